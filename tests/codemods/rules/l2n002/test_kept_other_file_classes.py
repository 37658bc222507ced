"""A compact body that binds a Linen class another file keeps Linen to a local (jax-md's `act =
GateActivation(..., name='act')` in an arm of an if, then `act(gating, x)`): no record of that class comes; once the
run has settled that it stays Linen there, the class building it is planned knowing so (a converted class would wrap
it with nnx_bridge.from_linen), and where it still stays Linen, its TODO gives its own reason and the program runs
as before. Converting it with the Linen module built inside an NNX `__call__` would fail at its first call."""

from __future__ import annotations

import jax
import numpy as np

from tests.codemods.rules.l2n002.test_other_files import _two_trees

ACTS = '''\
import flax.linen as nn


@nn.jit
class GateActivation(nn.Module):
  @nn.compact
  def __call__(self, gate, x):
    return x * nn.sigmoid(nn.Dense(x.shape[-1], name='gate')(gate))
'''

BLOCKS = '''\
import flax.linen as nn

from edges.acts import GateActivation


class Edgewise(nn.Module):
  hidden: int = 4
  act_type: str = 'gate'

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.hidden, name='so2_conv')(x)
    if self.act_type == 'gate':
      act = GateActivation(name='act')
    else:
      act = lambda gate, y: y * gate
    return act(h, h)
'''

X = jax.random.normal(jax.random.key(1), (2, 3))


def test_a_local_bound_to_a_class_another_file_keeps_linen_keeps_its_builder_linen(tmp_path, monkeypatch):
  files = {'edges/__init__.py': '', 'edges/acts.py': ACTS, 'edges/blocks.py': BLOCKS}
  result, linen, ported = _two_trees(tmp_path, monkeypatch, files, 'edges.blocks')
  todos = {o.path: [(e.line, e.message) for e in o.entries if e.kind == 'todo'] for o in result.files}
  assert (14, 'class Edgewise left as Linen: the submodule act is rebound in the method') in todos['edges/blocks.py'], \
      todos  # the lambda of the other arm, once GateActivation is known to stay Linen
  assert not {c.linen_name for o in result.files for c in o.classes}
  variables = linen.Edgewise().init(jax.random.key(0), X)
  np.testing.assert_array_equal(ported.Edgewise().apply(variables, X), linen.Edgewise().apply(variables, X))


RADIAL = '''\
import flax.linen as nn


class RadialMLP(nn.Module):
  channels: int = 4

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.channels, name='net_0')(nn.silu(x))
'''

MOE = '''\
import flax.linen as nn

from uma.radial import RadialMLP


@nn.jit
class SO2ConvolutionMoE(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(1):  # Linen numbers the MLPs as it runs: no wrapper takes their names, so they stay Linen
      x = RadialMLP()(x)
    return x
'''

EMBEDDING = '''\
import flax.linen as nn

from uma.radial import RadialMLP


class EdgeDegreeEmbedding(nn.Module):
  channels: int = 4

  @nn.compact
  def __call__(self, x_edge):
    rad_func = RadialMLP(channels=self.channels, name='rad_func')
    return rad_func(x_edge) * 2.0
'''

MODEL = '''\
import flax.linen as nn

from uma.embedding import EdgeDegreeEmbedding


@nn.jit
class UMABackbone(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(1):  # as above: the edge embedding stays Linen for it
      x = EdgeDegreeEmbedding()(x)
    return x
'''


def test_a_class_kept_for_another_file_s_use_says_what_keeps_it_linen_on_its_own(tmp_path, monkeypatch):
  """jax-md's UMA: the backbone (Linen) builds the edge embedding, which builds the radial MLP the MoE convolution
  (Linen) keeps Linen. The edge embedding would convert around the radial MLP (wrapped with nnx_bridge.from_linen),
  but the backbone builds it in a loop, where no to_linen bridge keeps Linen's names: it is kept Linen for that use,
  and a second run, which finds that TODO, words it the same (which `_two_trees` checks)."""
  files = {'uma/__init__.py': '', 'uma/radial.py': RADIAL, 'uma/moe.py': MOE, 'uma/embedding.py': EMBEDDING,
           'uma/model.py': MODEL}
  result, linen, ported = _two_trees(tmp_path, monkeypatch, files, 'uma.model')
  todos = {o.path: [e.message for e in o.entries if e.kind == 'todo'] for o in result.files}
  assert any(m.startswith('class EdgeDegreeEmbedding kept as Linen: the class UMABackbone of uma/model.py, which '
                          'stays Linen, builds it') for m in todos['uma/embedding.py']), todos
  assert not {c.linen_name for o in result.files for c in o.classes}
  variables = linen.UMABackbone().init(jax.random.key(0), X)
  np.testing.assert_array_equal(ported.UMABackbone().apply(variables, X), linen.UMABackbone().apply(variables, X))
