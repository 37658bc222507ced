"""Syntax helpers of L2N003 that need no metadata: reading literals, pruning tuples, placing commas."""

from __future__ import annotations

import re
import typing as tp

import libcst as cst
from libcst.metadata import Scope

from codemods.rules.l2n003.facts import Edit
from codemods.vocabulary import FREEZERS
from codemods.vocabulary import JITS
from codemods.vocabulary import PMAPS


def after_docstring(body: tp.Sequence[cst.BaseStatement], statement: cst.BaseStatement) -> list[cst.BaseStatement]:
  """`body` with `statement` first, after a docstring if there is one."""
  first = body[0] if body else None
  docstring = isinstance(first, cst.SimpleStatementLine) and isinstance(first.body[0], cst.Expr) \
      and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
  at = 1 if docstring else 0
  return [*body[:at], statement, *body[at:]]


def with_state(value: cst.BaseExpression | None, state: str) -> str:
  """`loss, state` for a pruned `loss`; `(loss, acc), state` for a pruned tuple; `state` for nothing."""
  if value is None:
    return state
  code = cst.Module([]).code_for_node(value)
  if isinstance(value, cst.Tuple) and not value.lpar:
    code = f'({code})'
  return f'{code}, {state}'


def resolves_to(scope: Scope, name: str, target: Scope) -> bool:
  """Whether `name` read in `scope` is the `name` of `target` (libcst also lists shadowed reads)."""
  while scope is not target:
    if scope.assignments[name] or scope.parent is scope:
      return False
    scope = scope.parent
  return True


def replace_with(code: str) -> Edit:
  """An edit that replaces a node by the expression `code`."""
  return lambda _: cst.parse_expression(code)


def rngs_code(key: str) -> str:
  """`nnx.Rngs(0)` for `jax.random.key(0)` / `PRNGKey(0)`, else `nnx.Rngs(<key>)`."""
  match = re.fullmatch(r'(?:jax\.)?(?:random\.)?(?:key|PRNGKey)\((\d+)\)', key)
  return f'nnx.Rngs({match.group(1) if match else key})'


def literal_keys(value: cst.BaseExpression) -> list[str] | None:
  """The keys of a dict display whose keys are all string literals, else None."""
  if not isinstance(value, cst.Dict) or not all(isinstance(e, cst.DictElement) for e in value.elements):
    return None
  keys = [e.key for e in value.elements]
  return [k.evaluated_value for k in keys] if all(isinstance(k, cst.SimpleString) for k in keys) else None


def mutable_collections(value: cst.BaseExpression) -> list[str] | None:
  """`['batch_stats']` / `'cache'` / `('a', 'b')` -> names; anything else (True, a variable) -> None."""
  if isinstance(value, cst.SimpleString):
    return [value.evaluated_value]
  if isinstance(value, (cst.List, cst.Tuple)) and value.elements \
      and all(isinstance(e.value, cst.SimpleString) for e in value.elements):
    return [e.value.evaluated_value for e in value.elements]
  return None


def subscript_keys(subscript: cst.Subscript, parent_of: tp.Callable[[cst.CSTNode], cst.CSTNode | None],
                   ) -> tuple[list[str | None], cst.CSTNode]:
  """The literal keys of a `x['a']['b']` chain starting at `subscript`, and its outermost node."""
  keys, node = [], subscript
  while True:
    element = node.slice[0].slice if len(node.slice) == 1 else None
    value = element.value if isinstance(element, cst.Index) else None
    keys.append(value.evaluated_value if isinstance(value, cst.SimpleString) else None)
    parent = parent_of(node)
    if not (isinstance(parent, cst.Subscript) and parent.value is node):
      return keys, node
    node = parent


def pruned_value(value: cst.BaseExpression | None, drops: set[tuple[int, ...]]) -> cst.BaseExpression | None:
  """`value` without the tuple elements at `drops`; a tuple left with one element becomes it, with none: None."""
  if () in drops or value is None:
    return None
  if not isinstance(value, cst.Tuple):
    return value
  kept = []
  for index, element in enumerate(value.elements):
    inner = pruned_value(element.value, {p[1:] for p in drops if p[:1] == (index,)})
    if inner is not None:
      kept.append(element.with_changes(value=inner))
  if not kept:
    return None
  if len(kept) == 1:
    return kept[0].value
  last = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
  return value.with_changes(elements=[*kept[:-1], last])


def without_trailing_comma(args: list[cst.Arg]) -> list[cst.Arg]:
  """`args` with no comma after the last one."""
  return [*args[:-1], args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)] if args else args


def args_with_commas(args: list[cst.Arg]) -> list[cst.Arg]:
  """`args` separated by ', ', the last one keeping its own comma."""
  comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(' '))
  return [a.with_changes(comma=comma) for a in args[:-1]] + args[-1:]


def params_with_commas(params: list[cst.Param]) -> list[cst.Param]:
  """`params` separated by ', ', with no comma after the last one."""
  comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(' '))
  return [p.with_changes(comma=comma) for p in params[:-1]] + [p.with_changes(comma=cst.MaybeSentinel.DEFAULT)
                                                                for p in params[-1:]]


def transform_of(expression: cst.BaseExpression) -> tuple[str | None, dict[str, cst.BaseExpression]]:
  """('jit' | 'pmap', {option: value}) for `jax.jit`, `jax.pmap` or `partial(jax.pmap, axis_name=...)`."""
  name = cst.helpers.get_full_name_for_node(expression) or ''
  if name in JITS or name in PMAPS:
    return ('jit' if name in JITS else 'pmap'), {}
  if isinstance(expression, cst.Call) and (cst.helpers.get_full_name_for_node(expression.func) or '').endswith('partial') \
      and expression.args and all(a.keyword is not None for a in expression.args[1:]):
    inner = cst.helpers.get_full_name_for_node(expression.args[0].value) or ''
    if inner in JITS or inner in PMAPS:
      return ('jit' if inner in JITS else 'pmap'), {a.keyword.value: a.value for a in expression.args[1:]}
  return None, {}


def unfrozen(value: cst.BaseExpression | None) -> cst.BaseExpression | None:
  """`model.init(...)` for `freeze(model.init(...))` / `unfreeze(...)`: NNX state is never frozen."""
  while isinstance(value, cst.Call) and len(value.args) == 1 \
      and FREEZERS.match(cst.helpers.get_full_name_for_node(value.func) or ''):
    value = value.args[0].value
  return value


def assigned_name(statement: cst.CSTNode) -> str | None:
  """The name a one-name assignment statement binds, else None."""
  if assigned_value(statement) is None:
    return None
  target = statement.body[0].targets[0].target
  return target.value if isinstance(target, cst.Name) else None


def assigned_value(statement: cst.CSTNode) -> cst.BaseExpression | None:
  """The value of a statement that is only `name = value`, else None."""
  if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
    assign = statement.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
      return assign.value
  return None


def single_name_target(assign: cst.Assign) -> bool:
  """Whether `assign` assigns to exactly one name."""
  return len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)


def is_method(func: cst.BaseExpression, model: str, method: str) -> bool:
  """Whether `func` is `<model>.<method>`."""
  return (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == model
          and func.attr.value == method)

