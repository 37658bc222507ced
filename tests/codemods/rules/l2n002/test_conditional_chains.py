"""Submodules built in if / elif / else chains and nested conditionals on fields (`planner._construction_conditions`)
exist in NNX exactly when Linen creates them (parity: fixtures/L2N002/conditional_chains.parity.json); a port with
a wrong condition fails, and constructions under a loop in an arm or under a test on the call keep the class Linen
with a TODO at the conditional or the test."""

import re
import runpy
import textwrap

import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec

CASE = 'L2N002/conditional_chains'
RULES = registry.select_rules(['L2N002'])


def test_a_port_that_builds_the_layer_of_another_arm_fails(tmp_path):
  entry = spec(CASE, 'Block', 'layer without bias')
  linen_module, variables, _, xs = models(CASE, entry)
  text = (FIXTURES / f'{CASE}.out.py').read_text()
  wrong = text.replace("(self.norm == 'layer') and self.use_bias else None",
                       "(self.norm == 'layer') and not self.use_bias else None")  # the bias-free layer's test
  assert wrong != text
  (tmp_path / 'port.py').write_text(wrong)
  port = runpy.run_path(str(tmp_path / 'port.py'))['Block'](norm='layer', use_bias=False, **entry['sizes'],
                                                            rngs=nnx.Rngs(0))
  with pytest.raises(nnx_bridge.MappingError, match='NNX layer_norm1 \\(LayerNorm\\) has no Linen counterpart'):
    nnx_bridge.compare(linen_module, variables, port, *xs)  # Linen's LayerNorm_0 has no bias: the port's has one


@pytest.mark.parametrize('arm, todo', [
    ('for _ in range(2):\n  x = nn.LayerNorm()(x)',
     r'^9:5 .*the @nn.compact body has loops, conditionals or nested blocks'),
    (None, r'^11:10 .*a submodule created under a condition on the call'),
])
def test_constructions_a_conditional_cannot_hold_keep_the_class_linen_with_a_todo(arm, todo):
  body = arm or 'x = nn.LayerNorm()(x)'
  test = 'x.ndim == 3' if arm is None else "self.norm == 'layer'"
  source = textwrap.dedent('''\
      import flax.linen as nn


      class Block(nn.Module):
        norm: str = 'layer'

        @nn.compact
        def __call__(self, x):
          if self.norm == 'batch':
            pass
          elif {test}:
      {body}
          return x
      ''').format(test=test, body=textwrap.indent(body, ' ' * 6))
  result = transform_source(source.encode(), RULES)
  todos = [f'{e.line}:{e.column} {e.message}' for e in result.entries if e.kind == 'todo']
  assert result.classes == () and len(todos) == 1 and re.match(todo, todos[0]), todos
