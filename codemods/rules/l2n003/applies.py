"""Rewrite: `model.apply(variables, x, ...)` -> `model(x)`, `method=` -> a method call, `mutable=` -> in place."""

from __future__ import annotations

import libcst as cst

from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.common import mode_owner
from codemods.rules.l2n003.facts import UPDATES
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.syntax import args_with_commas
from codemods.rules.l2n003.syntax import is_method
from codemods.rules.l2n003.syntax import literal_keys
from codemods.rules.l2n003.syntax import mutable_collections
from codemods.vocabulary import EVAL_VALUE
from codemods.vocabulary import IN_PLACE_COLLECTIONS_EXCLUDED


def is_apply(walk: Walk, call: cst.Call) -> bool:
  """`model.apply(...)`, or `state.apply_fn(...)` (checked to be the model's TrainState at the end)."""
  group = walk.group
  func = call.func
  return any(is_method(func, module, 'apply') for module in (group.model, *group.twins)) or (
      isinstance(func, cst.Attribute) and func.attr.value == 'apply_fn' and isinstance(func.value, cst.Name))


def convert_apply(walk: Walk, call: cst.Call) -> None:
  """`model.apply(variables, x, train=False)` -> `model(x)`, the mode recorded for its statement or step."""
  group, tree = walk.group, walk.tree
  method, mode, mutable, drop = None, None, None, [call.args[0]]
  for arg in call.args[1:]:
    name = arg.keyword.value if arg.keyword is not None else None
    if arg.star:
      raise Skip(call, f'{group.model}.apply with *args / **kwargs')
    if name == 'method':
      method = method_name(walk, arg.value)
    elif name in group.record.mode_arguments:
      if not (isinstance(arg.value, cst.Name) and arg.value.value in ('True', 'False')):
        raise Skip(arg, f'{group.model}.apply with {name}= not a literal True / False')
      mode = (arg.value.value == 'True') == EVAL_VALUE[name]
    elif name == 'rngs':
      streams = literal_keys(arg.value)
      if streams is None:
        raise Skip(arg, f'{group.model}.apply with rngs= that is not a dict with literal stream names')
      group.changes.append((arg, f'{tree.code(call.func)}(..., rngs=...) keys for {", ".join(streams)} dropped: the '
                                 f'NNX model draws them from the streams of its own nnx.Rngs'))
    elif name == 'mutable':
      mutable = mutable_collections(arg.value)
      if mutable is None or any(c in IN_PLACE_COLLECTIONS_EXCLUDED for c in mutable):
        raise Skip(arg, f'{group.model}.apply with mutable={tree.code(arg.value)} (only collections NNX '
                        'updates in place, e.g. batch_stats or cache, are converted)')
    elif name is None or name in group.record.call_arguments:
      continue
    else:
      raise Skip(arg, f'{group.model}.apply with {name}=')
    drop.append(arg)
  group.applies[call] = method
  module = group.model
  if any(is_method(call.func, m, 'apply') for m in (group.model, *group.twins)):
    group.model_uses.add(call.func.value)
    module = call.func.value.value
  if module != group.model and mode is not None:
    raise Skip(call, f'{module}.apply with a train/eval argument (set the mode on the view by hand)')
  target = f'{module}.{method}' if method else module
  kept = [a for a in call.args if a not in drop]
  group.edits[call] = lambda updated: updated.with_changes(
      func=cst.parse_expression(target), whitespace_before_args=cst.SimpleWhitespace(''),
      args=args_with_commas([updated.args[call.args.index(a)].with_changes(
          comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=cst.SimpleWhitespace('')) for a in kept]))
  group.changes.append((call, f'{tree.code(call.func)}(variables, ...) -> {target}(...)'))
  if mutable is not None:
    mutable_result(walk, call)
  owner = mode_owner(walk, call)
  group.applied.setdefault(owner, set()).add(module)
  if mode is not None:
    if group.modes.get(owner, mode) != mode:
      raise Skip(call, f'{group.model}.apply in train and eval mode in one statement or step')
    group.modes[owner] = mode
  elif len(group.record.mode_arguments) == 1 and group.record.mode_arguments[0] in group.record.mode_defaults \
      and method is None:  # `train: bool = True` not passed: the apply runs in the mode of its default
    name = group.record.mode_arguments[0]
    mode = group.record.mode_defaults[name] == EVAL_VALUE[name]
    if group.modes.get(owner, mode) != mode:
      raise Skip(call, f'{group.model}.apply in train and eval mode in one statement or step')
    group.modes[owner] = mode
  elif group.record.mode_arguments and method is None:
    group.modes.setdefault(owner, None)


def mutable_result(walk: Walk, call: cst.Call) -> None:
  """`out, updates = model.apply(..., mutable=[...])` -> `out = model(...)`; `updates` followed."""
  group, tree = walk.group, walk.tree
  assign = tree.parent(call)
  if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1
          and isinstance(assign.targets[0].target, cst.Tuple) and len(assign.targets[0].target.elements) == 2):
    raise Skip(call, f'{group.model}.apply(..., mutable=...) whose result is not unpacked as `out, updates = ...`')
  _, updates = (e.value for e in assign.targets[0].target.elements)
  group.edits[assign] = lambda updated: updated.with_changes(
      targets=[cst.AssignTarget(updated.targets[0].target.elements[0].value)])
  group.changes.append((call, f'{tree.code(call.func)}(..., mutable=...): the NNX call updates the model in '
                              f'place; {tree.code(updates)} goes'))
  walk.target(updates, UPDATES)


def method_name(walk: Walk, value: cst.BaseExpression) -> str:
  """`'encode'` or `Model.encode` -> 'encode'."""
  group = walk.group
  if isinstance(value, cst.SimpleString) and value.evaluated_value.isidentifier():
    return value.evaluated_value
  if isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) \
      and value.value.value == group.record.nnx_name:
    return value.attr.value
  raise Skip(value, f'{group.model}.apply with a method= that is not a method name')


def check_applies(walk: Walk) -> None:
  """Each collection an apply was given must be this model's state: the NNX call drops them."""
  group, tree = walk.group, walk.tree
  for call in group.applies:
    if call.func.attr.value == 'apply_fn' and call.func.value not in group.visited:
      raise Skip(call, f'{tree.code(call.func)} of something other than the TrainState of {group.model}')
    first = call.args[0].value
    if isinstance(first, cst.Dict) and literal_keys(first) is None:
      raise Skip(first, f'{group.model}.apply with a variables dict that is not a literal dict of collections')
    for value in [e.value for e in first.elements] if isinstance(first, cst.Dict) else [first]:
      if value not in group.visited:
        raise Skip(value, f'{group.model}.apply with variables ({tree.code(value)}) that are not the state '
                          f'of {group.model} from its init')

