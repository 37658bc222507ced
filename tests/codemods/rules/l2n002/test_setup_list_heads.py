"""A setup() loop filling two lists, one of them with its first layer written out before the loop (diffusers' mid
blocks), called as `self.resnets[0](...)` and then zipped as `zip(self.attentions, self.resnets[1:])` (parity:
fixtures/L2N002/diffusers_mid_block.parity.json)."""

import runpy

import pytest
from flax import nnx

import nnx_bridge
from nnx_bridge.derive import MappingError
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec

CASE = 'L2N002/diffusers_mid_block'
RULES = registry.select_rules(['L2N002'])
NAME = 'FlaxTinyUNetMidBlock2DCrossAttn'


def test_a_port_running_the_written_out_layer_last_fails(tmp_path):
  entry = spec(CASE, NAME)
  linen_module, variables, nnx_model, xs = models(CASE, entry)
  assert nnx_bridge.compare(linen_module, variables, nnx_model, *xs).ok
  source = (FIXTURES / f'{CASE}.out.py').read_text()
  first = '    hidden_states = self.resnets[0](hidden_states, temb)\n'
  last = '\n    return hidden_states\n'
  assert source.count(first) == 1 and source.endswith(last)
  path = tmp_path / 'wrong.py'
  path.write_text(source.replace(first, '')[:-len(last)] + '\n' + first + last.lstrip('\n'))
  wrong = runpy.run_path(str(path))[NAME](**entry['fields'], **entry['sizes'], rngs=nnx.Rngs(0))
  with pytest.raises(MappingError, match='pairs with'):  # its layers run in another order: verify refuses it
    nnx_bridge.compare(linen_module, variables, wrong, *xs)


def test_zipping_the_whole_list_is_a_todo_naming_the_slice():
  source = (FIXTURES / f'{CASE}.in.py').read_text().replace('self.resnets[1:]', 'self.resnets')
  result = transform_source(source.encode(), RULES)
  todos = [e.message for e in result.entries if e.kind == 'todo']
  assert len(todos) == 1 and 'zip self.resnets[1:], the layers its loop appends' in todos[0], todos
  assert f'class {NAME}(nn.Module)' in result.source.decode()
