"""L2N002 on module factories (`factories.py`, `factory_fields.py`): a ResNet whose blocks get `conv` / `norm` as
`ModuleDef` fields (partials of nn.Conv / nn.BatchNorm) and whose `block_cls` field holds a class of the file.
Outputs, every gradient and the BatchNorm statistics of a train-mode call match Linen on transferred params; a
port with a wrong norm factory is caught."""

import pathlib
import runpy

import jax
import jax.numpy as jnp
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002'
IMAGES = jax.random.normal(jax.random.key(3), (2, 8, 8, 3))
RESNET_SIZES = dict(conv_init_in_features=3, linear_in_features=8)


def _load(name: str, suffix: str) -> dict:
  return runpy.run_path(str(FIXTURES / f'{name}.{suffix}.py'))


def _resnet():
  linen_module = _load('module_factories', 'in')['TinyResNet'](3, width=4)
  variables = linen_module.init(jax.random.key(0), IMAGES, train=False)
  model = _load('module_factories', 'out')['TinyResNet'](3, width=4, **RESNET_SIZES, rngs=nnx.Rngs(1))
  return linen_module, variables, model


def test_resnet_with_factories_matches_linen():
  linen_module, variables, model = _resnet()
  report = nnx_bridge.compare(linen_module, variables, model, IMAGES)  # eval, gradients, train call + batch_stats
  assert report.ok, report.to_text()
  assert len(nnx.to_flat_state(nnx.state(model, nnx.Param))) == len(jax.tree.leaves(variables['params']))
  assert len(nnx.to_flat_state(nnx.state(model, nnx.BatchStat))) == len(jax.tree.leaves(variables['batch_stats']))
  mapping = nnx_bridge.derive_mapping(linen_module, model, IMAGES, train=False)
  linen_paths = {rule.nnx: rule.linen for rule in mapping.rules}
  assert linen_paths[('basic_block2', 'conv_proj', 'kernel')] == (('params', 'BasicBlock_1', 'conv_proj', 'kernel'),)
  assert linen_paths[('basic_block1', 'batch_norm2', 'mean')] == (('batch_stats', 'BasicBlock_0', 'BatchNorm_1', 'mean'),)


def test_the_factories_build_what_the_parent_passes():
  _, _, model = _resnet()
  block = model.basic_block2
  assert isinstance(block.conv1, nnx.Conv) and block.conv1.use_bias is False  # partial(nnx.Conv, use_bias=False)
  assert isinstance(block.norm_proj, nnx.BatchNorm) and block.norm_proj.momentum == 0.9
  assert model.basic_block1.conv_proj is None  # strides (1, 1): Linen creates no projection either
  assert block.act is nnx.relu


def test_a_wrong_norm_factory_is_caught():
  """A port whose norm factory kept BatchNorm's default momentum (0.99, not the 0.9 the parent passes) matches
  the forward pass and gradients, but not the running statistics a train step writes."""
  linen_module, variables, model = _resnet()
  model.set_attributes(nnx.BatchNorm, momentum=0.99)
  report = nnx_bridge.compare(linen_module, variables, model, IMAGES)
  assert not report.ok
  assert {d.check for d in report.differences if not d.ok} == {'train state'}


def _convert(source: str):
  return transform_source(source, registry.select_rules(['L2N002']))


def test_a_factory_of_unknown_kind_stays_linen():
  source = '''from typing import Any

import flax.linen as nn


class Block(nn.Module):
  conv: Any

  @nn.compact
  def __call__(self, x):
    return self.conv(4, (3, 3))(x)


class Net(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = Block(nn.Conv)(x)
    return Block(nn.Dense)(x)
'''
  result = _convert(source)
  todos = [e.message for e in result.entries if e.kind == 'todo']
  assert any('pass different kinds of conv (Conv, Dense)' in t for t in todos), todos
  assert 'class Block(nn.Module)' in result.source


def test_a_factory_passed_a_layer_name_becomes_the_nnx_layer():
  source = '''from typing import Any

import flax.linen as nn


class Block(nn.Module):
  norm: Any

  @nn.compact
  def __call__(self, x):
    return self.norm()(nn.Dense(4)(x))


class Net(nn.Module):
  @nn.compact
  def __call__(self, x):
    return Block(nn.LayerNorm)(x)
'''
  code = _convert(source).source
  assert 'self.layer_norm = self.norm(num_features=4, rngs=rngs)' in code
  assert 'self.block = Block(nnx.LayerNorm, linear_in_features=block_linear_in_features, rngs=rngs)' in code
  namespace: dict = {}
  exec(compile(code, '<converted>', 'exec'), namespace)
  linen_namespace: dict = {}
  exec(compile(source, '<linen>', 'exec'), linen_namespace)
  x = jnp.ones((2, 3))
  linen_module = linen_namespace['Net']()
  variables = linen_module.init(jax.random.key(0), x)
  model = namespace['Net'](block_linear_in_features=3, rngs=nnx.Rngs(0))
  report = nnx_bridge.compare(linen_module, variables, model, x)
  assert report.ok, report.to_text()
