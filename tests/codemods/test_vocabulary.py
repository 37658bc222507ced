"""codemods/vocabulary.py against the installed flax: every name resolves, spellings of one name are one object,
and the lists measured on flax (NNX_TWINS) are what flax says today."""

import importlib
import inspect
import typing as tp

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import nnx

from codemods import vocabulary as v


def _resolve(qualified: str) -> object:
  """The object a dotted name refers to (`flax.linen.transforms.scan`); LookupError when nothing is there."""
  module, _, name = qualified.rpartition('.')
  try:
    return getattr(importlib.import_module(module), name)
  except (ImportError, AttributeError) as error:
    raise LookupError(f'{qualified} does not resolve on the installed flax: {error}') from None


def _one_object(names: frozenset[str]) -> object:
  """The one object every spelling in `names` refers to; LookupError when they differ."""
  objects = {id(_resolve(n)): n for n in names}
  if len(objects) != 1:
    raise LookupError(f'{sorted(names)} name {len(objects)} different objects')
  return _resolve(next(iter(names)))


@pytest.mark.parametrize('names', [v.MODULE_NAMES, v.COMPACT_NAMES, v.SCAN_NAMES, v.VMAP_NAMES, v.JIT_NAMES,
                                   v.PARTIAL_NAMES], ids=lambda n: min(n))
def test_every_spelling_names_the_same_object(names):
  _one_object(names)


def test_remat_and_checkpoint_are_one_transform():
  assert _one_object(v.REMAT_NAMES) is nn.remat


def _pools_keeping_the_last_axis(function: tp.Callable, name: str) -> bool:
  """Whether `function`, called as a flax pooling function `name` is, windows (8, 6) into (4, 3) and keeps C = 5."""
  x = jnp.ones((2, 8, 6, 5))
  out = function(x, 0.0, jax.lax.add, (2, 2), (2, 2), 'VALID') if name.endswith('.pool') else function(x, (2, 2), (2, 2))
  return out.shape == (2, 4, 3, 5)


def test_pooling_functions_keep_the_last_axis_on_the_installed_flax():
  assert all(_pools_keeping_the_last_axis(_resolve(name), name) for name in v.POOLING)
  assert not _pools_keeping_the_last_axis(lambda x, *_: jnp.mean(x, axis=-1), 'flax.linen.avg_pool')


@pytest.mark.parametrize('axis, keeps', [((1, 2), False), ((-3, -2), True), (-1, False), ((-2, -1), False)])
def test_reductions_keep_the_last_axis_only_for_the_axes_the_interpreter_trusts(axis, keeps):
  import libcst as cst

  from codemods.rules.l2n002.dims import keeps_last_axis
  assert all(_resolve(name) for name in v.REDUCTIONS)
  call = cst.parse_expression(f'jnp.mean(x, axis={axis})')
  assert keeps_last_axis(call) is keeps
  if keeps:  # what the interpreter trusts holds on a 4-d array
    assert jnp.mean(jnp.ones((2, 8, 6, 5)), axis=axis).shape[-1] == 5


def test_broadcast_names_resolve():
  for name in v.BROADCAST_NAMES:
    assert _resolve(name) is nn.broadcast


def test_the_checkers_reject_a_wrong_name():
  with pytest.raises(LookupError, match='does not resolve'):
    _resolve('flax.linen.no_such_transform')
  with pytest.raises(LookupError, match='different objects'):
    _one_object(frozenset({'flax.linen.scan', 'flax.linen.vmap'}))


def test_scope_apis_are_module_members():
  assert v.CONVERTED_APIS <= v.SCOPE_APIS and v.STATE_APIS <= v.SCOPE_APIS
  seen = {}

  class Probe(nn.Module):  # `scope` is set on a bound instance only
    @nn.compact
    def __call__(self, x):
      seen.update((name, hasattr(self, name)) for name in v.SCOPE_APIS)
      return x

  Probe().init(jax.random.key(0), jnp.ones(1))
  missing = sorted(name for name, present in seen.items() if not present)
  assert not missing, f'not members of a bound flax.linen.Module: {missing}'


def test_control_flow_module_positions_and_nnx_counterparts():
  for linen_name, (nnx_name, position) in v.CONTROL_FLOW.items():
    parameters = list(inspect.signature(_resolve(linen_name)).parameters)
    assert parameters[position] == 'mdl', (linen_name, parameters)
    assert callable(getattr(nnx, nnx_name.removeprefix('nnx.')))


def test_wrapping_options_are_parameters_of_both_transforms():
  for names, nnx_name, options, *_ in v.WRAPPING.values():
    linen_params = inspect.signature(_one_object(names)).parameters
    nnx_params = inspect.signature(getattr(nnx, nnx_name.removeprefix('nnx.'))).parameters
    for option in options:
      assert option in linen_params and option in nnx_params, (nnx_name, option)


def test_stack_and_while_options_are_linen_parameters():
  for kind, options in v.STACK_OPTIONS.items():
    parameters = inspect.signature(getattr(nn, kind)).parameters
    assert set(options) <= set(parameters), (kind, set(options) - set(parameters))
  assert set(v.WHILE_OPTIONS) <= set(inspect.signature(nn.while_loop).parameters)


def test_nnx_twins_are_measured_on_the_installed_flax():
  measured = {name for name in dir(nn) if not name.startswith('_') and not isinstance(getattr(nn, name), type)
              and getattr(nnx, name, None) is getattr(nn, name)}
  assert v.NNX_TWINS == measured, ('update NNX_TWINS in codemods/vocabulary.py to the installed flax: '
                                   f'add {sorted(measured - v.NNX_TWINS)}, drop {sorted(v.NNX_TWINS - measured)}')


def test_mode_keywords_come_from_the_layer_table():
  from nnx_bridge.layer_table import MODE_ARGUMENTS

  assert set(v.MODE_PARAMS) == {m.name for m in MODE_ARGUMENTS}
  for name, inverted in v.MODE_PARAMS.items():
    assert v.EVAL_VALUE[name] is (not inverted)


def test_initializer_names_exist_in_nnx_and_compute_the_same():
  import numpy as np

  linen_names = {name for name in dir(nn.initializers) if not name.startswith('_')}
  assert linen_names <= v.NNX_INITIALIZERS  # nothing Linen has is left as a TODO today
  for name in v.NNX_INITIALIZERS:
    assert hasattr(nnx.initializers, name), name
    if getattr(nn.initializers, name) is not getattr(nnx.initializers, name):
      assert name in ('zeros_init', 'ones_init'), name
      key = jax.random.key(0)
      np.testing.assert_array_equal(getattr(nn.initializers, name)()(key, (2,)), getattr(nnx.initializers, name)()(key, (2,)))
  for name in v.LINEN_TOP_LEVEL_INITIALIZERS:
    assert getattr(nn, name) is getattr(nn.initializers, name)


def _same_signature_twins() -> set[str]:
  """The non-class names of flax.linen that flax.nnx exports as another object with the same signature."""
  found = set()
  for name in dir(nn):
    linen, port = getattr(nn, name), getattr(nnx, name, None)
    if name.startswith('_') or isinstance(linen, type) or port is None or port is linen or not callable(linen):
      continue
    try:
      if inspect.signature(linen) == inspect.signature(port):
        found.add(name)
    except (TypeError, ValueError):
      continue
  return found


def test_same_signature_twins_are_measured_and_compute_the_same():
  measured = _same_signature_twins()
  assert v.NNX_SAME_SIGNATURE == measured, ('update NNX_SAME_SIGNATURE in codemods/vocabulary.py: '
                                            f'add {sorted(measured - v.NNX_SAME_SIGNATURE)}, '
                                            f'drop {sorted(v.NNX_SAME_SIGNATURE - measured)}')
  mask = jnp.array([[1, 1, 0], [1, 0, 0]])
  for build in (lambda m: m.make_attention_mask(mask, mask), lambda m: m.make_causal_mask(mask),
                lambda m: m.combine_masks(m.make_attention_mask(mask, mask), m.make_causal_mask(mask))):
    assert jnp.array_equal(build(nn), build(nnx))


def test_linen_array_functions_are_plain_functions_nnx_does_not_export_alike():
  for qualified in v.LINEN_ARRAY_FUNCTIONS:
    function = _resolve(qualified)
    assert inspect.isfunction(function) and function.__module__ == 'flax.linen.attention', qualified
    name = qualified.rpartition('.')[2]
    port = getattr(nnx, name, None)
    assert port is None or inspect.signature(port) != inspect.signature(function), f'{name}: convert it instead'
    assert 'dropout_rng' in inspect.signature(function).parameters  # its key is an argument, not a Linen rng


def test_the_twin_measure_rejects_a_different_signature():
  assert 'dot_product_attention' not in _same_signature_twins()  # nnx's takes other arguments
  assert 'combine_masks' in _same_signature_twins()


def test_rngs_attributes_are_measured_on_the_installed_flax():
  measured = {name for name in dir(nnx.Rngs) if not name.startswith('_')}
  assert v.RNGS_ATTRIBUTES == measured, ('update RNGS_ATTRIBUTES in codemods/vocabulary.py: '
                                         f'add {sorted(measured - v.RNGS_ATTRIBUTES)}, drop {sorted(v.RNGS_ATTRIBUTES - measured)}')
  assert not isinstance(nnx.Rngs(0).gumbel, nnx.RngStream)  # why such a stream needs rngs['gumbel']
  assert isinstance(nnx.Rngs(0)['gumbel'], nnx.RngStream)


@pytest.mark.parametrize('linen_name', sorted(v.NNX_CALL_TWINS))
def test_call_twins_take_the_linen_arguments_under_the_keywords_given(linen_name):
  """Each Linen parameter maps to an NNX one (the positional ones in the same places), and the NNX annotation reads
  its names as Linen does where a rule maps every logical name (one mapping to None replicates its axis)."""
  nnx_name, positional, keywords = v.NNX_CALL_TWINS[linen_name]
  linen_params = list(inspect.signature(getattr(nn, linen_name)).parameters)
  nnx_params = inspect.signature(getattr(nnx, nnx_name)).parameters
  assert set(keywords) == set(linen_params) and list(positional) == linen_params[:len(positional)]
  assert [keywords[p] for p in positional] == list(nnx_params)[:len(positional)]
  assert all(k in nnx_params or 'metadata' in nnx_params for k in keywords.values())
  rules = (('embed', 'data'), ('mlp', None)) if 'rules' in keywords else None
  names = ('embed', 'mlp') if rules else ('data', 'model')
  extra = {'rules': rules} if rules else {}
  boxed = getattr(nn, linen_name)(nn.initializers.ones, names, **extra)(jax.random.key(0), (2, 2))
  port = getattr(nnx, nnx_name)(nnx.initializers.ones, names, eager_sharding=False,
                                **({keywords['rules']: rules} if rules else {}))
  param = nnx.Param(port(jax.random.key(0), (2, 2)))
  linen_spec = nn.get_partition_spec(boxed) if not rules else nn.logical_to_mesh_axes(boxed.names, rules)
  assert tuple(nnx.get_partition_spec(nnx.state(nnx.Dict(p=param)))['p'].get_value()) == tuple(linen_spec)


def test_merge_param_is_a_function_of_values_alone():
  for qualified in v.MERGE_PARAM_NAMES:
    function = _resolve(qualified)
    assert inspect.isfunction(function) and list(inspect.signature(function).parameters) == ['name', 'a', 'b']
    assert function('n', None, 3) == function('n', 3, None) == 3
    with pytest.raises(ValueError):
      function('n', 1, 2)
  assert v.MERGE_PARAM_NAMES <= v.LINEN_KEPT_FUNCTIONS
