"""L2N002 on the guide's RNN: a cell class of one's own scanned over time with nn.scan (parameters
broadcast to every step) becomes the converted cell run by nnx.scan; Linen's params transfer (outputs and
gradients: the fixtures' parity specs, tests/codemods/rules/test_fixture_parity.py)."""

import pathlib
import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.l2n002.kept_linen import kept_with

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002'
RULES = registry.select_rules(['L2N002'])


def _load(case: str, suffix: str) -> dict:
  return runpy.run_path(str(FIXTURES / f'{case}.{suffix}.py'))


def test_guide_rnn_transfer_by_derived_mapping():
  x = jax.random.normal(jax.random.key(1), (3, 12, 32))
  linen_module = _load('scan_cell', 'in')['RNN'](64)
  variables = linen_module.init(jax.random.key(0), x)
  model = _load('scan_cell', 'out')['RNN'](64, cell_x_features=32, rngs=nnx.Rngs(5))
  mapping = nnx_bridge.derive_mapping(linen_module, model, x)
  assert {r.nnx: r.linen for r in mapping.rules} == {
      ('cell', 'linear', name): (('params', 'ScanRNNCell_0', 'Dense_0', name),) for name in ('kernel', 'bias')
  }
  nnx_bridge.linen_to_nnx(variables, model, mapping)
  want = linen_module.apply(variables, x)
  assert want.shape == (3, 12, 64)
  np.testing.assert_allclose(model(x), want, atol=1e-5)


def test_setup_style_scan_on_axis_0_returns_carry_and_outputs():
  carry, xs = jnp.zeros((2, 4)), jax.random.normal(jax.random.key(2), (7, 2, 3))
  linen_module = _load('scan_cell_setup', 'in')['Encoder'](4)
  variables = linen_module.init(jax.random.key(0), carry, xs)
  model = _load('scan_cell_setup', 'out')['Encoder'](4, scanned_x_features=3, rngs=nnx.Rngs(0))
  mapping = nnx_bridge.derive_mapping(linen_module, model, carry, xs)
  nnx_bridge.linen_to_nnx(variables, model, mapping)
  (want_carry, want), (got_carry, got) = linen_module.apply(variables, carry, xs), model(carry, xs)
  np.testing.assert_allclose(got_carry, want_carry, atol=1e-5)
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert got.shape == (7, 2, 4)


CELL = '''import flax.linen as nn
import jax.numpy as jnp


class Cell(nn.Module):
  features: int

  @nn.compact
  def __call__(self, carry, x):
    carry = nn.Dense(self.features)(jnp.concatenate([carry, x], axis=-1))
    return carry, carry


class M(nn.Module):
  @nn.compact
  def __call__(self, carry, x):
    return {scan}(3)(carry, x)
'''


@pytest.mark.parametrize('scan, reason', [
    ("nn.scan(Cell, variable_axes={'params': 0}, split_rngs={'params': True}, in_axes=1, out_axes=1)",
     "nn.scan(Cell, variable_axes={'params': 0}, split_rngs={'params': True}, in_axes=1, out_axes=1) is converted "
     "only with length= (nnx.vmap creates that many copies in __init__)"),
    ("nn.scan(Cell, variable_broadcast='params', split_rngs={'params': True}, in_axes=1, out_axes=1)",
     "split_rngs={'params': True}"),
    ("nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False}, in_axes=(1,), out_axes=1)",
     'in_axes=(1,)'),
    ("nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False}, in_axes=1, out_axes=1, length=4)",
     'length=4'),
    ("nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False})", 'is converted only as'),
])
def test_other_scans_stay_linen_with_a_todo(scan, reason):
  result = transform_source(CELL.format(scan=scan), RULES)
  assert 'class M(nn.Module)' in result.source and 'nnx.scan(' not in result.source
  todo = kept_with(result, 'Cell')  # M stays Linen and scans Cell with nn.scan: Cell stays Linen too
  assert todo.message.startswith('class M left as Linen: ') and reason in todo.message, todo.message
  assert f'# TODO(linen2nnx): {todo.message}' in result.source


@pytest.mark.parametrize('body, reason', [
    ('    rnn = {scan}(3)\n    return rnn(carry, x), rnn(carry, x)\n', 'called 2 times'),
    ('    rnn = {scan}(3)\n    return rnn(carry, x=x)\n', 'other than as cell(carry, x)'),
    ('    rnn = {scan}(3)\n    f = rnn\n    return f(carry, x)\n', 'used other than by calling it'),
])
def test_scanned_cell_used_otherwise_stays_linen(body, reason):
  scan = "nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False}, in_axes=1, out_axes=1)"
  source = CELL.replace('    return {scan}(3)(carry, x)\n', body).format(scan=scan)
  result = transform_source(source, RULES)
  assert 'class M(nn.Module)' in result.source
  todo = kept_with(result, 'Cell')
  assert reason in todo.message, todo.message


def test_scan_called_where_built_converts():
  scan = "nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False}, in_axes=1, out_axes=1)"
  result = transform_source(CELL.format(scan=scan), RULES)
  assert 'class M(nnx.Module)' in result.source
  assert ('nnx.scan(lambda cell, carry, x: cell(carry, x), in_axes=(None, nnx.Carry, 1), '
          'out_axes=(nnx.Carry, 1))(self.cell, carry, x)') in result.source
  assert any('ScanCell_0 -> self.cell' in e.message for e in result.entries)
  # the carry has the size of the carry the cell returns; the input's last axis is a new argument, passed on
  assert 'nnx.Linear(in_features=self.features + x_features, out_features=self.features, rngs=rngs)' in result.source
  assert 'def __init__(self, *, cell_x_features: int, rngs: nnx.Rngs)' in result.source
  assert 'self.cell = Cell(3, x_features=cell_x_features, rngs=rngs)' in result.source
  messages = [e.message for e in result.entries]
  assert 'new constructor argument x_features: the size of the last axis of x' in messages
  assert 'flax.linen' not in result.source and 'nn.' not in result.source.replace('nnx.', '')
