"""Rewrite with `--train-state keep`: the TrainState stays, built around `nnx.split(model, nnx.Param, ...)` state.

The migration guide's variant: `graphdef, params, other_variables = nnx.split(model, nnx.Param,
...)`, a TrainState subclass with an `other_variables` field, and its steps stay `jax.jit`
steps; `state.apply_fn({'params': params}, x)` becomes
`state.apply_fn(params, state.other_variables)(x)[0]`. A project's subclass (`class
TrainState(train_state.TrainState): metrics: Metrics`) gets the `other_variables` field itself, and
its other fields keep what they hold; such a subclass is kept even without `--train-state keep`
when a field holds state that is neither the model's nor the optimizer's (clu metrics), since
only a functional TrainState carries it as the Linen code does. A factory returning the kept
state stays as it is; its caller's `state` is followed.
"""

from __future__ import annotations

import libcst as cst

from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.facts import KEPT_PARAMS
from codemods.rules.l2n003.facts import KEPT_STATE
from codemods.rules.l2n003.facts import RNG_KEY
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.facts import collection
from codemods.rules.l2n003.facts import describe
from codemods.rules.l2n003.syntax import args_with_commas
from codemods.rules.l2n003.syntax import literal_keys
from codemods.rules.l2n003.syntax import single_name_target
from codemods.vocabulary import EVAL_VALUE


def keep_train_state(walk: Walk, call: cst.Call, statement: cst.Assign | cst.Return,
                     arguments: dict[str, cst.BaseExpression], fields: dict[str, str | None],
                     why: str | None = None) -> None:
  """`--train-state keep` (or `why` the TrainState must stay): the TrainState stays, around `nnx.split` state (the
  migration guide's variant).

  `graphdef, params, other_variables = nnx.split(model, nnx.Param, ...)` before it, and `TrainState.create(
  apply_fn=graphdef.apply, ..., other_variables=other_variables)`: flax's TrainState gets a subclass `NNXTrainState`
  with that field, a project's subclass (`class TrainState(train_state.TrainState): metrics: Metrics`) gets the
  field added. Its other fields keep what they are given (clu metrics, an EMA of the params).
  """
  group, tree, run = walk.group, walk.tree, walk.run
  subclass = tree.class_def(call.func.value) if fields else None
  names = ('graphdef', 'other_variables') + (() if subclass is not None else ('NNXTrainState',))
  taken = [n for n in names if n in run.names_in_module or n in run.introduced]
  if taken:
    raise Skip(call, f'keeping the TrainState needs the names {", ".join(taken)}, which are taken')
  held = [name for name, kind in fields.items() if kind not in (None, RNG_KEY, collection('params'))]
  if held:
    raise Skip(arguments[held[0]], f'{why + ": " if why else ""}a kept TrainState with the field {held[0]} holding '
                                   f'{describe(fields[held[0]])} is not converted yet (nnx.split puts it in '
                                   'other_variables)')
  if group.record.mode_arguments:
    raise Skip(call, f'{why + ": " if why else ""}a kept TrainState would drop the rng and batch-stat updates of '
                     f'{group.model} between steps (nnx.split state in other_variables)'
                     + ('; use --train-state nnx' if why is None else ''))
  run.introduced.update({n: id(group) for n in names})
  group.kept_fields = tuple(fields)
  params = tree.code(arguments['params']) if isinstance(arguments['params'], cst.Name) else 'params'
  split = cst.parse_statement(f'graphdef, {params}, other_variables = nnx.split({group.model}, nnx.Param, ...)\n')
  line = tree.statement(statement)
  if subclass is None and isinstance(statement, cst.Assign):
    _new_subclass(walk, call, statement, line, split, params)
  else:
    given_params = [name for name, kind in fields.items() if kind == collection('params')]  # `ema_params=params`
    _add_field(walk, call, subclass, line, split, params, given_params)
  group.kept_state = True
  group.changes.append((call, f'TrainState.create(...) kept around nnx.split({group.model}, nnx.Param, ...) '
                              f'({why or "--train-state keep"})'
                              + (': NNXTrainState adds other_variables' if subclass is None else '')))
  if isinstance(statement, cst.Assign):
    walk.target(statement.targets[0].target, KEPT_STATE)
  else:
    walk.use(call, KEPT_STATE)


def _new_subclass(walk: Walk, call: cst.Call, assign: cst.Assign, line: cst.BaseStatement,
                  split: cst.SimpleStatementLine, params: str) -> None:
  """`state = train_state.TrainState.create(...)` -> `class NNXTrainState(train_state.TrainState)` adding
  `other_variables`, the split, and `state = NNXTrainState.create(...)`."""
  tree, group = walk.tree, walk.group
  base, state = tree.code(call.func.value), assign.targets[0].target.value
  arguments = {a.keyword.value: a.value for a in call.args}
  subclass = cst.parse_statement(f'class NNXTrainState({base}):\n  other_variables: nnx.State\n')
  create = cst.parse_statement(f'{state} = NNXTrainState.create(apply_fn=graphdef.apply, params={params}, '
                               f'other_variables=other_variables, tx={tree.code(arguments["tx"])})\n')
  blank = [cst.EmptyLine()] * (2 if isinstance(tree.parent(line), cst.Module) else 1)
  group.statements[line] = [subclass.with_changes(leading_lines=line.leading_lines),
                            split.with_changes(leading_lines=blank), create]


def _add_field(walk: Walk, call: cst.Call, subclass: cst.ClassDef | None, line: cst.BaseStatement,
               split: cst.SimpleStatementLine, params: str, given_params: list[str]) -> None:
  """The split before `line`; `create(...)` given `graphdef.apply`, the split's params (also for the fields
  `given_params`, which Linen gave the params: an EMA of them) and `other_variables`; the
  project's subclass gets the field `other_variables: nnx.State` (flax's TrainState returned by a factory gets
  `NNXTrainState`, placed before the factory)."""
  tree, group = walk.tree, walk.group
  group.statements[line] = [split.with_changes(leading_lines=line.leading_lines), line]
  group.edits.setdefault(line, lambda updated: updated.with_changes(leading_lines=[]))
  field = cst.parse_statement('other_variables: nnx.State\n')
  if subclass is not None:
    group.edits[subclass] = lambda updated: updated.with_changes(
        body=updated.body.with_changes(body=[*updated.body.body, field]))
    group.changes.append((subclass, f'class {subclass.name.value} adds the field other_variables: nnx.State'))
    func = None
  else:
    function = tree.enclosing_function(line)
    if not isinstance(function, cst.FunctionDef) or not isinstance(tree.parent(function), cst.Module):
      raise Skip(call, f'{tree.code(call.func)}(...) returned from a function not at the top of the module')
    top = tree.statement(function)
    made = cst.parse_statement(f'class NNXTrainState({tree.code(call.func.value)}):\n  other_variables: nnx.State\n')
    group.statements[top] = [made.with_changes(leading_lines=top.leading_lines), top]
    group.edits[top] = lambda updated: updated.with_changes(leading_lines=[cst.EmptyLine()] * 2)
    func = cst.Name('NNXTrainState')
  replaced = {'apply_fn': cst.parse_expression('graphdef.apply'), 'params': cst.Name(params),
              **{name: cst.Name(params) for name in given_params}}

  def edit(updated: cst.Call) -> cst.Call:
    args = [a.with_changes(value=replaced[a.keyword.value]) if a.keyword.value in replaced else a
            for a in updated.args]
    last = args[-1]
    added = cst.Arg(cst.Name('other_variables'), keyword=cst.Name('other_variables'), comma=last.comma,
                    equal=cst.AssignEqual(cst.SimpleWhitespace(''), cst.SimpleWhitespace('')))
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(' ')))
    made = updated.with_changes(args=[*args, added])
    return made.with_changes(func=made.func.with_changes(value=func)) if func is not None else made
  group.edits[call] = edit


def kept_attribute(walk: Walk, attribute: cst.Attribute, name: str, parent: cst.CSTNode | None) -> None:
  """A kept TrainState is used as in Linen; `apply_fn` calls change form, `params` is followed."""
  tree = walk.tree
  if name == 'apply_fn' and isinstance(parent, cst.Call) and parent.func is attribute:
    return walk.apply(parent)
  if name == 'params':
    return walk.use(attribute, KEPT_PARAMS)
  assign = tree.parent(parent) if isinstance(parent, cst.Call) else None
  if name in ('apply_gradients', 'replace') and isinstance(assign, cst.Assign) and assign.value is parent \
      and single_name_target(assign):
    return walk.target(assign.targets[0].target, KEPT_STATE)
  if name in ('apply_gradients', 'step', 'opt_state', 'tx', 'replace') or name in walk.group.kept_fields:
    return None  # as in Linen: the fields of the project's subclass hold what they held
  raise Skip(attribute, f'{tree.code(attribute)} of a kept TrainState is not converted yet')


def kept_step_argument(walk: Walk, call: cst.Call, function: cst.FunctionDef, arg: cst.Arg, kind: str) -> None:
  """A kept TrainState (or its params) passed to a step, by position or keyword: the step stays a jax step; its
  parameter is followed."""
  group, tree = walk.group, walk.tree
  params = function.params
  if isinstance(params.star_arg, cst.Param) or params.posonly_params or params.star_kwarg:
    raise Skip(call, f'{function.name.value}: state passed to a function taking *args, **kwargs or '
                     'positional-only parameters')
  if arg.keyword is None:
    position = [a for a in call.args if a.keyword is None].index(arg)
    param = params.params[position] if position < len(params.params) else None
  else:
    param = next((p for p in (*params.params, *params.kwonly_params) if p.name.value == arg.keyword.value), None)
  if param is None:
    raise Skip(call, f'{function.name.value}: state passed to a parameter it does not have')
  name = arg.value
  assign = tree.parent(call)
  if isinstance(assign, cst.Assign) and assign.value is call and isinstance(name, cst.Name):
    targets = [assign.targets[0].target]
    while targets and isinstance(targets[0], cst.Tuple):
      targets = [e.value for e in targets.pop(0).elements] + targets
    group.recognized.update(t for t in targets if isinstance(t, cst.Name) and t.value == name.value)
  group.recognized.add(param)
  group.kept_steps.add(function)
  walk.name(tree.scope(function.body), param.name.value, kind)


def kept_apply(walk: Walk, call: cst.Call) -> None:
  """`state.apply_fn({'params': params}, x, ...)` -> `state.apply_fn(params, state.other_variables)(x)[0]`."""
  group, tree = walk.group, walk.tree
  first = call.args[0].value
  if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == 'apply_fn'
          and isinstance(call.func.value, cst.Name) and isinstance(first, cst.Dict)
          and literal_keys(first) == ['params']):
    raise Skip(call, f'{tree.code(call.func)} with a kept TrainState: only state.apply_fn({{"params": ...}}, ...) '
                     'is converted')
  kept, mode = [], None
  for arg in call.args[1:]:
    name = arg.keyword.value if arg.keyword is not None else None
    if name in group.record.mode_arguments and isinstance(arg.value, cst.Name) and arg.value.value in ('True', 'False'):
      mode = (arg.value.value == 'True') == EVAL_VALUE[name]
    elif name == 'rngs':
      group.changes.append((arg, f'{tree.code(call.func)}(..., rngs=...) dropped: the model has no rng streams'))
    elif arg.star or (name is not None and name not in group.record.call_arguments):
      raise Skip(arg, f'{tree.code(call.func)} with {name or "*args"}= and a kept TrainState')
    else:
      kept.append(arg)
  if mode is not None:
    group.kept_modes.add(mode)
    if len(group.kept_modes) > 1:
      raise Skip(call, 'a kept TrainState applied in train and eval mode (its graphdef holds one mode)')
  group.applies[call] = None
  state = call.func.value.value

  def edit(updated: cst.Call) -> cst.BaseExpression:
    inner = cst.Call(updated.func, args_with_commas([cst.Arg(updated.args[0].value.elements[0].value),
                                                      cst.Arg(cst.parse_expression(f'{state}.other_variables'))]))
    args = [updated.args[call.args.index(a)].with_changes(
        comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=cst.SimpleWhitespace('')) for a in kept]
    return cst.Subscript(cst.Call(inner, args_with_commas(args)), [cst.SubscriptElement(cst.Index(cst.Integer('0')))])
  group.edits[call] = edit
  group.changes.append((call, f'{tree.code(call.func)}({{"params": params}}, ...) -> '
                              f'{state}.apply_fn(params, {state}.other_variables)(...)[0]'))

