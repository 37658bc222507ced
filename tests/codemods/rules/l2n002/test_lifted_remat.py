"""L2N002 on nn.remat / nn.checkpoint of a class of the same file: the child is built normally in
__init__ and its call runs through nnx.remat; Linen's params (CheckpointBlock_0, or the setup
attribute) transfer, outputs and every gradient match (the fixture's parity spec, tests/codemods/rules/test_fixture_parity.py),
and the gradient really rematerialises."""

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
from tests.codemods.rules.l2n002.kept_linen import kept_with

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002'
RULES = registry.select_rules(['L2N002'])
X = jax.random.normal(jax.random.key(1), (3, 5, 8))


def _load(case: str, suffix: str) -> dict:
  return runpy.run_path(str(FIXTURES / f'{case}.{suffix}.py'))


BLOCK_LAYERS = (('LayerNorm_0', 'layer_norm'), ('Dense_0', 'linear1'), ('Dense_1', 'linear2'))


def _layer_pairs(blocks: dict[str, str]) -> dict[tuple[str, ...], tuple[str, ...]]:
  """The report's child names (`CheckpointBlock_0 -> self.block1`, `Dense_0 -> self.linear1`) as layer pairs,
  as `linen2nnx verify --migrate-report` gives them to derive_mapping."""
  return {(linen, l): (nnx_name, n) for linen, nnx_name in blocks.items() for l, n in BLOCK_LAYERS}


def _gradient_jaxpr(model, x) -> str:
  graphdef, state = nnx.split(model)
  loss = lambda state: jnp.sum(nnx.merge(graphdef, state)(x) ** 2)
  return str(jax.make_jaxpr(jax.grad(loss))(state))


def test_transfer_by_derived_mapping_pairs_checkpoint_names():
  linen_module = _load('remat', 'in')['Stack'](8, 16)
  variables = linen_module.init(jax.random.key(0), X)
  model = _load('remat', 'out')['Stack'](8, 16, block1_layer_norm_num_features=8, rngs=nnx.Rngs(5))
  blocks = {'CheckpointBlock_0': 'block1', 'CheckpointBlock_1': 'block2'}
  by_pairs = nnx_bridge.derive_mapping(linen_module, model, X, layer_pairs=_layer_pairs(blocks))
  # Without pairs too: the trace sees the calls inside nnx.remat (identical blocks, paired by call order).
  mapping = nnx_bridge.derive_mapping(linen_module, model, X)
  assert {r.nnx: r.linen for r in mapping.rules} == {r.nnx: r.linen for r in by_pairs.rules}
  pairs = {r.nnx: r.linen for r in mapping.rules}
  assert pairs[('block1', 'linear1', 'kernel')] == (('params', 'CheckpointBlock_0', 'Dense_0', 'kernel'),)
  assert pairs[('block2', 'layer_norm', 'scale')] == (('params', 'CheckpointBlock_1', 'LayerNorm_0', 'scale'),)
  assert len(pairs) == 12
  nnx_bridge.linen_to_nnx(variables, model, mapping)
  np.testing.assert_allclose(model(X), linen_module.apply(variables, X), atol=1e-5)


@pytest.mark.parametrize('name, kwargs', [
    ('Stack', {'block1_layer_norm_num_features': 8}),
    ('SetupStack', {'first_layer_norm_num_features': 8}),
])
def test_gradient_rematerialises(name, kwargs):
  model = _load('remat', 'out')[name](8, 16, **kwargs, rngs=nnx.Rngs(0))
  jaxpr = _gradient_jaxpr(model, X)
  assert jaxpr.count('remat') + jaxpr.count('checkpoint') >= 2, jaxpr


STATIC = '''import flax.linen as nn


class Block(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x, double):
    y = nn.Dense(self.features)(x)
    if double:
      y = 2 * y
    return y


class M(nn.Module):
  @nn.compact
  def __call__(self, x):
    return {remat}(3)(x, True)
'''


def test_static_argnums_keep_their_numbers():
  """Linen counts `self` as argument 0 of __call__, nnx.remat the module given first: the same numbers."""
  source = STATIC.format(remat='nn.checkpoint(Block, static_argnums=(2,), policy=jax.checkpoint_policies.nothing_saveable)')
  source = source.replace('import flax.linen as nn\n', 'import flax.linen as nn\nimport jax\n')
  result = transform_source(source, RULES)
  assert ('nnx.remat(lambda module, x1, x2: module(x1, x2), policy=jax.checkpoint_policies.nothing_saveable, '
          'static_argnums=(2,))(self.block, x, True)') in result.source, result.source
  linen, converted = {}, {}
  exec(compile(source, 'linen', 'exec'), linen)
  exec(compile(result.source, 'nnx', 'exec'), converted)
  x = jnp.ones((2, 4))
  linen_module = linen['M']()
  variables = linen_module.init(jax.random.key(0), x)
  model = converted['M'](block_linear_in_features=4, rngs=nnx.Rngs(0))
  report = nnx_bridge.compare(linen_module, variables, model, x)
  assert report.ok, report.to_text()
  assert 'remat' in _gradient_jaxpr(model, x) or 'checkpoint' in _gradient_jaxpr(model, x)


@pytest.mark.parametrize('remat, reason', [
    ("nn.remat(Block, concrete=True)", 'is converted only with the options prevent_cse, policy, static_argnums'),
    ("nn.remat(Block, variables=True)", 'variables=True'),
    ("nn.checkpoint(Block, methods=['__call__'])", "methods=['__call__']"),
    ("nn.remat(Block, static_argnums=n)", 'static_argnums (argnums literal)'),
    ("nn.scan(nn.remat(Block), variable_broadcast='params', split_rngs={'params': False}, in_axes=1, out_axes=1)",
     'builds a submodule from a lifted transform or factory call whose result L2N002 cannot build'),
])
def test_other_remats_stay_linen_with_a_todo(remat, reason):
  source = STATIC.format(remat=remat).replace('class M', 'n = 2\n\n\nclass M')
  result = transform_source(source, RULES)
  assert 'class M(nn.Module)' in result.source and 'nnx.remat(' not in result.source
  todo = kept_with(result, 'Block')  # M stays Linen and runs Block through nn.remat: Block stays Linen too
  assert todo.message.startswith('class M left as Linen: ') and reason in todo.message, todo.message
  assert f'# TODO(linen2nnx): {todo.message}' in result.source


@pytest.mark.parametrize('body, reason', [
    ('    block = {remat}(3)\n    return block(x, True), block(x, False)\n', 'called 2 times'),
    ('    block = {remat}(3)\n    return block(x, double=True)\n', 'keyword or starred arguments'),
    ('    block = {remat}(3)\n    f = block\n    return f(x, True)\n', 'used other than by calling it'),
    ('    blocks = [{remat}(3)]\n    return blocks[0](x, True)\n', 'neither called where it is built nor bound'),
])
def test_rematted_submodule_used_otherwise_stays_linen(body, reason):
  source = STATIC.replace('    return {remat}(3)(x, True)\n', body).format(remat='nn.remat(Block)')
  result = transform_source(source, RULES)
  assert 'class M(nn.Module)' in result.source
  todo = kept_with(result, 'Block')
  assert reason in todo.message, todo.message


def _collection(suffix: str, checkpointed: bool, source: str | None = None):
  """FlaxTinyLayerCollection of the transformers-style fixture (`source`: the port's text, to run instead)."""
  scope = _load('hf_gradient_checkpointing', suffix) if source is None else {}
  if source is not None:
    exec(compile(source, 'port', 'exec'), scope)
  config = scope['TinyConfig']()
  if suffix == 'in':
    return scope['FlaxTinyLayerCollection'](config, gradient_checkpointing=checkpointed)
  return scope['FlaxTinyLayerCollection'](config, gradient_checkpointing=checkpointed,
                                          layers_intermediate_in_features=8, rngs=nnx.Rngs(0))


HIDDEN, MASK = jax.random.normal(jax.random.key(2), (2, 3, 8)), jnp.ones((2, 3))


def test_gradient_checkpointing_collection_runs_its_layers_through_nnx_remat():
  """transformers' `if self.gradient_checkpointing: X = remat(Layer, static_argnums=...)` (flax's partitioning.remat,
  bound at module level): the port binds X to the subclass whose __call__ runs through nnx.remat, only in that
  arm. Its static arguments stay static (`if output_attentions:` inside the layer needs a Python bool), and the
  outputs, attentions included, and gradients are Linen's."""
  for checkpointed in (True, False):
    linen_module, model = _collection('in', checkpointed), _collection('out', checkpointed)
    variables = linen_module.init(jax.random.key(0), HIDDEN, MASK)
    report = nnx_bridge.compare(linen_module, variables, model, HIDDEN, MASK, output_attentions=True)
    assert report.ok, report.to_text()
    assert {'output', 'gradient'} <= {d.check for d in report.differences}

    def loss(model):
      hidden, attentions = model(HIDDEN, MASK, None, False, True)
      return jnp.sum(hidden ** 2) + sum(jnp.sum(a) for a in attentions)

    graphdef, state = nnx.split(model)
    jaxpr = str(jax.make_jaxpr(lambda state: nnx.grad(loss)(nnx.merge(graphdef, state)))(state))
    assert (jaxpr.count('remat') + jaxpr.count('checkpoint') >= 2) == checkpointed, jaxpr


def test_a_wrong_gradient_checkpointing_port_fails_parity():
  """The fixture's parity check rejects a port wrong on purpose in the rematted layer (its residual sign)."""
  source = (FIXTURES / 'hf_gradient_checkpointing.out.py').read_text()
  wrong = source.replace('self.LayerNorm(layer_output + hidden_states)', 'self.LayerNorm(layer_output - hidden_states)')
  assert wrong != source
  linen_module = _collection('in', True)
  variables = linen_module.init(jax.random.key(0), HIDDEN, MASK)
  report = nnx_bridge.compare(linen_module, variables, _collection('out', True, wrong), HIDDEN, MASK)
  assert not report.ok


def test_a_rematted_local_used_otherwise_stays_linen_with_a_todo_at_its_line():
  source = (FIXTURES / 'hf_gradient_checkpointing.in.py').read_text().replace(
      '      self.layers = [\n          FlaxTinyCheckpointLayer(',
      '      self.kind = FlaxTinyCheckpointLayer\n      self.layers = [\n          FlaxTinyCheckpointLayer(')
  result = transform_source(source, RULES)
  assert 'class FlaxTinyLayerCollection(nn.Module)' in result.source and 'nnx.remat' not in result.source
  (todo,) = [e for e in result.entries if e.kind == 'todo' and e.message.startswith('class FlaxTinyLayerCollection ')]
  assert todo.message.endswith('FlaxTinyCheckpointLayer = remat(FlaxTinyLayer, ...) used other than to build '
                               'submodules'), todo.message
  assert todo.line == source.splitlines().index('      self.kind = FlaxTinyCheckpointLayer') + 1, todo
