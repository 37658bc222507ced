"""What only Linen's init sees is `False` in NNX, where no call creates variables: `self.is_initializing()` read as a
value and `self.is_mutable_collection('params')` (parity: fixtures/L2N002/dopamine_init_only_branch.parity.json);
a test of another collection keeps the class Linen, saying what to test instead."""

import runpy
import textwrap

from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec

CASE = 'L2N002/dopamine_init_only_branch'
RULES = registry.select_rules(['L2N002'])


def test_a_port_that_keeps_the_init_branch_fails(tmp_path):
  """With the init-only flag True, as in Linen's init, the port zeroes what Linen's apply returns."""
  linen_module, variables, nnx_model, xs = models(CASE, spec(CASE, 'Encoder'))
  assert nnx_bridge.compare(linen_module, variables, nnx_model, *xs).ok
  source = (FIXTURES / f'{CASE}.out.py').read_text()
  assert source.count('warming_up = False') == 1
  wrong_path = tmp_path / 'wrong.py'
  wrong_path.write_text(source.replace('warming_up = False', 'warming_up = True'))
  wrong = runpy.run_path(str(wrong_path))['Encoder'](5, linear_in_features=4, rngs=nnx.Rngs(0))
  report = nnx_bridge.compare(linen_module, variables, wrong, *xs)
  assert not report.ok
  assert any(d.check == 'output' and not d.ok for d in report.differences)


def test_another_mutable_collection_keeps_the_class_linen_saying_what_to_test():
  source = textwrap.dedent('''\
      import flax.linen as nn

      class Norm(nn.Module):
        @nn.compact
        def __call__(self, x):
          training = self.is_mutable_collection('batch_stats')
          return nn.Dense(3)(x) * (2.0 if training else 1.0)
      ''')
  result = transform_source(source.encode(), RULES)
  assert result.source.decode().count('class Norm(nn.Module)') == 1
  todos = [e.message for e in result.entries if e.kind == 'todo']
  assert len(todos) == 1 and "self.is_mutable_collection('batch_stats'): NNX variables are always mutable" in todos[0]
  assert 'model.train() / model.eval()' in todos[0]
