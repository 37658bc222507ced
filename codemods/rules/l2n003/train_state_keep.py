"""Rewrite with `--train-state keep`: the TrainState stays, built around `nnx.split(model, nnx.Param, ...)` state.

The migration guide's variant: `graphdef, params, other_variables = nnx.split(model, nnx.Param,
...)`, a TrainState subclass with an `other_variables` field, and its steps stay `jax.jit`
steps; `state.apply_fn({'params': params}, x)` becomes
`state.apply_fn(params, state.other_variables)(x)[0]`.
"""

from __future__ import annotations

import libcst as cst

from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.facts import KEPT_PARAMS
from codemods.rules.l2n003.facts import KEPT_STATE
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.syntax import args_with_commas
from codemods.rules.l2n003.syntax import literal_keys
from codemods.rules.l2n003.syntax import single_name_target
from codemods.vocabulary import EVAL_VALUE


def keep_train_state(walk: Walk, call: cst.Call, assign: cst.Assign,
                     arguments: dict[str, cst.BaseExpression]) -> None:
  """`--train-state keep`: the TrainState stays, around `nnx.split` state (the migration guide's variant).

  `graphdef, params, other_variables = nnx.split(model, nnx.Param, ...)`, a TrainState subclass
  with an `other_variables` field, and `TrainState.create(apply_fn=graphdef.apply, ...)`.
  """
  group, tree, run = walk.group, walk.tree, walk.run
  names = ('graphdef', 'other_variables', 'NNXTrainState')
  taken = [n for n in names if n in run.names_in_module or n in run.introduced]
  if taken:
    raise Skip(call, f'keeping the TrainState needs the names {", ".join(taken)}, which are taken')
  if group.record.mode_arguments:
    raise Skip(call, f'a kept TrainState would drop the rng and batch-stat updates of {group.model} between '
                     'steps (nnx.split state in other_variables); use --train-state nnx')
  run.introduced.update({n: id(group) for n in names})
  params = tree.code(arguments['params']) if isinstance(arguments['params'], cst.Name) else 'params'
  base, tx, state = tree.code(call.func.value), tree.code(arguments['tx']), assign.targets[0].target.value
  lines = [f'class NNXTrainState({base}):\n  other_variables: nnx.State\n',
           f'graphdef, {params}, other_variables = nnx.split({group.model}, nnx.Param, ...)\n',
           f'{state} = NNXTrainState.create(apply_fn=graphdef.apply, params={params}, '
           f'other_variables=other_variables, tx={tx})\n']
  line = tree.statement(assign)
  blank = [cst.EmptyLine()] * (2 if isinstance(tree.parent(line), cst.Module) else 1)
  split, create = (cst.parse_statement(code) for code in lines[1:])
  group.statements[line] = [cst.parse_statement(lines[0]).with_changes(leading_lines=line.leading_lines),
                            split.with_changes(leading_lines=blank), create]
  group.kept_state = True
  group.changes.append((call, f'TrainState.create(...) kept around nnx.split({group.model}, nnx.Param, ...) '
                              '(--train-state keep): NNXTrainState adds other_variables'))
  walk.target(assign.targets[0].target, KEPT_STATE)


def kept_attribute(walk: Walk, attribute: cst.Attribute, name: str, parent: cst.CSTNode | None) -> None:
  """A kept TrainState is used as in Linen; `apply_fn` calls change form, `params` is followed."""
  tree = walk.tree
  if name == 'apply_fn' and isinstance(parent, cst.Call) and parent.func is attribute:
    return walk.apply(parent)
  if name == 'params':
    return walk.use(attribute, KEPT_PARAMS)
  assign = tree.parent(parent) if isinstance(parent, cst.Call) else None
  if name == 'apply_gradients' and isinstance(assign, cst.Assign) and assign.value is parent \
      and single_name_target(assign):
    return walk.target(assign.targets[0].target, KEPT_STATE)
  if name in ('apply_gradients', 'step', 'opt_state', 'tx', 'replace'):
    return None
  raise Skip(attribute, f'{tree.code(attribute)} of a kept TrainState is not converted yet')


def kept_step_argument(walk: Walk, call: cst.Call, function: cst.FunctionDef, position: int, kind: str) -> None:
  """A kept TrainState (or its params) passed to a step: the step stays a jax step; its parameter is followed."""
  group, tree = walk.group, walk.tree
  params = function.params
  if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.posonly_params or position >= len(params.params):
    raise Skip(call, f'{function.name.value}: state passed to a parameter that is not a plain positional one')
  name = call.args[position].value
  assign = tree.parent(call)
  if isinstance(assign, cst.Assign) and assign.value is call and isinstance(name, cst.Name):
    targets = [assign.targets[0].target]
    while targets and isinstance(targets[0], cst.Tuple):
      targets = [e.value for e in targets.pop(0).elements] + targets
    group.recognized.update(t for t in targets if isinstance(t, cst.Name) and t.value == name.value)
  param = params.params[position]
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

