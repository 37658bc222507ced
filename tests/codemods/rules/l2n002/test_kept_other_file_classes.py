"""A compact body that binds a Linen class another file keeps Linen to a local (jax-md's `act =
GateActivation(..., name='act')` in an arm of an if, then `act(gating, x)`): no record of that class comes, so the
class building it stays Linen, with the reason at the construction, and the program runs as before. Converting it
would leave a Linen module built inside an NNX `__call__`, which fails at its first call."""

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
  assert (14, 'class Edgewise left as Linen: GateActivation, a Linen module class of another file, stays Linen there '
              '(see its TODO); L2N002 wraps only Linen classes of the same file with nnx_bridge.from_linen: convert '
              'it first, or move it into this file') in todos['edges/blocks.py'], todos
  assert not {c.linen_name for o in result.files for c in o.classes}
  variables = linen.Edgewise().init(jax.random.key(0), X)
  np.testing.assert_array_equal(ported.Edgewise().apply(variables, X), linen.Edgewise().apply(variables, X))
