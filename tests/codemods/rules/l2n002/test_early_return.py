"""Layers after `if <test on fields>: return ...` exist only where the test fails, as Linen builds them only then:
the parity of `fixtures/L2N002/early_return_heads.*` proves the port (tests/codemods/rules/test_fixture_parity.py,
which counts the parameters on both sides); here, that the port building them unconditionally, as the conversion
did before, has parameters Linen does not, and that a return on what the call gives leaves them unconditional."""

import jax
from flax import nnx

from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import models, spec, wrong_port

CASE = 'L2N002/early_return_heads'


def _param_count(model: nnx.Module) -> int:
  return len(jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_layers_built_whatever_the_return_are_parameters_linen_does_not_have(tmp_path):
  entry = spec(CASE, 'Head', 'pooled')
  _, variables, port, _ = models(CASE, entry)
  assert _param_count(port) == len(jax.tree.leaves(variables['params'])) == 2
  scope = wrong_port(CASE, ' if not self.pooled else None', '', tmp_path)
  unconditional = scope['Head'](**entry['sizes'], rngs=nnx.Rngs(0))
  assert _param_count(unconditional) == 6


def test_a_return_on_what_the_call_gives_leaves_the_layers_unconditional():
  source = '''import flax.linen as nn


class Skip(nn.Module):
  @nn.compact
  def __call__(self, x):
    if x.shape[0] == 0:
      return x
    return nn.Dense(3)(x)
'''
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert 'self.linear = nnx.Linear(in_features=linear_in_features, out_features=3, rngs=rngs)\n' in result.source
