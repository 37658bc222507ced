"""L2N002 on `name=` given to a setup() construction: the NNX attribute is the one the code assigns, the Linen name
(any string: transformers' ResNet and RegNet heads name theirs "1") is only where the variables live, for the report
and the checkpoint mapping. Parity on transferred parameters through the report's names, as `linen2nnx verify
--migrate-report` gives them; the names swapped are caught."""

import textwrap

import jax
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source

# In the style of transformers' FlaxResNetClassifierCollection / FlaxRegNetSELayerCollection.
SOURCE = textwrap.dedent('''\
    import flax.linen as nn
    import jax.numpy as jnp


    class FlaxSqueezeExcitationCollection(nn.Module):
        in_channels: int
        reduced_channels: int
        dtype: jnp.dtype = jnp.float32

        def setup(self):
            self.reduce = nn.Conv(self.reduced_channels, kernel_size=(1, 1), dtype=self.dtype, name="0")
            self.expand = nn.Conv(self.in_channels, kernel_size=(1, 1), dtype=self.dtype, name="2")

        def __call__(self, hidden_state):
            hidden_state = nn.relu(self.reduce(hidden_state))
            return nn.sigmoid(self.expand(hidden_state))


    class FlaxClassifierCollection(nn.Module):
        num_labels: int
        dtype: jnp.dtype = jnp.float32

        def setup(self):
            self.classifier = nn.Dense(self.num_labels, dtype=self.dtype, name="1")
            self.pooler = nn.Dense(self.num_labels, dtype=self.dtype, name="pool")

        def __call__(self, x):
            return self.classifier(x) - 2 * self.pooler(x)
''')


@pytest.fixture(scope='module')
def migrated():
  result = transform_source(SOURCE, registry.select_rules(['L2N002']))
  scope, linen_scope = {}, {}
  exec(compile(result.source, '<nnx>', 'exec'), scope)
  exec(compile(SOURCE, '<linen>', 'exec'), linen_scope)
  return result, scope, linen_scope


def test_the_attribute_is_the_nnx_name_and_name_the_linen_one(migrated):
  result, _, _ = migrated
  records = {c.linen_name: c for c in result.classes}
  assert set(records) == {'FlaxSqueezeExcitationCollection', 'FlaxClassifierCollection'}
  names = {(c.linen_name, c.nnx_attribute) for c in records['FlaxClassifierCollection'].children}
  assert names == {('1', 'classifier'), ('pool', 'pooler')}
  assert {(c.linen_name, c.nnx_attribute) for c in records['FlaxSqueezeExcitationCollection'].children} == {
      ('0', 'reduce'), ('2', 'expand')}
  assert '*, classifier_in_features: int, rngs' in result.source  # one size: both are called on x
  assert 'self.pooler = nnx.Linear(in_features=classifier_in_features,' in result.source
  assert '*, reduce_in_features: int, rngs' in result.source


@pytest.mark.parametrize('name, sizes, shape', [
    ('FlaxClassifierCollection', {'num_labels': 3, 'classifier_in_features': 5}, (2, 5)),
    ('FlaxSqueezeExcitationCollection', {'in_channels': 4, 'reduced_channels': 2, 'reduce_in_features': 4},
     (2, 3, 3, 4)),
])
def test_parity_through_the_reported_names(migrated, name, sizes, shape):
  result, scope, linen_scope = migrated
  record = next(c for c in result.classes if c.linen_name == name)
  fields = {k: v for k, v in sizes.items() if not k.endswith('_in_features')}
  linen_module = linen_scope[name](**fields)
  x = jax.random.normal(jax.random.key(0), shape)
  variables = linen_module.init(jax.random.key(1), x)
  assert set(variables['params']) == {c.linen_name for c in record.children}
  model = scope[name](**sizes, rngs=nnx.Rngs(0))
  pairs = {(c.linen_name,): (c.nnx_attribute,) for c in record.children}
  mapping = nnx_bridge.derive_mapping(linen_module, model, x, layer_pairs=pairs)
  report = nnx_bridge.compare(linen_module, variables, model, x, mapping=mapping)
  assert report.ok, report.to_text()
  if name == 'FlaxClassifierCollection':  # two Dense of one shape: the names swapped map without error, wrongly
    swapped = {linen: pairs[other] for linen, other in zip(pairs, reversed(list(pairs)))}
    wrong = nnx_bridge.derive_mapping(linen_module, model, x, layer_pairs=swapped)
    assert not nnx_bridge.compare(linen_module, variables, model, x, mapping=wrong).ok


def test_an_inline_construction_named_other_than_an_identifier_stays_linen():
  source = textwrap.dedent('''\
      import flax.linen as nn


      class Head(nn.Module):
          @nn.compact
          def __call__(self, x):
              return nn.Dense(3, name="1")(x)
  ''')
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert not result.classes
  assert [e.message for e in result.entries if e.kind == 'todo'] == [
      'class Head left as Linen: name= is not a literal identifier']
