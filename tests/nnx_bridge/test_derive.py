"""derive_mapping: Linen and NNX layouts paired by call order and the layer table, proven by transfer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from flax import traverse_util
from flax.nnx import traversals

from nnx_bridge.derive import MappingError, derive_mapping, mapping_by_path
from nnx_bridge.treemap import LeafRule, TreeMapping, normalize_path

X = jax.ShapeDtypeStruct((2, 3), jnp.float32)


def _perturbed(variables, seed=0):
  """Random positive shifts, so no leaf keeps its init value and a wrong mapping shows."""
  rng = np.random.default_rng(seed)
  return traverse_util.unflatten_dict({
      path: jnp.asarray(np.asarray(leaf) + rng.uniform(0.1, 1.0, leaf.shape), leaf.dtype)
      for path, leaf in traverse_util.flatten_dict(variables).items()
  })


def _transfer(mapping, linen_variables, model):
  """Puts the Linen values into `model` through `mapping`, paths converted back to the model's keys."""
  nnx_flat = mapping.linen_to_nnx(traverse_util.flatten_dict(linen_variables))
  model_paths = {
      normalize_path(path): path for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.RngState)))
  }
  assert set(nnx_flat) == set(model_paths)
  nnx.update(model, nnx.State(traversals.unflatten_mapping({model_paths[p]: v for p, v in nnx_flat.items()})))


def _check(linen_module, make_nnx, *inputs, **call_kwargs):
  """Derives on abstract models, transfers real values, and compares the two forward passes."""
  abstract = nnx.eval_shape(make_nnx)
  specs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), inputs)
  mapping = derive_mapping(linen_module, abstract, *specs, **call_kwargs)
  variables = _perturbed(linen_module.init(jax.random.key(1), *inputs, **call_kwargs))
  model = make_nnx()
  _transfer(mapping, variables, model)
  model.eval()
  expected = linen_module.apply(variables, *inputs, **call_kwargs)
  got = model(*inputs)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), got, expected)
  return mapping


def _x(shape=(2, 3), seed=0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _rule(mapping, nnx_path):
  return next(rule for rule in mapping.rules if rule.nnx == nnx_path)


# --- Models ------------------------------------------------------------------------------------


class SetupMLP(nn.Module):
  def setup(self):
    self.dense_in = nn.Dense(4)
    self.dense_out = nn.Dense(2)

  def __call__(self, x):
    return self.dense_out(nn.relu(self.dense_in(x)))


class CompactMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(nn.relu(nn.Dense(4)(x)))  # Dense_1 (inner) is called first


class NNXMLP(nnx.Module):
  def __init__(self, hidden=4, out=2, use_bias=True, *, rngs):
    self.linear1 = nnx.Linear(3, hidden, rngs=rngs)
    self.linear2 = nnx.Linear(hidden, out, use_bias=use_bias, rngs=rngs)

  def __call__(self, x):
    return self.linear2(nnx.relu(self.linear1(x)))


@pytest.mark.parametrize('linen_cls', [SetupMLP, CompactMLP])
def test_mlp_with_other_attribute_names(linen_cls):
  mapping = _check(linen_cls(), lambda: NNXMLP(rngs=nnx.Rngs(0)), _x())
  first = 'dense_in' if linen_cls is SetupMLP else 'Dense_1'
  assert _rule(mapping, ('linear1', 'kernel')).linen == (('params', first, 'kernel'),)


class SameWidth(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(3)(x))
    return nn.Dense(3)(x)


class DeclaredOutOfOrder(nnx.Module):
  def __init__(self, *, rngs):
    self.a = nnx.Linear(3, 3, rngs=rngs)  # declared first, sorted first, called second
    self.z = nnx.Linear(3, 3, rngs=rngs)

  def __call__(self, x):
    return self.a(nnx.relu(self.z(x)))


def test_call_order_wins_over_declaration_order():
  mapping = _check(SameWidth(), lambda: DeclaredOutOfOrder(rngs=nnx.Rngs(0)), _x())
  assert _rule(mapping, ('z', 'kernel')).linen == (('params', 'Dense_0', 'kernel'),)
  assert _rule(mapping, ('a', 'kernel')).linen == (('params', 'Dense_1', 'kernel'),)


class Stack(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(3):
      x = nn.tanh(nn.Dense(3)(x))
    return x


class NNXStack(nnx.Module):
  def __init__(self, *, rngs):
    self.layers = nnx.List([nnx.Linear(3, 3, rngs=rngs) for _ in range(3)])

  def __call__(self, x):
    for layer in self.layers:
      x = nnx.tanh(layer(x))
    return x


def test_nnx_list_children():
  mapping = _check(Stack(), lambda: NNXStack(rngs=nnx.Rngs(0)), _x())
  assert _rule(mapping, ('layers', '2', 'bias')).linen == (('params', 'Dense_2', 'bias'),)


class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(5)(x))
    return nn.Dense(3)(x)


class Blocks(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(2):
      x = Block()(x)
    return x


class NNXBlock(nnx.Module):
  def __init__(self, *, rngs):
    self.linear1 = nnx.Linear(3, 5, rngs=rngs)
    self.linear2 = nnx.Linear(5, 3, rngs=rngs)

  def __call__(self, x):
    return self.linear2(nnx.relu(self.linear1(x)))


class NNXBlocks(nnx.Module):
  def __init__(self, *, rngs):
    self.blocks = nnx.List([NNXBlock(rngs=rngs) for _ in range(2)])

  def __call__(self, x):
    for block in self.blocks:
      x = block(x)
    return x


def test_nested_blocks():
  mapping = _check(Blocks(), lambda: NNXBlocks(rngs=nnx.Rngs(0)), _x())
  assert _rule(mapping, ('blocks', '0', 'linear2', 'kernel')).linen == (
      ('params', 'Block_0', 'Dense_1', 'kernel'),
  )


class Normed(nn.Module):
  @nn.compact
  def __call__(self, x, train):
    x = nn.Dense(4)(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    return nn.Dense(2)(x)


class NNXNormed(nnx.Module):
  def __init__(self, *, rngs):
    self.linear = nnx.Linear(3, 4, rngs=rngs)
    self.norm = nnx.BatchNorm(4, momentum=0.9, rngs=rngs)
    self.head = nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, x):
    return self.head(self.norm(self.linear(x)))


def test_batch_norm_stats_come_from_batch_stats():
  mapping = _check(Normed(), lambda: NNXNormed(rngs=nnx.Rngs(0)), _x(), train=False)
  assert _rule(mapping, ('norm', 'mean')).linen == (('batch_stats', 'BatchNorm_0', 'mean'),)
  assert _rule(mapping, ('norm', 'scale')).linen == (('params', 'BatchNorm_0', 'scale'),)


class Recurrent(nn.Module):
  @nn.compact
  def __call__(self, carry, x):
    return nn.LSTMCell(4)(carry, nn.Dense(3)(x))


class NNXRecurrent(nnx.Module):
  def __init__(self, *, rngs):
    self.proj = nnx.Linear(3, 3, rngs=rngs)
    self.cell = nnx.LSTMCell(3, 4, rngs=rngs)

  def __call__(self, carry, x):
    return self.cell(carry, self.proj(x))


def _carry(seed=1):
  return (_x((2, 4), seed), _x((2, 4), seed + 1))


def test_lstm_cell_if_gate_is_renamed():
  mapping = _check(Recurrent(), lambda: NNXRecurrent(rngs=nnx.Rngs(0)), _carry(), _x())
  assert _rule(mapping, ('cell', 'if_', 'kernel')).linen == (('params', 'LSTMCell_0', 'if', 'kernel'),)


def test_optimized_lstm_cell_gates_are_fused():
  mapping = _check(
      nn.OptimizedLSTMCell(4), lambda: nnx.OptimizedLSTMCell(3, 4, rngs=nnx.Rngs(0)), _carry(), _x()
  )
  assert _rule(mapping, ('dense_h', 'bias')) == LeafRule(
      ('dense_h', 'bias'), tuple(('params', f'h{g}', 'bias') for g in 'ifgo'), -1
  )


def _gru_variables_without_hn_bias(variables):
  variables = _perturbed(variables)
  return {'params': {**variables['params'], 'hn': {**variables['params']['hn'], 'bias': jnp.zeros(4)}}}


def test_gru_cell_hn_bias_is_dropped():
  cell = nn.GRUCell(4)
  mapping = derive_mapping(cell, nnx.eval_shape(lambda: nnx.GRUCell(3, 4, rngs=nnx.Rngs(0))), _carry()[0], X)
  assert mapping.dropped == (('params', 'hn', 'bias'),)
  variables = _gru_variables_without_hn_bias(cell.init(jax.random.key(1), _carry()[0], _x()))
  model = nnx.GRUCell(3, 4, rngs=nnx.Rngs(0))
  _transfer(mapping, variables, model)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
      model(_carry()[0], _x()),
      cell.apply(variables, _carry()[0], _x()),
  )


class Affine(nn.Module):
  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],))
    offset = self.param('offset', nn.initializers.zeros, (x.shape[-1],))
    return x * scale + offset


class WithAffine(nn.Module):
  @nn.compact
  def __call__(self, x):
    temperature = self.param('temperature', nn.initializers.ones, ())
    return nn.Dense(2)(Affine()(nn.Dense(4)(x))) / temperature


class NNXAffine(nnx.Module):
  def __init__(self, n):
    self.scale = nnx.Param(jnp.ones(n))
    self.bias = nnx.Param(jnp.zeros(n))  # Linen calls it `offset`: paired by its unique shape

  def __call__(self, x):
    return x * self.scale + self.bias


class NNXWithAffine(nnx.Module):
  def __init__(self, *, rngs):
    self.temperature = nnx.Param(jnp.ones(()))
    self.inp = nnx.Linear(3, 4, rngs=rngs)
    self.affine = NNXAffine(4)
    self.out = nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, x):
    return self.out(self.affine(self.inp(x))) / self.temperature


def test_custom_module_params():
  mapping = _check(WithAffine(), lambda: NNXWithAffine(rngs=nnx.Rngs(0)), _x())
  assert _rule(mapping, ('affine', 'bias')).linen == (('params', 'Affine_0', 'offset'),)
  assert _rule(mapping, ('temperature',)).linen == (('params', 'temperature'),)


class Shared(nn.Module):
  def setup(self):
    self.body = nn.Dense(3)
    self.head = nn.Dense(2)

  def __call__(self, x):
    return self.head(self.body(nn.relu(self.body(x))))


class NNXShared(nnx.Module):
  def __init__(self, *, rngs):
    self.twice = nnx.Linear(3, 3, rngs=rngs)
    self.head = nnx.Linear(3, 2, rngs=rngs)

  def __call__(self, x):
    return self.head(self.twice(nnx.relu(self.twice(x))))


def test_shared_module_maps_once():
  mapping = _check(Shared(), lambda: NNXShared(rngs=nnx.Rngs(0)), _x())
  assert len(mapping.rules) == 4


def test_classes_are_restored():
  before = nnx.Linear.__dict__['__call__'], '__call__' in NNXMLP.__dict__
  derive_mapping(CompactMLP(), nnx.eval_shape(lambda: NNXMLP(rngs=nnx.Rngs(0))), X)
  assert (nnx.Linear.__dict__['__call__'], '__call__' in NNXMLP.__dict__) == before


def test_json_round_trip_with_fused_and_dropped_leaves():
  mapping = derive_mapping(
      nn.GRUCell(4), nnx.eval_shape(lambda: nnx.GRUCell(3, 4, rngs=nnx.Rngs(0))), _carry()[0], X
  )
  assert any(len(rule.linen) > 1 for rule in mapping.rules) and mapping.dropped
  assert TreeMapping.from_json(mapping.to_json()) == mapping


# --- mapping_by_path ---------------------------------------------------------------------------


class NNXSameLayout(nnx.Module):
  def __init__(self, *, rngs):
    self.Dense_0 = nnx.Linear(3, 4, rngs=rngs)
    self.BatchNorm_0 = nnx.BatchNorm(4, rngs=rngs)
    self.Dense_1 = nnx.Linear(4, 2, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)  # rng state: not part of the mapping


def test_mapping_by_path():
  variables = jax.eval_shape(lambda: Normed().init(jax.random.key(0), _x(), train=False))
  abstract = nnx.eval_shape(lambda: NNXSameLayout(rngs=nnx.Rngs(0)))
  mapping = mapping_by_path(variables, nnx.state(abstract))
  assert _rule(mapping, ('BatchNorm_0', 'var')).linen == (('batch_stats', 'BatchNorm_0', 'var'),)
  assert len(mapping.rules) == 8
  assert derive_mapping(Normed(), abstract, X, train=False) == mapping  # no forward pass needed


def test_mapping_by_path_names_unmatched_leaves():
  variables = jax.eval_shape(lambda: CompactMLP().init(jax.random.key(0), _x()))
  with pytest.raises(MappingError, match=r'params/Dense_0/kernel float32\[4,2\]: no NNX leaf'):
    mapping_by_path(variables, nnx.state(nnx.eval_shape(lambda: NNXMLP(rngs=nnx.Rngs(0)))))


# --- Given layer pairs -------------------------------------------------------------------------


class QueryKey(nn.Module):
  @nn.compact
  def __call__(self, x):
    q = nn.Dense(3, name='query')(x)
    k = nn.Dense(3, name='key')(x)
    return q * jnp.tanh(k)


class NNXKeyFirst(nnx.Module):
  """The same model, computing the key first: call order alone pairs query with k."""

  def __init__(self, *, rngs):
    self.q = nnx.Linear(3, 3, rngs=rngs)
    self.k = nnx.Linear(3, 3, rngs=rngs)

  def __call__(self, x):
    k = self.k(x)
    return self.q(x) * jnp.tanh(k)


def test_given_layer_pairs_beat_call_order():
  x, abstract = _x(), nnx.eval_shape(lambda: NNXKeyFirst(rngs=nnx.Rngs(0)))
  by_order = derive_mapping(QueryKey(), abstract, x)
  assert _rule(by_order, ('k', 'kernel')).linen == (('params', 'query', 'kernel'),)  # the known limit
  pairs = {('query',): ('q',), ('key',): ('k',)}
  mapping = derive_mapping(QueryKey(), abstract, x, layer_pairs=pairs)
  assert _rule(mapping, ('k', 'kernel')).linen == (('params', 'key', 'kernel'),)
  variables = _perturbed(QueryKey().init(jax.random.key(1), x))
  model = NNXKeyFirst(rngs=nnx.Rngs(0))
  _transfer(mapping, variables, model)
  np.testing.assert_allclose(model(x), QueryKey().apply(variables, x), atol=1e-5)


def test_given_layer_pairs_settle_what_call_order_cannot():
  pairs = {('Dense_0',): ('first',), ('Dense_1',): ('second',), ('nowhere',): ('second',)}
  mapping = derive_mapping(SameWidth(), nnx.eval_shape(lambda: NNXUncalled(rngs=nnx.Rngs(0))), X, layer_pairs=pairs)
  assert _rule(mapping, ('second', 'kernel')).linen == (('params', 'Dense_1', 'kernel'),)


def test_given_layer_pairs_that_do_not_fit_are_refused():
  with pytest.raises(MappingError, match=r'2 layers paired by the given names(.|\n)*'
                     r'Linen params/Dense_0/kernel float32\[4,2\] does not fit NNX linear1/kernel float32\[3,4\]'):
    derive_mapping(CompactMLP(), nnx.eval_shape(lambda: NNXMLP(rngs=nnx.Rngs(0))), X,
                   layer_pairs={('Dense_0',): ('linear1',), ('Dense_1',): ('linear2',)})


# --- Refusals ----------------------------------------------------------------------------------


def _derive(linen_module, make_nnx, *inputs):
  return derive_mapping(linen_module, nnx.eval_shape(make_nnx), *inputs)


def test_refuses_transposed_kernel():
  class Transposed(NNXMLP):
    def __init__(self, *, rngs):
      super().__init__(rngs=rngs)
      self.linear2 = nnx.Linear(2, 4, rngs=rngs)

  with pytest.raises(
      MappingError,
      match=r'Linen params/Dense_0/kernel float32\[4,2\] does not fit NNX linear2/kernel float32\[2,4\]',
  ):
    _derive(CompactMLP(), lambda: Transposed(rngs=nnx.Rngs(0)), X)


def test_refuses_missing_bias():
  with pytest.raises(MappingError, match=r'params/Dense_0/bias float32\[2\] has no place in NNX linear2'):
    _derive(CompactMLP(), lambda: NNXMLP(use_bias=False, rngs=nnx.Rngs(0)), X)


class NNXExtraLayer(NNXMLP):
  def __init__(self, *, rngs):
    super().__init__(rngs=rngs)
    self.extra = nnx.Linear(4, 4, rngs=rngs)

  def __call__(self, x):
    return self.linear2(self.extra(nnx.relu(self.linear1(x))))


def test_refuses_extra_layer():
  with pytest.raises(MappingError, match=r'NNX extra \(Linear\) has no Linen counterpart: extra/bias'):
    _derive(CompactMLP(), lambda: NNXExtraLayer(rngs=nnx.Rngs(0)), X)


class NNXUncalled(nnx.Module):
  """Uses its layers' kernels directly, so its forward pass gives no call order."""

  def __init__(self, *, rngs):
    self.first = nnx.Linear(3, 3, rngs=rngs)
    self.second = nnx.Linear(3, 3, rngs=rngs)

  def __call__(self, x):
    x = nnx.relu(x @ self.first.kernel[...] + self.first.bias[...])
    return x @ self.second.kernel[...] + self.second.bias[...]


def test_refuses_identical_uncalled_layers_as_ambiguous():
  with pytest.raises(MappingError, match=r'ambiguous: Linen Dense_0 \(Dense\), Linen Dense_1 .* NNX first'):
    _derive(SameWidth(), lambda: NNXUncalled(rngs=nnx.Rngs(0)), X)


def test_refuses_wrong_layer_class():
  class Normalized(NNXMLP):
    def __init__(self, *, rngs):
      super().__init__(rngs=rngs)
      self.linear1 = nnx.LayerNorm(3, rngs=rngs)
      self.linear2 = nnx.Linear(3, 2, rngs=rngs)

  with pytest.raises(MappingError, match=r'Linen Dense_1 \(Dense\) pairs with NNX linear1 \(LayerNorm\)'):
    _derive(CompactMLP(), lambda: Normalized(rngs=nnx.Rngs(0)), X)


def test_refusal_suggests_an_explicit_mapping_file():
  with pytest.raises(MappingError, match='TreeMapping.load'):
    _derive(SameWidth(), lambda: NNXUncalled(rngs=nnx.Rngs(0)), X)


class ThreeNamed(nn.Module):
  def setup(self):
    self.a = nn.Dense(3)
    self.b = nn.Dense(3)
    self.c = nn.Dense(2)

  def __call__(self, x):
    return self.c(self.b(nn.relu(self.a(x))))


class NNXSwapped(nnx.Module):
  def __init__(self, *, rngs):
    self.a = nnx.Linear(3, 3, rngs=rngs)
    self.b = nnx.Linear(3, 3, rngs=rngs)
    self.head = nnx.Linear(3, 2, rngs=rngs)

  def __call__(self, x):
    return self.head(self.a(nnx.relu(self.b(x))))


def test_refuses_when_names_and_call_order_disagree():
  with pytest.raises(MappingError, match=r'call order pairs Linen a \(Dense\) with NNX b \(Linear\)'):
    _derive(ThreeNamed(), lambda: NNXSwapped(rngs=nnx.Rngs(0)), X)


def test_a_wrapper_pairs_with_the_linen_module_of_its_own_name_before_a_look_alike_called_earlier():
  """HF's Flax llama: a final RMSNorm (one `weight` at its root) kept Linen behind nnx_bridge.from_linen, after a
  wrapped layer collection whose blocks hold norms of the same shape and run first."""
  import nnx_bridge

  class Norm(nn.Module):
    def setup(self):
      self.weight = self.param('weight', lambda _, size: jnp.ones(size), 3)

    def __call__(self, x):
      return self.weight * x

  class Blocks(nn.Module):
    def setup(self):
      self.norm = Norm()
      self.dense = nn.Dense(3)

    def __call__(self, x):
      return self.dense(self.norm(x))

  class LinenModel(nn.Module):
    def setup(self):
      self.layers = Blocks()
      self.norm = Norm()

    def __call__(self, x):
      return self.norm(self.layers(x))

  class Model(nnx.Module):
    def __init__(self, rngs):
      example = jax.ShapeDtypeStruct((2, 3), jnp.float32)
      self.layers = nnx_bridge.from_linen(Blocks(), example, rngs=rngs)
      self.norm = nnx_bridge.from_linen(Norm(), example, rngs=rngs)

    def __call__(self, x):
      return self.norm(self.layers(x))

  x = jnp.ones((2, 3))
  pairs = {('layers',): ('layers',), ('norm',): ('norm',)}  # as a migrate record names them
  mapping = nnx_bridge.derive_mapping(LinenModel(), Model(nnx.Rngs(0)), x, layer_pairs=pairs)
  rules = {tuple(rule.linen[0][1:]): rule.nnx for rule in mapping.rules}
  assert rules[('norm', 'weight')][0] == 'norm' and rules[('layers', 'norm', 'weight')][0] == 'layers'


def test_layers_under_nn_jit_are_traced_on_every_run():
  """`nn.jit` caches on the module's hash: a second trace of an equal module is a cache hit that runs none of its
  calls, and the layers inside would vanish from the trace (a mapping with "no NNX counterpart" for them)."""
  from nnx_bridge.linen_trace import trace_linen

  class Head(nn.Module):

    @nn.jit
    @nn.compact
    def __call__(self, x):
      return nn.Dense(3)(nn.LayerNorm()(x))

  first = trace_linen(Head(), (X,), {})
  second = trace_linen(Head(), (X,), {})
  expected = {('Dense_0',): nn.Dense, ('LayerNorm_0',): nn.LayerNorm}
  assert {p: c for p, c in first.classes.items() if p in expected} == expected
  assert {p: c for p, c in second.classes.items() if p in expected} == expected
