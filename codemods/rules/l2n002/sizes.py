"""The sizes NNX needs up front: derived from `__call__` (`dims.SizeWalk`) or new constructor arguments.

A pass of `planner.ClassPlanner`, mixed into it: it reads the file's facts and fills the class's plan.
"""

from __future__ import annotations

import typing as tp

import libcst as cst
from libcst.metadata import QualifiedNameSource

from codemods.nodes import descendants
from codemods.report import INPUT_DIMENSION
from codemods.report import UNDETERMINED
from codemods.report import ConstructorArgument
from codemods.rules.l2n002.dims import Dim
from codemods.rules.l2n002.dims import Input
from codemods.rules.l2n002.dims import Known
from codemods.rules.l2n002.dims import SizeWalk
from codemods.rules.l2n002.nodes import is_minus_one
from codemods.rules.l2n002.nodes import is_self_attr
from codemods.rules.l2n002.nodes import is_straight_statement
from codemods.rules.l2n002.nodes import paren
from codemods.rules.l2n002.plan import Child
from codemods.rules.l2n002.plan import ClassRewrite
from codemods.rules.l2n002.plan import Unsupported
from codemods.rules.l2n002.state import PlannerState
from codemods.vocabulary import COMPACT_NAMES
from nnx_bridge.layer_table import SAME_AS_INPUT
from nnx_bridge.layer_table import InputDim
from nnx_bridge.layer_table import InputDimsAt

if tp.TYPE_CHECKING:
  pass


class Sizes(PlannerState):
  """The sizes NNX needs up front."""

  def _derive(self, plan: ClassRewrite, methods: dict[str, cst.FunctionDef], call: cst.FunctionDef,
              calls: dict[cst.Call, Child], carry: Dim = None) -> Dim:
    """Fills each child's NNX sizes, walking `__call__` in order and into the class's own methods.

    A size is followed through straight-line code only; elsewhere a child's sizes become
    constructor arguments. For a cell the file scans with nn.scan, `carry` is the size of its
    first call argument (the carry it returns has it); the size of the carry `__call__` returns
    (the first of a returned pair) comes back, and a concatenate of known sizes and inputs gets
    a size argument for each input's last axis.
    """
    return SizeWalk(self, plan, methods, call, calls, carry).run()

  def returns_in_branches(self, method: cst.FunctionDef) -> bool:
    """A `return` in a conditional: what the last one returns is not all the method may return."""
    inside = set(descendants(method))
    return any(isinstance(sub, cst.Return) for branch in self.plan.branches & inside for sub in descendants(branch))

  def is_straight(self, body: cst.BaseSuite) -> bool:
    """Straight-line code, or conditionals of plain code that `_straight_line` let through."""
    return all(is_straight_statement(s) or s in self.plan.branches or s in self.loops.loops for s in body.body)

  def reshaped_last(self, expr: cst.CSTNode) -> str | None:
    """`x.reshape(..., n)` / `jnp.reshape(x, (..., n))`: the code of n, when it is valid in __init__."""
    shape = self.reshape_target(expr)
    last = shape[-1] if shape else None
    if last is None or isinstance(last, cst.StarredElement) or is_minus_one(last.value):
      return None
    try:
      self.check_hoistable(last.value)
    except Unsupported:
      return None
    return self.code(last.value)

  def reshape_target(self, expr: cst.CSTNode) -> list[cst.BaseElement] | None:
    """The target shape's elements of `x.reshape(a, b)`, `x.reshape((a, b))` or `jnp.reshape(x, (a, b))`."""
    if not isinstance(expr, cst.Call) or any(a.keyword is not None for a in expr.args):
      return None
    imported = any(q.source == QualifiedNameSource.IMPORT for q in self.facts.qualified_names(expr.func))
    if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == 'reshape' and not imported:
      args = list(expr.args)
    elif self.facts.has_name(expr.func, {'jax.numpy.reshape'}) and len(expr.args) == 2:
      args = list(expr.args[1:])
    else:
      return None
    if len(args) == 1 and isinstance(args[0].value, (cst.Tuple, cst.List)) and not args[0].star:
      return list(args[0].value.elements)
    if any(a.star == '**' for a in args):
      return None
    return [cst.StarredElement(a.value) if a.star else cst.Element(a.value) for a in args]

  # --- decode caches: init_cache ---------------------------------------------------------------

  def own_method(self, expr: cst.CSTNode, methods: dict[str, cst.FunctionDef]) -> cst.FunctionDef | None:
    """The method of this class that `expr` (`self.<method>(...)`) calls, if any."""
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and is_self_attr(expr.func):
      method = methods.get(expr.func.attr.value)
      if method is not None and method.name.value != 'setup' \
          and all(self.facts.has_name(d.decorator, COMPACT_NAMES) for d in method.decorators):
        return method
    return None

  def size_param(self, plan: ClassRewrite, child: Child, nnx_arg: str, where: str | None, source: Dim,
                  node: cst.CSTNode, shape_ref: bool = False, input_index: int | None = None) -> str:
    """A new keyword-only constructor argument for a size the code does not determine, unless the example
    trace (`--examples`) found one expression of the class's fields for it: then that expression. `shape_ref`:
    an `x.shape[-1]` the child's arguments read, rather than an input size of the child."""
    traced = self.plan.traced.get((child.linen_name, nnx_arg)) \
        if child.api is None and child.spec is not None and not shape_ref else None
    if child.sibling is not None and input_index is not None:  # a class of the file: the input it is called with
      traced = self.plan.traced.get((child.linen_name, f'input:{input_index}'))
    if traced is not None and traced.expression is not None:
      self.plan.traced_codes.add(traced.expression)
      self.plan.pending.append((node, f'{nnx_arg} of self.{child.attr} = {traced.expression}, from the example trace: '
                                  f'{traced.describe()}'))
      return traced.expression
    name = f'{child.attr}_{nnx_arg}'
    while name in plan.field_names or name in {p for p, _ in plan.size_params} or name == 'rngs':
      name += '_'
    plan.size_params.append((name, source))
    input_name = plan.call_params[source.index] if isinstance(source, Input) else None
    if child.api or shape_ref:  # an `x.shape[-1]` in a variable's shape: measurable when x is a call argument
      origin = INPUT_DIMENSION if input_name else UNDETERMINED
      read = 'the shape' if child.api else 'the arguments'
      detail = f'{where}, in {read} of self.{child.attr}' + ('' if input_name else ', not determined by the code')
      argument = ConstructorArgument(name, origin, detail, child.attr, input=input_name)
    else:
      origin = UNDETERMINED if where is None else INPUT_DIMENSION
      if where is None:
        where = f'not determined by the code of __call__ (pass what self.{child.attr} needs)'
      detail = f'{nnx_arg} of self.{child.attr}, {where}' + (f' ({traced.describe()})' if traced else '')
      argument = ConstructorArgument(name, origin, detail, child.attr, child_argument=nnx_arg, input=input_name)
    plan.size_arguments.append(argument)
    self.plan.pending.append((node, f'new constructor argument {name}: {detail}'))
    return name

  def size_sources(self, child: Child) -> list[tuple[str, int, bool]]:
    """(NNX argument, call-argument index or -1, optional) for each size NNX needs up front."""
    if child.bridged:  # initialised from example inputs instead
      return []
    if child.sibling is not None:
      return [(name, source.index if isinstance(source, Input) else -1, False)
              for name, source in child.sibling.size_params]
    if child.wrapper is not None:  # the cell's sizes, read off the wrapper's inputs
      feeds = dict(child.wrapper.cell_inputs)
      sources = []
      for nnx_arg, index, optional in self.size_sources(child.cell):
        if index not in feeds:
          raise Unsupported(child.ctor, f'{nnx_arg} of {child.cell.spec.nnx} comes from a cell input '
                                         f'{child.wrapper.linen} does not feed')
        sources.append((nnx_arg, feeds[index], optional))
      return sources
    sources = []
    for nnx_arg, source in child.spec.derived:
      if isinstance(source, InputDim) and source.axis == -1:
        sources.append((nnx_arg, source.arg, source.optional))
      elif isinstance(source, InputDimsAt) and source.axes_kwarg in child.kwargs:
        raise Unsupported(child.ctor, f'{nnx_arg} of {child.spec.nnx} from {source.axes_kwarg}= is not derived yet')
      elif isinstance(source, InputDimsAt) and not source.as_mapping and source.default == -1:
        sources.append((nnx_arg, source.arg, False))
      elif not (isinstance(source, InputDimsAt) and source.as_mapping and not source.default):
        raise Unsupported(child.ctor, f'{nnx_arg} of {child.spec.nnx} is not derived yet')
    return sources

  def call_arg(self, call: cst.Call, child: Child, index: int) -> int | None:
    """The position in `call.args` of the call argument `index`, by position or by name."""
    if index < 0:
      return None
    names = (child.spec or child.wrapper).call_args if child.spec or child.wrapper else child.sibling.call_params
    for position, arg in enumerate(call.args):
      if arg.keyword is None and position == index:
        return position
      if arg.keyword is not None and index < len(names) and arg.keyword.value == names[index]:
        return position
    return None

  def output_dim(self, child: Child, arg_dims: list[Dim]) -> Dim:
    """The last-axis size of a child's output, from the layer table or a converted sibling class."""
    first = arg_dims[0] if arg_dims else None

    def known(node: cst.CSTNode) -> Dim:  # an input size read in the arguments is what the code said of it
      return child.ref_dims.get(node) if node in child.shape_refs else Known(self.code(node, child.size_codes))
    if child.wrapper is not None:  # the cell's features, unless it returns the carry too
      size = child.cell.kwargs.get(child.wrapper.output_size)
      if size is None or any(k in child.kwargs for k in child.wrapper.output_unless):
        return None
      return Known(self.code(size))
    if child.spec is None:
      return self._sibling_output(child, arg_dims)
    size = child.spec.output_size
    if size == SAME_AS_INPUT:
      return first
    if size is not None and size in child.kwargs:
      return known(child.kwargs[size])
    out = child.spec.output_shape  # else the last of the trailing axes the whole output shape has
    if size is not None or out is None or any(k in child.kwargs for k in out.unless):
      return None
    kwarg = next((k for k in out.trailing if k == SAME_AS_INPUT or k in child.kwargs), None)
    value = child.kwargs.get(kwarg)
    if kwarg == SAME_AS_INPUT:
      return first
    if isinstance(value, (cst.Tuple, cst.List)) and out.tuple_ok and value.elements \
        and not isinstance(value.elements[-1], cst.StarredElement):
      return known(value.elements[-1].value)
    if value is not None and (not out.tuple_ok or isinstance(value, cst.Integer)):
      return known(value)
    return None

  def first_output_dim(self, child: Child, arg_dims: list[Dim]) -> Dim:
    """The size of the first element of the tuple a same-file class returns (transformers' layers), in the caller's
    terms; None for other children."""
    if child.spec is not None or child.wrapper is not None or child.sibling is None:
      return None
    return self._in_caller_dim(child, arg_dims, child.sibling.first_output)

  def _sibling_output(self, child: Child, arg_dims: list[Dim]) -> Dim:
    """A same-file class's output size, in the caller's terms: one of its fields, or an input."""
    return self._in_caller_dim(child, arg_dims, child.sibling.output if child.sibling is not None else None)

  def _in_caller_dim(self, child: Child, arg_dims: list[Dim], output: Dim) -> Dim:
    """A size of the same-file class `child` builds, in the caller's terms."""
    if output is None:
      return None
    if isinstance(output, Input):
      return arg_dims[output.index] if output.index < len(arg_dims) else None
    code = self.in_caller(output.code, child)
    return None if code is None else Known(code)

  def in_caller(self, code: str, child: Child) -> str | None:
    """Code of a same-file class (`self.heads * self.dim`) in the terms of the class that builds it
    as `child`: each `self.<field>` replaced by the argument passed for it; None when one is not passed."""
    fields, missing = child.sibling.field_names, []

    class Fields(cst.CSTTransformer):
      def leave_Attribute(_, original: cst.Attribute, updated: cst.BaseExpression) -> cst.BaseExpression:
        if is_self_attr(original):
          name = original.attr.value
          if name in fields and name in child.kwargs:
            return cst.parse_expression(paren(self.code(child.kwargs[name])))
          missing.append(name)
        return updated

    try:
      original = cst.parse_expression(code)
    except cst.ParserSyntaxError:
      return None
    nodes = (original, *descendants(original))
    arguments = {name for name, _ in child.sibling.size_params}
    if any(isinstance(n, cst.Name) and n.value in arguments for n in nodes):
      return None  # a size argument of the class (`self.mlp_dim or 4 * linear1_in_features`): not the caller's
    selves = [n for n in nodes if isinstance(n, cst.Name) and n.value == 'self']
    if len(selves) != len([n for n in nodes if isinstance(n, cst.Attribute) and is_self_attr(n)]):
      return None  # `self` used other than as `self.<field>`
    node = original.visit(Fields())
    return None if missing else cst.Module([]).code_for_node(node)
