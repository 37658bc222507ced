"""from_linen: a Linen module inside NNX, checked against the pure-Linen computation."""

import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

import nnx_bridge
from nnx_bridge import from_linen

X = jax.random.normal(jax.random.key(1), (4, 5))


class BnNet(nn.Module):
  """Dense + BatchNorm: state updates without randomness."""

  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.Dense(3)(x)
    return nn.BatchNorm(use_running_average=not train, momentum=0.5)(x)


class DropNet(nn.Module):
  """Dense + BatchNorm + Dropout + sown intermediate, with an extra method."""

  @nn.compact
  def __call__(self, x, train: bool):
    h = nn.Dense(4)(x)
    h = nn.BatchNorm(use_running_average=not train)(h)
    self.sow('intermediates', 'hidden', h)
    h = nn.Dropout(0.5, deterministic=not train)(h)
    return nn.Dense(2, name='head')(h)


class Codec(nn.Module):
  def setup(self):
    self.enc = nn.Dense(3)
    self.dec = nn.Dense(5)

  def encode(self, x):
    return self.enc(x)

  def __call__(self, x):
    return self.dec(self.encode(x))


def _linen_train_step(module, variables, x, **kwargs):
  out, updates = module.apply(variables, x, train=True, mutable=['batch_stats'], **kwargs)
  return out, {**variables, **updates}


# --- init -----------------------------------------------------------------------------------


def test_init_from_shape_structs_equals_init_from_arrays():
  spec = jax.ShapeDtypeStruct(X.shape, X.dtype)
  a = from_linen(BnNet(), spec, train=False, rngs=nnx.Rngs(0))
  b = from_linen(BnNet(), X, train=False, rngs=nnx.Rngs(0))
  jax.tree.map(np.testing.assert_array_equal, a.linen_variables(), b.linen_variables())
  expected = BnNet().init({'params': nnx.Rngs(0).fork()['params']()}, X, train=False)
  assert jax.tree.structure(a.linen_variables()) == jax.tree.structure(expected)


def test_layout_follows_nnx():
  model = from_linen(BnNet(), X, rngs=nnx.Rngs(0))
  assert isinstance(model.Dense_0['kernel'], nnx.Param)
  assert isinstance(model.BatchNorm_0['mean'], nnx.BatchStat)
  assert model.Dense_0['kernel'].shape == (5, 3)
  bare = from_linen(nn.Dense(3), X, rngs=nnx.Rngs(0))
  assert isinstance(bare.kernel, nnx.Param)


def test_missing_params_stream_is_an_error():
  with pytest.raises(nnx_bridge.MissingRngError, match="'params' during init"):
    from_linen(nn.Dense(3), X, rngs=None)


# --- train / eval -----------------------------------------------------------------------------


def test_eval_mode_matches_linen_eval():
  model = from_linen(DropNet(), X, rngs=nnx.Rngs(0))
  variables = model.linen_variables()
  model.eval()
  out = model(X)
  np.testing.assert_allclose(out, DropNet().apply(variables, X, train=False), rtol=1e-6)
  jax.tree.map(np.testing.assert_array_equal, model.linen_variables(), variables)  # no update


def test_train_mode_updates_batch_stats_like_linen():
  # flax's ToNNX needs train=..., mutable=['batch_stats'] passed by hand; here train() does it.
  model = from_linen(BnNet(), X, rngs=nnx.Rngs(0))
  variables = model.linen_variables()
  model.train()
  out = model(X)
  expected_out, expected = _linen_train_step(BnNet(), variables, X)
  np.testing.assert_allclose(out, expected_out, rtol=1e-6)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
      model.linen_variables()['batch_stats'],
      expected['batch_stats'],
  )


def test_train_mode_dropout_draws_from_the_rngs_stream():
  model = from_linen(DropNet(), X, rngs=nnx.Rngs(0))
  model.train()
  outs = []
  for _ in range(2):
    variables = model.linen_variables()
    stream = model.rngs['dropout']  # falls back to the default stream, as nnx.Dropout does
    key = jax.random.fold_in(stream.key[...], stream.count[...])
    expected, _ = _linen_train_step(DropNet(), variables, X, rngs={'dropout': key})
    outs.append(model(X))
    np.testing.assert_allclose(outs[-1], expected, rtol=1e-6)
  assert not np.allclose(outs[0], outs[1])  # a fresh mask every call, never a fixed key


def test_missing_dropout_stream_is_a_clear_error():
  model = from_linen(DropNet(), X, rngs=nnx.Rngs(params=0))
  model.eval()
  model(X)  # eval mode needs no dropout rng
  model.train()
  with pytest.raises(nnx_bridge.MissingRngError, match=r"stream 'dropout'.*nnx.Rngs\(dropout="):
    model(X)


class FieldFlag(nn.Module):
  train: bool = False

  @nn.compact
  def __call__(self, x):
    return nn.Dropout(0.5, deterministic=not self.train)(x)


def test_mode_flag_that_is_a_field():
  model = from_linen(FieldFlag(), X, rngs=nnx.Rngs(dropout=1))
  model.eval()
  np.testing.assert_array_equal(model(X), X)
  model.train()
  assert not np.allclose(model(X), X)


def test_explicit_call_argument_wins_over_mode():
  model = from_linen(DropNet(), X, rngs=nnx.Rngs(0))
  variables = model.linen_variables()
  model.train()
  np.testing.assert_allclose(
      model(X, train=False), DropNet().apply(variables, X, train=False), rtol=1e-6
  )


def test_mode_arguments_can_be_chosen_and_are_checked():
  model = from_linen(DropNet(), X, train=False, rngs=nnx.Rngs(0), mode_arguments=())
  with pytest.raises(TypeError, match="missing 1 required positional argument: 'train'"):
    model(X)  # the mode no longer feeds `train`
  with pytest.raises(ValueError, match="Unknown mode argument 'is_eval'"):
    from_linen(DropNet(), X, rngs=nnx.Rngs(0), mode_arguments=['is_eval'])
  with pytest.raises(ValueError, match="no call argument or field named 'deterministic'"):
    from_linen(DropNet(), X, rngs=nnx.Rngs(0), mode_arguments=['deterministic'])


# --- state updates under NNX transforms ---------------------------------------------------------


def _loss(model, x):
  return (model(x) ** 2).mean()


def _run_eager(model):
  model(X)


def _run_jit_graph(model):
  nnx.jit(lambda m, x: m(x))(model, X)


def _run_jit_tree(model):
  # flax's ToNNX silently loses the BatchNorm update here.
  nnx.jit(lambda m, x: m(x), graph=False)(model, X)


def _run_tree_mode(model):
  with nnx.set_graph_mode(False):
    nnx.jit(lambda m, x: m(x))(model, X)


def _run_grad(model):
  nnx.grad(_loss)(model, X)


def _run_value_and_grad_jit(model):
  nnx.jit(nnx.value_and_grad(_loss))(model, X)


def _run_remat(model):
  nnx.remat(lambda m, x: m(x))(model, X)


def _run_optimizer(model):
  optimizer = nnx.Optimizer(model, optax.sgd(0.0), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer, x):
    grads = nnx.grad(_loss)(model, x)
    optimizer.update(model, grads)

  step(model, optimizer, X)


@pytest.mark.parametrize(
    'run',
    [
        _run_eager,
        _run_jit_graph,
        _run_jit_tree,
        _run_tree_mode,
        _run_grad,
        _run_value_and_grad_jit,
        _run_remat,
        _run_optimizer,
    ],
    ids=lambda f: f.__name__[len('_run_'):],
)
def test_batch_stats_update_survives(run):
  model = from_linen(BnNet(), X, rngs=nnx.Rngs(0))
  _, expected = _linen_train_step(BnNet(), model.linen_variables(), X)
  run(model)
  got = model.linen_variables()['batch_stats']['BatchNorm_0']
  want = expected['batch_stats']['BatchNorm_0']
  assert not np.allclose(want['mean'], 0.0)  # the update is really there to be lost
  np.testing.assert_allclose(got['mean'], want['mean'], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got['var'], want['var'], rtol=1e-5, atol=1e-7)


def test_batch_stats_update_under_nnx_scan():
  model = from_linen(BnNet(), X, rngs=nnx.Rngs(0))
  xs = jnp.stack([X, 2 * X, X + 1])
  variables = model.linen_variables()
  expected_ys = []
  for x in xs:
    y, variables = _linen_train_step(BnNet(), variables, x)
    expected_ys.append(y)

  @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
  def run(model, x):
    return model, model(x)

  _, ys = run(model, xs)
  np.testing.assert_allclose(ys, jnp.stack(expected_ys), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
      model.BatchNorm_0['var'][...], variables['batch_stats']['BatchNorm_0']['var'], rtol=1e-5
  )


def test_ensemble_under_nnx_vmap():
  @nnx.split_rngs(splits=3)
  @nnx.vmap(in_axes=0, out_axes=0)
  def create(rngs):
    return from_linen(BnNet(), jax.ShapeDtypeStruct((4, 5), jnp.float32), rngs=rngs)

  ensemble = create(nnx.Rngs(0))
  assert ensemble.Dense_0['kernel'].shape == (3, 5, 3)
  members = [jax.tree.map(lambda v, i=i: v[i], ensemble.linen_variables()) for i in range(3)]
  assert not np.allclose(members[0]['params']['Dense_0']['kernel'], members[1]['params']['Dense_0']['kernel'])
  ys = nnx.vmap(lambda m, x: m(x), in_axes=(0, None))(ensemble, X)
  for i, variables in enumerate(members):
    y, updated = _linen_train_step(BnNet(), variables, X)
    np.testing.assert_allclose(ys[i], y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        ensemble.BatchNorm_0['mean'][i], updated['batch_stats']['BatchNorm_0']['mean'], rtol=1e-5
    )


def test_scan_over_stacked_layers():
  """Layers stacked with nnx.vmap at creation, run with nnx.scan: the NNX scan-over-layers idiom."""

  @nnx.split_rngs(splits=3)
  @nnx.vmap(in_axes=0, out_axes=0)
  def create(rngs):
    return from_linen(nn.Dense(5), jax.ShapeDtypeStruct((4, 5), jnp.float32), rngs=rngs)

  layers = create(nnx.Rngs(0))

  @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
  def forward(x, layer):
    return jnp.tanh(layer(x))

  y = forward(X, layers)
  expected = X
  for i in range(3):
    variables = jax.tree.map(lambda v, i=i: v[i], layers.linen_variables())
    expected = jnp.tanh(nn.Dense(5).apply(variables, expected))
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


# --- intermediates ---------------------------------------------------------------------------


def test_sown_values_do_not_pile_up_and_jit_does_not_retrace():
  model = from_linen(DropNet(), X, rngs=nnx.Rngs(0))
  model.eval()
  traces = []

  @nnx.jit
  def forward(model, x):
    traces.append(1)
    return model(x)

  for _ in range(3):
    forward(model, X)
  assert len(traces) == 1
  assert not nnx.state(model, nnx.Intermediate)  # nothing kept between calls


def test_sown_values_come_out_through_nnx_capture():
  model = from_linen(DropNet(), X, rngs=nnx.Rngs(0))
  model.eval()
  variables = model.linen_variables()
  _, expected = DropNet().apply(variables, X, train=False, mutable=['intermediates'])
  for _ in range(2):  # one value per call, never accumulated across calls
    _, captured = nnx.capture(model, nnx.Intermediate)(X)
    (hidden,) = captured['hidden'].get_value()
    np.testing.assert_allclose(hidden, expected['intermediates']['hidden'][0], rtol=1e-6)


# --- methods, odd trees, errors ----------------------------------------------------------------


def test_other_methods_are_exposed():
  model = from_linen(Codec(), X, rngs=nnx.Rngs(0))
  variables = model.linen_variables()
  np.testing.assert_allclose(model.encode(X), Codec().apply(variables, X, method='encode'), rtol=1e-6)
  np.testing.assert_allclose(model(X), Codec().apply(variables, X), rtol=1e-6)
  with pytest.raises(AttributeError, match='decode'):
    model.decode(X)


class SameNameTwoCollections(nn.Module):
  @nn.compact
  def __call__(self, x):
    w = self.param('w', nn.initializers.ones, (x.shape[-1],))
    calls = self.variable('cache', 'w', lambda: jnp.zeros((), jnp.int32))
    if not self.is_initializing():
      calls.value += 1
    return x * w


def test_same_name_in_two_collections():
  # flax's ToNNX raises "Found duplicate variable path" here.
  model = from_linen(SameNameTwoCollections(), X, rngs=nnx.Rngs(0))
  assert isinstance(model.w, nnx.Param)
  assert isinstance(getattr(model, 'cache:w'), nnx.Cache)
  model(X)
  model(X)
  assert int(getattr(model, 'cache:w')[...]) == 2
  assert model.linen_variables()['cache']['w'] == 2


class LateVariable(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.BatchNorm(use_running_average=not train)(x)
    if train:
      self.variable('batch_stats', 'late', jnp.zeros, ())
    return x


def test_variable_created_after_init_is_an_error():
  model = from_linen(LateVariable(), X, rngs=nnx.Rngs(0))  # init runs in eval mode
  model.train()
  with pytest.raises(nnx_bridge.BridgeError, match='batch_stats/late after initialization'):
    model(X)


def test_variable_name_clashing_with_wrapper_attribute_is_an_error():
  class Clash(nn.Module):
    @nn.compact
    def __call__(self, x):
      return x * self.param('rngs', nn.initializers.ones, ())

  with pytest.raises(nnx_bridge.BridgeError, match="'rngs' clashes"):
    from_linen(Clash(), X, rngs=nnx.Rngs(0))


# --- partitioning metadata ---------------------------------------------------------------------


class Partitioned(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(
        8, kernel_init=nn.with_partitioning(nn.initializers.lecun_normal(), (None, 'model'))
    )(x)
    return nn.Dense(
        5,
        kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('mlp', 'embed')),
    )(x)


class ScannedBlocks(nn.Module):
  @nn.compact
  def __call__(self, x):
    block = nn.scan(
        lambda module, carry, _: (Partitioned()(carry), None),
        variable_axes={'params': 0},
        split_rngs={'params': True},
        length=3,
        metadata_params={nn.PARTITION_NAME: 'layers'},
    )
    x, _ = block(self, x, None)
    return x


def test_partitioning_metadata_without_a_mesh():
  # with flax's default flax_always_shard_variable=True, flax's ToNNX init fails without a mesh.
  model = from_linen(Partitioned(), jax.ShapeDtypeStruct((2, 5), jnp.float32), rngs=nnx.Rngs(0))
  assert model.Dense_0['kernel'].get_metadata()['out_sharding'] == (None, 'model')
  assert model.Dense_1['kernel'].get_metadata()['out_sharding'] == ('mlp', 'embed')
  specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
  assert specs['Dense_0']['kernel'].get_value() == jax.sharding.PartitionSpec(None, 'model')
  boxed = model.linen_variables()['params']
  assert isinstance(boxed['Dense_0']['kernel'], nn.Partitioned)
  assert isinstance(boxed['Dense_1']['kernel'], nn.LogicallyPartitioned)


def test_layer_axis_of_linen_scan_is_kept():
  model = from_linen(ScannedBlocks(), jax.ShapeDtypeStruct((2, 5), jnp.float32), rngs=nnx.Rngs(0))
  (scan_name,) = model.linen_variable_names
  kernel = getattr(model, scan_name)['Dense_0']['kernel']
  assert kernel.shape == (3, 5, 8)
  assert kernel.get_metadata()['out_sharding'] == ('layers', None, 'model')


def test_layer_axis_of_nnx_vmap_is_added():
  @nnx.split_rngs(splits=2)
  @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: 'layers'})
  def create(rngs):
    return from_linen(Partitioned(), jax.ShapeDtypeStruct((2, 5), jnp.float32), rngs=rngs)

  stacked = create(nnx.Rngs(0))
  assert stacked.Dense_0['kernel'].shape == (2, 5, 8)
  assert stacked.Dense_0['kernel'].get_metadata()['out_sharding'] == ('layers', None, 'model')
  boxed = stacked.linen_variables()['params']['Dense_0']['kernel']
  assert boxed.names == ('layers', None, 'model')


_SHARDED_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from flax import linen as nn, nnx
    from nnx_bridge import from_linen

    class Sharded(nn.Module):
      @nn.compact
      def __call__(self, x):
        init = nn.with_partitioning(nn.initializers.lecun_normal(), (None, 'model'))
        h = nn.Dense(8, kernel_init=init)(x)
        return nn.Dense(5)(h)

    assert len(jax.devices()) == 8
    mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    x = jax.random.normal(jax.random.key(0), (4, 5))
    with jax.set_mesh(mesh):
      model = from_linen(Sharded(), jax.ShapeDtypeStruct((4, 5), jnp.float32),
                         rngs=nnx.Rngs(0))
      kernel = model.Dense_0['kernel'][...]
      assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, 'model'), kernel.sharding
      y = nnx.jit(lambda m, x: m(x))(model, x)
    variables = jax.device_get(model.linen_variables(boxed=False))
    expected = Sharded().apply(variables, x)
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5)
    print('ok')
    """
)


@pytest.mark.slow
def test_sharded_on_a_simulated_8_device_mesh():
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu')
  root = str(pathlib.Path(__file__).resolve().parents[2])
  result = subprocess.run(
      [sys.executable, '-c', _SHARDED_SCRIPT], env=env, cwd=root, capture_output=True, text=True
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith('ok')


def test_rng_streams_are_kept_only_when_the_module_draws_from_them():
  assert from_linen(BnNet(), X, rngs=nnx.Rngs(0)).rngs is None  # no key state in every step
  kept = from_linen(DropNet(), X, rngs=nnx.Rngs(0))
  assert kept.rngs is not None and kept.linen_rng_names == ('dropout',)
