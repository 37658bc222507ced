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
import pytest
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


def test_a_child_attribute_the_nnx_module_holds_otherwise_keeps_the_class_linen():
  """A child's field, an attribute its setup() sets, and its convolution's dtype read as they are
  (fixtures/L2N002/child_attribute_reads.*, with parity); the convolution's `features` (NNX's `out_features`), or
  a write to the child's attribute, keep the class Linen at that line."""
  source = (FIXTURES / 'child_attribute_reads.in.py').read_text()
  rules = registry.select_rules(['L2N002'])
  assert 'FlaxTinyEmbeddings' in {c.linen_name for c in transform_source(source, rules).classes}
  features = source.replace('target_dtype = self.patch_embeddings.projection.dtype',
                            'target_dtype = jnp.float32 if self.patch_embeddings.projection.features else None')
  written = source.replace('    target_dtype = self.patch_embeddings.projection.dtype\n',
                           '    target_dtype = self.patch_embeddings.projection.dtype\n'
                           '    self.patch_embeddings.num_patches = 2\n')
  for changed in (features, written):
    assert changed != source
    result = transform_source(changed, rules)
    todos = [e.message for e in result.entries if e.kind == 'todo']
    assert any('FlaxTinyEmbeddings left as Linen: self.patch_embeddings used other than by calling it' in m
               for m in todos), todos


def test_a_layer_replacing_a_plain_value_is_assigned_as_nnx_data():
  """fixtures/L2N002/setup_value_placeholder.* (parity with and without the layers): without `nnx.data(...)` the port
  could not be built; a plain value set after the layer is no placeholder, and keeps the class Linen."""
  port = (FIXTURES / 'setup_value_placeholder.out.py').read_text()
  bare = port.replace('self.summary = nnx.data(nnx.Linear(', 'self.summary = (nnx.Linear(')
  assert bare != port
  scope: dict = {}
  exec(compile(bare, '<bare>', 'exec'), scope)
  with pytest.raises(ValueError, match='static attribute'):
    scope['FlaxTinySequenceSummary'](4, dense_in_features=4, rngs=nnx.Rngs(0))
  source = (FIXTURES / 'setup_value_placeholder.in.py').read_text()
  after = source.replace('      self.summary = nn.Dense(self.hidden_size, dtype=self.dtype)\n',
                         '      self.summary = nn.Dense(self.hidden_size, dtype=self.dtype)\n    self.summary = identity\n')
  assert after != source
  result = transform_source(after, registry.select_rules(['L2N002']))
  assert 'FlaxTinySequenceSummary' not in {c.linen_name for c in result.classes}


def test_a_port_creating_a_conditional_param_always_is_caught():
  """fixtures/L2N002/compact_conditional_param.* (parity with and without the bias): Linen has no bias without
  use_bias, so the NNX class makes none; a port that always makes it holds a param Linen has not."""
  source = (FIXTURES / 'compact_conditional_param.out.py').read_text()
  always = source.replace(' if self.use_bias else None\n', '\n')
  assert always != source
  linen_scope: dict = {}
  exec(compile((FIXTURES / 'compact_conditional_param.in.py').read_text(), '<linen>', 'exec'), linen_scope)
  port_scope: dict = {}
  exec(compile(always, '<port>', 'exec'), port_scope)
  x = jnp.linspace(-1.0, 1.0, 2 * 5 * 4).reshape(2, 5, 4)
  linen = linen_scope['FlaxTinyConv1D'](3, use_bias=False)
  variables = linen.init(jax.random.key(0), x)
  port = port_scope['FlaxTinyConv1D'](3, use_bias=False, kernel_features=4, rngs=nnx.Rngs(0))
  assert set(dict(nnx.to_flat_state(nnx.state(port, nnx.Param)))) != {('kernel',)}
  with pytest.raises(nnx_bridge.MappingError):
    nnx_bridge.compare(linen, variables, port, x)


def test_a_param_read_in_an_in_place_addition_converts_but_one_added_to_keeps_the_class_linen():
  """`hidden_states += self.bias` reads the param (fixtures/L2N002/param_in_place_add.*, with parity);
  `self.bias += 1.0` would change it at every call, which an NNX Param read with `[...]` would not do."""
  source = (FIXTURES / 'param_in_place_add.in.py').read_text()
  rules = registry.select_rules(['L2N002'])
  assert 'hidden_states += self.bias[...]' in transform_source(source, rules).source
  written = source.replace('hidden_states += self.bias\n', 'self.bias += 1.0\n        hidden_states += self.bias\n')
  assert written != source
  todos = [e.message for e in transform_source(written, rules).entries if e.kind == 'todo']
  assert any('FlaxTinyOnlyMLMHead left as Linen: self.bias (a param) assigned to' in m for m in todos), todos
