"""Sizes only the call knows, as constructor arguments.

A compact body that sizes a layer by a local computed from its inputs' shapes beyond their last axis
(dopamine's `token_size = x.shape[0]`, then `nn.Dense(features=token_size)`) builds that layer when Linen's
`init` runs, at the size of the inputs `init` was given; NNX builds it in `__init__`, before any call. The local
becomes a keyword-only constructor argument of the same name (an int, as a size is), which `__init__` reads where
the construction moved; the statement stays in `__call__` for the rest of the body. A class of the run building
this one passes it on as one of its own (`sizes.size_param`), and `model.init` call sites say which value to give.
"""

from __future__ import annotations

import re
import typing as tp

import libcst as cst

from codemods.report import UNDETERMINED, ConstructorArgument
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.plan import ClassRewrite

_SIZE_ATTRIBUTES = frozenset({'ndim', 'size'})
_SIZE_FUNCTIONS = frozenset({'len', 'int', 'max', 'min'})
_SIZE_OPERATORS = (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide, cst.Modulo)


def size_valued(value: cst.BaseExpression) -> bool:
  """Whether `value` computes an int from shapes, names, integers and integer arithmetic (`x.shape[0]`,
  `self.qkv_features or inputs.shape[-1]`, `len(x) // 2`)."""
  if isinstance(value, (cst.Integer, cst.Name)):
    return True
  if isinstance(value, cst.Attribute):  # a field (`self.features`), `x.ndim`
    return isinstance(value.value, cst.Name) and (value.value.value == 'self' or value.attr.value in _SIZE_ATTRIBUTES)
  if isinstance(value, cst.Subscript):  # `x.shape[0]`
    return isinstance(value.value, cst.Attribute) and value.value.attr.value == 'shape' and len(value.slice) == 1 \
        and isinstance(value.slice[0].slice, cst.Index) and size_valued(value.slice[0].slice.value)
  if isinstance(value, cst.UnaryOperation):
    return isinstance(value.operator, cst.Minus) and size_valued(value.expression)
  if isinstance(value, cst.BinaryOperation):
    return isinstance(value.operator, _SIZE_OPERATORS) and size_valued(value.left) and size_valued(value.right)
  if isinstance(value, cst.BooleanOperation):  # `self.qkv_features or inputs_q.shape[-1]`
    return size_valued(value.left) and size_valued(value.right)
  if isinstance(value, cst.Call):
    return isinstance(value.func, cst.Name) and value.func.value in _SIZE_FUNCTIONS \
        and all(a.keyword is None and not a.star and size_valued(a.value) for a in value.args)
  return False


def call_value_param(ctx: ClassContext, local: cst.Name, value: cst.BaseExpression) -> str | None:
  """The constructor argument that stands for the local `local`, bound once to `value`, which reads what only the
  call knows: added on first use, the same on every later one. None when `value` is no size, or the local's name
  is taken by a field or another argument of the NNX constructor."""
  plan, name = ctx.plan, local.value
  arguments = {a.name: a for a in plan.size_arguments}
  if name in arguments:
    return name if arguments[name].child is None and arguments[name].origin == UNDETERMINED else None
  if not size_valued(value) or name in plan.field_names or name in {p for p, _ in plan.size_params} \
      or name in ('rngs', *plan.flags, *plan.example_params):
    return None
  detail = (f'the value of the local {name} = {ctx.facts.code(value)} in the call, which only the call knows: give '
            'what it is for the inputs the model will run on (Linen fixed it at init)')
  plan.size_params.append((name, None))
  plan.size_arguments.append(ConstructorArgument(name, UNDETERMINED, detail))
  plan.pending.append((local, f'new constructor argument {name}: {detail}'))
  return name


def drop_unread(plan: ClassRewrite, init_code: tp.Iterable[str]) -> None:
  """Drops the arguments `call_value_param` added that no code of `__init__` reads: a pass may have asked about a
  local only to try another way (the size walk's reshapes), and an argument nobody reads is noise at every call."""
  code = '\n'.join(init_code)
  unread = {a.name for a in plan.size_arguments if a.child is None and a.origin == UNDETERMINED
            and (a.name, None) in plan.size_params and re.search(rf'\b{re.escape(a.name)}\b', code) is None}
  if not unread:
    return
  plan.size_params[:] = [p for p in plan.size_params if not (p[0] in unread and p[1] is None)]
  plan.size_arguments[:] = [a for a in plan.size_arguments if a.name not in unread or a.child is not None]
  plan.pending[:] = [(node, message) for node, message in plan.pending
                     if not any(message.startswith(f'new constructor argument {name}: the value of the local ')
                                for name in unread)]
