"""The size/shape interpreter of L2N002: what the code of a `__call__` says of array sizes.

NNX builds layers in `__init__`, so the input sizes Linen infers on the first call must be known
there. The interpreter walks a method body in order, with one abstract value per local name:

- `LastAxisWalk` follows last-axis sizes (`Dim`): `Known(code)` (code valid in `__init__`, such
  as `self.features`), `Input(i)` (the last axis of call argument i) or None (the code does not
  say). Elementwise functions, pooling and arithmetic keep a size, `concatenate` on the last axis sums
  known sizes; anything else forgets it. A tuple (transformers' `outputs = (hidden_states,) + outputs`) keeps
  the sizes of its first and last elements, read back by `[0]` and `[-1]`. `sizes.SizeWalk` adds what the
  class's children, variables
  and own methods say (for the hoisting, loop and factory passes).
- `WholeShapeWalk` follows whole shapes: `decode_cache.CacheShapes` in terms of the first input's
  (`input_shape`), for the decode-cache pass; `example_shapes.ExampleShapes` as axes of the example
  input, for the shape formulas.

All share `BodyWalk`: the statements that run in NNX (`if [not] self.is_initializing()` blocks
resolved), conditionals of plain code (a name keeps its value only when every arm agrees), loops
(a hook), returns and assignments.
"""

from __future__ import annotations

import dataclasses
import types
import typing as tp

import libcst as cst

from codemods.nodes import children
from codemods.nodes import descendants
from codemods.rules.l2n002.nodes import (
  ARITHMETIC,
  AUGMENTED,
  arm_run,
  assigned_name,
  forget,
  if_arms,
  if_tests,
  is_minus_one,
  is_number,
  paren,
)
from codemods.vocabulary import CONCATENATE, ELEMENTWISE, POOLING, REDUCTIONS, SAME_SHAPE, TILE


class Names(tp.Protocol):
  """What the interpreter asks of a file's facts (`facts.FileFacts`): whether an expression names one of the given
  Linen or JAX names, imports and aliases resolved."""

  def has_name(self, node: cst.CSTNode, names: tp.Collection[str]) -> bool: ...


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
  (a residual reassigned in one arm of an `if`); an input's wins over one the code does not say
  (`self.drop_path(self.mlp(h)) + hidden_states`, a residual around layers of unknown output).
  """
  if left == right:
    return left
  if isinstance(left, Known) or isinstance(right, Known):
    return left if isinstance(left, Known) else right
  return right if left is None else left if right is None else None


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
        yield from self.statements(arm_run(statement, self.ifs[statement]))
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
    """A conditional of plain code: a name keeps its value only when every arm agrees; an arm that leaves it
    None (`layer_outputs = (None, None)`, transformers' LayerDrop) has no say, None having no size."""
    for test in if_tests(statement):
      self.value(test, env)
    ends, nones = [], []
    for arm in if_arms(statement):
      ends.append(dict(env))
      nones.append(_none_names(arm) if arm is not None else set())
      if arm is not None:
        self.walk(arm, ends[-1])
    for name in {name for end in ends for name in end}:
      values = [end.get(name) for end, none in zip(ends, nones) if name not in none] or [end.get(name) for end in ends]
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


def _none_names(arm: cst.BaseSuite) -> set[str]:
  """The names an arm leaves None: its last statement binding each is `name = None` or a tuple of Nones (then
  its elements `name[0]`, ... too, as the walk names them)."""
  found: dict[str, bool] = {}
  for statement in arm.body:
    name = assigned_name(statement)
    if name is not None:
      value = statement.body[0].value
      parts = [e.value for e in value.elements] if isinstance(value, cst.Tuple) and value.elements else [value]
      none = all(isinstance(p, cst.Name) and p.value == 'None' for p in parts)
      found.update({name: none, **{f'{name}[{i}]': none for i in range(len(parts))}})
  return {name for name, none in found.items() if none}


class WholeShapeWalk(BodyWalk[V]):
  """A walk for whole shapes (decode caches, example-input formulas): a block other than a plain conditional
  learns nothing (its calls of children are `unknown_call`s, its names forgotten); in a simple statement a
  `return` gives the output, `name = value` binds the value (`bind`), anything else is evaluated for its calls
  and its names forgotten (unless `augmented` handles it)."""

  def statement(self, statement: cst.BaseStatement, env: dict[str, V | None], output: V | None) -> V | None:
    if not isinstance(statement, cst.SimpleStatementLine):
      for sub in descendants(statement):
        if isinstance(sub, cst.Call):
          self.unknown_call(sub)
      forget(statement, env)
      return output
    for part in statement.body:
      name = assigned_name(cst.SimpleStatementLine([part]))
      if isinstance(part, cst.Return) and part.value is not None:
        output = self.value(part.value, env)
      elif name is not None:
        self.bind(name, part, env)
      elif not self.augmented(part, env):
        for sub in children(part):
          self.value(sub, env)
        forget(part, env)
    return output

  def unknown_call(self, call: cst.Call) -> None:
    """A call inside a block the walk does not enter (a loop, a `with`)."""

  def bind(self, name: str, part: cst.Assign, env: dict[str, V | None]) -> None:
    """`name = <value>`: the name gets the value's shape."""
    env[name] = self.value(part.value, env)

  def augmented(self, part: cst.BaseSmallStatement, env: dict[str, V | None]) -> bool:
    """`name += value` and the like, when the subclass knows what it does (True)."""
    return False


class LastAxisWalk(BodyWalk[Known | Input]):
  """Last-axis sizes through plain array code: names, elementwise functions, pooling, arithmetic, concatenate."""

  def __init__(self, facts: Names, ifs: tp.Mapping[cst.If, bool] = NO_IFS,
               branches: tp.Collection[cst.If] = ()) -> None:
    super().__init__(ifs, branches)
    self.facts = facts
    self.derive = True  # False: walk for the calls only, every size unknown
    self.firsts: dict[cst.CSTNode, Dim] = {}  # a tuple display or call walked -> its first element's size
    self.lasts: dict[cst.CSTNode, Dim] = {}  # ... and its last element's (DistilBERT's `layer_outputs[-1]`)

  def value(self, expr: cst.CSTNode, env: dict[str, Dim]) -> Dim:
    derive = self.derive
    if derive and isinstance(expr, cst.Name):
      return env.get(expr.value)
    if derive and isinstance(expr, cst.Tuple):  # `(hidden_states,)`: a tuple has no last axis; its ends are kept
      dims = [self.value(e.value, env) for e in expr.elements]
      if dims and not isinstance(expr.elements[0], cst.StarredElement):
        self.firsts[expr] = dims[0]
      if dims and not isinstance(expr.elements[-1], cst.StarredElement):
        self.lasts[expr] = dims[-1]
      return None
    if derive and isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add) \
        and (isinstance(expr.left, cst.Tuple) or isinstance(expr.right, cst.Tuple)):
      self.value(expr.left, env)  # `(hidden_states,) + outputs[1:]`: the left tuple's first; `(w,) + output`: the
      self.value(expr.right, env)  # right one's last
      self.firsts[expr] = self.first_element(expr.left, env) if isinstance(expr.left, cst.Tuple) else None
      self.lasts[expr] = self.last_element(expr.right, env)
      return None
    if derive and isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Name) \
        and (end := _end_index(expr)) is not None and tuple_end(expr.value.value, end) in env:
      return env[tuple_end(expr.value.value, end)]  # `layer_outputs[0]` / `[-1]` of a name holding a tuple
    if derive and isinstance(expr, cst.Subscript) and (end := _end_index(expr)) is not None \
        and isinstance(expr.value, (cst.Call, cst.Tuple, cst.BinaryOperation)):
      self.value(expr.value, env)
      return (self.firsts if end == 0 else self.lasts).get(expr.value)  # `block(x)[0]` of a call returning a tuple
    if derive and isinstance(expr, cst.Call) and self.facts.has_name(expr.func, ELEMENTWISE) \
        and len(expr.args) == 1 and expr.args[0].keyword is None and not expr.args[0].star:
      return self.value(expr.args[0].value, env)
    if derive and isinstance(expr, cst.Call) and _cast_of(self.facts, expr) is not None:
      for arg in expr.args[1:]:
        self.value(arg.value, env)
      return self.value(_cast_of(self.facts, expr), env)
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
    if derive and isinstance(expr, cst.IfExp):  # `nn.relu(h) if self.activation else h`: what both arms agree on
      self.value(expr.test, env)
      body, orelse = self.value(expr.body, env), self.value(expr.orelse, env)
      return body if body == orelse else None
    if derive and isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, ARITHMETIC):
      left, right = self.value(expr.left, env), self.value(expr.right, env)
      return right if is_number(expr.left) else left if is_number(expr.right) else broadcast(left, right)
    for sub in children(expr):
      self.value(sub, env)
    return self.reshaped(expr) if derive else None

  def concatenated(self, expr: cst.Call, env: dict[str, Dim]) -> Dim:
    """`jnp.concatenate([a, b], axis=-1)` of known sizes: their sum."""
    first = expr.args[0].value if expr.args else None
    axis = [a.value for a in expr.args[1:] if a.keyword is None or a.keyword.value == 'axis']
    if not (isinstance(first, (cst.List, cst.Tuple)) and len(axis) == 1 and is_minus_one(axis[0])):
      for sub in children(expr):
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
              if not extended:  # `outputs += (attn,)` keeps a tuple's first element, and its last is attn's
                env.pop(first_of_tuple(sub.value), None)
              last = self.last_element(part.value, env) if extended and sub is target else None
              if last is not None:
                env[tuple_end(sub.value, -1)] = last
              else:
                env.pop(tuple_end(sub.value, -1), None)
    return output

  def returned(self, value: cst.BaseExpression, env: dict[str, Dim]) -> Dim:
    return self.value(value, env)

  def assign(self, part: cst.CSTNode, env: dict[str, Dim]) -> bool:
    """`name = value`: the name gets the value's size (True), and a tuple's first element size; False for other
    statements."""
    if isinstance(part, cst.Assign) and len(part.targets) == 1 and isinstance(part.targets[0].target, cst.Name):
      name = part.targets[0].target.value
      env[name] = self.value(part.value, env)
      for end, found in ((0, self.first_element(part.value, env)), (-1, self.last_element(part.value, env))):
        if found is not None:
          env[tuple_end(name, end)] = found
        else:
          env.pop(tuple_end(name, end), None)
      return True
    if self.derive and isinstance(part, cst.AugAssign) and isinstance(part.operator, AUGMENTED) \
        and isinstance(part.target, cst.Name) and env.get(part.target.value) is not None \
        and not isinstance(part.value, cst.Tuple):  # `x += block_input` on an array: as `x = x + block_input`
      right = self.value(part.value, env)
      left = env[part.target.value]
      env[part.target.value] = left if is_number(part.value) else broadcast(left, right)
      return True
    return False

  def first_element(self, value: cst.BaseExpression, env: dict[str, Dim]) -> Dim:
    """The first element's size of the tuple `value` (walked already): a display, a call, a name holding one."""
    if isinstance(value, cst.Name):
      return env.get(first_of_tuple(value.value))
    return self.firsts.get(value)

  def last_element(self, value: cst.BaseExpression, env: dict[str, Dim]) -> Dim:
    """The last element's size of the tuple `value` (walked already), as `first_element`."""
    if isinstance(value, cst.Name):
      return env.get(tuple_end(value.value, -1))
    return self.lasts.get(value)


def _cast_of(facts: Names, call: cst.Call) -> cst.BaseExpression | None:
  """The array a cast or a move of elements keeps the shape of: `jnp.asarray(x, dtype)`'s `x`, `x.astype(dtype)`'s
  `x`, `jnp.flip(x, axis=1)`'s `x`."""
  if call.args and call.args[0].keyword is None and not any(a.star for a in call.args) \
      and facts.has_name(call.func, SAME_SHAPE):
    return call.args[0].value
  if isinstance(call.func, cst.Attribute) and call.func.attr.value == 'astype' and len(call.args) == 1 \
      and not call.args[0].star:
    return call.func.value
  return None


def first_of_tuple(name: str) -> str:
  """The key under which a walk's `env` holds the first element's size of the tuple `name` holds (`outputs[0]`):
  not an identifier, so it never meets a name."""
  return tuple_end(name, 0)


def tuple_end(name: str, end: int) -> str:
  """The `env` key of the first (`end` 0) or last (-1) element's size of the tuple `name` holds."""
  return f'{name}[{end}]'


def _end_index(expr: cst.Subscript) -> int | None:
  """0 for `t[0]`, -1 for `t[-1]`, else None."""
  if not (len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index)):
    return None
  index = literal_int(expr.slice[0].slice.value)
  return index if index in (0, -1) else None
