"""L2N002: `flax.linen.Module` classes (setup style or `@nn.compact` `__call__`) -> `nnx.Module`.

## What it does
For a module-level class whose only base is `flax.linen.Module` and whose body holds annotated
fields and methods, it writes `__init__(self, <fields>, *, <sizes>, rngs: nnx.Rngs)` that stores
each field, then either moves the `setup()` body there (each statement must be
`self.<attr> = <layer>(...)`) or hoists every layer constructed inline in a straight-line
`@nn.compact` `__call__` into an attribute (`linear`, `linear1`, ..., or its `name=`). Layers
come from the layer table (`nnx_bridge.layer_table`): renamed kwargs, explicit Linen defaults,
`rngs=rngs`. NNX sizes taken from call inputs are derived from the code (a field, the
`features` of the layer before) or become keyword-only constructor arguments named after their
role, each reported with its source. `__call__` arguments named like a train/eval switch
(`training`, `deterministic`, ...) that only feed `deterministic=` / `use_running_average=`
are dropped: NNX's `model.train()` / `model.eval()` set those. A class of the same file used
as a child is converted with it. `nn.relu` and the other functions NNX shares become `nnx.X`.

## Left as a TODO (the class is not changed)
`self.param`, `self.variable`, `self.make_rng`, `self.sow` and other scope APIs; Linen names
without a known NNX counterpart (`nn.scan`, `nn.remat`, unknown layers, module-typed fields);
constructions in loops, conditionals, nested functions or not called at once; kwargs NNX does
not take; train/eval switches used otherwise; other statements in the class or in `setup()`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import keyword
import re
import typing as tp

import libcst as cst
import libcst.helpers
from libcst.metadata import QualifiedNameProvider
from libcst.metadata import ScopeProvider

from codemods.report import FIELD
from codemods.report import INPUT_DIMENSION
from codemods.report import RNGS
from codemods.report import UNDETERMINED
from codemods.report import ChildName
from codemods.report import ConstructorArgument
from codemods.rule import MigrationRule
from nnx_bridge.layer_table import MODE_ARGUMENTS
from nnx_bridge.layer_table import InputDim
from nnx_bridge.layer_table import InputDimsAt
from nnx_bridge.layer_table import SAME_AS_INPUT
from nnx_bridge.layer_table import LayerSpec
from nnx_bridge.layer_table import find_layer

MODULE_NAMES = frozenset({'flax.linen.Module', 'flax.linen.module.Module'})
COMPACT_NAMES = frozenset({'flax.linen.compact', 'flax.linen.module.compact'})
MODE_PARAMS = {m.name: m.inverted for m in MODE_ARGUMENTS}
LAYER_MODE_KWARGS = frozenset(m.name for m in MODE_ARGUMENTS if m.name == m.nnx_attribute)
SCOPE_APIS = frozenset({
    'param', 'variable', 'make_rng', 'sow', 'has_variable', 'is_initializing', 'is_mutable_collection',
    'put_variable', 'get_variable', 'has_rng', 'scope', 'variables', 'perturb', 'bind', 'apply', 'init',
    'init_with_output', 'lazy_init', 'path', 'clone', 'copy', 'tabulate', 'module_paths', 'unbind',
})
ELEMENTWISE = frozenset(
    f'{module}.{name}'
    for module in ('flax.linen', 'flax.nnx', 'jax.nn', 'jax.numpy')
    for name in ('relu', 'relu6', 'gelu', 'silu', 'swish', 'sigmoid', 'tanh', 'elu', 'selu', 'celu',
                 'leaky_relu', 'softplus', 'soft_sign', 'hard_tanh', 'log_sigmoid', 'softmax', 'log_softmax')
)

Dim = tuple[str, tp.Any] | None
"""A last-axis size: ('known', code valid in __init__), ('input', i) (the class's call argument i), or None."""


class _Unsupported(Exception):
  """A construct that keeps the class from being converted."""

  def __init__(self, node: cst.CSTNode, message: str) -> None:
    super().__init__(message)
    self.node, self.message = node, message


@dataclasses.dataclass
class _Child:
  """One submodule of the converted class."""

  attr: str
  linen_name: str
  ctor: cst.Call
  spec: LayerSpec | None
  sibling: _Plan | None
  kwargs: dict[str, cst.BaseExpression]
  sizes: dict[str, str] = dataclasses.field(default_factory=dict)
  done: bool = False
  text: str = ''


@dataclasses.dataclass
class _Plan:
  """What the class becomes."""

  name: str
  params: list[str]
  field_names: list[str]
  call_params: list[str]
  compact: bool
  children: list[_Child] = dataclasses.field(default_factory=list)
  size_params: list[tuple[str, Dim]] = dataclasses.field(default_factory=list)
  output: Dim = None  # the last-axis size `__call__` returns, when the code determines it
  size_arguments: list[ConstructorArgument] = dataclasses.field(default_factory=list)
  mode_params: list[tuple[int, str, bool]] = dataclasses.field(default_factory=list)
  linen_nodes: list[cst.CSTNode] = dataclasses.field(default_factory=list)


@functools.cache
def _class_of(dotted: str) -> type:
  module, _, name = dotted.rpartition('.')
  return getattr(importlib.import_module(module), name)


@functools.cache
def _linen_fields(linen: str) -> tuple[str, ...]:
  return tuple(p for p in inspect.signature(_class_of(linen)).parameters if p not in ('parent', 'name'))


@functools.cache
def _nnx_kwargs(nnx_name: str) -> frozenset[str]:
  return frozenset(inspect.signature(_class_of(nnx_name).__init__).parameters)


@functools.cache
def _nnx_twin(qualified: str) -> str | None:
  """'nnx.relu' when flax.nnx exports the very object `qualified` (a flax.linen function) names."""
  name = qualified.rpartition('.')[2]
  linen, nnx = importlib.import_module('flax.linen'), importlib.import_module('flax.nnx')
  value = getattr(linen, name, None)
  if value is None or isinstance(value, type) or getattr(nnx, name, None) is not value:
    return None
  return f'nnx.{name}'


def _snake(name: str) -> str:
  return re.sub(r'(?<=[a-z0-9])(?=[A-Z])', '_', name).lower()


def _descendants(node: cst.CSTNode) -> tp.Iterator[cst.CSTNode]:
  for child in node.children:
    yield child
    yield from _descendants(child)


class ConvertModuleDefinitionsRule(MigrationRule):
  """Converts Linen module classes built from table layers into NNX modules."""

  CODE = 'L2N002'
  DESCRIPTION = 'nn.Module classes (setup or compact __call__) -> nnx.Module with __init__(..., rngs).'
  METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider)

  def __init__(self, context: cst.codemod.CodemodContext) -> None:
    super().__init__(context)
    self._plans: dict[str, _Plan] = {}
    self._linen_classes: set[str] = set()
    self._class_plans: dict[cst.ClassDef, _Plan] = {}
    self._calls: dict[cst.Call, tuple[str | None, set[int]]] = {}
    self._ctors: dict[cst.Call, str] = {}
    self._refs: dict[cst.CSTNode, str] = {}
    self._methods: dict[cst.FunctionDef, set[str]] = {}
    self._pending: list[tuple[cst.CSTNode, str]] = []
    self._switches: dict[str, bool] = {}
    self._mode_uses: set[cst.Name] = set()

  # --- traversal -------------------------------------------------------------------------------

  def visit_Module(self, node: cst.Module) -> None:
    self._linen_classes = {
        s.name.value for s in node.body if isinstance(s, cst.ClassDef) and self._is_linen_class(s)
    }

  def visit_ClassDef(self, node: cst.ClassDef) -> None:
    if node.name.value not in self._linen_classes or not isinstance(self._parent(node), cst.Module):
      return
    saved = (dict(self._calls), dict(self._ctors), dict(self._refs), dict(self._methods))
    self._pending = []
    try:
      plan = self._plan(node)
    except _Unsupported as error:
      self._calls, self._ctors, self._refs, self._methods = saved
      self.report_todo(error.node, f'class {node.name.value} left as Linen: {error.message}')
      return
    self._plans[node.name.value] = self._class_plans[node] = plan
    self.add_needed_import('flax', 'nnx')
    for used in plan.linen_nodes:
      self.remove_import_of(used)
    self._report(node, plan)
    for where, message in self._pending:
      self.report_change(where, message)

  def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
    if original_node in self._ctors:
      return cst.parse_expression(self._ctors[original_node])
    if original_node not in self._calls:
      return updated_node
    attr, dropped = self._calls[original_node]
    args = [a for i, a in enumerate(updated_node.args) if i not in dropped]
    if args:
      args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    func = cst.parse_expression(f'self.{attr}') if attr else updated_node.func
    return updated_node.with_changes(func=func, args=args)

  def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
    return cst.parse_expression(self._refs[original_node]) if original_node in self._refs else updated_node

  def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
    return cst.parse_expression(self._refs[original_node]) if original_node in self._refs else updated_node

  def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
    if original_node not in self._methods:
      return updated_node
    dropped = self._methods[original_node]
    params = [p for p in updated_node.params.params if p.name.value not in dropped]
    if params:
      params[-1] = params[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    decorators = [
        new for old, new in zip(original_node.decorators, updated_node.decorators)
        if not self._has_name(old.decorator, COMPACT_NAMES)
    ]
    return updated_node.with_changes(params=updated_node.params.with_changes(params=params), decorators=decorators)

  def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
    plan = self._class_plans.get(original_node)
    if plan is None:
      return updated_node
    body: list[cst.BaseStatement] = []
    init_index = None
    setup_body: list[cst.BaseStatement] = []
    for statement in updated_node.body.body:
      if _field_name(statement) is not None:
        init_index = len(body) if init_index is None else init_index
      elif isinstance(statement, cst.FunctionDef) and statement.name.value == 'setup':
        setup_body = list(statement.body.body)
      else:
        body.append(statement)
    if init_index is None:
      init_index = 1 if body and _is_docstring(body[0]) else 0
    body.insert(init_index, self._init(plan, setup_body))
    return updated_node.with_changes(
        bases=[cst.Arg(cst.parse_expression('nnx.Module'))], body=updated_node.body.with_changes(body=body)
    )

  # --- planning --------------------------------------------------------------------------------

  def _plan(self, node: cst.ClassDef) -> _Plan:
    if node.decorators or node.keywords or len(node.bases) != 1:
      raise _Unsupported(node, 'class decorators, keywords or several bases')
    if not self.nnx_is_free(node):
      raise _Unsupported(node, 'the name nnx is bound to something else here')
    fields, methods = [], {}
    for statement in node.body.body:
      if _field_name(statement) is not None:
        fields.append(statement)
      elif isinstance(statement, cst.FunctionDef):
        methods[statement.name.value] = statement
      elif not _is_docstring(statement):
        raise _Unsupported(statement, 'only annotated fields and methods are converted')
    field_names = [_field_name(f) for f in fields]
    for field, name in zip(fields, field_names):
      value = field.body[0].value
      if name in ('name', 'parent', 'rngs') or (value is not None and _has_call(value)):
        raise _Unsupported(field, f'field {name} (a reserved name or a computed default)')
    setup, call = methods.get('setup'), methods.get('__call__')
    compact = [m for m in methods.values() if any(self._has_name(d.decorator, COMPACT_NAMES) for d in m.decorators)]
    if setup is not None and compact:
      raise _Unsupported(node, 'both setup() and @nn.compact')
    if compact and compact != [call]:
      raise _Unsupported(compact[0], '@nn.compact on a method other than __call__')
    if call is None or (setup is None and not compact):
      raise _Unsupported(node, 'no setup() or @nn.compact __call__ to convert')
    self._check_self_uses(node)
    mode = self._mode_params(call)
    params = [self.module.code_for_node(f.body[0]).strip() for f in fields]
    call_params = [p.name.value for p in call.params.params[1:]]
    plan = _Plan(node.name.value, params, field_names, call_params, bool(compact))
    self._switches = {name: MODE_PARAMS[name] for name in mode.values()}
    self._mode_uses = set()
    taken = set(field_names) | set(methods) | {'rngs'}
    if compact:
      self._plan_compact(plan, call, taken)
    else:
      self._plan_setup(plan, setup, call, taken, methods)
    for sub in _descendants(call.body):
      if isinstance(sub, cst.Name) and sub.value in self._switches and sub not in self._mode_uses:
        raise _Unsupported(sub, f'the train/eval switch {sub.value} is used other than to set train/eval arguments')
    for child in plan.children:
      child.text = self._ctor_text(child)
      if not compact:
        self._ctors[child.ctor] = child.text
    allowed = {node.bases[0].value} | {d.decorator for m in compact for d in m.decorators}
    allowed |= {child.ctor.func for child in plan.children}
    refs = len(self._refs)
    self._convert_linen_refs(node, allowed)
    plan.linen_nodes = [*allowed, *list(self._refs)[refs:]]
    plan.mode_params = [(i, name, MODE_PARAMS[name]) for i, name in mode.items()]
    if mode or compact:
      self._methods[call] = set(mode.values())
    return plan

  def _check_self_uses(self, node: cst.ClassDef) -> None:
    for sub in _descendants(node):
      if isinstance(sub, cst.Attribute) and _is_self_attr(sub) and sub.attr.value in SCOPE_APIS:
        raise _Unsupported(sub, f'self.{sub.attr.value} has no automatic NNX conversion yet')

  def _mode_params(self, call: cst.FunctionDef) -> dict[int, str]:
    params = call.params
    if isinstance(params.star_arg, cst.Param) or params.star_kwarg or params.posonly_params or params.kwonly_params:
      raise _Unsupported(call, '__call__ takes *args, **kwargs, positional-only or keyword-only arguments')
    names = [p.name.value for p in params.params[1:]]
    return {i: name for i, name in enumerate(names) if name in MODE_PARAMS}

  def _plan_compact(self, plan: _Plan, call: cst.FunctionDef, taken: set[str]) -> None:
    ctors = [c for c in _descendants(call) if isinstance(c, cst.Call) and self._constructed(c) is not None]
    if not ctors:
      raise _Unsupported(call, 'no submodule constructed in the @nn.compact __call__')
    if not all(isinstance(s, cst.SimpleStatementLine) for s in call.body.body):
      raise _Unsupported(call, 'the @nn.compact body has loops, conditionals or nested blocks')
    outer = {}
    for sub in _descendants(call):
      if isinstance(sub, (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
        if any(c in ctors for c in _descendants(sub)):
          raise _Unsupported(sub, 'a submodule constructed in a lambda or comprehension')
      if isinstance(sub, cst.Call) and sub.func in ctors:
        outer[sub.func] = sub
    counts: dict[str, int] = {}
    for ctor in ctors:
      if ctor not in outer:
        raise _Unsupported(ctor, 'a submodule that is not called where it is constructed')
      plan.children.append(self._child(ctor, counts, None))
    self._name_children(plan.children, taken)
    for child in plan.children:
      self._calls[outer[child.ctor]] = (child.attr, set())
    self._derive(plan, call, {outer[c.ctor]: c for c in plan.children}, derive=True)

  def _plan_setup(self, plan: _Plan, setup: cst.FunctionDef, call: cst.FunctionDef, taken: set[str],
                  methods: dict[str, cst.FunctionDef]) -> None:
    if len(setup.params.params) != 1 or setup.decorators:
      raise _Unsupported(setup, 'setup() with arguments or decorators')
    counts: dict[str, int] = {}
    for statement in setup.body.body:
      target = _self_assignment(statement)
      ctor = statement.body[0].value if target is not None else None
      if not isinstance(ctor, cst.Call) or self._constructed(ctor) is None:
        raise _Unsupported(statement, 'a setup() statement other than self.<attr> = <table layer>(...)')
      child = self._child(ctor, counts, target)
      if child.attr in {c.attr for c in plan.children} or child.attr in taken:
        raise _Unsupported(statement, f'self.{child.attr} assigned twice or shadowing a field or method')
      plan.children.append(child)
    by_attr = {c.attr: c for c in plan.children}
    calls = {}
    for method in methods.values():
      if method is setup:
        continue
      for sub in _descendants(method):
        if isinstance(sub, cst.Attribute) and _is_self_attr(sub) and sub.attr.value in by_attr:
          parent = self._parent(sub)
          if not (isinstance(parent, cst.Call) and parent.func is sub):
            raise _Unsupported(sub, f'self.{sub.attr.value} used other than by calling it')
          if method is call:
            calls[parent] = by_attr[sub.attr.value]
          else:
            self._call_modes(parent, by_attr[sub.attr.value])
    self._derive(plan, call, calls, derive=all(isinstance(s, cst.SimpleStatementLine) for s in call.body.body))

  def _child(self, ctor: cst.Call, counts: dict[str, int], attr: str | None) -> _Child:
    linen, spec, sibling = self._constructed(ctor)
    short = linen.rpartition('.')[2]
    if any(a.star for a in ctor.args):
      raise _Unsupported(ctor, 'a constructor call with *args or **kwargs')
    positional = [a.value for a in ctor.args if a.keyword is None]
    names = _linen_fields(linen) if spec is not None else tuple(sibling.field_names)
    if len(positional) > len(names):
      raise _Unsupported(ctor, f'too many positional arguments for {short}')
    kwargs = dict(zip(names, positional))
    kwargs.update((a.keyword.value, a.value) for a in ctor.args if a.keyword is not None)
    if 'parent' in kwargs:
      raise _Unsupported(ctor, 'parent= is not converted')
    name = kwargs.pop('name', None)
    if name is not None and not (isinstance(name, cst.SimpleString) and name.evaluated_value.isidentifier()
                                 and not keyword.iskeyword(name.evaluated_value)):
      raise _Unsupported(ctor, 'name= is not a literal identifier')
    for value in kwargs.values():
      self._check_hoistable(value)
    explicit = name.evaluated_value if name is not None else attr
    if not explicit:
      counts[short] = counts.get(short, -1) + 1  # Linen numbers auto-named children per class
    child = _Child(explicit or '', explicit or f'{short}_{counts[short]}', ctor, spec, sibling, kwargs)
    self._ctor_modes(child)
    return child

  def _check_hoistable(self, value: cst.BaseExpression) -> None:
    """Constructor arguments must mean the same in __init__: no locals, no Linen names."""
    for sub in (value, *_descendants(value)):
      if not isinstance(sub, cst.Name) or sub.value in self._switches:
        continue
      if any(q.name.startswith('flax.linen') for q in self.get_metadata(QualifiedNameProvider, sub, set())):
        raise _Unsupported(sub, 'a constructor argument uses a flax.linen name')
      scope = self.get_metadata(ScopeProvider, sub, None)
      outer = (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)
      if sub.value != 'self' and scope is not None and not isinstance(scope, outer) \
          and any(not isinstance(a.scope, outer) for a in scope[sub.value]):
        raise _Unsupported(sub, f'a constructor argument uses the local {sub.value}')

  def _name_children(self, children: list[_Child], taken: set[str]) -> None:
    """Gives auto-named children a readable, deterministic, collision-free attribute name."""
    explicit = [c.attr for c in children if c.attr]
    if len(set(explicit)) != len(explicit) or set(explicit) & taken:
      raise _Unsupported(children[0].ctor, 'duplicate name= values or names shadowing a field or method')
    taken = taken | set(explicit)
    auto = [c for c in children if not c.attr]
    bases = [_snake(c.spec.nnx.rpartition('.')[2]) if c.spec else _snake(c.sibling.name) for c in auto]
    for i, (child, base) in enumerate(zip(auto, bases)):
      attr = f'{base}{bases[:i].count(base) + 1}' if bases.count(base) > 1 else base
      while attr in taken:
        attr += '_'
      child.attr = attr
      taken.add(attr)

  # --- sizes and train/eval switches -----------------------------------------------------------

  def _derive(self, plan: _Plan, call: cst.FunctionDef, calls: dict[cst.Call, _Child], derive: bool) -> None:
    """Fills each child's NNX size arguments, walking the straight-line `call` body in order."""
    env: dict[str, Dim] = {name: ('input', i) for i, name in enumerate(plan.call_params)}
    shared: dict[tp.Any, str] = {}
    visited: set[cst.Call] = set()

    def dim(expr: cst.BaseExpression) -> Dim:
      if isinstance(expr, cst.Call) and expr in calls:
        return visit(expr)
      if derive and isinstance(expr, cst.Name):
        return env.get(expr.value)
      if derive and isinstance(expr, cst.Call) and self._has_name(expr.func, ELEMENTWISE) \
          and len(expr.args) == 1 and expr.args[0].keyword is None and not expr.args[0].star:
        return dim(expr.args[0].value)
      for sub in _descendants(expr):
        if isinstance(sub, cst.Call) and sub in calls and sub not in visited:
          visit(sub)
      return None

    def visit(node: cst.Call) -> Dim:
      visited.add(node)
      child = calls[node]
      dropped = self._call_modes(node, child)
      attr = self._calls[node][0] if node in self._calls else None
      if attr or dropped:
        self._calls[node] = (attr, dropped)
      arg_dims = [dim(a.value) for a in node.args]
      if not child.done:
        child.done = True
        for nnx_arg, index, optional in self._size_sources(child):
          position = self._call_arg(node, child, index)
          if position is None and optional:
            continue
          source = arg_dims[position] if position is not None else None
          if source is not None and source[0] == 'known':
            child.sizes[nnx_arg] = source[1]
            continue
          key = source if source is not None else (child.attr, nnx_arg)
          if key not in shared:
            argument = self.module.code_for_node(node.args[position].value) if position is not None else None
            shared[key] = self._size_param(plan, child, nnx_arg, argument, source, node)
          child.sizes[nnx_arg] = shared[key]
      return self._output(child, arg_dims)

    for statement in call.body.body:
      parts = statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]
      for part in parts:
        if isinstance(part, cst.Return) and part.value is not None:
          plan.output = dim(part.value)
          continue
        if isinstance(part, cst.Assign) and len(part.targets) == 1 and isinstance(part.targets[0].target, cst.Name):
          env[part.targets[0].target.value] = dim(part.value)
          continue
        dim(part)
        targets = [t.target for t in getattr(part, 'targets', ())] + [getattr(part, 'target', None)]
        for target in filter(None, targets):
          for sub in (target, *_descendants(target)):
            if isinstance(sub, cst.Name):
              env[sub.value] = None
    for child in plan.children:
      if not child.done:
        for nnx_arg, index, optional in self._size_sources(child):
          if not optional:
            child.sizes[nnx_arg] = self._size_param(plan, child, nnx_arg, None, None, child.ctor)

  def _size_param(self, plan: _Plan, child: _Child, nnx_arg: str, argument: str | None, source: Dim,
                  node: cst.CSTNode) -> str:
    """A new keyword-only constructor argument for a size the code does not determine."""
    name = f'{child.attr}_{nnx_arg}'
    while name in plan.field_names or name in {p for p, _ in plan.size_params} or name == 'rngs':
      name += '_'
    plan.size_params.append((name, source))
    if argument is None:
      where = f'not determined by the code of __call__ (pass what self.{child.attr} needs)'
    else:
      where = f"the input dimension of self.{child.attr}'s call argument {argument}"
    detail = f'{nnx_arg} of self.{child.attr}, {where}'
    origin = UNDETERMINED if argument is None else INPUT_DIMENSION
    plan.size_arguments.append(ConstructorArgument(name, origin, detail, child.attr))
    self._pending.append((node, f'new constructor argument {name}: {detail}'))
    return name

  def _size_sources(self, child: _Child) -> list[tuple[str, int, bool]]:
    """(NNX argument, call-argument index or -1, optional) for each size NNX needs up front."""
    if child.sibling is not None:
      return [(name, source[1] if source and source[0] == 'input' else -1, False)
              for name, source in child.sibling.size_params]
    sources = []
    for nnx_arg, source in child.spec.derived:
      if isinstance(source, InputDim) and source.axis == -1:
        sources.append((nnx_arg, source.arg, source.optional))
      elif isinstance(source, InputDimsAt) and source.axes_kwarg in child.kwargs:
        raise _Unsupported(child.ctor, f'{nnx_arg} of {child.spec.nnx} from {source.axes_kwarg}= is not derived yet')
      elif isinstance(source, InputDimsAt) and not source.as_mapping and source.default == -1:
        sources.append((nnx_arg, source.arg, False))
      elif not (isinstance(source, InputDimsAt) and source.as_mapping and not source.default):
        raise _Unsupported(child.ctor, f'{nnx_arg} of {child.spec.nnx} is not derived yet')
    return sources

  def _call_arg(self, call: cst.Call, child: _Child, index: int) -> int | None:
    """The position in `call.args` of the call argument `index`, by position or by name."""
    if index < 0:
      return None
    names = child.spec.call_args if child.spec else child.sibling.call_params
    for position, arg in enumerate(call.args):
      if arg.keyword is None and position == index:
        return position
      if arg.keyword is not None and index < len(names) and arg.keyword.value == names[index]:
        return position
    return None

  def _output(self, child: _Child, arg_dims: list[Dim]) -> Dim:
    """The last-axis size of a child's output, from the layer table or a converted sibling class."""
    first = arg_dims[0] if arg_dims else None
    if child.spec is None:
      return self._sibling_output(child, arg_dims)
    size = child.spec.output_size
    if size == SAME_AS_INPUT:
      return first
    if size is not None and size in child.kwargs:
      return ('known', self.module.code_for_node(child.kwargs[size]))
    return None

  def _sibling_output(self, child: _Child, arg_dims: list[Dim]) -> Dim:
    """A same-file class's output size, in the caller's terms: one of its fields, or an input."""
    output = child.sibling.output if child.sibling is not None else None
    if output is None:
      return None
    if output[0] == 'input':
      return arg_dims[output[1]] if output[1] < len(arg_dims) else None
    field = output[1][len('self.'):] if output[1].startswith('self.') else None
    if field in child.sibling.field_names and field in child.kwargs:
      return ('known', self.module.code_for_node(child.kwargs[field]))
    return None

  def _switch(self, value: cst.BaseExpression, inverted: bool) -> None:
    """Checks that `value` is a __call__ train/eval switch (or its negation) meaning the same as the target."""
    negated = isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Not)
    name = value.expression if negated else value
    if not (isinstance(name, cst.Name) and name.value in self._switches and negated ^ inverted == self._switches[name.value]):
      raise _Unsupported(value, 'a train/eval argument that is not a matching __call__ switch')
    self._mode_uses.add(name)

  def _ctor_modes(self, child: _Child) -> None:
    """Drops the constructor's train/eval kwargs, which NNX's train()/eval() set."""
    for key in [k for k in child.kwargs if child.spec is not None and k in LAYER_MODE_KWARGS]:
      self._switch(child.kwargs.pop(key), False)

  def _call_modes(self, call: cst.Call, child: _Child) -> set[int]:
    """Checks a child call's train/eval arguments; returns the positions to drop."""
    if child.spec is not None:
      if len([a for a in call.args if a.keyword is None]) > len(child.spec.call_args):
        raise _Unsupported(call, 'positional arguments beyond the layer inputs')
      targets = {name: False for name in LAYER_MODE_KWARGS}
    else:
      targets = {}
      for index, name, inverted in child.sibling.mode_params:
        targets[index] = targets[name] = inverted
    dropped, seen = set(), set()
    for position, arg in enumerate(call.args):
      key = arg.keyword.value if arg.keyword is not None else position
      if key in targets:
        self._switch(arg.value, targets[key])
        dropped.add(position)
        seen.add(key)
    if child.sibling is not None and any(i not in seen and n not in seen for i, n, _ in child.sibling.mode_params):
      raise _Unsupported(call, f'a train/eval argument of {child.sibling.name} left to its default')
    return dropped

  def _ctor_text(self, child: _Child) -> str:
    """The NNX constructor call of `child`, as code valid in __init__."""
    code = self.module.code_for_node
    if child.sibling is not None:
      fields = child.sibling.field_names
      args = [code(v) if i < len(fields) and f == fields[i] else f'{f}={code(v)}'
              for i, (f, v) in enumerate(child.kwargs.items())]
      args += [f'{k}={v}' for k, v in child.sizes.items()]
      return f'{child.sibling.name}({", ".join([*args, "rngs=rngs"])})'
    spec = child.spec
    renames, accepted = dict(spec.arg_renames), _nnx_kwargs(spec.nnx)
    only = {k.name for k in spec.linen_only}
    args = [f'{k}={v}' for k, v in child.sizes.items()]
    for name, value in child.kwargs.items():
      new = renames.get(name, name)
      if name in only or new not in accepted:
        raise _Unsupported(value, f'{name}= of {spec.linen} has no NNX counterpart to pass it to')
      args.append(f'{new}={code(value)}')
    args += [f'{k}={v!r}' for k, v in spec.linen_defaults if k not in child.kwargs]
    return f'nnx.{spec.nnx.rpartition(".")[2]}({", ".join([*args, "rngs=rngs"])})'

  # --- helpers ---------------------------------------------------------------------------------

  def _constructed(self, call: cst.Call) -> tuple[str, LayerSpec | None, _Plan | None] | None:
    if isinstance(call.func, cst.Name) and call.func.value in self._linen_classes:
      sibling = self._plans.get(call.func.value)
      if sibling is None:
        raise _Unsupported(call, f'{call.func.value} is a Linen module that was not converted')
      return call.func.value, None, sibling
    if not isinstance(call.func, (cst.Name, cst.Attribute)):
      return None
    for qualified in self.get_metadata(QualifiedNameProvider, call.func, set()):
      spec = find_layer(qualified.name)
      if spec is not None and spec.nnx is not None:
        return spec.linen, spec, None
    return None

  def _convert_linen_refs(self, node: cst.CSTNode, allowed: set[cst.CSTNode]) -> None:
    for child in node.children:
      if child in allowed:
        continue
      names = {q.name for q in self.get_metadata(QualifiedNameProvider, child, set())}
      linen = {n for n in names if n == 'flax.linen' or n.startswith('flax.linen.')}
      if isinstance(child, (cst.Name, cst.Attribute)) and linen:
        twin = {_nnx_twin(n) for n in linen}
        if len(twin) != 1 or None in twin or linen != names:
          raise _Unsupported(child, f'{self.module.code_for_node(child)} has no automatic NNX conversion here')
        self._refs[child] = twin.pop()
        continue
      self._convert_linen_refs(child, allowed)

  def _has_name(self, node: cst.CSTNode, names: tp.Collection[str]) -> bool:
    return any(q.name in names for q in self.get_metadata(QualifiedNameProvider, node, set()))

  def _is_linen_class(self, node: cst.ClassDef) -> bool:
    return any(self._has_name(base.value, MODULE_NAMES) for base in node.bases)

  def _parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
    return self.get_metadata(cst.metadata.ParentNodeProvider, node, None)

  def _report(self, node: cst.ClassDef, plan: _Plan) -> None:
    signature = ', '.join([*plan.params, '*', *(f'{p}: int' for p, _ in plan.size_params), 'rngs: nnx.Rngs'])
    self.report_change(node, f'class {plan.name}(nn.Module) -> nnx.Module with __init__({signature})')
    if plan.compact:
      mapping = ', '.join(f'{c.linen_name} -> self.{c.attr}' for c in plan.children)
      self.report_change(node, f'{plan.name}: @nn.compact submodules hoisted into __init__: {mapping}')
    for _, name, _ in plan.mode_params:
      self.report_change(node, f'{plan.name}.__call__: train/eval argument {name} dropped; use model.train() / model.eval()')
    fields = [ConstructorArgument(name, FIELD, param) for name, param in zip(plan.field_names, plan.params)]
    arguments = [*fields, *plan.size_arguments, ConstructorArgument('rngs', RNGS, 'nnx.Rngs')]
    self.report_class(node, plan.name, arguments, [ChildName(c.linen_name, c.attr) for c in plan.children])

  def _init(self, plan: _Plan, setup_body: list[cst.BaseStatement]) -> cst.FunctionDef:
    params = ', '.join(['self', *plan.params, '*', *(f'{p}: int' for p, _ in plan.size_params), 'rngs: nnx.Rngs'])
    lines = [f'self.{name} = {name}' for name in plan.field_names]
    if plan.compact:
      lines += [f'self.{c.attr} = {c.text}' for c in plan.children]
    source = f'def __init__({params}):\n' + ''.join(f'  {line}\n' for line in lines or ['pass'])
    init = cst.parse_statement(source)
    body = [*init.body.body, *setup_body] if lines else setup_body or list(init.body.body)
    return init.with_changes(body=init.body.with_changes(body=body))


def _field_name(statement: cst.CSTNode) -> str | None:
  """The name of a dataclass field `name: T` / `name: T = default`, else None."""
  if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
    assign = statement.body[0]
    if isinstance(assign, cst.AnnAssign) and isinstance(assign.target, cst.Name):
      return assign.target.value
  return None


def _is_docstring(statement: cst.CSTNode) -> bool:
  return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
          and isinstance(statement.body[0], cst.Expr) and isinstance(statement.body[0].value, cst.BaseString))


def _is_self_attr(node: cst.Attribute) -> bool:
  return isinstance(node.value, cst.Name) and node.value.value == 'self'


def _self_assignment(statement: cst.CSTNode) -> str | None:
  """The attribute of a `self.<attr> = value` statement, else None."""
  if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
    assign = statement.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
      target = assign.targets[0].target
      if isinstance(target, cst.Attribute) and _is_self_attr(target):
        return target.attr.value
  return None


def _has_call(node: cst.CSTNode) -> bool:
  return any(isinstance(sub, cst.Call) for sub in (node, *_descendants(node)))
