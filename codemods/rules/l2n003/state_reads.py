"""Rewrite the reads of the state: `variables['params']['Dense_0']['kernel']` -> `model.dense.kernel[...]`.

A leaf read follows the child names L2N002 recorded (and a layer's own parameter names); a
tree reader (`jax.tree.leaves(params)`) reads `nnx.state(model, nnx.Param)`, the same leaves.
"""

from __future__ import annotations

import libcst as cst

from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.common import module_for
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.facts import collection_of
from codemods.rules.l2n003.syntax import replace_with
from codemods.variable_types import flax_variable_type
from nnx_bridge.layer_table import find_layer


def leaf(walk: Walk, node: cst.CSTNode, keys: list[str | None], state: str | None = None) -> None:
  """`model.block.linear.kernel[...]` for ['params', 'Block_0', 'Dense_0', 'kernel'].

  With `state` (the code of an nnx.State of the model): `<state>['block']['linear']['kernel'][...]`.
  """
  group, tree, run = walk.group, walk.tree, walk.run
  if any(k is None for k in keys):
    raise Skip(node, 'a variables read with keys that are not literal strings')
  if isinstance(tree.parent(node), (cst.AssignTarget, cst.AugAssign, cst.Del)):
    raise Skip(node, 'a write into the variables')
  record, code, layer = group.record, group.model if state is None else state, group.layer
  step = (lambda name: f'.{name}') if state is None else (lambda name: f'[{name!r}]')
  for key in keys[1:]:
    if layer is not None:
      if layer.params.key_renames or layer.params.fuse or layer.params.drop:
        raise Skip(node, f'a read of {key} in a layer whose NNX parameters are laid out differently')
      group.edits[node] = replace_with(f'{code}{step(key)}[...]')
      return
    child = {c.linen_name: c for c in record.children}.get(key) if record else None
    if child is None:
      raise Skip(node, f'a variables read of {key}, which the record of {group.record.nnx_name} does not name')
    code += step(child.nnx_attribute)
    if child.linen_class in run.records:
      record = run.records[child.linen_class]
    elif child.linen_class is not None and find_layer(child.linen_class) is not None:
      record, layer = None, find_layer(child.linen_class)
    elif child.linen_class is not None:
      raise Skip(node, f'a variables read below {key}, a {child.linen_class}')
    else:
      if key != keys[-1]:
        raise Skip(node, f'a variables read below {key}')
      group.edits[node] = replace_with(f'{code}[...]')
      return
  path = ''.join(f'[{k!r}]' for k in keys)
  raise Skip(node, f'a whole tree of variables ({path}) is used by code not converted yet '
                   '(a tree map, a checkpoint save, ...)')


def state_read(walk: Walk, call: cst.Call, node: cst.BaseExpression, kind: str) -> None:
  """`jax.tree.leaves(params)` -> `jax.tree.leaves(nnx.state(model, nnx.Param))`: the same leaves, other paths."""
  group, tree = walk.group, walk.tree
  group.state_reads.append((node, flax_variable_type(collection_of(kind) or '') or 'nnx.Not(nnx.RngState)'))
  group.changes.append((call, f'{tree.code(node)} in {tree.code(call.func)}(...) -> the NNX state of the model '
                              '(the same leaves; its paths are the NNX attribute paths)'))


def finish_state_reads(walk: Walk) -> None:
  """The tree readers read the state of the module their step applies (the model or a view)."""
  group = walk.group
  for node, kind_filter in group.state_reads:
    code = f'nnx.state({module_for(walk, node)}, {kind_filter})'
    group.edits[node] = replace_with(code)

