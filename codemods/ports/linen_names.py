"""The Linen name of a layer the migrate report records by a pattern over its parent's fields.

A compact body that builds a loop's layers and then one more lets Linen number the last after the loop's:
`Dense_{len(self.features[:-1])}` (jax-md's MLP), `Dense_{self.num_layers + 1}` (dopamine's actor). The report
keeps the pattern; verify and convert read the number off the parent module's fields. The pattern is evaluated
over a small safe grammar (`self`, its attributes, integer subscripts and slices, `len`, `+ - *`, integers),
never by `eval`.
"""

from __future__ import annotations

import ast
import re
import types
import typing as tp

_FIELD_PLACEHOLDER = re.compile(r'\{([^{}]*\bself\b[^{}]*)\}')
_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def resolve(linen_name: str, fields: tp.Mapping[str, tp.Any]) -> str | None:
  """`linen_name` with a placeholder over `self` replaced by its value for a module of these field values
  (`Dense_{self.num_layers}` -> `Dense_2`); the name itself without one; None when the placeholder reads something
  the grammar does not allow or the fields do not hold."""
  found = _FIELD_PLACEHOLDER.search(linen_name)
  if found is None:
    return linen_name
  try:
    value = _value(ast.parse(found[1].strip(), mode='eval').body, types.SimpleNamespace(**fields))
  except (SyntaxError, ValueError, TypeError, AttributeError, IndexError, KeyError):
    return None
  return linen_name[:found.start()] + str(value) + linen_name[found.end():] if type(value) is int else None


def _value(node: ast.expr, module: types.SimpleNamespace) -> tp.Any:
  if isinstance(node, ast.Name) and node.id == 'self':
    return module
  if isinstance(node, ast.Constant) and type(node.value) is int:
    return node.value
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    return -_value(node.operand, module)
  if isinstance(node, ast.Attribute) and not node.attr.startswith('_'):
    return getattr(_value(node.value, module), node.attr)
  if isinstance(node, ast.Subscript):
    return _value(node.value, module)[_index(node.slice, module)]
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'len' \
      and len(node.args) == 1 and not node.keywords:
    return len(_value(node.args[0], module))
  if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
    return _OPERATORS[type(node.op)](_value(node.left, module), _value(node.right, module))
  raise ValueError(f'{ast.dump(node)} is outside the grammar of Linen name patterns')


def _index(node: ast.expr, module: types.SimpleNamespace) -> tp.Any:
  if isinstance(node, ast.Slice):
    bound = lambda part: None if part is None else _value(part, module)
    return slice(bound(node.lower), bound(node.upper), bound(node.step))
  return _value(node, module)
