"""L2N002 fixtures run for real: what the converted classes do beyond parity with Linen (tests/codemods/rules/test_fixture_parity.py),
and the constructs that stay Linen."""

import pathlib
import runpy

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002'
RULES = registry.select_rules(['L2N002'])


def _load(case: str, suffix: str) -> dict:
  return runpy.run_path(str(FIXTURES / f'{case}.{suffix}.py'))


def test_new_size_arguments_are_reported():
  result = transform_source((FIXTURES / 'setup_mlp.in.py').read_text(), RULES)
  messages = [e.message for e in result.entries]
  assert "new constructor argument dense1_in_features: in_features of self.dense1, the input dimension of self.dense1's call argument x" in messages
  assert 'dense2_in_features' not in result.source  # derived: self.hidden


def test_dropout_trains_with_its_own_rng_stream():
  model = _load('compact_dropout_batchnorm', 'out')['Net'](width=6, stem_in_features=5, rngs=nnx.Rngs(0, dropout=1))
  x = jax.random.normal(jax.random.key(0), (3, 5))
  model.train()
  first, second = model(x), model(x)
  assert not jnp.allclose(first, second)  # fresh masks, BatchNorm stats updated in place
  model.eval()
  assert jnp.allclose(model(x), model(x))


@pytest.mark.parametrize('case', sorted(p.name[:-6] for p in FIXTURES.glob('*.in.py')))
def test_migrating_again_changes_nothing(case):
  once = transform_source((FIXTURES / f'{case}.in.py').read_text(), registry.ALL_RULES)
  assert transform_source(once.source, registry.ALL_RULES).source == once.source


def test_guide_collections_counter_keeps_its_collection_and_counts():
  ns = _load('guide_collections', 'out')
  model = ns['Block'](4, dense_in_features=4, rngs=nnx.Rngs(0))
  assert nnx.variable_name_from_type(ns['Counter']) == 'counter'  # Linen interop keeps the collection name
  model(jnp.ones((2, 4)))
  model(jnp.ones((2, 4)))
  assert int(model.count[...]) == 2
  _, params, batch_stats, count = nnx.split(model, nnx.Param, nnx.BatchStat, ns['Counter'])
  assert set(params.keys()) == {'batchnorm', 'dense'} and set(batch_stats.keys()) == {'batchnorm'}
  assert set(count.keys()) == {'count'}


def test_guide_multiple_methods_decoder_size_is_derived_through_encode():
  source = (FIXTURES / 'guide_multiple_methods.out.py').read_text()
  assert 'nnx.Linear(in_features=self.embed_dim, out_features=self.output_dim' in source
  model = _load('guide_multiple_methods', 'out')['AutoEncoder'](256, 784, encoder_in_features=784, rngs=nnx.Rngs(0))
  assert model.encoder.kernel.shape == (784, 256) and model.decoder.kernel.shape == (256, 784)
  assert model.encode(jnp.ones((1, 784))).shape == (1, 256)


def test_scope_variables_match_linen_with_transferred_state():
  x = jax.random.normal(jax.random.key(0), (2, 4))
  linen_module = _load('scope_variables', 'in')['NoisyHead'](hidden=3, noise=0.0)
  variables = linen_module.init(jax.random.key(1), x)
  assert int(variables['stats']['steps']) == 0  # the is_initializing guard kept init from counting
  model = _load('scope_variables', 'out')['NoisyHead'](
      hidden=3, noise=0.0, linear_in_features=4, rngs=nnx.Rngs(0, noise=1))
  mapping = nnx_bridge.derive_mapping(linen_module, model, x)
  nnx_bridge.linen_to_nnx(variables, model, mapping)
  want, updates = linen_module.apply(variables, x, rngs={'noise': jax.random.key(2)}, mutable=['stats', 'intermediates'])
  got = model(x)
  assert jnp.allclose(want, got, atol=1e-6)
  assert int(model.steps[...]) == int(updates['stats']['steps']) == 1
  linen_grad = jax.grad(lambda p: linen_module.apply({**variables, 'params': p}, x, rngs={'noise': jax.random.key(2)},
                                                    mutable=['stats'])[0].sum())(variables['params'])
  nnx_grad = nnx.grad(lambda m: m(x).sum())(model)
  assert jnp.allclose(linen_grad['bias'], nnx_grad['bias'][...], atol=1e-6)
  assert jnp.allclose(linen_grad['Scale_0']['scale'], nnx_grad['scale']['scale'][...], atol=1e-6)


def test_make_rng_draws_fresh_noise_from_its_stream_and_sow_is_captured():
  model = _load('scope_variables', 'out')['NoisyHead'](
      hidden=3, linear_in_features=4, rngs=nnx.Rngs(0, noise=1))
  x = jnp.ones((2, 4))
  assert not jnp.allclose(model(x), model(x))
  _, intermediates = nnx.capture(model, nnx.Intermediate)(x)
  assert intermediates['features'][0].shape == (2, 3)


def test_todo_case_is_left_unchanged_with_reasons():
  source = (FIXTURES / 'todo_loop.in.py').read_text()
  result = transform_source(source, RULES)
  assert [e.kind for e in result.entries] == ['todo', 'todo']
  code_lines = [line for line in result.source.splitlines() if 'TODO(linen2nnx)' not in line]
  assert code_lines == source.splitlines()


@pytest.mark.parametrize('snippet, reason', [
    ('  @nn.compact\n  def __call__(self, x):\n    d = nn.Dense(3)\n    f = d\n    return f(x)\n',
     'the submodule d used other than by calling it'),
    ('  @nn.compact\n  def __call__(self, x):\n    return [nn.Dense(3)][0](x)\n', 'not called where it is constructed'),
    ('  @nn.compact\n  def __call__(self, x):\n    return nn.scan(nn.Dense)(3)(nn.Dense(3)(x))\n', 'builds a submodule'),
    ('  @nn.compact\n  def __call__(self, x):\n    return nn.Bidirectional(nn.RNN(nn.GRUCell(3)), nn.RNN(nn.GRUCell(3)))(x)\n',
     'nn.Bidirectional(...)(...) builds a submodule from nn.Bidirectional, a Linen layer the layer table has no NNX '
     'counterpart of'),
    ('  @nn.compact\n  def __call__(self, x):\n    return Block(3)(x)\n',  # imported from another file
     'Block(...)(...) builds a submodule from Block, which is neither a table layer nor a Linen class of this file'),
    ('  flag: bool\n  @nn.compact\n  def __call__(self, x):\n    return nn.Dense(3)(x) if self.flag else x\n',
     'nn.Dense(3) is created inside a conditional expression (a if c else b), which NNX cannot build in __init__'),
    ('  flag: bool\n  @nn.compact\n  def __call__(self, x):\n    return self.flag and nn.Dense(3)(x)\n',
     'nn.Dense(3) is created inside an and/or expression'),
    ('  @nn.compact\n  def __call__(self, xs):\n    return [nn.Dense(3)(x) for x in xs]\n',
     'nn.Dense(3) is created inside a list comprehension'),
    ('  @nn.compact\n  def __call__(self, x):\n    f = lambda y: nn.Dense(3)(y)\n    return f(x)\n',
     'nn.Dense(3) is created inside a lambda'),
    ('  conv: object\n  @nn.compact\n  def __call__(self, x):\n    return nn.Dense(3)(self.conv(4)(x))\n',
     'self.conv(...)(...) builds a submodule from a ModuleDef'),
    ('  @nn.compact\n  def __call__(self, x):\n    return nn.Dense(3)(x + self.get_variable("cache", "k"))\n', 'self.get_variable'),
    ('  def setup(self):\n    self.k = self.make_rng("dropout")\n  def __call__(self, x):\n    return x\n', 'a setup() statement'),
    ('  @nn.compact\n  def __call__(self, x):\n    w = self.param("w", nn.initializers.ones, (x.shape[0],))\n    return x * w\n',
     'local x'),
    ('  @nn.compact\n  def __call__(self, x):\n    while x.ndim < 3:\n      x = nn.Dense(3)(x[None])\n    return x\n',
     'loops, conditionals'),  # a layer built in a loop whose count depends on the data
    ('  def setup(self):\n    self.d = nn.Dense(3, dot_general_cls=None)\n  def __call__(self, x):\n    return self.d(x)\n',
     'no NNX counterpart'),
    ('  @nn.compact\n  def __call__(self, x, train):\n    return nn.Dropout(0.5)(x, deterministic=train)\n', 'train/eval'),
    ('  @nn.compact\n  def __call__(self, x):\n    return nn.Dense(x.shape[0])(x)\n', 'local x'),  # the batch size
])
def test_unsupported_constructs_are_todos(snippet, reason):
  source = f'import flax.linen as nn\n\n\nclass M(nn.Module):\n{snippet}'
  result = transform_source(source, RULES)
  assert [e.kind for e in result.entries] == ['todo'] and reason in result.entries[0].message, result.entries
  assert 'nn.Module' in result.source and 'nnx' not in result.source.replace('TODO(linen2nnx)', '')


def test_config_fields_start_in_the_switch_default_mode():
  """Parity with Linen: fixtures/L2N002/config_fields.parity.json."""
  nnx_ns = _load('config_fields', 'out')
  x = jax.random.normal(jax.random.key(0), (3, 5))
  model = nnx_ns['Classifier'](nnx_ns['Config'](dropout=0.5), linear1_in_features=5, rngs=nnx.Rngs(0, dropout=1))
  assert jnp.allclose(model(x), model(x))  # deterministic=True was the Linen default: eval until train()
  model.train()
  assert not jnp.allclose(model(x), model(x))


def test_module_fields_hold_the_submodules_the_caller_builds():
  from flax import linen as nn

  linen_ns, nnx_ns = _load('module_fields', 'in'), _load('module_fields', 'out')
  x = jax.random.normal(jax.random.key(0), (2, 5))
  linen_module = linen_ns['Classifier'](backbone=nn.Dense(4), head=linen_ns['Head'](3))
  variables = linen_module.init(jax.random.key(1), x)
  rngs = nnx.Rngs(0)
  model = nnx_ns['Classifier'](nnx.Linear(5, 4, rngs=rngs), nnx_ns['Head'](3, linear_in_features=4, rngs=rngs), rngs=rngs)
  report = nnx_bridge.compare(linen_module, variables, model, x)
  assert report.ok, report.to_text()


def test_guide_variable_creation_shapes():
  """The guide's variable creation section: Linen's init shapes are the converted model's attributes."""
  linen_module = _load('guide_basic_module', 'in')['Model'](256, 10)
  params = linen_module.init(jax.random.key(0), jnp.ones((1, 784)), training=False)['params']
  model = _load('guide_basic_module', 'out')['Model'](256, 10, block_linear_in_features=784, rngs=nnx.Rngs(0))
  assert params['Dense_0']['bias'].shape == model.linear.bias.shape == (10,)
  assert params['Block_0']['Dense_0']['kernel'].shape == model.block.linear.kernel.shape == (784, 256)
