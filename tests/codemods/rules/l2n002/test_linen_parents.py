"""A class left as Linen that builds a class the file converts: the construction becomes nnx_bridge.to_linen, and the
Linen class runs as before on its own variables (same paths, shapes, outputs and gradients), so its checkpoints
still load; where it would not, the built class stays Linen with the reason. A second run changes nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from codemods import rules as registry
from codemods import transform
from codemods.transform import transform_source
from tests.codemods.rules import test_fixture_parity as fixture_parity
from tests.codemods.rules.l2n002.test_decide import WMT_STYLE

# In the layout of transformers' modeling_flax_bert.py: the attention stays Linen (its decode cache lives in a helper
# method), the output block it builds is converted.
HF_ATTENTION = '''import flax.linen as nn
import jax
import jax.numpy as jnp


class TinyConfig:
  hidden_size = 8
  layer_norm_eps = 1e-12
  hidden_dropout_prob = 0.1


class FlaxTinySelfOutput(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.dense = nn.Dense(self.config.hidden_size, kernel_init=jax.nn.initializers.normal(0.02), dtype=self.dtype)
    self.LayerNorm = nn.LayerNorm(epsilon=self.config.layer_norm_eps, dtype=self.dtype)
    self.dropout = nn.Dropout(rate=self.config.hidden_dropout_prob)

  def __call__(self, hidden_states, input_tensor, deterministic: bool = True):
    hidden_states = self.dense(hidden_states)
    hidden_states = self.dropout(hidden_states, deterministic=deterministic)
    hidden_states = self.LayerNorm(hidden_states + input_tensor)
    return hidden_states


class FlaxTinyAttention(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.query = nn.Dense(self.config.hidden_size, dtype=self.dtype)
    self.output = FlaxTinySelfOutput(self.config, dtype=self.dtype)

  @nn.compact
  def _concatenate_to_cache(self, key):
    is_initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    if is_initialized:
      cached_key.value = key
    return key

  def __call__(self, hidden_states, init_cache=False, deterministic: bool = True):
    query = self.query(hidden_states)
    if self.has_variable("cache", "cached_key") or init_cache:
      query = self._concatenate_to_cache(query)
    return self.output(query, hidden_states, deterministic=deterministic)


class FlaxTinyPreTrainedModel:
  module_class = FlaxTinyAttention  # held for transformers' init / apply: FlaxTinyAttention stays Linen
'''

HIDDEN = jax.random.normal(jax.random.key(1), (2, 3, 8))
TOKENS = jnp.array([[1, 2, 3], [4, 5, 6]])


def _module(source: str) -> dict:
  namespace: dict = {}
  exec(compile(source, 'models.py', 'exec'), namespace)
  return namespace


def _migrate(source: str) -> tuple[str, list[str]]:
  result = transform_source(source, registry.ALL_RULES)
  return result.source, [f'{e.line}:{e.column} {e.kind}: {e.message}' for e in result.entries]


def _layout(tree):
  return jax.tree.map(lambda leaf: (leaf.shape, leaf.dtype), tree)


def _same_model(original, bridged, *args, **kwargs) -> None:
  """`bridged` creates `original`'s variables and, on `original`'s own variables, gives its outputs and gradients."""
  variables = original.init(jax.random.key(0), *args, **kwargs)
  assert _layout(bridged.init(jax.random.key(0), *args, **kwargs)) == _layout(variables)
  np.testing.assert_allclose(bridged.apply(variables, *args, **kwargs), original.apply(variables, *args, **kwargs),
                             rtol=1e-6, atol=1e-6)
  grads = [jax.grad(lambda p, m=m: m.apply({**variables, 'params': p}, *args, **kwargs).sum())(variables['params'])
           for m in (original, bridged)]
  assert jax.tree.structure(grads[0]) == jax.tree.structure(grads[1])
  for expected, actual in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_a_linen_attention_builds_its_converted_output_through_to_linen_and_runs_on_its_own_variables():
  new, entries = _migrate(HF_ATTENTION)
  assert 'class FlaxTinySelfOutput(nnx.Module):' in new and 'class FlaxTinyAttention(nn.Module):' in new
  assert ("self.output = nnx_bridge.to_linen(FlaxTinySelfOutput, self.config, dtype=self.dtype, "
          "input_sizes={'dense_in_features': 'hidden_states'})") in new
  assert any('FlaxTinySelfOutput, converted to NNX, is built by FlaxTinyAttention, which stays Linen: wrapped with '
             'nnx_bridge.to_linen' in e for e in entries)
  original, bridged = (_module(s)['FlaxTinyAttention'](_module(s)['TinyConfig']()) for s in (HF_ATTENTION, new))
  _same_model(original, bridged, HIDDEN)
  # the decode cache of the Linen class still works around the bridge
  cached = bridged.init(jax.random.key(0), HIDDEN, init_cache=True)
  _, updates = bridged.apply(cached, HIDDEN, mutable=['cache'])
  assert set(cached) == {'params', 'cache'} and set(updates) == {'cache'}
  variables = bridged.init(jax.random.key(0), HIDDEN)
  # train mode: the converted block's dropout draws from Linen's 'dropout' rng, and needs it, as Linen's did
  train = bridged.apply(variables, HIDDEN, deterministic=False, rngs={'dropout': jax.random.key(2)})
  assert not np.allclose(train, bridged.apply(variables, HIDDEN))
  with pytest.raises(Exception, match='dropout'):
    bridged.apply(variables, HIDDEN, deterministic=False)
  # without the bridge, the Linen attention builds the NNX block the Linen way and cannot even be initialised
  unbridged = new.replace("nnx_bridge.to_linen(FlaxTinySelfOutput, self.config, dtype=self.dtype, "
                          "input_sizes={'dense_in_features': 'hidden_states'})",
                          'FlaxTinySelfOutput(self.config, dtype=self.dtype)')
  assert unbridged != new
  broken = _module(unbridged)['FlaxTinyAttention'](_module(unbridged)['TinyConfig']())
  with pytest.raises(TypeError):
    broken.init(jax.random.key(0), HIDDEN)


def test_compact_children_keep_their_linen_names_under_the_bridge():
  """flax's wmt Encoder1DBlock, built with name= in a Linen encoder: its NNX attributes are stored under LayerNorm_0
  and Dense_0, so the encoder's variables (and checkpoints) are those of the Linen original."""
  new, _ = _migrate(WMT_STYLE)
  assert "linen_names={'layer_norm': 'LayerNorm_0', 'linear': 'Dense_0'}" in new
  original, bridged = (_module(s)['Encoder'](_module(s)['EncoderConfig']()) for s in (WMT_STYLE, new))
  _same_model(original, bridged, TOKENS)


# transformers' layer collection (`self.layers = [FlaxBertLayer(config, name=str(i)) ...]`), converted to an nnx.List,
# built by an encoder that stays Linen (it reads self.variables).
HF_LAYER_COLLECTION = '''import flax.linen as nn
import jax.numpy as jnp


class TinyConfig:
  hidden_size = 8
  num_hidden_layers = 2


class FlaxTinyLayer(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.dense = nn.Dense(self.config.hidden_size, dtype=self.dtype)
    self.LayerNorm = nn.LayerNorm(dtype=self.dtype)

  def __call__(self, hidden_states, deterministic: bool = True):
    return self.LayerNorm(nn.gelu(self.dense(hidden_states)))


class FlaxTinyLayerCollection(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.layers = [
        FlaxTinyLayer(self.config, name=str(i), dtype=self.dtype) for i in range(self.config.num_hidden_layers)
    ]

  def __call__(self, hidden_states, deterministic: bool = True):
    for i, layer in enumerate(self.layers):
      hidden_states = layer(hidden_states, deterministic=deterministic)
    return hidden_states


class FlaxTinyEncoder(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.layer = FlaxTinyLayerCollection(self.config, dtype=self.dtype)

  def __call__(self, hidden_states, deterministic: bool = True):
    if self.has_variable("cache", "cached_key"):
      hidden_states = hidden_states + self.variables["cache"]["cached_key"]
    return self.layer(hidden_states, deterministic=deterministic)
'''


def test_a_layer_list_keeps_linen_s_element_names_under_the_bridge():
  new, _ = _migrate(HF_LAYER_COLLECTION)
  assert "linen_names={'layers': '{}'}" in new
  original, bridged = (_module(s)['FlaxTinyEncoder'](_module(s)['TinyConfig']()) for s in (HF_LAYER_COLLECTION, new))
  _same_model(original, bridged, HIDDEN)


# transformers' model wrappers: `module_class = FlaxTinyForClassificationModule`, which the PreTrainedModel builds with
# (config, dtype) and runs with .init / .apply. The held head stays Linen; the pooler it builds is converted.
HF_MODEL_WRAPPER = '''import flax.linen as nn
import jax.numpy as jnp


class TinyConfig:
  hidden_size = 8
  num_labels = 3
  vocab_size = 16


class FlaxTinyPooler(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.dense = nn.Dense(self.config.hidden_size, dtype=self.dtype)

  def __call__(self, hidden_states):
    return nn.tanh(self.dense(hidden_states)[:, 0])


class FlaxTinyForClassificationModule(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.embeddings = nn.Embed(self.config.vocab_size, self.config.hidden_size, dtype=self.dtype)
    self.pooler = FlaxTinyPooler(self.config, dtype=self.dtype)
    self.classifier = nn.Dense(self.config.num_labels, dtype=self.dtype)

  def __call__(self, input_ids, deterministic: bool = True):
    return self.classifier(self.pooler(self.embeddings(input_ids)))


class FlaxTinyPreTrainedModel:
  module_class: nn.Module = None

  def __init__(self, config: TinyConfig, dtype: jnp.dtype = jnp.float32):
    self.module = self.module_class(config=config, dtype=dtype)

  def init_weights(self, rng, input_ids):
    return self.module.init(rng, input_ids)["params"]

  def __call__(self, params, input_ids):
    return self.module.apply({"params": params}, input_ids)


class FlaxTinyForClassification(FlaxTinyPreTrainedModel):
  module_class = FlaxTinyForClassificationModule
'''


def test_a_module_class_a_wrapper_holds_stays_linen_and_the_wrapper_runs_as_before():
  new, entries = _migrate(HF_MODEL_WRAPPER)
  assert 'class FlaxTinyForClassificationModule(nn.Module):' in new and 'class FlaxTinyPooler(nnx.Module):' in new
  assert any('class FlaxTinyForClassificationModule kept as Linen: the class FlaxTinyForClassification, which is no '
             'module, holds it in a class attribute (FlaxTinyForClassification.module_class)' in e for e in entries)
  original, migrated = (_module(s)['FlaxTinyForClassification'](_module(s)['TinyConfig']())
                        for s in (HF_MODEL_WRAPPER, new))
  params = original.init_weights(jax.random.key(0), TOKENS)
  assert _layout(migrated.init_weights(jax.random.key(0), TOKENS)) == _layout(params)
  np.testing.assert_allclose(migrated(params, TOKENS), original(params, TOKENS), rtol=1e-6, atol=1e-6)
  # without the holder, the head converts: the holder is what keeps it Linen
  alone, _ = _migrate(HF_MODEL_WRAPPER.replace('  module_class = FlaxTinyForClassificationModule\n', '  pass\n'))
  assert 'class FlaxTinyForClassificationModule(nnx.Module):' in alone


@pytest.mark.parametrize('source', [HF_ATTENTION, WMT_STYLE, HF_LAYER_COLLECTION, HF_MODEL_WRAPPER],
                         ids=['setup', 'compact', 'list', 'wrapper'])
def test_a_second_run_changes_nothing(source):
  new, _ = _migrate(source)
  again, _ = _migrate(new)
  assert again == new


def _kept(source: str, reason: str) -> None:
  """FlaxTinySelfOutput stays Linen, with `reason` in its TODO, and the program runs as before."""
  new, entries = _migrate(source)
  assert 'import nnx_bridge' not in new and 'to_linen(' not in new and 'class FlaxTinySelfOutput(nn.Module):' in new
  todo = next(e for e in entries if 'class FlaxTinySelfOutput kept as Linen' in e)
  assert reason in todo, todo
  outputs = [_module(s)['FlaxTinyAttention'](_module(s)['TinyConfig']()) for s in (source, new)]
  variables = outputs[0].init(jax.random.key(0), HIDDEN)
  np.testing.assert_array_equal(outputs[1].apply(variables, HIDDEN), outputs[0].apply(variables, HIDDEN))


@pytest.mark.parametrize('old, new, reason', [
    ('self.output(query, hidden_states, deterministic=deterministic)', 'self.output(query, hidden_states, deterministic)',
     'a call of FlaxTinySelfOutput passes its train/eval argument by position'),
    ('    return self.output(query, hidden_states, deterministic=deterministic)',
     '    self.output.sow("intermediates", "seen", query)\n'
     '    return self.output(query, hidden_states, deterministic=deterministic)',
     'self.output.sow (FlaxTinySelfOutput) is called or assigned to through the bridge'),
    ('    self.output = FlaxTinySelfOutput(self.config, dtype=self.dtype)',
     '    output_class = FlaxTinySelfOutput\n    self.output = output_class(self.config, dtype=self.dtype)',
     'it uses FlaxTinySelfOutput other than by building it'),
], ids=['mode-by-position', 'other-use', 'class-as-value'])
def test_a_construction_no_bridge_can_keep_running_keeps_the_class_linen(old, new, reason):
  assert old in HF_ATTENTION
  _kept(HF_ATTENTION.replace(old, new), reason)


MERGED_HEADS = HF_ATTENTION.replace(  # the output block's dense is fed the heads merged back: no argument shows its size
    '    hidden_states = self.dense(hidden_states)\n',
    '    hidden_states = self.dense(hidden_states.reshape(hidden_states.shape[:2] + (-1,)))\n').replace(
    'return self.output(query, hidden_states,', 'return self.output(query.reshape(query.shape[:2] + (2, 4)), hidden_states,')


@pytest.mark.parametrize('source, sizes', [
    (MERGED_HEADS, "traced_sizes=('dense_in_features',)"),
    (HF_ATTENTION.replace('def __call__(self, hidden_states, input_tensor, deterministic',
                          'def __call__(self, hidden_states=None, input_tensor=None, deterministic'),
     "traced_sizes=('dense_in_features',)"),
], ids=['computed-input', 'optional-input'])
def test_sizes_no_required_argument_shows_are_found_by_the_bridge_from_a_run_of_the_call(source, sizes):
  assert source != HF_ATTENTION
  new, _ = _migrate(source)
  assert f'self.output = nnx_bridge.to_linen(FlaxTinySelfOutput, self.config, dtype=self.dtype, {sizes})' in new
  original, bridged = (_module(s)['FlaxTinyAttention'](_module(s)['TinyConfig']()) for s in (source, new))
  _same_model(original, bridged, HIDDEN)
  np.testing.assert_allclose(jax.jit(bridged.apply)(original.init(jax.random.key(0), HIDDEN), HIDDEN),
                             original.apply(original.init(jax.random.key(0), HIDDEN), HIDDEN), rtol=1e-6, atol=1e-6)


def test_a_size_only_a_variable_of_the_class_takes_keeps_the_class_linen():
  """A `self.param` shaped by a computed value: no table layer's size, so no run of the bridge can find it."""
  start, end = HF_ATTENTION.index('class FlaxTinySelfOutput'), HF_ATTENTION.index('class FlaxTinyAttention')
  source = HF_ATTENTION[:start] + """class FlaxTinySelfOutput(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, hidden_states, input_tensor, deterministic: bool = True):
    merged = hidden_states.reshape(hidden_states.shape[:2] + (-1,))
    gain = self.param('gain', nn.initializers.ones, (merged.shape[-1],))
    return nn.Dense(self.config.hidden_size)(merged * gain) + input_tensor


""" + HF_ATTENTION[end:].replace('return self.output(query, hidden_states,',
                                'return self.output(query.reshape(query.shape[:2] + (2, 4)), hidden_states,')
  _kept(source, 'its NNX __init__ needs gain_features, which no argument of its call shows')


def test_an_array_the_converted_init_computes_is_recomputed_by_the_bridge():
  """`self.scale = jnp.sqrt(...)` in setup(): a constant of the NNX __init__, which no Linen collection holds."""
  source = HF_ATTENTION.replace(
      '    self.dropout = nn.Dropout(rate=self.config.hidden_dropout_prob)\n',
      '    self.dropout = nn.Dropout(rate=self.config.hidden_dropout_prob)\n'
      '    self.scale = jnp.sqrt(jnp.asarray(self.config.hidden_size, jnp.float32))\n').replace(
      '    hidden_states = self.dense(hidden_states)\n', '    hidden_states = self.dense(hidden_states) / self.scale\n')
  new, _ = _migrate(source)
  assert 'nnx_bridge.to_linen(FlaxTinySelfOutput' in new
  original, bridged = (_module(s)['FlaxTinyAttention'](_module(s)['TinyConfig']()) for s in (source, new))
  _same_model(original, bridged, HIDDEN)


# As transformers' modeling_flax_wav2vec2.py: the collection stays Linen because it calls its layers with a
# train/eval argument computed from the data, which no switch of a converted layer takes; with the layers bridged,
# which take it as written, a second run would find another blocker there.
WAV2VEC2_STYLE = '''import flax.linen as nn
import jax.numpy as jnp


class TinyConfig:
  conv_dim = (4, 6)
  conv_kernel = (3, 3)
  num_feat_extract_layers = 2


class FlaxLayerNormConvLayer(nn.Module):
  config: TinyConfig
  layer_id: int = 0
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.conv = nn.Conv(features=self.config.conv_dim[self.layer_id],
                        kernel_size=(self.config.conv_kernel[self.layer_id],), padding="VALID", dtype=self.dtype)
    self.layer_norm = nn.LayerNorm(dtype=self.dtype)
    self.dropout = nn.Dropout(0.1)

  def __call__(self, hidden_states, deterministic: bool = True):
    return self.dropout(nn.gelu(self.layer_norm(self.conv(hidden_states))), deterministic=deterministic)


class FlaxConvLayersCollection(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.layers = [
        FlaxLayerNormConvLayer(self.config, layer_id=i, name=str(i), dtype=self.dtype)
        for i in range(self.config.num_feat_extract_layers)
    ]

  def __call__(self, hidden_states):
    for conv_layer in self.layers:
      hidden_states = conv_layer(hidden_states, deterministic=hidden_states.ndim < 4) * 2
    return hidden_states
'''


def test_bridges_a_second_run_would_undo_are_not_made():
  new, entries = _migrate(WAV2VEC2_STYLE)
  assert 'to_linen(' not in new
  assert any('class FlaxLayerNormConvLayer kept as Linen: the class FlaxConvLayersCollection, left as Linen, uses '
             'it, and cannot wrap it with nnx_bridge.to_linen: with it a second run would find another reason to keep '
             'FlaxConvLayersCollection Linen' in e for e in entries)
  assert _migrate(new)[0] == new


def test_without_the_second_run_check_the_bridged_file_changes_again(monkeypatch):
  """What the check in transform_source prevents: the bridged collection gets a new TODO on the next run."""
  monkeypatch.setattr(transform, '_changed_classes', lambda first, second: frozenset())
  new, _ = _migrate(WAV2VEC2_STYLE)
  assert 'nnx_bridge.to_linen(FlaxLayerNormConvLayer' in new
  assert _migrate(new)[0] != new


def test_a_linen_class_converted_later_keeps_its_to_linen_child_wrapped_and_drops_its_switch():
  """A Linen parent an earlier run bridged, converted on a later run (its holder was removed): the to_linen child's
  call parameters are its NNX class's, and the switch it was given goes to model.train() / model.eval()."""
  source = '''import flax.linen as nn
import nnx_bridge
from flax import nnx


class Block(nnx.Module):
  def __init__(self, *, linear_in_features: int, rngs: nnx.Rngs):
    self.linear = nnx.Linear(linear_in_features, 4, rngs=rngs)
    self.dropout = nnx.Dropout(0.1, rngs=rngs)

  def __call__(self, x):
    return self.dropout(self.linear(x))


class Tower(nn.Module):
  def setup(self):
    self.block = nnx_bridge.to_linen(Block, input_sizes={'linear_in_features': 'x'})

  def __call__(self, x, deterministic: bool = True):
    return self.block(x, deterministic=deterministic)
'''
  new, entries = _migrate(source)
  assert 'class Tower(nnx.Module):' in new and not any('converter failed' in e for e in entries)
  assert 'return self.block(x)\n' in new
  tower = _module(new)['Tower'](block_example_inputs=(jnp.ones((1, 3)),), rngs=nnx.Rngs(0))
  assert tower(jnp.ones((2, 3))).shape == (2, 4)


# As transformers' modeling_flax_bert.py: the masked-LM module stays Linen (a wrapper holds it), its head ties the
# decoder to the word embeddings when the config says so, and is converted.
HF_MASKED_LM = '''from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


class TinyConfig:
  vocab_size = 11
  hidden_size = 8
  layer_norm_eps = 1e-12

  def __init__(self, tie_word_embeddings=True):
    self.tie_word_embeddings = tie_word_embeddings


class FlaxTinyPredictionHeadTransform(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.dense = nn.Dense(self.config.hidden_size, dtype=self.dtype)
    self.LayerNorm = nn.LayerNorm(epsilon=self.config.layer_norm_eps, dtype=self.dtype)

  def __call__(self, hidden_states):
    hidden_states = self.dense(hidden_states)
    hidden_states = nn.gelu(hidden_states)
    return self.LayerNorm(hidden_states)


class FlaxTinyLMPredictionHead(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32
  bias_init: Callable[..., jnp.ndarray] = jax.nn.initializers.zeros

  def setup(self):
    self.transform = FlaxTinyPredictionHeadTransform(self.config, dtype=self.dtype)
    self.decoder = nn.Dense(self.config.vocab_size, dtype=self.dtype, use_bias=False)
    self.bias = self.param("bias", self.bias_init, (self.config.vocab_size,))

  def __call__(self, hidden_states, shared_embedding=None):
    hidden_states = self.transform(hidden_states)
    if shared_embedding is not None:
      hidden_states = self.decoder.apply({"params": {"kernel": shared_embedding.T}}, hidden_states)
    else:
      hidden_states = self.decoder(hidden_states)
    bias = jnp.asarray(self.bias, self.dtype)
    return hidden_states + bias


class FlaxTinyOnlyMLMHead(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.predictions = FlaxTinyLMPredictionHead(self.config, dtype=self.dtype)

  def __call__(self, hidden_states, shared_embedding=None):
    return self.predictions(hidden_states, shared_embedding=shared_embedding)


class FlaxTinyForMaskedLMModule(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.embeddings = nn.Embed(self.config.vocab_size, self.config.hidden_size, dtype=self.dtype)
    self.cls = FlaxTinyOnlyMLMHead(config=self.config, dtype=self.dtype)

  def __call__(self, input_ids):
    hidden_states = self.embeddings(input_ids)
    if self.config.tie_word_embeddings:
      shared_embedding = self.embeddings.variables["params"]["embedding"]
    else:
      shared_embedding = None
    return self.cls(hidden_states, shared_embedding=shared_embedding)


class FlaxTinyForMaskedLM:
  module_class = FlaxTinyForMaskedLMModule
'''


@pytest.mark.parametrize('tie', [True, False])
def test_a_linen_parent_passes_the_tie_flag_its_config_decides_and_runs_on_its_own_variables(tie):
  new, entries = _migrate(HF_MASKED_LM)
  assert 'class FlaxTinyOnlyMLMHead(nnx.Module):' in new and 'class FlaxTinyForMaskedLMModule(nn.Module):' in new
  assert ('self.cls = nnx_bridge.to_linen(FlaxTinyOnlyMLMHead, config=self.config, dtype=self.dtype, '
          'tied_decoder=self.config.tie_word_embeddings, ') in new, new
  original, bridged = (_module(s)['FlaxTinyForMaskedLMModule'](_module(s)['TinyConfig'](tie)) for s in (HF_MASKED_LM, new))
  variables = original.init(jax.random.key(0), TOKENS)
  assert ('decoder' in variables['params']['cls']['predictions']) is not tie
  _same_model(original, bridged, TOKENS)
  # a bridge that ignored the config creates a decoder Linen does not (other variables), or lacks the one it runs
  wrong = new.replace('tied_decoder=self.config.tie_word_embeddings', f'tied_decoder={not tie}')
  assert wrong != new
  broken = _module(wrong)['FlaxTinyForMaskedLMModule'](_module(wrong)['TinyConfig'](tie))
  with pytest.raises(AssertionError if tie else TypeError):
    _same_model(original, broken, TOKENS)


def test_a_tie_the_construction_cannot_decide_keeps_the_head_linen():
  """The embedding is passed under a test on a call argument: whether Linen creates the decoder is decided per
  call, which no constructor flag can say."""
  source = HF_MASKED_LM.replace('def __call__(self, input_ids):', 'def __call__(self, input_ids, tie=True):') \
      .replace('if self.config.tie_word_embeddings:\n      shared_embedding', 'if tie:\n      shared_embedding')
  new, entries = _migrate(source)
  assert 'class FlaxTinyOnlyMLMHead(nn.Module):' in new and 'to_linen(FlaxTinyOnlyMLMHead' not in new
  todo = next(e for e in entries if 'class FlaxTinyOnlyMLMHead kept as Linen' in e)
  assert 'pass shared_embedding under conditions a construction cannot evaluate' in todo, todo
  original, migrated = (_module(s)['FlaxTinyForMaskedLMModule'](_module(s)['TinyConfig']()) for s in (source, new))
  variables = original.init(jax.random.key(0), TOKENS)
  np.testing.assert_array_equal(migrated.apply(variables, TOKENS), original.apply(variables, TOKENS))


# In the layout of transformers' modeling_flax_regnet.py: the layer stays Linen (a wrapper holds it), the shortcut and
# the identity it picks between by a conditional expression are converted.
REGNET_STYLE = '''import flax.linen as nn
import jax.numpy as jnp


class Identity(nn.Module):
    def __call__(self, x, **kwargs):
        return x


class FlaxTinyShortCut(nn.Module):
    out_channels: int

    def setup(self):
        self.convolution = nn.Conv(self.out_channels, kernel_size=(1, 1), use_bias=False)

    def __call__(self, x):
        return self.convolution(x)


class FlaxTinyLayer(nn.Module):
    in_channels: int
    out_channels: int

    def setup(self):
        should_apply_shortcut = self.in_channels != self.out_channels
        self.shortcut = FlaxTinyShortCut(self.out_channels) if should_apply_shortcut else Identity()
        self.conv = nn.Conv(self.out_channels, kernel_size=(3, 3))

    def __call__(self, hidden_state):
        return nn.relu(self.conv(hidden_state) + self.shortcut(hidden_state))


class FlaxTinyPreTrainedModel:
    module_class = FlaxTinyLayer  # held for transformers' init / apply: FlaxTinyLayer stays Linen
'''


@pytest.mark.parametrize('out_channels', [3, 5])
def test_classes_a_linen_class_builds_inside_a_conditional_expression_are_bridged_there(out_channels):
  """The Linen layer stays so; the classes it picks between convert and are built through to_linen where they were,
  and a second run, reading `nnx_bridge.to_linen(Identity)` as the `Identity()` the first run bridged, changes
  nothing."""
  new, entries = _migrate(REGNET_STYLE)
  assert 'class Identity(nnx.Module):' in new and 'class FlaxTinyShortCut(nnx.Module):' in new
  assert ("self.shortcut = nnx_bridge.to_linen(FlaxTinyShortCut, self.out_channels, input_sizes={"
          "'convolution_in_features': 'x'}) if should_apply_shortcut else nnx_bridge.to_linen(Identity)") in new
  assert any('class FlaxTinyLayer kept as Linen: the class FlaxTinyPreTrainedModel, which is no module, holds it'
             in e for e in entries)
  assert _migrate(new)[0] == new
  images = jax.random.normal(jax.random.key(0), (2, 4, 4, 3))
  original, bridged = (_module(s)['FlaxTinyLayer'](3, out_channels) for s in (REGNET_STYLE, new))
  _same_model(original, bridged, images)


# diffusers' VAE mid block: its list starts with a ResNet block and the loop appends one more per layer beside
# another list, then `self.resnets[0](...)` and `zip(self.downsamplers, self.resnets[1:])` (which converts:
# fixtures/L2N002/diffusers_mid_block). Here a method reading `self.scope` keeps the mid block Linen; the blocks it
# builds convert and reach its lists through setup()'s locals.
ENCODER_BLOCK = (fixture_parity.FIXTURES / 'L2N002/diffusers_encoder_block.in.py').read_text()
MID_BLOCK = '''

class FlaxUNetMidBlock2D(nn.Module):
    in_channels: int
    num_layers: int = 1

    def setup(self):
        # there is always at least one resnet
        resnets = [FlaxResnetBlock2D(in_channels=self.in_channels, out_channels=self.in_channels)]
        downsamplers = []
        for _ in range(self.num_layers):
            down = FlaxDownsample2D(self.in_channels)
            downsamplers.append(down)
            res_block = FlaxResnetBlock2D(in_channels=self.in_channels, out_channels=self.in_channels)
            resnets.append(res_block)
        self.resnets = resnets
        self.downsamplers = downsamplers

    def __call__(self, hidden_states, deterministic=True):
        hidden_states = self.resnets[0](hidden_states, deterministic=deterministic)
        for down, resnet in zip(self.downsamplers, self.resnets[1:]):
            hidden_states = down(hidden_states)
            hidden_states = resnet(hidden_states, deterministic=deterministic)
        return hidden_states

    def is_bound(self):
        return self.scope is not None
'''
VAE_MID_BLOCK = ENCODER_BLOCK + MID_BLOCK
IMAGES = jax.random.normal(jax.random.key(3), (2, 8, 8, 4))


def test_layers_a_linen_class_keeps_in_setup_lists_through_locals_are_bridged_there():
  """The mid block stays Linen; the ResNet blocks and downsamplers it appends to its lists convert, each built
  through to_linen where it stood, and the mid block runs as before on its own variables (same paths, outputs and
  gradients). A second run changes nothing."""
  new, entries = _migrate(VAE_MID_BLOCK)
  assert 'class FlaxUNetMidBlock2D(nn.Module):' in new and 'class FlaxResnetBlock2D(nnx.Module):' in new
  assert 'resnets = [nnx_bridge.to_linen(FlaxResnetBlock2D, ' in new
  assert 'res_block = nnx_bridge.to_linen(FlaxResnetBlock2D, ' in new
  assert 'down = nnx_bridge.to_linen(FlaxDownsample2D, ' in new
  assert _migrate(new)[0] == new
  original, bridged = (_module(s)['FlaxUNetMidBlock2D'](4, num_layers=2) for s in (VAE_MID_BLOCK, new))
  _same_model(original, bridged, IMAGES)


@pytest.mark.parametrize('old, new, reason', [
    ('hidden_states = resnet(hidden_states, deterministic=deterministic)',
     'hidden_states = resnet(hidden_states, deterministic)',
     'a call of FlaxResnetBlock2D passes its train/eval argument by position'),
    ('        self.resnets = resnets\n', '        self.resnets = tuple(resnets)\n',
     'a construction of FlaxResnetBlock2D that is neither called at once nor kept as a setup() attribute'),
    ('        return hidden_states\n', '        return hidden_states * len(self.resnets)\n',
     'self.resnets (FlaxResnetBlock2D) is used other than by calling it'),
], ids=['mode-by-position', 'list-passed-on', 'list-used-otherwise'])
def test_a_setup_list_whose_layers_no_bridge_can_keep_running_keeps_them_linen(old, new, reason):
  assert MID_BLOCK.count(old) == 1
  source = ENCODER_BLOCK + MID_BLOCK.replace(old, new)
  migrated, entries = _migrate(source)
  assert 'class FlaxResnetBlock2D(nn.Module):' in migrated and 'to_linen(FlaxResnetBlock2D' not in migrated
  todo = next(e for e in entries if 'class FlaxResnetBlock2D kept as Linen' in e)
  assert reason in todo, todo
  original, kept = (_module(s)['FlaxUNetMidBlock2D'](4, num_layers=2) for s in (source, migrated))
  variables = original.init(jax.random.key(0), IMAGES)
  np.testing.assert_array_equal(kept.apply(variables, IMAGES), original.apply(variables, IMAGES))


# jax-md's UMA block: a compact body binds a named layer to a local and calls it; the body keeps the block Linen
# (its layer norm comes from a helper), the layer it binds converts.
COMPACT_LOCAL = '''import flax.linen as nn
import jax.numpy as jnp


def get_normalization_layer(name):
  return nn.LayerNorm(name=name)


class Edgewise(nn.Module):
  hidden_channels: int
  dropout: float = 0.1

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    x = nn.Dense(self.hidden_channels)(x)
    return nn.Dropout(self.dropout)(x, deterministic=deterministic)


class UMABlock(nn.Module):
  hidden_channels: int

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    x_res = x
    x = get_normalization_layer('norm_1')(x)
    edgewise = Edgewise(hidden_channels=self.hidden_channels, name='edge_wise')
    x = edgewise(x, deterministic=deterministic)
    return x + x_res
'''


@pytest.mark.parametrize('old, new, converted', [
    (None, None, True),
    ('    x = edgewise(x, deterministic=deterministic)\n', '    x = edgewise(x, deterministic)\n', False),
    ('    return x + x_res\n', '    edgewise = nn.Dense(8)\n    return edgewise(x) + x_res\n', False),
    ("    edgewise = Edgewise(hidden_channels=self.hidden_channels, name='edge_wise')\n"
     '    x = edgewise(x, deterministic=deterministic)\n',
     '    edgewise = None\n    if self.hidden_channels > 4:\n'
     "      edgewise = Edgewise(hidden_channels=self.hidden_channels, name='edge_wise')\n"
     '    if edgewise is not None:\n      x = edgewise(x, deterministic=deterministic)\n', True),
], ids=['called', 'mode-by-position', 'rebound', 'none-or-layer'])
def test_a_named_layer_a_linen_body_binds_to_a_local_and_calls_is_bridged_there(old, new, converted):
  """The UMA block stays Linen; the layer it binds to a local and only calls converts and is built through to_linen
  there, the block running as before on its own variables. A call passing the switch by position, or a local bound
  twice, keeps the layer Linen; a local first bound to None and tested for it (jax-md's `rad_func = None`) does
  not."""
  source = COMPACT_LOCAL if old is None else COMPACT_LOCAL.replace(old, new)
  migrated, _ = _migrate(source)
  assert 'class UMABlock(nn.Module):' in migrated
  assert ('class Edgewise(nnx.Module):' in migrated) == converted
  assert ('edgewise = nnx_bridge.to_linen(Edgewise, ' in migrated) == converted
  assert _migrate(migrated)[0] == migrated
  x = jax.random.normal(jax.random.key(4), (3, 8))
  original, bridged = (_module(s)['UMABlock'](8) for s in (source, migrated))
  _same_model(original, bridged, x)


# transformers' T5 block: a tuple of layers named by their index, the cross-attention added only to a causal block,
# the feed-forward last, called as `self.layer[0]`, `self.layer[1]`, `self.layer[-1]`. The tuple keeps the block
# Linen; the layers in it convert.
T5_BLOCK = '''import flax.linen as nn
import jax.numpy as jnp


class FlaxT5LayerSelfAttention(nn.Module):
    d_model: int
    dropout_rate: float = 0.1

    def setup(self):
        self.SelfAttention = nn.Dense(self.d_model, use_bias=False)
        self.layer_norm = nn.LayerNorm()
        self.dropout = nn.Dropout(self.dropout_rate)

    def __call__(self, hidden_states, deterministic=True):
        attention_output = self.SelfAttention(self.layer_norm(hidden_states))
        return (hidden_states + self.dropout(attention_output, deterministic=deterministic),)


class FlaxT5LayerCrossAttention(nn.Module):
    d_model: int

    def setup(self):
        self.EncDecAttention = nn.Dense(self.d_model, use_bias=False)
        self.layer_norm = nn.LayerNorm()

    def __call__(self, hidden_states, key_value_states):
        return (hidden_states + self.EncDecAttention(self.layer_norm(hidden_states)) * key_value_states.mean(),)


class FlaxT5LayerFF(nn.Module):
    d_model: int
    dropout_rate: float = 0.1

    def setup(self):
        self.wi = nn.Dense(2 * self.d_model, use_bias=False)
        self.wo = nn.Dense(self.d_model, use_bias=False)
        self.dropout = nn.Dropout(self.dropout_rate)

    def __call__(self, hidden_states, deterministic=True):
        forwarded_states = self.wo(nn.relu(self.wi(hidden_states)))
        return hidden_states + self.dropout(forwarded_states, deterministic=deterministic)


class FlaxT5Block(nn.Module):
    d_model: int
    causal: bool = False

    def setup(self):
        self.layer = (FlaxT5LayerSelfAttention(self.d_model, name=str(0)),)
        feed_forward_index = 1
        if self.causal:
            self.layer += (FlaxT5LayerCrossAttention(self.d_model, name=str(1)),)
            feed_forward_index += 1

        self.layer += (FlaxT5LayerFF(self.d_model, name=str(feed_forward_index)),)

    def __call__(self, hidden_states, encoder_hidden_states=None, deterministic=True):
        hidden_states = self.layer[0](hidden_states, deterministic=deterministic)[0]
        if self.causal and encoder_hidden_states is not None:
            hidden_states = self.layer[1](hidden_states, key_value_states=encoder_hidden_states)[0]
        return self.layer[-1](hidden_states, deterministic=deterministic)


class FlaxT5PreTrainedModel:
    module_class = FlaxT5Block  # held for transformers' init / apply: FlaxT5Block stays Linen
'''


@pytest.mark.parametrize('causal', [False, True])
def test_layers_a_linen_class_adds_to_a_setup_tuple_are_bridged_there(causal):
  """The T5 block stays Linen; its three layer classes convert and are built through to_linen in the tuple, under
  their index names, and the block runs as before on its own variables, with and without the cross-attention. A
  second run changes nothing; a layer called with its switch by position stays Linen."""
  new, _ = _migrate(T5_BLOCK)
  assert 'class FlaxT5Block(nn.Module):' in new
  assert 'self.layer += (nnx_bridge.to_linen(FlaxT5LayerFF, self.d_model, name=str(feed_forward_index), ' in new
  layers = ['FlaxT5LayerSelfAttention', 'FlaxT5LayerCrossAttention', 'FlaxT5LayerFF']
  assert [c for c in layers if f'class {c}(nnx.Module):' in new] == layers
  assert _migrate(new)[0] == new
  hidden, encoded = jax.random.normal(jax.random.key(5), (2, 3, 8)), jax.random.normal(jax.random.key(6), (2, 4, 8))
  original, bridged = (_module(s)['FlaxT5Block'](8, causal=causal) for s in (T5_BLOCK, new))
  _same_model(original, bridged, hidden, encoded)
  positional = T5_BLOCK.replace('return self.layer[-1](hidden_states, deterministic=deterministic)',
                                'return self.layer[-1](hidden_states, deterministic)')
  assert 'class FlaxT5LayerFF(nn.Module):' in _migrate(positional)[0]


# In the layout of transformers' modeling_flax_bart.py: the model module, held by its wrapper, shares an embedding
# with its encoder and decoder and returns its encoder to the wrapper's `encode` (`_get_encoder_module`); the
# causal-LM decoder wrapper builds an embedding for the decoder it forwards `*args` to.
HF_SEQ2SEQ = '''import flax.linen as nn
import jax
import jax.numpy as jnp


class TinyConfig:
  vocab_size = 16
  d_model = 8
  dropout = 0.1


class FlaxTinyEncoder(nn.Module):
  config: TinyConfig
  embed_tokens: nn.Embed
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.dropout_layer = nn.Dropout(rate=self.config.dropout)
    self.dense = nn.Dense(self.config.d_model, dtype=self.dtype)
    self.layernorm_embedding = nn.LayerNorm(dtype=self.dtype, epsilon=1e-05)

  def __call__(self, input_ids, output_hidden_states: bool = False, deterministic: bool = True):
    hidden_states = self.layernorm_embedding(self.embed_tokens(input_ids))
    hidden_states = self.dropout_layer(hidden_states, deterministic=deterministic)
    return nn.gelu(self.dense(hidden_states))


class FlaxTinyDecoder(nn.Module):
  config: TinyConfig
  embed_tokens: nn.Embed
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.dropout_layer = nn.Dropout(rate=self.config.dropout)
    self.dense = nn.Dense(self.config.d_model, dtype=self.dtype)

  def __call__(self, input_ids, encoder_hidden_states=None, deterministic: bool = True):
    hidden_states = self.embed_tokens(input_ids)
    if encoder_hidden_states is not None:
      hidden_states = hidden_states + encoder_hidden_states.mean(axis=1, keepdims=True)
    hidden_states = self.dropout_layer(hidden_states, deterministic=deterministic)
    return self.dense(hidden_states)


class FlaxTinyModule(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.shared = nn.Embed(self.config.vocab_size, self.config.d_model, dtype=self.dtype)
    self.encoder = FlaxTinyEncoder(self.config, dtype=self.dtype, embed_tokens=self.shared)
    self.decoder = FlaxTinyDecoder(self.config, dtype=self.dtype, embed_tokens=self.shared)

  def _get_encoder_module(self):
    return self.encoder

  def __call__(self, input_ids, decoder_input_ids, deterministic: bool = True):
    encoded = self.encoder(input_ids, deterministic=deterministic)
    return self.decoder(decoder_input_ids, encoded, deterministic=deterministic)


class FlaxTinyDecoderWrapper(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    embed_tokens = nn.Embed(self.config.vocab_size, self.config.d_model, dtype=self.dtype)
    self.decoder = FlaxTinyDecoder(config=self.config, embed_tokens=embed_tokens, dtype=self.dtype)

  def __call__(self, *args, **kwargs):
    return self.decoder(*args, **kwargs)


class FlaxTinyPreTrainedModel:
  module_class: nn.Module = None

  def __init__(self, config: TinyConfig, dtype: jnp.dtype = jnp.float32):
    self.module = self.module_class(config=config, dtype=dtype)

  def init_weights(self, rng, *inputs):
    return self.module.init(rng, *inputs)["params"]

  def encode(self, params, input_ids, train: bool = False, dropout_rng=None):
    def _encoder_forward(module, input_ids, **kwargs):
      encode_module = module._get_encoder_module()
      return encode_module(input_ids, **kwargs)

    rngs = {"dropout": dropout_rng} if dropout_rng is not None else {}
    return self.module.apply({"params": params}, input_ids, deterministic=not train, rngs=rngs,
                             method=_encoder_forward)

  def __call__(self, params, *inputs):
    return self.module.apply({"params": params}, *inputs)


class FlaxTinyModel(FlaxTinyPreTrainedModel):
  module_class = FlaxTinyModule


class FlaxTinyForCausalLM(FlaxTinyPreTrainedModel):
  module_class = FlaxTinyDecoderWrapper
'''


def test_a_linen_model_returning_its_encoder_to_the_wrapper_bridges_it_and_encodes_as_before():
  """The encoder converts: the held model builds it through to_linen on the shared embedding, returns it to the
  wrapper's `encode`, which calls it with the Linen arguments, and everything runs as before on the original
  parameters. The decoder, given an embedding the causal-LM wrapper builds for it (Linen keeps it below the
  decoder), stays Linen with that reason. A second run changes nothing."""
  new, entries = _migrate(HF_SEQ2SEQ)
  assert 'class FlaxTinyEncoder(nnx.Module):' in new and 'class FlaxTinyDecoder(nn.Module):' in new
  assert 'self.encoder = nnx_bridge.to_linen(FlaxTinyEncoder, self.config, dtype=self.dtype, ' \
         'embed_tokens=self.shared, ' in new
  assert any('class FlaxTinyDecoder kept as Linen: the class FlaxTinyDecoderWrapper, left as Linen, uses it, and '
             'cannot wrap it with nnx_bridge.to_linen: a construction of FlaxTinyDecoder is given embed_tokens, a '
             'Linen module built for it' in e for e in entries)
  assert _migrate(new)[0] == new
  original, migrated = (_module(s) for s in (HF_SEQ2SEQ, new))
  config = original['TinyConfig']()
  models = [m['FlaxTinyModel'](config) for m in (original, migrated)]
  params = models[0].init_weights(jax.random.key(0), TOKENS, TOKENS)
  assert _layout(models[1].init_weights(jax.random.key(0), TOKENS, TOKENS)) == _layout(params)
  for run in (lambda m: m(params, TOKENS, TOKENS), lambda m: m.encode(params, TOKENS)):
    np.testing.assert_allclose(run(models[1]), run(models[0]), rtol=1e-6, atol=1e-6)
  # `encode(train=True)` reaches the bridged encoder as deterministic=False: dropout runs, on the 'dropout' rng
  trained = models[1].encode(params, TOKENS, train=True, dropout_rng=jax.random.key(2))
  assert not np.allclose(trained, models[1].encode(params, TOKENS))
  causal = [m['FlaxTinyForCausalLM'](config) for m in (original, migrated)]
  causal_params = causal[0].init_weights(jax.random.key(0), TOKENS)
  np.testing.assert_array_equal(causal[1](causal_params, TOKENS), causal[0](causal_params, TOKENS))


@pytest.mark.parametrize('old, new, reason', [
    ('input_ids, output_hidden_states: bool = False, deterministic: bool = True):',
     'input_ids, deterministic: bool = True, output_hidden_states: bool = False):',
     'self.encoder (FlaxTinyEncoder) is returned to callers out of sight, and its train/eval argument '
     'deterministic is followed by other positional ones'),
    ('    return self.encoder\n', '    return [self.encoder]\n',
     'self.encoder (FlaxTinyEncoder) is used other than by calling it'),
], ids=['switch-before-positional', 'returned-in-a-list'])
def test_an_encoder_returned_where_callers_could_misplace_its_switch_stays_linen(old, new, reason):
  assert old in HF_SEQ2SEQ
  migrated, entries = _migrate(HF_SEQ2SEQ.replace(old, new))
  assert 'class FlaxTinyEncoder(nn.Module):' in migrated
  assert any(reason in e for e in entries), [e for e in entries if 'FlaxTinyEncoder kept' in e]


def test_a_decoder_a_linen_wrapper_forwards_args_to_is_bridged_unless_args_could_misplace_its_switch():
  """With the embedding a setup() attribute of the causal-LM wrapper, the decoder converts, built there through
  to_linen; the wrapper forwards `*args` and runs as before. With the switch before another positional parameter,
  `*args` could carry it there, and the decoder stays Linen."""
  attribute = HF_SEQ2SEQ.replace(
      '    embed_tokens = nn.Embed(self.config.vocab_size, self.config.d_model, dtype=self.dtype)\n'
      '    self.decoder = FlaxTinyDecoder(config=self.config, embed_tokens=embed_tokens, dtype=self.dtype)',
      '    self.embed_tokens = nn.Embed(self.config.vocab_size, self.config.d_model, dtype=self.dtype)\n'
      '    self.decoder = FlaxTinyDecoder(config=self.config, embed_tokens=self.embed_tokens, dtype=self.dtype)')
  assert attribute != HF_SEQ2SEQ
  new, _ = _migrate(attribute)
  assert 'class FlaxTinyDecoder(nnx.Module):' in new and 'self.decoder = nnx_bridge.to_linen(FlaxTinyDecoder, ' in new
  original, migrated = (_module(s) for s in (attribute, new))
  causal = [m['FlaxTinyForCausalLM'](original['TinyConfig']()) for m in (original, migrated)]
  params = causal[0].init_weights(jax.random.key(0), TOKENS)
  assert _layout(causal[1].init_weights(jax.random.key(0), TOKENS)) == _layout(params)
  np.testing.assert_allclose(causal[1](params, TOKENS), causal[0](params, TOKENS), rtol=1e-6, atol=1e-6)
  shifted = attribute.replace('input_ids, encoder_hidden_states=None, deterministic: bool = True):',
                              'input_ids, deterministic: bool = True, encoder_hidden_states=None):').replace(
      'self.decoder(decoder_input_ids, encoded, ', 'self.decoder(decoder_input_ids, encoder_hidden_states=encoded, ')
  assert shifted.count('encoder_hidden_states=') == attribute.count('encoder_hidden_states=') + 1
  kept, entries = _migrate(shifted)
  assert 'class FlaxTinyDecoder(nn.Module):' in kept
  assert any('a call of FlaxTinyDecoder forwards *args, which may hold its train/eval argument deterministic, '
             'followed by other positional ones' in e for e in entries)


# In the layout of transformers' modeling_flax_wav2vec2.py: the adapter's layer list stays Linen for its own reason
# (a train/eval argument computed from the data), and bridging its layers would change that reason in a second run.
HF_ADAPTER = '''import flax.linen as nn
import jax
import jax.numpy as jnp


class TinyConfig:
  hidden_size = 8
  output_hidden_size = 4
  num_adapter_layers = 2
  layer_norm_eps = 1e-5


class FlaxTinyFeatureProjection(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.layer_norm = nn.LayerNorm(epsilon=self.config.layer_norm_eps, dtype=self.dtype)
    self.projection = nn.Dense(self.config.hidden_size, dtype=self.dtype)

  def __call__(self, hidden_states):
    return self.projection(self.layer_norm(hidden_states))


class FlaxTinyAdapterLayer(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.conv = nn.Conv(features=2 * self.config.output_hidden_size, kernel_size=(1,), strides=(1,),
                        padding=((0, 0),), dtype=self.dtype)
    self.dropout = nn.Dropout(0.1)

  def __call__(self, hidden_states, deterministic: bool = True):
    hidden_states = self.conv(hidden_states)
    return self.dropout(nn.glu(hidden_states, axis=2), deterministic=deterministic)


class FlaxTinyAdapterLayersCollection(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.layers = [
        FlaxTinyAdapterLayer(self.config, name=str(i), dtype=self.dtype)
        for i in range(self.config.num_adapter_layers)
    ]

  def __call__(self, hidden_states):
    for conv_layer in self.layers:  # a train/eval argument computed from the data: no switch of a converted layer
      hidden_states = conv_layer(hidden_states, deterministic=hidden_states.ndim < 4)
    return hidden_states


class FlaxTinyModule(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.feature_projection = FlaxTinyFeatureProjection(self.config, dtype=self.dtype)
    self.adapter = FlaxTinyAdapterLayersCollection(self.config, dtype=self.dtype)

  def __call__(self, input_values):
    return self.adapter(self.feature_projection(input_values))


class FlaxTinyPreTrainedModel:
  module_class: nn.Module = None


class FlaxTinyModel(FlaxTinyPreTrainedModel):
  module_class = FlaxTinyModule
'''


def test_a_layer_list_left_unbridged_costs_only_its_own_layers():
  """The collection stays Linen for its own reason, and bridging its layers would change that reason in a second
  run: its layer class stays Linen. The model's other converted block is still bridged, the file is settled (a
  second run changes nothing), and the model runs as before on its own variables."""
  new, entries = _migrate(HF_ADAPTER)
  assert 'class FlaxTinyAdapterLayer(nn.Module):' in new and 'class FlaxTinyFeatureProjection(nnx.Module):' in new
  assert 'self.feature_projection = nnx_bridge.to_linen(FlaxTinyFeatureProjection, ' in new
  assert any('class FlaxTinyAdapterLayer kept as Linen: the class FlaxTinyAdapterLayersCollection, left as Linen, '
             'uses it, and cannot wrap it with nnx_bridge.to_linen: with it a second run would find another reason '
             'to keep FlaxTinyAdapterLayersCollection Linen' in e for e in entries)
  assert _migrate(new)[0] == new
  values = jax.random.normal(jax.random.key(7), (2, 5, 6))
  original, bridged = (_module(s)['FlaxTinyModule'](_module(s)['TinyConfig']()) for s in (HF_ADAPTER, new))
  _same_model(original, bridged, values)


# In the layout of transformers' modeling_flax_beit.py: the embeddings read the patch count the patch embeddings'
# setup() stored, and the held model reads their patch grid through the embeddings.
HF_PATCHES = '''import flax.linen as nn
import jax
import jax.numpy as jnp


class TinyConfig:
  image_size = 8
  patch_size = 4
  num_channels = 3
  hidden_size = 6
  hidden_dropout_prob = 0.1


class FlaxTinyPatchEmbeddings(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    image_size = self.config.image_size
    patch_size = self.config.patch_size
    self.num_patches = (image_size // patch_size) * (image_size // patch_size)
    self.patch_shape = (image_size // patch_size, image_size // patch_size)
    self.projection = nn.Conv(self.config.hidden_size, kernel_size=(patch_size, patch_size),
                              strides=(patch_size, patch_size), padding="VALID", dtype=self.dtype)

  def __call__(self, pixel_values):
    embeddings = self.projection(pixel_values)
    batch_size, _, _, channels = embeddings.shape
    return jnp.reshape(embeddings, (batch_size, -1, channels))


class FlaxTinyEmbeddings(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.cls_token = self.param("cls_token", nn.initializers.zeros, (1, 1, self.config.hidden_size))
    self.patch_embeddings = FlaxTinyPatchEmbeddings(self.config, dtype=self.dtype)
    num_patches = self.patch_embeddings.num_patches
    self.position_embeddings = self.param(
        "position_embeddings", nn.initializers.normal(0.02), (1, num_patches + 1, self.config.hidden_size))
    self.dropout = nn.Dropout(rate=self.config.hidden_dropout_prob)

  def __call__(self, pixel_values, deterministic=True):
    embeddings = self.patch_embeddings(pixel_values)
    cls_tokens = jnp.broadcast_to(self.cls_token, (embeddings.shape[0], 1, self.config.hidden_size))
    embeddings = jnp.concatenate((cls_tokens, embeddings), axis=1) + self.position_embeddings
    return self.dropout(embeddings, deterministic=deterministic)


class FlaxTinyModule(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.embeddings = FlaxTinyEmbeddings(self.config, dtype=self.dtype)
    grid = self.embeddings.patch_embeddings.patch_shape
    self.bias = self.param("bias", nn.initializers.normal(0.02), (grid[0] * grid[1] + 1, 1))

  def __call__(self, pixel_values, deterministic=True):
    return self.embeddings(pixel_values, deterministic=deterministic) + self.bias


class FlaxTinyPreTrainedModel:
  module_class: nn.Module = None


class FlaxTinyModel(FlaxTinyPreTrainedModel):
  module_class = FlaxTinyModule
'''


def test_plain_attributes_a_linen_parent_reads_from_bridged_children_come_from_their_nnx_init():
  """The held model stays Linen and builds the converted embeddings through to_linen; its setup() reads the patch
  grid their patch embeddings stored, which the bridge reads from the NNX module built abstractly (the size its
  call gives a placeholder). Same variables, outputs and gradients; a second run changes nothing."""
  new, _ = _migrate(HF_PATCHES)
  assert 'class FlaxTinyEmbeddings(nnx.Module):' in new and 'class FlaxTinyPatchEmbeddings(nnx.Module):' in new
  assert 'self.embeddings = nnx_bridge.to_linen(FlaxTinyEmbeddings, ' in new
  assert 'grid = self.embeddings.patch_embeddings.patch_shape' in new
  assert _migrate(new)[0] == new
  pixels = jax.random.normal(jax.random.key(8), (2, 8, 8, 3))
  original, bridged = (_module(s)['FlaxTinyModule'](_module(s)['TinyConfig']()) for s in (HF_PATCHES, new))
  _same_model(original, bridged, pixels)


@pytest.mark.parametrize('old, new', [
    ('grid = self.embeddings.patch_embeddings.patch_shape',
     'grid = (self.embeddings.patch_embeddings.projection.kernel_size[0] // 2,) * 2'),
    ('grid = self.embeddings.patch_embeddings.patch_shape', 'grid = self.embeddings.config.patches()'),
], ids=['a-layer-attribute', 'a-call'])
def test_reads_through_the_bridge_other_than_plain_attributes_keep_the_class_linen(old, new):
  """A table layer's attribute (NNX names them otherwise) or a call through the bridge: the embeddings stay Linen,
  and the model runs as before."""
  assert old in HF_PATCHES
  source = HF_PATCHES.replace(old, new).replace('class TinyConfig:', 'class TinyConfig:\n  patches = staticmethod(lambda: (2, 2))')
  migrated, _ = _migrate(source)
  assert 'class FlaxTinyEmbeddings(nn.Module):' in migrated and 'class FlaxTinyPatchEmbeddings(nnx.Module):' in migrated
  pixels = jax.random.normal(jax.random.key(8), (2, 8, 8, 3))
  original, bridged = (_module(s)['FlaxTinyModule'](_module(s)['TinyConfig']()) for s in (source, migrated))
  _same_model(original, bridged, pixels)


VISION_HEAD = '''import flax.linen as nn
import jax.numpy as jnp


class CNN(nn.Module):
  """In the style of brax's vision networks: convolutions, then a spatial mean."""
  num_filters: int = 4

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(self.num_filters, kernel_size=(3, 3))(x))
    return jnp.mean(x, axis=(-3, -2))


@nn.jit
class VisionHead(nn.Module):
  @nn.compact
  def __call__(self, left, right):
    left = CNN(num_filters=4)(left)
    right = CNN(num_filters=3)(right)
    return nn.Dense(2)(jnp.concatenate([left, right], axis=-1))
'''
PIXELS = (jax.random.normal(jax.random.key(2), (2, 6, 6, 3)), jax.random.normal(jax.random.key(3), (2, 6, 6, 2)))


def test_a_compact_construction_without_name_is_bridged_under_the_name_linen_gives_it():
  """`CNN(...)(x)` in a compact body is Linen's `CNN_0`, the next one `CNN_1`: the wrappers take those names, so the
  Linen head keeps its variables (and checkpoints)."""
  new, _ = _migrate(VISION_HEAD)
  assert "nnx_bridge.to_linen(CNN, num_filters=4, name='CNN_0'" in new and "name='CNN_1'" in new, new
  original, bridged = (_module(s)['VisionHead']() for s in (VISION_HEAD, new))
  assert set(original.init(jax.random.key(0), *PIXELS)['params']) == {'CNN_0', 'CNN_1', 'Dense_0'}
  _same_model(original, bridged, *PIXELS)


@pytest.mark.parametrize('old, new', [
    ('    left = CNN(num_filters=4)(left)\n',
     '    for _ in range(2):\n      left = CNN(num_filters=4)(left)[..., None, None, :]\n    left = left[..., 0, 0, :]\n'),
    ('    left = CNN(num_filters=4)(left)\n', '    if left.shape[-1] > 1:\n      left = CNN(num_filters=4)(left)\n'
                                            '    else:\n      left = jnp.mean(left, axis=(-3, -2))\n'),
], ids=['loop', 'condition-before'])
def test_a_compact_construction_linen_numbers_at_run_time_keeps_the_class_linen(old, new):
  source = VISION_HEAD.replace(old, new)
  assert source != VISION_HEAD
  new, entries = _migrate(source)
  assert 'class CNN(nn.Module):' in new and 'to_linen(' not in new
  todo = next(e for e in entries if 'class CNN kept as Linen' in e)
  assert 'CNN is built outside setup() without name=, where Linen numbers it by code the run does not follow' in todo


GPT2_STYLE = '''import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax


class TinyConfig:
  hidden_size = 8
  num_heads = 2
  vocab_size = 16


class FlaxConv1D(nn.Module):
  features: int
  use_bias: bool = True
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, inputs):
    inputs = jnp.asarray(inputs, self.dtype)
    kernel = self.param("kernel", jax.nn.initializers.normal(stddev=0.02), (self.features, inputs.shape[-1]))
    kernel = jnp.asarray(kernel.transpose(), self.dtype)
    y = lax.dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())))
    if self.use_bias:
      y = y + jnp.asarray(self.param("bias", jax.nn.initializers.zeros, (self.features,)), self.dtype)
    return y


class FlaxTinyAttention(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.embed_dim = self.config.hidden_size
    self.head_dim = self.embed_dim // self.config.num_heads
    self.c_attn = FlaxConv1D(3 * self.embed_dim, dtype=self.dtype)
    self.c_proj = FlaxConv1D(self.embed_dim, dtype=self.dtype)

  def __call__(self, hidden_states):
    query, key, value = jnp.split(self.c_attn(hidden_states), 3, axis=2)
    split = lambda x: x.reshape(x.shape[:2] + (self.config.num_heads, self.head_dim))
    weights = jax.nn.softmax(jnp.einsum("...qhd,...khd->...hqk", split(query), split(key)), axis=-1)
    merged = jnp.einsum("...hqk,...khd->...qhd", weights, split(value))
    return self.c_proj(merged.reshape(merged.shape[:2] + (-1,)))


class FlaxTinyModule(nn.Module):
  config: TinyConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.wte = nn.Embed(self.config.vocab_size, self.config.hidden_size, dtype=self.dtype)
    self.attn = FlaxTinyAttention(self.config, dtype=self.dtype)

  def __call__(self, input_ids):
    hidden_states = self.wte(input_ids)
    return hidden_states + self.attn(hidden_states)


''' + HF_MODEL_WRAPPER[HF_MODEL_WRAPPER.index('class FlaxTinyPreTrainedModel:'):].replace(
    'FlaxTinyForClassificationModule', 'FlaxTinyModule').replace('FlaxTinyForClassification', 'FlaxTinyModel')


def test_a_size_shaping_a_converted_class_s_own_variable_down_the_tree_is_found_by_the_bridge():
  """GPT-2: the attention's output FlaxConv1D is fed the heads merged back; its kernel's width, `inputs.shape[-1]`
  of its own call, is in no argument of the attention's call: the bridge finds it from that call in a run."""
  new, _ = _migrate(GPT2_STYLE)
  assert 'class FlaxTinyAttention(nnx.Module):' in new and 'class FlaxTinyModule(nn.Module):' in new
  assert ("self.attn = nnx_bridge.to_linen(FlaxTinyAttention, self.config, dtype=self.dtype, "
          "input_sizes={'c_attn_kernel_features': 'hidden_states'}, "
          "traced_inputs={'c_proj_kernel_features': 'inputs'})") in new
  original, bridged = (_module(s)['FlaxTinyModule'](_module(s)['TinyConfig']()) for s in (GPT2_STYLE, new))
  variables = original.init(jax.random.key(0), TOKENS)
  trained = {'params': jax.tree.map(lambda v: v + 0.05 * jax.random.normal(jax.random.key(4), v.shape),
                                    variables['params'])}
  assert _layout(bridged.init(jax.random.key(0), TOKENS)) == _layout(variables)
  np.testing.assert_allclose(bridged.apply(trained, TOKENS), original.apply(trained, TOKENS), rtol=1e-6, atol=1e-6)
  grads = [jax.grad(lambda p, m=m: m.apply({'params': p}, TOKENS).sum())(trained['params'])
           for m in (original, bridged)]
  for expected, actual in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1]), strict=True):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
  wrong = new.replace('return self.c_proj(merged.reshape(merged.shape[:2] + (-1,)))',
                      'return self.c_proj(merged.reshape(merged.shape[:2] + (-1,))[..., ::-1])')
  assert wrong != new
  port = _module(wrong)['FlaxTinyModule'](_module(wrong)['TinyConfig']())
  assert not np.allclose(port.apply(trained, TOKENS), original.apply(trained, TOKENS), atol=1e-4)
