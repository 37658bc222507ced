"""Linen variables <-> NNX state: layout, metadata boxes, exact round trips."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from flax.core import meta

from nnx_bridge import linen_state


class _Stateful(nn.Module):
  """Params with partitioning metadata, batch stats, and a custom collection."""

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(
        4,
        kernel_init=nn.with_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp')),
    )(x)
    x = nn.Dense(
        3,
        kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('mlp', 'vocab')),
    )(x)
    x = nn.BatchNorm(use_running_average=False)(x)
    self.variable('step_counts', 'steps', lambda: jnp.zeros((), jnp.int32))
    return x


@pytest.fixture(scope='module')
def variables():
  return _Stateful().init(jax.random.key(0), jnp.ones((2, 5)))


def _assert_same_tree(a, b):
  flat_a = jax.tree_util.tree_flatten_with_path(a, is_leaf=lambda x: isinstance(x, meta.AxisMetadata))[0]
  flat_b = jax.tree_util.tree_flatten_with_path(b, is_leaf=lambda x: isinstance(x, meta.AxisMetadata))[0]
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
  for (path, x), (_, y) in zip(flat_a, flat_b):
    assert type(x) is type(y), path
    if isinstance(x, meta.AxisMetadata):
      assert x.replace_boxed(None) == y.replace_boxed(None), path  # same metadata fields
      x, y = x.unbox(), y.unbox()
    np.testing.assert_array_equal(x, y)
    assert x.dtype == y.dtype


def test_layout_is_per_module_with_typed_variables(variables):
  state = linen_state.linen_to_nnx_state(variables)
  assert isinstance(state['Dense_0']['kernel'], nnx.Param)
  assert state['Dense_0']['kernel'].get_metadata()['out_sharding'] == ('embed', 'mlp')
  assert state['Dense_1']['kernel'].get_metadata()['out_sharding'] == ('mlp', 'vocab')
  assert isinstance(state['BatchNorm_0']['mean'], nnx.BatchStat)
  assert isinstance(state['BatchNorm_0']['scale'], nnx.Param)
  assert state['steps'].get_value().dtype == jnp.int32
  assert type(state['steps']).__name__ == 'Collection_step_counts'


def test_round_trip_is_exact_with_metadata_boxes(variables):
  back = linen_state.nnx_to_linen_variables(linen_state.linen_to_nnx_state(variables))
  # flax's LogicallyPartitioned.to_nnx_metadata strips `names` from the box it is called on;
  # the caller's tree must come out of a conversion untouched.
  assert variables['params']['Dense_1']['kernel'].names == ('mlp', 'vocab')
  assert isinstance(back['params']['Dense_0']['kernel'], nn.Partitioned)
  assert isinstance(back['params']['Dense_1']['kernel'], nn.LogicallyPartitioned)
  _assert_same_tree(variables, back)


def test_round_trip_detects_a_changed_box():
  """The comparison above must fail when metadata differs (guards the round-trip test)."""
  a = {'params': {'w': nn.Partitioned(jnp.ones((2, 2)), names=('a', 'b'))}}
  b = {'params': {'w': nn.Partitioned(jnp.ones((2, 2)), names=('a', None))}}
  with pytest.raises(AssertionError):
    _assert_same_tree(a, b)


def test_unboxed_view_for_apply(variables):
  raw = linen_state.nnx_to_linen_variables(linen_state.linen_to_nnx_state(variables), boxed=False)
  assert not any(
      isinstance(x, meta.AxisMetadata)
      for x in jax.tree.leaves(raw, is_leaf=lambda x: isinstance(x, meta.AxisMetadata))
  )
  x = jnp.ones((2, 5))
  expected = _Stateful().apply(variables, x, mutable=['batch_stats'])[0]
  np.testing.assert_array_equal(_Stateful().apply(raw, x, mutable=['batch_stats'])[0], expected)


def test_same_name_in_two_collections_round_trips():
  # flax's own bridge raises "Found duplicate variable path" on this legal Linen tree.
  variables = {
      'params': {'layer': {'w': jnp.ones((2,))}},
      'cache': {'layer': {'w': jnp.zeros((3,))}},
      'batch_stats': {'layer': {'w': jnp.full((4,), 2.0)}},
  }
  state = linen_state.linen_to_nnx_state(variables)
  assert set(state['layer']) == {'w', 'cache:w', 'batch_stats:w'}
  assert isinstance(state['layer']['w'], nnx.Param)
  assert isinstance(state['layer']['cache:w'], nnx.Cache)
  _assert_same_tree(variables, linen_state.nnx_to_linen_variables(state))


def test_non_variable_leaf_is_rejected():
  with pytest.raises(TypeError, match='layer/w is not an nnx.Variable'):
    linen_state.nnx_to_linen_variables({'layer': {'w': jnp.ones(2)}})
