"""L2N002 on shared layers: a setup() embedding handed to two children stays one NNX object (one set of
params, as in Linen), and a layer bound to a local in @nn.compact and used several times (weight tying
through `embed.attend`, a block applied twice) becomes one attribute. Outputs and every gradient match
Linen on transferred params, with no duplicated params (the fixture's parity spec, tests/codemods/rules/test_fixture_parity.py);
the shared embedding is one object with one gradient; untying the copies is caught."""

import pathlib
import runpy

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002'
TOKENS = jnp.array([[1, 4, 2, 7], [3, 3, 0, 5]])


def _load(suffix: str) -> dict:
  return runpy.run_path(str(FIXTURES / f'shared_layers.{suffix}.py'))


def test_the_shared_embedding_is_one_object():
  model = _load('out')['Seq2Seq'](11, 6, encoder_linear_in_features=6, rngs=nnx.Rngs(1))
  assert model.encoder.embed is model.shared is model.decoder.embed
  grads = nnx.grad(lambda m: jnp.sum(m(TOKENS) ** 2))(model)
  paths = [path for path, _ in nnx.to_flat_state(grads) if path[-1] == 'embedding']
  assert len(paths) == 1  # one Variable, one gradient (summed over both uses), wherever NNX lists it


def test_untied_copies_are_caught():
  """A port with its own output projection instead of `wte.attend` (the tie lost) does not match Linen."""
  linen_module = _load('in')['TiedLM'](11, 6)
  variables = linen_module.init(jax.random.key(0), TOKENS)
  model = _load('out')['TiedLM'](11, 6, rngs=nnx.Rngs(1))
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_module, model, TOKENS))
  np.testing.assert_allclose(model(TOKENS), linen_module.apply(variables, TOKENS), atol=1e-5)
  untied = nnx.Embed(11, 6, rngs=nnx.Rngs(9))
  untied.embedding[...] = model.wte.embedding[...] + 0.1  # a copy trained apart from the input embedding
  tied_out = model(TOKENS)
  model.wte.attend = untied.attend
  assert not np.allclose(model(TOKENS), tied_out, atol=1e-3)


def test_a_shared_local_used_otherwise_stays_linen():
  source = '''import flax.linen as nn


class M(nn.Module):
  @nn.compact
  def __call__(self, x):
    dense = nn.Dense(3)
    layers = [dense]
    return dense(x)
'''
  result = transform_source(source, registry.select_rules(['L2N002']))
  (todo,) = [e for e in result.entries if e.kind == 'todo']
  assert 'the submodule dense used other than by calling it or one of its methods' in todo.message


def test_a_local_bound_in_an_if_arm_is_built_under_its_condition_but_not_one_bound_in_a_loop_or_with():
  arm = '''import flax.linen as nn


class M(nn.Module):
  kind: str = 'dense'

  @nn.compact
  def __call__(self, x):
    if self.kind == 'dense':
      dense = nn.Dense(3)
      x = x * 2
    else:
      return x
    return dense(x)
'''
  result = transform_source(arm, registry.select_rules(['L2N002']))
  assert not [e for e in result.entries if e.kind == 'todo']
  code = result.source
  assert "self.linear = nnx.Linear(in_features=linear_in_features, out_features=3, rngs=rngs) if self.kind == 'dense' " \
         "else None" in code
  assert 'return self.linear(x)' in code and 'dense = ' not in code
  for block in ('for _ in range(2):', 'with jax.named_scope("a"):'):
    source = arm.replace("if self.kind == 'dense':", block).replace('    else:\n      return x\n', '')
    result = transform_source(source, registry.select_rules(['L2N002']))
    (todo,) = [e for e in result.entries if e.kind == 'todo']
    assert todo.message.startswith('class M left as Linen: '), todo.message  # built per iteration / in a block
