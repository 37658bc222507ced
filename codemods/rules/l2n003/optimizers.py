"""Rewrite the optimizers: `tx.init(params)` / `TrainState.create(...)` -> `nnx.Optimizer(model, tx, wrt=nnx.Param)`.

`tx.update` + `optax.apply_updates` and `state.apply_gradients(grads=grads)` become
`optimizer.update(model, grads)`; `params = jax.tree.map(f, params, grads)` becomes
`nnx.update(model, jax.tree.map(f, nnx.state(model, nnx.Param), grads))`.
"""

from __future__ import annotations

import libcst as cst

from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.common import optimizer_name
from codemods.rules.l2n003.common import replace_statement
from codemods.rules.l2n003.facts import OPT_STATE
from codemods.rules.l2n003.facts import OPTAX_UPDATES
from codemods.rules.l2n003.facts import RNG_KEY
from codemods.rules.l2n003.facts import TRAIN_STATE
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.facts import collection
from codemods.rules.l2n003.syntax import args_with_commas
from codemods.rules.l2n003.syntax import single_name_target


def train_state_optimizer(walk: Walk, call: cst.Call, assign: cst.Assign,
                          arguments: dict[str, cst.BaseExpression]) -> None:
  """`state = TrainState.create(apply_fn=model.apply, params=params, tx=tx)` -> an nnx.Optimizer."""
  group, tree = walk.group, walk.tree
  optimizer, tx = optimizer_name(walk, call), tree.code(arguments['tx'])
  replace_statement(walk, assign, f'{optimizer} = nnx.Optimizer({group.model}, {tx}, wrt=nnx.Param)')
  group.changes.append((call, f'TrainState.create(...) -> {optimizer} = nnx.Optimizer({group.model}, {tx}, '
                              f'wrt=nnx.Param); the TrainState\'s uses go to {group.model} and {optimizer}'))
  walk.target(assign.targets[0].target, TRAIN_STATE)


def train_state_attribute(walk: Walk, attribute: cst.Attribute, name: str, parent: cst.CSTNode | None) -> bool:
  """`state.step` -> `optimizer.step[...]`, `state = state.apply_gradients(grads=g)` (or its `return`) ->
  `optimizer.update(model, g)`, `state.replace(<fields>=...)` -> `state`.

  False for any other attribute of the TrainState.
  """
  group, tree = walk.group, walk.tree
  if name == 'step':
    optimizer = optimizer_name(walk, attribute)
    group.edits[attribute] = lambda _: cst.parse_expression(f'{optimizer}.step[...]')
    return True
  if name == 'replace' and isinstance(parent, cst.Call) and parent.args \
      and all(a.keyword is not None and a.keyword.value in group.fields for a in parent.args):
    # `state.replace(batch_stats=..., dropout_rng=new_rng)` -> `state`: the NNX model holds that state itself
    group.done.add(parent)
    group.edits[parent] = lambda updated: updated.func.value
    holds = ('its own nnx.Rngs' if all(group.fields[a.keyword.value] == RNG_KEY for a in parent.args)
             else 'its state, updated in place')
    group.changes.append((parent, f'{tree.code(parent)} -> {tree.code(attribute.value)}: the NNX model holds {holds}'))
    walk.use(parent, TRAIN_STATE)
    return True
  if name != 'apply_gradients' or not isinstance(parent, cst.Call):
    return False
  assign = tree.parent(parent)
  grads = [a for a in parent.args if a.keyword is not None and a.keyword.value == 'grads']
  others = [a for a in parent.args if a not in grads]  # fields of a subclass: state the NNX model updated itself
  assigned = isinstance(assign, cst.Assign) and assign.value is parent and single_name_target(assign)
  returned = isinstance(assign, cst.Return) and assign.value is parent and len(tree.statement(assign).body) == 1
  in_return = isinstance(assign, cst.Element) and isinstance(tree.parent(assign), cst.Tuple) \
      and isinstance(tree.parent(tree.parent(assign)), cst.Return) and len(tree.statement(assign).body) == 1
  if not (grads and all(a.keyword is not None and a.keyword.value in group.fields for a in others)
          and (assigned or returned or in_return)):
    return False
  group.done.add(parent)
  optimizer = optimizer_name(walk, parent)
  update = f'{optimizer}.update({group.model}, {tree.code(grads[0].value)})'
  group.changes.append((parent, f'state.apply_gradients(grads=...) -> {optimizer}.update({group.model}, grads)'))
  if returned or in_return:  # `return state.apply_gradients(grads=grads)[, loss]`: the update, then the return
    line = tree.statement(assign)  # without the state (`training_steps.returned` prunes it)
    made = cst.parse_statement(f'{update}\n').with_changes(leading_lines=line.leading_lines)
    group.statements[line] = [made] if returned else [made, line]
    group.edits.setdefault(line, lambda updated: updated.with_changes(leading_lines=[]))
    walk.use(parent, TRAIN_STATE)
    return True
  group.edits[assign] = lambda _: cst.Expr(cst.parse_expression(update))
  walk.target(assign.targets[0].target, TRAIN_STATE)
  return True


def optimizer_init(walk: Walk, call: cst.Call) -> None:
  """`opt_state = tx.init(params)` -> `optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)`."""
  group, tree = walk.group, walk.tree
  assign = tree.parent(call)
  if not (isinstance(assign, cst.Assign) and assign.value is call and single_name_target(assign)):
    raise Skip(call, f'{tree.code(call)} not assigned to one name')
  if group.optimizer is not None:
    raise Skip(call, f'a second optimizer for {group.model}')
  optimizer, tx = optimizer_name(walk, call), tree.code(call.func.value)
  replace_statement(walk, assign, f'{optimizer} = nnx.Optimizer({group.model}, {tx}, wrt=nnx.Param)')
  group.changes.append((call, f'{tree.code(call)} -> {optimizer} = nnx.Optimizer({group.model}, {tx}, wrt=nnx.Param)'))
  walk.target(assign.targets[0].target, OPT_STATE)


def optax_update(walk: Walk, call: cst.Call) -> None:
  """`updates, opt_state = tx.update(grads, opt_state, params)`: removed; `updates` followed."""
  group, tree = walk.group, walk.tree
  if call in group.done:
    return
  group.done.add(call)
  assign = tree.parent(call)
  if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1
          and isinstance(assign.targets[0].target, cst.Tuple) and len(assign.targets[0].target.elements) == 2
          and len(call.args) in (2, 3) and all(a.keyword is None for a in call.args)):
    raise Skip(call, f'{tree.code(call)} not written as `updates, opt_state = tx.update(grads, opt_state, params)`')
  updates, opt_state = (e.value for e in assign.targets[0].target.elements)
  group.statements[tree.statement(assign)] = None
  for value in call.args[1:]:
    group.visited.add(value.value)
  walk.target(opt_state, OPT_STATE)
  walk.target(updates, OPTAX_UPDATES)


def apply_updates(walk: Walk, call: cst.Call) -> None:
  """`params = optax.apply_updates(params, updates)` -> `optimizer.update(model, grads)`."""
  group, tree = walk.group, walk.tree
  if call in group.done:
    return
  group.done.add(call)
  assign = tree.parent(call)
  updates = call.args[1].value if len(call.args) == 2 else None
  if not (isinstance(assign, cst.Assign) and assign.value is call and single_name_target(assign)
          and isinstance(updates, cst.Name)):
    raise Skip(call, f'{tree.code(call)} not written as `params = optax.apply_updates(params, updates)`')
  made = [a.node for a in tree.assignments(tree.scope(updates), updates.value)]
  assign_of = made[0] if len(made) == 1 else None
  while assign_of is not None and not isinstance(assign_of, (cst.Assign, cst.BaseStatement)):
    assign_of = tree.parent(assign_of)
  if not (isinstance(assign_of, cst.Assign) and isinstance(assign_of.value, cst.Call)
          and isinstance(assign_of.value.func, cst.Attribute) and assign_of.value.func.attr.value == 'update'):
    raise Skip(call, f'{tree.code(updates)} does not come from one `tx.update(grads, opt_state, params)`')
  optimizer = optimizer_name(walk, call)
  grads = tree.code(assign_of.value.args[0].value)
  replace_statement(walk, assign, f'{optimizer}.update({group.model}, {grads})')
  group.changes.append((call, f'tx.update + optax.apply_updates -> {optimizer}.update({group.model}, {grads})'))
  optax_update(walk, assign_of.value)
  group.visited.update(a.value for a in call.args)
  walk.target(assign.targets[0].target, collection('params'))


def tree_map_update(walk: Walk, call: cst.Call, node: cst.BaseExpression) -> None:
  """`params = jax.tree.map(f, params, grads)` -> `nnx.update(model, jax.tree.map(f, nnx.state(model, nnx.Param), ...))`."""
  group, tree = walk.group, walk.tree
  assign = tree.parent(call)
  if not (isinstance(assign, cst.Assign) and assign.value is call and single_name_target(assign)):
    raise Skip(call, f'{tree.code(call)} over the params, not assigned back to the params')
  position = [a.value for a in call.args].index(node)

  def edit(updated: cst.Call) -> cst.Call:
    state = cst.parse_expression(f'nnx.state({group.model}, nnx.Param)')
    args = [a.with_changes(value=state) if i == position else a for i, a in enumerate(updated.args)]
    return cst.Call(cst.parse_expression('nnx.update'), args_with_commas(
        [cst.Arg(cst.Name(group.model)), cst.Arg(updated.with_changes(args=args))]))
  group.edits[call] = edit
  group.edits[assign] = lambda updated: cst.Expr(updated.value)
  group.changes.append((call, f'params = {tree.code(call.func)}(...) -> nnx.update({group.model}, ...)'))
  walk.target(assign.targets[0].target, collection('params'))

