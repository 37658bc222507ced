"""to_linen: an NNX module inside Linen, checked against the same NNX module run natively."""

import functools
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import errors as flax_errors
from flax import linen as nn
from flax import nnx
from flax import traverse_util

from nnx_bridge import collectionlib
from nnx_bridge import element_names
from nnx_bridge.errors import BridgeError, ImmutableCollectionError, MissingRngError, StateMismatchError
from nnx_bridge.state_check import check_state
from nnx_bridge.nnx_in_linen import ToLinen, to_linen

X = (jnp.arange(6, dtype=jnp.float32).reshape(2, 3) - 2.0) / 3.0
KEY = jax.random.key(0)


def flat_linen(state: nnx.State) -> dict:
  """Flattens NNX state (minus rng state) to {(collection, *path): value}, the bridge's layout."""
  return {
      (collectionlib.collection_name(type(var)), *map(str, path)): var.get_value()
      for path, var in nnx.to_flat_state(state)
      if not isinstance(var, nnx.RngState)
  }


def variables_of(module: nnx.Module) -> dict:
  """The Linen variables holding a native NNX module's state."""
  return traverse_util.unflatten_dict(flat_linen(nnx.state(module)))


def load(module: nnx.Module, variables) -> nnx.Module:
  """Copies Linen variables into a native NNX module, so both run with identical state."""
  flat = traverse_util.flatten_dict(nn.unbox(variables))
  for path, var in nnx.to_flat_state(nnx.state(module, nnx.All(nnx.Variable, nnx.Not(nnx.RngState)))):
    var.set_value(flat[(collectionlib.collection_name(type(var)), *map(str, path))])
  return module


def assert_trees_close(actual, expected):
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-6)


class MLP(nnx.Module):

  def __init__(self, *, rngs: nnx.Rngs):
    self.linear1 = nnx.Linear(3, 4, rngs=rngs)
    self.linear2 = nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, x):
    return self.linear2(nnx.relu(self.linear1(x)))


class Block(nnx.Module):

  def __init__(self, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(3, 4, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)
    self.norm = nnx.BatchNorm(4, rngs=rngs)

  def __call__(self, x):
    return self.norm(self.dropout(self.linear(x)))


concrete_kernel_inits = []


def counting_kernel_init(key, shape, dtype):
  if not isinstance(key, jax.core.Tracer):  # abstract (eval_shape) builds are not initializer runs
    concrete_kernel_inits.append(shape)
  return jax.random.normal(key, shape, dtype)


class Counted(nnx.Module):
  traced_constructions = 0

  def __init__(self, *, rngs: nnx.Rngs):
    Counted.traced_constructions += 1
    self.linear = nnx.Linear(3, 2, kernel_init=counting_kernel_init, rngs=rngs)

  def __call__(self, x):
    return self.linear(x)


CallCounts = collectionlib.variable_type('call_counts')


class CountingLinear(nnx.Module):

  def __init__(self, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(3, 2, rngs=rngs)
    self.calls = CallCounts(jnp.zeros((), jnp.int32))

  def __call__(self, x):
    self.calls[...] += 1
    return self.linear(x)


class AutoEncoder(nnx.Module):

  def __init__(self, *, rngs: nnx.Rngs):
    self.encoder = nnx.Linear(3, 2, rngs=rngs)
    self.decoder = nnx.Linear(2, 3, rngs=rngs)

  def encode(self, x):
    return self.encoder(x)

  def __call__(self, x):
    return self.decoder(self.encode(x))


def test_to_linen_returns_named_wrapper():
  module = to_linen(nnx.Linear, 3, 2, use_bias=False, name='proj')
  assert isinstance(module, ToLinen) and module.name == 'proj'
  assert module.args == (3, 2) and dict(module.kwargs) == {'use_bias': False}


def test_init_stores_constructed_state_without_rng_state():
  variables = to_linen(Block).init({'params': KEY, 'dropout': KEY}, X)
  native = Block(rngs=nnx.Rngs(1))
  assert jax.tree.map(jnp.shape, variables) == jax.tree.map(jnp.shape, variables_of(native))
  # the state right after __init__: the init call's batch-stat update is not stored
  np.testing.assert_array_equal(variables['batch_stats']['norm']['mean'], jnp.zeros(4))


def test_apply_matches_native_module():
  module = to_linen(MLP)
  variables = module.init(KEY, X)
  native = load(MLP(rngs=nnx.Rngs(1)), variables)
  np.testing.assert_allclose(module.apply(variables, X), native(X), rtol=1e-6)


def test_init_runs_initializers_once_and_apply_never():
  module = to_linen(Counted)
  concrete_kernel_inits.clear()
  variables = module.init(KEY, X)
  assert concrete_kernel_inits == [(3, 2)]
  module.apply(variables, X)
  traced_after_first_apply = Counted.traced_constructions
  for _ in range(3):
    module.apply(variables, X)
    jax.jit(module.apply)(variables, X)
  assert concrete_kernel_inits == [(3, 2)]
  assert Counted.traced_constructions == traced_after_first_apply  # abstract structure is cached


def _bad_params(params, kind):
  params = dict(params)
  if kind == 'missing':
    del params['bias']
  elif kind == 'extra':
    params['scale'] = jnp.ones(2)
  elif kind == 'shape':
    params['kernel'] = jnp.ones((5, 5))
  elif kind == 'dtype':
    params['kernel'] = params['kernel'].astype(jnp.bfloat16)
  return {'params': params}


@pytest.mark.parametrize(
    'kind, message',
    [
        ('missing', r'params/bias: expected float32\[2\], got nothing \(missing\)'),
        ('extra', r'params/scale: expected nothing \(unexpected key\), got float32\[2\]'),
        ('shape', r'params/kernel: expected float32\[3,2\], got float32\[5,5\]'),
        ('dtype', r'params/kernel: expected float32\[3,2\], got bfloat16\[3,2\]'),
    ],
)
def test_mismatched_params_raise_with_path(kind, message):
  module = to_linen(nnx.Linear, 3, 2)
  params = module.init(KEY, X)['params']
  with pytest.raises(StateMismatchError, match=message):
    module.apply(_bad_params(params, kind), X)
  with pytest.raises(StateMismatchError, match=message):
    jax.jit(module.apply)(_bad_params(params, kind), X)


def test_check_state_lists_every_problem_sorted():
  expected = {('params', 'a'): jax.ShapeDtypeStruct((2,), jnp.float32),
              ('params', 'b'): jax.ShapeDtypeStruct((3,), jnp.float32)}
  given = {('params', 'b'): np.zeros(4, np.float32), ('params', 'c'): np.zeros(1, np.int32)}
  with pytest.raises(StateMismatchError) as info:
    check_state(expected, given, context='ctx')
  assert str(info.value).splitlines() == [
      'ctx (3 mismatched leaves):',
      '  params/a: expected float32[2], got nothing (missing)',
      '  params/b: expected float32[3], got float32[4]',
      '  params/c: expected nothing (unexpected key), got int32[1]',
  ]
  check_state(expected, {('params', 'a'): np.zeros(2, np.float32),
                         ('params', 'b'): jnp.zeros(3)}, context='ctx')


def test_dropout_without_dropout_rng_raises_even_though_params_rng_exists():
  module = to_linen(nnx.Dropout, 0.5)
  x = jnp.ones((4, 8))
  with pytest.raises(MissingRngError, match=r"\['dropout'\].*rngs=\{'dropout': key\}"):
    module.init(KEY, x)  # Linen alone would fall back to 'params'
  variables = module.init({'params': KEY, 'dropout': KEY}, x)
  for apply in (module.apply, jax.jit(module.apply)):
    with pytest.raises(MissingRngError, match='dropout'):
      apply(variables, x, rngs={'params': KEY})


def test_dropout_keys_come_from_linen_make_rng_like_native_dropout():
  module = to_linen(nnx.Dropout, 0.5)
  x = jnp.ones((4, 8))
  variables = module.init({'params': KEY, 'dropout': KEY}, x)
  y1 = module.apply(variables, x, rngs={'dropout': jax.random.key(1)})
  y2 = module.apply(variables, x, rngs={'dropout': jax.random.key(2)})
  y1_again = jax.jit(module.apply)(variables, x, rngs={'dropout': jax.random.PRNGKey(1)})
  assert not np.array_equal(y1, y2)
  np.testing.assert_array_equal(y1, y1_again)

  class LinenKey(nn.Module):
    def __call__(self):
      return self.make_rng('dropout')

  key = LinenKey().apply({}, rngs={'dropout': jax.random.key(1)})
  native = nnx.Dropout(0.5)(x, rngs=nnx.RngStream(key, tag='dropout'))
  np.testing.assert_array_equal(y1, native)


def test_deterministic_dropout_needs_no_rng():
  module = to_linen(nnx.Dropout, 0.5, deterministic=True)
  np.testing.assert_array_equal(module.apply(module.init(KEY, X), X), X)


def _batch_norm_with_stats():
  native = nnx.BatchNorm(3, momentum=0.5, rngs=nnx.Rngs(0))
  native.mean[...] = jnp.array([0.1, -0.2, 0.3])
  native.var[...] = jnp.array([1.5, 0.5, 2.0])
  native.scale[...] = jnp.array([1.0, 2.0, 0.5])
  return native


def test_batch_norm_train_mode_needs_mutable_and_matches_native_update():
  native = _batch_norm_with_stats()
  variables = variables_of(native)
  module = to_linen(nnx.BatchNorm, 3, momentum=0.5)
  message = r"batch_stats/mean.*mutable=\['batch_stats'\]"
  with pytest.raises(ImmutableCollectionError, match=message):
    module.apply(variables, X)
  y, updates = jax.jit(lambda v, x: module.apply(v, x, mutable=['batch_stats']))(variables, X)
  y_native = native(X)
  np.testing.assert_allclose(y, y_native, rtol=1e-6)
  assert_trees_close(updates, {'batch_stats': variables_of(native)['batch_stats']})
  assert not np.allclose(updates['batch_stats']['mean'], variables['batch_stats']['mean'])


def test_write_to_boxed_leaf_keeps_the_callers_box():
  variables = variables_of(_batch_norm_with_stats())
  mean = variables['batch_stats']['mean']
  variables['batch_stats']['mean'] = nn.Partitioned(mean, names=('features',))
  module = to_linen(nnx.BatchNorm, 3, momentum=0.5)
  _, updates = module.apply(variables, X, mutable=['batch_stats'])
  box = updates['batch_stats']['mean']
  assert isinstance(box, nn.Partitioned) and box.names == ('features',)
  assert not np.allclose(box.value, mean)


def test_batch_norm_eval_mode_writes_nothing():
  native = _batch_norm_with_stats()
  module = to_linen(nnx.BatchNorm, 3, momentum=0.5, use_running_average=True)
  y = module.apply(variables_of(native), X)
  native.eval()
  np.testing.assert_allclose(y, native(X), rtol=1e-6)


def test_custom_collection_counter_write_needs_mutable():
  module = to_linen(CountingLinear)
  variables = module.init(KEY, X)
  assert variables['call_counts'] == {'calls': 0}  # state right after __init__
  message = r"call_counts/calls.*mutable=\['call_counts'\]"
  with pytest.raises(ImmutableCollectionError, match=message):
    module.apply(variables, X)
  _, updates = module.apply(variables, X, mutable=['call_counts'])
  assert updates['call_counts']['calls'] == 1


class Sowing(nnx.Module):

  def __init__(self, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(3, 2, rngs=rngs)

  def __call__(self, x):
    y = self.linear(x)
    self.sow(nnx.Intermediate, 'hidden', y)
    return y


@pytest.mark.filterwarnings('ignore:Using .Module.sow\\(\\). outside:DeprecationWarning')
def test_leaf_created_by_call_needs_mutable_and_matches_native_sow():
  module = to_linen(Sowing)
  variables = module.init(KEY, X)
  assert set(variables) == {'params'}
  with pytest.raises(ImmutableCollectionError, match=r"intermediates/hidden.*\['intermediates'\]"):
    module.apply(variables, X)
  _, updates = module.apply(variables, X, mutable=['intermediates'])
  native = load(Sowing(rngs=nnx.Rngs(1)), variables)
  native(X)
  assert_trees_close(updates, {'intermediates': variables_of(native)['intermediates']})


def test_nnx_method_calls_named_method():
  module = to_linen(AutoEncoder)
  variables = module.init(KEY, X)
  native = load(AutoEncoder(rngs=nnx.Rngs(1)), variables)
  encoded = module.apply(variables, X, nnx_method='encode')
  np.testing.assert_allclose(encoded, native.encode(X), rtol=1e-6)
  np.testing.assert_allclose(module.apply(variables, X), native(X), rtol=1e-6)


class SetupParent(nn.Module):
  """Uses one wrapped layer twice (weight tying), so init must not construct it twice."""

  def setup(self):
    self.dense = nn.Dense(3)
    self.tied = to_linen(nnx.Linear, 3, 3)

  def __call__(self, x):
    return self.tied(nn.relu(self.tied(self.dense(x))))


class CompactParent(nn.Module):

  @nn.compact
  def __call__(self, x):
    h = to_linen(nnx.BatchNorm, 3, momentum=0.5, name='norm')(nn.Dense(3)(x))
    return to_linen(nnx.Linear, 3, 2, name='head')(h)


def test_nested_in_setup_parent_shares_one_construction():
  parent = SetupParent()
  y_init, variables = parent.init_with_output(KEY, X)
  assert variables['params']['tied']['kernel'].shape == (3, 3)
  tied = load(nnx.Linear(3, 3, rngs=nnx.Rngs(1)), {'params': variables['params']['tied']})
  dense = variables['params']['dense']
  expected = tied(nn.relu(tied(X @ dense['kernel'] + dense['bias'])))
  np.testing.assert_allclose(y_init, expected, rtol=1e-6)
  np.testing.assert_allclose(parent.apply(variables, X), expected, rtol=1e-6)


def test_nested_in_compact_parent_writes_stats_at_its_path():
  parent = CompactParent()
  variables = parent.init(KEY, X)
  y, updates = parent.apply(variables, X, mutable=['batch_stats'])
  params = variables['params']
  norm = load(nnx.BatchNorm(3, momentum=0.5, rngs=nnx.Rngs(1)),
              {'params': params['norm'], 'batch_stats': variables['batch_stats']['norm']})
  head = load(nnx.Linear(3, 2, rngs=nnx.Rngs(1)), {'params': params['head']})
  expected = head(norm(X @ params['Dense_0']['kernel'] + params['Dense_0']['bias']))
  np.testing.assert_allclose(y, expected, rtol=1e-5)
  assert_trees_close(updates, {'batch_stats': {'norm': variables_of(norm)['batch_stats']}})
  with pytest.raises(ImmutableCollectionError, match='batch_stats/mean'):
    parent.apply(variables, X)


def test_jit_grad_matches_native_nnx_grad():
  module = to_linen(MLP)
  variables = module.init(KEY, X)

  def loss(params):
    return jnp.sum(module.apply({'params': params}, X) ** 2)

  grads = jax.jit(jax.grad(loss))(variables['params'])
  native = load(MLP(rngs=nnx.Rngs(1)), variables)
  native_grads = nnx.grad(lambda m: jnp.sum(m(X) ** 2))(native)
  assert_trees_close(grads, traverse_util.unflatten_dict(flat_linen(native_grads))['params'])
  assert any(np.abs(g).sum() > 0 for g in jax.tree.leaves(grads))


def _explicit_mesh():
  return jax.set_mesh(jax.make_mesh((1, 1), ('a', 'b')))


def _no_eager_sharding():
  return nnx.use_eager_sharding(False)


@pytest.mark.parametrize('context', [_explicit_mesh, _no_eager_sharding])
def test_out_sharding_metadata_becomes_partitioned_box(context):
  # flax 0.12.8 shards Variables eagerly by default, so out_sharding needs a mesh; without
  # eager sharding no mesh is needed. Both must give the same Linen box.
  module = to_linen(nnx.Linear, 3, 2, kernel_metadata={'out_sharding': ('a', 'b')})
  with context():
    variables = module.init(KEY, X)
    y = module.apply(variables, X)
  kernel = variables['params']['kernel']
  assert isinstance(kernel, nn.Partitioned) and kernel.names == ('a', 'b')
  spec = nn.get_partition_spec(variables)['params']['kernel']
  assert spec == jax.sharding.PartitionSpec('a', 'b')
  assert not isinstance(variables['params']['bias'], nn.Partitioned)
  np.testing.assert_allclose(y, X @ kernel.value + variables['params']['bias'], rtol=1e-6)


class _ScannedLinears(nn.Module):
  """Three NNX Linears stacked by `nn.scan`, with a partitioning layer axis."""

  @nn.compact
  def __call__(self, x):
    def body(module, carry, _):
      layer = to_linen(nnx.Linear, 3, 3, kernel_metadata={'out_sharding': (None, 'model')})
      return layer(carry), None

    scan = nn.scan(
        body,
        variable_axes={'params': 0},
        split_rngs={'params': True},
        length=3,
        metadata_params={nn.PARTITION_NAME: 'layers'},
    )
    return scan(self, x, None)[0]


def test_layer_axis_of_linen_scan_is_kept():
  # flax's ToLinen boxes NNX metadata in NNXMeta, whose add_axis does nothing (flax #5589).
  with _no_eager_sharding():
    variables = _ScannedLinears().init(KEY, X)
    y = _ScannedLinears().apply(variables, X)
  (scanned,) = variables['params'].values()
  assert isinstance(scanned['kernel'], nn.Partitioned)
  assert scanned['kernel'].names == ('layers', None, 'model')
  assert scanned['kernel'].value.shape == (3, 3, 3)
  h = X
  for i in range(3):  # the same three layers, applied one after another
    h = h @ scanned['kernel'].value[i] + scanned['bias'][i]
  np.testing.assert_allclose(y, h, rtol=1e-6)


# --- train / eval from the Linen parent --------------------------------------------------------


class MigratedBlock(nnx.Module):
  """A migrated Linen block: its `train` switch went to `train()` / `eval()`.

  It starts in the other mode than the one a test runs, so the test sees the mode being set.
  """

  def __init__(self, din, dout, *, starts_in_eval: bool = False, rngs: nnx.Rngs):
    self.linear = nnx.Linear(din, dout, rngs=rngs)
    self.norm = nnx.BatchNorm(dout, momentum=0.5, use_running_average=starts_in_eval, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, deterministic=starts_in_eval, rngs=rngs)

  def __call__(self, x):
    return self.dropout(self.norm(self.linear(x)))


class LinenBlock(nn.Module):
  """The Linen original of MigratedBlock, with the NNX attribute names, so variables match."""

  features: int

  @nn.compact
  def __call__(self, x, train: bool):
    h = nn.Dense(self.features, name='linear')(x)
    h = nn.BatchNorm(use_running_average=not train, momentum=0.5, name='norm')(h)
    return nn.Dropout(0.5, deterministic=not train, name='dropout')(h)


def _block(starts_in_eval: bool, **kwargs) -> ToLinen:
  return to_linen(MigratedBlock, 3, 4, starts_in_eval=starts_in_eval, name='block', **kwargs)


MODE_PASSING = {  # how a Linen parent passes its mode to the block, as it did to LinenBlock
    'train': lambda h, train: _block(train)(h, train=train),
    'deterministic': lambda h, train: _block(train)(h, deterministic=not train),
    'use_running_average': lambda h, train: _block(train)(h, use_running_average=not train),
    'constructor': lambda h, train: _block(train, train=train)(h),
    'linen': lambda h, train: LinenBlock(4, name='block')(h, train=train),
}


class Parent(nn.Module):
  """A Linen model calling the block through MODE_PASSING[passing]."""

  passing: str

  @nn.compact
  def __call__(self, x, train: bool):
    return MODE_PASSING[self.passing](nn.Dense(3, name='stem')(x), train)


def _trained_variables():
  """Linen variables of Parent with non-trivial batch stats, so eval mode visibly uses them."""
  variables = Parent('linen').init({'params': KEY}, X, train=False)
  stats = variables['batch_stats']['block']['norm']
  stats['mean'] = jnp.array([0.3, -0.1, 0.2, 0.0])
  stats['var'] = jnp.array([2.0, 0.5, 1.0, 3.0])
  return variables


def _key_at_block(key):
  """The key Linen's make_rng('dropout') gives at path 'block' (what the wrapper draws)."""

  class Probe(nn.Module):
    @nn.compact
    def __call__(self):
      return self.make_rng('dropout')

  class Root(nn.Module):
    @nn.compact
    def __call__(self):
      return Probe(name='block')()

  return Root().apply({}, rngs={'dropout': key})


BRIDGED = ['train', 'deterministic', 'use_running_average', 'constructor']


@pytest.mark.parametrize('passing', BRIDGED)
def test_eval_mode_init_and_apply_need_no_dropout_rng_and_match_linen(passing):
  model = Parent(passing)
  variables = model.init({'params': KEY}, X, train=False)  # no dropout rng in eval mode
  linen_variables = Parent('linen').init({'params': KEY}, X, train=False)
  assert jax.tree.map(jnp.shape, variables) == jax.tree.map(jnp.shape, linen_variables)
  variables = _trained_variables()
  expected = Parent('linen').apply(variables, X, train=False)
  for apply in (model.apply, jax.jit(model.apply, static_argnames='train')):
    y = apply(variables, X, train=False)  # no rngs, batch_stats not mutable
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('passing', BRIDGED)
def test_train_mode_uses_linen_dropout_rng_and_updates_stats_like_linen(passing):
  model = Parent(passing)
  variables = _trained_variables()
  key = jax.random.key(3)
  _, expected = Parent('linen').apply(
      variables, X, train=True, rngs={'dropout': key}, mutable=['batch_stats']
  )
  native = load(MigratedBlock(3, 4, rngs=nnx.Rngs(1)), {
      'params': variables['params']['block'], 'batch_stats': variables['batch_stats']['block']
  })
  stem = variables['params']['stem']
  h = X @ stem['kernel'] + stem['bias']
  native.train()
  y_native = native.dropout(native.norm(native.linear(h)), rngs=nnx.RngStream(_key_at_block(key), tag='dropout'))
  apply = functools.partial(model.apply, mutable=['batch_stats'])
  for run in (apply, jax.jit(apply, static_argnames='train')):
    y, updates = run(variables, X, train=True, rngs={'dropout': key})
    np.testing.assert_allclose(y, y_native, rtol=1e-6, atol=1e-6)
    assert_trees_close(updates, expected)
  assert_trees_close(updates['batch_stats']['block'], variables_of(native)['batch_stats'])
  assert not np.allclose(updates['batch_stats']['block']['norm']['mean'],
                         variables['batch_stats']['block']['norm']['mean'])
  assert (y == 0).any() and not np.array_equal(
      y, apply(variables, X, train=True, rngs={'dropout': jax.random.key(4)})[0]
  )


def test_train_mode_without_dropout_rng_or_mutable_fails_where_linen_fails():
  variables = _trained_variables()
  with pytest.raises(flax_errors.InvalidRngError, match='dropout'):
    Parent('linen').apply(variables, X, train=True, mutable=['batch_stats'])
  with pytest.raises(MissingRngError, match=r"\['dropout'\].*rngs=\{'dropout': key\}"):
    Parent('train').apply(variables, X, train=True, mutable=['batch_stats'])
  with pytest.raises(flax_errors.ModifyScopeVariableError, match='batch_stats'):
    Parent('linen').apply(variables, X, train=True, rngs={'dropout': KEY})
  with pytest.raises(ImmutableCollectionError, match=r"at 'block' wrote to batch_stats/norm/mean.*mutable=\['batch_stats'\]"):
    Parent('train').apply(variables, X, train=True, rngs={'dropout': KEY})


def test_mode_must_be_static_and_given_once():
  module = to_linen(MigratedBlock, 3, 4, train=False)
  block_variables = module.init(KEY, X)
  with pytest.raises(BridgeError, match=r"train=.*must be a Python bool.*static_argnames=\['train'\]"):
    jax.jit(lambda v, train: to_linen(MigratedBlock, 3, 4).apply(v, X, train=train))(block_variables, True)
  with pytest.raises(BridgeError, match='both to to_linen and at call time'):
    module.apply(block_variables, X, train=True)
  with pytest.raises(BridgeError, match='train=True, deterministic=True contradict each other'):
    to_linen(MigratedBlock, 3, 4).apply(block_variables, X, train=True, deterministic=True)


@pytest.mark.parametrize('train', [False, True])
def test_mode_reaches_blocks_under_linen_vmap(train):
  def ensemble(make_block):
    class Ensemble(nn.Module):
      @nn.compact
      def __call__(self, x):
        def member(module, x):
          return make_block()(x, train=train)

        return nn.vmap(
            member, variable_axes={'params': 0, 'batch_stats': 0},
            split_rngs={'params': True, 'dropout': True}, in_axes=None, axis_size=2,
        )(self, x)

    return Ensemble()

  bridged = ensemble(lambda: _block(train))
  linen = ensemble(lambda: LinenBlock(4, name='block'))
  rngs = {'params': KEY, 'dropout': KEY} if train else {'params': KEY}
  variables = bridged.init(rngs, X)
  assert jax.tree.map(jnp.shape, variables) == jax.tree.map(jnp.shape, linen.init(rngs, X))
  if not train:
    np.testing.assert_allclose(bridged.apply(variables, X), linen.apply(variables, X), rtol=1e-6)
    return
  kwargs = {'rngs': {'dropout': KEY}, 'mutable': ['batch_stats']}
  y, updates = bridged.apply(variables, X, **kwargs)
  y_linen, expected = linen.apply(variables, X, **kwargs)
  assert_trees_close(updates, expected)  # BatchNorm runs before Dropout: stats do not see masks
  kept = (y != 0) & (y_linen != 0)
  assert (y == 0).any() and kept.any()
  np.testing.assert_allclose(y[kept], y_linen[kept], rtol=1e-6)  # same normalization and scale


class FrozenNormBlock(nnx.Module):
  """An NNX module that takes `deterministic` itself, with a BatchNorm frozen in eval mode."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.norm = nnx.BatchNorm(3, use_running_average=True, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)

  def __call__(self, x, deterministic: bool):
    return self.dropout(self.norm(x), deterministic=deterministic)


def test_mode_argument_the_nnx_method_takes_is_passed_and_sets_no_mode():
  module = to_linen(FrozenNormBlock)
  variables = module.init({'params': KEY, 'dropout': KEY}, X, deterministic=True)
  # train() would unfreeze the norm and write batch_stats, which are immutable here
  y = module.apply(variables, X, deterministic=False, rngs={'dropout': KEY})
  native = load(FrozenNormBlock(rngs=nnx.Rngs(1)), variables)
  expected = native.dropout(native.norm(X), deterministic=False,
                            rngs=nnx.RngStream(_key_at_root(KEY), tag='dropout'))
  np.testing.assert_allclose(y, expected, rtol=1e-6)
  np.testing.assert_allclose(module.apply(variables, X, deterministic=True), native.norm(X), rtol=1e-6)


def _key_at_root(key):
  class Probe(nn.Module):
    @nn.compact
    def __call__(self):
      return self.make_rng('dropout')

  return Probe().apply({}, rngs={'dropout': key})


# --- what the migration's to_linen seams use: sizes from the call, Linen names for the variables -----------------


class SizedBlock(nnx.Module):
  """A migrated block whose NNX __init__ takes an input size its Linen original learnt at its first call."""

  def __init__(self, features: int, *, linear_in_features: int, rngs: nnx.Rngs):
    self.norm = nnx.LayerNorm(linear_in_features, rngs=rngs)
    self.linear = nnx.Linear(linear_in_features, features, rngs=rngs)

  def __call__(self, hidden_states, mask=None):
    return self.linear(self.norm(hidden_states))


class LinenSizedBlock(nn.Module):
  """SizedBlock's Linen original, @nn.compact: Linen names its layers LayerNorm_0 and Dense_0."""

  features: int

  @nn.compact
  def __call__(self, hidden_states, mask=None):
    return nn.Dense(self.features)(nn.LayerNorm()(hidden_states))


class ParentOf(nn.Module):
  block: tp.Callable[[], nn.Module]

  @nn.compact
  def __call__(self, x):
    return self.block()(x)


def test_input_sizes_come_from_the_call_and_linen_names_keep_the_original_variables():
  bridged = lambda: to_linen(SizedBlock, 2, input_sizes={'linear_in_features': 'hidden_states'},
                             linen_names={'norm': 'LayerNorm_0', 'linear': 'Dense_0'}, name='block')
  original = ParentOf(lambda: LinenSizedBlock(2, name='block'))
  variables = original.init(KEY, X)
  shapes = lambda tree: jax.tree.map(jnp.shape, tree)
  assert shapes(ParentOf(bridged).init(KEY, X)) == shapes(variables)
  np.testing.assert_allclose(ParentOf(bridged).apply(variables, X), original.apply(variables, X), rtol=1e-6)
  grads = [jax.grad(lambda p, m=m: m.apply({'params': p}, X).sum())(variables['params'])
           for m in (ParentOf(bridged), original)]
  assert_trees_close(*grads)


def test_input_sizes_of_an_argument_the_call_does_not_pass_is_an_error():
  bridged = lambda: to_linen(SizedBlock, 2, input_sizes={'linear_in_features': 'mask'})
  with pytest.raises(BridgeError, match='linear_in_features is the last-axis size of the call argument mask'):
    ParentOf(bridged).init(KEY, X)


def test_unknown_linen_name_paths_stay_nnx_names():
  variables = ParentOf(lambda: to_linen(SizedBlock, 2, input_sizes={'linear_in_features': 'hidden_states'},
                                        linen_names={'norm': 'LayerNorm_0'}, name='block')).init(KEY, X)
  assert set(variables['params']['block']) == {'LayerNorm_0', 'linear'}


class Stack(nnx.Module):
  """A migrated layer collection: an nnx.List Linen held as children named 0, 1 (`name=str(i)`)."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.layers = nnx.List([SizedBlock(3, linear_in_features=3, rngs=rngs) for _ in range(2)])

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


def test_list_elements_and_their_children_are_stored_under_linen_s_names():
  names = {'layers': '{}', 'layers.{}.norm': 'LayerNorm_0', 'layers.{}.linear': 'Dense_0'}
  variables = to_linen(Stack, linen_names=names).init(KEY, X)
  assert set(variables['params']) == {'0', '1'}
  assert set(variables['params']['1']) == {'LayerNorm_0', 'Dense_0'}
  native = Stack(rngs=nnx.Rngs(1))
  for i, layer in enumerate(native.layers):
    load(layer, {'params': {'norm': variables['params'][str(i)]['LayerNorm_0'],
                            'linear': variables['params'][str(i)]['Dense_0']}})
  np.testing.assert_allclose(to_linen(Stack, linen_names=names).apply(variables, X), native(X), rtol=1e-6)


def test_list_elements_linen_counted_across_iterations_are_stored_under_those_names():
  names = {'layers': 'Block_{1 + 2 * i}'}
  variables = to_linen(Stack, linen_names=names).init(KEY, X)
  assert set(variables['params']) == {'Block_1', 'Block_3'}
  assert element_names.element_name('Conv_{2 * i}', 3) == 'Conv_6' and element_names.element_name('{}', 3) == '3'


def test_a_list_name_placeholder_other_than_an_integer_combination_of_the_index_is_refused():
  with pytest.raises(ValueError, match=r"'Dense_\{self.num_layers\}' has a placeholder other than"):
    to_linen(Stack, linen_names={'layers': 'Dense_{self.num_layers}'}).init(KEY, X)


class Wide(nnx.Module):
  """One kind of layer a stage may hold (Linen names its dense `Dense_0`)."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.dense = nnx.Linear(3, 3, rngs=rngs)

  def __call__(self, x):
    return self.dense(x)


class Narrow(Wide):
  """The other kind, holding its dense at the same NNX path, which Linen names `proj`."""


class Stage(nnx.Module):
  """ResNet's stage migrated: its layers are of the kind its flag says (`layer = A if <test> else B`)."""

  def __init__(self, wide: bool, *, rngs: nnx.Rngs):
    layer = Wide if wide else Narrow
    self.layers = nnx.List([layer(rngs=rngs) for _ in range(2)])

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


def test_a_name_of_an_owner_class_applies_where_a_module_of_that_class_holds_the_path():
  names = {'layers': '{}', 'layers.{}.dense@Wide': 'Dense_0', 'layers.{}.dense@Narrow': 'proj'}
  for wide, inner in ((True, 'Dense_0'), (False, 'proj')):
    variables = to_linen(Stage, wide, linen_names=names).init(KEY, X)
    assert {k: set(v) for k, v in variables['params'].items()} == {'0': {inner}, '1': {inner}}
  assert element_names.resolve_owners(names, Stage(False, rngs=nnx.Rngs(0))) == {
      'layers': '{}', 'layers.0.dense': 'proj', 'layers.1.dense': 'proj'}


class CountedAfterLoop(nnx.Module):
  """dopamine's actor migrated: its output layer is Linen's `Dense_{self.num_layers}`, after the loop's."""

  def __init__(self, num_layers: int, *, rngs: nnx.Rngs):
    self.num_layers, self.label = num_layers, 'actor'
    self.linears = nnx.List([nnx.Linear(3, 3, rngs=rngs) for _ in range(num_layers)])
    self.linear = nnx.Linear(3, 2, rngs=rngs)

  def __call__(self, x):
    for layer in self.linears:
      x = layer(x)
    return self.linear(x)


def test_a_layer_named_after_a_loop_s_takes_the_number_of_the_module_s_attribute():
  names = {'linears': 'Dense_{}', 'linear': 'Dense_{num_layers}'}
  for layers in (1, 3):
    variables = to_linen(CountedAfterLoop, layers, linen_names=names).init(KEY, X)
    assert set(variables['params']) == {f'Dense_{i}' for i in range(layers + 1)}
    assert variables['params'][f'Dense_{layers}']['kernel'].shape == (3, 2)
  shifted = to_linen(CountedAfterLoop, 2, linen_names={**names, 'linear': 'Dense_{num_layers + 1}'}).init(KEY, X)
  assert set(shifted['params']) == {'Dense_0', 'Dense_1', 'Dense_3'}


@pytest.mark.parametrize('name, error', [('Dense_{label}', "needs the int attribute label of the module holding it, "
                                                          "which is 'actor'"),
                                         ('Dense_{depth}', 'needs the int attribute depth')])
def test_a_name_after_an_attribute_that_is_no_int_is_an_error(name, error):
  with pytest.raises(BridgeError, match=error):
    to_linen(CountedAfterLoop, 2, linen_names={'linears': 'Dense_{}', 'linear': name}).init(KEY, X)


class PlainArray(nnx.Module):
  """HF's causal mask and rotary table, migrated: constants kept as plain array attributes, not nnx.Variables."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(3, 3, rngs=rngs)
    self.table = jnp.tril(jnp.ones((2, 3))) * jnp.arange(3.0)

  def __call__(self, x):
    return self.linear(x) + self.table


def test_a_plain_array_constant_is_recomputed_not_stored():
  variables = to_linen(PlainArray).init(KEY, X)
  assert set(traverse_util.flatten_dict(variables)) == {('params', 'linear', 'kernel'), ('params', 'linear', 'bias')}
  native = load(PlainArray(rngs=nnx.Rngs(1)), variables)
  out = jax.jit(to_linen(PlainArray).apply)(variables, X)  # the constant computed while apply is traced
  np.testing.assert_allclose(out, native(X), rtol=1e-6)


class NumpyPlainArray(nnx.Module):
  """transformers' GPT-J rotary table: `create_sinusoidal_positions` returns a numpy array, static in NNX's graph."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(3, 3, rngs=rngs)
    self.table = np.tril(np.ones((2, 3), np.float32)) * np.arange(3.0, dtype=np.float32)

  def __call__(self, x):
    return self.linear(x) + self.table


def test_a_numpy_constant_is_recomputed_too_and_gradients_flow():
  variables = to_linen(NumpyPlainArray).init(KEY, X)
  native = load(NumpyPlainArray(rngs=nnx.Rngs(1)), variables)
  np.testing.assert_allclose(to_linen(NumpyPlainArray).apply(variables, X), native(X), rtol=1e-6)
  grads = jax.grad(lambda p: to_linen(NumpyPlainArray).apply({'params': p}, X).sum())(variables['params'])
  np.testing.assert_allclose(grads['linear']['bias'], np.full(3, 2.0), rtol=1e-6)


class RandomPlainArray(nnx.Module):
  """A plain array drawn from the rngs: neither a Linen variable nor something apply could recompute."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.noise = jax.random.normal(rngs.params(), (3,))

  def __call__(self, x):
    return x + self.noise


def test_a_plain_array_drawn_from_the_rngs_is_an_error_naming_it():
  with pytest.raises(BridgeError, match=r'keeps arrays drawn from its rngs that are not nnx.Variables \(noise\)'):
    to_linen(RandomPlainArray).init(KEY, X)


class CachedSum(nnx.Module):
  """transformers' decode cache, migrated: `init_cache=True` makes the call create it, later calls update it."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(3, 3, rngs=rngs)
    self.cached = nnx.data(None)

  def __call__(self, x, init_cache: bool = False):
    y = self.linear(x)
    if self.cached is not None or init_cache:
      is_initialized = self.cached is not None
      if not is_initialized:
        self.cached = nnx.Cache(jnp.zeros(y.shape, y.dtype))
      if is_initialized:
        self.cached[...] = self.cached[...] + y
        y = self.cached[...]
    return y


def test_a_variable_the_call_creates_is_stored_at_init_and_restored_at_apply():
  bridge = to_linen(CachedSum)
  variables = bridge.init(KEY, X, init_cache=True)
  np.testing.assert_array_equal(variables['cache']['cached'], jnp.zeros((2, 3)))
  native = load(CachedSum(rngs=nnx.Rngs(1)), {'params': variables['params']})
  native(X, init_cache=True)
  for step in range(2):
    out, updates = bridge.apply(variables, X + step, mutable=['cache'])
    variables = {**variables, **updates}
    np.testing.assert_allclose(out, native(X + step), rtol=1e-6)
  np.testing.assert_allclose(variables['cache']['cached'], native.cached[...], rtol=1e-6)
  np.testing.assert_allclose(bridge.apply({'params': variables['params']}, X), native.linear(X), rtol=1e-6)


def test_init_drops_a_created_variable_of_a_collection_it_does_not_keep():
  variables = to_linen(CachedSum).init(KEY, X, init_cache=True, mutable=['params'])
  assert set(variables) == {'params'}


def test_a_given_leaf_below_a_slot_the_call_fills_is_an_error():
  variables = to_linen(CachedSum).init(KEY, X, init_cache=True)
  wrong = {**variables, 'cache': {'cached': {'deeper': jnp.zeros((2, 3))}}}
  with pytest.raises(StateMismatchError, match='cache/cached/deeper'):
    to_linen(CachedSum).apply(wrong, X, mutable=['cache'])


class _Patches(nnx.Module):
  """Stores a plain attribute from its arguments, and takes its input size as transformers' ports do."""

  def __init__(self, image_size: int, patch_size: int, *, projection_in_features: int, rngs: nnx.Rngs):
    self.num_patches = (image_size // patch_size) ** 2
    self.projection = nnx.Linear(projection_in_features, 4, rngs=rngs)

  def __call__(self, x):
    return self.projection(x)


class _PatchCounter(nn.Module):
  """A Linen parent reading the bridged child's plain attribute in setup()."""

  def setup(self):
    self.patches = to_linen(_Patches, 8, 4, input_sizes={'projection_in_features': 'x'})
    self.scale = self.patches.num_patches

  def __call__(self, x):
    return self.patches(x) * self.scale


def test_a_plain_attribute_of_the_nnx_module_is_read_through_the_wrapper_before_any_call():
  x = jnp.ones((2, 3))
  variables = _PatchCounter().init(jax.random.key(0), x)
  kernel = variables['params']['patches']['projection']['kernel']
  np.testing.assert_allclose(_PatchCounter().apply(variables, x), 4 * (x @ kernel + 0.0), rtol=1e-6)
  wrapper = to_linen(_Patches, 8, 4, input_sizes={'projection_in_features': 'x'})
  assert wrapper.num_patches == 4 and not hasattr(wrapper, 'no_such_attribute')
  broken = to_linen(_Patches, 8)  # no patch_size: the NNX module cannot be built to read from
  assert not hasattr(broken, 'num_patches')
  with pytest.raises(AttributeError, match='its NNX module could not be built'):
    broken.num_patches
