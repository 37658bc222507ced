"""Rewrite data parallelism: a `@partial(jax.pmap, axis_name=...)` step given replicated state -> `@nnx.pmap`
(and `p_step = jax.pmap(step, axis_name=...)` -> `nnx.pmap(step, ...)`).

The model and optimizer are broadcast (`in_axes` None), the body and its `pmean`s unchanged;
`jax_utils.replicate` / `unreplicate` of the state go (see `follow.StateWalk`).
"""

from __future__ import annotations

import libcst as cst

from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.facts import StepFunction


def pmap_decorator(walk: Walk, record: StepFunction, names: dict[int, list[str]]) -> None:
  """`@partial(jax.pmap, axis_name='batch')` -> `@nnx.pmap(axis_name='batch', in_axes=(None, None, 0, 0))`, or the
  same for the wrapper call `jax.pmap(step, axis_name='batch')`.

  The model and optimizer are broadcast (in_axes None) where Linen code mapped replicated
  state over the devices; the other arguments keep their in_axes.
  """
  group, tree = walk.group, walk.tree
  decorator, options = record.pmap
  params = list(record.node.params.params)
  wrapped = decorator.args[0].value if isinstance(decorator, cst.Call) else None
  if isinstance(wrapped, cst.Call):  # functools.partial(step, config=...): in_axes cover the other parameters
    bound = {a.keyword.value for a in wrapped.args[1:]}
    if {p.name.value for p in params[len(params) - len(bound):]} != bound:
      raise Skip(wrapped, f'{record.node.name.value}: functools.partial binds parameters that are not its last ones')
    params = params[:len(params) - len(bound)]
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
  if isinstance(decorator, cst.Call):  # `p_step = jax.pmap(step, ...)`, the step's wrapper
    code = f'nnx.pmap({", ".join([tree.code(decorator.args[0].value), *args])})'
    group.edits[decorator] = lambda _: cst.parse_expression(code)
    group.changes.append((decorator, f'{tree.code(decorator)} -> {code}: the model and optimizer are broadcast to '
                                     'the devices'))
    return
  code = f'nnx.pmap({", ".join(args)})'
  group.edits[decorator] = lambda updated: updated.with_changes(decorator=cst.parse_expression(code))
  group.changes.append((decorator, f'@{tree.code(decorator.decorator)} -> @{code} on {record.node.name.value}: '
                                   'the model and optimizer are broadcast to the devices'))

