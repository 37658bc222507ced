"""L2N002 on nn.RNN(cell): the converted NNX models run on transferred Linen parameters.

The RNN fixtures' Linen and NNX classes are both executed: Linen parameters (randomly shifted,
so that zero biases cannot hide a wrong mapping) go into the converted model through the derived
mapping, and the outputs and every parameter's gradient are compared (`nnx_bridge.compare`).
"""

import pathlib
import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from nnx_bridge.layer_table import WRAPPERS, find_layer, find_wrapper

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / 'fixtures' / 'L2N002'
RULES = registry.select_rules(['L2N002'])
TOKENS = jax.random.randint(jax.random.key(1), (3, 6), 0, 10)
SEQUENCE = jax.random.normal(jax.random.key(2), (2, 5, 4))

# (fixture, class, Linen fields, NNX size kwargs the report asks for, input)
CASES = {
    'lstm_compact': ('rnn_lstm', 'Classifier', dict(vocab=10, hidden=5), {}, TOKENS),
    'optimized_lstm_setup': ('rnn_lstm', 'Tagger', dict(hidden=3),
                             dict(encoder_in_features=4, head_in_features=3), SEQUENCE),
    'gru_compact': ('rnn_gru', 'Encoder', dict(hidden=4), dict(linear_in_features=4), SEQUENCE),
    'gru_setup': ('rnn_gru', 'Stack', {}, dict(rnn_in_features=4), SEQUENCE),
}


def _load(fixture: str, suffix: str) -> dict:
  return runpy.run_path(str(FIXTURES / f'{fixture}.{suffix}.py'))


def _perturbed(variables, seed=0):
  """Every leaf shifted by a random amount: stands in for trained weights (b_hn included)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: x + jnp.asarray(rng.uniform(0.1, 0.5, x.shape), x.dtype), variables)


def _models(case, perturb=True):
  fixture, name, fields, sizes, x = CASES[case]
  linen_module = _load(fixture, 'in')[name](**fields)
  variables = linen_module.init(jax.random.key(0), x)
  nnx_model = _load(fixture, 'out')[name](**fields, **sizes, rngs=nnx.Rngs(0))
  return linen_module, _perturbed(variables) if perturb else variables, nnx_model, x


@pytest.mark.parametrize('case', ['lstm_compact', 'optimized_lstm_setup'])
def test_lstm_ports_match_linen_outputs_and_gradients(case):
  linen_module, variables, nnx_model, x = _models(case)
  mapping = nnx_bridge.derive_mapping(linen_module, nnx_model, x)
  nnx_bridge.linen_to_nnx(variables, nnx_model, mapping)
  expected = linen_module.apply(variables, x)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), nnx_model(x), expected)
  report = nnx_bridge.compare(linen_module, variables, nnx_model, x, mapping=mapping)
  assert report.ok, report.to_text()
  gradients = {d.path for d in report.differences if d.check == 'gradient'}
  params = {'/'.join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(nnx_model, nnx.Param))}
  assert gradients == params  # every parameter's gradient was compared


def test_cells_keep_linen_names_per_style():
  """compact: the cell lives beside the RNN (`LSTMCell_0`); setup: under it (`encoder/cell`)."""
  linen_module, variables, nnx_model, x = _models('lstm_compact')
  rules = {r.nnx: r.linen for r in nnx_bridge.derive_mapping(linen_module, nnx_model, x).rules}
  assert rules[('rnn', 'cell', 'if_', 'kernel')] == (('params', 'LSTMCell_0', 'if', 'kernel'),)
  linen_module, variables, nnx_model, x = _models('optimized_lstm_setup')
  rules = {r.nnx: r.linen for r in nnx_bridge.derive_mapping(linen_module, nnx_model, x).rules}
  fused = rules[('encoder', 'cell', 'dense_h', 'kernel')]
  assert fused == tuple(('params', 'encoder', 'cell', f'h{g}', 'kernel') for g in 'ifgo')


def test_gru_port_is_exact_only_without_b_hn():
  for case in ('gru_compact', 'gru_setup'):
    linen_module, variables, nnx_model, x = _models(case, perturb=False)  # fresh init: b_hn == 0
    report = nnx_bridge.compare(linen_module, variables, nnx_model, x)
    assert report.ok, report.to_text()
    linen_module, variables, nnx_model, x = _models(case)  # "trained": b_hn != 0
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
