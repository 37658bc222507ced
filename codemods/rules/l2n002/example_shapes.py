"""Sizes the model's input decides: formulas over `input_shape` for the size arguments `__call__` leaves open.

`dims.py` follows last-axis sizes, which is all a Dense after a Dense needs. A Dense after
convolutions, pooling and a flatten (`x.reshape((x.shape[0], -1))`, flax's MNIST CNN) takes a
size only the input's whole shape decides: the code cannot fix it, so L2N002 makes it a
constructor argument. This pass writes that argument's value as a formula over the shape of the
first call input (`codemods/shape_formulas.py`), one per rank (2 to 5) since the rank decides
which axes are batch and which spatial; L2N003 evaluates it on the literal example input of
`model.init`, so the caller passes a number and the user fills in nothing.

`ExampleShapes` follows whole shapes with one formula per axis (None where the code does not
say): layers by their table row (`output_shape`, `window` for convolutions), flax's pooling,
elementwise functions, reductions over literal axes, and reshapes to literal sizes, `x.shape[i]`
and one -1. Only literal integers enter a formula (a field's value is not known to the caller).
"""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst

from codemods.report import INPUT_DIMENSION, UNDETERMINED
from codemods.rules.l2n002 import sizes
from codemods.rules.l2n002.dims import WholeShapeWalk, literal_int, reduced_axes
from codemods.rules.l2n002.nodes import ARITHMETIC, is_number
from codemods.shape_formulas import SHAPE
from codemods.vocabulary import ELEMENTWISE, POOLING_WINDOW, REDUCTIONS, WINDOW_POOLING
from nnx_bridge.layer_spec import SAME_AS_INPUT, InputDim, Window

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.context import ClassContext
  from codemods.rules.l2n002.plan import Child, ClassRewrite

Axes = tuple[str | None, ...]
"""A whole shape of known rank: each axis's size as a formula over `input_shape`, None where unknown."""
RANKS = range(2, 6)
_RESHAPE = frozenset({'jax.numpy.reshape'})
_POOL_ARGS = ('inputs', 'window_shape', 'strides', 'padding')  # avg_pool / max_pool / min_pool, by position


def add_shape_formulas(ctx: ClassContext, plan: ClassRewrite, call: cst.FunctionDef,
                       calls: dict[cst.Call, Child]) -> None:
  """Gives each size argument the code leaves undetermined its formulas over the first input's shape."""
  children = {child.attr: child for child in plan.children if not child.repeated}
  open_sizes = [(i, a) for i, a in enumerate(plan.size_arguments)
                if a.origin in (UNDETERMINED, INPUT_DIMENSION) and a.input is None and a.child in children
                and a.child_argument is not None and children[a.child].spec is not None]
  if not open_sizes or not plan.call_params:
    return
  found: dict[int, list[tuple[int, str]]] = {i: [] for i, _ in open_sizes}
  for rank in RANKS:
    walker = ExampleShapes(ctx, plan, calls)
    walker.walk(call.body, {plan.call_params[0]: tuple(f'{SHAPE}[{axis}]' for axis in range(rank))})
    for index, argument in open_sizes:
      source = dict(children[argument.child].spec.derived).get(argument.child_argument)
      shape = walker.inputs.get(argument.child)
      if isinstance(source, InputDim) and source.arg == 0 and shape and -len(shape) <= source.axis < len(shape) \
          and shape[source.axis] is not None:
        found[index].append((rank, shape[source.axis]))
  for index, argument in open_sizes:
    if found[index]:
      plan.size_arguments[index] = dataclasses.replace(argument, shape_formulas=tuple(found[index]),
                                                       example_input=plan.call_params[0])


class ExampleShapes(WholeShapeWalk[Axes]):
  """Whole shapes through `__call__`, and the shape each child is first called with (`inputs`)."""

  def __init__(self, ctx: ClassContext, plan: ClassRewrite, calls: dict[cst.Call, Child]) -> None:
    super().__init__(plan.ifs, plan.branches)
    self.ctx, self.calls = ctx, calls
    self.inputs: dict[str, Axes | None] = {}  # child attribute -> its input's shape (None: several differ)

  def value(self, expr: cst.CSTNode, env: dict[str, Axes | None]) -> Axes | None:
    has_name = self.ctx.facts.has_name
    if isinstance(expr, cst.Name):
      return env.get(expr.value)
    if isinstance(expr, cst.Call) and expr in self.calls:
      return self.layer(expr, env)
    if isinstance(expr, cst.Call) and has_name(expr.func, ELEMENTWISE) and len(expr.args) == 1 \
        and expr.args[0].keyword is None and not expr.args[0].star:
      return self.value(expr.args[0].value, env)
    if isinstance(expr, cst.Call) and has_name(expr.func, WINDOW_POOLING):
      return self.pooled(expr, env)
    if isinstance(expr, cst.Call) and has_name(expr.func, REDUCTIONS) and expr.args and expr.args[0].keyword is None:
      return self.reduced(expr, env)
    if isinstance(expr, cst.Call) and (isinstance(expr.func, cst.Attribute) and expr.func.attr.value == 'reshape'
                                       or has_name(expr.func, _RESHAPE)):
      return self.reshaped(expr, env)
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, ARITHMETIC):
      left, right = self.value(expr.left, env), self.value(expr.right, env)
      return right if is_number(expr.left) else left if is_number(expr.right) else left if left == right else None
    for sub in expr.children:
      self.value(sub, env)
    return None

  def layer(self, node: cst.Call, env: dict[str, Axes | None]) -> Axes | None:
    child = self.calls[node]
    args = [self.value(a.value, env) for a in node.args]
    first = sizes.call_arg(self.ctx, node, child, 0) if not child.bridged else None
    source = args[first] if first is not None else None
    self.inputs[child.attr] = source if self.inputs.get(child.attr, source) == source else None
    spec = child.spec
    if source is None or spec is None or child.wrapper is not None:
      return None
    if spec.window is not None:
      features = _literal(child.kwargs.get(spec.output_size)) if spec.output_size else None
      return _windowed(source, spec.window, child.kwargs, features)
    out = spec.output_shape
    if out is None or any(k in child.kwargs for k in out.unless) or out.keep not in ('leading', 'all'):
      return None
    kept = source if out.keep == 'all' else source[:-1]
    kwarg = next((k for k in out.trailing if k == SAME_AS_INPUT or k in child.kwargs), None)
    if kwarg == SAME_AS_INPUT:
      return (*kept, source[-1])
    value = child.kwargs.get(kwarg) if kwarg is not None else None
    if isinstance(value, (cst.Tuple, cst.List)) and out.tuple_ok:
      return (*kept, *(_literal(e.value) for e in value.elements))
    return (*kept, _literal(value)) if value is not None else None

  def pooled(self, call: cst.Call, env: dict[str, Axes | None]) -> Axes | None:
    """`nn.avg_pool(x, (2, 2), strides=(2, 2))`: the pooled axes per `POOLING_WINDOW`, the features kept."""
    given = {**{name: a.value for name, a in zip(_POOL_ARGS, call.args) if a.keyword is None and not a.star},
             **{a.keyword.value: a.value for a in call.args if a.keyword is not None}}
    shape = self.value(given['inputs'], env) if 'inputs' in given else None
    for name, value in given.items():
      if name != 'inputs':
        self.value(value, env)
    return _windowed(shape, POOLING_WINDOW, given, shape[-1] if shape else None) if shape else None

  def reduced(self, call: cst.Call, env: dict[str, Axes | None]) -> Axes | None:
    """`jnp.mean(x, axis=(1, 2))`: the reduced axes go (become 1 with `keepdims=True`)."""
    shape = self.value(call.args[0].value, env)
    options = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    axes, keep = reduced_axes(call), options.get('keepdims')
    if shape is None or axes is None or any(a is None or not -len(shape) <= a < len(shape) for a in axes) \
        or set(options) - {'axis', 'keepdims'} or len([a for a in call.args if a.keyword is None]) > 2 \
        or (keep is not None and _bool(keep) is None):
      return None
    reduced = {a % len(shape) for a in axes}
    if keep is not None and _bool(keep):
      return tuple('1' if i in reduced else part for i, part in enumerate(shape))
    return tuple(part for i, part in enumerate(shape) if i not in reduced)

  def reshaped(self, call: cst.Call, env: dict[str, Axes | None]) -> Axes | None:
    """`x.reshape((x.shape[0], -1))` and the like: literal sizes, `x.shape[i]` of an array known here, one -1."""
    method = isinstance(call.func, cst.Attribute) and call.func.attr.value == 'reshape'
    base = self.value(call.func.value if method else call.args[0].value, env) if method or call.args else None
    rest = list(call.args if method else call.args[1:])
    if len(rest) == 1 and isinstance(rest[0].value, (cst.Tuple, cst.List)):
      rest = list(rest[0].value.elements)
    if base is None or not rest or any(isinstance(e, cst.StarredElement) or getattr(e, 'keyword', None) for e in rest):
      return None
    parts: list[str | None] = [self._size(e.value, env) for e in rest]
    holes = [i for i, e in enumerate(rest) if literal_int(e.value) == -1]
    if len(holes) > 1 or None in base:
      return None
    if holes:
      left = list(base)
      for i, part in enumerate(parts):
        if i not in holes and part in left:
          left.remove(part)
        elif i not in holes:
          return None  # a size not taken from the input: the -1 would need a division
      parts[holes[0]] = ' * '.join(_paren(part) for part in left) or '1'
    return tuple(parts)

  def _size(self, expr: cst.BaseExpression, env: dict[str, Axes | None]) -> str | None:
    """A literal size, or `x.shape[i]` of an array whose shape is known here."""
    if literal_int(expr) is not None:
      return str(literal_int(expr))
    if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Attribute) and expr.value.attr.value == 'shape' \
        and isinstance(expr.value.value, cst.Name) and len(expr.slice) == 1 \
        and isinstance(expr.slice[0].slice, cst.Index):
      shape, index = env.get(expr.value.value.value), literal_int(expr.slice[0].slice.value)
      if shape is not None and index is not None and -len(shape) <= index < len(shape):
        return shape[index]
    return None

  def unknown_call(self, call: cst.Call) -> None:
    if call in self.calls:
      self.inputs[self.calls[call].attr] = None


def _windowed(shape: Axes, window: Window, kwargs: tp.Mapping[str, cst.BaseExpression],
              last: str | None) -> Axes | None:
  """`shape` through a convolution or pooling: the axes before the last windowed, the last one `last`."""
  if any(k in kwargs for k in window.unless) or window.window not in kwargs:
    return None
  sizes = _ints(kwargs[window.window])
  if sizes is None or len(shape) < len(sizes) + 1:
    return None
  strides = _ints(kwargs[window.strides]) if window.strides in kwargs else (1,) * len(sizes)
  strides = strides * len(sizes) if strides is not None and len(strides) == 1 else strides
  padding = _padding(kwargs.get(window.padding), window.default_padding, len(sizes))
  if strides is None or len(strides) != len(sizes) or padding is None:
    return None
  spatial = shape[len(shape) - len(sizes) - 1:-1]
  windowed = tuple(None if n is None else Window.axis_code(n, k, s, pad)
                   for n, k, s, pad in zip(spatial, sizes, strides, padding))
  return (*shape[:len(shape) - len(sizes) - 1], *windowed, last)


def _padding(value: cst.BaseExpression | None, default: str, count: int) -> list[str | tuple[int, int]] | None:
  """'SAME' / 'VALID', one int for every side, or a (lo, hi) pair per axis; None for anything else."""
  if value is None:
    return [default] * count
  if isinstance(value, cst.SimpleString) and value.evaluated_value in ('SAME', 'VALID'):
    return [value.evaluated_value] * count
  if literal_int(value) is not None:
    return [(literal_int(value), literal_int(value))] * count
  pairs = [_ints(e.value) for e in value.elements] if isinstance(value, (cst.Tuple, cst.List)) else None
  if pairs is None or len(pairs) != count or any(p is None or len(p) != 2 for p in pairs):
    return None
  return [tuple(p) for p in pairs]


def _ints(value: cst.BaseExpression | None) -> tuple[int, ...] | None:
  if literal_int(value) is not None:
    return (literal_int(value),)
  if isinstance(value, (cst.Tuple, cst.List)) and value.elements:
    found = tuple(literal_int(e.value) for e in value.elements)
    return None if None in found else found
  return None


def _bool(value: cst.BaseExpression) -> bool | None:
  return {'True': True, 'False': False}.get(value.value) if isinstance(value, cst.Name) else None


def _literal(value: cst.BaseExpression | None) -> str | None:
  """The size a constructor argument gives, when it is a literal integer."""
  return str(literal_int(value)) if literal_int(value) is not None else None


def _paren(code: str) -> str:
  return code if code.replace('_', '').replace('[', '').replace(']', '').isalnum() else f'({code})'

