"""restore_linen_checkpoint: a Linen checkpoint read straight into an NNX model, strictly, in its shardings."""

import os
import subprocess
import sys
import textwrap
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import config as flax_config
from flax import linen as nn
from flax import nnx
from flax.training import checkpoints as flax_checkpoints
from flax.training import train_state

import nnx_bridge
from nnx_bridge import restore_linen_checkpoint
from nnx_bridge.derive import MappingError
from nnx_bridge.errors import LossyConversionError
from nnx_bridge.errors import StateMismatchError
from nnx_bridge.errors import UnreadableCheckpointError
from nnx_bridge.treemap import LeafRule
from nnx_bridge.treemap import TreeMapping

# flax's legacy checkpointing warns on every save; these tests write legacy checkpoints on purpose.
pytestmark = pytest.mark.filterwarnings('ignore:Flax Checkpointing will soon be deprecated:DeprecationWarning')

X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)


class LinenNet(nn.Module):
  out: int = 2

  @nn.compact
  def __call__(self, x):
    h = nn.BatchNorm(use_running_average=True)(nn.Dense(4)(x))  # Dense_0, BatchNorm_0
    return nn.Dense(self.out)(nn.relu(h))  # Dense_1


class SamePort(nnx.Module):
  """The hand port keeping Linen's names, so that mapping_by_path pairs the leaves."""

  def __init__(self, rngs: nnx.Rngs, out: int = 2, dtype: tp.Any = jnp.float32):
    self.Dense_0 = nnx.Linear(3, 4, rngs=rngs)
    self.BatchNorm_0 = nnx.BatchNorm(4, use_running_average=True, rngs=rngs)
    self.Dense_1 = nnx.Linear(4, out, param_dtype=dtype, rngs=rngs)

  def __call__(self, x):
    return self.Dense_1(nnx.relu(self.BatchNorm_0(self.Dense_0(x))))


class RenamedPort(nnx.Module):
  """The same model with its own attribute names: only an explicit mapping pairs it."""

  def __init__(self, rngs: nnx.Rngs, out: int = 2):
    self.linear = nnx.Linear(3, 4, rngs=rngs)
    self.norm = nnx.BatchNorm(4, use_running_average=True, rngs=rngs)
    self.head = nnx.Linear(4, out, rngs=rngs)

  def __call__(self, x):
    return self.head(nnx.relu(self.norm(self.linear(x))))


RENAMED = TreeMapping(tuple(
    LeafRule(nnx_path, (linen_key,)) for nnx_path, linen_key in [
        (('linear', 'kernel'), ('params', 'Dense_0', 'kernel')),
        (('linear', 'bias'), ('params', 'Dense_0', 'bias')),
        (('norm', 'scale'), ('params', 'BatchNorm_0', 'scale')),
        (('norm', 'bias'), ('params', 'BatchNorm_0', 'bias')),
        (('norm', 'mean'), ('batch_stats', 'BatchNorm_0', 'mean')),
        (('norm', 'var'), ('batch_stats', 'BatchNorm_0', 'var')),
        (('head', 'kernel'), ('params', 'Dense_1', 'kernel')),
        (('head', 'bias'), ('params', 'Dense_1', 'bias')),
    ]
))


def _randomize(tree, seed: int):
  """Every leaf uniform in [0.5, 1.5) (BatchNorm variances stay positive), so that a swapped leaf shows."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return treedef.unflatten([jax.random.uniform(k, x.shape, x.dtype, 0.5, 1.5) for k, x in zip(keys, leaves)])


def _variables(module: nn.Module = LinenNet()) -> dict:
  return _randomize(module.init(jax.random.key(0), X), seed=1)


def _save(path, tree) -> None:
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(path, tree)
  checkpointer.wait_until_finished()


def _snapshot(model: nnx.Module) -> dict:
  return {path: np.array(v.get_value()) for path, v in nnx.to_flat_state(nnx.state(model))}


def _assert_unchanged(model: nnx.Module, before: dict) -> None:
  after = _snapshot(model)
  assert after.keys() == before.keys()
  for path in before:
    assert np.array_equal(after[path], before[path]), path


def _linen_out(variables, module: nn.Module = LinenNet()):
  return module.apply(variables, X)


@pytest.fixture
def linen_ckpt(tmp_path):
  variables = _variables()
  _save(tmp_path / 'linen', variables)
  return tmp_path / 'linen', variables


# --- restores ------------------------------------------------------------------------------------


def test_a_model_laid_out_like_linen_is_restored_in_place(linen_ckpt):
  path, variables = linen_ckpt
  model = SamePort(nnx.Rngs(7))

  state = restore_linen_checkpoint(model, path)

  np.testing.assert_allclose(model(X), _linen_out(variables), rtol=1e-6)
  assert np.array_equal(model.BatchNorm_0.var[...], variables['batch_stats']['BatchNorm_0']['var'])
  assert isinstance(state['BatchNorm_0']['mean'], nnx.BatchStat)  # Variable types kept
  assert np.array_equal(state['Dense_1']['kernel'][...], model.Dense_1.kernel[...])


def test_an_abstract_state_gives_a_state_nnx_merge_takes(linen_ckpt):
  path, variables = linen_ckpt
  abstract_model = nnx.eval_shape(lambda: SamePort(nnx.Rngs(0)))
  graphdef, abstract_state = nnx.split(abstract_model)

  state = restore_linen_checkpoint(abstract_state, path)

  model = nnx.merge(graphdef, state)
  np.testing.assert_allclose(model(X), _linen_out(variables), rtol=1e-6)
  default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  assert all(v.get_value().sharding == default for _, v in nnx.to_flat_state(state))
  assert isinstance(abstract_state['Dense_0']['kernel'].get_value(), jax.ShapeDtypeStruct)  # not modified


def test_an_explicit_mapping_from_derive_mapping(linen_ckpt):
  path, variables = linen_ckpt
  model = RenamedPort(nnx.Rngs(3))
  mapping = nnx_bridge.derive_mapping(LinenNet(), model, X)
  assert set(mapping.rules) == set(RENAMED.rules) and not mapping.dropped

  restore_linen_checkpoint(model, path, mapping)

  np.testing.assert_allclose(model(X), _linen_out(variables), rtol=1e-6)


def test_a_renamed_port_without_a_mapping_says_how_to_give_one(linen_ckpt):
  model = RenamedPort(nnx.Rngs(3))
  before = _snapshot(model)
  with pytest.raises(MappingError) as info:
    restore_linen_checkpoint(model, linen_ckpt[0])
  message = str(info.value)
  assert 'params/Dense_0/kernel' in message and 'linear/kernel' in message
  assert '--write-mapping' in message and 'derive_mapping' in message
  _assert_unchanged(model, before)


def test_a_mapping_file_written_for_review_is_used(linen_ckpt, tmp_path):
  RENAMED.save(tmp_path / 'mapping.json')  # what `linen2nnx verify --write-mapping` writes
  model = RenamedPort(nnx.Rngs(3))
  restore_linen_checkpoint(model, linen_ckpt[0], TreeMapping.load(tmp_path / 'mapping.json'))
  np.testing.assert_allclose(model(X), _linen_out(linen_ckpt[1]), rtol=1e-6)


class LinenMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(4)(x))  # Dense_0 (Linen numbers layers in the order they are made)
    return nn.Dense(2)(h)


class MLPPort(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.Dense_0 = nnx.Linear(3, 4, rngs=rngs)
    self.Dense_1 = nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, x):
    return self.Dense_1(nnx.relu(self.Dense_0(x)))


def test_a_checkpoint_of_the_params_tree_alone(tmp_path):
  variables = _variables(LinenMLP())
  _save(tmp_path / 'params', variables['params'])  # a TrainState's params saved on their own
  model = MLPPort(nnx.Rngs(5))

  restore_linen_checkpoint(model, tmp_path / 'params', linen_collection='params')
  np.testing.assert_allclose(model(X), _linen_out(variables, LinenMLP()), rtol=1e-6)

  other = MLPPort(nnx.Rngs(5))
  before = _snapshot(other)
  with pytest.raises(StateMismatchError, match="Dense_0, Dense_1 of the checkpoint.*linen_collection='params'"):
    restore_linen_checkpoint(other, tmp_path / 'params')  # without linen_collection: no collections at the top
  _assert_unchanged(other, before)


class TrainState(train_state.TrainState):
  batch_stats: tp.Any


def _train_state(variables) -> TrainState:
  return TrainState.create(
      apply_fn=LinenNet().apply, params=variables['params'], tx=optax.adam(1e-3),
      batch_stats=variables['batch_stats'],
  ).replace(step=7)


def test_a_train_state_restores_its_model_collections_and_leaves_the_rest(tmp_path):
  variables = _variables()
  _save(tmp_path / 'state', _train_state(variables))  # params, batch_stats, opt_state, step
  assert {'opt_state', 'step'} <= set(ocp.StandardCheckpointer().metadata(tmp_path / 'state').item_metadata.tree)
  model = SamePort(nnx.Rngs(7))

  restore_linen_checkpoint(model, tmp_path / 'state')
  np.testing.assert_allclose(model(X), _linen_out(variables), rtol=1e-6)

  renamed = RenamedPort(nnx.Rngs(3))
  restore_linen_checkpoint(renamed, tmp_path / 'state', RENAMED)
  np.testing.assert_allclose(renamed(X), _linen_out(variables), rtol=1e-6)


def _linen_training(state: TrainState, steps: int) -> tuple[TrainState, list[float]]:
  """`steps` Adam steps on a squared error, the TrainState way; the state after them and their losses."""

  @jax.jit
  def step(state):
    def loss_fn(params):
      return jnp.mean(state.apply_fn({'params': params, 'batch_stats': state.batch_stats}, X) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss

  losses = []
  for _ in range(steps):
    state, loss = step(state)
    losses.append(float(loss))
  return state, losses


def test_with_the_optimizer_training_resumes_with_the_losses_linen_would_have(tmp_path):
  state, _ = _linen_training(_train_state(_variables()), 2)
  _save(tmp_path / 'state', state)
  model = RenamedPort(nnx.Rngs(3))
  optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

  model_state, optimizer_state = restore_linen_checkpoint(model, tmp_path / 'state', RENAMED, optimizer=optimizer)
  assert int(optimizer.step.get_value()) == 9 and optimizer_state['step'].get_value() == 9  # 7 + 2
  np.testing.assert_array_equal(model_state['head']['kernel'].get_value(), state.params['Dense_1']['kernel'])

  @nnx.jit
  def nnx_step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda model: jnp.mean(model(X) ** 2))(model)
    optimizer.update(model, grads)
    return loss

  _, linen_losses = _linen_training(state, 3)
  np.testing.assert_allclose([float(nnx_step(model, optimizer)) for _ in range(3)], linen_losses, rtol=1e-6)


def test_with_the_optimizer_an_optax_state_of_another_kind_is_refused(tmp_path):
  _save(tmp_path / 'state', _train_state(_variables()))
  model = RenamedPort(nnx.Rngs(3))
  optimizer = nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)
  before = _snapshot(model)
  with pytest.raises(StateMismatchError) as error:
    restore_linen_checkpoint(model, tmp_path / 'state', RENAMED, optimizer=optimizer)
  assert 'the NNX model has no leaf optimizer/opt_state/0/mu/linear/kernel' in str(error.value)
  assert 'optimizer/opt_state/0/trace/linear/kernel: in the NNX model, nothing in the mapping makes it' in str(error.value)
  _assert_unchanged(model, before)
  with pytest.raises(ValueError, match='A checkpoint of one collection holds no optimizer state'):
    restore_linen_checkpoint(model, tmp_path / 'state', RENAMED, optimizer=optimizer, linen_collection='params')


def test_an_unknown_top_level_key_is_refused_by_name(tmp_path):
  variables = _variables()
  _save(tmp_path / 'state', {**variables, 'ema': variables['params'], 'step': 3})
  model = SamePort(nnx.Rngs(7))
  before = _snapshot(model)
  with pytest.raises(StateMismatchError, match=r'top-level keys ema of the checkpoint .* \(batch_stats, params\)'):
    restore_linen_checkpoint(model, tmp_path / 'state')
  _assert_unchanged(model, before)


@pytest.mark.parametrize('backend', ['msgpack', 'orbax'])
def test_a_legacy_flax_checkpoint(tmp_path, backend):
  variables = _variables()
  with flax_config.temp_flip_flag('use_orbax_checkpointing', backend == 'orbax'):
    flax_checkpoints.save_checkpoint(tmp_path / 'ckpts', _randomize(dict(variables), seed=9), step=1, keep=2)
    written = flax_checkpoints.save_checkpoint(tmp_path / 'ckpts', dict(variables), step=3, keep=2)
  assert len(os.listdir(tmp_path / 'ckpts')) == 2
  assert os.path.isfile(written) == (backend == 'msgpack')

  for path in (tmp_path / 'ckpts', written):  # the folder (its latest step, as flax restores it) or one step
    model = SamePort(nnx.Rngs(7))
    restore_linen_checkpoint(model, path)
    np.testing.assert_allclose(model(X), _linen_out(variables), rtol=1e-6)


def test_a_legacy_train_state_file(tmp_path):
  variables = _variables()
  with flax_config.temp_flip_flag('use_orbax_checkpointing', False):
    written = flax_checkpoints.save_checkpoint(tmp_path, _train_state(variables), step=7)
  model = SamePort(nnx.Rngs(7))
  restore_linen_checkpoint(model, written)
  np.testing.assert_allclose(model(X), _linen_out(variables), rtol=1e-6)


def test_rng_state_is_left_as_it_is(linen_ckpt):
  class WithDropout(SamePort):
    def __init__(self, rngs: nnx.Rngs):
      super().__init__(rngs)
      self.dropout = nnx.Dropout(0.5, rngs=rngs)

  model = WithDropout(nnx.Rngs(0))
  key = np.array(jax.random.key_data(model.dropout.rngs.key[...]))
  state = restore_linen_checkpoint(model, linen_ckpt[0])
  assert not any(isinstance(v, nnx.RngState) for _, v in nnx.to_flat_state(state))
  assert np.array_equal(jax.random.key_data(model.dropout.rngs.key[...]), key)
  model.eval()
  np.testing.assert_allclose(model(X), _linen_out(linen_ckpt[1]), rtol=1e-6)


# --- refusals: each names the offending paths and leaves the model as it was ----------------------


def _refused(path, error: type[Exception], expected: list[str], model=None, **kwargs) -> str:
  model = model if model is not None else SamePort(nnx.Rngs(7))
  before = _snapshot(model)
  with pytest.raises(error) as info:
    restore_linen_checkpoint(model, path, **kwargs)
  for text in expected:
    assert text in str(info.value), (text, str(info.value))
  _assert_unchanged(model, before)
  return str(info.value)


def test_a_missing_leaf(tmp_path):
  variables = _variables()
  del variables['params']['Dense_1']['bias']
  _save(tmp_path / 'linen', variables)

  _refused(tmp_path / 'linen', MappingError, ['NNX Dense_1/bias float32[2]: no Linen leaf', 'params/Dense_1/bias'])
  _refused(
      tmp_path / 'linen', StateMismatchError,
      ['params/Dense_1/bias -> head/bias: params/Dense_1/bias is in the mapping, not in the checkpoint'],
      model=RenamedPort(nnx.Rngs(3)), mapping=RENAMED,
  )


def test_a_missing_collection(tmp_path):
  variables = _variables()
  _save(tmp_path / 'linen', {'params': variables['params']})
  _refused(tmp_path / 'linen', MappingError, ['NNX BatchNorm_0/mean', 'batch_stats/BatchNorm_0/mean'])


def test_an_extra_leaf(tmp_path):
  variables = _variables()
  variables['params']['Dense_1']['scale'] = jnp.ones(2)
  _save(tmp_path / 'linen', variables)

  _refused(tmp_path / 'linen', MappingError, ['Linen params/Dense_1/scale float32[2]: no NNX leaf at Dense_1/scale'])
  _refused(
      tmp_path / 'linen', StateMismatchError, ['params/Dense_1/scale: in the checkpoint, not in the mapping'],
      model=RenamedPort(nnx.Rngs(3)), mapping=RENAMED,
  )


def test_a_leaf_the_mapping_makes_and_the_model_lacks(linen_ckpt):
  mapping = TreeMapping((*RENAMED.rules[:-1], LeafRule(('head', 'offset'), (('params', 'Dense_1', 'bias'),))))
  _refused(
      linen_ckpt[0], StateMismatchError,
      ['params/Dense_1/bias -> head/offset: the NNX model has no leaf head/offset',
       'head/bias: in the NNX model, nothing in the mapping makes it'],
      model=RenamedPort(nnx.Rngs(3)), mapping=mapping,
  )


def test_a_wrong_shape(linen_ckpt):
  _refused(
      linen_ckpt[0], MappingError,
      ['Linen params/Dense_1/kernel float32[4,2] does not fit NNX Dense_1/kernel float32[4,3]'],
      model=SamePort(nnx.Rngs(7), out=3),
  )
  _refused(
      linen_ckpt[0], StateMismatchError,
      ['params/Dense_1/kernel -> head/kernel: the checkpoint gives float32[4,2], '
       'the NNX model expects float32[4,3]'],
      model=RenamedPort(nnx.Rngs(3), out=3), mapping=RENAMED,
  )


def test_a_wrong_dtype(linen_ckpt):
  _refused(
      linen_ckpt[0], MappingError,
      ['Linen params/Dense_1/kernel float32[4,2] does not fit NNX Dense_1/kernel bfloat16[4,2]'],
      model=SamePort(nnx.Rngs(7), dtype=jnp.bfloat16),
  )


def test_a_wrong_dtype_with_an_explicit_mapping(tmp_path):
  variables = _variables()
  variables['batch_stats']['BatchNorm_0']['var'] = variables['batch_stats']['BatchNorm_0']['var'].astype(jnp.float16)
  _save(tmp_path / 'linen', variables)
  _refused(
      tmp_path / 'linen', StateMismatchError,
      ['batch_stats/BatchNorm_0/var -> norm/var: the checkpoint gives float16[4], the NNX model expects float32[4]'],
      model=RenamedPort(nnx.Rngs(3)), mapping=RENAMED,
  )


def test_a_dropped_leaf_must_be_zero(tmp_path):
  variables = _variables()
  variables['params']['Dense_1']['scale'] = jnp.ones(2)
  _save(tmp_path / 'linen', variables)
  mapping = TreeMapping(RENAMED.rules, dropped=(('params', 'Dense_1', 'scale'),))
  _refused(tmp_path / 'linen', LossyConversionError, ['params/Dense_1/scale'],
           model=RenamedPort(nnx.Rngs(3)), mapping=mapping)

  model = RenamedPort(nnx.Rngs(3))
  restore_linen_checkpoint(model, tmp_path / 'linen', mapping, allow_lossy=True)
  del variables['params']['Dense_1']['scale']
  np.testing.assert_allclose(model(X), _linen_out(variables), rtol=1e-6)


def _truncate(path) -> None:
  with open(path, 'r+b') as stream:
    stream.truncate(os.path.getsize(path) // 2)


def _largest_file(folder) -> str:
  files = [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names]
  return max(files, key=os.path.getsize)


@pytest.mark.parametrize('damaged', ['_METADATA', 'array data'])
def test_a_damaged_orbax_checkpoint(tmp_path, damaged):
  params = nn.Dense(64).init(jax.random.key(0), jnp.ones((1, 64)))['params']  # the kernel is stored apart
  _save(tmp_path / 'params', params)
  _truncate(tmp_path / 'params' / '_METADATA' if damaged == '_METADATA' else _largest_file(tmp_path / 'params'))

  message = _refused(
      tmp_path / 'params', UnreadableCheckpointError, [str(tmp_path / 'params'), 'save it or copy it'],
      model=nnx.Linear(64, 64, rngs=nnx.Rngs(0)), linen_collection='params',
  )
  assert '\n' not in message


def test_a_damaged_or_foreign_file(tmp_path):
  variables = _variables()
  with flax_config.temp_flip_flag('use_orbax_checkpointing', False):
    written = flax_checkpoints.save_checkpoint(tmp_path, dict(variables), step=1)
  _truncate(written)
  message = _refused(written, UnreadableCheckpointError, [f'{written} cannot be read as a flax msgpack checkpoint'])
  assert '\n' not in message

  (tmp_path / 'notes.txt').write_text('a number: 3')
  _refused(tmp_path / 'notes.txt', UnreadableCheckpointError, ['notes.txt'])


def test_a_path_that_does_not_exist(tmp_path):
  _refused(tmp_path / 'missing', FileNotFoundError, [f'No checkpoint at {tmp_path / "missing"}'])


def test_a_folder_that_is_not_a_checkpoint(tmp_path):
  (tmp_path / 'notes').mkdir()
  _refused(tmp_path / 'notes', UnreadableCheckpointError, ['notes is not an orbax checkpoint'])


def test_the_target_must_be_a_module_or_a_state_of_variables(linen_ckpt):
  with pytest.raises(TypeError, match='nnx.Module or an nnx.State'):
    restore_linen_checkpoint({'Dense_0': {}}, linen_ckpt[0])
  with pytest.raises(TypeError, match='not an nnx.Variable'):
    restore_linen_checkpoint(nnx.State(nnx.to_pure_dict(nnx.state(SamePort(nnx.Rngs(0))))), linen_ckpt[0])


# --- sharding ------------------------------------------------------------------------------------

_SHARDED_CHILD = textwrap.dedent('''
    import sys
    import jax, jax.numpy as jnp, numpy as np, orbax.checkpoint as ocp
    from flax import linen as nn, nnx
    from jax.sharding import NamedSharding, PartitionSpec as P
    from nnx_bridge import restore_linen_checkpoint
    from nnx_bridge.errors import StateMismatchError
    from nnx_bridge.treemap import LeafRule, TreeMapping

    tmp = sys.argv[1]
    assert len(jax.devices()) == 8
    mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    X = jnp.ones((2, 3))

    class LinenNet(nn.Module):
      @nn.compact
      def __call__(self, x):
        h = jnp.concatenate([nn.Dense(4, name='q')(x), nn.Dense(4, name='k')(x)], axis=-1)
        return nn.Dense(4)(nn.relu(nn.BatchNorm(use_running_average=True)(h)))

    part = lambda *names: nnx.with_partitioning(nnx.initializers.lecun_normal(), names)
    class Port(nnx.Module):
      def __init__(self, rngs):
        self.qk = nnx.Linear(3, 8, kernel_init=part(None, 'model'), rngs=rngs)
        self.BatchNorm_0 = nnx.BatchNorm(8, use_running_average=True, scale_init=nnx.with_partitioning(
            nnx.initializers.ones_init(), ('model',)), rngs=rngs)
        self.Dense_0 = nnx.Linear(8, 4, kernel_init=part('model', None), rngs=rngs)
      def __call__(self, x):
        return self.Dense_0(nnx.relu(self.BatchNorm_0(self.qk(x))))

    variables = LinenNet().init(jax.random.key(0), X)
    variables = jax.tree.map(lambda x: x + jnp.arange(x.size, dtype=x.dtype).reshape(x.shape) / 7, variables)
    saver = ocp.StandardCheckpointer()
    saver.save(tmp + '/linen', variables)
    saver.wait_until_finished()
    rules = [
        LeafRule(('qk', 'kernel'), (('params', 'q', 'kernel'), ('params', 'k', 'kernel')), concat_axis=1),
        LeafRule(('qk', 'bias'), (('params', 'q', 'bias'), ('params', 'k', 'bias')), concat_axis=0),
    ]
    for name in ('kernel', 'bias'):
      rules.append(LeafRule(('Dense_0', name), (('params', 'Dense_0', name),)))
    for name in ('scale', 'bias'):
      rules.append(LeafRule(('BatchNorm_0', name), (('params', 'BatchNorm_0', name),)))
    for name in ('mean', 'var'):
      rules.append(LeafRule(('BatchNorm_0', name), (('batch_stats', 'BatchNorm_0', name),)))
    mapping = TreeMapping(tuple(rules))
    linen = jax.tree.map(np.asarray, variables)
    expected = {
        ('qk', 'kernel'): (np.concatenate([linen['params']['q']['kernel'], linen['params']['k']['kernel']], 1),
                           P(None, 'model')),
        ('qk', 'bias'): (np.concatenate([linen['params']['q']['bias'], linen['params']['k']['bias']]), P()),
        ('Dense_0', 'kernel'): (linen['params']['Dense_0']['kernel'], P('model', None)),
        ('Dense_0', 'bias'): (linen['params']['Dense_0']['bias'], P()),
        ('BatchNorm_0', 'scale'): (linen['params']['BatchNorm_0']['scale'], P('model')),
        ('BatchNorm_0', 'bias'): (linen['params']['BatchNorm_0']['bias'], P()),
        ('BatchNorm_0', 'mean'): (linen['batch_stats']['BatchNorm_0']['mean'], P()),
        ('BatchNorm_0', 'var'): (linen['batch_stats']['BatchNorm_0']['var'], P()),
    }

    def check(state, how):
      flat = {tuple(map(str, path)): v.get_value() for path, v in nnx.to_flat_state(state)}
      assert flat.keys() == expected.keys(), (how, flat.keys())
      for key, (value, spec) in expected.items():
        got = flat[key]
        want = NamedSharding(mesh, spec)
        assert got.sharding.is_equivalent_to(want, got.ndim), (how, key, got.sharding, want)
        if spec != P():
          assert got.sharding == want, (how, key, got.sharding, want)
          assert len(got.addressable_shards) == 8 and got.addressable_shards[0].data.shape != got.shape, key
        assert np.array_equal(np.asarray(got), value), (how, key)

    # 1. The abstract state nnx.eval_shape gives under the mesh (shardings on the abstract mesh).
    with jax.set_mesh(mesh):
      graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Port(nnx.Rngs(0))))
      state = restore_linen_checkpoint(abstract, tmp + '/linen', mapping)
      check(state, 'eval_shape under set_mesh')
      model = nnx.merge(graphdef, state)
      np.testing.assert_allclose(model(X), LinenNet().apply(variables, X), rtol=1e-5)

    # ... which names the missing mesh outside it, before reading anything.
    try:
      restore_linen_checkpoint(abstract, tmp + '/linen', mapping)
      raise AssertionError('restored on an abstract mesh without a mesh')
    except StateMismatchError as error:
      assert 'abstract mesh' in str(error) and 'jax.set_mesh' in str(error), error

    # 2. ShapeDtypeStructs with concrete shardings, no mesh context.
    concrete = jax.tree.map(
        lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, v.sharding.spec)),
        abstract)
    check(restore_linen_checkpoint(concrete, tmp + '/linen', mapping), 'concrete ShapeDtypeStructs')

    # 3. A sharded model, restored in place: its arrays keep their shardings.
    with jax.set_mesh(mesh):
      model = Port(nnx.Rngs(1))
    restore_linen_checkpoint(model, tmp + '/linen', mapping)
    check(nnx.state(model), 'model in place')

    # 4. A TrainState into a sharded model and its optimizer: Adam's moments keep the params' shardings.
    import optax
    from flax.training import train_state

    class TrainState(train_state.TrainState):
      batch_stats: object

    tx = optax.adam(1e-3)
    ts = TrainState.create(apply_fn=LinenNet().apply, params=variables['params'],
                           batch_stats=variables['batch_stats'], tx=tx)
    _, opt_state = tx.update(jax.tree.map(jnp.ones_like, ts.params), ts.opt_state, ts.params)
    saver.save(tmp + '/train_state', ts.replace(opt_state=opt_state, step=1))
    saver.wait_until_finished()
    with jax.set_mesh(mesh):
      model = Port(nnx.Rngs(1))
      optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    restore_linen_checkpoint(model, tmp + '/train_state', mapping, optimizer=optimizer)
    check(nnx.state(model), 'model with its optimizer')
    assert int(optimizer.step.get_value()) == 1
    linen_mu = jax.tree.map(np.asarray, opt_state[0].mu)
    for name, spec in (('qk', P(None, 'model')), ('Dense_0', P('model', None))):
      got = optimizer.opt_state[0].mu[name]['kernel'].get_value()
      assert got.sharding == NamedSharding(mesh, spec), (name, got.sharding)
      want = (np.concatenate([linen_mu['q']['kernel'], linen_mu['k']['kernel']], 1) if name == 'qk'
              else linen_mu['Dense_0']['kernel'])
      assert np.array_equal(np.asarray(got), want), name
    print('sharded restore ok')
''')


def test_restored_arrays_have_the_target_shardings_on_an_8_device_mesh(tmp_path):
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu')
  result = subprocess.run(
      [sys.executable, '-c', _SHARDED_CHILD, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'sharded restore ok' in result.stdout
