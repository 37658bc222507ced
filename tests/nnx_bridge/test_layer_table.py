"""Tests of the Linen -> NNX layer table, its runtime transforms and its checker."""

import dataclasses
import importlib
import inspect
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx, traverse_util

from nnx_bridge import layer_check
from nnx_bridge.errors import LossyConversionError, StateMismatchError
from nnx_bridge.layer_check import TOLERANCE, check_all, check_layer, linen_example
from nnx_bridge.layer_params import (
    linen_to_nnx_params,
    nnx_constructor_kwargs,
    nnx_to_linen_params,
)
from nnx_bridge.layer_table import (
    LAYERS,
    MODE_ARGUMENTS,
    Fuse,
    einsum_bias_shape,
    find_layer,
    render_markdown,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _short(spec):
  return spec.linen.rpartition('.')[2]


ROWS = pytest.mark.parametrize('spec', LAYERS, ids=[_short(spec) for spec in LAYERS])
NAMED = {_short(spec): spec for spec in LAYERS}


def _resolve(dotted):
  module, _, name = dotted.rpartition('.')
  return getattr(importlib.import_module(module), name)


def _params(cls):
  """Constructor parameter name -> default (inspect.Parameter.empty when required)."""
  signature = inspect.signature(cls if dataclasses.is_dataclass(cls) else cls.__init__)
  skip = {'self', 'parent', 'name'}
  return {n: p.default for n, p in signature.parameters.items() if n not in skip}


def _bit_equal(a, b):
  flat_a, flat_b = traverse_util.flatten_dict(a), traverse_util.flatten_dict(b)
  assert flat_a.keys() == flat_b.keys()
  for path in flat_a:
    assert flat_a[path].dtype == flat_b[path].dtype, path
    np.testing.assert_array_equal(flat_a[path], flat_b[path], err_msg=str(path))


# --- Every row against the installed flax --------------------------------------------------------


@ROWS
def test_row_output_matches_linen(spec):
  check = check_layer(spec)
  assert check.passed, check.detail
  assert (check.linen, check.nnx, check.expected_exact) == (spec.linen, spec.nnx, spec.exact)
  if spec.exact:
    assert check.max_abs_diff <= TOLERANCE, check.detail
  else:  # GRUCell: the dropped b_hn really changes the output
    assert check.max_abs_diff > TOLERANCE, check.detail


def test_check_all_checks_every_row_in_order(monkeypatch):
  rows = (NAMED['GRUCell'], NAMED['Dense'])
  monkeypatch.setattr(layer_check, 'LAYERS', rows)  # the full table runs in the test above
  checks = check_all()
  assert [(c.linen, c.expected_exact, c.passed) for c in checks] == [
      ('flax.linen.GRUCell', False, True),
      ('flax.linen.Dense', True, True),
  ]


def test_dense_nnx_output_equals_hand_computed_linen_math():
  spec = NAMED['Dense']
  _, variables, (x,) = linen_example(spec)
  kwargs = nnx_constructor_kwargs(spec, dict(spec.example.linen_kwargs), x)
  layer = nnx.Linear(**kwargs, rngs=nnx.Rngs(0))
  nnx.update(layer, nnx.from_flat_state(linen_to_nnx_params(spec, variables)))
  p = variables['params']
  np.testing.assert_allclose(layer(x), x @ p['kernel'] + p['bias'], atol=TOLERANCE)


@ROWS
def test_row_names_match_installed_signatures(spec):
  linen_cls, nnx_cls = _resolve(spec.linen), _resolve(spec.nnx)
  linen, nnx_ = _params(linen_cls), _params(nnx_cls)
  renames = dict(spec.arg_renames)
  linen_only = {k.name for k in spec.linen_only}
  assert renames.keys() <= linen.keys() and set(renames.values()) <= nnx_.keys()
  assert linen_only <= linen.keys() and not linen_only & nnx_.keys()
  for kwarg in spec.linen_only:
    assert linen[kwarg.name] == kwarg.default, kwarg.name
    assert kwarg.feeds is None or kwarg.feeds in dict(spec.derived)
  for name, value in spec.linen_defaults:
    assert linen[name] == value and nnx_[name] != value, name
  assert {name for name, _ in spec.derived} <= nnx_.keys()
  # Complete: every Linen kwarg NNX lacks is renamed or declared Linen-only ...
  assert linen.keys() - nnx_.keys() == renames.keys() | linen_only
  # ... and every required NNX argument is filled by a rename, a derivation or the same name.
  required = {n for n, d in nnx_.items() if d is inspect.Parameter.empty and n != 'rngs'}
  assert required <= set(renames.values()) | {n for n, _ in spec.derived} | linen.keys()
  call = list(inspect.signature(linen_cls.__call__).parameters)[1:]
  assert call[: len(spec.call_args)] == list(spec.call_args)
  assert dict(spec.example.linen_kwargs).keys() <= linen.keys()
  assert spec.example.mode_argument in {None, *(m.name for m in MODE_ARGUMENTS)}


def test_find_layer_accepts_short_and_defining_module_paths():
  assert find_layer('flax.linen.Dense') is NAMED['Dense']
  assert find_layer('flax.nnx.Linear') is None
  assert find_layer('flax.linen.attention.Dense') is None
  for spec in LAYERS:
    long_names = [
        f'flax.linen.{m}.{_short(spec)}'
        for m in ('linear', 'normalization', 'stochastic', 'attention', 'recurrent')
        if find_layer(f'flax.linen.{m}.{_short(spec)}') is spec
    ]
    assert len(long_names) == 1, spec.linen
    assert _resolve(long_names[0]) is _resolve(spec.linen)


# --- Round trips ---------------------------------------------------------------------------------


@ROWS
def test_round_trip_is_bit_exact(spec):
  _, variables, _ = linen_example(spec)
  flat = traverse_util.flatten_dict(variables)
  for drop in spec.params.drop:  # a dropped leaf can only round-trip when it is zero
    flat[(drop.collection, *drop.path)] = jnp.zeros_like(flat[(drop.collection, *drop.path)])
  variables = traverse_util.unflatten_dict(flat)
  nnx_flat = linen_to_nnx_params(spec, variables)
  back = nnx_to_linen_params(spec, nnx_flat, expected=traverse_util.flatten_dict(variables))
  _bit_equal(back, variables)
  again = linen_to_nnx_params(spec, back)
  assert again.keys() == nnx_flat.keys()
  for path in nnx_flat:
    np.testing.assert_array_equal(again[path], nnx_flat[path], err_msg=str(path))


def test_fused_gates_are_in_ifgo_order_and_split_back():
  spec = NAMED['OptimizedLSTMCell']
  _, variables, _ = linen_example(spec)
  p = variables['params']
  fused = linen_to_nnx_params(spec, variables)[('dense_h', 'kernel')]
  width = p['hi']['kernel'].shape[-1]
  for index, gate in enumerate('ifgo'):
    gate_kernel = fused[:, index * width:(index + 1) * width]
    np.testing.assert_array_equal(gate_kernel, p[f'h{gate}']['kernel'])


def test_gru_round_trip_loses_only_b_hn():
  spec = NAMED['GRUCell']
  _, variables, _ = linen_example(spec)
  with pytest.raises(LossyConversionError, match='params/hn/bias is not zero.*b_hn'):
    linen_to_nnx_params(spec, variables)
  back = nnx_to_linen_params(spec, linen_to_nnx_params(spec, variables, allow_lossy=True))
  assert float(jnp.abs(variables['params']['hn']['bias']).max()) > 0
  np.testing.assert_array_equal(back['params']['hn']['bias'], 0)
  back['params']['hn']['bias'] = variables['params']['hn']['bias']
  _bit_equal(back, variables)


# --- The checker rejects wrong rows and wrong trees ----------------------------------------------


def test_lstm_without_if_rename_fails_the_check():
  spec = NAMED['LSTMCell']
  broken = dataclasses.replace(spec, params=dataclasses.replace(spec.params, key_renames=()))
  check = check_layer(broken)
  assert not check.passed
  assert 'if_/kernel: expected float32[3,4], got nothing (missing)' in check.detail
  assert 'if/kernel: expected nothing (unexpected key)' in check.detail


def test_optimized_lstm_in_wrong_gate_order_fails_the_check():
  spec = NAMED['OptimizedLSTMCell']
  fuse = tuple(
      dataclasses.replace(f, parts=(f.parts[0], f.parts[1], f.parts[3], f.parts[2]))  # i, f, o, g
      for f in spec.params.fuse
  )
  check = check_layer(dataclasses.replace(spec, params=dataclasses.replace(spec.params, fuse=fuse)))
  assert not check.passed
  assert TOLERANCE < check.max_abs_diff < float('inf'), check.detail


def test_leaf_left_at_random_init_fails_the_check():
  spec = NAMED['OptimizedLSTMCell']
  fuse = spec.params.fuse[:2]  # forgets dense_h/bias
  check = check_layer(dataclasses.replace(spec, params=dataclasses.replace(spec.params, fuse=fuse)))
  assert not check.passed
  assert 'dense_h/bias: expected float32[16], got nothing (missing)' in check.detail


def test_gru_claimed_exact_fails_the_check():
  check = check_layer(dataclasses.replace(NAMED['GRUCell'], exact=True))
  assert not check.passed and 'params/hn/bias is not zero' in check.detail


def test_einsum_without_bias_shape_fails_the_check():
  check = check_layer(dataclasses.replace(NAMED['Einsum'], derived=()))
  assert not check.passed and 'bias: expected nothing (unexpected key)' in check.detail


def test_batchnorm_stats_from_wrong_collection_fail_the_check():
  spec = NAMED['BatchNorm']
  params = dataclasses.replace(spec.params, collections=())
  check = check_layer(dataclasses.replace(spec, params=params))
  assert not check.passed and 'extra batch_stats/mean' in check.detail


def test_missing_and_extra_leaves_raise_naming_the_path():
  spec = NAMED['Dense']
  _, variables, _ = linen_example(spec)
  expected = linen_to_nnx_params(spec, variables)
  without_bias = {'params': {'kernel': variables['params']['kernel']}}
  with pytest.raises(StateMismatchError, match=r'bias: expected float32\[3\], got nothing \(missing\)'):
    linen_to_nnx_params(spec, without_bias, expected=expected)
  extra = {'params': {**variables['params'], 'scale': variables['params']['bias']}}
  with pytest.raises(StateMismatchError, match=r'scale: expected nothing \(unexpected key\)'):
    linen_to_nnx_params(spec, extra, expected=expected)
  wrong_shape = {'params': {**variables['params'], 'bias': jnp.zeros(7)}}
  with pytest.raises(StateMismatchError, match=r'bias: expected float32\[3\], got float32\[7\]'):
    linen_to_nnx_params(spec, wrong_shape, expected=expected)
  with pytest.raises(StateMismatchError, match='extra intermediates/kernel'):
    linen_to_nnx_params(spec, {**variables, 'intermediates': {'kernel': jnp.zeros(1)}})


def test_missing_fused_parts_raise_naming_the_path():
  spec = NAMED['OptimizedLSTMCell']
  _, variables, _ = linen_example(spec)
  params = dict(variables['params'])
  del params['hf']
  with pytest.raises(StateMismatchError, match='missing params/hf/kernel.*missing params/hf/bias'):
    linen_to_nnx_params(spec, {'params': params})
  nnx_flat = linen_to_nnx_params(spec, variables)
  del nnx_flat[('dense_h', 'bias')]
  with pytest.raises(StateMismatchError, match='missing dense_h/bias'):
    nnx_to_linen_params(spec, nnx_flat)
  expected = traverse_util.flatten_dict(variables)
  del expected[('params', 'hf', 'bias')]
  with pytest.raises(StateMismatchError, match=r'params/hf/bias: expected nothing \(unexpected key\)'):
    nnx_to_linen_params(spec, linen_to_nnx_params(spec, variables), expected=expected)


def test_unequal_fused_widths_are_rejected():
  spec = dataclasses.replace(
      NAMED['OptimizedLSTMCell'], params=dataclasses.replace(
          NAMED['OptimizedLSTMCell'].params, fuse=(Fuse(('w',), (('a',), ('b',))),))
  )
  with pytest.raises(StateMismatchError, match='unequal widths fused into w'):
    linen_to_nnx_params(spec, {'params': {'a': jnp.zeros((2, 3)), 'b': jnp.zeros((2, 4))}})


# --- Constructor kwargs --------------------------------------------------------------------------


def test_constructor_kwargs_rename_and_derive_sizes():
  x = jnp.zeros((3, 2, 4, 5))
  assert nnx_constructor_kwargs(NAMED['Dense'], {'features': 3}, x) == {
      'out_features': 3, 'in_features': 5,
  }
  assert nnx_constructor_kwargs(
      NAMED['DenseGeneral'], {'features': (2, 3), 'axis': (-2, -1), 'batch_dims': (0,)}, x
  ) == {'out_features': (2, 3), 'axis': (-2, -1), 'in_features': (4, 5), 'batch_axis': {0: 3}}
  assert nnx_constructor_kwargs(NAMED['DenseGeneral'], {'features': 2}, x) == {
      'out_features': 2, 'in_features': 5,
  }
  carry = (jnp.zeros((2, 4)), jnp.zeros((2, 4)))
  assert nnx_constructor_kwargs(NAMED['LSTMCell'], {'features': 4}, carry, jnp.zeros((2, 3))) == {
      'hidden_features': 4, 'in_features': 3,
  }
  q, kv = jnp.zeros((2, 3, 4)), jnp.zeros((2, 5, 6))
  mha = NAMED['MultiHeadDotProductAttention']
  assert nnx_constructor_kwargs(mha, {'num_heads': 2}, q) == {
      'decode': False, 'num_heads': 2, 'in_features': 4,
  }
  assert nnx_constructor_kwargs(mha, {'num_heads': 2}, q, kv)['in_kv_features'] == 6
  assert nnx_constructor_kwargs(NAMED['BatchNorm'], {'axis': 1}, x) == {
      'axis': 1, 'num_features': 2,
  }


def test_einsum_kwargs_derive_bias_shape_as_linen_does():
  einsum = NAMED['Einsum']
  kwargs = {'shape': (4, 2, 3), 'einsum_str': 'abc,cde->abde'}
  assert nnx_constructor_kwargs(einsum, kwargs, jnp.zeros((2, 3, 4))) == {
      'kernel_shape': (4, 2, 3), 'einsum_str': 'abc,cde->abde', 'bias_shape': (2, 3),
  }
  assert 'bias_shape' not in nnx_constructor_kwargs(einsum, {**kwargs, 'use_bias': False})
  assert einsum_bias_shape('...a,ab->...b', (4, 5)) == (5,)
  assert einsum_bias_shape('btd,dnh->bnt', (4, 2, 3)) == (2,)
  linen = nn.Einsum((4, 2, 3), '...a,anh->...hn')
  bias = linen.init(jax.random.key(0), jnp.zeros((2, 4)))['params']['bias']
  assert bias.shape == einsum_bias_shape('...a,anh->...hn', (4, 2, 3))
  with pytest.raises(ValueError, match='einsum_str'):
    nnx_constructor_kwargs(einsum, {'shape': (4, 2, 3)})


def test_linen_only_kwargs_convert_only_at_their_default():
  norm = NAMED['LayerNorm']
  x = jnp.zeros((2, 4))
  assert nnx_constructor_kwargs(norm, {'force_float32_reductions': True}, x) == {'num_features': 4}
  with pytest.raises(ValueError, match='force_float32_reductions=False'):
    nnx_constructor_kwargs(norm, {'force_float32_reductions': False}, x)
  with pytest.raises(ValueError, match='call argument 0'):
    nnx_constructor_kwargs(norm, {})


# --- Plain data, documented -----------------------------------------------------------------------


def test_layer_table_imports_without_jax():
  code = (
      'import importlib.util, sys\n'
      f'path = {str(ROOT / "nnx_bridge" / "layer_table.py")!r}\n'
      'spec = importlib.util.spec_from_file_location("lt", path)\n'
      'module = importlib.util.module_from_spec(spec)\n'
      'sys.modules["lt"] = module\n'
      'spec.loader.exec_module(module)\n'
      'assert len(module.LAYERS) == 16, len(module.LAYERS)\n'
      'assert not [m for m in sys.modules if m.split(".")[0] in ("jax", "flax", "numpy")], '
      'sorted(sys.modules)\n'
  )
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
  assert result.returncode == 0, result.stderr


def test_recorded_signatures_are_the_installed_flax_ones():
  """The codemod reads the table classes' constructor signatures from `layer_signatures` (no flax import)."""
  from nnx_bridge import layer_signatures
  from nnx_bridge.layer_table import WRAPPERS

  assert set(layer_signatures.LINEN_FIELDS) == {s.linen for s in LAYERS} | {w.linen for w in WRAPPERS}
  assert set(layer_signatures.NNX_ARGUMENTS) == {s.nnx for s in LAYERS if s.nnx} | {w.nnx for w in WRAPPERS}
  for name, fields in layer_signatures.LINEN_FIELDS.items():
    assert fields == layer_signatures.installed_linen_fields(name), name
  for name, arguments in layer_signatures.NNX_ARGUMENTS.items():
    assert arguments == layer_signatures.installed_nnx_arguments(name), name
  for spec in LAYERS:
    recorded = layer_signatures.LINEN_CALL_PARAMS.get(spec.linen, spec.call_args)
    assert recorded == layer_signatures.installed_linen_call_params(spec.linen), spec.linen
  from codemods.vocabulary import LAYER_MODE_KWARGS
  for name in {s.nnx for s in LAYERS if s.nnx}:
    taken = layer_signatures.installed_nnx_call_modes(name, LAYER_MODE_KWARGS)
    assert layer_signatures.NNX_CALL_MODES.get(name, frozenset()) == taken, name


def test_recorded_stateless_layers_are_those_whose_init_gives_no_variables():
  """`layer_signatures.STATELESS`, which the codemod reads to build a layer under a train/eval test in both modes."""
  from nnx_bridge import layer_signatures
  from nnx_bridge.layer_check import linen_example

  found = {spec.linen for spec in LAYERS if spec.example is not None
           and not jax.tree.leaves(linen_example(spec)[1])}
  assert found == layer_signatures.STATELESS
  assert 'flax.linen.Dense' not in found  # the check sees variables where there are some


def test_docs_table_is_generated_from_the_rows():
  text = (ROOT / 'docs' / 'layer_table.md').read_text()
  assert text == render_markdown(), 'regenerate docs/layer_table.md from render_markdown()'
  for spec in LAYERS:
    assert f'| `{spec.linen}` | `{spec.nnx}` |' in text
