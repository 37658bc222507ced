"""Strict Linen <-> NNX state transfer through a TreeMapping, including optimizer state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from flax.training import train_state

from nnx_bridge import transfer
from nnx_bridge.errors import StateMismatchError
from nnx_bridge.treemap import LeafRule
from nnx_bridge.treemap import TreeMapping

X = jax.random.normal(jax.random.key(1), (4, 3))


class LinenMLP(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(4)(x)
    x = nn.BatchNorm(use_running_average=not train)(x)
    return nn.Dense(2)(nn.relu(x))


class NNXMLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.linear1 = nnx.Linear(3, 4, rngs=rngs)
    self.bn = nnx.BatchNorm(4, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)  # rng state, not part of any Linen tree
    self.linear2 = nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, x):
    return self.linear2(nnx.relu(self.dropout(self.bn(self.linear1(x)))))


def _rule(nnx_path, linen_key):
  return LeafRule(tuple(nnx_path.split('/')), (tuple(linen_key.split('/')),))


MAPPING = TreeMapping((
    _rule('linear1/kernel', 'params/Dense_0/kernel'),
    _rule('linear1/bias', 'params/Dense_0/bias'),
    _rule('bn/scale', 'params/BatchNorm_0/scale'),
    _rule('bn/bias', 'params/BatchNorm_0/bias'),
    _rule('bn/mean', 'batch_stats/BatchNorm_0/mean'),
    _rule('bn/var', 'batch_stats/BatchNorm_0/var'),
    _rule('linear2/kernel', 'params/Dense_1/kernel'),
    _rule('linear2/bias', 'params/Dense_1/bias'),
))


@pytest.fixture(scope='module')
def variables():
  variables = LinenMLP().init(jax.random.key(0), X)
  # One train step so the batch stats are not at their init values.
  _, updates = LinenMLP().apply(variables, X, train=True, mutable=['batch_stats'])
  return {**variables, **updates}


def test_transfer_reproduces_linen_outputs(variables):
  model = transfer.linen_to_nnx(variables, NNXMLP(nnx.Rngs(0)), MAPPING)
  model.eval()
  np.testing.assert_allclose(model(X), LinenMLP().apply(variables, X), atol=1e-6)


def test_round_trip_is_bit_exact(variables):
  model = transfer.linen_to_nnx(variables, NNXMLP(nnx.Rngs(0)), MAPPING)
  back = transfer.nnx_to_linen(model, MAPPING)
  assert jax.tree.structure(back) == jax.tree.structure(variables)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(variables)):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)


def test_rng_state_is_left_alone(variables):
  model = NNXMLP(nnx.Rngs(0))
  before = jax.random.key_data(model.dropout.rngs.key[...])
  transfer.linen_to_nnx(variables, model, MAPPING)
  np.testing.assert_array_equal(jax.random.key_data(model.dropout.rngs.key[...]), before)


def _edited(variables, edit):
  params = jax.tree.map(lambda x: x, dict(variables['params']))
  params['Dense_0'] = dict(params['Dense_0'])
  edit(params)
  return {**variables, 'params': params}


def test_missing_leaf_is_an_error(variables):
  broken = _edited(variables, lambda p: p['Dense_0'].pop('bias'))
  with pytest.raises(StateMismatchError, match='params/Dense_0/bias: in the mapping, not given'):
    transfer.linen_to_nnx(broken, NNXMLP(nnx.Rngs(0)), MAPPING)


def test_extra_leaf_is_an_error(variables):
  broken = _edited(variables, lambda p: p['Dense_0'].update(scale=jnp.ones(4)))
  with pytest.raises(StateMismatchError, match='params/Dense_0/scale: given, not in the mapping'):
    transfer.linen_to_nnx(broken, NNXMLP(nnx.Rngs(0)), MAPPING)


def test_wrong_shape_names_both_sides(variables):
  # nnx.replace_by_pure_dict would put a (5, 5) array into the (3, 4) slot without a word.
  broken = _edited(variables, lambda p: p['Dense_0'].update(kernel=jnp.ones((5, 5))))
  with pytest.raises(
      StateMismatchError,
      match=r'(?s)linear1/kernel: expected float32\[3,4\], got float32\[5,5\].*'
      r'linear1/kernel <- params/Dense_0/kernel',
  ):
    transfer.linen_to_nnx(broken, NNXMLP(nnx.Rngs(0)), MAPPING)


def test_wrong_dtype_is_an_error(variables):
  broken = _edited(variables, lambda p: p['Dense_0'].update(kernel=p['Dense_0']['kernel'].astype(jnp.bfloat16)))
  with pytest.raises(StateMismatchError, match=r'linear1/kernel: expected float32\[3,4\], got bfloat16\[3,4\]'):
    transfer.linen_to_nnx(broken, NNXMLP(nnx.Rngs(0)), MAPPING)


def test_failed_transfer_changes_nothing(variables):
  model = NNXMLP(nnx.Rngs(0))
  before = model.linear1.bias[...]
  broken = _edited(variables, lambda p: p['Dense_0'].update(kernel=jnp.ones((5, 5))))
  with pytest.raises(StateMismatchError):
    transfer.linen_to_nnx(broken, model, MAPPING)
  np.testing.assert_array_equal(model.linear1.bias[...], before)


class NNXStack(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.layers = nnx.List([nnx.Linear(3, 3, rngs=rngs) for _ in range(2)])

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


class LinenStack(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(3)(x)  # Dense_0 is applied first
    return nn.Dense(3)(h)


def test_integer_and_string_keys_are_the_same_key():
  variables = LinenStack().init(jax.random.key(0), X)
  # As read back from orbax, nnx.List indices are strings.
  mapping = TreeMapping(tuple(
      _rule(f'layers/{i}/{leaf}', f'params/Dense_{i}/{leaf}') for i in range(2) for leaf in ('kernel', 'bias')
  ))
  model = transfer.linen_to_nnx(variables, NNXStack(nnx.Rngs(0)), mapping)
  np.testing.assert_allclose(model(X), LinenStack().apply(variables, X), atol=1e-6)


# --- optimizer state ---------------------------------------------------------------------------


def _linen_loss(params, batch_stats, x):
  out, _ = LinenMLP().apply(
      {'params': params, 'batch_stats': batch_stats}, x, train=True, mutable=['batch_stats']
  )
  return (out ** 2).mean()


def test_optimizer_state_follows_the_parameters(variables):
  tx = optax.adam(1e-2)
  state = train_state.TrainState.create(apply_fn=None, params=variables['params'], tx=tx)
  grads = jax.grad(_linen_loss)(state.params, variables['batch_stats'], X)
  state = state.apply_gradients(grads=grads)  # non-trivial mu, nu, count and step

  model = transfer.linen_to_nnx({**variables, 'params': state.params}, NNXMLP(nnx.Rngs(0)), MAPPING)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  transfer.optimizer_state_to_nnx(state.opt_state, optimizer, MAPPING, step=state.step)
  assert int(optimizer.step[...]) == 1

  back = transfer.optimizer_state_to_linen(optimizer, MAPPING, state.opt_state)
  assert jax.tree.structure(back) == jax.tree.structure(state.opt_state)
  jax.tree.map(np.testing.assert_array_equal, back, state.opt_state)

  # One more identical step on both sides lands on the same parameters.
  grads = jax.grad(_linen_loss)(state.params, variables['batch_stats'], X)
  state = state.apply_gradients(grads=grads)
  model.train()
  model.dropout.deterministic = True
  nnx_grads = nnx.grad(lambda m: (m(X) ** 2).mean())(model)
  optimizer.update(model, nnx_grads)
  np.testing.assert_allclose(model.linear1.kernel[...], state.params['Dense_0']['kernel'], atol=1e-6)
  np.testing.assert_allclose(model.bn.scale[...], state.params['BatchNorm_0']['scale'], atol=1e-6)


def test_optimizer_state_of_another_shape_is_refused(variables):
  tx = optax.adam(1e-2)
  model = transfer.linen_to_nnx(variables, NNXMLP(nnx.Rngs(0)), MAPPING)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  sgd_state = optax.sgd(1e-2, momentum=0.9).init(variables['params'])
  with pytest.raises(StateMismatchError, match=r'opt_state/0/mu/linear1/kernel: expected float32\[3,4\], got nothing'):
    transfer.optimizer_state_to_nnx(sgd_state, optimizer, MAPPING)


class SameLayout(nnx.Module):
  """A port that kept Linen's auto-names: no mapping needed."""

  def __init__(self, rngs: nnx.Rngs, out: int = 3):
    self.Dense_0 = nnx.Linear(3, 3, rngs=rngs)
    self.Dense_1 = nnx.Linear(3, out, rngs=rngs)

  def __call__(self, x):
    return self.Dense_1(self.Dense_0(x))


def test_without_a_mapping_the_layouts_must_agree():
  from nnx_bridge.derive import MappingError

  variables = LinenStack().init(jax.random.key(0), X)
  model = transfer.linen_to_nnx(variables, SameLayout(nnx.Rngs(0)))
  np.testing.assert_allclose(model(X), LinenStack().apply(variables, X), atol=1e-6)
  with pytest.raises(MappingError, match=r'params/Dense_1/kernel float32\[3,3\] does not fit NNX Dense_1/kernel'):
    transfer.linen_to_nnx(variables, SameLayout(nnx.Rngs(0), out=2))


def test_an_array_attribute_is_a_constant_not_state():
  """HF's CLIP embeddings keep `self.position_ids = jnp.arange(...)` from setup(): in NNX a plain array attribute,
  which no Linen variable maps to. Mapping and transfer leave it alone; a wrong-shaped Linen leaf is still refused."""
  import nnx_bridge

  class LinenEmbeddings(nn.Module):
    def setup(self):
      self.position_ids = jnp.arange(4)
      self.position_embedding = nn.Embed(4, 3)

    def __call__(self, x):
      return x + self.position_embedding(self.position_ids)

  class Embeddings(nnx.Module):
    def __init__(self, rngs):
      self.position_ids = jnp.arange(4)
      self.position_embedding = nnx.Embed(4, 3, rngs=rngs)

    def __call__(self, x):
      return x + self.position_embedding(self.position_ids)

  x = jnp.ones((2, 4, 3))
  linen, model = LinenEmbeddings(), Embeddings(nnx.Rngs(1))
  variables = linen.init(jax.random.key(0), x)
  mapping = nnx_bridge.derive_mapping(linen, model, x)
  nnx_bridge.linen_to_nnx(variables, model, mapping)
  np.testing.assert_allclose(model(x), linen.apply(variables, x))
  assert np.array_equal(model.position_ids, jnp.arange(4))
  wrong = {'params': {'position_embedding': {'embedding': jnp.ones((5, 3))}}}
  with pytest.raises(Exception, match='position_embedding'):
    nnx_bridge.linen_to_nnx(wrong, model, mapping)
