"""L2N002 on sizes read off the input at call time (`d = x.shape[-1]`, `n, _, d = x.shape`, `nn.Dense(x.shape[-1])`,
big_vision's `nn.Dense(self.mlp_dim or 4 * d)`),
chained config aliases, a tiled probe and the carry of a scan over layers: the sizes are derived from the code, the
converted classes match Linen on transferred params (outputs and every gradient: the fixture's parity spec,
tests/codemods/rules/test_fixture_parity.py), and a port whose output projection ignores the input's width is caught."""

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
IMAGES = jax.random.normal(jax.random.key(0), (2, 4, 4, 3))
TOKENS = jax.random.normal(jax.random.key(1), (2, 5, 6))


@pytest.fixture(scope='module')
def linen():
  return runpy.run_path(str(FIXTURES / 'input_size_locals.in.py'))


@pytest.fixture(scope='module')
def ported():
  return runpy.run_path(str(FIXTURES / 'input_size_locals.out.py'))


def test_the_sizes_come_from_the_code(ported):
  """Only the widths of the data are constructor arguments: the encoder's inner layers are sized from its config."""
  import inspect

  encoder = inspect.signature(ported['Encoder'].__init__).parameters
  assert [p for p in encoder if p not in ('self', 'config', 'rngs')] == ['embedding_in_features']
  model = ported['Encoder'](ported['Config'](hidden_size=10), embedding_in_features=3, rngs=nnx.Rngs(0))
  assert model.head.probe.shape == (1, 1, 10)
  assert model.head.mlp.linear2.out_features == 10
  assert model(IMAGES).shape == (2, 1, 10)


def test_a_port_ignoring_the_input_width_is_caught(linen, ported):
  """MlpBlock projects back to the input's width (`d`); a port projecting to mlp_dim instead is refused by name."""
  linen_module = linen['MlpBlock'](12)
  variables = linen_module.init(jax.random.key(0), TOKENS)
  wrong = ported['MlpBlock'](12, linear1_in_features=6, rngs=nnx.Rngs(1))
  wrong.linear2 = nnx.Linear(12, 12, rngs=nnx.Rngs(2))
  with pytest.raises(nnx_bridge.BridgeError, match='linear2'):
    nnx_bridge.compare(linen_module, variables, wrong, TOKENS)


ACT2FN_HEAD = '''import flax.linen as nn
import jax.numpy as jnp
from transformers.modeling_flax_utils import ACT2FN


class FlaxTinyPredictionHeadTransform(nn.Module):
    hidden_size: int = 6
    hidden_act: str = "gelu"
    dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.dense = nn.Dense(self.hidden_size, dtype=self.dtype)
        self.transform_act_fn = ACT2FN[self.hidden_act]
        self.LayerNorm = nn.LayerNorm(epsilon=1e-12, dtype=self.dtype)

    def __call__(self, hidden_states):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.transform_act_fn(hidden_states)
        return self.LayerNorm(hidden_states)
'''


@pytest.mark.parametrize('act, derived', [('ACT2FN[self.hidden_act]', True), ('ACTS[self.hidden_act]', False)])
def test_sizes_flow_through_an_activation_of_transformers_table(act, derived):
  """transformers' `ACT2FN` maps names to elementwise functions: the LayerNorm after it has the Dense's features.
  A dict of the file says nothing the interpreter knows of (it may hold anything): the LayerNorm's size is then an
  argument."""
  from codemods import rules as registry
  from codemods.transform import transform_source

  source = ACT2FN_HEAD.replace('ACT2FN[self.hidden_act]', act).replace(
      'from transformers.modeling_flax_utils import ACT2FN', 'from transformers.modeling_flax_utils import ACT2FN\n\n'
      'ACTS = {"gelu": nn.gelu}')
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert 'class FlaxTinyPredictionHeadTransform(nnx.Module)' in result.source, result.source
  assert ('LayerNorm_num_features' in result.source) is not derived, result.source
  linen_namespace: dict = {}
  namespace: dict = {}
  exec(compile(source, '<linen>', 'exec'), linen_namespace)
  exec(compile(result.source, '<converted>', 'exec'), namespace)
  linen_module = linen_namespace['FlaxTinyPredictionHeadTransform']()
  variables = linen_module.init(jax.random.key(0), TOKENS)
  sizes = {} if derived else {'LayerNorm_num_features': 6}
  model = namespace['FlaxTinyPredictionHeadTransform'](dense_in_features=6, **sizes, rngs=nnx.Rngs(0))
  assert nnx_bridge.compare(linen_module, variables, model, TOKENS).ok


BLOCK_HEAD = '''import flax.linen as nn
import jax.numpy as jnp


class FlaxTinyAttentionOutput(nn.Module):
    hidden_size: int = 6

    def setup(self):
        self.value = nn.Dense(self.hidden_size)
        self.out_proj = nn.Dense(4)

    def __call__(self, hidden_states, use_bias: bool = False):
        value_states = self.value(hidden_states)
        if use_bias:
            if hidden_states.ndim == 3:
                value_states = value_states + 1.0
        attn_output = value_states.reshape(value_states.shape[:2] + (self.hidden_size,))
        return self.out_proj(attn_output)
'''


@pytest.mark.parametrize('assigned, derived', [('value_states', True), ('attn_output', False)])
def test_sizes_are_followed_past_a_block_for_the_names_it_leaves_alone(assigned, derived):
  """A block the walk does not follow (nested ifs) may rebind the names it assigns: those are unknown after it,
  and the others are followed on. `x.reshape(x.shape[:2] + (n,))` (transformers' `_merge_heads`) has last axis n."""
  from codemods import rules as registry
  from codemods.transform import transform_source

  source = BLOCK_HEAD
  if assigned == 'attn_output':  # the block now rebinds the name out_proj reads after it
    source = source.replace('        attn_output = value_states.reshape(', '        attn_output = jnp.concatenate([value_states, value_states], -1)\n'
                            '        if use_bias:\n            if hidden_states.ndim == 3:\n'
                            '                attn_output = value_states.reshape(')
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert 'class FlaxTinyAttentionOutput(nnx.Module)' in result.source, result.source
  assert ('out_proj_in_features' in result.source) is not derived, result.source
  linen_namespace: dict = {}
  namespace: dict = {}
  exec(compile(source, '<linen>', 'exec'), linen_namespace)
  exec(compile(result.source, '<converted>', 'exec'), namespace)
  linen_module = linen_namespace['FlaxTinyAttentionOutput']()
  variables = linen_module.init(jax.random.key(0), TOKENS)
  sizes = {} if derived else {'out_proj_in_features': 12}
  model = namespace['FlaxTinyAttentionOutput'](value_in_features=6, **sizes, rngs=nnx.Rngs(0))
  assert nnx_bridge.compare(linen_module, variables, model, TOKENS).ok


EMBED_THEN_NORM = '''import flax.linen as nn
import jax.numpy as jnp


class Config:
    hidden_size = 6


class FlaxTinyEmbeddings(nn.Module):
    config: Config

    def setup(self):
        embed_dim = self.config.hidden_size
        self.token_embedding = nn.Embed(10, embed_dim)

    def __call__(self, input_ids):
        return self.token_embedding(input_ids)


class FlaxTinyTextModel(nn.Module):
    config: Config

    def setup(self):
        self.embeddings = FlaxTinyEmbeddings(self.config)
        self.final_layer_norm = nn.LayerNorm()

    def __call__(self, input_ids):
        return self.final_layer_norm(self.embeddings(input_ids))
'''


BOUND_IN_ARMS = EMBED_THEN_NORM.replace(
    '        embed_dim = self.config.hidden_size\n',
    '        if self.config.hidden_size > 0:\n            embed_dim = self.config.hidden_size\n'
    '        else:\n            embed_dim = 6\n')

# diffusers' `out_channels = self.in_channels if self.out_channels is None else self.out_channels`: a local named
# like a field, which is no second binding of it
NAMED_LIKE_A_FIELD = EMBED_THEN_NORM.replace(
    '    config: Config\n\n    def setup(self):\n        embed_dim',
    '    config: Config\n    embed_dim: int = None\n\n    def setup(self):\n        embed_dim', 1).replace(
    'embed_dim = self.config.hidden_size\n',
    'embed_dim = self.config.hidden_size if self.embed_dim is None else self.embed_dim\n').replace(
    'FlaxTinyEmbeddings(self.config)', 'FlaxTinyEmbeddings(self.config, embed_dim=2 * self.config.hidden_size)')


@pytest.mark.parametrize('source, norm_size, sizes', [
    (EMBED_THEN_NORM, 'num_features=self.config.hidden_size', {}),
    (BOUND_IN_ARMS, 'num_features=final_layer_norm_num_features', {'final_layer_norm_num_features': 6}),
    (NAMED_LIKE_A_FIELD, 'num_features=(self.config.hidden_size if (2 * self.config.hidden_size) is None else '
                         '(2 * self.config.hidden_size))', {}),
], ids=['bound once', 'bound in the arms of an if', 'named like a field'])
def test_a_child_s_output_size_written_with_its_own_locals_is_in_the_parent_s_terms(source, norm_size, sizes):
  """CLIP's embeddings return `embed_dim` wide, a local their setup() binds once to `self.config.hidden_size`: the
  parent's layer norm takes that code with the parent's config, also when the local shares a field's name. A local
  bound in the arms of an if is not the parent's to name: the layer norm gets a size argument (never code that fails with NameError in __init__)."""
  from codemods import rules as registry
  from codemods.transform import transform_source

  result = transform_source(source, registry.select_rules(['L2N002']))
  assert 'class FlaxTinyTextModel(nnx.Module)' in result.source, result.source
  assert f'self.final_layer_norm = nnx.LayerNorm({norm_size}, rngs=rngs)' in result.source, result.source
  linen_namespace: dict = {}
  namespace: dict = {}
  exec(compile(source, '<linen>', 'exec'), linen_namespace)
  exec(compile(result.source, '<converted>', 'exec'), namespace)
  ids = jax.numpy.array([[1, 2, 3], [4, 5, 6]])
  linen_module = linen_namespace['FlaxTinyTextModel'](linen_namespace['Config']())
  variables = linen_module.init(jax.random.key(0), ids)
  model = namespace['FlaxTinyTextModel'](namespace['Config'](), **sizes, rngs=nnx.Rngs(0))
  assert nnx_bridge.compare(linen_module, variables, model, ids).ok


# In the style of transformers' GPT-Neo: the MLP's output width is a local of its setup(), the block returns
# `(hidden_states,) + outputs[1:]`, and the collection loops over the blocks.
GPT_NEO_STYLE = '''import flax.linen as nn
import jax.numpy as jnp


class Config:
  def __init__(self, hidden_size=8, intermediate_size=16, num_layers=2):
    self.hidden_size = hidden_size
    self.intermediate_size = intermediate_size
    self.num_layers = num_layers


class FlaxMLP(nn.Module):
  config: Config
  intermediate_size: int

  def setup(self):
    embed_dim = self.config.hidden_size
    self.c_fc = nn.Dense(self.intermediate_size)
    self.c_proj = nn.Dense(embed_dim)

  def __call__(self, hidden_states):
    return self.c_proj(nn.gelu(self.c_fc(hidden_states)))


class FlaxBlock(nn.Module):
  config: Config

  def setup(self):
    self.ln_1 = nn.LayerNorm()
    self.mlp = FlaxMLP(self.config, self.config.intermediate_size)

  def __call__(self, hidden_states, output_attentions: bool = False):
    outputs = (hidden_states,) if output_attentions else ()
    residual = hidden_states
    hidden_states = residual + self.mlp(self.ln_1(hidden_states))
    return (hidden_states,) + outputs


class FlaxBlockCollection(nn.Module):
  config: Config

  def setup(self):
    self.blocks = [FlaxBlock(self.config, name=str(i)) for i in range(self.config.num_layers)]

  def __call__(self, hidden_states):
    for block in self.blocks:
      hidden_states = block(hidden_states)[0]
    return hidden_states
'''


def _collection_matches_linen(source: str, name: str, later_size: str) -> None:
  """Converts `source` with no TODO, the layers after the first sized `later_size` in the port, and compares the
  collection `name` with its Linen original (the first layer's sizes given as 8)."""
  import inspect

  from codemods import rules as registry
  from codemods.transform import transform_source

  result = transform_source(source, registry.select_rules(['L2N002']))
  assert not [e for e in result.entries if e.kind == 'todo'], result.source
  assert f'if i == 0 else {later_size}' in result.source, result.source
  linen_ns, nnx_ns = {}, {}
  exec(compile(source, 'linen', 'exec'), linen_ns)
  exec(compile(result.source, 'nnx', 'exec'), nnx_ns)
  x = jax.random.normal(jax.random.key(0), (2, 3, 8))
  module = linen_ns[name](linen_ns['Config']())
  variables = module.init(jax.random.key(1), x)
  sizes = {p: 8 for p in inspect.signature(nnx_ns[name].__init__).parameters if p.endswith('_features')}
  report = nnx_bridge.compare(module, variables, nnx_ns[name](nnx_ns['Config'](), **sizes, rngs=nnx.Rngs(0)), x)
  assert report.ok, report.to_text()


def test_a_width_bound_to_a_setup_local_sizes_the_blocks_after_the_first():
  """The MLP's output width `embed_dim` is `self.config.hidden_size` bound in its setup(), and the block's output is
  the first element of `(hidden_states,) + outputs`: every block after the first takes the config's width."""
  _collection_matches_linen(GPT_NEO_STYLE, 'FlaxBlockCollection', 'self.config.hidden_size')


# In the style of transformers' OPT: the attention's output is unpacked from a tuple, and the feed-forward runs on
# the tokens flattened, then reshaped back to a shape saved before.
OPT_STYLE = '''import flax.linen as nn
import jax.numpy as jnp


class Config:
  def __init__(self, hidden_size=8, ffn_dim=16, num_layers=2):
    self.hidden_size = hidden_size
    self.ffn_dim = ffn_dim
    self.num_layers = num_layers


class FlaxAttention(nn.Module):
  embed_dim: int

  def setup(self):
    self.q_proj = nn.Dense(self.embed_dim)
    self.out_proj = nn.Dense(self.embed_dim)

  def __call__(self, hidden_states):
    weights = nn.softmax(self.q_proj(hidden_states), axis=-1)
    return self.out_proj(weights * hidden_states), weights


class FlaxDecoderLayer(nn.Module):
  config: Config

  def setup(self):
    self.embed_dim = self.config.hidden_size
    self.self_attn = FlaxAttention(self.embed_dim)
    self.fc1 = nn.Dense(self.config.ffn_dim)
    self.fc2 = nn.Dense(self.embed_dim)

  def __call__(self, hidden_states):
    residual = hidden_states
    hidden_states, self_attn_weights = self.self_attn(hidden_states)
    hidden_states = residual + hidden_states
    hidden_states_shape = hidden_states.shape
    hidden_states = hidden_states.reshape(-1, hidden_states.shape[-1])
    residual = hidden_states
    hidden_states = self.fc2(nn.relu(self.fc1(hidden_states)))
    hidden_states = (residual + hidden_states).reshape(hidden_states_shape)
    return (hidden_states, self_attn_weights)


class FlaxDecoderLayerCollection(nn.Module):
  config: Config

  def setup(self):
    self.layers = [FlaxDecoderLayer(self.config, name=str(i)) for i in range(self.config.num_layers)]

  def __call__(self, hidden_states):
    for decoder_layer in self.layers:
      layer_outputs = decoder_layer(hidden_states)
      hidden_states = layer_outputs[0]
    return hidden_states
'''


def test_a_tuple_unpacked_output_and_a_saved_shape_size_the_layers_after_the_first():
  """`hidden_states, weights = self.self_attn(...)` takes the tuple's first size, and `.reshape(shape)` after
  `shape = hidden_states.shape` the size hidden_states had then: every layer after the first takes the config's."""
  _collection_matches_linen(OPT_STYLE, 'FlaxDecoderLayerCollection', 'self.config.hidden_size')


CONV1D = '''import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax


class FlaxTinyConv1D(nn.Module):
    features: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, inputs):
        inputs = jnp.asarray(inputs, self.dtype)
        kernel = self.param("kernel", jax.nn.initializers.normal(stddev=0.02), (self.features, inputs.shape[-1]))
        kernel = jnp.asarray(kernel.transpose(), self.dtype)
        return lax.dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())))


class FlaxTinyMLP(nn.Module):
    hidden_size: int = 6

    def setup(self):
        self.c_fc = FlaxTinyConv1D(4 * self.hidden_size)
        self.ln = nn.LayerNorm()

    def __call__(self, hidden_states):
        hidden_states = self.ln(hidden_states.astype(jnp.float32))
        return self.c_fc(hidden_states)
'''


@pytest.mark.parametrize('cast, derived', [('jnp.asarray(inputs, self.dtype)', True), ('jnp.tanh(inputs)', True),
                                           ('jnp.cumsum(inputs)', False)])
def test_sizes_flow_through_dtype_casts(cast, derived):
  """transformers' GPT-2 `FlaxConv1D` casts its input (`inputs = jnp.asarray(inputs, self.dtype)`) before reading
  `inputs.shape[-1]` for its kernel, and callers cast with `.astype`: a cast keeps the shape, so the kernel's input
  size is the call argument's, and the MLP's children are sized from its own input. A function the walk does not
  know (a flattening `cumsum`) leaves the size a constructor argument."""
  from codemods import rules as registry
  from codemods.transform import transform_source

  source = CONV1D.replace('inputs = jnp.asarray(inputs, self.dtype)', f'inputs = {cast}')
  result = transform_source(source, registry.select_rules(['L2N002']))
  records = {c.linen_name: c for c in result.classes}
  assert set(records) == {'FlaxTinyConv1D', 'FlaxTinyMLP'}, result.source
  kernel = next(a for a in records['FlaxTinyConv1D'].arguments if a.name == 'kernel_features')
  assert (kernel.origin, kernel.input) == (('input_dimension', 'inputs') if derived else ('undetermined', None))
  namespace: dict = {}
  exec(compile(result.source, '<converted>', 'exec'), namespace)
  if not derived:
    return
  linen_namespace: dict = {}
  exec(compile(source, '<linen>', 'exec'), linen_namespace)
  linen_module = linen_namespace['FlaxTinyMLP']()
  variables = jax.tree.map(lambda v: v + 0.5, linen_module.init(jax.random.key(0), TOKENS))
  model = namespace['FlaxTinyMLP'](**{a.name: 6 for a in records['FlaxTinyMLP'].arguments
                                      if a.origin == 'input_dimension'}, rngs=nnx.Rngs(0))
  assert nnx_bridge.compare(linen_module, variables, model, TOKENS).ok


def test_a_local_of_the_input_s_last_axis_sizes_a_layer_but_one_of_another_axis_keeps_the_class_linen():
  """flax's wmt `actual_out_dim = inputs.shape[-1] if self.out_dim is None else self.out_dim` moves to __init__ with
  the input size (fixtures/L2N002/local_input_size.*, with parity); a local reading another axis of the input
  (`inputs.shape[1]`, the length) is what only the call knows."""
  source = (FIXTURES / 'local_input_size.in.py').read_text()
  rules = registry.select_rules(['L2N002'])
  new = transform_source(source, rules).source
  assert 'out_features=(linear1_in_features if self.out_dim is None else self.out_dim)' in new
  other_axis = source.replace('actual_out_dim = inputs.shape[-1] if', 'actual_out_dim = inputs.shape[1] if')
  assert other_axis != source
  todos = [e.message for e in transform_source(other_axis, rules).entries if e.kind == 'todo']
  assert any('class MlpBlock left as Linen: a constructor argument uses the local actual_out_dim, whose value reads '
             'inputs, which only the call knows' in m for m in todos), todos


def test_a_local_computed_from_the_input_width_moves_to_init_with_the_size():
  """jax-md's `bound = 1.0 / math.sqrt(in_features)`: in NNX the width is a constructor argument and the initializer
  draws within the bound of that width (here 1 / sqrt(100)); a local reading the input's values stays in the call,
  and its class Linen."""
  namespace = runpy.run_path(str(FIXTURES / 'size_local_values.out.py'))
  layer = namespace['SO3Linear'](out_features=50, lmax=1, weight_features=100, rngs=nnx.Rngs(0))
  spread = float(jnp.abs(layer.weight[...]).max())
  assert 0.05 < spread <= 0.1
  source = (FIXTURES / 'size_local_values.in.py').read_text().replace(
      'bound = 1.0 / math.sqrt(in_features)', 'bound = 1.0 / math.sqrt(input_embedding.sum())')
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert any('a constructor argument uses the local bound, whose value reads input_embedding' in e.message
             for e in result.entries if e.kind == 'todo')
