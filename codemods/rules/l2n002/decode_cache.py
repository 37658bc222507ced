"""Decode caches: the `self.has_variable('cache', ...)` pattern -> `nnx.Cache` attributes made by a
new `init_cache(input_shape, dtype)`, from whole shapes through `__call__` (`dims.CacheShapes`), or, in a helper
`__call__` calls when asked (transformers' `_concatenate_to_cache`), by the call that finds them missing.

Planning functions over a `context.ClassContext`, run by `planner.plan_class`: they read the file's facts and
fill the class's plan.
"""

from __future__ import annotations

import re
import typing as tp

import libcst as cst

from codemods.nodes import children
from codemods.nodes import descendants
from codemods.rules.l2n002 import init_code, queries, sizes
from codemods.rules.l2n002.conditions import arm_path
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.dims import (
  INPUT_SHAPE,
  Shape,
  WholeShapeWalk,
  broadcast_shape,
  shape_code,
  simplify,
  split_last,
)
from codemods.rules.l2n002.nodes import (
  ARITHMETIC,
  HAS_VARIABLE_HINT,
  assigned_name,
  cache_read,
  is_minus_one,
  is_number,
  is_self_attr,
  is_written,
  paren,
  scope_api,
)
from codemods.rules.l2n002.plan import Child, ClassRewrite, Unsupported
from codemods.variable_types import flax_variable_type
from codemods.vocabulary import ELEMENTWISE
from nnx_bridge.layer_table import SAME_AS_INPUT


def decode_caches(ctx: ClassContext, plan: ClassRewrite, method: cst.FunctionDef) -> set[cst.Call]:
  """The decode-cache patterns of the @nn.compact method; returns their self.variable calls.

  The pattern, in one block: `flag = self.has_variable('cache', 'k')`, then
  `v = self.variable('cache', 'k', init, *args)` for each cache, then `if flag: <the update>`. Linen's init
  creates the caches and leaves them as `init` made them; later calls run the update.

  * In `__call__` (flax's MultiHeadDotProductAttention, the lm1b and wmt examples), the caches are made
    by a new init_cache, the flag becomes a check that it ran, and the update always runs (an else is only
    run by Linen's init).
  * In a helper that `__call__` calls when asked (transformers' `_concatenate_to_cache`, run when
    `self.has_variable('cache', 'cached_key') or init_cache`), the call that finds the caches missing creates
    them, as Linen's init did: `flag = self.k is not None`, then `if not flag: self.k = nnx.Cache(init(*args))`
    (`_created_by_call`); the class's other `self.has_variable('cache', 'k')` become `self.k is not None`, its
    `self.variables['cache']['k']` reads `self.k[...]`.
  """
  found: set[cst.Call] = set()
  for call in descendants(method.body):
    if isinstance(call, cst.Call) and scope_api(call) == 'has_variable':
      found |= _decode_cache(ctx, plan, method, call)
  if ctx.plan.lazy_caches:
    _cache_uses(ctx, plan)
  return found


def _decode_cache(ctx: ClassContext, plan: ClassRewrite, method: cst.FunctionDef, call: cst.Call) -> set[cst.Call]:
  unsupported = lambda node, why: Unsupported(node, f'{why}{HAS_VARIABLE_HINT}')
  assign, line = ctx.facts.parent(call), None
  if isinstance(assign, cst.Assign):
    line = ctx.facts.parent(assign)
  if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
          and assign.value is call and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
          and len(call.args) == 2 and all(a.keyword is None and isinstance(a.value, cst.SimpleString) for a in call.args)):
    raise unsupported(call, "self.has_variable other than `flag = self.has_variable('cache', '<name>')`")
  collection, name = (a.value.evaluated_value for a in call.args)
  if collection != 'cache':
    raise unsupported(call, f'self.has_variable on the collection {collection!r} (only decode caches, in '
                            "'cache', are converted)")
  created_by_call = method.name.value != '__call__'
  flag = assign.targets[0].target.value
  block = ctx.facts.parent(line)
  statements = list(block.body)
  start = statements.index(line)
  guard = next((s for s in statements[start + 1:] if isinstance(s, cst.If) and isinstance(s.test, cst.Name)
                and s.test.value == flag), None)
  if guard is None:
    raise unsupported(call, f'a self.has_variable flag {flag} not tested by an `if {flag}:` after it in the same block')
  caches: dict[str, cst.Call] = {}
  holders: dict[str, str] = {}
  for statement in statements[start + 1:statements.index(guard)]:
    target = assigned_name(statement)
    value = statement.body[0].value if target else None
    if isinstance(value, cst.Call) and scope_api(value) == 'variable' and value.args \
        and isinstance(value.args[0].value, cst.SimpleString) and value.args[0].value.evaluated_value == 'cache' \
        and len(value.args) > 1 and isinstance(value.args[1].value, cst.SimpleString):
      caches[value.args[1].value.evaluated_value] = value
      holders[target] = value.args[1].value.evaluated_value
    elif created_by_call:
      raise unsupported(statement, f'code other than the decode caches\' self.variable calls between `{flag} = '
                                   f'self.has_variable(...)` and `if {flag}:`')
  if name not in caches:
    raise unsupported(call, f"self.has_variable('cache', {name!r}) without a "
                            f"`{name} = self.variable('cache', {name!r}, ...)` between it and `if {flag}:`")
  uses = [n for n in descendants(method.body) if isinstance(n, cst.Name) and n.value == flag]
  if [n for n in uses if n is not assign.targets[0].target and n is not guard.test]:
    raise unsupported(call, f'the self.has_variable flag {flag} used other than as `if {flag}:`')
  inside = set(descendants(guard.body))
  values = []  # the `<holder>.value` uses
  for node in descendants(method.body):
    if isinstance(node, cst.Name) and node.value in holders:
      parent = ctx.facts.parent(node)
      if isinstance(parent, cst.AssignTarget) and ctx.facts.parent(parent).value in caches.values():
        continue  # `cached_key = self.variable('cache', ...)`
      if isinstance(parent, cst.Attribute) and parent.attr is node or isinstance(parent, cst.Arg) and parent.keyword is node:
        continue  # `other.cached_key`, `f(cached_key=...)`: not the local
      if not (isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == 'value'):
        raise unsupported(node, f'the decode cache {holders[node.value]} used other than through .value')
      if not created_by_call and is_written(parent, ctx.facts.parent) and parent not in inside:
        raise Unsupported(node, f'the decode cache {holders[node.value]} is written outside `if {flag}:`, so '
                                 "Linen's init writes it too: init_cache cannot create it as that init did")
      values.append(parent)
  ctx.plan.cache_uses.add(call)
  if created_by_call:
    _created_by_call(ctx, call, flag, caches, holders, values)
    return set(caches.values())
  ctx.plan.statements[line] = (f'if self.{name} is None:\n'
                            f"  raise ValueError('{plan.name}: the decode cache is empty: call init_cache(input_shape) first')\n")
  ctx.plan.ifs[guard] = True
  dropped = ' (its else, which only Linen\'s init ran, goes)' if guard.orelse is not None else ''
  ctx.plan.pending.append((call, f'`{flag} = self.has_variable({collection!r}, {name!r})` -> a check that init_cache '
                              f'created the decode caches; the `if {flag}:` block runs always{dropped}'))
  return set(caches.values())


def _created_by_call(ctx: ClassContext, call: cst.Call, flag: str, caches: dict[str, cst.Call], holders: dict[str, str],
                     values: list[cst.Attribute]) -> None:
  """Decode caches the call that finds them missing creates, in one block where Linen's self.variable calls were:
  `if not <flag>: self.<name> = nnx.Cache(<init>(*args))` for each; `<holder>.value` reads and writes
  `self.<name>[...]`."""
  name = call.args[1].value.evaluated_value
  var_type = flax_variable_type('cache')
  ctx.plan.exprs[call] = f'self.{name} is not None'
  created = [f'  self.{cache} = {init_code.variable_code(ctx, ctor, var_type, {})}\n' for cache, ctor in caches.items()]
  lines = [ctx.facts.parent(ctx.facts.parent(ctor)) for ctor in caches.values()]
  ctx.plan.statements[lines[0]] = f'if not {flag}:\n' + ''.join(created)
  ctx.plan.removed.update(lines[1:])
  for value in values:
    ctx.plan.exprs[value] = f'self.{holders[value.value.value]}[...]'
  ctx.plan.lazy_caches.update(caches)
  names = ', '.join(f'self.{cache}' for cache in caches)
  ctx.plan.pending.append((call, f"`{flag} = self.has_variable('cache', {name!r})` -> `self.{name} is not None`: the "
                              f'call that finds the decode caches missing creates {names} (None until then), as '
                              "Linen's init did"))


def _cache_uses(ctx: ClassContext, plan: ClassRewrite) -> None:
  """The class's other uses of the caches the call creates: `self.has_variable('cache', 'k')` ->
  `self.k is not None` (`not self.has_variable(...)` -> `self.k is None`), a read of
  `self.variables['cache']['k']` -> `self.k[...]`. Other uses stay for the scope-API check to refuse."""
  for node in descendants(ctx.facts.class_defs[plan.name]):
    if isinstance(node, cst.Call) and scope_api(node) == 'has_variable' and node not in ctx.plan.cache_uses:
      name = _cache_name(node.args) if len(node.args) == 2 else None
      if name not in ctx.plan.lazy_caches:
        continue
      parent = ctx.facts.parent(node)
      if isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
        ctx.plan.exprs[parent] = f'self.{name} is None'
      else:
        bare = isinstance(parent, (cst.BooleanOperation, cst.If, cst.IfExp, cst.Assign, cst.Arg))
        ctx.plan.exprs[node] = f'self.{name} is not None' if bare else f'(self.{name} is not None)'
      ctx.plan.cache_uses.add(node)
    elif isinstance(node, cst.Subscript) and (name := cache_read(node)) in ctx.plan.lazy_caches \
        and not is_written(node, ctx.facts.parent) and not isinstance(ctx.facts.parent(node), cst.Del):
      ctx.plan.exprs[node] = f'self.{name}[...]'
      ctx.plan.cache_uses.add(node.value)


def _cache_name(args: tp.Sequence[cst.Arg]) -> str | None:
  """'k' for the arguments `('cache', 'k')`, else None."""
  if all(a.keyword is None and not a.star and isinstance(a.value, cst.SimpleString) for a in args):
    collection, name = (a.value.evaluated_value for a in args)
    return name if collection == 'cache' else None
  return None


def plan_init_cache(ctx: ClassContext, node: cst.ClassDef, plan: ClassRewrite, call: cst.FunctionDef, calls: dict[cst.Call, Child],
                     taken: set[str]) -> None:
  """Whole shapes through `__call__` and, for a class with decode caches, the body of init_cache.

  A class whose `__call__` creates decode caches (`_decode_caches`) creates them in
  init_cache(input_shape, dtype) instead, from the shapes the code gives them in terms of the
  shape of its first input; a class with children holding decode caches (converted classes
  with an init_cache, table layers in decode mode) calls theirs with their inputs' shapes.
  Whatever the code does not fix keeps the class Linen.
  """
  walker = CacheShapes(ctx, plan, calls)
  env: dict[str, Shape] = {plan.call_params[0]: INPUT_SHAPE} if plan.call_params else {}
  plan.output_shape = walker.walk(call.body, env)
  if sizes.returns_in_branches(ctx, call):
    plan.output_shape = None
  holders = [c for c in plan.children if c.holds_cache]
  if not walker.own and not holders:
    return
  if 'init_cache' in taken | {c.attr for c in plan.children}:
    raise Unsupported(node, 'decode caches, and the class already has an attribute init_cache')
  if not plan.call_params:
    raise Unsupported(node, 'decode caches, and __call__ takes no input whose shape init_cache could take')
  if {'input_shape', 'dtype'} & ctx.facts.global_names:
    raise Unsupported(node, "decode caches, and a module-level name input_shape or dtype that init_cache's "
                             'arguments would hide')
  queries.jnp_bound(ctx, node)
  lines = []
  for child in plan.children:
    if child.ctor in walker.own:
      lines.append(f'self.{child.attr} = {child.cache_text}')
    elif child.holds_cache:
      shapes = walker.inputs.get(child.attr, [])
      if not shapes:
        raise Unsupported(child.ctor, f'self.{child.attr} holds a decode cache and __call__ does not call it: '
                                       'init_cache cannot derive the shape of its input')
      if any(s is None for s in shapes) or len(set(shapes)) != 1:
        raise Unsupported(child.ctor, f'init_cache cannot derive the shape of the input of self.{child.attr}, '
                                       'which holds a decode cache: the code does not fix it')
      method = child.spec.cache.method if child.spec is not None else 'init_cache'
      lines.append(f'self.{child.attr}.{method}({shape_code(shapes[0])}, dtype)')
      lines[-1] = ctx.loops.cache_line(child, lines[-1])  # an nnx.List: `for block in self.blocks: ...`
  plan.cache_lines, plan.cache_input = lines, plan.call_params[0]
  plan.cache_switch = _cache_switch(ctx, plan, walker.own, holders)


def _cache_switch(ctx: ClassContext, plan: ClassRewrite, own: tp.Collection[cst.Call], holders: list[Child]) -> str | None:
  """The field without which the class creates no decode cache, if one: the test `if self.decode:` around every
  cache it creates, or the field it gives every child holding one as that child's switch (`decode=self.decode`);
  a construction giving the field a literal False then holds none (`Child.holds_cache`)."""
  if own and not holders:
    paths = {arm_path(ctx, ctor) for ctor in own}
    tests = [test for test, holds in paths.pop() if holds] if len(paths) == 1 else []
    field = re.fullmatch(r'self\.(\w+)', tests[0]) if len(tests) == 1 else None
    found = {field[1]} if field is not None else set()
  elif holders and not own:
    switches = [c.sibling.cache_switch if c.sibling is not None else c.spec.cache.switch for c in holders]
    values = [c.kwargs.get(switch) if switch else None for c, switch in zip(holders, switches)]
    found = {v.attr.value if isinstance(v, cst.Attribute) and is_self_attr(v) else None for v in values}
  else:
    found = set()
  field = found.pop() if len(found) == 1 else None
  return field if field in plan.field_names else None


def cache_text(ctx: ClassContext, child: Child, env: dict[str, Shape], dtypes: dict[str, str | None]) -> None:
  """A decode cache's creation in init_cache: each `x.shape` / `x.dtype` of its arguments from what the code says of x."""
  replacements: dict[cst.CSTNode, str] = {}
  for arg in child.ctor.args[2:]:
    for sub in (arg.value, *descendants(arg.value)):
      if isinstance(sub, cst.Attribute) and isinstance(sub.value, cst.Name) and sub.attr.value in ('shape', 'dtype'):
        known = env.get(sub.value.value) if sub.attr.value == 'shape' else dtypes.get(sub.value.value)
        if known is not None:
          replacements[sub] = shape_code(known) if sub.attr.value == 'shape' else known
  for arg in child.ctor.args[2:]:
    try:
      queries.check_hoistable(ctx, arg.value, skip=set(replacements))
    except Unsupported as error:
      raise Unsupported(error.node, f'init_cache cannot derive the decode cache {child.linen_name}: '
                                     f'{ctx.facts.code(error.node)} is not fixed by the code before it '
                                     '(only the .shape and .dtype of layer outputs and of the first input are)') from None
  child.size_codes = replacements
  child.cache_text = init_code.variable_text(ctx, child)


def layer_shape(ctx: ClassContext, child: Child, source: tuple[str, ...]) -> Shape:
  """A table layer's output shape from its input's, per the row's `output_shape`."""
  out = child.spec.output_shape
  if out is None or any(k in child.kwargs for k in out.unless):
    return None
  lead, last = split_last(source)
  for kwarg in out.trailing:
    if kwarg == SAME_AS_INPUT:
      trailing: tuple[str, ...] = (last,)
      break
    if kwarg in child.kwargs:
      value = child.kwargs[kwarg]
      if isinstance(value, (cst.Tuple, cst.List)) and out.tuple_ok:
        if any(isinstance(e, cst.StarredElement) for e in value.elements):
          return None
        trailing = tuple(queries.code(ctx, e.value) for e in value.elements)
      elif out.tuple_ok and not isinstance(value, cst.Integer):
        return None  # an int or a tuple: the code does not say which
      else:
        trailing = (queries.code(ctx, value),)
      break
  else:
    return None
  return simplify((*(source if out.keep == 'all' else lead), *trailing))


def sibling_shape(ctx: ClassContext, child: Child, source: tuple[str, ...]) -> Shape:
  """A same-file class's output shape, in the caller's terms."""
  out = child.sibling.output_shape
  if out is None:
    return None
  lead, last = split_last(source)
  parts: list[str] = []
  for part in out:
    if part in ('*input_shape', '*input_shape[:-1]', 'input_shape[-1]'):
      parts += {'*input_shape': source, '*input_shape[:-1]': lead, 'input_shape[-1]': (last,)}[part]
      continue
    star = '*' if part.startswith('*') else ''
    code = None if 'input_shape' in part else sizes.in_caller(ctx, part[len(star):], child)
    if code is None:
      return None
    parts.append(star + code)
  return simplify(tuple(parts))


def reshaped(ctx: ClassContext, expr: cst.CSTNode, env: dict[str, Shape]) -> Shape:
  """`y.reshape(*x.shape[:-1], n)` and the like: the shape, from what the code says of x."""
  elements = sizes.reshape_target(ctx, expr)
  if not elements:
    return None
  parts: list[str] = []
  for element in elements:
    value = element.value
    if isinstance(element, cst.StarredElement):
      sliced = isinstance(value, cst.Subscript) and len(value.slice) == 1 \
          and isinstance(value.slice[0].slice, cst.Slice) and value.slice[0].slice.lower is None \
          and value.slice[0].slice.step is None and value.slice[0].slice.upper is not None \
          and is_minus_one(value.slice[0].slice.upper)
      base = value.value if sliced else value
      if not (isinstance(base, cst.Attribute) and isinstance(base.value, cst.Name) and base.attr.value == 'shape'):
        return None
      known = env.get(base.value.value)
      if known is None:
        return None
      parts += split_last(known)[0] if sliced else known
      continue
    if is_minus_one(value):
      return None
    try:
      queries.check_hoistable(ctx, value)
    except Unsupported:
      return None
    parts.append(queries.code(ctx, value))
  return simplify(tuple(parts))


class CacheShapes(WholeShapeWalk[tuple[str, ...]]):
  """Whole shapes through a class's `__call__`: the decode caches' creation, the shapes its children holding
  caches are called with."""

  def __init__(self, ctx: ClassContext, plan: ClassRewrite, calls: dict[cst.Call, Child]) -> None:
    super().__init__(plan.ifs, plan.branches)
    self.ctx, self.calls = ctx, calls
    self.inputs: dict[str, list[Shape]] = {}  # a child holding a cache -> the shapes init_cache takes, per call
    self.dtypes: dict[str, str | None] = {}
    self.own = {c.ctor: c for c in plan.children if c.cache and c.ctor not in plan.lazy_caches.values()}

  def value(self, expr: cst.CSTNode, env: dict[str, Shape]) -> Shape:
    if isinstance(expr, cst.Name):
      return env.get(expr.value)
    if isinstance(expr, cst.Call) and expr in self.calls:
      return self.layer(expr, env)
    if isinstance(expr, cst.Call) and self.ctx.facts.has_name(expr.func, ELEMENTWISE) \
        and len(expr.args) == 1 and expr.args[0].keyword is None and not expr.args[0].star:
      return self.value(expr.args[0].value, env)
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, ARITHMETIC):
      left, right = self.value(expr.left, env), self.value(expr.right, env)
      return right if is_number(expr.left) else left if is_number(expr.right) else broadcast_shape(left, right)
    for sub in children(expr):
      self.value(sub, env)
    return reshaped(self.ctx, expr, env)

  def layer(self, node: cst.Call, env: dict[str, Shape]) -> Shape:
    child = self.calls[node]
    args = [self.value(a.value, env) for a in node.args]
    if child.holds_cache:
      wanted = child.spec.cache.shape_args if child.spec is not None else (0,)
      position = next((p for p in (sizes.call_arg(self.ctx, node, child, i) for i in wanted) if p is not None), None)
      self.inputs.setdefault(child.attr, []).append(args[position] if position is not None else None)
    first = sizes.call_arg(self.ctx, node, child, 0) if not child.bridged else None
    source = args[first] if first is not None else None
    unsaid = self.ctx.plan.arm_bound.get(child.ctor) in self.ctx.plan.open_locals  # an arm's module the code
    if source is None or child.wrapper is not None or unsaid:                      # does not build: shape unsaid
      return None
    return layer_shape(self.ctx, child, source) if child.spec is not None else sibling_shape(self.ctx, child, source)

  def dtype_of(self, value: cst.CSTNode) -> str | None:
    """The dtype of a layer's output: init_cache's dtype, unless the layer sets its own."""
    if isinstance(value, cst.Call) and value in self.calls and self.calls[value].spec is not None:
      kwargs = self.calls[value].kwargs
      if 'dtype' not in kwargs:
        return 'dtype'
      code = paren(queries.code(self.ctx, kwargs['dtype']))
      return f'dtype if {code} is None else {code}'
    return self.dtypes.get(value.value) if isinstance(value, cst.Name) else None

  def joined(self, name: str, value: Shape) -> None:
    self.dtypes[name] = None if value is None else self.dtypes.get(name)

  def loop(self, statement: cst.BaseStatement, env: dict[str, Shape]) -> bool:
    if statement not in self.ctx.loops.loops:
      return False
    self.ctx.loops.shapes(statement, env, self.walk)  # a for loop building layers: its first and later iterations
    return True

  def unknown_call(self, call: cst.Call) -> None:
    if call in self.calls:
      self.layer(call, {})

  def bind(self, name: str, part: cst.Assign, env: dict[str, Shape]) -> None:
    if part.value in self.own:  # a decode cache, made from what the code says so far
      cache_text(self.ctx, self.own[part.value], env, self.dtypes)
      env[name] = self.dtypes[name] = None
    else:
      env[name], self.dtypes[name] = self.value(part.value, env), self.dtype_of(part.value)

  def augmented(self, part: cst.BaseSmallStatement, env: dict[str, Shape]) -> bool:
    if not (isinstance(part, cst.AugAssign) and isinstance(part.target, cst.Name)
            and type(part.operator).__name__.removesuffix('Assign') in {o.__name__ for o in ARITHMETIC}):
      return False
    value = self.value(part.value, env)
    target = part.target.value
    env[target] = env.get(target) if is_number(part.value) else broadcast_shape(env.get(target), value)
    return True
