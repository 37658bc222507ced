"""L2N002 on nn.RNN(cell): the converted NNX models run on transferred Linen parameters.

Parity with Linen (outputs and every parameter's gradient, on randomly shifted Linen parameters so that
zero biases cannot hide a wrong mapping) is in the fixtures' parity specs (tests/codemods/rules/test_fixture_parity.py);
here: the Linen names cells keep, GRU's b_hn, and what stays Linen.
"""

import pathlib

import jax
import jax.numpy as jnp
import pytest

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from nnx_bridge.layer_table import WRAPPERS, find_layer, find_wrapper
from tests.codemods.rules import test_fixture_parity as fixture_parity

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002'
RULES = registry.select_rules(['L2N002'])


def _models(fixture: str, name: str):
  """(Linen module, its variables shifted by random amounts, the converted model, the input) from the fixture's
  parity spec: the shifts stand in for trained weights (b_hn included)."""
  return fixture_parity.models(f'L2N002/{fixture}', fixture_parity.spec(f'L2N002/{fixture}', name), perturb=True)


def test_cells_keep_linen_names_per_style():
  """compact: the cell lives beside the RNN (`LSTMCell_0`); setup: under it (`encoder/cell`)."""
  linen_module, variables, nnx_model, (x,) = _models('rnn_lstm', 'Classifier')
  rules = {r.nnx: r.linen for r in nnx_bridge.derive_mapping(linen_module, nnx_model, x).rules}
  assert rules[('rnn', 'cell', 'if_', 'kernel')] == (('params', 'LSTMCell_0', 'if', 'kernel'),)
  linen_module, variables, nnx_model, (x,) = _models('rnn_lstm', 'Tagger')
  rules = {r.nnx: r.linen for r in nnx_bridge.derive_mapping(linen_module, nnx_model, x).rules}
  fused = rules[('encoder', 'cell', 'dense_h', 'kernel')]
  assert fused == tuple(('params', 'encoder', 'cell', f'h{g}', 'kernel') for g in 'ifgo')


@pytest.mark.parametrize('name', ['Encoder', 'Stack'])
def test_gru_port_is_exact_only_without_b_hn(name):
  """At a fresh init (b_hn == 0) the GRU ports match Linen (fixtures/L2N002/rnn_gru.parity.json); trained, not."""
  linen_module, variables, nnx_model, (x,) = _models('rnn_gru', name)
  mapping = nnx_bridge.derive_mapping(linen_module, nnx_model, x)
  assert any(key[-2:] == ('hn', 'bias') for key in mapping.dropped)
  with pytest.raises(nnx_bridge.LossyConversionError, match='hn/bias is not zero'):
    nnx_bridge.linen_to_nnx(variables, nnx_model, mapping)
  nnx_bridge.linen_to_nnx(variables, nnx_model, mapping, allow_lossy=True)
  got, want = jax.tree.leaves(nnx_model(x)), jax.tree.leaves(linen_module.apply(variables, x))
  assert max(float(jnp.abs(a - b).max()) for a, b in zip(got, want)) > 1e-3  # the documented difference


def test_gru_conversion_is_flagged_never_silent():
  result = transform_source((FIXTURES / 'rnn_gru.in.py').read_text(), RULES)
  todos = [e for e in result.entries if e.kind == 'todo' and 'GRUCell' in e.message]
  assert len(todos) == 2
  for entry in todos:
    assert 'b_hn' in entry.message and '#5594' in entry.message
  assert result.source.count('# TODO(linen2nnx): self.rnn.cell: flax.nnx.GRUCell does not compute') == 2
  assert 'nnx.RNN(nnx.GRUCell(in_features=self.hidden, hidden_features=self.hidden, rngs=rngs), return_carry=True)' \
      in result.source


def test_rnn_kwargs_and_sizes_follow_the_table():
  result = transform_source((FIXTURES / 'rnn_lstm.in.py').read_text(), RULES)
  assert 'nnx.RNN(nnx.LSTMCell(in_features=8, hidden_features=self.hidden, rngs=rngs))' in result.source
  assert 'reverse=True, keep_order=True)' in result.source and 'time_major=False)' in result.source
  messages = [e.message for e in result.entries]
  assert any('RNN_0 -> self.rnn (its cell LSTMCell_0 -> self.rnn.cell)' in m for m in messages)
  rnn = find_wrapper('flax.linen.RNN')
  assert rnn is WRAPPERS[0] and find_wrapper('flax.linen.recurrent.RNN') is rnn
  assert all(find_layer(cell) is not None for cell in rnn.cells)


@pytest.mark.parametrize('source, reason', [
    ('nn.RNN(nn.LSTMCell(3), variable_broadcast=False)(x)', 'variable_broadcast= of flax.linen.RNN has no NNX'),
    ('nn.RNN(nn.LSTMCell(3))(x, init_key=jax.random.key(1))', 'init_key= of a flax.linen.RNN call'),
    ('nn.RNN(nn.Dense(3))(x)', 'RNN over a cell other than'),
    ('nn.scan(nn.LSTMCell, variable_broadcast="params", split_rngs={"params": False})(3)(c, x)',
     'nn.scan(nn.LSTMCell'),
])
def test_other_recurrent_code_stays_linen_with_a_todo(source, reason):
  code = (
      'import jax\nimport flax.linen as nn\n\n\nclass M(nn.Module):\n  @nn.compact\n'
      f'  def __call__(self, x, c=None):\n    return {source}\n'
  )
  result = transform_source(code, RULES)
  assert 'class M(nn.Module)' in result.source
  (todo,) = [e for e in result.entries if e.kind == 'todo']
  assert reason in todo.message, todo.message
