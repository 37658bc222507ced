"""Rewrite the training steps: a step given the state takes `model` / `optimizer`, its loss `nnx.grad`s the model.

A step function defined in the file and given the params, batch stats, optimizer state or
TrainState takes the model (and optimizer) in their place; `@jax.jit` becomes `@nnx.jit`;
`jax.grad` / `jax.value_and_grad(loss_fn)(params)` become `nnx.grad` / `nnx.value_and_grad(loss_fn)(model)`;
the state it returned goes from its `return` and from the unpacking at each call site.
"""

from __future__ import annotations

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.common import mode_owner
from codemods.rules.l2n003.common import module_for
from codemods.rules.l2n003.common import rewrite_call
from codemods.rules.l2n003.common import rewrite_parameters
from codemods.rules.l2n003.common import state_names
from codemods.rules.l2n003.facts import KEPT_PARAMS
from codemods.rules.l2n003.facts import MODEL_STATE
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.facts import StepFunction
from codemods.rules.l2n003.facts import collection
from codemods.rules.l2n003.facts import collection_of
from codemods.rules.l2n003.facts import describe
from codemods.rules.l2n003.syntax import pruned_value
from codemods.rules.l2n003.syntax import replace_with
from codemods.rules.l2n003.syntax import resolves_to
from codemods.rules.l2n003.syntax import transform_of
from codemods.rules.l2n003.syntax import without_trailing_comma
from codemods.rules.l2n003.tree import Tree
from codemods.vocabulary import GRADS
from codemods.vocabulary import PMAP_OPTIONS


def wrapped_step(walk: Walk, name: cst.Name) -> tuple[cst.Call, cst.FunctionDef] | None:
  """`(jax.pmap(step, 'batch'), step)` when `name` is bound once to a jax.jit / jax.pmap of a step defined in the
  file (`p_train_step = jax.pmap(train_step, axis_name='batch')`, as flax's and transformers' examples make it),
  also through `functools.partial(step, config=...)` binding keywords, or rebinds the step's own name after its
  `def` (`train_step = jax.jit(train_step)`)."""
  tree = walk.tree
  scope = tree.scope_or_none(name)
  assignments = list(scope[name.value]) if scope is not None else []
  targets = [a.node for a in assignments if isinstance(a.node, cst.Name)]
  if len(targets) != 1 or not isinstance(tree.parent(targets[0]), cst.AssignTarget):
    return None
  assign = tree.parent(tree.parent(targets[0]))
  wrapper = assign.value if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
  if not (isinstance(wrapper, cst.Call) and wrapper.args and wrapper.args[0].keyword is None
          and transform_of(wrapper.func)[0] is not None):
    return None
  inner = _partial_target(wrapper.args[0].value)
  if not isinstance(inner, cst.Name):
    return None
  if inner.value == name.value:  # the rebinding: the step's `def`, then `step = jax.jit(step)`
    defs = [a.node for a in assignments if isinstance(a.node, cst.FunctionDef)]
    if len(assignments) == 2 and len(defs) == 1 and tree.position(defs[0]) < tree.position(assign):
      return wrapper, defs[0]
    return None
  function = tree.function_def(inner) if len(assignments) == 1 else None
  return (wrapper, function) if function is not None else None


def _partial_target(expression: cst.BaseExpression) -> cst.BaseExpression:
  """`step` for `functools.partial(step, config=...)` (keywords only: the positions stay), else `expression`."""
  if isinstance(expression, cst.Call) and (cst.helpers.get_full_name_for_node(expression.func) or '').endswith(
      'partial') and expression.args and all(a.keyword is not None for a in expression.args[1:]):
    return expression.args[0].value
  return expression


def step_argument(walk: Walk, call: cst.Call, function: cst.FunctionDef, position: int, kind: str,
                  wrapper: cst.Call | None = None) -> None:
  """State passed to a step function defined in this file (or to the alias its `wrapper`, a jax.jit / jax.pmap
  of it, is bound to): the parameter is followed as state."""
  group, tree = walk.group, walk.tree
  if kind not in (*MODEL_STATE, collection('params')) and collection_of(kind) is None:
    raise Skip(call, f'{describe(kind)} passed to {function.name.value}')
  params = function.params
  if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.posonly_params or position >= len(params.params):
    raise Skip(call, f'{function.name.value}: state passed to a parameter that is not a plain positional one')
  record = group.functions.setdefault(function, StepFunction(function))
  if wrapper is not None and record.wrapper not in (None, wrapper):
    raise Skip(call, f'{function.name.value} is wrapped by jax.jit / jax.pmap in two places')
  record.wrapper = record.wrapper or wrapper
  record.calls.add(call)
  if record.kinds.get(position, kind) != kind:
    raise Skip(call, f'{function.name.value} receives different state in parameter {position}')
  if position in record.kinds:
    return
  record.kinds[position] = kind
  _decorators(walk, record)
  param = params.params[position]
  group.recognized.add(param)
  walk.name(tree.scope(function.body), param.name.value, kind)


def _decorators(walk: Walk, record: StepFunction) -> None:
  """`@jax.jit` / `@partial(jax.jit, donate_argnums=...)` -> `@nnx.jit`; `jax.pmap` -> `nnx.pmap` (at the end)."""
  group, tree, run = walk.group, walk.tree, walk.run
  function = record.node
  if function in group.done:
    return
  group.done.add(function)
  for decorator in function.decorators:
    expression = decorator.decorator
    transform, options = transform_of(expression)
    allowed = PMAP_OPTIONS if transform == 'pmap' else ('donate_argnums',)
    if transform is None or any(k not in allowed for k in options):
      what = ', '.join(k for k in options if k not in allowed) or 'options this rule does not know'
      raise Skip(decorator, f'{function.name.value}: a decorator other than jax.jit / jax.pmap, or one with '
                            f'{what} (positions change when the state becomes the model)')
    if isinstance(expression, cst.Call):
      run.remove_import_of(expression.func)  # functools, once no partial is left
    if 'donate_argnums' in options:
      group.changes.append((decorator, f'{function.name.value}: donate_argnums dropped (NNX updates the model '
                                       'in place)'))
    if transform == 'pmap':
      record.pmap = (decorator, options)
      continue
    group.edits[decorator] = lambda updated: updated.with_changes(decorator=cst.parse_expression('nnx.jit'))
    group.changes.append((decorator, f'@{tree.code(expression)} -> @nnx.jit on {function.name.value}'))
  if record.wrapper is not None:
    _wrapper(walk, record)


def _wrapper(walk: Walk, record: StepFunction) -> None:
  """`jax.jit(step)` -> `nnx.jit(step)`; `jax.pmap(step, 'batch')` is recorded as the step's pmap, rewritten once
  the in_axes of its state are known (`data_parallel.pmap_decorator`)."""
  group, tree = walk.group, walk.tree
  wrapper, name = record.wrapper, record.node.name.value
  transform, _ = transform_of(wrapper.func)
  options = {a.keyword.value: a.value for a in wrapper.args[1:] if a.keyword is not None}
  positional = [a for a in wrapper.args[1:] if a.keyword is None]
  if transform == 'pmap' and positional:  # jax.pmap(fun, axis_name, in_axes, ...)
    options.update(zip(('axis_name', 'in_axes'), (a.value for a in positional)))
    positional = positional[2:]
  allowed = PMAP_OPTIONS if transform == 'pmap' else ('donate_argnums',)
  if positional or any(k not in allowed for k in options) or any(a.star for a in wrapper.args):
    what = ', '.join(k for k in options if k not in allowed) or 'arguments this rule does not know'
    raise Skip(wrapper, f'{tree.code(wrapper.func)}({name}, ...) with {what} (positions change when the state '
                        'becomes the model)')
  if 'donate_argnums' in options:
    group.changes.append((wrapper, f'{name}: donate_argnums dropped (NNX updates the model in place)'))
  if transform == 'pmap':
    record.pmap = (wrapper, options)
    return
  step = tree.code(wrapper.args[0].value)
  group.edits[wrapper] = lambda _: cst.parse_expression(f'nnx.jit({step})')
  group.changes.append((wrapper, f'{tree.code(wrapper)} -> nnx.jit({step})'))


def grad_transform(walk: Walk, call: cst.Call) -> cst.Call | None:
  """The `jax.grad(loss_fn, ...)` / `jax.value_and_grad(...)` call whose function `call` calls: inline
  (`jax.grad(loss_fn)(params)`) or through a name bound to it once and used once (`grad_fn(params)`)."""
  tree, inner = walk.tree, call.func
  if isinstance(call.func, cst.Name):
    scope = tree.scope(call.func)
    assignments = tree.assignments(scope, call.func.value) if scope is not None else []
    node = assignments[0].node if len(assignments) == 1 else None
    assign = tree.parent(node) if isinstance(node, cst.Name) else None
    assign = tree.parent(assign) if isinstance(assign, cst.AssignTarget) else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and len(assignments[0].references) == 1):
      return None
    inner = assign.value
  if isinstance(inner, cst.Call) and (cst.helpers.get_full_name_for_node(inner.func) or '') in GRADS:
    return inner
  return None


def grad(walk: Walk, call: cst.Call, kept: bool = False) -> None:
  """`jax.value_and_grad(loss_fn, has_aux=...)(params, ...)` -> `nnx.value_and_grad(loss_fn, ...)(model, ...)`.

  Also through a name: `grad_fn = jax.value_and_grad(loss_fn, has_aux=True)` then `grad_fn(params)`."""
  group, tree = walk.group, walk.tree
  if call in group.done:
    return
  group.done.add(call)
  inner = grad_transform(walk, call)
  func = cst.helpers.get_full_name_for_node(inner.func)
  options = {a.keyword.value: a.value for a in inner.args[1:] if a.keyword is not None}
  if len(inner.args) < 1 or inner.args[0].keyword is not None or any(k != 'has_aux' for k in options) \
      or len(options) != len(inner.args) - 1 or call.args[0].keyword is not None:
    raise Skip(call, f'{func} with options other than has_aux (argnums changes what is differentiated)')
  has_aux = options.get('has_aux')
  if has_aux is not None and not (isinstance(has_aux, cst.Name) and has_aux.value in ('True', 'False')):
    raise Skip(call, f'{func} with has_aux= not a literal True / False')
  loss = inner.args[0].value
  function = tree.function_def(loss) if isinstance(loss, cst.Name) else loss if isinstance(loss, cst.Lambda) else None
  if function is None or function.params.star_arg is not cst.MaybeSentinel.DEFAULT or not function.params.params:
    raise Skip(loss, f'{func} of something other than a function defined here with the params first')
  if kept:  # jax.grad stays: the loss takes the nnx.State of the params
    param = function.params.params[0]
    group.recognized.add(param)
    return walk.name(tree.scope(function.body), param.name.value, KEPT_PARAMS)
  record = group.functions.setdefault(function, StepFunction(function, loss_of=call, transform=inner))
  if record.kinds:
    raise Skip(loss, f'{tree.code(loss)} is differentiated twice')
  record.kinds[0] = collection('params')
  group.edits[inner.func] = replace_with(GRADS[func])
  param = function.params.params[0]
  group.recognized.add(param)
  walk.name(tree.scope(function.body), param.name.value, collection('params'))


def returned(walk: Walk, node: cst.BaseExpression, kind: str, final: bool = False) -> None:
  """State returned by a step or loss function: dropped from its `return` (path recorded).

  A function not known as a step yet is looked at again once the walk is over (`final`)."""
  group, tree = walk.group, walk.tree
  path, current = [], node
  while True:
    parent = tree.parent(current)
    if isinstance(parent, cst.Return):
      break
    tuple_ = tree.parent(parent) if isinstance(parent, cst.Element) else None
    if not isinstance(tuple_, cst.Tuple):
      raise Skip(node, f'{tree.code(node)} ({describe(kind)}) is used by code not converted yet')
    path.insert(0, list(tuple_.elements).index(parent))
    current = tuple_
  function = tree.enclosing_function(parent)
  if function not in group.functions and not final:
    group.pending_returns.append((node, kind))  # a loss whose `jax.grad` call the walk has not reached yet
    return
  if function not in group.functions:
    raise Skip(node, f'{describe(kind)} returned from a function other than a training step')
  record = group.functions[function]
  record.drops[tuple(path)] = kind
  record.returns.setdefault(parent, set()).add(tuple(path))


def finish_function(walk: Walk, record: StepFunction) -> None:
  """Rewrites a step's (or loss function's) parameters, returns and call sites once all its state is known."""
  group, tree = walk.group, walk.tree
  function = record.node
  rewrite_parameters(walk, record)
  drops = set(record.drops)
  returns = [n for n in descendants(function) if isinstance(n, cst.Return)
             and tree.enclosing_function(n) is function]
  if drops:
    if any(record.returns.get(r, set()) != drops for r in returns):
      raise Skip(returns[0], f'{tree.name_of(function)} returns its state in different places')
    for statement in returns:
      _prune_return(walk, statement, drops)
  if record.loss_of is not None:
    module, call = module_for(walk, function), record.loss_of
    group.edits[call.args[0]] = lambda updated, module=module: updated.with_changes(value=cst.Name(module))
    func, loss = cst.helpers.get_full_name_for_node(record.transform.func), tree.code(record.transform.args[0].value)
    group.changes.append((call, f'{func}({loss})(params) -> {GRADS[func]}({loss})({module})'))
    _loss_result(walk, record, drops)
  else:
    _step_calls(walk, record, drops)


def _prune_return(walk: Walk, statement: cst.Return, drops: set[tuple[int, ...]]) -> None:
  group, tree = walk.group, walk.tree
  value = pruned_value(statement.value, drops)
  if value is None and tree.statement(statement) in group.statements:
    return  # already rewritten: `return state.apply_gradients(grads=g)` -> `optimizer.update(model, g)`
  if value is None:
    line = tree.statement(statement)
    if len(line.body) != 1:
      raise Skip(statement, 'a return of state sharing its line with other statements')
    group.statements[line] = None
  else:
    group.edits[statement] = lambda updated: updated.with_changes(value=pruned_value(updated.value, drops))
  group.changes.append((statement, 'the state it returned goes: NNX updates the model in place'))


def _loss_result(walk: Walk, record: StepFunction, drops: set[tuple[int, ...]]) -> None:
  """A has_aux loss that returned batch-stats updates: the aux is pruned at both ends."""
  group, tree = walk.group, walk.tree
  if not drops:
    return
  call = record.loss_of
  has_aux = any(a.keyword is not None and a.keyword.value == 'has_aux' and a.value.value == 'True'
                for a in record.transform.args)
  if not has_aux or any(p[:1] != (1,) for p in drops):
    raise Skip(call, f'{tree.code(record.transform)}: the loss function returns state other than in its aux')
  value_and_grad = GRADS[cst.helpers.get_full_name_for_node(record.transform.func)] == 'nnx.value_and_grad'
  consumer = {((0, *p) if value_and_grad else p): kind for p, kind in record.drops.items()}
  _prune_consumer(walk, call, consumer)
  if (1,) in drops:  # the whole aux went: no has_aux any more
    group.edits[record.transform] = lambda updated: updated.with_changes(args=without_trailing_comma(
        [a for a in updated.args if not (a.keyword is not None and a.keyword.value == 'has_aux')]))


def _step_calls(walk: Walk, record: StepFunction, drops: set[tuple[int, ...]]) -> None:
  """Every call of a step passes the state in the same places; its unpacking drops the returned state."""
  group, tree = walk.group, walk.tree
  function = record.node
  names = state_names(walk, function, record.kinds)
  for node in _call_names(walk, record):
    call = tree.parent(node)
    if not (isinstance(call, cst.Call) and call.func is node and call in record.calls):
      raise Skip(node, f'{function.name.value} is used other than called with the state of {group.model}')
    for position in record.kinds:
      if position >= len(call.args) or call.args[position].keyword is not None or call.args[position].star \
          or call.args[position].value not in group.visited:
        raise Skip(call, f'{function.name.value} called without the state of {group.model} in position {position}')
    rewrite_call(walk, call, names)
    owner = mode_owner(walk, call)
    if function in group.modes:
      mode = group.modes[function]
      if group.modes.get(owner, mode) != mode:
        raise Skip(call, f'{function.name.value} called in train and eval mode in one statement')
      group.modes[owner] = mode
    if drops:
      _prune_consumer(walk, call, record.drops)


def _call_names(walk: Walk, record: StepFunction) -> list[cst.Name]:
  """The names a step is called through: its own, and for a wrapped step (`p_step = jax.pmap(step)`) its alias's
  instead of the one reading it in the wrapper."""
  tree = walk.tree
  names = _references(tree, record.node.name)
  if record.wrapper is None:
    return names
  alias = tree.parent(record.wrapper).targets[0].target
  wrapped = _partial_target(record.wrapper.args[0].value)
  return [n for n in dict.fromkeys([*names, *_references(tree, alias)]) if n is not wrapped]


def _references(tree: Tree, name: cst.Name) -> list[cst.Name]:
  """The reads of the name `name` binds, in the scope it binds it in (both bindings of a rebound step's name)."""
  scope = tree.scope(name)
  return list(dict.fromkeys(a.node for assignment in tree.assignments(scope, name.value)
                            for a in assignment.references if resolves_to(a.scope, name.value, scope)))


def _prune_consumer(walk: Walk, call: cst.Call, drops: dict[tuple[int, ...], str]) -> None:
  """`params, opt_state, loss = step(...)` -> `loss = step(...)`; the dropped names are followed as state."""
  group, tree = walk.group, walk.tree
  assign = tree.parent(call)
  if isinstance(assign, cst.Expr):
    return
  if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1):
    raise Skip(call, f'the state returned by {tree.code(call.func)} is used by code not converted yet')
  target = assign.targets[0].target
  for path, kind in drops.items():
    node = target
    for index in path:
      if not (isinstance(node, cst.Tuple) and index < len(node.elements)):
        raise Skip(assign, f'the result of {tree.code(call.func)} unpacked in a different shape than it is returned')
      node = node.elements[index].value
    walk.target(node, kind)
  pruned = pruned_value(target, set(drops))
  if pruned is None:
    group.edits[assign] = lambda updated: cst.Expr(updated.value)
  else:
    group.edits[assign] = lambda updated: updated.with_changes(
        targets=[cst.AssignTarget(pruned_value(updated.targets[0].target, set(drops)))])

