"""Sharding annotations: `nn.with_logical_partitioning` / `nn.with_partitioning` -> `nnx.with_partitioning(...,
eager_sharding=False)`, the names kept on each Variable and no mesh needed to build the model, as in Linen (parity:
fixtures/L2N002/lm1b_logical_partitioning.parity.json, sharding specs compared too)."""

import runpy
import textwrap

import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec

CASE = 'L2N002/lm1b_logical_partitioning'
RULES = registry.select_rules(['L2N002'])


def _port(tmp_path, edit) -> dict:
  """The globals of the fixture's port with `edit` applied to its code."""
  source = (FIXTURES / f'{CASE}.out.py').read_text()
  edited = edit(source)
  assert edited != source
  path = tmp_path / 'port.py'
  path.write_text(edited)
  return runpy.run_path(str(path))


def test_the_port_keeps_each_annotation_and_a_port_with_other_names_fails(tmp_path):
  linen_module, variables, nnx_model, xs = models(CASE, spec(CASE, 'MlpBlock'))
  report = nnx_bridge.compare(linen_module, variables, nnx_model, *xs)
  assert report.ok and {row.nnx_spec for row in report.sharding} >= {"('embed', 'mlp')", "('mlp', 'embed')"}
  wrong = _port(tmp_path, lambda s: s.replace("sharding=('mlp', 'embed')", "sharding=('embed', 'mlp')"))
  config = wrong['TransformerConfig']()
  report = nnx_bridge.compare(linen_module, variables, wrong['MlpBlock'](config, linear1_in_features=8,
                                                                        rngs=nnx.Rngs(0)), *xs)
  assert not report.ok
  assert [row.nnx for row in report.failures] == ['linear2/kernel']


def test_without_eager_sharding_false_the_port_needs_a_mesh(tmp_path):
  """NNX shards an annotated Variable as it creates it unless told not to: the keyword keeps Linen's behaviour."""
  ported = _port(tmp_path, lambda s: s.replace(', eager_sharding=False', ''))
  with pytest.raises(ValueError, match='mesh'):
    ported['Embedder'](ported['TransformerConfig'](), rngs=nnx.Rngs(0))


def test_rules_passed_by_position_are_a_todo_naming_the_keyword():
  source = textwrap.dedent('''\
      import flax.linen as nn

      RULES = (('embed', 'model'),)

      class Head(nn.Module):
        @nn.compact
        def __call__(self, x):
          init = nn.with_logical_partitioning(nn.initializers.ones, ('embed',), None, RULES)
          return x * self.param('w', init, (3,))
      ''')
  result = transform_source(source.encode(), RULES)
  todos = [e.message for e in result.entries if e.kind == 'todo']
  assert len(todos) == 1 and 'any other argument by its keyword (fn, names, mesh, rules)' in todos[0], todos
  assert 'sharding_rules' in todos[0] and 'class Head(nn.Module)' in result.source.decode()
