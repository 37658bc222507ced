"""The sizes NNX needs up front: derived from `__call__` (`SizeWalk`, over the `dims` interpreter) or new
constructor arguments.

`derive` is run by `planner.plan_class`; the size reads (`call_arg`, `size_sources`, `size_param`, `in_caller`,
`reshape_target`, ...) are shared by the loop, decode-cache and shape-formula passes. Plain functions over a
`context.ClassContext`; this module imports no pass.
"""

from __future__ import annotations

import builtins

import typing as tp

import libcst as cst
from libcst.metadata import QualifiedNameSource

from codemods.nodes import descendants
from codemods.report import INPUT_DIMENSION, UNDETERMINED, ConstructorArgument
from codemods.rules.l2n002 import queries
from codemods.rules.l2n002.conditions import arm_path, built_under, may_meet, same_place
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.dims import Dim, Input, Known, LastAxisWalk, first_of_tuple, tuple_end
from codemods.rules.l2n002.facts import FileFacts
from codemods.rules.l2n002.nodes import (
  assigned_name,
  assigned_names,
  is_minus_one,
  is_self_attr,
  is_straight_statement,
  paren,
  self_assignment,
  size_local_of,
)
from codemods.rules.l2n002.plan import EACH_ELEMENT, Child, ClassRewrite, EachElement, Unsupported
from codemods.vocabulary import COMPACT_NAMES
from nnx_bridge.layer_table import SAME_AS_INPUT, InputDim, InputDimsAt


def derive(ctx: ClassContext, plan: ClassRewrite, methods: dict[str, cst.FunctionDef], call: cst.FunctionDef,
            calls: dict[cst.Call, Child], carry: Dim = None) -> Dim:
  """Fills each child's NNX sizes, walking `__call__` in order and into the class's own methods.

  A size is followed through straight-line code only; elsewhere a child's sizes become
  constructor arguments. For a cell the file scans with nn.scan, `carry` is the size of its
  first call argument (the carry it returns has it); the size of the carry `__call__` returns
  (the first of a returned pair) comes back, and a concatenate of known sizes and inputs gets
  a size argument for each input's last axis.
  """
  return SizeWalk(ctx, plan, methods, call, calls, carry).run()


def returns_in_branches(ctx: ClassContext, method: cst.FunctionDef) -> bool:
  """A `return` in a conditional: what the last one returns is not all the method may return."""
  inside = set(descendants(method))
  return any(isinstance(sub, cst.Return) for branch in ctx.plan.branches & inside for sub in descendants(branch))


def is_straight(ctx: ClassContext, body: cst.BaseSuite) -> bool:
  """Straight-line code, or conditionals of plain code that `_straight_line` let through."""
  return all(_straight(ctx, s) for s in body.body)


def _straight(ctx: ClassContext, statement: cst.BaseStatement) -> bool:
  return is_straight_statement(statement) or statement in ctx.plan.branches or statement in ctx.loops.loops \
      or statement in ctx.loops.unrolled


def reshaped_last(ctx: ClassContext, expr: cst.CSTNode) -> str | None:
  """`x.reshape(..., n)` / `jnp.reshape(x, (..., n))`: the code of n, when it is valid in __init__."""
  shape = reshape_target(ctx, expr)
  last = shape[-1] if shape else None
  if last is None or isinstance(last, cst.StarredElement) or is_minus_one(last.value):
    return None
  try:
    queries.check_hoistable(ctx, last.value)
  except Unsupported:
    return None
  return queries.code(ctx, last.value)


def reshape_target(ctx: ClassContext, expr: cst.CSTNode) -> list[cst.BaseElement] | None:
  """The target shape's elements of `x.reshape(a, b)`, `x.reshape((a, b))` or `jnp.reshape(x, (a, b))`; a shape
  `x.shape[:2] + (a, b)` (transformers' `_merge_heads`) is `(*x.shape[:2], a, b)`."""
  if not isinstance(expr, cst.Call) or any(a.keyword is not None for a in expr.args):
    return None
  imported = any(q.source == QualifiedNameSource.IMPORT for q in ctx.facts.qualified_names(expr.func))
  if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == 'reshape' and not imported:
    args = list(expr.args)
  elif ctx.facts.has_name(expr.func, {'jax.numpy.reshape'}) and len(expr.args) == 2:
    args = list(expr.args[1:])
  else:
    return None
  if len(args) == 1 and isinstance(args[0].value, (cst.Tuple, cst.List)) and not args[0].star:
    return list(args[0].value.elements)
  joined = args[0].value if len(args) == 1 and not args[0].star else None
  if isinstance(joined, cst.BinaryOperation) and isinstance(joined.operator, cst.Add) \
      and isinstance(joined.right, cst.Tuple):
    return [cst.StarredElement(joined.left), *joined.right.elements]
  if any(a.star == '**' for a in args):
    return None
  return [cst.StarredElement(a.value) if a.star else cst.Element(a.value) for a in args]

# --- decode caches: init_cache ---------------------------------------------------------------


def own_method(ctx: ClassContext, expr: cst.CSTNode, methods: dict[str, cst.FunctionDef]) -> cst.FunctionDef | None:
  """The method of this class that `expr` (`self.<method>(...)`) calls, if any."""
  if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and is_self_attr(expr.func):
    method = methods.get(expr.func.attr.value)
    if method is not None and method.name.value != 'setup' \
        and all(ctx.facts.has_name(d.decorator, COMPACT_NAMES) for d in method.decorators):
      return method
  return None


def size_param(ctx: ClassContext, plan: ClassRewrite, child: Child, nnx_arg: str, where: str | None, source: Dim,
                node: cst.CSTNode, shape_ref: bool = False, input_index: int | None = None, each: bool = False,
               offset: int = 0) -> str:
  """A new keyword-only constructor argument for a size the code does not determine, unless the example
  trace (`--examples`) found one expression of the class's fields for it: then that expression. `shape_ref`:
  an `x.shape[-1]` the child's arguments read, rather than an input size of the child. `each`: one size per
  element of the list `child` is (`EachElement`), `offset` the layers written out before the loop's, which the tuple
  skips; a child's argument that is one passes through as one (its record not `per_element`: the child's own record
  says how its tuple is measured)."""
  passed_on = child.sibling is not None and isinstance(dict(child.sibling.size_params).get(nnx_arg), EachElement)
  traced = ctx.plan.traced.get((child.linen_name, nnx_arg)) \
      if child.api is None and child.spec is not None and not shape_ref else None
  if child.sibling is not None and input_index is not None:  # a class of the file: the input it is called with
    traced = ctx.plan.traced.get((child.linen_name, f'input:{input_index}'))
  if traced is not None and traced.expression is not None:
    ctx.plan.traced_codes.add(traced.expression)
    ctx.plan.pending.append((node, f'{nnx_arg} of self.{child.attr} = {traced.expression}, from the example trace: '
                                f'{traced.describe()}'))
    return traced.expression
  name = f'{child.attr}_{nnx_arg}'
  while name in plan.field_names or name in {p for p, _ in plan.size_params} or name == 'rngs':
    name += '_'
  plan.size_params.append((name, EACH_ELEMENT if each or passed_on else source))
  input_name = plan.call_params[source.index] if isinstance(source, Input) and not each else None
  if each:
    detail = f'{nnx_arg} of each element of self.{child.attr}, in order, {where or "not determined by the code"}'
    argument = ConstructorArgument(name, UNDETERMINED, detail, child.attr, child_argument=nnx_arg, per_element=True,
                                   element_offset=offset)
  elif passed_on:
    detail = f'{nnx_arg} of self.{child.attr}, one size per element of its list'
    argument = ConstructorArgument(name, UNDETERMINED, detail, child.attr, child_argument=nnx_arg)
  elif child.api or shape_ref:  # an `x.shape[-1]` in a variable's shape: measurable when x is a call argument
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
  ctx.plan.pending.append((node, f'new constructor argument {name}: {detail}'))
  return name


def size_sources(ctx: ClassContext, child: Child) -> list[tuple[str, int, bool]]:
  """(NNX argument, call-argument index or -1, optional) for each size NNX needs up front."""
  if child.bridged:  # initialised from example inputs instead
    return []
  if child.sibling is not None:
    return [(name, source.index if isinstance(source, Input) else -1, False)
            for name, source in child.sibling.size_params]
  if child.wrapper is not None:  # the cell's sizes, read off the wrapper's inputs
    feeds = dict(child.wrapper.cell_inputs)
    sources = []
    for nnx_arg, index, optional in size_sources(ctx, child.cell):
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


def call_arg(ctx: ClassContext, call: cst.Call, child: Child, index: int) -> int | None:
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


def output_dim(ctx: ClassContext, child: Child, arg_dims: list[Dim]) -> Dim:
  """The last-axis size of a child's output, from the layer table or a converted sibling class."""
  first = arg_dims[0] if arg_dims else None

  def known(node: cst.CSTNode) -> Dim:  # an input size read in the arguments is what the code said of it
    return child.ref_dims.get(node) if node in child.shape_refs else Known(queries.code(ctx, node, child.size_codes))
  if child.wrapper is not None:  # the cell's features, unless it returns the carry too
    size = child.cell.kwargs.get(child.wrapper.output_size)
    if size is None or any(k in child.kwargs for k in child.wrapper.output_unless):
      return None
    return Known(queries.code(ctx, size))
  if child.spec is None:
    return _sibling_output(ctx, child, arg_dims)
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


def first_output_dim(ctx: ClassContext, child: Child, arg_dims: list[Dim]) -> Dim:
  """The size of the first element of the tuple a same-file class returns (transformers' layers), in the caller's
  terms; None for other children."""
  if child.spec is not None or child.wrapper is not None or child.sibling is None:
    return None
  return _in_caller_dim(ctx, child, arg_dims, child.sibling.first_output)


def last_output_dim(ctx: ClassContext, child: Child, arg_dims: list[Dim]) -> Dim:
  """The size of the last element of the tuple a same-file class returns (DistilBERT's `layer_outputs[-1]`), as
  `first_output_dim`."""
  if child.spec is not None or child.wrapper is not None or child.sibling is None:
    return None
  return _in_caller_dim(ctx, child, arg_dims, child.sibling.last_output)


def _sibling_output(ctx: ClassContext, child: Child, arg_dims: list[Dim]) -> Dim:
  """A same-file class's output size, in the caller's terms: one of its fields, or an input."""
  return _in_caller_dim(ctx, child, arg_dims, child.sibling.output if child.sibling is not None else None)


def _in_caller_dim(ctx: ClassContext, child: Child, arg_dims: list[Dim], output: Dim) -> Dim:
  """A size of the same-file class `child` builds, in the caller's terms."""
  if output is None:
    return None
  if isinstance(output, Input):
    return arg_dims[output.index] if output.index < len(arg_dims) else None
  code = in_caller(ctx, output.code, child)
  return None if code is None else Known(code)


def in_caller(ctx: ClassContext, code: str, child: Child, depth: int = 0) -> str | None:
  """Code of a same-file class (`self.heads * self.dim`) in the terms of the class that builds it
  as `child`: each `self.<field>` replaced by the argument passed for it, and an attribute its setup() sets once
  from plain code (BART's `self.embed_dim = self.config.d_model`) by that code in the caller's terms; None when
  one is not passed."""
  fields, missing = child.sibling.field_names, []
  sibling = child.sibling
  plain, bound = ({}, {}) if depth >= 3 else sibling.setup_bindings if sibling.origin else \
      setup_bindings(ctx.facts, sibling.name)

  class Fields(cst.CSTTransformer):
    def leave_Attribute(_, original: cst.Attribute, updated: cst.BaseExpression) -> cst.BaseExpression:
      if is_self_attr(original):
        name = original.attr.value
        if name in fields and name in child.kwargs:
          return cst.parse_expression(paren(queries.code(ctx, child.kwargs[name])))
        expanded = in_caller(ctx, plain[name], child, depth + 1) if name in plain and name not in fields else None
        if expanded is not None:
          return cst.parse_expression(paren(expanded))
        missing.append(name)
      return updated

  class Locals(cst.CSTTransformer):  # a local its setup() binds once (GPT-Neo's `embed_dim = self.config.hidden_size`)
    def leave_Attribute(_, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
      return updated.with_changes(attr=original.attr)  # `x.embed_dim`: an attribute, no local

    def leave_Name(_, original: cst.Name, updated: cst.BaseExpression) -> cst.BaseExpression:
      return cst.parse_expression(paren(bound[original.value])) if original.value in bound else updated

  try:
    original = cst.parse_expression(code).visit(Locals())
  except cst.ParserSyntaxError:
    return None
  nodes = (original, *descendants(original))
  arguments = {name for name, _ in child.sibling.size_params}
  if any(isinstance(n, cst.Name) and n.value in arguments for n in nodes):
    return None  # a size argument of the class (`self.mlp_dim or 4 * linear1_in_features`): not the caller's
  attrs = {id(n.attr) for n in nodes if isinstance(n, cst.Attribute)}
  if any(isinstance(n, cst.Name) and id(n) not in attrs and n.value != 'self' and n.value not in ctx.facts.global_names
         and not hasattr(builtins, n.value) for n in nodes):
    return None  # a local of the class's __init__ (CLIP's `embed_dim = self.config.hidden_size`): not the caller's
  selves = [n for n in nodes if isinstance(n, cst.Name) and n.value == 'self']
  if len(selves) != len([n for n in nodes if isinstance(n, cst.Attribute) and is_self_attr(n)]):
    return None  # `self` used other than as `self.<field>`
  node = original.visit(Fields())
  return None if missing else cst.Module([]).code_for_node(node)


def setup_bindings(facts: FileFacts, name: str) -> tuple[dict[str, str], dict[str, str]]:
  """The attributes the class `name` of this file sets once, by a top-level `self.<attr> = <code>` of its setup(),
  and the locals its setup() binds once, by a top-level `<local> = <code>`, with that code."""
  node = facts.class_defs.get(name)
  setup = next((s for s in node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == 'setup'), None) \
      if node is not None else None
  if setup is None:
    return {}, {}
  def targets(scope: cst.CSTNode) -> list[cst.BaseExpression]:
    return [t for sub in descendants(scope) for t in
            ([t.target for t in sub.targets] if isinstance(sub, cst.Assign) else
             [sub.target] if isinstance(sub, (cst.AugAssign, cst.AnnAssign)) else [])]
  written = [t.attr.value for t in targets(node) if isinstance(t, cst.Attribute) and is_self_attr(t)]
  # setup()'s own bindings: a field of the same name (diffusers' `out_channels = self.in_channels if
  # self.out_channels is None else self.out_channels`) is no second binding of the local
  names = [n.value for t in targets(setup) for n in (t, *descendants(t)) if isinstance(n, cst.Name)]
  attributes, bound = {}, {}
  for statement in setup.body.body:
    target, local = self_assignment(statement), assigned_name(statement)
    if target is not None and written.count(target) == 1:
      attributes[target] = facts.code(statement.body[0].value)
    elif local is not None and names.count(local) == 1:
      bound[local] = facts.code(statement.body[0].value)
  return attributes, bound


class SizeWalk(LastAxisWalk):
  """Last-axis sizes through a class's `__call__`, into its own methods, sizing each child it reaches."""

  def __init__(self, ctx: ClassContext, plan: ClassRewrite, methods: dict[str, cst.FunctionDef], call: cst.FunctionDef,
               calls: dict[cst.Call, Child], carry: Dim) -> None:
    super().__init__(ctx.facts, plan.ifs, plan.branches)
    self.ctx, self.plan, self.methods, self.call, self.calls, self.carry = ctx, plan, methods, call, calls, carry
    self.scanned = plan.name in ctx.facts.scanned_cells
    self.returned_carry: list[Dim] = []
    self.returned_first: list[Dim] = []  # of the last `return` of __call__ itself, when it returns a tuple
    self.returned_last: list[Dim] = []  # ... and of its last element
    self.shared: dict[tp.Any, str] = {}
    self.visited: set[cst.Call] = set()
    self.active: list[cst.FunctionDef] = []
    self.variables = {c.ctor: c for c in plan.children if c.api is not None and c.hoisted}
    self.size_locals: dict[str, Dim] = {}  # `d = x.shape[-1]`: what the code said of x there
    self.whole_shapes: dict[str, Dim] = {}  # `shape = x.shape`: the same, for `y.reshape(shape)`

  def run(self) -> Dim:
    """Walks `__call__` (and every child call it does not reach); the carry's size for a scanned cell."""
    inputs = {name: Input(i) for i, name in enumerate(self.plan.call_params)}
    if self.carry is not None and self.plan.call_params:
      inputs[self.plan.call_params[0]] = self.carry
    self.active.append(self.call)
    self.derive = True
    self.plan.output = self.walk(self.call.body, inputs)
    self.plan.first_output = self.returned_first[0] if self.returned_first else None
    self.plan.last_output = self.returned_last[0] if self.returned_last else None
    if returns_in_branches(self.ctx, self.call):
      self.plan.output = self.plan.first_output = self.plan.last_output = None
    self.derive = False
    for node in self.calls:  # calls in methods __call__ does not reach: still checked, sizes undetermined
      if node not in self.visited:
        self.visit(node, {})
    for child in self.plan.children:
      if child.api is not None and child.hoisted:
        self.resolve(child, {})
      elif child.api is None and not child.done and not (child.alternative and child.ctor in self.ctx.loops.sites):
        for nnx_arg, index, optional in size_sources(self.ctx, child):
          if not optional:
            child.sizes[nnx_arg] = size_param(self.ctx, self.plan, child, nnx_arg, None, None, child.ctor)
    self.plan.carry_output = self.returned_carry[0] if self.returned_carry else None
    carry = self.returned_carry[0] if self.returned_carry else None
    return carry if isinstance(carry, Known) else None

  def statement(self, statement: cst.BaseStatement, env: dict[str, Dim], output: Dim) -> Dim:
    """A block other than straight-line code (`if self.has_variable(...):` holding more blocks): its calls are
    walked with every size unknown, since what runs in it and in which order is not followed; after it, the names
    it assigns are unknown and the rest of the body is followed again. A `return` in it ends the following: what
    comes after may not run. A nested `def` or `class` runs nothing where it stands (dopamine's `def mu_init(key,
    shape): ... return ...` before the params it initialises): it binds its name only, and its calls are checked
    with the calls no walk reaches."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
      env[statement.name.value] = None
      return output
    if _straight(self.ctx, statement):
      return super().statement(statement, env, output)
    derive, self.derive = self.derive, False
    try:
      output = super().statement(statement, env, output)
    finally:
      self.derive = derive and not any(isinstance(sub, cst.Return) for sub in descendants(statement))
    for name in assigned_names(statement, self.ctx.facts.parent):
      env[name] = None
    return output

  def value(self, expr: cst.CSTNode, env: dict[str, Dim]) -> Dim:
    if isinstance(expr, cst.Call) and expr in self.calls:
      return self.visit(expr, env)
    if isinstance(expr, cst.Call) and expr in self.variables:
      self.resolve(self.variables[expr], env)
      return self.last_of_shape(self.variables[expr]) if self.derive else None
    method = own_method(self.ctx, expr, self.methods)
    if method is not None:
      return self.enter(expr, method, env)
    if self.derive and queries.is_activation(self.ctx, expr):  # `self.act(x)`, a Callable field: elementwise
      return self.value(expr.args[0].value, env)
    return super().value(expr, env)

  def reshaped(self, expr: cst.CSTNode) -> Dim:
    target = reshape_target(self.ctx, expr)
    if target and isinstance(target[-1].value, cst.Name) and target[-1].value.value in self.size_locals:
      return self.size_locals[target[-1].value.value]  # `jnp.reshape(x, (n, h * w, c))` after `n, h, w, c = x.shape`
    if target and len(target) == 1 and not isinstance(target[0], cst.StarredElement) \
        and isinstance(target[0].value, cst.Name) and target[0].value.value in self.whole_shapes:
      return self.whole_shapes[target[0].value.value]  # `x.reshape(shape)` after `shape = h.shape` (OPT's layers)
    last = reshaped_last(self.ctx, expr)
    return Known(last) if last is not None else None

  def concatenated_parts(self, parts: list[Dim], expr: cst.Call) -> list[Dim]:
    if self.scanned and self.carry is not None and parts and all(p is not None for p in parts) \
        and any(isinstance(p, Known) for p in parts):  # a cell's carry and input: the input's last axis
      return [p if isinstance(p, Known) else Known(self.input_size(p.index, expr)) for p in parts]
    return parts

  def loop(self, statement: cst.BaseStatement, env: dict[str, Dim]) -> bool:
    first = self.ctx.loops.unrolled.get(statement)
    if first is not None:  # over a setup() list written out: once per element, the k-th calling element k
      body = set(descendants(statement.body))
      calls = [call for call in self.calls if self.calls[call] is first and call in body]
      for element in [c for c in self.plan.children if c.attr == first.attr and c.element is not None]:
        self.calls.update(dict.fromkeys(calls, element))
        self.walk(statement.body, env)
      self.calls.update(dict.fromkeys(calls, first))
      return True
    if statement not in self.ctx.loops.loops:
      return False
    heads = self.ctx.loops.walked_heads(statement)
    if heads:  # the layers written out before a setup() list's loop (`layers = [Layer(...)]`): once each, first
      body = set(descendants(statement.body))
      calls = {call: child for call, child in self.calls.items() if call in body}
      for head in heads:
        self.calls.update(dict.fromkeys(calls, next(c for c in self.plan.children if c.ctor is head)))
        self.walk(statement.body, env)
      self.calls.update(calls)
    self.ctx.loops.derive(self.ctx, self.plan, statement, env, self.derive, self.walk, self.shared)  # every iteration
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
      self.returned_last[:] = [self.last_element(value, env)]
    return dim

  def assign(self, part: cst.CSTNode, env: dict[str, Dim]) -> bool:
    local = size_local_of(part) if isinstance(part, cst.Assign) else None
    if local is not None:
      self.size_locals[local[0]] = env.get(local[1]) if self.derive else None
    if isinstance(part, cst.Assign) and len(part.targets) == 1 and isinstance(part.targets[0].target, cst.Name) \
        and isinstance(part.value, cst.Attribute) and part.value.attr.value == 'shape' \
        and isinstance(part.value.value, cst.Name):  # `shape = h.shape`: a whole shape, reshaped to later
      self.whole_shapes[part.targets[0].target.value] = env.get(part.value.value.value) if self.derive else None
    if super().assign(part, env):
      return True
    if isinstance(part, cst.Assign) and len(part.targets) == 1 and part.value in self.calls:
      self.value(part, env)
      first = self.scanned_carry(part.targets[0].target, part.value, env)
      if first is None and isinstance(part.targets[0].target, cst.Tuple) and self.derive:
        first = self.firsts.get(part.value)  # `hidden_states, weights = self.self_attn(...)`: the tuple's first
      for sub in (part.targets[0].target, *descendants(part.targets[0].target)):
        if isinstance(sub, cst.Name):
          env[sub.value] = first if first is not None and sub is part.targets[0].target.elements[0].value else None
          env.pop(first_of_tuple(sub.value), None)
          env.pop(tuple_end(sub.value, -1), None)
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
    code = in_caller(self.ctx, carry.code, child)
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
      queries.check_hoistable(self.ctx, last)
    except Unsupported:
      return None
    return Known(queries.code(self.ctx, last))

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
    """A call of a child (its train/eval arguments checked by `modes.check_calls`): its sizes from its
    arguments', its output's size."""
    self.visited.add(node)
    child = self.calls[node]
    arg_dims = [self.value(a.value, env) for a in node.args]
    if child.ctor in self.ctx.loops.sites:  # built in a for loop: sized by loops.py from every iteration
      group = [c for c in self.plan.children if c.ctor is child.ctor]  # each class a local may name there
      if self.derive:
        self.firsts[node] = _one({first_output_dim(self.ctx, c, arg_dims) for c in group})
        self.lasts[node] = _one({last_output_dim(self.ctx, c, arg_dims) for c in group})
      self.ctx.loops.seen(self.ctx, group, node, arg_dims)
      return _one({output_dim(self.ctx, c, arg_dims) for c in group})
    local = self.plan.arm_bound.get(child.ctor)  # a local each arm of an if binds to another layer: each
    group = [child, *(c for c in self.plan.children if c.alternative and same_place(child, c)
                      or local is not None and c is not child and self.plan.arm_bound.get(c.ctor) == local)]
    path = arm_path(self.ctx, node)  # BigBird's `self.self`: each arm's class sized at the calls under its test
    group = [c for c in group if may_meet(built_under(self.ctx, c), path)] or group
    unsaid = {None} if local in self.plan.open_locals else set()  # an arm's module the code does not build
    if self.derive:  # the arms of a setup() if may build other modules: sizes for each
      self.firsts[node] = _one({first_output_dim(self.ctx, c, arg_dims) for c in group} | unsaid)
      self.lasts[node] = _one({last_output_dim(self.ctx, c, arg_dims) for c in group} | unsaid)
    return _one({self.sized(c, node, arg_dims, env) for c in group} | unsaid)

  def sized(self, child: Child, node: cst.Call, arg_dims: list[Dim], env: dict[str, Dim]) -> Dim:
    """The sizes of the child `node` calls, from its arguments'; its output's size."""
    if not child.done:
      child.done = True
      self.shape_sizes(child, env)
      for nnx_arg, index, optional in size_sources(self.ctx, child):
        position = call_arg(self.ctx, node, child, index)
        if position is None and optional:
          continue
        source = arg_dims[position] if position is not None else None
        if isinstance(source, Known):
          child.sizes[nnx_arg] = source.code
          continue
        key = source if source is not None else (child.attr, nnx_arg)
        if key not in self.shared:
          argument = self.ctx.facts.code(node.args[position].value) if position is not None else None
          where = None if argument is None else f"the input dimension of self.{child.attr}'s call argument {argument}"
          self.shared[key] = size_param(self.ctx, self.plan, child, nnx_arg, where, source, node, input_index=position)
        child.sizes[nnx_arg] = self.shared[key]
    if child.wrapper is not None and any(a.keyword is not None and a.keyword.value in child.wrapper.output_unless
                                         for a in node.args):
      return None  # `return_carry=True` at call time: a (carry, outputs) pair
    return output_dim(self.ctx, child, arg_dims)

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
        array = queries.size_local(self.ctx, ref) if isinstance(ref, cst.Name) else name
        label = array if array == name else f'{array} (bound to {name})'
        self.shared[key] = size_param(self.ctx, self.plan, child, 'features', f'the size of the last axis of {label}',
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
    derive = self.derive
    try:
      return self.walk(method.body, inner)
    finally:
      self.active.pop()
      self.derive = derive


def _one(dims: set[Dim]) -> Dim:
  """The size every class one construction may build gives, or None where they differ."""
  return dims.pop() if len(dims) == 1 else None
