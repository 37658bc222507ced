"""Decode caches: the `self.has_variable('cache', ...)` pattern -> `nnx.Cache` attributes made by a
new `init_cache(input_shape, dtype)`, from whole shapes through `__call__` (`dims.CacheShapes`).

A pass of `planner.ClassPlanner`, mixed into it: it reads the file's facts and fills the class's plan.
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002.dims import INPUT_SHAPE
from codemods.rules.l2n002.dims import CacheShapes
from codemods.rules.l2n002.dims import Shape
from codemods.rules.l2n002.dims import shape_code
from codemods.rules.l2n002.dims import simplify
from codemods.rules.l2n002.dims import split_last
from codemods.rules.l2n002.nodes import HAS_VARIABLE_HINT
from codemods.rules.l2n002.nodes import assigned_name
from codemods.rules.l2n002.nodes import is_minus_one
from codemods.rules.l2n002.nodes import is_written
from codemods.rules.l2n002.nodes import scope_api
from codemods.rules.l2n002.plan import Child
from codemods.rules.l2n002.plan import ClassRewrite
from codemods.rules.l2n002.plan import Unsupported
from codemods.rules.l2n002.state import PlannerState
from nnx_bridge.layer_table import SAME_AS_INPUT

if tp.TYPE_CHECKING:
  pass



class DecodeCaches(PlannerState):
  """Decode caches."""

  def _decode_caches(self, plan: ClassRewrite, method: cst.FunctionDef) -> set[cst.Call]:
    """The decode-cache patterns of the @nn.compact method; returns their self.variable calls.

    The pattern (flax's MultiHeadDotProductAttention, the lm1b and wmt examples), in one block:
    `flag = self.has_variable('cache', 'k')`, then `v = self.variable('cache', 'k', init, *args)`
    for each cache, then `if flag: <the update>` (an else is only run by Linen's init). Linen's
    init creates the caches and leaves them as `init` made them; later calls run the update. In
    NNX init_cache creates them, the flag becomes a check that it ran, and the update always runs.
    """
    found: set[cst.Call] = set()
    for call in descendants(method.body):
      if isinstance(call, cst.Call) and scope_api(call) == 'has_variable':
        found |= self._decode_cache(plan, method, call)
    return found

  def _decode_cache(self, plan: ClassRewrite, method: cst.FunctionDef, call: cst.Call) -> set[cst.Call]:
    unsupported = lambda node, why: Unsupported(node, f'{why}{HAS_VARIABLE_HINT}')
    assign, line = self.facts.parent(call), None
    if isinstance(assign, cst.Assign):
      line = self.facts.parent(assign)
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
            and assign.value is call and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
            and len(call.args) == 2 and all(a.keyword is None and isinstance(a.value, cst.SimpleString) for a in call.args)):
      raise unsupported(call, "self.has_variable other than `flag = self.has_variable('cache', '<name>')`")
    collection, name = (a.value.evaluated_value for a in call.args)
    if collection != 'cache':
      raise unsupported(call, f'self.has_variable on the collection {collection!r} (only decode caches, in '
                              "'cache', are converted)")
    if method.name.value != '__call__':
      raise unsupported(call, 'a decode cache in an @nn.compact method other than __call__')
    flag = assign.targets[0].target.value
    block = self.facts.parent(line)
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
    if name not in caches:
      raise unsupported(call, f"self.has_variable('cache', {name!r}) without a "
                              f"`{name} = self.variable('cache', {name!r}, ...)` between it and `if {flag}:`")
    uses = [n for n in descendants(method.body) if isinstance(n, cst.Name) and n.value == flag]
    if [n for n in uses if n is not assign.targets[0].target and n is not guard.test]:
      raise unsupported(call, f'the self.has_variable flag {flag} used other than as `if {flag}:`')
    inside = set(descendants(guard.body))
    for node in descendants(method.body):
      if isinstance(node, cst.Name) and node.value in holders:
        parent = self.facts.parent(node)
        if isinstance(parent, cst.AssignTarget) and self.facts.parent(parent).value in caches.values():
          continue  # `cached_key = self.variable('cache', ...)`
        if isinstance(parent, cst.Attribute) and parent.attr is node or isinstance(parent, cst.Arg) and parent.keyword is node:
          continue  # `other.cached_key`, `f(cached_key=...)`: not the local
        if not (isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == 'value'):
          raise unsupported(node, f'the decode cache {holders[node.value]} used other than through .value')
        if is_written(parent, self.facts.parent) and parent not in inside:
          raise Unsupported(node, f'the decode cache {holders[node.value]} is written outside `if {flag}:`, so '
                                   "Linen's init writes it too: init_cache cannot create it as that init did")
    self.plan.cache_flags[call] = flag
    self.plan.statements[line] = (f'if self.{name} is None:\n'
                              f"  raise ValueError('{plan.name}: the decode cache is empty: call init_cache(input_shape) first')\n")
    self.plan.ifs[guard] = True
    dropped = ' (its else, which only Linen\'s init ran, goes)' if guard.orelse is not None else ''
    self.plan.pending.append((call, f'`{flag} = self.has_variable({collection!r}, {name!r})` -> a check that init_cache '
                                f'created the decode caches; the `if {flag}:` block runs always{dropped}'))
    return set(caches.values())

  def _plan_init_cache(self, node: cst.ClassDef, plan: ClassRewrite, call: cst.FunctionDef, calls: dict[cst.Call, Child],
                       taken: set[str]) -> None:
    """Whole shapes through `__call__` and, for a class with decode caches, the body of init_cache.

    A class whose `__call__` creates decode caches (`_decode_caches`) creates them in
    init_cache(input_shape, dtype) instead, from the shapes the code gives them in terms of the
    shape of its first input; a class with children holding decode caches (converted classes
    with an init_cache, table layers in decode mode) calls theirs with their inputs' shapes.
    Whatever the code does not fix keeps the class Linen.
    """
    walker = CacheShapes(self, plan, calls)
    env: dict[str, Shape] = {plan.call_params[0]: INPUT_SHAPE} if plan.call_params else {}
    plan.output_shape = walker.walk(call.body, env)
    if self.returns_in_branches(call):
      plan.output_shape = None
    holders = [c for c in plan.children if c.holds_cache]
    if not walker.own and not holders:
      return
    if 'init_cache' in taken | {c.attr for c in plan.children}:
      raise Unsupported(node, 'decode caches, and the class already has an attribute init_cache')
    if not plan.call_params:
      raise Unsupported(node, 'decode caches, and __call__ takes no input whose shape init_cache could take')
    if {'input_shape', 'dtype'} & self.facts.global_names:
      raise Unsupported(node, "decode caches, and a module-level name input_shape or dtype that init_cache's "
                               'arguments would hide')
    self.jnp_bound(node)
    lines = []
    for child in plan.children:
      if child.cache:
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
        lines[-1] = self.loops.cache_line(child, lines[-1])  # an nnx.List: `for block in self.blocks: ...`
    plan.cache_lines, plan.cache_input = lines, plan.call_params[0]

  def cache_text(self, child: Child, env: dict[str, Shape], dtypes: dict[str, str | None]) -> None:
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
        self.check_hoistable(arg.value, skip=set(replacements))
      except Unsupported as error:
        raise Unsupported(error.node, f'init_cache cannot derive the decode cache {child.linen_name}: '
                                       f'{self.facts.code(error.node)} is not fixed by the code before it '
                                       '(only the .shape and .dtype of layer outputs and of the first input are)') from None
    child.size_codes = replacements
    child.cache_text = self._variable_text(child)

  def layer_shape(self, child: Child, source: tuple[str, ...]) -> Shape:
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
          trailing = tuple(self.code(e.value) for e in value.elements)
        elif out.tuple_ok and not isinstance(value, cst.Integer):
          return None  # an int or a tuple: the code does not say which
        else:
          trailing = (self.code(value),)
        break
    else:
      return None
    return simplify((*(source if out.keep == 'all' else lead), *trailing))

  def sibling_shape(self, child: Child, source: tuple[str, ...]) -> Shape:
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
      code = None if 'input_shape' in part else self.in_caller(part[len(star):], child)
      if code is None:
        return None
      parts.append(star + code)
    return simplify(tuple(parts))

  def reshaped(self, expr: cst.CSTNode, env: dict[str, Shape]) -> Shape:
    """`y.reshape(*x.shape[:-1], n)` and the like: the shape, from what the code says of x."""
    elements = self.reshape_target(expr)
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
        self.check_hoistable(value)
      except Unsupported:
        return None
      parts.append(self.code(value))
    return simplify(tuple(parts))

  def jnp_bound(self, node: cst.CSTNode) -> bool:
    """Whether `jnp` is `jax.numpy` here (False: unbound, the import is added); raises when it is something else."""
    names = self.facts.names_of(node, 'jnp')
    if names - {'jax.numpy'}:
      raise Unsupported(node, "decode caches, and the name jnp (init_cache's default dtype is jnp.float32) is "
                               'bound to something else here')
    return bool(names)
