"""Shape formulas: a size written as code over the shape of an example input, and its value for a given shape.

When a layer's input size depends on the shape of the model's input through convolutions,
pooling and flattening (`nn.Dense(256)` after `x.reshape((x.shape[0], -1))`), L2N002 records
the size as a formula over `input_shape`, one per rank of that input
(`(input_shape[1] // 2) * (input_shape[2] // 2) * 64` for rank 4). L2N003 evaluates it on the
literal shape of the example input of `model.init(key, jnp.ones([1, 28, 28, 1]))`, so the
migrated construction gets `linear1_in_features=3136`, as flax's hand port writes it.

A formula holds integers, `input_shape[i]`, `+ - * //`, unary minus and parentheses only; it is
evaluated on that grammar (never with `eval`).
"""

from __future__ import annotations

import ast
import operator
import typing as tp

SHAPE = 'input_shape'
_OPERATORS: dict[type, tp.Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def evaluate(formula: str, shape: tp.Sequence[int]) -> int | None:
  """The value of `formula` for an input of `shape`; None when it reads an axis `shape` lacks, divides by
  zero or is not a shape formula."""
  try:
    return _value(ast.parse(formula, mode='eval').body, tuple(shape))
  except (SyntaxError, _NotAFormula, IndexError, ZeroDivisionError):
    return None


class _NotAFormula(Exception):
  pass


def _value(node: ast.AST, shape: tuple[int, ...]) -> int:
  if isinstance(node, ast.Constant) and type(node.value) is int:
    return node.value
  if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
    return _OPERATORS[type(node.op)](_value(node.left, shape), _value(node.right, shape))
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    return -_value(node.operand, shape)
  if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == SHAPE:
    return shape[_value(node.slice, shape)]
  raise _NotAFormula(ast.dump(node))
