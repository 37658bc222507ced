"""L2N002 on Linen's lifted control flow: nn.cond / nn.switch -> nnx.cond / nnx.switch with the same
arguments, nn.while_loop -> nnx.while_loop over (module, carry). Every branch the predicate picks gives
Linen's outputs and gradients on the transferred params (the fixture's parity spec, tests/codemods/rules/test_fixture_parity.py),
the branches differ, the loop runs; branches using Linen scope APIs stay Linen."""

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

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002'
RULES = registry.select_rules(['L2N002'])
X = jax.random.normal(jax.random.key(1), (2, 4))


def _load(suffix: str) -> dict:
  return runpy.run_path(str(FIXTURES / f'control_flow.{suffix}.py'))


def test_the_branch_taken_follows_the_predicate():
  """The two nn.cond branches differ (a residual), so a port that always took one would be caught."""
  linen_module = _load('in')['Gated'](4)
  variables = linen_module.init(jax.random.key(0), X, True)
  model = _load('out')['Gated'](4, dense_in_features=4, rngs=nnx.Rngs(7))
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_module, model, X, True))
  np.testing.assert_allclose(model(X, True) - model(X, False), X, atol=1e-5)
  np.testing.assert_allclose(model(X, False), linen_module.apply(variables, X, False), atol=1e-5)


def test_the_loop_matches_linen_and_runs_three_steps():
  """Outputs only: neither library differentiates through a while loop (lax.while_loop has no reverse mode)."""
  linen_module = _load('in')['Refine'](4)
  variables = linen_module.init(jax.random.key(0), X)
  model = _load('out')['Refine'](4, step_in_features=4, rngs=nnx.Rngs(7))
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_module, model, X))
  np.testing.assert_allclose(model(X), linen_module.apply(variables, X), atol=1e-6)
  expected = X
  for _ in range(3):
    expected = jnp.tanh(model.step(expected))
  np.testing.assert_allclose(model(X), expected, atol=1e-6)


SOURCE = '''import flax.linen as nn


def outside(mdl, x):
  return nn.Dense(2)(x)


class M(nn.Module):
  def setup(self):
    self.dense = nn.Dense(2)

  def __call__(self, x, flag):
    return {call}
'''


@pytest.mark.parametrize('call, reason', [
    ("nn.cond(flag, lambda mdl, x: mdl.variable('s', 'n').value, lambda mdl, x: x, self, x)",
     "mdl.variable in a nn.cond branch"),
    ('nn.cond(flag, outside, outside, self, x)', 'the nn.cond branch outside (outside the class) uses Linen names'),
    ('nn.cond(flag, lambda mdl, x: mdl.dense(x), lambda mdl, x: x, self, x, variables=True)',
     'converted with its arguments by position'),
    ('nn.while_loop(lambda mdl, c: c < 3, lambda mdl, c: c + 1, mdl=self, init=0)', 'arguments by position'),
])
def test_other_control_flow_stays_linen_with_a_todo(call, reason):
  result = transform_source(SOURCE.format(call=call), RULES)
  assert 'class M(nn.Module)' in result.source
  (todo,) = [e for e in result.entries if e.kind == 'todo']
  assert todo.message.startswith('class M left as Linen: ') and reason in todo.message, todo.message
