"""L2N002 on weight tying (`tied.py`): `.apply` of a Dense on a shared embedding's kernel, `.variables` reads, and
the Hugging Face head that ties only when given the embedding. Outputs and gradients match Linen on transferred
params; a port with a broken tie is caught."""

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


def _load(name: str, suffix: str) -> dict:
  return runpy.run_path(str(FIXTURES / f'{name}.{suffix}.py'))


def _convert(source: str):
  return transform_source(source, registry.select_rules(['L2N002']))




TOKENS = jnp.array([[1, 4, 2, 7], [3, 3, 0, 5]])


def _masked_lm():
  linen_module = _load('tied_apply', 'in')['MaskedLM'](11, 6)
  variables = linen_module.init(jax.random.key(0), TOKENS)
  model = _load('tied_apply', 'out')['MaskedLM'](11, 6, rngs=nnx.Rngs(1))
  return linen_module, variables, model


def test_tied_apply_matches_linen():
  linen_module, variables, model = _masked_lm()
  assert 'decoder' not in variables['params']['lm_head']  # only run through .apply: Linen creates no params
  report = nnx_bridge.compare(linen_module, variables, model, TOKENS)
  assert report.ok, report.to_text()
  assert len(nnx.to_flat_state(nnx.state(model, nnx.Param))) == len(jax.tree.leaves(variables['params']))
  assert not hasattr(model.lm_head, 'decoder')


def test_a_broken_tie_is_caught():
  """A port that projects with a copy of the embedding (trained apart from it) instead of the embedding itself
  matches the outputs on transferred params but not the embedding's gradient, which gets both uses in Linen."""
  linen_module, variables, model = _masked_lm()

  class Untied(nnx.Module):
    def __init__(self, lm):
      self.lm = lm
      self.copy = nnx.Param(lm.encoder.token_embed.embedding[...])

    def __call__(self, token_ids):
      hidden_states = self.lm.encoder(token_ids)
      return self.lm.lm_head(hidden_states, self.copy[...])

  mapping = nnx_bridge.derive_mapping(linen_module, model, TOKENS)
  nnx_bridge.linen_to_nnx(variables, model, mapping)
  untied = Untied(model)
  tied_grad = nnx.grad(lambda m: jnp.sum(m(TOKENS) ** 2))(model)['encoder']['token_embed']['embedding'][...]
  untied_grad = nnx.grad(lambda m: jnp.sum(m(TOKENS) ** 2))(untied)['lm']['encoder']['token_embed']['embedding'][...]
  assert not jnp.allclose(tied_grad, untied_grad, atol=1e-3)
  linen_grad = jax.grad(lambda p: jnp.sum(linen_module.apply({'params': p}, TOKENS) ** 2))(variables['params'])
  assert jnp.allclose(tied_grad, linen_grad['encoder']['token_embed']['embedding'], atol=1e-5)


def test_a_tied_apply_with_a_bias_stays_linen():
  source = '''import flax.linen as nn


class Head(nn.Module):
  def setup(self):
    self.decoder = nn.Dense(5)

  def __call__(self, x, embedding):
    return self.decoder.apply({'params': {'kernel': embedding.T}}, x)
'''
  todos = [e.message for e in _convert(source).entries if e.kind == 'todo']
  assert any('the Dense has a bias' in t for t in todos), todos


@pytest.mark.parametrize('tie', [True, False])
def test_conditional_tie_matches_linen_in_both_configurations(tie):
  """The Hugging Face form: the head ties when given the embedding, else uses its own decoder. Linen creates the
  decoder's params only in the untied configuration; the NNX model mirrors that through tied_decoder, which the
  middle class passes on."""
  linen_module = _load('tied_apply', 'in')['ConfigurableLM'](11, 6, tie_word_embeddings=tie)
  variables = linen_module.init(jax.random.key(0), TOKENS)
  assert ('decoder' in variables['params']['cls']['predictions']) is not tie
  model = _load('tied_apply', 'out')['ConfigurableLM'](11, 6, tie_word_embeddings=tie,
                                                       rngs=nnx.Rngs(1))
  assert (model.cls.predictions.decoder is None) is tie  # tied_decoder passed on through MLMOutput
  report = nnx_bridge.compare(linen_module, variables, model, TOKENS)
  assert report.ok, report.to_text()
  assert len(nnx.to_flat_state(nnx.state(model, nnx.Param))) == len(jax.tree.leaves(variables['params']))


def test_a_tie_outside_an_if_else_stays_linen():
  source = '''import flax.linen as nn


class Head(nn.Module):
  def setup(self):
    self.decoder = nn.Dense(5, use_bias=False)

  def __call__(self, x, embedding=None):
    if embedding is not None:
      return self.decoder.apply({'params': {'kernel': embedding.T}}, x)
    return self.decoder(x)
'''
  todos = [e.message for e in _convert(source).entries if e.kind == 'todo']
  assert any('other than as `if <arg> is not None: <tied> else: <own>`' in t for t in todos), todos


def test_a_tied_apply_with_a_dtype_casts_like_the_dense():
  source = '''import flax.linen as nn
import jax.numpy as jnp


class Head(nn.Module):
  def setup(self):
    self.embed = nn.Embed(7, 4)
    self.decoder = nn.Dense(7, use_bias=False, dtype=jnp.bfloat16)

  def __call__(self, tokens):
    h = self.embed(tokens)
    return self.decoder.apply({'params': {'kernel': self.embed.variables['params']['embedding'].T}}, h)
'''
  code = _convert(source).source
  assert 'jnp.asarray(h, jnp.bfloat16) @ jnp.asarray(self.embed.embedding[...].T, jnp.bfloat16)' in code
  linen_namespace: dict = {}
  namespace: dict = {}
  exec(compile(source, '<linen>', 'exec'), linen_namespace)
  exec(compile(code, '<converted>', 'exec'), namespace)
  tokens = jnp.array([[1, 2, 6]])
  linen_module = linen_namespace['Head']()
  variables = linen_module.init(jax.random.key(0), tokens)
  model = namespace['Head'](rngs=nnx.Rngs(0))
  report = nnx_bridge.compare(linen_module, variables, model, tokens)
  assert report.ok, report.to_text()
  assert model(tokens).dtype == jnp.bfloat16
