"""Decide and rewrite the step style (`--step-style`, docs/performance.md) of each converted training step.

'functional': `@jax.jit def step(graphdef, state, ...)` merging `(model, optimizer)` inside and
returning their state as a dict of arrays, split before the loop and updated after it; `state` is donated
(`jax.jit(donate_argnames='state')`: XLA writes the new state into its buffers, as an in-place update), so the
loop starts from a copy and the arrays the model holds stay valid for any other code holding them.
'cached': the `@nnx.jit` step called through `nnx.cached_partial(step, model, optimizer)`.
A step a style cannot be applied to safely falls back (functional -> cached -> `@nnx.jit`),
with a report entry saying why.
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.common import module_for
from codemods.rules.l2n003.common import rewrite_call
from codemods.rules.l2n003.common import rewrite_parameters
from codemods.rules.l2n003.common import state_names
from codemods.rules.l2n003.facts import StepFunction
from codemods.rules.l2n003.facts import StepStyleChoice
from codemods.rules.l2n003.syntax import after_docstring
from codemods.rules.l2n003.syntax import pruned_value
from codemods.rules.l2n003.syntax import transform_of
from codemods.rules.l2n003.syntax import with_state

Loops = dict[cst.CSTNode, list[cst.Call]]
"""The innermost loop around each call of a step -> those calls."""

def apply_step_styles(walk: Walk) -> None:
  """Rewrites each converted training step in the style `--step-style` chose (docs/performance.md).

  'functional': the step becomes `@jax.jit def step(graphdef, state, ...)`, which merges
  `(model, optimizer)` from them and returns their state last, as a dict of arrays;
  `graphdef, state = nnx.split((model, optimizer))` goes before the loop that calls it and
  `nnx.update((model, optimizer), state)` after it. 'cached': the `@nnx.jit` step is called
  through `nnx.cached_partial(step, model, optimizer)`, made before the loop. A step 'functional'
  cannot be applied to safely (the loop reads the model) gets 'cached' where that applies; one
  neither applies to stays `@nnx.jit`. Each such step gets a report entry saying why.
  """
  group, tree, run = walk.group, walk.tree, walk.run
  style = run.options.step_style
  if style == 'nnx-jit':
    return
  for function in sorted(group.kept_steps, key=tree.position):
    group.changes.append((function, f'{function.name.value}: stays a jax.jit step over the kept TrainState '
                                    f'(--train-state keep); step style {style} not applied'))
  for function, record in sorted(group.functions.items(), key=lambda item: tree.position(item[0])):
    if record.loss_of is not None or not isinstance(function, cst.FunctionDef) or not record.drops:
      continue  # a loss function, or a step that returns no state (an eval step): nothing carried between calls
    name = function.name.value
    if record.pmap is not None:
      group.changes.append((function, f'{name}: stays an nnx.pmap step over the model; step style {style} not '
                                      'applied (it applies to jitted steps)'))
      continue
    if record.wrapper is not None:
      group.changes.append((record.wrapper, f'{name}: stays an nnx.jit step, jitted where it is wrapped; step style '
                                            f'{style} not applied (it applies to steps decorated with jax.jit)'))
      continue
    if not any(transform_of(d.decorator)[0] == 'jit' for d in function.decorators):
      continue
    choice = choose_style(walk, record, style)
    if choice.note is not None:
      group.changes.append((function, choice.note))
    if choice.style == 'functional':
      _functional_step(walk, record, choice)
    elif choice.style == 'cached':
      _cached_step(walk, record, choice)


def choose_style(walk: Walk, record: StepFunction, style: str) -> StepStyleChoice:
  """Decide: `style` where it applies safely; else 'cached' for 'functional' where that applies; else none."""
  name = record.node.name.value
  reason, loops = _style_blocker(walk, record, style)
  if reason is None:
    return StepStyleChoice(style, None, _frozen(loops))
  if style == 'functional':
    cached_reason, loops = _style_blocker(walk, record, 'cached')
    if cached_reason is None:
      return StepStyleChoice('cached', f'{name}: step style functional not applied: {reason}; cached instead (the '
                                       'next fastest)', _frozen(loops))
  return StepStyleChoice(None, f'{name}: stays @nnx.jit over the model; step style {style} not applied: {reason}')


def _frozen(loops: Loops) -> tuple[tuple[cst.CSTNode, tuple[cst.Call, ...]], ...]:
  return tuple((loop, tuple(calls)) for loop, calls in loops.items())


def _style_loops(walk: Walk, record: StepFunction) -> tuple[Loops, str | None]:
  """The innermost loop around each call of a step, or why there is none to hoist the style's setup before.

  A mode call placed before the step's calls inside the loop (the loop shares a statement with
  code in the other mode, e.g. an eval after each epoch) is fine when it is the only one there:
  `_hoist_modes` moves it before the loop.
  """
  group, tree, run = walk.group, walk.tree, walk.run
  loops: Loops = {}
  for call in sorted(record.calls, key=tree.position):
    child = tree.statement(call)
    node = tree.parent(child)
    while node is not None and not isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
      if isinstance(node, (cst.For, cst.While)) and child is node.body:
        break
      child, node = node, tree.parent(node)
    if not isinstance(node, (cst.For, cst.While)):
      return {}, f'it is called outside a loop (line {tree.position(call)[0]})'
    loops.setdefault(node, []).append(call)
  for loop in loops:
    if any(other is not loop and tree.encloses(other, loop) for other in loops):
      return {}, 'it is called in nested loops'
    if loop in run.statements:
      return {}, 'its loop also runs the code of another model'
    if _loop_modes(walk, loop, loops[loop]) is None:
      return {}, f'{group.model}.train() / {group.model}.eval() is set inside the loop that calls it'
  return loops, None


def _loop_modes(walk: Walk, loop: cst.CSTNode, calls: tp.Sequence[cst.Call]) -> list[str] | None:
  """The mode call placed inside `loop` (`[]` or `['model.train()']`), if only before these step calls; else None."""
  group, tree = walk.group, walk.tree
  inside = [s for s in group.mode_inserts if s is not loop and tree.encloses(loop, s)]
  steps = {tree.statement(call) for call in calls}
  codes = set()
  for statement in inside:
    extras = [s for s in group.statements.get(statement) or [] if s is not statement]
    if statement not in steps or len(extras) != 1:
      return None
    codes.add(cst.Module([]).code_for_node(extras[0]).strip())
  return sorted(codes) if len(codes) <= 1 else None


def _hoist_modes(walk: Walk, loop: cst.CSTNode, calls: tp.Sequence[cst.Call]) -> list[str]:
  """Moves the mode call placed before these step calls inside `loop` to before it (see `_loop_modes`)."""
  group, tree = walk.group, walk.tree
  codes = _loop_modes(walk, loop, calls)
  for statement in {tree.statement(call) for call in calls}:
    if statement in group.mode_inserts and statement is not loop and group.statements.get(statement):
      group.statements[statement] = [statement]
  return codes or []


def _style_blocker(walk: Walk, record: StepFunction, style: str) -> tuple[str | None, Loops]:
  """Why `style` cannot be applied to this step safely (None: it can), and the loops around its calls."""
  group, tree = walk.group, walk.tree
  function = record.node
  if group.kept_state:
    return 'the TrainState of the model is kept (--train-state keep)', {}
  module = module_for(walk, function)
  if module != group.model:
    return f'it applies {module}, a decode-mode view of {group.model}', {}
  if not isinstance(function.body, cst.IndentedBlock):
    return 'its body shares the line of its def', {}
  loops, reason = _style_loops(walk, record)
  if reason is not None:
    return reason, {}
  for loop, calls in loops.items():
    views = [n for n in descendants(loop) if isinstance(n, cst.Name) and n.value in group.twins]
    if views:
      return f'the loop that calls it uses {views[0].value}, a decode-mode view of {group.model}', {}
    if style != 'functional':
      continue
    allowed: set[cst.CSTNode] = set()
    for call in calls:
      assign = tree.parent(call)
      if not (isinstance(assign, cst.Assign) and assign.value is call):
        return f'the result of a call of it (line {tree.position(call)[0]}) is not assigned', {}
      allowed.update(call.args[p].value for p in record.kinds)
      target = assign.targets[0].target
      for path in record.drops:
        node = target
        for index in path:
          node = node.elements[index].value
        allowed.add(node)
    for node in descendants(loop):
      if (node in group.visited or node in group.model_uses) and node not in allowed:
        return (f'the loop that calls it also uses {tree.code(node)} (line {tree.position(node)[0]}), the '
                f'state of {group.model} (move that use after the loop for the functional style)'), {}
      leaves = isinstance(node, (cst.Return, cst.Yield))
      if leaves and tree.enclosing_function(node) is tree.enclosing_function(loop):
        return f'the loop that calls it can leave by a {type(node).__name__.lower()} before nnx.update', {}
  if style == 'functional':
    scope = tree.scope_or_none(function.body)
    for node in descendants(function.body):
      if isinstance(node, cst.Name) and node in group.visited and not tree.bound_inside(node, scope):
        return f'it reads {node.value}, state of {group.model} from an enclosing scope', {}
  return None, loops


def _free_name(walk: Walk, candidates: tp.Sequence[str]) -> str | None:
  """The first candidate not used in the file, or used only for the Linen state of this group (all rewritten)."""
  group, tree, run = walk.group, walk.tree, walk.run
  followed = {name for _, name in group.names}
  for name in candidates:
    if run.introduced.get(name, id(group)) != id(group):
      continue
    if name in run.introduced or name not in run.names_in_module:
      return name
    if name in followed and all(_state_name_use(walk, node) for node in descendants(tree.module)
                                if isinstance(node, cst.Name) and node.value == name):
      return name
  return None


def _state_name_use(walk: Walk, node: cst.Name) -> bool:
  group, tree = walk.group, walk.tree
  parent = tree.parent(node)
  if isinstance(parent, cst.Attribute) and parent.attr is node:
    return True
  if isinstance(parent, cst.Arg) and parent.keyword is node:
    return True
  scope = tree.binding_scope(node)
  return scope is not None and (id(scope), node.value) in group.names


def _style_nodes(walk: Walk, record: StepFunction) -> tuple[dict[int, list[str]], str]:
  """The step's NNX names by state position and the code of the graph nodes (`(model, optimizer)`)."""
  names = state_names(walk, record.node, record.kinds)
  order = [n for position in sorted(names) for n in names[position]]
  return names, f'({", ".join(order)})' if len(order) > 1 else order[0]


def _around_loop(walk: Walk, loop: cst.CSTNode, before: list[str], after: list[str]) -> None:
  """Statements right before `loop` (after a mode call placed there, taking the loop's leading lines) and after it."""
  group = walk.group
  current = group.statements.get(loop, [loop])
  index = current.index(loop)
  block = [*current[:index], *(cst.parse_statement(f'{code}\n') for code in before)]
  block[0] = block[0].with_changes(leading_lines=loop.leading_lines)
  group.statements[loop] = [*block, loop, *(cst.parse_statement(f'{code}\n') for code in after), *current[index + 1:]]
  previous = group.edits.get(loop)
  group.edits[loop] = lambda updated: (previous(updated) if previous else updated).with_changes(leading_lines=[])


def _functional_step(walk: Walk, record: StepFunction, choice: StepStyleChoice) -> None:
  group, tree, run = walk.group, walk.tree, walk.run
  function, drops = record.node, set(record.drops)
  name = function.name.value
  graphdef = _free_name(walk, ('graphdef', 'nnx_graphdef'))
  state = _free_name(walk, ('state', 'nnx_state'))
  if graphdef is None or state is None:
    group.changes.append((function, f'{name}: stays @nnx.jit over the model; step style functional not applied: '
                                    'the names graphdef / nnx_graphdef or state / nnx_state are taken'))
    return
  run.introduced.update({graphdef: id(group), state: id(group)})
  names, nodes = _style_nodes(walk, record)
  first = min(names)
  carried = {position: ([graphdef, state] if position == first else []) for position in names}
  rewrite_parameters(walk, record, carried)
  merge = cst.parse_statement(f'{nodes.strip("()")} = nnx.merge({graphdef}, {state})\n')
  group.edits[function.body] = lambda updated: updated.with_changes(body=after_docstring(updated.body, merge))
  returned = f'nnx.to_pure_dict(nnx.state({nodes}))'
  for statement in [n for n in descendants(function) if isinstance(n, cst.Return)
                    and tree.enclosing_function(n) is function]:
    line = tree.statement(statement)
    if line in group.statements and group.statements[line] is None:
      del group.statements[line]
    group.edits[statement] = lambda updated: updated.with_changes(
        value=cst.parse_expression(with_state(pruned_value(updated.value, drops), returned)))
    group.changes = [(n, m) for n, m in group.changes if n is not statement]
    group.changes.append((statement, f'the state it returned -> {returned}, returned last'))
  donated = False
  for decorator in function.decorators:
    expression = decorator.decorator
    if transform_of(expression)[0] != 'jit':
      continue
    jit = tree.code(expression.args[0].value if isinstance(expression, cst.Call) else expression)
    donated = jit == 'jax.jit'  # `jax` names the module: the copy before the loop can be written with it
    new = f'{jit}(donate_argnames={state!r})' if donated else jit
    group.edits[decorator] = lambda updated, new=new: updated.with_changes(decorator=cst.parse_expression(new))
    group.changes = [(n, m) for n, m in group.changes if not (n is decorator and '-> @nnx.jit' in m)]
    was = f'@{jit} stays' if tree.code(expression) == new else f'@{tree.code(expression)} -> @{new}'
    donation = f', {state} donated (its buffers reused for the new state)' if donated else ''
    group.changes.append((decorator, f'{was} on {name}, over ({graphdef}, {state}): {nodes} merged inside'
                                     f'{donation} (step style functional)'))
  for call in record.calls:
    rewrite_call(walk, call, carried)
    assign = tree.parent(call)
    group.edits[assign] = lambda updated: updated.with_changes(targets=[cst.AssignTarget(cst.parse_expression(
        with_state(pruned_value(updated.targets[0].target, drops), state)))])
  for loop, calls in choice.loops:
    modes = _hoist_modes(walk, loop, calls)
    pure = f'jax.device_put(nnx.to_pure_dict({state}), may_alias=False)' if donated else f'nnx.to_pure_dict({state})'
    split = [f'{graphdef}, {state} = nnx.split({nodes})', f'{state} = {pure}']
    _around_loop(walk, loop, [*modes, *split], [f'nnx.update({nodes}, {state})'])
    copied = (f'; a copy, since {name} donates it: the arrays of {nodes.strip("()")} stay valid for other code that '
              'holds them') if donated else ''
    group.changes.append((loop, f'{graphdef}, {state} = nnx.split({nodes}) before the loop, nnx.update({nodes}, '
                                f'{state}) after it: {name} carries their state as a dict of arrays{copied} (step '
                                'style functional)'))


def _cached_step(walk: Walk, record: StepFunction, choice: StepStyleChoice) -> None:
  group, run = walk.group, walk.run
  function = record.node
  name = function.name.value
  cached = _free_name(walk, (f'cached_{name}', f'{name}_cached'))
  if cached is None:
    group.changes.append((function, f'{name}: stays @nnx.jit over the model; step style cached not applied: the '
                                    f'names cached_{name} and {name}_cached are taken'))
    return
  run.introduced[cached] = id(group)
  names, nodes = _style_nodes(walk, record)
  if sorted(names) != list(range(len(names))):
    rewrite_parameters(walk, record, names, lead=True)
    group.changes.append((function, f'{name}: takes {nodes.strip("()")} first (nnx.cached_partial binds the '
                                    'leading arguments)'))
  for call in record.calls:
    rewrite_call(walk, call, {position: [] for position in names}, func=cached)
  for loop, calls in choice.loops:
    modes = _hoist_modes(walk, loop, calls)
    _around_loop(walk, loop, [*modes, f'{cached} = nnx.cached_partial({name}, {nodes.strip("()")})'], [])
    group.changes.append((loop, f'{cached} = nnx.cached_partial({name}, {nodes.strip("()")}) before the loop: its '
                                f'calls skip the graph traversal of {nodes} (step style cached)'))

