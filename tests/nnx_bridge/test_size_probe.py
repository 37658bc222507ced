"""to_linen's `traced_sizes`: input sizes of layers inside an NNX module that no call argument shows, found by one
abstract run of the call, so that a Linen parent builds it on its Linen original's variables; what the run cannot
find is an error naming the size, never a guess."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import nnx_bridge
from nnx_bridge import size_probe

H = jax.random.normal(jax.random.key(0), (2, 5, 6))


class LinenHeads(nn.Module):
  """HF's attention shape: the output dense is fed the heads merged back, a size no argument shows."""

  heads: int
  head_dim: int

  @nn.compact
  def __call__(self, h):
    q = nn.Dense(self.heads * self.head_dim, name='query')(h).reshape(h.shape[:2] + (self.heads, self.head_dim))
    merged = jnp.tanh(q).reshape(h.shape[:2] + (-1,))
    return nn.LayerNorm(name='norm')(nn.Dense(h.shape[-1], name='dense')(merged) + h)


class Heads(nnx.Module):
  def __init__(self, heads, head_dim, *, query_in_features, dense_in_features, norm_num_features, out, rngs,
               decoder_in_features=None, tied=False):
    self.heads, self.head_dim = heads, head_dim
    self.query = nnx.Linear(query_in_features, heads * head_dim, rngs=rngs)
    self.dense = nnx.Linear(dense_in_features, out, rngs=rngs)
    self.norm = nnx.LayerNorm(norm_num_features, rngs=rngs)
    self.decoder = None if tied or decoder_in_features is None else nnx.Linear(decoder_in_features, 3, rngs=rngs)

  def __call__(self, h, decode=False):
    q = self.query(h).reshape(h.shape[:2] + (self.heads, self.head_dim))
    out = self.norm(self.dense(jnp.tanh(q).reshape(h.shape[:2] + (-1,))) + h)
    return self.decoder(out) if decode else out


def _parent(**bridge):
  class Parent(nn.Module):
    @nn.compact
    def __call__(self, h):
      return nnx_bridge.to_linen(Heads, 3, 4, out=6, name='attn', **bridge)(h)
  return Parent()


class LinenParent(nn.Module):
  @nn.compact
  def __call__(self, h):
    return LinenHeads(3, 4, name='attn')(h)


TRACED = dict(input_sizes={'query_in_features': 'h'}, traced_sizes=('dense_in_features', 'norm_num_features'))


def test_the_bridge_builds_the_linen_original_s_variables_and_runs_on_them():
  linen, bridged = LinenParent(), _parent(**TRACED)
  variables = linen.init(jax.random.key(1), H)
  shapes = lambda tree: jax.tree.map(jnp.shape, tree)
  assert shapes(bridged.init(jax.random.key(1), H)) == shapes(variables)
  assert shapes(variables)['params']['attn']['dense']['kernel'] == (12, 6)
  np.testing.assert_allclose(bridged.apply(variables, H), linen.apply(variables, H), atol=1e-6)
  np.testing.assert_allclose(jax.jit(bridged.apply)(variables, H), linen.apply(variables, H), atol=1e-6)
  grads = [jax.grad(lambda p, m=m: m.apply({'params': p}, H).sum())(variables['params']) for m in (linen, bridged)]
  for expected, actual in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1]), strict=True):
    np.testing.assert_allclose(actual, expected, atol=1e-5)


def test_the_probe_leaves_the_layer_classes_as_they_were():
  before = [vars(cls).get('__call__') for cls in (nnx.Linear, nnx.LayerNorm)]
  _parent(**TRACED).init(jax.random.key(1), H)
  assert [vars(cls).get('__call__') for cls in (nnx.Linear, nnx.LayerNorm)] == before


def test_sizes_found_per_call_shape():
  found = [size_probe.traced_sizes(Heads, (3, 4), (('out', h.shape[-1]), ('query_in_features', h.shape[-1])),
                                   ('dense_in_features', 'norm_num_features'), '__call__', (h,), {}, where='test')
           for h in (H, jnp.ones((1, 2, 8)))]
  assert found == [{'dense_in_features': 12, 'norm_num_features': 6}, {'dense_in_features': 12, 'norm_num_features': 8}]


def test_a_size_of_a_layer_that_is_not_built_is_not_needed():
  """HF's tied decoder: the size is an argument, but no layer takes it."""
  given = (('out', 6), ('query_in_features', 6), ('dense_in_features', 12), ('norm_num_features', 6), ('tied', True))
  found = size_probe.traced_sizes(Heads, (3, 4), given, ('decoder_in_features',), '__call__', (H,), {}, where='test')
  assert found == {'decoder_in_features': 0}


def test_a_size_the_call_never_reaches_is_an_error_naming_it():
  """The decoder is built but this call does not run it: its size is not guessed."""
  with pytest.raises(nnx_bridge.BridgeError, match='never ran a layer whose input size is decoder_in_features'):
    size_probe.traced_sizes(Heads, (3, 4), (('out', 6), ('query_in_features', 6), ('dense_in_features', 12),
                                            ('norm_num_features', 6)),
                            ('decoder_in_features',), '__call__', (H,), {}, where='test')
  found = size_probe.traced_sizes(Heads, (3, 4), (('out', 6), ('query_in_features', 6), ('dense_in_features', 12),
                                                  ('norm_num_features', 6)),
                                  ('decoder_in_features',), '__call__', (H,), {'decode': True}, where='test')
  assert found == {'decoder_in_features': 6}


def test_a_size_the_code_computes_with_is_an_error_not_a_guess():
  """A port whose __init__ doubles the size it is given: the run with placeholders fails, and says which sizes."""

  class Doubled(Heads):
    def __init__(self, *args, dense_in_features, **kwargs):
      super().__init__(*args, dense_in_features=2 * dense_in_features, **kwargs)

  with pytest.raises(nnx_bridge.BridgeError, match='finding dense_in_features by running the call failed'):
    size_probe.traced_sizes(Doubled, (3, 4), (('out', 6), ('query_in_features', 6), ('norm_num_features', 6)),
                            ('dense_in_features',), '__call__', (H,), {}, where='test')


class LinenConv1D(nn.Module):
  """GPT-2's FlaxConv1D: a kernel of its own, shaped by its input's last axis."""

  features: int

  @nn.compact
  def __call__(self, inputs):
    kernel = self.param('kernel', nn.initializers.normal(stddev=0.02), (self.features, inputs.shape[-1]))
    return inputs @ kernel.T


class Conv1D(nnx.Module):
  def __init__(self, features, *, kernel_features, rngs):
    self.kernel = nnx.Param(nn.initializers.normal(stddev=0.02)(rngs.params(), (features, kernel_features)))

  def __call__(self, inputs):
    return inputs @ self.kernel[...].T


class LinenAttention(nn.Module):
  """The projection is fed the heads merged back: its kernel's width is in no argument of the call."""

  @nn.compact
  def __call__(self, hidden_states):
    heads = LinenConv1D(8, name='c_attn')(hidden_states).reshape(hidden_states.shape[:2] + (2, 4))
    return LinenConv1D(3, name='c_proj')(jnp.tanh(heads).reshape(hidden_states.shape[:2] + (-1,)))


class Attention(nnx.Module):
  def __init__(self, *, c_attn_kernel_features, c_proj_kernel_features, rngs):
    self.c_attn = Conv1D(8, kernel_features=c_attn_kernel_features, rngs=rngs)
    self.c_proj = Conv1D(3, kernel_features=c_proj_kernel_features, rngs=rngs)

  def __call__(self, hidden_states):
    heads = self.c_attn(hidden_states).reshape(hidden_states.shape[:2] + (2, 4))
    return self.c_proj(jnp.tanh(heads).reshape(hidden_states.shape[:2] + (-1,)))


class TransposedAttention(Attention):
  """A wrong port: the projection's kernel is read the other way round, so its width is not the input's."""

  def __call__(self, hidden_states):
    heads = self.c_attn(hidden_states).reshape(hidden_states.shape[:2] + (2, 4))
    return jnp.tanh(heads).reshape(hidden_states.shape[:2] + (-1,)) @ self.c_proj.kernel[...]


def _attention_parent(cls):
  class Parent(nn.Module):
    @nn.compact
    def __call__(self, h):
      return nnx_bridge.to_linen(cls, name='attn', input_sizes={'c_attn_kernel_features': 'hidden_states'},
                                 traced_inputs={'c_proj_kernel_features': 'inputs'})(h)
  return Parent()


class LinenAttentionParent(nn.Module):
  @nn.compact
  def __call__(self, h):
    return LinenAttention(name='attn')(h)


def test_a_size_shaping_a_variable_of_a_module_inside_is_found_from_that_module_s_argument():
  linen, bridged = LinenAttentionParent(), _attention_parent(Attention)
  variables = jax.tree.map(lambda v: v + 0.1, linen.init(jax.random.key(1), H))
  shapes = lambda tree: jax.tree.map(jnp.shape, tree)
  assert shapes(bridged.init(jax.random.key(1), H)) == shapes(variables)
  assert shapes(variables)['params']['attn']['c_proj']['kernel'] == (3, 8)
  np.testing.assert_allclose(bridged.apply(variables, H), linen.apply(variables, H), atol=1e-6)
  grads = [jax.grad(lambda p, m=m: m.apply({'params': p}, H).sum())(variables['params']) for m in (linen, bridged)]
  for expected, actual in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1]), strict=True):
    np.testing.assert_allclose(actual, expected, atol=1e-5)


def test_a_port_whose_variable_is_shaped_otherwise_fails_the_run():
  variables = LinenAttentionParent().init(jax.random.key(1), H)
  with pytest.raises(nnx_bridge.BridgeError, match='finding c_proj_kernel_features by running the call failed'):
    _attention_parent(TransposedAttention).apply(variables, H)


def test_without_the_argument_s_name_the_size_is_an_error_not_a_guess():
  with pytest.raises(nnx_bridge.BridgeError, match='finding c_proj_kernel_features by running the call failed'):
    size_probe.traced_sizes(Attention, (), (('c_attn_kernel_features', 6),), ('c_proj_kernel_features',),
                            '__call__', (H,), {}, where='test')


def _doubling(x):
  return jnp.concatenate([x, x], axis=-1)


class LinenGrowing(nn.Module):
  """Each layer's output passes through a function that doubles its width: every layer has its own input size."""

  features: tuple = (3, 4, 5)

  @nn.compact
  def __call__(self, x):
    for f in self.features:
      x = _doubling(nn.Dense(f)(x))
    return x


class Growing(nnx.Module):
  """Its port: one input size per element of the list, a tuple the constructor takes."""

  def __init__(self, features=(3, 4, 5), *, linears_in_features: tuple, rngs):
    self.linears = nnx.List([nnx.Linear(linears_in_features[i], f, rngs=rngs) for i, f in enumerate(features)])

  def __call__(self, x):
    for linear in self.linears:
      x = _doubling(linear(x))
    return x


def test_a_size_per_element_of_a_list_is_found_element_by_element():
  found = size_probe.traced_sizes(Growing, (), (), ('linears_in_features',), '__call__', (H,), {}, where='test')
  assert found == {'linears_in_features': (6, 6, 8)}

  class Parent(nn.Module):
    @nn.compact
    def __call__(self, h):
      return nnx_bridge.to_linen(Growing, traced_sizes=('linears_in_features',),
                                 linen_names={'linears': 'Dense_{}'}, name='mlp')(h)

  class LinenParent(nn.Module):
    @nn.compact
    def __call__(self, h):
      return LinenGrowing(name='mlp')(h)

  linen, bridged = LinenParent(), Parent()
  variables = jax.tree.map(lambda v: v + 0.1, linen.init(jax.random.key(1), H))
  assert jax.tree.map(jnp.shape, bridged.init(jax.random.key(1), H)) == jax.tree.map(jnp.shape, variables)
  np.testing.assert_allclose(bridged.apply(variables, H), linen.apply(variables, H), atol=1e-6)


def test_an_element_size_indexed_by_other_than_a_number_is_an_error():
  class Keyed(Growing):
    def __init__(self, *, linears_in_features, rngs):
      super().__init__(linears_in_features={'a': linears_in_features['a']}, rngs=rngs)

  with pytest.raises(nnx_bridge.BridgeError, match="finding linears_in_features by running the call failed .*"
                                                   "indexed by 'a', not an element number"):
    size_probe.traced_sizes(Keyed, (), (), ('linears_in_features',), '__call__', (H,), {}, where='test')


class LinenGroupNormBlock(nn.Module):
  """diffusers' resnet shape: a GroupNorm of 4 groups over channels a convolution computed first."""

  @nn.compact
  def __call__(self, x):
    h = nn.Conv(8, (3, 3), name='conv')(x)
    return nn.GroupNorm(num_groups=4, name='norm')(h) + h


class GroupNormBlock(nnx.Module):
  def __init__(self, *, conv_in_features, norm_num_features, rngs, groups=4):
    self.conv = nnx.Conv(conv_in_features, 8, (3, 3), rngs=rngs)
    self.norm = nnx.GroupNorm(norm_num_features, num_groups=groups, rngs=rngs)

  def __call__(self, x):
    h = self.conv(x)
    return self.norm(h) + h


class LinenGroupNormParent(nn.Module):
  @nn.compact
  def __call__(self, x):
    return LinenGroupNormBlock(name='block')(x)


@pytest.mark.parametrize('groups', [4, 2], ids=['port', 'wrong_port'])
def test_a_group_norm_size_is_found_and_its_groups_follow_it(groups):
  """A GroupNorm keeps no feature count, only its group size, which a placeholder width would get wrong: the run
  finds the size from its input and gives the norm the group size of that size, so the port runs as Linen does;
  a port normalising over other groups computes something else, which the same check sees."""
  class Parent(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nnx_bridge.to_linen(GroupNormBlock, groups=groups, name='block', input_sizes={'conv_in_features': 'x'},
                                 traced_sizes=('norm_num_features',))(x)

  x = jax.random.normal(jax.random.key(2), (2, 4, 4, 3))
  variables = LinenGroupNormParent().init(jax.random.key(1), x)
  same = np.allclose(Parent().apply(variables, x), LinenGroupNormParent().apply(variables, x), atol=1e-5)
  assert same == (groups == 4)
