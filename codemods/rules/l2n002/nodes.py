"""Helpers over the libcst nodes of a Linen class that the L2N002 passes share."""

from __future__ import annotations

import keyword
import re
import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.vocabulary import (
  NNX_INITIALIZERS,
  NNX_SAME_SIGNATURE,
  NNX_TWINS,
  RNGS_ATTRIBUTES,
  SCOPE_APIS,
  nnx_initializer_target,
)

HAS_VARIABLE_HINT = (' (a decode cache or a lazily created variable: in NNX, create it in an explicit '
                     'cache-initialisation method)')
"""Why the scope API has_variable has no automatic conversion."""
DEFERRING: dict[type[cst.CSTNode], str] = {  # an expression whose parts run only sometimes, or later
    cst.Lambda: 'a lambda', cst.ListComp: 'a list comprehension', cst.DictComp: 'a dict comprehension',
    cst.GeneratorExp: 'a generator expression', cst.IfExp: 'a conditional expression (a if c else b)',
    cst.BooleanOperation: 'an and/or expression',
}
"""How a TODO names the construct a submodule construction sits in, which NNX cannot build in __init__ as it is."""
ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)
"""The binary operators sizes flow through (elementwise with a scalar or broadcast)."""
AUGMENTED = (cst.AddAssign, cst.SubtractAssign, cst.MultiplyAssign, cst.DivideAssign)
"""Their augmented assignments (`x += block_input`)."""


def nnx_counterpart(qualified: str) -> str | None:
  """'nnx.initializers.zeros' / 'nnx.relu': the flax.nnx name of the same Linen object, if any."""
  initializer = nnx_initializer_target(qualified)
  if initializer is not None:
    return f'nnx.{initializer}' if initializer.rpartition('.')[2] in NNX_INITIALIZERS | {'initializers'} else None
  name = qualified.rpartition('.')[2]
  return f'nnx.{name}' if name in NNX_TWINS | NNX_SAME_SIGNATURE else None


def snake(name: str) -> str:
  return re.sub(r'(?<=[a-z0-9])(?=[A-Z])', '_', name).lower()


class Replace(cst.CSTTransformer):
  """Replaces given nodes of the original tree with code, or with another node of the tree (a local's value, itself
  rewritten by the same replacements, in parentheses where it is not atomic)."""

  def __init__(self, replacements: tp.Mapping[cst.CSTNode, str | cst.BaseExpression],
               keywords: tp.Mapping[cst.Call, str] | None = None) -> None:
    super().__init__()
    self._replacements, self._keywords = replacements, keywords or {}

  def on_leave(self, original_node: cst.CSTNode, updated_node: tp.Any) -> tp.Any:
    if original_node in self._keywords:
      updated_node = with_keyword(updated_node, self._keywords[original_node])
    if original_node not in self._replacements:
      return updated_node
    replacement = self._replacements[original_node]
    if isinstance(replacement, str):
      return cst.parse_expression(replacement)
    value = replacement.visit(self)
    if isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.SimpleString, cst.Integer,
                          cst.Float, cst.Tuple, cst.List, cst.Dict)) or value.lpar:
      return value
    return value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def with_keyword(call: cst.Call, code: str) -> cst.Call:
  """`call` with the keyword arguments `code` (`eager_sharding=False`, `a=x, b=y`) added last, each laid out as the
  arguments before it: on the line of the last one, or on a line of its own after a trailing comma."""
  for added in tp.cast(cst.Call, cst.parse_expression(f'f({code})')).args:
    call = _with_argument(call, added.with_changes(comma=cst.MaybeSentinel.DEFAULT))
  return call


def _with_argument(call: cst.Call, added: cst.Arg) -> cst.Call:
  if not call.args:
    return call.with_changes(args=[added])
  *before, last = call.args
  if isinstance(last.comma, cst.Comma):  # a trailing comma: the new argument takes it, after the last one's spacing
    spacing = before[-1].comma.whitespace_after if before and isinstance(before[-1].comma, cst.Comma) \
        else call.whitespace_before_args
    if isinstance(spacing, cst.SimpleWhitespace) and not spacing.value:  # `f(a,)`
      spacing = cst.SimpleWhitespace(' ')
    added = added.with_changes(comma=last.comma)
    last = last.with_changes(comma=cst.Comma(whitespace_after=spacing))
  else:
    added = added.with_changes(whitespace_after_arg=last.whitespace_after_arg)
    last = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(' ')),
                             whitespace_after_arg=cst.SimpleWhitespace(''))
  return call.with_changes(args=[*before, last, added])


def scope_api(call: cst.Call) -> str | None:
  """'param' for `self.param(...)`, ...: the Linen scope API a call uses, else None."""
  func = call.func
  if isinstance(func, cst.Attribute) and is_self_attr(func) and func.attr.value in SCOPE_APIS:
    return func.attr.value
  return None


def cache_read(node: cst.Subscript) -> str | None:
  """'k' for `self.variables['cache']['k']`, else None."""
  inner = node.value
  if not (isinstance(inner, cst.Subscript) and isinstance(inner.value, cst.Attribute) and is_self_attr(inner.value)
          and inner.value.attr.value == 'variables'):
    return None
  keys = [_literal_index(s) for s in (inner.slice, node.slice)]
  return keys[1] if keys[0] == 'cache' else None


def _literal_index(slices: tp.Sequence[cst.SubscriptElement]) -> str | None:
  """The string of a `['name']` subscript, else None."""
  if len(slices) == 1 and isinstance(slices[0].slice, cst.Index) and isinstance(slices[0].slice.value, cst.SimpleString):
    return slices[0].slice.value.evaluated_value
  return None


def is_initializing_if(statement: cst.CSTNode) -> bool:
  """`if self.is_initializing():` / `if not self.is_initializing():`, with or without an `else:` (not an elif)."""
  if not isinstance(statement, cst.If) or isinstance(statement.orelse, cst.If):
    return False
  test = statement.test
  if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
    test = test.expression
  return isinstance(test, cst.Call) and scope_api(test) == 'is_initializing' and not test.args


def arm_run(statement: cst.If, body_runs: bool) -> tp.Sequence[cst.BaseStatement]:
  """The statements of `statement` (an `if` without elif) that run: its body, or its else arm (none without one)."""
  if body_runs:
    return statement.body.body
  return statement.orelse.body.body if isinstance(statement.orelse, cst.Else) else ()


def assigned_name(statement: cst.CSTNode) -> str | None:
  """The name of a `name = value` statement, else None."""
  if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
    assign = statement.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
      return assign.targets[0].target.value
  return None


def is_written(node: cst.CSTNode, parent_of: tp.Callable[[cst.CSTNode], cst.CSTNode | None]) -> bool:
  """Whether `node` is (part of) an assignment target: `node = ...`, `node += ...`, `a, node = ...`."""
  parent = parent_of(node)
  while isinstance(parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
    node, parent = parent, parent_of(parent)
  return isinstance(parent, cst.AssignTarget) or (isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is node)


def assigned_names(node: cst.CSTNode, parent_of: tp.Callable[[cst.CSTNode], cst.CSTNode | None]) -> set[str]:
  """The local names a statement (and the blocks in it) may bind: assignment, `for`, `with ... as` and `:=`
  targets."""
  targets = [sub for sub in descendants(node) if isinstance(sub, cst.Name) and is_written(sub, parent_of)]
  for sub in descendants(node):
    target = sub.target if isinstance(sub, (cst.For, cst.NamedExpr)) else \
        sub.asname.name if isinstance(sub, cst.WithItem) and sub.asname is not None else None
    targets += [n for n in (target, *descendants(target)) if isinstance(n, cst.Name)] if target is not None else []
  return {name.value for name in targets}


def make_rng_stream(node: cst.CSTNode) -> str | None:
  """The stream of `self.make_rng('<literal>')`; None for any other node."""
  if not (isinstance(node, cst.Call) and scope_api(node) == 'make_rng' and len(node.args) == 1
          and node.args[0].keyword is None and isinstance(node.args[0].value, cst.SimpleString)):
    return None
  return node.args[0].value.evaluated_value


def init_draw(stream: str) -> str:
  """The code that draws a key of `stream` from __init__'s `rngs` (from its `default` stream when the Rngs have no
  such stream)."""
  return f'rngs{stream_access(stream)}()'


def has_scope_call(node: cst.CSTNode) -> bool:
  return any(isinstance(sub, cst.Call) and scope_api(sub) for sub in (node, *descendants(node)))


def is_straight_statement(statement: cst.CSTNode) -> bool:
  """A simple statement, or an `if [not] self.is_initializing():` block NNX resolves."""
  return isinstance(statement, cst.SimpleStatementLine) or is_initializing_if(statement)


def forget(node: cst.CSTNode, env: dict[str, tp.Any]) -> None:
  """Every name `node` assigns no longer has what the code said of it."""
  for sub in descendants(node):
    targets = []
    if isinstance(sub, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr, cst.AsName)):
      targets.append(sub.target if not isinstance(sub, cst.AsName) else sub.name)
    for target in targets:
      for name in (target, *descendants(target)):
        if isinstance(name, cst.Name) and name.value in env:
          env[name.value] = None


def if_arms(statement: cst.If) -> list[cst.BaseSuite | None]:
  """The bodies of an if / elif / else chain; None for a missing else."""
  arms: list[cst.BaseSuite | None] = []
  node: cst.CSTNode | None = statement
  while isinstance(node, cst.If):
    arms.append(node.body)
    node = node.orelse
  arms.append(node.body if isinstance(node, cst.Else) else None)
  return arms


def if_tests(statement: cst.If) -> list[cst.BaseExpression]:
  tests = []
  node: cst.CSTNode | None = statement
  while isinstance(node, cst.If):
    tests.append(node.test)
    node = node.orelse
  return tests


def is_number(node: cst.CSTNode) -> bool:
  if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
    node = node.expression
  return isinstance(node, (cst.Integer, cst.Float))


def last_axis_array(node: cst.CSTNode) -> str | None:
  """`x` for `x.shape[-1]`, `x[0]` for `x[0].shape[-1]` (an element of the name x at a literal index); else None.
  An element is no name the size walk follows: its size is never derived from what the code says of `x`."""
  if not (isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute) and node.value.attr.value == 'shape'
          and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index)
          and is_minus_one(node.slice[0].slice.value)):
    return None
  array = node.value.value
  if isinstance(array, cst.Name):
    return array.value
  if isinstance(array, cst.Subscript) and isinstance(array.value, cst.Name) and len(array.slice) == 1 \
      and isinstance(array.slice[0].slice, cst.Index) and isinstance(array.slice[0].slice.value, cst.Integer):
    return f'{array.value.value}[{array.slice[0].slice.value.value}]'
  return None


def size_local_of(assign: cst.Assign) -> tuple[str, str] | None:
  """(local, array) for `d = x.shape[-1]` (`d = x[0].shape[-1]`) and `n, _, d = x.shape` (the last target is the
  last axis)."""
  if len(assign.targets) != 1:
    return None
  target, value = assign.targets[0].target, assign.value
  if isinstance(target, cst.Name) and (array := last_axis_array(value)) is not None:
    return target.value, array
  if isinstance(target, (cst.Tuple, cst.List)) and target.elements and isinstance(target.elements[-1].value, cst.Name) \
      and not isinstance(target.elements[-1], cst.StarredElement) and isinstance(value, cst.Attribute) \
      and value.attr.value == 'shape' and isinstance(value.value, cst.Name):
    return target.elements[-1].value.value, value.value.value
  return None


def is_minus_one(node: cst.CSTNode) -> bool:
  return (isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus)
          and isinstance(node.expression, cst.Integer) and node.expression.value == '1')


def literal_identifier(node: cst.CSTNode) -> bool:
  return (isinstance(node, cst.SimpleString) and node.evaluated_value.isidentifier()
          and not keyword.iskeyword(node.evaluated_value))


def paren(code: str) -> str:
  return code if re.fullmatch(r'[\w.]+', code) else f'({code})'


def stream_access(stream: str) -> str:
  """`.dropout` / `['my-stream']` / `['gumbel']` (a sampler of nnx.Rngs has that name): how `rngs` names a stream."""
  attribute = stream.isidentifier() and not keyword.iskeyword(stream) and stream not in RNGS_ATTRIBUTES
  return f'.{stream}' if attribute else f'[{stream!r}]'


def field_name(statement: cst.CSTNode) -> str | None:
  """The name of a dataclass field `name: T` / `name: T = default`, else None."""
  if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
    assign = statement.body[0]
    if isinstance(assign, cst.AnnAssign) and isinstance(assign.target, cst.Name):
      return assign.target.value
  return None


def is_docstring(statement: cst.CSTNode) -> bool:
  return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
          and isinstance(statement.body[0], cst.Expr) and isinstance(statement.body[0].value, cst.BaseString))


def is_self_attr(node: cst.Attribute) -> bool:
  return isinstance(node.value, cst.Name) and node.value.value == 'self'


def self_assignment(statement: cst.CSTNode) -> str | None:
  """The attribute of a `self.<attr> = value` statement, else None."""
  if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
    assign = statement.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
      target = assign.targets[0].target
      if isinstance(target, cst.Attribute) and is_self_attr(target):
        return target.attr.value
  return None


def self_tuple_assignment(statement: cst.CSTNode) -> list[tuple[str, cst.BaseExpression]] | None:
  """`self.a, self.b = x, y` (transformers' `self.q_proj, self.k_proj, self.v_proj = dense(), dense(), dense()`): each
  attribute with its value; None for other statements."""
  if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
          and isinstance(assign := statement.body[0], cst.Assign) and len(assign.targets) == 1):
    return None
  targets, values = assign.targets[0].target, assign.value
  if not (isinstance(targets, (cst.Tuple, cst.List)) and isinstance(values, (cst.Tuple, cst.List))
          and len(targets.elements) == len(values.elements)):
    return None
  pairs = [(t.value, v.value) for t, v in zip(targets.elements, values.elements)
           if isinstance(t, cst.Element) and isinstance(v, cst.Element)]
  if len(pairs) != len(targets.elements) or not all(isinstance(t, cst.Attribute) and is_self_attr(t) for t, _ in pairs):
    return None
  return [(t.attr.value, v) for t, v in pairs]


def has_call(node: cst.CSTNode) -> bool:
  return any(isinstance(sub, cst.Call) for sub in (node, *descendants(node)))


def literal_dict(node: cst.BaseExpression) -> dict[str, cst.BaseExpression] | None:
  """`{'params': 0}` as a dict of its string keys; None for anything else."""
  if not isinstance(node, cst.Dict) or not all(
      isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString) for e in node.elements):
    return None
  return {e.key.evaluated_value: e.value for e in node.elements}


def literal_ints(node: cst.BaseExpression, offset: int = 0) -> list[int] | None:
  """`2` or `(1, 2)` as a list of ints, each plus `offset`; None for anything else."""
  if isinstance(node, cst.Integer):
    return [int(node.value) + offset]
  if isinstance(node, cst.Tuple) and all(isinstance(e.value, cst.Integer) for e in node.elements):
    return [int(e.value.value) + offset for e in node.elements]
  return None


def broadcast_scan_axes(kwargs: tp.Mapping[str, cst.BaseExpression]) -> tuple[int, int] | None:
  """(in_axes, out_axes) of nn.scan's options when they are `variable_broadcast='params', split_rngs={'params':
  False}, in_axes=<int>, out_axes=<int>` (the parameters shared by every step, as nnx.scan broadcasts a module);
  None for any other options."""
  broadcast, split = kwargs.get('variable_broadcast'), kwargs.get('split_rngs')
  axes = [kwargs.get('in_axes'), kwargs.get('out_axes')]
  if set(kwargs) != {'variable_broadcast', 'split_rngs', 'in_axes', 'out_axes'} \
      or not (isinstance(broadcast, cst.SimpleString) and broadcast.evaluated_value == 'params') \
      or not (isinstance(split, cst.Dict) and len(split.elements) == 1
              and isinstance(split.elements[0], cst.DictElement)
              and isinstance(split.elements[0].key, cst.SimpleString)
              and split.elements[0].key.evaluated_value == 'params'
              and isinstance(split.elements[0].value, cst.Name) and split.elements[0].value.value == 'False') \
      or not all(isinstance(a, cst.Integer) for a in axes):
    return None
  return int(axes[0].value), int(axes[1].value)


SCOPE_LEADS = {'param': ('name', 'init_fn'), 'variable': ('col', 'name', 'init_fn')}
"""The leading parameters of Linen's `self.param` / `self.variable`, before the init function's own arguments."""


def scope_arguments(call: cst.Call) -> tuple[list[cst.BaseExpression], list[cst.Arg]] | None:
  """The leading arguments of a `self.param(...)` / `self.variable(...)` call in Linen's order, by position or
  by name (`init_fn=`), and the arguments its init function gets; None with `*args` / `**kwargs` or one missing."""
  names = SCOPE_LEADS[scope_api(call)]
  if any(a.star for a in call.args):
    return None
  positional = [a.value for a in call.args if a.keyword is None]
  keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
  leading = positional[:len(names)] + [keywords.get(name) for name in names[len(positional):]]
  if None in leading:
    return None
  given = set(names[len(positional):])
  return leading, [a for a in call.args[len(names):] if a.keyword is None] + [
      a for a in call.args if a.keyword is not None and a.keyword.value not in given]


def renumbered(numbers: tp.Iterable[int], dropped: tp.Collection[int]) -> list[int]:
  """Argument positions (`static_argnums`) once the positions `dropped` are gone from the signature."""
  return [n - sum(m < n for m in dropped) for n in numbers if n not in dropped]


def int_tuple(numbers: tp.Sequence[int]) -> str:
  """`(2,)`, `(2, 3)`: argument positions as a tuple literal."""
  return f'({numbers[0]},)' if len(numbers) == 1 else f'({", ".join(map(str, numbers))})'


def is_plain_if(statement: cst.If) -> bool:
  """An `if` whose arms hold only simple statements and ifs, none testing a scope API but the init-only ones."""
  branches = [statement, *(s for s in descendants(statement) if isinstance(s, cst.If))]
  return not any(isinstance(s, cst.BaseCompoundStatement) and not isinstance(s, cst.If) for s in descendants(statement)) \
      and not any(isinstance(sub, cst.Call) and scope_api(sub) and not init_only(sub)
                  for b in branches for sub in (b.test, *descendants(b.test)))


def init_only(call: cst.Call) -> bool:
  """`self.is_initializing()` or `self.is_mutable_collection('params')`: true only while Linen creates variables,
  `False` in NNX (`scope.py`)."""
  if scope_api(call) == 'is_initializing':
    return not call.args
  name = call.args[0].value if scope_api(call) == 'is_mutable_collection' and len(call.args) == 1 \
      and call.args[0].keyword is None else None
  return isinstance(name, cst.SimpleString) and name.evaluated_value == 'params'


def value_else_none(parent: tp.Callable[[cst.CSTNode], cst.CSTNode | None],
                    assigns: tp.Sequence[cst.Assign]) -> cst.If | None:
  """The statement `if <test>: x = <value> else: x = None` when `assigns` are exactly those two assignments of a
  local (transformers' `shared_embedding` under `if self.config.tie_word_embeddings:`), else None."""
  nones = [a for a in assigns if isinstance(a.value, cst.Name) and a.value.value == 'None']
  if len(assigns) != 2 or len(nones) != 1:
    return None
  given = next(a for a in assigns if a not in nones)
  block, other = parent(parent(given)), parent(parent(nones[0]))
  statement = parent(block)
  if isinstance(statement, cst.If) and block is statement.body and isinstance(statement.orelse, cst.Else) \
      and parent(other) is statement.orelse:
    return statement
  return None


def read_names(node: cst.CSTNode) -> list[cst.Name]:
  """The names `node` reads: its Name nodes but keyword labels (`in_channels=`) and attribute names (`.dtype`)."""
  labels = {id(sub.keyword if isinstance(sub, cst.Arg) else sub.attr)
            for sub in (node, *descendants(node)) if isinstance(sub, (cst.Arg, cst.Attribute))}
  return [n for n in (node, *descendants(node)) if isinstance(n, cst.Name) and id(n) not in labels]


def may_hold_modules(setup: cst.FunctionDef, name: str) -> bool:
  """Whether setup() may put a module into the list `name`: it appends to it, or adds, a construction or a local
  that is not plainly a number (a loop variable over `range(...)`, a value computed without calls: jax-md's
  `expand_index.append(l - 1)`)."""
  plain = lambda value: isinstance(value, cst.BaseExpression) and not isinstance(value, cst.Call) and all(
      _plain_number(setup, n) for n in (value, *descendants(value)) if isinstance(n, cst.Name))
  for call in descendants(setup.body):
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name) \
        and call.func.value.value == name and call.func.attr.value in ('append', 'extend', 'insert') \
        and not all(plain(a.value) for a in call.args):
      return True
  return any(isinstance(n, cst.AugAssign) and isinstance(n.target, cst.Name) and n.target.value == name
             for n in descendants(setup.body))


def _plain_number(setup: cst.FunctionDef, name: cst.Name) -> bool:
  """Whether every binding of `name` in setup() is a loop over `range(...)` or a value computed without calls."""
  bindings = [n for n in descendants(setup.body)
              if isinstance(n, cst.For) and isinstance(n.target, cst.Name) and n.target.value == name.value
              or isinstance(n, (cst.Assign, cst.AugAssign)) and any(
                  isinstance(t, cst.Name) and t.value == name.value
                  for t in ([x.target for x in n.targets] if isinstance(n, cst.Assign) else [n.target]))]
  return bool(bindings) and all(
      isinstance(b.iter, cst.Call) and isinstance(b.iter.func, cst.Name) and b.iter.func.value == 'range'
      if isinstance(b, cst.For) else not any(isinstance(c, cst.Call) for c in (b.value, *descendants(b.value)))
      for b in bindings)


def is_none_test(use: cst.CSTNode | None, name: cst.CSTNode) -> bool:
  """Whether `use` is `<name> is None` / `is not None`."""
  return isinstance(use, cst.Comparison) and use.left is name and len(use.comparisons) == 1 \
      and isinstance(use.comparisons[0].operator, (cst.Is, cst.IsNot)) \
      and isinstance(use.comparisons[0].comparator, cst.Name) and use.comparisons[0].comparator.value == 'None'
