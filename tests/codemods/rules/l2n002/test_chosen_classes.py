"""L2N002 on a local of setup() that names one class or another (`constructions.chosen_classes`, `choices.py`): the
fixture `hf_chosen_classes` proves the ports in each arm (tests/codemods/rules/test_fixture_parity.py); here, that
each arm builds its own class with its own input sizes, and that a choice the conversion cannot keep stays Linen
with a TODO saying why."""

import jax
import pytest

from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules import test_fixture_parity as fixture_parity
from tests.codemods.rules.l2n002 import test_linen_parents as linen_parents

CASE = 'L2N002/hf_chosen_classes'


def test_each_arm_builds_its_class():
  """The decoder's block holds the full attention layer, the encoder's the local one: the bindings decide, as in
  Linen, and the stage's conditional expression likewise."""
  built = {}
  for name, entry_id in (('FlaxTinyBlock', 'decoder'), ('FlaxTinyBlock', 'local'), ('FlaxTinyStage', 'bottleneck'),
                         ('FlaxTinyStage', 'basic')):
    _, _, model, (x,) = fixture_parity.models(CASE, fixture_parity.spec(CASE, name, entry_id))
    first = model.layer[0] if name == 'FlaxTinyBlock' else model.layers
    built[entry_id] = type(first).__name__
    assert model(x)[0].shape[-1] == x.shape[-1] if name == 'FlaxTinyBlock' else model(x).shape[-1] == 6
  assert built == {'decoder': 'FlaxTinyLayerSelfAttention', 'local': 'FlaxTinyLayerLocalSelfAttention',
                   'bottleneck': 'FlaxTinyBottleNeckLayer', 'basic': 'FlaxTinyBasicLayer'}
  shortcuts = {entry_id: type(fixture_parity.models(CASE, fixture_parity.spec(CASE, 'FlaxTinyXLayer', entry_id))[2]
                              .shortcut).__name__ for entry_id in ('projected', 'identity')}
  assert shortcuts == {'projected': 'FlaxTinyShortCut', 'identity': 'Identity'}


SOURCE = '''import flax.linen as nn


class A(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features)(x)


class B(nn.Module):
{b_fields}

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features)(x)


class M(nn.Module):
  wide: bool = True

  def setup(self):
{body}

  def __call__(self, x):
    return self.layer(x)
'''


def _todo(b_fields: str, body: str) -> str:
  return _todo_of(SOURCE.format(b_fields=b_fields, body=body))


@pytest.mark.parametrize('b_fields, body, message', [
    ('  features: int', '    layer = A if self.wide else B\n    self.kind = layer\n    self.layer = layer(4)',
     'is named other than to build it'),
    ('  features: int', '    layer = A if self.wide else B\n    print(B.__name__)\n    self.layer = layer(4)',
     'B, a Linen module class, is named other than to build it'),
])
def test_choices_that_stay_linen(b_fields, body, message):
  assert message in _todo(b_fields, body)


def test_sizes_of_the_same_names_go_in_the_construction():
  """A and B take their input size by the same name: the one construction passes it, the binding stays as it is
  (the fixture's block, whose classes name them otherwise, gets them where its local names each class)."""
  result = transform_source(SOURCE.format(b_fields='  features: int', body='    layer = A if self.wide else B\n'
                                                                            '    self.layer = layer(4)'),
                            registry.select_rules(['L2N002']))
  assert not [e for e in result.entries if e.kind == 'todo']
  assert '    layer = A if self.wide else B\n' in result.source
  assert 'self.layer = layer(4, linear_in_features=layer_linear_in_features, rngs=rngs)' in result.source
  assert 'functools' not in result.source


def test_a_class_that_stays_linen_keeps_the_choice_linen():
  """A class the local may name stays Linen (here: it asks `self.is_mutable_collection`): the construction cannot
  build it as an NNX class, so the class choosing stays Linen too, saying which."""
  source = SOURCE.format(b_fields='  features: int', body='    layer = A if self.wide else B\n    self.layer = layer(4)')
  source = source.replace('    return nn.Dense(self.features)(x)\n\n\nclass M',
                          '    if self.is_mutable_collection("stats"):\n      x = x + 1\n'
                          '    return nn.Dense(self.features)(x)\n\n\nclass M')
  assert 'layer(...) builds one class or another, as the local layer names them: it converts when every class it ' \
         'may build converts' in _todo_of(source)


def _todo_of(source: str) -> str:
  result = transform_source(source, registry.select_rules(['L2N002']))
  (todo,) = [e for e in result.entries if e.kind == 'todo' and e.message.startswith('class M left')]
  return todo.message


def test_arms_whose_calls_differ_stay_linen():
  """`A(4) if self.wide else B(4)` called with an argument only B takes: the call cannot run A."""
  source = SOURCE.format(b_fields='  features: int', body='    self.layer = A(4) if self.wide else B(4)')
  source = source.replace('class B(nn.Module):\n  features: int\n\n  @nn.compact\n  def __call__(self, x):',
                          'class B(nn.Module):\n  features: int\n\n  @nn.compact\n  def __call__(self, x, scale=1.0):')
  source = source.replace('return self.layer(x)', 'return self.layer(x, scale=2.0)')
  assert 'self.layer is built by two arms of an if, as modules that take other call arguments' in _todo_of(source)


HELD_COLLECTION = '''

class FlaxTinyBlockCollection(nn.Module):
  config: TinyLongT5Config
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.first = FlaxTinyBlock(self.config, has_relative_attention_bias=True, dtype=self.dtype, name="0")
    self.second = FlaxTinyBlock(self.config, dtype=self.dtype, name="1")

  def __call__(self, hidden_states, deterministic=True):
    hidden_states = self.first(hidden_states, deterministic=deterministic)[0]
    return self.second(hidden_states, deterministic=deterministic)[0]


class FlaxTinyPreTrainedModel:
  module_class = FlaxTinyBlockCollection  # held for transformers' init / apply: it stays Linen
'''


@pytest.mark.parametrize('causal', [True, False])
def test_a_linen_parent_runs_the_converted_blocks_on_its_own_variables(causal):
  """LongT5's block collection stays Linen (a wrapper holds it) and builds the converted blocks through to_linen:
  in either arm of the block's choice it creates the original's variables and, on them, gives its outputs and
  gradients."""
  original = (fixture_parity.FIXTURES / f'{CASE}.in.py').read_text() + HELD_COLLECTION
  result = transform_source(original, registry.ALL_RULES)
  assert 'class FlaxTinyBlock(nnx.Module):' in result.source
  assert 'nnx_bridge.to_linen(FlaxTinyBlock, ' in result.source
  namespaces = [{}, {}]
  for source, namespace in zip((original, result.source), namespaces):
    exec(compile(source, 'models.py', 'exec'), namespace)
  config = lambda ns: ns['TinyLongT5Config'](causal=causal)
  linen, bridged = (ns['FlaxTinyBlockCollection'](config(ns)) for ns in namespaces)
  linen_parents._same_model(linen, bridged, jax.random.normal(jax.random.key(1), (2, 3, 8)))


HELD_STAGES = '''

class FlaxTinyModule(nn.Module):
  config: TinyResNetConfig

  def setup(self):
    self.encoder = FlaxTinyStageCollection(self.config)

  def __call__(self, pixel_values, deterministic=True):
    return self.encoder(pixel_values, deterministic=deterministic)[0]


class FlaxTinyPreTrainedModel:
  module_class = FlaxTinyModule  # held for transformers' init / apply: it stays Linen
'''


@pytest.mark.parametrize('layer_type', ['bottleneck', 'basic'])
def test_a_linen_parent_keeps_the_names_each_layer_class_gives(layer_type):
  """ResNet's model stays Linen (a wrapper holds it) and builds the converted stages through to_linen. The stage's
  layers are bottleneck or basic layers as the config says, and each names its convolutions its own way (`0`, `1`
  or `layer_0`, `layer_1`): the wrapper's names say whose each is, so that in either arm the parent creates the
  original's variables and, on them, gives its outputs and gradients."""
  case = 'L2N002/hf_chosen_classes_in_lists'
  original = (fixture_parity.FIXTURES / f'{case}.in.py').read_text() + HELD_STAGES
  result = transform_source(original, registry.ALL_RULES)
  assert 'nnx_bridge.to_linen(FlaxTinyStageCollection, ' in result.source
  assert "'stages.{}.layers.layers.{}.layer@FlaxTinyBasicLayer': 'layer_{}'" in result.source
  assert "'stages.{}.layers.layers.{}.layer@FlaxTinyBottleNeckLayer': '{}'" in result.source
  namespaces = [{}, {}]
  for source, namespace in zip((original, result.source), namespaces):
    exec(compile(source, 'models.py', 'exec'), namespace)
  linen, bridged = (ns['FlaxTinyModule'](ns['TinyResNetConfig'](layer_type=layer_type)) for ns in namespaces)
  linen_parents._same_model(linen, bridged, jax.random.normal(jax.random.key(1), (2, 8, 8, 3)))


def test_classes_sized_by_other_names_in_a_loop_are_each_built_by_name():
  """A local naming classes whose input sizes have other names, building a list before and in a loop: no one
  construction can give each its own, nor the binding (the sizes differ per construction), so each construction
  builds each class by name with its own sizes, under `layer is <class>`; the fixture `hf_chosen_classes_in_lists`
  proves such ports in each arm."""
  source = '''import flax.linen as nn


class A(nn.Module):
  def setup(self):
    self.dense = nn.Dense(4)

  def __call__(self, x):
    return self.dense(x)


class B(nn.Module):
  def setup(self):
    self.proj = nn.Dense(4)

  def __call__(self, x):
    return self.proj(x)


class M(nn.Module):
  wide: bool = True

  def setup(self):
    layer = A if self.wide else B
    layers = [layer()]
    for _ in range(2):
      layers.append(layer())
    self.layers = layers

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x
'''
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert not [e for e in result.entries if e.kind == 'todo']
  assert ('self.layers = nnx.List([A(dense_in_features=layers_dense_in_features, rngs=rngs) if layer is A else '
          'B(proj_in_features=layers_dense_in_features, rngs=rngs), *[A(dense_in_features=4, rngs=rngs) if layer is A '
          'else B(proj_in_features=4, rngs=rngs) for _ in range(2)]])') in result.source


def test_each_arm_builds_its_class_in_every_element_of_a_list():
  """The stage's first layer and those of its loop are of the class the config names, in either arm."""
  case = 'L2N002/hf_chosen_classes_in_lists'
  for entry_id, kind in (('bottleneck', 'FlaxTinyBottleNeckLayer'), ('basic', 'FlaxTinyBasicLayer')):
    _, _, model, (x,) = fixture_parity.models(case, fixture_parity.spec(case, 'FlaxTinyStageLayersCollection',
                                                                        entry_id))
    assert [type(layer).__name__ for layer in model.layers] == [kind] * 3
    assert model(x).shape == (2, 2, 2, 6)


def test_the_construction_keeps_its_arguments_where_they_stand():
  """B takes `features` second: the keyword stays a keyword, as every class the local names takes it so."""
  result = transform_source(SOURCE.format(b_fields='  scale: float = 1.0\n  features: int = 4',
                                          body='    layer = A if self.wide else B\n    self.layer = layer(features=4)'),
                            registry.select_rules(['L2N002']))
  assert not [e for e in result.entries if e.kind == 'todo']
  assert 'self.layer = layer(features=4, linear_in_features=layer_linear_in_features, rngs=rngs)' in result.source
