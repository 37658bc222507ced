"""Lifted transforms over classes of the file (nn.scan, nn.vmap, nn.remat, nn.jit) and over methods (decorators),
and control flow (nn.cond, nn.switch, nn.while_loop): the calls of a lifted submodule, the decorators of the
class's methods, and the Linen control-flow functions.
What a lifted construction builds is read by `constructions.py`.

Planning functions over a `context.ClassContext`, run by `planner.plan_class`: they read the file's facts and
fill the class's plan.
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002 import queries
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.nodes import broadcast_scan_axes, int_tuple, literal_ints, renumbered
from codemods.rules.l2n002.plan import Child, Unsupported, draws_rngs
from codemods.vocabulary import (
  COMPACT_NAMES,
  CONTROL_FLOW,
  NOWRAP_NAMES,
  PARTIAL_NAMES,
  SCAN_NAMES,
  SCOPE_APIS,
  WHILE_OPTIONS,
  WRAPPING,
)


def plan_method_decorators(ctx: ClassContext, node: cst.ClassDef,
                           dropped: tp.Mapping[cst.FunctionDef, tp.Collection[str]]) -> set[cst.CSTNode]:
  """The Linen decorators of the class's methods: `@nn.remat` / `@nn.jit`, bare or as `@functools.partial(nn.remat,
  static_argnums=...)` -> `nnx.remat` / `nnx.jit`, whose argument numbers count `self` as Linen's do (renumbered
  for the train/eval arguments `dropped` from the method); `@nn.nowrap` goes (NNX wraps no method); `@nn.compact`
  is left for the rule to drop. Returns the decorators handled; raises Unsupported at any other Linen decorator."""
  handled: set[cst.CSTNode] = set()
  for method in node.body.body:
    if not isinstance(method, cst.FunctionDef):
      continue
    gone = {i for i, p in enumerate(method.params.params) if p.name.value in dropped.get(method, ())}
    for decorator in method.decorators:
      expr = decorator.decorator
      if ctx.facts.has_name(expr, COMPACT_NAMES):
        handled.add(expr)
      elif ctx.facts.has_name(expr, NOWRAP_NAMES):
        ctx.plan.removed.add(decorator)
        ctx.plan.pending.append((expr, f'@{ctx.facts.code(expr)} removed: NNX wraps no method'))
        handled.add(expr)
      elif _method_transform(ctx, method, expr, gone):
        handled.update((expr, expr.func) if isinstance(expr, cst.Call) else (expr,))  # `functools`, once unused
  return handled


def _method_transform(ctx: ClassContext, method: cst.FunctionDef, expr: cst.BaseExpression, gone: set[int]) -> bool:
  """Plans `@nn.remat` / `@functools.partial(nn.jit, ...)` over `method` as its NNX transform; False for a
  decorator that is no Linen code."""
  partial = isinstance(expr, cst.Call) and ctx.facts.has_name(expr.func, PARTIAL_NAMES) and bool(expr.args) \
      and expr.args[0].keyword is None
  target = expr.args[0].value if partial else expr
  kind = next((k for k, (names, *_) in WRAPPING.items() if ctx.facts.has_name(target, names)), None)
  code, name = ctx.facts.code(expr), method.name.value
  if partial and ctx.facts.has_name(target, SCAN_NAMES):
    _method_scan(ctx, method, tp.cast(cst.Call, expr), gone)
    return True
  if kind is None:
    if any(ctx.facts.is_linen_name(sub) for sub in (expr, *descendants(expr)) if isinstance(sub, (cst.Name, cst.Attribute))):
      raise Unsupported(expr, f'@{code} is a Linen transform over the method {name}: write its NNX counterpart '
                               '(nnx.vmap, nnx.scan, ...) over the method by hand; @nn.remat and @nn.jit convert')
    return False
  _, transform, accepted, _, offset = WRAPPING[kind]
  options = expr.args[1:] if partial else ()
  numbers = {a.keyword.value: literal_ints(a.value, offset) for a in options if a.keyword is not None}
  if any(a.keyword is None or a.keyword.value not in accepted for a in options) or None in numbers.values():
    raise Unsupported(expr, f'@{code} over {name} is converted with the options {", ".join(accepted)} given by name '
                             f'(argnums literal), which {transform} takes')
  kept = []
  for arg in options:
    queries.check_hoistable(ctx, arg.value)
    key = arg.keyword.value
    if key.endswith('argnums'):
      left = renumbered(numbers[key], gone)
      if left:
        kept.append(f'{key}={int_tuple(left)}')
    else:
      kept.append(f'{key}={queries.code(ctx, arg.value, {})}')
  new = f'{ctx.facts.code(expr.func)}({", ".join([transform, *kept])})' if kept else transform
  ctx.plan.exprs[expr] = new
  ctx.plan.pending.append((expr, f'@{code} -> @{new}: the NNX transform over the method {name}'))
  return True


def _method_scan(ctx: ClassContext, method: cst.FunctionDef, expr: cst.Call, gone: set[int]) -> None:
  """`@functools.partial(nn.scan, variable_broadcast='params', split_rngs={'params': False}, in_axes=1, out_axes=1)`
  over `__call__(self, carry, x)` (the flax guide's LSTM, sst2's SimpleLSTM) -> `@nnx.scan(in_axes=(None,
  nnx.Carry, 1), out_axes=(nnx.Carry, 1))`: the module broadcast to every step, its parameters shared as Linen
  shares them; the callers give whole sequences (`facts.scanned_cells`)."""
  code = f'{ctx.facts.code(expr.func)}({ctx.facts.code(expr.args[0].value)}, ...)'  # on one line
  kwargs = {a.keyword.value: a.value for a in expr.args[1:] if a.keyword is not None}
  axes = broadcast_scan_axes(kwargs)
  params = method.params
  xs = params.params[2:]
  if axes is None or any(a.keyword is None for a in expr.args[1:]) or method.name.value != '__call__':
    raise Unsupported(expr, f'@{code} is converted over __call__ with the options variable_broadcast=\'params\', '
                            "split_rngs={'params': False}, in_axes=<int>, out_axes=<int> (the parameters shared by "
                            'every step); write the NNX scan over the method by hand')
  if len(params.params) < 3 or gone or params.star_arg != cst.MaybeSentinel.DEFAULT or params.kwonly_params \
      or params.star_kwarg or any(p.default is not None for p in xs):
    raise Unsupported(expr, f'@{code} over __call__ is converted where it takes (self, carry, x, ...) by position '
                            'alone, without defaults or train/eval switches')
  if draws_rngs(ctx.plan):
    raise Unsupported(expr, f'@{code}: the scanned __call__ draws random numbers, which nnx.scan does not split '
                            'for a module broadcast to every step: pass the keys in as a scanned input')
  in_axes = ', '.join(['None', 'nnx.Carry', *[str(axes[0])] * len(xs)])
  new = f'nnx.scan(in_axes=({in_axes}), out_axes=(nnx.Carry, {axes[1]}))'
  ctx.plan.exprs[expr] = new
  ctx.plan.pending.append((expr, f'@{code} -> @{new}: the module broadcast to every step (its parameters '
                                 'shared, as Linen shares them), the carry carried, the inputs scanned'))


def plan_control_flow(ctx: ClassContext, node: cst.ClassDef) -> set[cst.CSTNode]:
  """`nn.cond(pred, f, g, self, *xs)` / `nn.switch(i, branches, self, *xs)` -> nnx.cond / nnx.switch with the
  same arguments (each branch gets the module, as in Linen); `nn.while_loop(cond_fn, body_fn, self, init)` ->
  nnx.while_loop over `(self, init)`. Returns the Linen names converted."""
  converted = set()
  for call in descendants(node):
    if not (isinstance(call, cst.Call) and isinstance(call.func, (cst.Name, cst.Attribute))):
      continue
    names = {q.name for q in ctx.facts.qualified_names(call.func)}
    kind = next((CONTROL_FLOW[n] for n in names if n in CONTROL_FLOW), None)
    if kind is None:
      continue
    target, at = kind
    func = ctx.facts.code(call.func)
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    options = {a.keyword.value for a in call.args if a.keyword is not None}
    loop = target == 'nnx.while_loop'
    if any(a.star for a in call.args) or options - set(WHILE_OPTIONS if loop else ()) \
        or len(positional) <= at or (loop and len(positional) != 4) \
        or not (isinstance(positional[at], cst.Name) and positional[at].value == 'self'):
      accepted = f' (and {", ".join(WHILE_OPTIONS)}, which NNX does not need)' if loop else ''
      raise Unsupported(call, f'{func}(...) is converted with its arguments by position, self as the module'
                               f'{accepted}')
    for branch in positional[1:at]:
      _check_branch(ctx, branch, func)
    if loop:
      ctx.plan.while_loops.add(call)
      dropped = f'; {", ".join(sorted(options))} dropped (NNX carries every Variable)' if options else ''
      ctx.plan.pending.append((call, f'{func}(cond_fn, body_fn, self, init) -> nnx.while_loop over (self, init), '
                                  f'the functions still given the module{dropped}'))
    else:
      ctx.plan.exprs[call.func] = target
      ctx.plan.pending.append((call, f'{func}(...) -> {target}(...): the same arguments, each branch given the module'))
    converted.add(call.func)
  return converted


def _check_branch(ctx: ClassContext, branch: cst.BaseExpression, func: str) -> None:
  """A branch of lifted control flow: a lambda or function (or a list of them) that uses its module argument
  only through attributes other than Linen's scope APIs, and no Linen name outside this class."""
  if isinstance(branch, (cst.List, cst.Tuple)):
    for element in branch.elements:
      _check_branch(ctx, element.value, func)
    return
  function = branch
  if isinstance(branch, cst.Name):
    scope = ctx.facts.scope(branch)
    assignments = list(scope[branch.value]) if scope is not None else []
    if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
      raise Unsupported(branch, f'a {func} branch bound more than once, or not in this file')
    function = assignments[0].node
    target = ctx.facts.parent(function)
    assign = ctx.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
      return _check_branch(ctx, assign.value, func)
    if not isinstance(function, cst.FunctionDef):
      raise Unsupported(branch, f'a {func} branch that is not a function of this file')
    if isinstance(ctx.facts.parent(function), cst.Module) and any(
        queries.nnx_name_for_or_none(ctx, sub) is None and ctx.facts.is_linen_name(sub) for sub in descendants(function)):
      raise Unsupported(branch, f'the {func} branch {branch.value} (outside the class) uses Linen names')
  if not isinstance(function, (cst.Lambda, cst.FunctionDef)) or not function.params.params:
    raise Unsupported(branch, f'a {func} branch other than a lambda or function taking the module first')
  module = function.params.params[0].name.value
  for sub in descendants(function.body):
    if isinstance(sub, cst.Attribute) and isinstance(sub.value, cst.Name) and sub.value.value == module \
        and sub.attr.value in SCOPE_APIS:
      raise Unsupported(sub, f'{module}.{sub.attr.value} in a {func} branch (variables created or read through '
                              'Linen scope APIs)')


def check_calls(ctx: ClassContext) -> None:
  """Checks each call of a lifted child the plan records (`children.py`): how it is called, and says how NNX runs it."""
  for call, child in ctx.plan.scan_calls.items():
    _scan_call(ctx, call, child)
  for call, child in ctx.plan.remat_calls.items():
    _remat_call(ctx, call, child)
  for call, child in ctx.plan.stack_calls.items():
    _stack_call(ctx, call, child)


def _remat_call(ctx: ClassContext, call: cst.Call, child: Child) -> None:
  """A call of a rematted submodule: positional arguments only, nnx.remat runs it."""
  if any(a.keyword is not None or a.star for a in call.args):
    raise Unsupported(call, f'a {child.remat[0]}-wrapped submodule called with keyword or starred arguments '
                             '(converted: positional)')
  transform, options = child.remat[0], f' ({child.remat[1]})' if child.remat[1] else ''
  effect = 'its activations recomputed in the backward pass' if transform == 'nnx.remat' else 'compiled on its own'
  ctx.plan.pending.append((call, f'the {transform.partition(".")[2]}-wrapped submodule self.{child.attr} called through '
                              f'{transform}{options}: {effect}, as in Linen'))


def scan_local(ctx: ClassContext, method: cst.FunctionDef, ctor: cst.Call) -> tuple[cst.Call, list[cst.Name]]:
  """`rnn = nn.scan(Cell, ...)(...)` in the @nn.compact method: the statement goes (the cell is built in
  __init__), `rnn.<method>` reads the attribute; returns the one call `rnn(carry, x)`."""
  if queries.bound_local(ctx, method, ctor) is None:
    if ctor in ctx.plan.remats:
      raise Unsupported(ctor, 'an nn.remat submodule neither called where it is built nor bound by '
                               '`name = nn.remat(...)(...)`')
    raise Unsupported(ctor, 'an nn.scan cell neither called where it is built nor bound by `name = nn.scan(...)(...)`')
  kind = 'rematted submodule' if ctor in ctx.plan.remats else 'scanned cell'
  calls, names = queries.local_uses(ctx, method, ctor, kind)
  if len(calls) != 1:
    raise Unsupported(ctor, f'the {kind} {queries.bound_local(ctx, method, ctor).value} is called {len(calls)} times '
                             '(converted: once)')
  return calls[0], names


def _stack_call(ctx: ClassContext, call: cst.Call, child: Child) -> None:
  """A call of stacked copies: every argument by position (for scan, `(carry, *xs)`); nnx.scan runs the layers
  in turn, nnx.vmap the ensemble's members side by side."""
  stacked = child.stacked
  if any(a.keyword is not None or a.star for a in call.args) or len(call.args) != len(child.sibling.call_params):
    raise Unsupported(call, f'nn.{stacked.transform} copies called other than with all of {child.sibling.name}\'s '
                             'arguments by position')
  remat = '' if stacked.remat is None else (
      f', each rematerialised (nnx.remat{f"({stacked.remat})" if stacked.remat else ""})')
  unsplit = '' if 'dropout' in stacked.split or not draws_rngs(child.sibling) else (
      f'; split_rngs names only {", ".join(stacked.split)}: no other rng stream reached the Linen copies (a dropout '
      'in train mode failed there), NNX splits every stream per copy')
  run = 'nnx.scan, one layer after the other' if stacked.transform == 'scan' else 'nnx.vmap, side by side'
  ctx.plan.pending.append((call, f'the nn.{stacked.transform} of {child.sibling.name} ({child.linen_name}) -> '
                              f'self.{child.attr}, {stacked.length} copies created by nnx.vmap over '
                              f'rngs.split({stacked.length}) (variables stacked on axis 0, as Linen\'s), run by '
                              f'{run}{remat}{unsplit}'))


def _scan_call(ctx: ClassContext, call: cst.Call, child: Child) -> None:
  """A call of a scanned cell: `(carry, x)` by position, nnx.scan runs it."""
  if len(call.args) != 2 or any(a.keyword is not None or a.star for a in call.args):
    raise Unsupported(call, 'a scanned cell called other than as cell(carry, x)')
  in_axis, out_axis = child.scan
  ctx.plan.pending.append((call, f'the nn.scan call {ctx.facts.code(call.func)}(...) -> nnx.scan over '
                              f'self.{child.attr}, the cell broadcast to every step (its params are shared): '
                              f'in_axes=(None, nnx.Carry, {in_axis}), out_axes=(nnx.Carry, {out_axis})'))
