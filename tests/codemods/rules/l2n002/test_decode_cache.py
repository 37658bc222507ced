"""L2N002 decode caches: the converted LMs decode exactly as the Linen ones, token by token.

`fixtures/L2N002/decode_cache` is a decoder-only LM whose own attention keeps the Linen decode
cache pattern (`self.has_variable('cache', ...)`); `decode_cache_attention` uses flax's
`nn.MultiHeadDotProductAttention(decode=...)`. Linen decodes with its `cache` collection (init
with decode on, then apply with mutable=['cache']); NNX after `init_cache(...)`.
Each fixture's parity spec (`<case>.parity.json`, also compared by tests/codemods/rules/test_fixture_parity.py) names
the LM class and the Linen and NNX paths of each attention holding a cache.
"""

import json
import pathlib
import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.report import FileOutcome
from codemods.report import MigrationResult
from codemods.report import converted_classes_from_json
from codemods.transform import transform_source
from tests.codemods.rules import test_fixture_parity as fixture_parity

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002'
RULES = registry.select_rules(['L2N002'])
VOCAB, BATCH, MAX_LEN = 13, 2, 7
ATOL = 1e-5

CASES = ('decode_cache', 'decode_cache_attention')


def _spec(case: str) -> tuple[str, dict[tuple[str, ...], tuple[str, ...]]]:
  """The LM class, and the Linen module path of each attention holding a cache with its NNX path (the parity spec)."""
  entry = fixture_parity.spec(f'L2N002/{case}')
  return entry['class'], {tuple(linen): tuple(port) for linen, port in entry['decode_caches']}


LEAVES = ('cached_key', 'cached_value', 'cache_index')


def _load(case: str, suffix: str) -> dict:
  return runpy.run_path(str(FIXTURES / f'{case}.{suffix}.py'))


def _tokens(key: int, length: int = MAX_LEN) -> jax.Array:
  return jax.random.randint(jax.random.key(key), (BATCH, length), 0, VOCAB)


def _pair(case: str):
  """The Linen LM and its variables, and the converted NNX LM holding the same parameters."""
  name, _ = _spec(case)
  linen_lm = _load(case, 'in')[name](VOCAB)
  variables = linen_lm.init(jax.random.key(1), _tokens(0))
  model = _load(case, 'out')[name](VOCAB, rngs=nnx.Rngs(0))
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_lm, model, _tokens(0)))
  return linen_lm, variables, model


def _node(tree, path):
  for key in path:
    tree = tree[key] if isinstance(tree, dict) else getattr(tree, key)
  return tree


class _LinenDecoder:
  """Linen decoding: a cache from init with decode on, then one apply per step with mutable=['cache']."""

  def __init__(self, case: str, params) -> None:
    self.module = _load(case, 'in')[_spec(case)[0]](VOCAB, decode=True)
    self.params = params
    self.cache = self.module.init(jax.random.key(1), jnp.ones((BATCH, MAX_LEN), jnp.int32))['cache']

  def __call__(self, token: jax.Array) -> jax.Array:
    logits, updates = self.module.apply({'params': self.params, 'cache': self.cache}, token, mutable=['cache'])
    self.cache = updates['cache']
    return logits


@nnx.jit
def _nnx_step(model, token):
  return model(token)


def _nnx_decoder(model):
  model.set_attributes(decode=True)  # every module with a decode attribute, nnx.MultiHeadAttention included
  model.init_cache((BATCH, MAX_LEN))
  return lambda token: _nnx_step(model, token)


@pytest.mark.parametrize('case', CASES)
def test_full_sequence_forward_matches_linen(case):
  linen_lm, variables, model = _pair(case)
  tokens = _tokens(5)
  np.testing.assert_allclose(model(tokens), linen_lm.apply(variables, tokens), atol=ATOL)
  assert not jax.tree.leaves(nnx.state(model, nnx.Cache))  # no cache until init_cache, as Linen without decode


@pytest.mark.parametrize('case', CASES)
def test_init_cache_makes_the_caches_linen_init_makes(case):
  _, variables, model = _pair(case)
  linen_cache = _LinenDecoder(case, variables['params']).cache
  model.init_cache((BATCH, MAX_LEN))
  for linen_path, nnx_path in _spec(case)[1].items():
    for leaf in LEAVES:
      want, got = _node(linen_cache, (*linen_path, leaf)), _node(model, (*nnx_path, leaf))
      assert isinstance(got, nnx.Cache)
      assert got[...].shape == want.shape and got[...].dtype == want.dtype, (linen_path, leaf)
      np.testing.assert_array_equal(got[...], want)


@pytest.mark.parametrize('case', CASES)
def test_token_by_token_decoding_matches_linen_and_the_caches_agree(case):
  linen_lm, variables, model = _pair(case)
  tokens = _tokens(3)
  full = linen_lm.apply(variables, tokens)
  linen_step, nnx_step = _LinenDecoder(case, variables['params']), _nnx_decoder(model)
  for t in range(MAX_LEN):
    want, got = linen_step(tokens[:, t:t + 1]), nnx_step(tokens[:, t:t + 1])
    np.testing.assert_allclose(got, want, atol=ATOL, err_msg=f'step {t}')
    np.testing.assert_allclose(got[:, 0], full[:, t], atol=ATOL, err_msg=f'step {t}')  # decoding is causal attention
  for linen_path, nnx_path in _spec(case)[1].items():
    for leaf in LEAVES:
      np.testing.assert_allclose(_node(model, (*nnx_path, leaf))[...], _node(linen_step.cache, (*linen_path, leaf)),
                                 atol=ATOL, err_msg=f'{linen_path} {leaf}')
  assert int(_node(model, (*nnx_path, 'cache_index'))[...]) == MAX_LEN


@pytest.mark.parametrize('case', CASES)
def test_greedy_generation_gives_the_same_tokens(case):
  _, variables, model = _pair(case)
  prompt = _tokens(4, length=3)

  def generate(step):
    for t in range(prompt.shape[1]):
      logits = step(prompt[:, t:t + 1])
    generated = []
    for _ in range(MAX_LEN - prompt.shape[1]):
      token = jnp.argmax(logits[:, -1], axis=-1)
      generated.append(token)
      logits = step(token[:, None])
    return jnp.stack(generated, axis=1)

  want = generate(_LinenDecoder(case, variables['params']))
  got = generate(_nnx_decoder(model))
  np.testing.assert_array_equal(got, want)
  assert want.shape == (BATCH, MAX_LEN - prompt.shape[1])


def test_a_linen_cache_collection_transfers_into_the_nnx_caches():
  """Mid-decoding Linen state (params and cache) moves into the NNX LM, which then decodes on the same."""
  case = 'decode_cache'
  linen_lm, variables, _ = _pair(case)
  tokens = _tokens(6)
  linen_step = _LinenDecoder(case, variables['params'])
  for t in range(3):
    linen_step(tokens[:, t:t + 1])
  model = _load(case, 'out')['TinyLM'](VOCAB, decode=True, rngs=nnx.Rngs(7))
  model.init_cache((BATCH, MAX_LEN))
  mapping = nnx_bridge.derive_mapping(linen_step.module, model, jnp.ones((BATCH, MAX_LEN), jnp.int32))
  assert ('block2', 'causal_self_attention', 'cached_key') in {rule.nnx for rule in mapping.rules}
  nnx_bridge.linen_to_nnx({'params': variables['params'], 'cache': linen_step.cache}, model, mapping)
  for t in range(3, MAX_LEN):
    np.testing.assert_allclose(_nnx_step(model, tokens[:, t:t + 1]), linen_step(tokens[:, t:t + 1]), atol=ATOL)


def test_decoding_before_init_cache_says_so():
  _, _, model = _pair('decode_cache')
  model.set_attributes(decode=True)
  with pytest.raises(ValueError, match='call init_cache'):
    model(_tokens(0, length=1))


def test_the_report_records_init_cache_and_survives_json():
  result = transform_source((FIXTURES / 'decode_cache.in.py').read_text(), RULES)
  assert {c.nnx_name: c.cache_input for c in result.classes} == {
      'CausalSelfAttention': 'x', 'Block': 'x', 'TinyLM': 'tokens'}
  messages = [e.message for e in result.entries]
  assert ('TinyLM: new method init_cache(input_shape, dtype=jnp.float32), input_shape being the shape of tokens at '
          "full length (what Linen's init saw): it calls self.block1.init_cache, self.block2.init_cache; call it "
          'before decoding') in messages
  outcome = FileOutcome('lm.py', 'changed', classes=result.classes)
  document = json.loads(MigrationResult((outcome,)).to_json())
  assert document['files'][0]['classes'][2]['cache_input'] == 'tokens'
  assert converted_classes_from_json(document) == {'lm.py': result.classes}


@pytest.mark.parametrize('case', CASES)
def test_the_converted_code_needs_only_flax_and_jax(case):
  source = (FIXTURES / f'{case}.out.py').read_text()
  imports = [line for line in source.splitlines() if line.startswith(('import ', 'from '))]
  assert all(line.split()[1].split('.')[0] in ('jax', 'flax') for line in imports), imports
  assert 'def init_cache(self, input_shape: tuple[int, ...], dtype=jnp.float32):' in source


_HEAD = 'import jax.numpy as jnp\nimport flax.linen as nn\n\n\nclass M(nn.Module):\n  @nn.compact\n  def __call__(self, x):\n'


@pytest.mark.parametrize('body, reason', [
    # Linen's init writes the cache too: it is not the zeros init_cache would make
    ("    ready = self.has_variable('cache', 'last')\n    last = self.variable('cache', 'last', jnp.zeros, x.shape)\n"
     '    if ready:\n      x = x + last.value\n    last.value = x\n    return nn.Dense(2)(x)\n',
     'written outside `if ready:`'),
    ("    ready = self.has_variable('cache', 'last')\n    last = self.variable('cache', 'last', jnp.zeros, x.shape)\n"
     '    if ready:\n      x = x + last.value\n    else:\n      last.value = x\n    return nn.Dense(2)(x)\n',
     'written outside `if ready:`'),
    ("    if self.has_variable('cache', 'k'):\n      x = x + 1\n    return nn.Dense(2)(x)\n",
     "other than `flag = self.has_variable('cache', '<name>')`"),
    ("    ready = self.has_variable('params', 'w')\n    w = self.variable('params', 'w', jnp.zeros, x.shape)\n"
     '    if ready:\n      x = x + w.value\n    return nn.Dense(2)(x)\n', "collection 'params'"),
    ("    ready = self.has_variable('cache', 'k')\n    k = self.variable('cache', 'k', jnp.zeros, x.shape)\n"
     '    if ready:\n      k.value = x\n    return nn.Dense(2)(x) * ready\n', 'used other than as `if ready:`'),
    ("    ready = self.has_variable('cache', 'other')\n    k = self.variable('cache', 'k', jnp.zeros, x.shape)\n"
     '    if ready:\n      k.value = x\n    return nn.Dense(2)(x)\n', "without a `other = self.variable('cache', 'other', ...)`"),
    # shapes init_cache cannot derive
    ("    h = jnp.concatenate([x, x], axis=0)\n    ready = self.has_variable('cache', 'k')\n"
     "    k = self.variable('cache', 'k', jnp.zeros, h.shape, h.dtype)\n    if ready:\n      k.value = h\n"
     '    return nn.Dense(2)(x)\n', 'init_cache cannot derive the decode cache k'),
    ('    h = jnp.concatenate([x, x], axis=1)\n    return nn.SelfAttention(num_heads=2, decode=True)(h)\n',
     'init_cache cannot derive the shape of the input of self.multi_head_attention'),
])
def test_unsupported_has_variable_patterns_stay_linen_with_a_todo(body, reason):
  source = _HEAD + body
  result = transform_source(source, RULES)
  assert [e.kind for e in result.entries] == ['todo'] and reason in result.entries[0].message, result.entries
  assert 'class M left as Linen' in result.entries[0].message
  code_lines = [line for line in result.source.splitlines() if 'TODO(linen2nnx)' not in line]
  assert code_lines == source.splitlines()
  assert not result.classes


def test_a_setup_style_attention_layer_in_decode_mode_gets_init_cache():
  source = ('import flax.linen as nn\n\n\nclass M(nn.Module):\n  features: int\n  decode: bool = False\n\n'
            '  def setup(self):\n    self.embed = nn.Embed(10, self.features)\n'
            '    self.attn = nn.SelfAttention(num_heads=2, decode=self.decode)\n\n'
            '  def __call__(self, tokens):\n    return self.attn(self.embed(tokens))\n')
  result = transform_source(source, RULES)
  assert [e.kind for e in result.entries if e.kind == 'todo'] == []
  assert '    self.attn.init_cache((*input_shape, self.features), dtype)\n' in result.source
  namespace: dict = {}
  exec(compile(result.source, 'm.py', 'exec'), namespace)
  model = namespace['M'](4, decode=True, rngs=nnx.Rngs(0))
  model.init_cache((BATCH, MAX_LEN))
  assert model.attn.cached_key.shape == (BATCH, MAX_LEN, 2, 2)
  assert model(jnp.zeros((BATCH, 1), jnp.int32)).shape == (BATCH, 1, 4)


def test_a_child_built_with_its_cache_switch_false_holds_no_cache():
  """The LM's blocks built with `decode=False`: the attention inside creates its caches only under `if
  self.decode:`, and the block passes it its own `decode`, so neither block ever holds one. The LM needs no
  init_cache (nor shapes for one), and its port runs as the Linen model does."""
  source = (fixture_parity.FIXTURES / 'L2N002/decode_cache.in.py').read_text().replace(
      'decode=self.decode)(x)\n', 'decode=False)(x)\n')
  assert source.count('decode=False)(x)') == 2
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert not [e for e in result.entries if e.kind == 'todo']
  lm = result.source[result.source.index('class TinyLM'):]
  assert 'def init_cache' not in lm and 'def init_cache' in result.source  # the attention's and block's stay
  namespaces = [{}, {}]
  for code, namespace in zip((source, result.source), namespaces):
    exec(compile(code, 'm.py', 'exec'), namespace)
  tokens = jnp.array([[1, 2, 3], [4, 5, 6]])
  linen = namespaces[0]['TinyLM'](vocab_size=11, decode=True)
  variables = linen.init(jax.random.key(0), tokens)
  assert set(variables) == {'params'}  # Linen made no cache either
  model = namespaces[1]['TinyLM'](vocab_size=11, decode=True, rngs=nnx.Rngs(0))
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen, model, tokens))
  np.testing.assert_allclose(model(tokens), linen.apply(variables, tokens), rtol=1e-5, atol=1e-6)
