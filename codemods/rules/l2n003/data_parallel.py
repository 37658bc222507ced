"""Rewrite data parallelism: a `@partial(jax.pmap, axis_name=...)` step given replicated state -> `@nnx.pmap`.

The model and optimizer are broadcast (`in_axes` None), the body and its `pmean`s unchanged;
`jax_utils.replicate` / `unreplicate` of the state go (see `follow.StateWalk`).
"""

from __future__ import annotations

import libcst as cst

from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.facts import StepFunction


def pmap_decorator(walk: Walk, record: StepFunction, names: dict[int, list[str]]) -> None:
  """`@partial(jax.pmap, axis_name='batch')` -> `@nnx.pmap(axis_name='batch', in_axes=(None, None, 0, 0))`.

  The model and optimizer are broadcast (in_axes None) where Linen code mapped replicated
  state over the devices; the other arguments keep their in_axes.
  """
  group, tree = walk.group, walk.tree
  decorator, options = record.pmap
  params = record.node.params.params
  given = options.get('in_axes')
  if given is None:
    axes = ['0'] * len(params)
  elif isinstance(given, cst.Tuple) and len(given.elements) == len(params):
    axes = [tree.code(e.value) for e in given.elements]
  elif isinstance(given, (cst.Integer, cst.Name)):
    axes = [tree.code(given)] * len(params)
  else:
    raise Skip(given, f'{record.node.name.value}: jax.pmap in_axes that is not a literal int or tuple')
  new_axes = [a for position, axis in enumerate(axes) for a in (['None'] * len(names[position])
                                                                if position in names else [axis])]
  args = [f'axis_name={tree.code(options["axis_name"])}'] if 'axis_name' in options else []
  args.append(f'in_axes=({", ".join(new_axes)}{"," if len(new_axes) == 1 else ""})')
  code = f'nnx.pmap({", ".join(args)})'
  group.edits[decorator] = lambda updated: updated.with_changes(decorator=cst.parse_expression(code))
  group.changes.append((decorator, f'@{tree.code(decorator.decorator)} -> @{code} on {record.node.name.value}: '
                                   'the model and optimizer are broadcast to the devices'))

