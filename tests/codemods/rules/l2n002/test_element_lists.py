"""L2N002 on setup() lists written out (`self.layer = [A(...), A(...)]`, transformers' ResNet collections, or a tuple
built in steps, T5's `self.layer += (B(...),)`): the
fixture's parity (tests/codemods/rules/test_fixture_parity.py) proves the ports; here, that each element is sized
from the one before it, that a port with two elements swapped is caught, and that lists of other shapes keep a
precise TODO."""

import numpy as np
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules import test_fixture_parity as fixture_parity

CASE = 'L2N002/hf_element_lists'


def _converted(source: str) -> str:
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert not [e for e in result.entries if e.kind == 'todo']
  return result.source


def _todo(source: str) -> str:
  """Why class M stays Linen."""
  result = transform_source(source, registry.select_rules(['L2N002']))
  (todo,) = [e for e in result.entries if e.kind == 'todo' and e.message.startswith('class M left')]
  return todo.message


def test_each_element_takes_the_size_the_one_before_returned():
  """Element 0 takes the input's size (a constructor argument), element k what element k - 1 returns."""
  out = _converted('''import flax.linen as nn


class Head(nn.Module):
  def setup(self):
    self.layers = [nn.Dense(8), nn.Dense(4), nn.Dense(2)]

  def __call__(self, x):
    for layer in self.layers:
      x = nn.relu(layer(x))
    return x
''')
  assert 'self.layers = nnx.List([nnx.Linear(in_features=layers_in_features, out_features=8, rngs=rngs), ' \
         'nnx.Linear(in_features=8, out_features=4, rngs=rngs), nnx.Linear(in_features=4, out_features=2, ' \
         'rngs=rngs)])' in out


def test_a_conditional_whose_arms_disagree_gives_no_size():
  """`h if ... else nn.Dense(3)(h)` returns either size: the next element's input size is a constructor argument,
  not the one of either arm."""
  out = _converted('''import flax.linen as nn


class Maybe(nn.Module):
  project: bool

  def setup(self):
    self.dense = nn.Dense(3)

  def __call__(self, h):
    return self.dense(h) if self.project else h


class Stack(nn.Module):
  def setup(self):
    self.blocks = [Maybe(True), Maybe(False)]

  def __call__(self, x):
    for block in self.blocks:
      x = block(x)
    return x
''')
  assert 'Maybe(True, dense_in_features=blocks_dense_in_features, rngs=rngs), ' \
         'Maybe(False, dense_in_features=blocks_dense_in_features_, rngs=rngs)' in out


def test_swapped_elements_are_caught():
  """The two 1x1 convolutions of the bottleneck exchanged in the port: its outputs no longer match Linen's."""
  entry = dict(fixture_parity.spec(CASE, 'FlaxTinyBottleNeckLayerCollection'),
               fields={'out_channels': 3, 'reduction': 1}, sizes={'layer_convolution_in_features': 3})
  linen_module, variables, model, (x,) = fixture_parity.models(CASE, entry)
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_module, model, x))
  expected = linen_module.apply(variables, x)
  model.eval()
  np.testing.assert_allclose(model(x), expected, atol=1e-5)
  first, last = nnx.state(model.layer[0]), nnx.state(model.layer[2])
  nnx.update(model.layer[0], last)
  nnx.update(model.layer[2], first)
  assert not np.allclose(model(x), expected, atol=1e-3)


SETUP = '''import flax.linen as nn


class Other(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic=True):
    return nn.Dropout(0.5, deterministic=deterministic)(nn.Dense(4)(x))


class Another(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic=True):
    return nn.Dropout(0.1, deterministic=deterministic)(x)


class M(nn.Module):
  wide: bool = True

  def setup(self):
{body}

  def __call__(self, x):
{call}
    return x
'''
LOOP = '    for layer in self.layers:\n      x = layer(x)'
HEADED = '''    layers = [nn.Dense(4, {head})]
    for i in range(2):
      layers.append(nn.Dense(4, {loop}))
    self.layers = layers'''  # the first layer written out, the others appended (transformers' ResNet stages)
STEPS = '''    self.layers = (nn.Dense(4),)
    if self.wide:
      self.layers += (nn.Dense(4),)
    self.layers += (nn.Dense(2),)'''  # a tuple built in steps: the last layer stands at 1 or 2


@pytest.mark.parametrize('body, call, message', [
    ('    self.layers = [Other(), Another()]', '    for layer in self.layers:\n      x = layer(x, True)',
     'a list of layers of several classes (Another, Other) called with more than its input'),
    ('    self.layers = [nn.Dense(4), nn.relu]', LOOP, 'a list of layers beside other values'),
    ("    self.layers = [nn.Dense(4, name='a'), nn.Dense(4, name='b')]", LOOP,
     "a list of layers named 'a', 'b' (converted: no name=, or names that end in their index)"),
    ('    if self.wide:\n      self.layers = [nn.Dense(4), nn.Dense(4)]', LOOP,
     'a list of layers built inside a block of setup()'),
    ('    self.layers = [nn.Dense(4), nn.Dense(4)]', '    first = self.layers[0]\n    x = first(x)',
     'self.layers (a list of layers) used other than by `for layer in self.layers:`'),
    (STEPS, '    x = self.layers[1](x)',
     'self.layers[1]: the layer it calls depends on conditions the call does not fix (2 layers of the list may '
     'stand there)'),
    (STEPS, LOOP, 'a for loop over self.layers, a list of layers some of which setup() adds under a condition'),
    (STEPS.replace('nn.Dense(4)', 'nn.Dense(4, name=str(1))').replace('nn.Dense(2)', 'nn.Dense(2, name=str(1))'),
     '    x = self.layers[-1](x)', 'a list of layers named str(1), str(1), str(1) (converted: no name=, or names '
                                  'that end in their index)'),
    (HEADED.format(head='name="first"', loop='name=str(i + 1)'), LOOP,
     "self.layers: a layer written out before the loop named \"first\", where Linen names the element at its place 0"),
    (HEADED.format(head='name="0"', loop='name=str(i)'), LOOP, 'self.layers: name=str(i) in a setup() list'),
    (HEADED.format(head='name="0"', loop=''), LOOP,
     'self.layers: a layer written out before the loop named "0", where Linen names the element at its place layers_0'),
])
def test_lists_that_stay_linen(body, call, message):
  assert message in _todo(SETUP.format(body=body, call=call))



COUNTED = '''import flax.linen as nn


class M(nn.Module):
  causal: bool = False

  def setup(self):
    index = 1
    for k in range(2):
{loop}
    self.layers = (nn.Dense(4, name=str(0)),)
    if self.causal:
      self.layers += (nn.Dense(4, name=str(index)),)
      index += 1
    self.layers += (nn.Dense(4, name=str(index)),)

  def __call__(self, x):
    return self.layers[-1](self.layers[0](x))
'''


def test_names_by_a_counter_are_checked_in_every_configuration():
  """T5's `name=str(feed_forward_index)`: a loop of setup() that leaves the counter alone does not matter; one that
  moves it leaves the names unknown, and the class Linen."""
  assert 'class M(nnx.Module)' in _converted(COUNTED.format(loop='      scale = k * 2'))
  assert 'a list of layers named str(0), str(index), str(index)' in _todo(COUNTED.format(loop='      index += k'))
