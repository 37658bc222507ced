"""Layer loops whose input size changes from one iteration to the next in a way the code does not express (an
activation looked up by name, ALBERT's layer groups fed each other's outputs): the class converts with one size
per element as a constructor argument, `tuple[int, ...]` (parity: fixtures/L2N002/per_element_sizes.parity.json);
a port giving every element the first one's size fails on the Linen variables."""

import runpy
import textwrap

import jax
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec

CASE = 'L2N002/per_element_sizes'
RULES = registry.select_rules(['L2N002'])


def test_a_port_giving_every_element_the_first_size_fails(tmp_path):
  entry = spec(CASE, 'MLP', 'swish')
  linen_module, variables, _, xs = models(CASE, entry)
  text = (FIXTURES / f'{CASE}.out.py').read_text()
  wrong = text.replace('in_features=linears_in_features[i]', 'in_features=linears_in_features[0]')
  assert wrong != text
  (tmp_path / 'port.py').write_text(wrong)
  port = runpy.run_path(str(tmp_path / 'port.py'))['MLP'](**entry['fields'], **entry['sizes'], rngs=nnx.Rngs(0))
  with pytest.raises(Exception, match='shape'):
    nnx_bridge.compare(linen_module, variables, port, *xs)  # Dense_1's kernel is (4, 6), the port's (8, 6)


GROUPS = '''\
import flax.linen as nn
import jax.numpy as jnp


class Group(nn.Module):
  width: int

  @nn.compact
  def __call__(self, hidden_states):
    return (jnp.concatenate([nn.Dense(self.width)(hidden_states)] * 2, axis=-1),)


class LayerGroups(nn.Module):
  """ALBERT shares each group among several layers: layer i runs group `int(i / (layers / groups))`."""

  num_hidden_layers: int = 4
  num_hidden_groups: int = 2

  def setup(self):
    self.layers = [Group(3, name=str(i)) for i in range(self.num_hidden_groups)]

  def __call__(self, hidden_states):
    for i in range(self.num_hidden_layers):
      group_idx = {index}
      hidden_states = self.layers[group_idx](hidden_states)[0]
    return hidden_states
'''


def test_layers_called_by_an_index_that_is_0_first_take_the_size_of_the_iteration_that_first_calls_them():
  source = GROUPS.format(index='int(i / (self.num_hidden_layers / self.num_hidden_groups))')
  result = transform_source(source, RULES)
  assert [c.linen_name for c in result.classes] == ['Group', 'LayerGroups'], result.source
  assert 'layers_linear_in_features: tuple[int, ...]' in result.source
  linen_scope, nnx_scope = {}, {}
  exec(compile(source, 'linen.py', 'exec'), linen_scope)
  exec(compile(result.source, 'nnx.py', 'exec'), nnx_scope)
  x = jax.random.normal(jax.random.key(0), (2, 6))  # each group doubles 3: every layer's input is 6 wide
  linen = linen_scope['LayerGroups']()
  variables = linen.init(jax.random.key(1), x)
  port = nnx_scope['LayerGroups'](layers_linear_in_features=(6, 6), rngs=nnx.Rngs(0))
  report = nnx_bridge.compare(linen, variables, port, x)
  assert report.ok, report.to_text()


@pytest.mark.parametrize('index', ['i + 1', 'self.num_hidden_groups - 1 - i // 2'])
def test_an_index_that_is_not_0_in_the_first_iteration_keeps_the_class_linen(index):
  result = transform_source(textwrap.dedent(GROUPS.format(index=index)), RULES)
  assert result.classes == ()  # Group, which LayerGroups builds by name=, stays Linen with it
  assert any(e.message.startswith('class LayerGroups left as Linen: self.layers (a list of layers) used other than by')
             for e in result.entries if e.kind == 'todo')
