"""L2N002 decode caches created on the call that asks for them (transformers' `_concatenate_to_cache`).

`fixtures/L2N002/decode_cache_on_call` is a causal LM in transformers' Flax style. Linen decodes as transformers'
`generate` does: `init(..., init_cache=True)` at full length makes the `cache` collection, then one
`apply({'params', 'cache'}, ..., mutable=['cache'])` per token. The NNX port creates its caches on the
`init_cache=True` call and then decodes token by token; through `nnx_bridge.to_linen` the same Linen calls run the
NNX code with the caches in the Linen `cache` collection, as transformers' wrappers keep them.
"""

import pathlib
import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax import traverse_util

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002'
RULES = registry.select_rules(['L2N002'])
VOCAB, BATCH, MAX_LEN = 13, 2, 8
LM = 'FlaxTinyForCausalLMModule'
ATOL = 1e-5


def _load(suffix: str) -> dict:
  return runpy.run_path(str(FIXTURES / f'decode_cache_on_call.{suffix}.py'))


def _inputs(tokens: jax.Array, start: int = 0) -> tuple[jax.Array, jax.Array, jax.Array]:
  """input_ids, attention_mask (over the full length, as transformers' generate passes it) and position_ids."""
  positions = jnp.broadcast_to(jnp.arange(start, start + tokens.shape[1]), tokens.shape)
  return tokens, jnp.ones((BATCH, MAX_LEN), jnp.int32), positions


def _tokens(key: int, length: int = MAX_LEN) -> jax.Array:
  return jax.random.randint(jax.random.key(key), (BATCH, length), 0, VOCAB)


def _sizes() -> dict[str, int]:
  """The size arguments the migration leaves (the report names them); the fixture's hidden size is 16."""
  result = transform_source((FIXTURES / 'decode_cache_on_call.in.py').read_text(), RULES)
  record = next(c for c in result.classes if c.nnx_name == LM)
  return {argument.name: 16 for argument in record.arguments if argument.origin not in ('field', 'rngs')}


@pytest.fixture(scope='module')
def pair():
  """The Linen LM with its parameters, and the NNX port holding the same ones."""
  linen_lm = _load('in')[LM](VOCAB)
  tokens = _tokens(0)
  params = linen_lm.init(jax.random.key(1), *_inputs(tokens[:, :MAX_LEN]))['params']
  model = _load('out')[LM](VOCAB, **_sizes(), rngs=nnx.Rngs(0))
  mapping = nnx_bridge.derive_mapping(linen_lm, model, *_inputs(tokens))
  nnx_bridge.linen_to_nnx({'params': params}, model, mapping)
  return linen_lm, params, model


class _LinenDecoder:
  """transformers' decoding: the cache from `init(..., init_cache=True)`, then one apply per step."""

  def __init__(self, module, params) -> None:
    self.module, self.params = module, params
    self.cache = module.init(jax.random.key(1), *_inputs(jnp.ones((BATCH, MAX_LEN), jnp.int32)),
                             init_cache=True)['cache']
    self.step = 0

  def __call__(self, token: jax.Array) -> jax.Array:
    logits, updates = self.module.apply({'params': self.params, 'cache': self.cache}, *_inputs(token, self.step),
                                        mutable=['cache'])
    self.cache, self.step = updates['cache'], self.step + 1
    return logits


class _NNXDecoder:
  """The port's decoding: one call with init_cache=True creates the caches, then one call per step."""

  def __init__(self, model) -> None:
    self.model = model
    model(*_inputs(jnp.ones((BATCH, MAX_LEN), jnp.int32)), init_cache=True)
    self.step = 0

  def __call__(self, token: jax.Array) -> jax.Array:
    logits = _nnx_call(self.model, *_inputs(token, self.step))
    self.step += 1
    return logits


@nnx.jit
def _nnx_call(model, input_ids, attention_mask, position_ids):
  return model(input_ids, attention_mask, position_ids)


def test_the_full_forward_matches_linen_and_makes_no_cache(pair):
  linen_lm, params, model = pair
  tokens = _tokens(5)
  np.testing.assert_allclose(model(*_inputs(tokens)), linen_lm.apply({'params': params}, *_inputs(tokens)), atol=ATOL)
  assert model.layer.attention.cached_key is None


def test_token_by_token_decoding_matches_linen_and_the_caches_agree(pair):
  linen_lm, params, model = pair
  model = nnx.clone(model)
  tokens = _tokens(3)
  full = linen_lm.apply({'params': params}, *_inputs(tokens))
  linen_step, nnx_step = _LinenDecoder(linen_lm, params), _NNXDecoder(model)
  attention = model.layer.attention
  linen_cache = linen_step.cache['layer']['attention']
  for name in ('cached_key', 'cached_value', 'cache_index'):  # as Linen's init made them
    np.testing.assert_array_equal(getattr(attention, name)[...], linen_cache[name])
  for t in range(MAX_LEN):
    want, got = linen_step(tokens[:, t:t + 1]), nnx_step(tokens[:, t:t + 1])
    np.testing.assert_allclose(got, want, atol=ATOL, err_msg=f'step {t}')
    np.testing.assert_allclose(got[:, 0], full[:, t], atol=ATOL, err_msg=f'step {t}')
  linen_cache = linen_step.cache['layer']['attention']
  for name in ('cached_key', 'cached_value', 'cache_index'):
    np.testing.assert_allclose(getattr(attention, name)[...], linen_cache[name], atol=ATOL, err_msg=name)
  assert int(attention.cache_index[...]) == MAX_LEN


def test_through_to_linen_the_cache_collection_is_linen_s_and_decoding_matches(pair):
  """transformers' wrappers keep a Linen module: a bridged port makes, reads and updates the same `cache`."""
  linen_lm, params, _ = pair
  bridged = nnx_bridge.to_linen(_load('out')[LM], VOCAB, **_sizes())
  linen_step, bridged_step = _LinenDecoder(linen_lm, params), _LinenDecoder(bridged, params)
  shapes = lambda tree: {k: (v.shape, v.dtype) for k, v in traverse_util.flatten_dict(tree).items()}
  assert shapes(bridged_step.cache) == shapes(linen_step.cache)
  tokens = _tokens(4)
  for t in range(MAX_LEN):
    np.testing.assert_allclose(bridged_step(tokens[:, t:t + 1]), linen_step(tokens[:, t:t + 1]), atol=ATOL,
                               err_msg=f'step {t}')
  for path, value in traverse_util.flatten_dict(linen_step.cache).items():
    np.testing.assert_allclose(traverse_util.flatten_dict(bridged_step.cache)[path], value, atol=ATOL)


def test_the_report_says_who_creates_the_caches():
  result = transform_source((FIXTURES / 'decode_cache_on_call.in.py').read_text(), RULES)
  assert ("`is_initialized = self.has_variable('cache', 'cached_key')` -> `self.cached_key is not None`: the call "
          'that finds the decode caches missing creates self.cached_key, self.cached_value, self.cache_index (None '
          "until then), as Linen's init did") in [e.message for e in result.entries]
  assert not [e for e in result.entries if e.kind == 'todo']


_ATTENTION = '''import jax.numpy as jnp
import flax.linen as nn


class Attention(nn.Module):
    @nn.compact
    def _concatenate_to_cache(self, key):
        is_initialized = self.has_variable("cache", "cached_key")
{between}        cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
        if is_initialized:
            key = cached_key.value + key
            cached_key.value = key
        return key

    def __call__(self, x, init_cache: bool = False):
        if {read}:
            x = x + 1
        if self.has_variable("cache", "cached_key") or init_cache:
            x = self._concatenate_to_cache(x)
        return nn.Dense(2)(x)
'''


@pytest.mark.parametrize('between, read, reason', [
    ('        key = key * 2\n', 'init_cache', 'code other than the decode caches'),
    ('', 'self.variables["cache"]["other"] is None', 'self.variables has no automatic NNX conversion'),
    ('', 'self.variables["params"]', 'self.variables has no automatic NNX conversion'),
    ('', 'self.has_variable("cache", "other")', 'self.has_variable has no automatic NNX conversion'),
])
def test_other_cache_patterns_stay_linen_with_a_todo(between, read, reason):
  source = _ATTENTION.format(between=between, read=read)
  result = transform_source(source, RULES)
  assert [e.kind for e in result.entries] == ['todo'] and reason in result.entries[0].message, result.entries
  assert not result.classes
