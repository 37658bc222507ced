"""A Linen top model that picks its blocks' calls by their class (diffusers' ControlNet and UNet, Linen for a base
out of sight): it builds the blocks of another file in a setup() list through a local bound in each arm of an if,
runs them in a loop whose `isinstance(down_block, CrossAttnDownBlock)` decides which arguments each gets, and calls
its mid block under `if self.mid_block is not None`. The blocks convert; the top model wraps each with
`nnx_bridge.to_linen`, asks `nnx_bridge.is_instance` (which sees through the wrapper), and runs on its Linen
original's variables (paths, values, gradients)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nnx_bridge

from tests.codemods.rules.l2n002.test_other_files import _two_trees

BLOCKS = '''\
"""Blocks in the style of diffusers' unet_2d_blocks_flax."""
import flax.linen as nn
import jax.numpy as jnp


class ResnetBlock(nn.Module):
  in_channels: int
  out_channels: int

  def setup(self):
    self.norm1 = nn.GroupNorm(num_groups=4, epsilon=1e-5)
    self.conv1 = nn.Conv(self.out_channels, kernel_size=(3, 3), padding=((1, 1), (1, 1)))
    self.time_emb_proj = nn.Dense(self.out_channels)
    self.norm2 = nn.GroupNorm(num_groups=4, epsilon=1e-5)
    self.conv_shortcut = None
    if self.in_channels != self.out_channels:
      self.conv_shortcut = nn.Conv(self.out_channels, kernel_size=(1, 1), padding='VALID')

  def __call__(self, hidden_states, temb, deterministic=True):
    residual = hidden_states
    hidden_states = self.conv1(nn.swish(self.norm1(hidden_states)))
    hidden_states = hidden_states + jnp.expand_dims(jnp.expand_dims(self.time_emb_proj(nn.swish(temb)), 1), 1)
    hidden_states = self.norm2(hidden_states)
    if self.conv_shortcut is not None:
      residual = self.conv_shortcut(residual)
    return hidden_states + residual


class CrossAttnDownBlock(nn.Module):
  in_channels: int
  out_channels: int

  def setup(self):
    self.resnet = ResnetBlock(in_channels=self.in_channels, out_channels=self.out_channels)
    self.proj = nn.Dense(self.out_channels)

  def __call__(self, hidden_states, temb, encoder_hidden_states, deterministic=True):
    hidden_states = self.resnet(hidden_states, temb, deterministic=deterministic)
    context = self.proj(encoder_hidden_states).mean(axis=1)
    hidden_states = hidden_states + jnp.expand_dims(jnp.expand_dims(context, 1), 1)
    return hidden_states, (hidden_states,)


class DownBlock(nn.Module):
  in_channels: int
  out_channels: int

  def setup(self):
    self.resnet = ResnetBlock(in_channels=self.in_channels, out_channels=self.out_channels)

  def __call__(self, hidden_states, temb, deterministic=True):
    hidden_states = self.resnet(hidden_states, temb, deterministic=deterministic)
    return hidden_states, (hidden_states,)
'''

CONTROLNET = '''\
"""A top model in the style of diffusers' ControlNet: a base out of sight (a loader mixin) keeps it Linen."""
from typing import Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp

from loaders import ModelMixin

from .blocks import CrossAttnDownBlock, DownBlock


class ControlNet(nn.Module, ModelMixin):
  block_out_channels: Tuple[int, ...] = (8, 16)
  down_block_types: Tuple[str, ...] = ('CrossAttnDownBlock', 'DownBlock')
  mid_block_type: Optional[str] = 'DownBlock'

  def setup(self):
    self.conv_in = nn.Conv(self.block_out_channels[0], kernel_size=(3, 3), padding=((1, 1), (1, 1)))
    self.time_embedding = nn.Dense(12)
    down_blocks = []
    output_channel = self.block_out_channels[0]
    for i, down_block_type in enumerate(self.down_block_types):
      input_channel = output_channel
      output_channel = self.block_out_channels[i]
      if down_block_type == 'CrossAttnDownBlock':
        down_block = CrossAttnDownBlock(in_channels=input_channel, out_channels=output_channel)
      else:
        down_block = DownBlock(in_channels=input_channel, out_channels=output_channel)
      down_blocks.append(down_block)
    self.down_blocks = down_blocks
    if self.mid_block_type is not None:
      self.mid_block = DownBlock(in_channels=self.block_out_channels[-1], out_channels=self.block_out_channels[-1])
    else:
      self.mid_block = None

  def __call__(self, sample, timesteps, encoder_hidden_states, train: bool = False):
    t_emb = self.time_embedding(jnp.expand_dims(timesteps, -1).astype(jnp.float32))
    sample = self.conv_in(sample)
    down_block_res_samples = (sample,)
    for down_block in self.down_blocks:
      if isinstance(down_block, CrossAttnDownBlock):
        sample, res_samples = down_block(sample, t_emb, encoder_hidden_states, deterministic=not train)
      else:
        sample, res_samples = down_block(sample, t_emb, deterministic=not train)
      down_block_res_samples += res_samples
    if self.mid_block is not None:
      sample, _ = self.mid_block(sample, t_emb, deterministic=not train)
    return sample, down_block_res_samples
'''

ARGS = (jax.random.normal(jax.random.key(1), (2, 6, 6, 4)), jnp.array([3.0, 7.0]),
        jax.random.normal(jax.random.key(2), (2, 3, 5)))


def _controlnets(tmp_path, monkeypatch, edit=None):
  files = {'unet/__init__.py': '', 'unet/blocks.py': BLOCKS, 'unet/controlnet.py': CONTROLNET,
           'loaders.py': 'class ModelMixin:\n  pass\n'}
  return _two_trees(tmp_path, monkeypatch, files, 'unet.controlnet', edit)


def _loss(model):
  return lambda params: sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(model.apply({'params': params}, *ARGS)))


def test_a_linen_model_picking_its_blocks_by_class_wraps_them_and_runs_on_its_variables(tmp_path, monkeypatch):
  result, linen, ported = _controlnets(tmp_path, monkeypatch)
  converted = {c.linen_name for o in result.files for c in o.classes}
  assert converted == {'ResnetBlock', 'CrossAttnDownBlock', 'DownBlock'}, \
      [e.message for o in result.files for e in o.entries if e.kind == 'todo']
  code = (tmp_path / 'nnx' / 'unet' / 'controlnet.py').read_text()
  assert 'if nnx_bridge.is_instance(down_block, CrossAttnDownBlock):' in code, code
  assert 'down_block = nnx_bridge.to_linen(CrossAttnDownBlock, in_channels=input_channel' in code
  assert 'self.mid_block = nnx_bridge.to_linen(DownBlock, ' in code
  variables = linen.ControlNet().init(jax.random.key(0), *ARGS)
  shapes = lambda tree: jax.tree.map(jnp.shape, tree)
  assert shapes(ported.ControlNet().init(jax.random.key(0), *ARGS)) == shapes(variables)
  rng = np.random.default_rng(0)  # trained weights: no zero bias hides a wrong mapping
  params = jax.tree.map(lambda p: p + rng.uniform(0.1, 0.3, p.shape).astype(p.dtype), variables['params'])
  want, got = (jax.value_and_grad(_loss(m.ControlNet()))(params) for m in (linen, ported))
  np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
  for expected, actual in zip(jax.tree.leaves(want[1]), jax.tree.leaves(got[1]), strict=True):
    np.testing.assert_allclose(actual, expected, atol=1e-5)
  assert float(jnp.abs(got[1]['down_blocks_0']['proj']['kernel']).sum()) > 0  # the text states reach the first block
  no_mid = ported.ControlNet(mid_block_type=None)
  assert 'mid_block' not in no_mid.init(jax.random.key(0), *ARGS)['params']


def test_a_plain_isinstance_on_the_wrapped_blocks_is_rejected_by_the_comparison(tmp_path, monkeypatch):
  """Left as `isinstance`, the test is False for every wrapper: the cross-attention block is called without the text
  states and the wrapper stops the program, saying which argument the call lacks."""
  _, linen, ported = _controlnets(tmp_path, monkeypatch, (
      'unet/controlnet.py', lambda code: code.replace('nnx_bridge.is_instance(', 'isinstance(')))
  params = linen.ControlNet().init(jax.random.key(0), *ARGS)['params']
  with pytest.raises(nnx_bridge.BridgeError, match='passes no array for it'):
    _loss(ported.ControlNet())(params)
