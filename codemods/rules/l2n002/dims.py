"""The size/shape interpreter of L2N002: what the code of a `__call__` says of array sizes.

NNX builds layers in `__init__`, so the input sizes Linen infers on the first call must be known
there. The interpreter walks a method body in order, with one abstract value per local name:

- `LastAxisWalk` follows last-axis sizes (`Dim`): `Known(code)` (code valid in `__init__`, such
  as `self.features`), `Input(i)` (the last axis of call argument i) or None (the code does not
  say). Elementwise functions, pooling and arithmetic keep a size, `concatenate` on the last axis sums
  known sizes; anything else forgets it. `SizeWalk` adds what the class's children, variables and
  own methods say (for the hoisting, loop and factory passes).
- `CacheShapes` follows whole shapes (`Shape`) in terms of the first input's (`input_shape`), for
  the decode-cache pass.

Both share `BodyWalk`: the statements that run in NNX (`if [not] self.is_initializing()` blocks
resolved), conditionals of plain code (a name keeps its value only when every arm agrees), loops
(a hook), returns and assignments.
"""

from __future__ import annotations

import dataclasses
import types
import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.report import INPUT_DIMENSION
from codemods.report import ConstructorArgument
from codemods.rules.l2n002.nodes import ARITHMETIC
from codemods.rules.l2n002.nodes import assigned_name
from codemods.rules.l2n002.nodes import forget
from codemods.rules.l2n002.nodes import if_arms
from codemods.rules.l2n002.nodes import if_tests
from codemods.rules.l2n002.nodes import is_minus_one
from codemods.rules.l2n002.nodes import is_number
from codemods.rules.l2n002.nodes import paren
from codemods.rules.l2n002.nodes import size_local_of
from codemods.rules.l2n002.plan import Unsupported
from codemods.vocabulary import CONCATENATE
from codemods.vocabulary import ELEMENTWISE
from codemods.vocabulary import POOLING
from codemods.vocabulary import REDUCTIONS
from codemods.vocabulary import TILE

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.facts import FileFacts
  from codemods.rules.l2n002.plan import Child
  from codemods.rules.l2n002.plan import ClassRewrite
  from codemods.rules.l2n002.planner import ClassPlanner


@dataclasses.dataclass(frozen=True)
class Known:
  """A size the code fixes, as code valid in `__init__` (`self.features`, `self.a + self.b`)."""

  code: str


@dataclasses.dataclass(frozen=True)
class Input:
  """The last-axis size of the class's call argument `index`."""

  index: int


Dim = Known | Input | None
"""A last-axis size; None when the code does not say."""

Shape = tuple[str, ...] | None
"""A whole shape as the parts of a tuple display valid in init_cache: ('*input_shape[:-1]', 'self.features'),
in terms of `input_shape`, the shape of the first call argument; None when the code does not fix it."""

INPUT_SHAPE = ('*input_shape',)
NO_IFS: tp.Mapping[cst.If, bool] = types.MappingProxyType({})
V = tp.TypeVar('V')


def broadcast(left: Dim, right: Dim) -> Dim:
  """The last axis of `left op right`: theirs when they agree, else the one the code fixes.

  Two arrays combined elementwise have the same last axis unless one of them is 1 and
  broadcasts: a size the code fixes (a field) wins over an input's, or over one it does not say
  (a residual reassigned in one arm of an `if`).
  """
  if left == right:
    return left
  if isinstance(left, Known) or isinstance(right, Known):
    return left if isinstance(left, Known) else right
  return None


def split_last(shape: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
  """The leading parts and the last axis of a shape: ('*input_shape',) -> (('*input_shape[:-1]',), 'input_shape[-1]')."""
  *lead, last = shape
  if last.startswith('*'):
    return (*lead, f'{last}[:-1]'), f'{last[1:]}[-1]'
  return tuple(lead), last


def simplify(parts: tuple[str, ...]) -> tuple[str, ...]:
  """('*e[:-1]', 'e[-1]') -> ('*e',)."""
  out: list[str] = []
  for part in parts:
    if out and out[-1].startswith('*') and out[-1].endswith('[:-1]') and part == f'{out[-1][1:-len("[:-1]")]}[-1]':
      out[-1] = out[-1][:-len('[:-1]')]
    else:
      out.append(part)
  return tuple(out)


def shape_code(shape: tuple[str, ...]) -> str:
  """The shape as code: `input_shape` for ('*input_shape',), else a tuple display."""
  if len(shape) == 1 and shape[0].startswith('*'):
    return shape[0][1:]
  return f'({", ".join(shape)}{"," if len(shape) == 1 else ""})'


def broadcast_shape(left: Shape, right: Shape) -> Shape:
  """The shape of `left op right`: as `broadcast`, on the last axis once the leading ones agree."""
  if left is None or right is None or left == right:
    return left if left == right else None
  (lead, last), (other_lead, other_last) = split_last(left), split_last(right)
  if lead != other_lead:
    return None
  if last == other_last:
    return left
  if ('input_shape' in last) != ('input_shape' in other_last):  # a size the code fixes wins over an input's
    return simplify((*lead, other_last if 'input_shape' in last else last))
  return None


def reduced_axes(call: cst.Call) -> tuple[int | None, ...] | None:
  """The axes a reduction `jnp.mean(x, axis=(1, 2))` reduces, as literal ints (None for any other value); None
  without an `axis` or when `x` is not its first, positional argument."""
  positional = [a.value for a in call.args if a.keyword is None and not a.star]
  axis = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == 'axis'),
              positional[1] if len(positional) > 1 else None)
  if not call.args or call.args[0].keyword is not None or call.args[0].star or axis is None:
    return None
  values = [e.value for e in axis.elements] if isinstance(axis, (cst.Tuple, cst.List)) else [axis]
  return tuple(literal_int(v) for v in values) or None


def literal_int(value: cst.BaseExpression | None) -> int | None:
  """The int a literal `3` / `-3` is, else None."""
  if isinstance(value, cst.Integer):
    return int(value.value)
  if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus) \
      and isinstance(value.expression, cst.Integer):
    return -int(value.expression.value)
  return None


def keeps_last_axis(call: cst.Call) -> bool:
  """Whether a reduction `jnp.mean(x, axis=...)` reduces only negative literal axes other than -1."""
  axes = reduced_axes(call)
  return axes is not None and all(a is not None and a < -1 for a in axes)


def _bare_slice(index: cst.BaseSlice) -> bool:
  """`:` alone: an index that keeps its axis whole (as the last index, the array's last axis)."""
  return isinstance(index, cst.Slice) and index.lower is None and index.upper is None and index.step is None


class BodyWalk(tp.Generic[V]):
  """A walk of a method body in order, for one abstract value per local name (`env`).

  `ifs`: the `if [not] self.is_initializing():` statements -> whether their body runs in NNX;
  `branches`: the conditionals of plain code walked arm by arm. Subclasses say what an
  expression's value is (`value`) and what a statement does (`statement`).
  """

  def __init__(self, ifs: tp.Mapping[cst.If, bool] = NO_IFS, branches: tp.Collection[cst.If] = ()) -> None:
    self.ifs, self.branches = ifs, branches

  def statements(self, statements: tp.Sequence[cst.BaseStatement]) -> tp.Iterator[cst.BaseStatement]:
    """The statements that run in NNX: `if [not] self.is_initializing():` blocks resolved."""
    for statement in statements:
      if statement in self.ifs:
        if self.ifs[statement]:
          yield from self.statements(statement.body.body)
      else:
        yield statement

  def walk(self, body: cst.BaseSuite, env: dict[str, V | None]) -> V | None:
    """Walks `body`, updating `env`; returns the value of the last `return` reached (None without one)."""
    output: V | None = None
    for statement in self.statements(body.body):
      if statement in self.branches:
        self.branch(statement, env)
      elif not self.loop(statement, env):
        output = self.statement(statement, env, output)
    return output

  def branch(self, statement: cst.If, env: dict[str, V | None]) -> None:
    """A conditional of plain code: a name keeps its value only when every arm agrees."""
    for test in if_tests(statement):
      self.value(test, env)
    ends = []
    for arm in if_arms(statement):
      ends.append(dict(env))
      if arm is not None:
        self.walk(arm, ends[-1])
    for name in {name for end in ends for name in end}:
      values = [end.get(name) for end in ends]
      env[name] = values[0] if all(v == values[0] for v in values) else None
      self.joined(name, env[name])

  def value(self, expr: cst.CSTNode, env: dict[str, V | None]) -> V | None:
    raise NotImplementedError

  def statement(self, statement: cst.BaseStatement, env: dict[str, V | None], output: V | None) -> V | None:
    """Runs one statement; returns the walk's output so far (a `return` replaces it)."""
    raise NotImplementedError

  def loop(self, statement: cst.BaseStatement, env: dict[str, V | None]) -> bool:
    """Walks a loop the subclass knows (True), else leaves it to `statement` (False)."""
    return False

  def joined(self, name: str, value: V | None) -> None:
    """After a conditional: `name` has `value` in every arm (None: they disagree)."""


class LastAxisWalk(BodyWalk[Known | Input]):
  """Last-axis sizes through plain array code: names, elementwise functions, pooling, arithmetic, concatenate."""

  def __init__(self, facts: FileFacts, ifs: tp.Mapping[cst.If, bool] = NO_IFS,
               branches: tp.Collection[cst.If] = ()) -> None:
    super().__init__(ifs, branches)
    self.facts = facts
    self.derive = True  # False: walk for the calls only, every size unknown
    self.firsts: dict[cst.CSTNode, Dim] = {}  # a tuple display or call walked -> its first element's size

  def value(self, expr: cst.CSTNode, env: dict[str, Dim]) -> Dim:
    derive = self.derive
    if derive and isinstance(expr, cst.Name):
      return env.get(expr.value)
    if derive and isinstance(expr, cst.Tuple):  # `(hidden_states,)`: a tuple has no last axis; its first is kept
      dims = [self.value(e.value, env) for e in expr.elements]
      if dims and not isinstance(expr.elements[0], cst.StarredElement):
        self.firsts[expr] = dims[0]
      return None
    if derive and isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Name) \
        and first_of_tuple(expr.value.value) in env and _index_zero(expr):
      return env[first_of_tuple(expr.value.value)]  # `layer_outputs[0]` of a name holding a tuple
    if derive and isinstance(expr, cst.Call) and self.facts.has_name(expr.func, ELEMENTWISE) \
        and len(expr.args) == 1 and expr.args[0].keyword is None and not expr.args[0].star:
      return self.value(expr.args[0].value, env)
    if derive and isinstance(expr, cst.Call) and self.facts.has_name(expr.func, POOLING) and expr.args \
        and expr.args[0].keyword is None and not expr.args[0].star:
      for arg in expr.args[1:]:
        self.value(arg.value, env)
      return self.value(expr.args[0].value, env)  # a window over the spatial axes: the features axis is kept
    if derive and isinstance(expr, cst.Call) and self.facts.has_name(expr.func, REDUCTIONS) \
        and keeps_last_axis(expr):
      return self.value(expr.args[0].value, env)
    if derive and isinstance(expr, cst.Call) and self.facts.has_name(expr.func, CONCATENATE):
      return self.concatenated(expr, env)
    if derive and isinstance(expr, cst.Call) and self.facts.has_name(expr.func, TILE) and len(expr.args) == 2 \
        and isinstance(expr.args[1].value, (cst.List, cst.Tuple)) and expr.args[1].value.elements \
        and isinstance(expr.args[1].value.elements[-1].value, cst.Integer) \
        and expr.args[1].value.elements[-1].value.value == '1':
      self.value(expr.args[1].value, env)
      return self.value(expr.args[0].value, env)
    if derive and isinstance(expr, cst.Subscript) and expr.slice and _bare_slice(expr.slice[-1].slice):
      for element in expr.slice:  # `h[:, 0, :]`: the last axis is the one the trailing `:` keeps
        self.value(element, env)
      return self.value(expr.value, env)
    if derive and isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, ARITHMETIC):
      left, right = self.value(expr.left, env), self.value(expr.right, env)
      return right if is_number(expr.left) else left if is_number(expr.right) else broadcast(left, right)
    for sub in expr.children:
      self.value(sub, env)
    return self.reshaped(expr) if derive else None

  def concatenated(self, expr: cst.Call, env: dict[str, Dim]) -> Dim:
    """`jnp.concatenate([a, b], axis=-1)` of known sizes: their sum."""
    first = expr.args[0].value if expr.args else None
    axis = [a.value for a in expr.args[1:] if a.keyword is None or a.keyword.value == 'axis']
    if not (isinstance(first, (cst.List, cst.Tuple)) and len(axis) == 1 and is_minus_one(axis[0])):
      for sub in expr.children:
        self.value(sub, env)
      return None
    parts = self.concatenated_parts([self.value(e.value, env) for e in first.elements], expr)
    if not parts or any(isinstance(e, cst.StarredElement) for e in first.elements) \
        or any(not isinstance(p, Known) for p in parts):
      return None
    return Known(' + '.join(paren(p.code) for p in parts))

  def concatenated_parts(self, parts: list[Dim], expr: cst.Call) -> list[Dim]:
    """The sizes a concatenate adds up; a subclass may make inputs' sizes known."""
    return parts

  def reshaped(self, expr: cst.CSTNode) -> Dim:
    """The last axis a reshape gives; unknown here (a subclass knows what __init__ can evaluate)."""
    return None

  def statement(self, statement: cst.BaseStatement, env: dict[str, Dim], output: Dim) -> Dim:
    parts = statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]
    for part in parts:
      if isinstance(part, cst.Return) and part.value is not None:
        output = self.returned(part.value, env)
      elif not self.assign(part, env):
        self.value(part, env)
        targets = [t.target for t in getattr(part, 'targets', ())] + [getattr(part, 'target', None)]
        extended = isinstance(part, cst.AugAssign) and isinstance(part.operator, cst.AddAssign)
        for target in filter(None, targets):
          for sub in (target, *descendants(target)):
            if isinstance(sub, cst.Name):
              env[sub.value] = None
              if not extended:  # `outputs += (attn,)` keeps a tuple's first element
                env.pop(first_of_tuple(sub.value), None)
    return output

  def returned(self, value: cst.BaseExpression, env: dict[str, Dim]) -> Dim:
    return self.value(value, env)

  def assign(self, part: cst.CSTNode, env: dict[str, Dim]) -> bool:
    """`name = value`: the name gets the value's size (True), and a tuple's first element size; False for other
    statements."""
    if isinstance(part, cst.Assign) and len(part.targets) == 1 and isinstance(part.targets[0].target, cst.Name):
      name = part.targets[0].target.value
      env[name] = self.value(part.value, env)
      first = env.get(first_of_tuple(part.value.value)) if isinstance(part.value, cst.Name) \
          else self.firsts.get(part.value)
      if first is not None:
        env[first_of_tuple(name)] = first
      else:
        env.pop(first_of_tuple(name), None)
      return True
    return False

  def first_element(self, value: cst.BaseExpression, env: dict[str, Dim]) -> Dim:
    """The first element's size of the tuple `value` (walked already): a display, a call, a name holding one."""
    if isinstance(value, cst.Name):
      return env.get(first_of_tuple(value.value))
    return self.firsts.get(value)


def first_of_tuple(name: str) -> str:
  """The key under which a walk's `env` holds the first element's size of the tuple `name` holds (`outputs[0]`):
  not an identifier, so it never meets a name."""
  return f'{name}[0]'


def _index_zero(expr: cst.Subscript) -> bool:
  return len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index) \
      and isinstance(expr.slice[0].slice.value, cst.Integer) and expr.slice[0].slice.value.value == '0'


class SizeWalk(LastAxisWalk):
  """Last-axis sizes through a class's `__call__`, into its own methods, sizing each child it reaches."""

  def __init__(self, p: ClassPlanner, plan: ClassRewrite, methods: dict[str, cst.FunctionDef], call: cst.FunctionDef,
               calls: dict[cst.Call, Child], carry: Dim) -> None:
    super().__init__(p.facts, plan.ifs, plan.branches)
    self.p, self.plan, self.methods, self.call, self.calls, self.carry = p, plan, methods, call, calls, carry
    self.scanned = plan.name in p.facts.scanned_cells
    self.returned_carry: list[Dim] = []
    self.returned_first: list[Dim] = []  # of the last `return` of __call__ itself, when it returns a tuple
    self.shared: dict[tp.Any, str] = {}
    self.visited: set[cst.Call] = set()
    self.active: list[cst.FunctionDef] = []
    self.variables = {c.ctor: c for c in plan.children if c.api is not None and c.hoisted}
    self.size_locals: dict[str, Dim] = {}  # `d = x.shape[-1]`: what the code said of x there

  def run(self) -> Dim:
    """Walks `__call__` (and every child call it does not reach); the carry's size for a scanned cell."""
    inputs = {name: Input(i) for i, name in enumerate(self.plan.call_params)}
    if self.carry is not None and self.plan.call_params:
      inputs[self.plan.call_params[0]] = self.carry
    self.active.append(self.call)
    self.derive = self.p.is_straight(self.call.body)
    self.plan.output = self.walk(self.call.body, inputs)
    self.plan.first_output = self.returned_first[0] if self.returned_first else None
    if self.p.returns_in_branches(self.call):
      self.plan.output = self.plan.first_output = None
    self.derive = False
    for node in self.calls:  # calls in methods __call__ does not reach: still checked, sizes undetermined
      if node not in self.visited:
        self.visit(node, {})
    for child in self.plan.children:
      if child.api is not None and child.hoisted:
        self.resolve(child, {})
      elif child.api is None and not child.done:
        for nnx_arg, index, optional in self.p.size_sources(child):
          if not optional:
            child.sizes[nnx_arg] = self.p.size_param(self.plan, child, nnx_arg, None, None, child.ctor)
    self.plan.carry_output = self.returned_carry[0] if self.returned_carry else None
    carry = self.returned_carry[0] if self.returned_carry else None
    return carry if isinstance(carry, Known) else None

  def value(self, expr: cst.CSTNode, env: dict[str, Dim]) -> Dim:
    if isinstance(expr, cst.Call) and expr in self.calls:
      return self.visit(expr, env)
    if isinstance(expr, cst.Call) and expr in self.variables:
      self.resolve(self.variables[expr], env)
      return self.last_of_shape(self.variables[expr]) if self.derive else None
    method = self.p.own_method(expr, self.methods)
    if method is not None:
      return self.enter(expr, method, env)
    if self.derive and self.p.factories.is_activation(expr):  # `self.act(x)`, a Callable field: elementwise
      return self.value(expr.args[0].value, env)
    return super().value(expr, env)

  def reshaped(self, expr: cst.CSTNode) -> Dim:
    target = self.p.reshape_target(expr)
    if target and isinstance(target[-1].value, cst.Name) and target[-1].value.value in self.size_locals:
      return self.size_locals[target[-1].value.value]  # `jnp.reshape(x, (n, h * w, c))` after `n, h, w, c = x.shape`
    last = self.p.reshaped_last(expr)
    return Known(last) if last is not None else None

  def concatenated_parts(self, parts: list[Dim], expr: cst.Call) -> list[Dim]:
    if self.scanned and self.carry is not None and parts and all(p is not None for p in parts) \
        and any(isinstance(p, Known) for p in parts):  # a cell's carry and input: the input's last axis
      return [p if isinstance(p, Known) else Known(self.input_size(p.index, expr)) for p in parts]
    return parts

  def loop(self, statement: cst.BaseStatement, env: dict[str, Dim]) -> bool:
    if statement not in self.p.loops.loops:
      return False
    self.p.loops.derive(self.p, self.plan, statement, env, self.derive, self.walk, self.shared)  # every iteration
    return True

  def returned(self, value: cst.BaseExpression, env: dict[str, Dim]) -> Dim:
    if self.scanned and self.active == [self.call] and isinstance(value, cst.Tuple) and len(value.elements) == 2 \
        and not any(isinstance(e, cst.StarredElement) for e in value.elements):  # a scanned cell's (carry, y)
      self.returned_carry[:] = [self.value(value.elements[0].value, env)]
      self.value(value.elements[1].value, env)
      return None
    dim = self.value(value, env)
    if self.active == [self.call]:
      self.returned_first[:] = [self.first_element(value, env)]
    return dim

  def assign(self, part: cst.CSTNode, env: dict[str, Dim]) -> bool:
    local = size_local_of(part) if isinstance(part, cst.Assign) else None
    if local is not None:
      self.size_locals[local[0]] = env.get(local[1]) if self.derive else None
    if super().assign(part, env):
      return True
    if isinstance(part, cst.Assign) and len(part.targets) == 1 and part.value in self.calls:
      self.value(part, env)
      first = self.scanned_carry(part.targets[0].target, part.value, env)
      for sub in (part.targets[0].target, *descendants(part.targets[0].target)):
        if isinstance(sub, cst.Name):
          env[sub.value] = first if first is not None and sub is part.targets[0].target.elements[0].value else None
          env.pop(first_of_tuple(sub.value), None)
      return True
    return False

  def scanned_carry(self, target: cst.BaseExpression, call: cst.Call, env: dict[str, Dim]) -> Dim:
    """`x, _ = <scan over a class of the file>(x, ...)`: the carry's size, from what the class returns."""
    child = self.calls[call]
    if not (self.derive and isinstance(target, cst.Tuple) and len(target.elements) == 2
            and isinstance(target.elements[0].value, cst.Name) and child.sibling is not None
            and (child.scan is not None or child.stacked is not None) and child.sibling.carry_output is not None):
      return None
    carry = child.sibling.carry_output
    if isinstance(carry, Input):
      return self.value(call.args[carry.index].value, env) if carry.index < len(call.args) else None
    code = self.p.in_caller(carry.code, child)
    return None if code is None else Known(code)

  def last_of_shape(self, child: Child) -> Dim:
    """A param's last axis: the last of its literal shape tuple (`self.param('p', init, (1, n, d))`)."""
    shape = child.ctor.args[2].value if child.api == 'param' and len(child.ctor.args) > 2 else None
    if not isinstance(shape, (cst.Tuple, cst.List)) or not shape.elements \
        or isinstance(shape.elements[-1], cst.StarredElement):
      return None
    last = shape.elements[-1].value
    if last in child.shape_refs:
      return child.ref_dims.get(last)
    try:
      self.p.check_hoistable(last)
    except Unsupported:
      return None
    return Known(self.p.code(last))

  def input_size(self, index: int, node: cst.CSTNode) -> str:
    """A size argument for the last axis of call argument `index`."""
    key = Input(index)
    if key not in self.shared:
      name = f'{self.plan.call_params[index]}_features'
      while name in self.plan.field_names or name in {p for p, _ in self.plan.size_params} or name == 'rngs':
        name += '_'
      self.plan.size_params.append((name, key))
      detail = f'the size of the last axis of {self.plan.call_params[index]}'
      self.plan.size_arguments.append(ConstructorArgument(name, INPUT_DIMENSION, detail, None,
                                                          input=self.plan.call_params[index]))
      self.plan.pending.append((node, f'new constructor argument {name}: {detail}'))
      self.shared[key] = name
    return self.shared[key]

  def visit(self, node: cst.Call, env: dict[str, Dim]) -> Dim:
    """A call of a child: its train/eval arguments checked, its sizes from its arguments', its output's size."""
    self.visited.add(node)
    child = self.calls[node]
    dropped = self.p.call_modes(node, child)
    attr = self.plan.calls[node][0] if node in self.plan.calls else None
    if attr or dropped:
      self.plan.calls[node] = (attr, dropped)
    arg_dims = [self.value(a.value, env) for a in node.args]
    if self.derive:
      self.firsts[node] = self.p.first_output_dim(child, arg_dims)
    if child.ctor in self.p.loops.sites:  # built in a for loop: sized by loops.py from every iteration
      self.p.loops.seen(self.p, child, node, arg_dims)
      return self.p.output_dim(child, arg_dims)
    if not child.done:
      child.done = True
      self.shape_sizes(child, env)
      for nnx_arg, index, optional in self.p.size_sources(child):
        position = self.p.call_arg(node, child, index)
        if position is None and optional:
          continue
        source = arg_dims[position] if position is not None else None
        if isinstance(source, Known):
          child.sizes[nnx_arg] = source.code
          continue
        key = source if source is not None else (child.attr, nnx_arg)
        if key not in self.shared:
          argument = self.p.facts.code(node.args[position].value) if position is not None else None
          where = None if argument is None else f"the input dimension of self.{child.attr}'s call argument {argument}"
          self.shared[key] = self.p.size_param(self.plan, child, nnx_arg, where, source, node, input_index=position)
        child.sizes[nnx_arg] = self.shared[key]
    if child.wrapper is not None and any(a.keyword is not None and a.keyword.value in child.wrapper.output_unless
                                         for a in node.args):
      return None  # `return_carry=True` at call time: a (carry, outputs) pair
    return self.p.output_dim(child, arg_dims)

  def resolve(self, child: Child, env: dict[str, Dim]) -> None:
    """A hoisted variable's shape: each `x.shape[-1]` from what the code says of x."""
    if child.done:
      return
    child.done = True
    self.shape_sizes(child, env)

  def shape_sizes(self, child: Child, env: dict[str, Dim]) -> None:
    """Each `x.shape[-1]` (or local bound to one) in a child's arguments: what the code says of x."""
    for ref, name in child.shape_refs.items():
      source = (self.size_locals.get(name) if isinstance(ref, cst.Name) else env.get(name)) if self.derive else None
      child.ref_dims[ref] = source
      if isinstance(source, Known):
        child.size_codes[ref] = paren(source.code)
        continue
      key = source if source is not None else (child.attr, name)
      if key not in self.shared:
        array = self.p.size_local(ref) if isinstance(ref, cst.Name) else name
        label = array if array == name else f'{array} (bound to {name})'
        self.shared[key] = self.p.size_param(self.plan, child, 'features', f'the size of the last axis of {label}',
                                             source, ref, shape_ref=True)
      child.size_codes[ref] = self.shared[key]

  def enter(self, node: cst.Call, method: cst.FunctionDef, env: dict[str, Dim]) -> Dim:
    """A call of one of the class's own methods: its arguments bound to what the caller knows."""
    arg_dims = [(a.keyword.value if a.keyword else i, self.value(a.value, env)) for i, a in enumerate(node.args)]
    if method in self.active or any(a.star for a in node.args):
      return None
    names = [p.name.value for p in method.params.params[1:]]
    inner = {names[k] if isinstance(k, int) and k < len(names) else k: d for k, d in arg_dims}
    self.active.append(method)
    derive, self.derive = self.derive, self.derive and self.p.is_straight(method.body)
    try:
      return self.walk(method.body, inner)
    finally:
      self.active.pop()
      self.derive = derive


class CacheShapes(BodyWalk[tuple[str, ...]]):
  """Whole shapes through a class's `__call__`: the decode caches' creation, the shapes its children holding
  caches are called with."""

  def __init__(self, p: ClassPlanner, plan: ClassRewrite, calls: dict[cst.Call, Child]) -> None:
    super().__init__(plan.ifs, plan.branches)
    self.p, self.calls = p, calls
    self.inputs: dict[str, list[Shape]] = {}  # a child holding a cache -> the shapes init_cache takes, per call
    self.dtypes: dict[str, str | None] = {}
    self.own = {c.ctor: c for c in plan.children if c.cache}

  def value(self, expr: cst.CSTNode, env: dict[str, Shape]) -> Shape:
    if isinstance(expr, cst.Name):
      return env.get(expr.value)
    if isinstance(expr, cst.Call) and expr in self.calls:
      return self.layer(expr, env)
    if isinstance(expr, cst.Call) and self.p.facts.has_name(expr.func, ELEMENTWISE) \
        and len(expr.args) == 1 and expr.args[0].keyword is None and not expr.args[0].star:
      return self.value(expr.args[0].value, env)
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, ARITHMETIC):
      left, right = self.value(expr.left, env), self.value(expr.right, env)
      return right if is_number(expr.left) else left if is_number(expr.right) else broadcast_shape(left, right)
    for sub in expr.children:
      self.value(sub, env)
    return self.p.reshaped(expr, env)

  def layer(self, node: cst.Call, env: dict[str, Shape]) -> Shape:
    child = self.calls[node]
    args = [self.value(a.value, env) for a in node.args]
    if child.holds_cache:
      wanted = child.spec.cache.shape_args if child.spec is not None else (0,)
      position = next((p for p in (self.p.call_arg(node, child, i) for i in wanted) if p is not None), None)
      self.inputs.setdefault(child.attr, []).append(args[position] if position is not None else None)
    first = self.p.call_arg(node, child, 0) if not child.bridged else None
    source = args[first] if first is not None else None
    if source is None or child.wrapper is not None:
      return None
    return self.p.layer_shape(child, source) if child.spec is not None else self.p.sibling_shape(child, source)

  def dtype_of(self, value: cst.CSTNode) -> str | None:
    """The dtype of a layer's output: init_cache's dtype, unless the layer sets its own."""
    if isinstance(value, cst.Call) and value in self.calls and self.calls[value].spec is not None:
      kwargs = self.calls[value].kwargs
      if 'dtype' not in kwargs:
        return 'dtype'
      code = paren(self.p.code(kwargs['dtype']))
      return f'dtype if {code} is None else {code}'
    return self.dtypes.get(value.value) if isinstance(value, cst.Name) else None

  def joined(self, name: str, value: Shape) -> None:
    self.dtypes[name] = None if value is None else self.dtypes.get(name)

  def loop(self, statement: cst.BaseStatement, env: dict[str, Shape]) -> bool:
    if statement not in self.p.loops.loops:
      return False
    self.p.loops.shapes(statement, env, self.walk)  # a for loop building layers: its first and later iterations
    return True

  def statement(self, statement: cst.BaseStatement, env: dict[str, Shape], output: Shape) -> Shape:
    if not isinstance(statement, cst.SimpleStatementLine):  # other blocks: their calls learn nothing
      for sub in descendants(statement):
        if isinstance(sub, cst.Call) and sub in self.calls:
          self.layer(sub, {})
      forget(statement, env)
      return output
    for part in statement.body:
      name = assigned_name(cst.SimpleStatementLine([part]))
      if isinstance(part, cst.Return) and part.value is not None:
        output = self.value(part.value, env)
      elif name is not None and part.value in self.own:  # a decode cache, made from what the code says so far
        self.p.cache_text(self.own[part.value], env, self.dtypes)
        env[name] = self.dtypes[name] = None
      elif name is not None:
        env[name], self.dtypes[name] = self.value(part.value, env), self.dtype_of(part.value)
      elif isinstance(part, cst.AugAssign) and isinstance(part.target, cst.Name) \
          and type(part.operator).__name__.removesuffix('Assign') in {o.__name__ for o in ARITHMETIC}:
        value = self.value(part.value, env)
        target = part.target.value
        env[target] = env.get(target) if is_number(part.value) else broadcast_shape(env.get(target), value)
      else:
        for sub in part.children:
          self.value(sub, env)
        forget(part, env)
    return output
