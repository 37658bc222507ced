"""A whole TrainState checkpoint to nnx.state((model, optimizer)) and back: training resumes with the same losses."""

import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn
from flax import nnx
from flax.training import train_state

from nnx_bridge import derive
from nnx_bridge.errors import LossyConversionError
from nnx_bridge.errors import StateMismatchError
from nnx_bridge.train_state_checkpoint import nnx_to_train_state_checkpoint
from nnx_bridge.train_state_checkpoint import train_state_to_nnx_checkpoint
from nnx_bridge.treemap import TreeMapping

X = jax.random.normal(jax.random.key(1), (8, 3))
Y = jax.random.normal(jax.random.key(2), (8, 2))
TX = optax.adam(1e-2)


class Net(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.BatchNorm(use_running_average=not train)(nn.Dense(4)(x))
    return nn.Dense(2)(nn.relu(x))


class Port(nnx.Module):
  """The hand port with its own attribute names: the derived mapping pairs them."""

  def __init__(self, rngs: nnx.Rngs):
    self.linear = nnx.Linear(3, 4, rngs=rngs)
    self.norm = nnx.BatchNorm(4, rngs=rngs)
    self.head = nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, x):
    return self.head(nnx.relu(self.norm(self.linear(x))))


class TrainState(train_state.TrainState):
  batch_stats: tp.Any


def _fresh_state() -> TrainState:
  variables = Net().init(jax.random.key(0), X, train=False)
  return TrainState.create(apply_fn=Net().apply, params=variables['params'], batch_stats=variables['batch_stats'], tx=TX)


@jax.jit
def linen_step(state: TrainState) -> tuple[TrainState, jax.Array]:
  def loss_fn(params):
    out, updates = state.apply_fn(
        {'params': params, 'batch_stats': state.batch_stats}, X, train=True, mutable=['batch_stats'])
    return jnp.mean((out - Y) ** 2), updates

  (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  return state.apply_gradients(grads=grads, batch_stats=updates['batch_stats']), loss


@nnx.jit
def nnx_step(model: Port, optimizer: nnx.Optimizer) -> jax.Array:
  loss, grads = nnx.value_and_grad(lambda model: jnp.mean((model(X) - Y) ** 2))(model)
  optimizer.update(model, grads)
  return loss


def _save(path, tree) -> None:
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(path, tree)


def _model_and_optimizer() -> tuple[Port, nnx.Optimizer]:
  model = Port(nnx.Rngs(5))  # its own init: every leaf must come from the checkpoint
  return model, nnx.Optimizer(model, TX, wrt=nnx.Param)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A Linen TrainState after three steps, saved as flax examples save it, and the mapping to Port."""
  state = _fresh_state()
  for _ in range(3):
    state, _ = linen_step(state)
  path = tmp_path_factory.mktemp('linen') / 'state'
  _save(path, state)
  mapping = derive.derive_mapping(Net(), Port(nnx.Rngs(0)), X, train=False)
  return path, state, mapping


def test_training_resumes_in_nnx_with_the_losses_linen_would_have(trained, tmp_path):
  src, state, mapping = trained
  model, optimizer = _model_and_optimizer()
  written = train_state_to_nnx_checkpoint(
      src, tmp_path / 'nnx', mapping, model_abstract_state=nnx.state(model, nnx.Not(nnx.RngState)),
      optimizer_abstract_state=nnx.state(optimizer),
  )
  assert written == len(jax.tree.leaves(state))  # 6 params, 2 batch stats, adam's count, mu and nu, the step
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(tmp_path / 'nnx', nnx.state((model, optimizer), nnx.Not(nnx.RngState)))
  nnx.update((model, optimizer), restored)
  assert int(optimizer.step.get_value()) == 3
  linen_losses, nnx_losses = [], []
  for _ in range(3):
    state, loss = linen_step(state)
    linen_losses.append(float(loss))
    nnx_losses.append(float(nnx_step(model, optimizer)))
  np.testing.assert_allclose(nnx_losses, linen_losses, rtol=1e-6)
  np.testing.assert_allclose(model.norm.mean.get_value(), state.batch_stats['BatchNorm_0']['mean'], rtol=1e-6)


def test_nnx_training_state_comes_back_as_the_train_state_linen_restores(trained, tmp_path):
  src, state, mapping = trained
  model, optimizer = _model_and_optimizer()
  train_state_to_nnx_checkpoint(src, tmp_path / 'nnx', mapping)  # the abstract states are optional
  with ocp.StandardCheckpointer() as checkpointer:
    nnx.update((model, optimizer), checkpointer.restore(
        tmp_path / 'nnx', nnx.state((model, optimizer), nnx.Not(nnx.RngState))))
  nnx_step(model, optimizer)
  _save(tmp_path / 'nnx_next', nnx.state((model, optimizer), nnx.Not(nnx.RngState)))
  nnx_to_train_state_checkpoint(tmp_path / 'nnx_next', tmp_path / 'linen', mapping, train_state_like=_fresh_state())
  with ocp.StandardCheckpointer() as checkpointer:
    back = checkpointer.restore(tmp_path / 'linen', _fresh_state())  # optax's tuples, EmptyState and all
  expected, _ = linen_step(state)
  assert int(back.step) == 4
  for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_an_optimizer_of_another_kind_writes_nothing(trained, tmp_path):
  src, _, mapping = trained
  model = Port(nnx.Rngs(0))
  sgd = nnx.state(nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param))
  with pytest.raises(StateMismatchError) as error:
    train_state_to_nnx_checkpoint(src, tmp_path / 'nnx', mapping, optimizer_abstract_state=sgd)
  assert '1/opt_state/0/mu/linear/kernel/value' in str(error.value)  # adam's moment has no place in sgd's trace
  assert '1/opt_state/0/trace/linear/kernel/value: in the NNX model and optimizer' in str(error.value)
  assert not (tmp_path / 'nnx').exists()


def test_a_field_nothing_maps_is_named_and_nothing_written(tmp_path):
  state = _fresh_state()
  _save(tmp_path / 'linen', {**state.__dict__, 'apply_fn': None, 'tx': None, 'dropout_rng': jnp.zeros(2, jnp.uint32)})
  mapping = derive.derive_mapping(Net(), Port(nnx.Rngs(0)), X, train=False)
  with pytest.raises(StateMismatchError, match='dropout_rng: in the checkpoint, not in the mapping'):
    train_state_to_nnx_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', mapping)
  assert not (tmp_path / 'nnx').exists()


def test_a_missing_moment_is_named(trained, tmp_path):
  _, state, mapping = trained
  adam, empty = state.opt_state
  mu = {name: dict(leaves) for name, leaves in adam.mu.items()}
  del mu['Dense_0']['kernel']
  _save(tmp_path / 'linen', state.replace(opt_state=(adam._replace(mu=mu), empty)))
  with pytest.raises(StateMismatchError, match='opt_state/0/mu/Dense_0/kernel is in the mapping, not in the checkpoint'):
    train_state_to_nnx_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', mapping)


def test_a_dropped_leaf_must_be_zero_and_its_moments_go_with_it(trained, tmp_path):
  src, _, mapping = trained
  keep = tuple(rule for rule in mapping.rules if rule.linen != (('params', 'Dense_1', 'bias'),))
  dropping = TreeMapping(keep, (('params', 'Dense_1', 'bias'),))
  with pytest.raises(LossyConversionError, match='params/Dense_1/bias'):
    train_state_to_nnx_checkpoint(src, tmp_path / 'nnx', dropping)
  written = train_state_to_nnx_checkpoint(src, tmp_path / 'nnx', dropping, allow_lossy=True)
  assert written == len(jax.tree.leaves(trained[1])) - 3  # the bias, its mu and its nu


def test_the_train_state_to_restore_into_is_checked(trained, tmp_path):
  src, state, mapping = trained
  model, optimizer = _model_and_optimizer()
  train_state_to_nnx_checkpoint(src, tmp_path / 'nnx', mapping)
  other = TrainState.create(apply_fn=None, params=state.params, batch_stats=state.batch_stats, tx=optax.sgd(0.1))
  with pytest.raises(StateMismatchError, match='opt_state/0/mu/Dense_0/kernel: the TrainState has no leaf'):
    nnx_to_train_state_checkpoint(tmp_path / 'nnx', tmp_path / 'linen', mapping, train_state_like=other)
  assert not (tmp_path / 'linen').exists()
