"""Module factories for L2N002: fields that hold a layer, a partial of one or a class of the file.

flax's ResNet passes its blocks `conv = partial(nn.Conv, use_bias=False)` and `norm = partial(nn.BatchNorm, ...)`
as fields typed `ModuleDef`, and the block builds its layers by calling them: `self.conv(self.filters, (3, 3))(x)`;
the ResNet itself holds `block_cls: ModuleDef`, a class of the file. In NNX a factory is called in `__init__` with
the input size and `rngs`: `self.conv1 = self.conv(in_features=..., out_features=self.filters, ..., rngs=rngs)`,
and the parent passes `partial(nnx.Conv, use_bias=False)`.

What a factory field makes comes from the constructions of its class in the same file (a call of the class, a
`partial` of it, a field default, or a call through another factory field holding the class): every one of them
must pass the same kind of layer (a table layer, a partial of it, or a local bound to such a partial) or the same
class. Layers are only passed from converted classes (module-level code is not converted); a class may be passed
from anywhere (the name then refers to the converted class). `Callable` fields called with one argument
(`act: Callable = nn.relu`) are activations: elementwise, so sizes flow through them.

`scan_factories` finds the factory fields of a file once (`FileFacts.factories`); `ClassFactories` converts
them for the class being planned, its results in the class's ClassRewrite.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002.plan import Child
from codemods.rules.l2n002.plan import ClassRewrite
from codemods.rules.l2n002.plan import Unsupported
from codemods.vocabulary import CALLABLE
from codemods.vocabulary import LAYER_MODE_KWARGS
from codemods.vocabulary import PARTIAL_NAMES
from nnx_bridge.layer_table import LayerSpec
from nnx_bridge.layer_table import find_layer
from nnx_bridge.layer_table import nnx_arguments

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.facts import FileFacts
  from codemods.rules.l2n002.planner import ClassPlanner


@dataclasses.dataclass(frozen=True)
class Factory:
  """What a factory field makes: `kind` 'layer' (`target` the table layer's qualified Linen name) or 'class'
  (`target` the name of a Linen class of the file)."""

  kind: str
  target: str

  def describe(self) -> str:
    return self.target.rpartition('.')[2] if self.kind == 'layer' else f'the class {self.target}'


@dataclasses.dataclass
class FactoryValue:
  """A value passed for a factory field from inside a class: a layer name, a partial of one, or a local bound to
  such a partial (then `local`, the statement binding it)."""

  node: cst.BaseExpression
  owner: str
  factory: Factory
  target: str  # the class whose field it is
  local: tuple[cst.SimpleStatementLine, cst.Call] | None = None




@dataclasses.dataclass(frozen=True)
class FactoryFields:
  """The factory fields of a file's Linen classes and what each makes."""

  fields: tp.Mapping[tuple[str, str], Factory | str] = dataclasses.field(default_factory=dict)  # (class, field) ->
  activations: tp.Mapping[str, set[str]] = dataclasses.field(default_factory=dict)  # ... what it makes, or why unknown
  suppliers: tp.Mapping[str, set[str]] = dataclasses.field(default_factory=dict)  # class -> the classes passing its
  values: tp.Mapping[str, list[FactoryValue]] = dataclasses.field(default_factory=dict)  # ... layer factories; class
  # -> the layer factories its code passes. `activations`: class -> its Callable fields.


def scan_factories(facts: FileFacts) -> FactoryFields:
  """Finds the factory fields of the file's Linen classes and what each makes."""
  return _FileScan(facts).scan()


class _FileScan:
  """The search for the factory fields of one file (`scan_factories`)."""

  def __init__(self, facts: FileFacts) -> None:
    self.facts = facts
    self.fields: dict[tuple[str, str], Factory | str] = {}
    self.activations: dict[str, set[str]] = {}
    self.suppliers: dict[str, set[str]] = {}
    self._values: dict[str, list[FactoryValue]] = {}

  def scan(self) -> FactoryFields:
    """Finds the factory fields of the file's Linen classes and what each makes."""
    facts, module = self.facts, self.facts.module
    classes = {s.name.value: s for s in module.body
               if isinstance(s, cst.ClassDef) and s.name.value in facts.linen_classes}
    fields = {name: _fields(node) for name, node in classes.items()}
    self.activations = {
        name: {f for f, (annotation, _) in fields[name].items() if CALLABLE.match(facts.code(annotation))}
        for name in classes}
    used = {(name, built.func.attr.value) for name, node in classes.items() for built in _factory_calls(node)
            if _self_field(built.func, fields[name])}
    if not used:
      return FactoryFields(activations=self.activations)
    owners = {sub: name for name, node in classes.items() for sub in descendants(node)}
    calls = [sub for sub in descendants(module) if isinstance(sub, cst.Call)]
    for _ in range(2 * len(classes) + 2):  # a class passed through a factory field passes its own factories on
      found: dict[tuple[str, str], list[tuple[cst.BaseExpression, str | None]]] = {key: [] for key in used}
      for name, node in classes.items():  # field defaults, evaluated at module level
        for field, (_, default) in fields[name].items():
          if (name, field) in used and default is not None:
            found[(name, field)].append((default, None))
      for call in calls:
        owner = owners.get(call)
        target, args = self._built(call, owner, classes)
        if target is None:
          continue
        names = list(fields[target])
        positional = [a.value for a in args if a.keyword is None and not a.star]
        given = dict(zip(names, positional))
        given.update((a.keyword.value, a.value) for a in args if a.keyword is not None)
        for field, value in given.items():
          if (target, field) in used:
            found[(target, field)].append((value, owner))
        if any(a.star for a in args):  # `Block(**kwargs)`: what it passes is unknown
          for field in names:
            if (target, field) in used and field not in given:
              found[(target, field)].append((call, owner))
      forwarded = {(owner, value.attr.value) for values in found.values() for value, owner in values  # `conv=self.conv`
                   if owner is not None and isinstance(value, cst.Attribute) and _self_field(value, fields[owner])}
      forwarded -= used
      used |= forwarded  # a field a class only hands on to a factory field makes what that one makes
      resolved = {key: self._agree(key, values) for key, values in found.items()}
      if resolved == self.fields and not forwarded:
        break
      self.fields = resolved
    self._values, self.suppliers = {}, {}
    for (name, field), values in found.items():
      factory = self.fields[(name, field)]
      if not isinstance(factory, Factory) or factory.kind != 'layer':
        continue
      for value, owner in values:
        self.suppliers.setdefault(name, set()).add(owner)
        if not (isinstance(value, cst.Attribute) and _self_field(value, fields[owner])):
          self._values.setdefault(owner, []).append(self._value(value, owner, factory, name))
    return FactoryFields(self.fields, self.activations, self.suppliers, self._values)

  def _built(self, call: cst.Call, owner: str | None, classes: dict[str, cst.ClassDef]
             ) -> tuple[str | None, tp.Sequence[cst.Arg]]:
    """The class of the file `call` builds (`Block(...)`, `partial(Block, ...)`, `self.block_cls(...)`) and the
    arguments it gives the class's fields."""
    func, args = call.func, call.args
    if self.facts.has_name(func, PARTIAL_NAMES) and args and args[0].keyword is None and not args[0].star:
      func, args = args[0].value, args[1:]
    if isinstance(func, cst.Name) and func.value in classes:
      return func.value, args
    if owner is not None and isinstance(func, cst.Attribute) and _is_self(func.value):
      factory = self.fields.get((owner, func.attr.value))
      if isinstance(factory, Factory) and factory.kind == 'class':
        return factory.target, args
    return None, ()

  def _resolve(self, value: cst.BaseExpression, owner: str | None) -> Factory | None:
    """What a value passed for a factory field makes: a class of the file, a table layer or a partial of one
    (bound to a local or not), or what a factory field of the class passing it makes."""
    facts = self.facts
    if isinstance(value, cst.Name) and value.value in facts.linen_classes:
      return Factory('class', value.value)
    if owner is not None and isinstance(value, cst.Attribute) and _is_self(value.value):
      factory = self.fields.get((owner, value.attr.value))
      return factory if isinstance(factory, Factory) else None
    if isinstance(value, cst.Call) and facts.has_name(value.func, PARTIAL_NAMES) and value.args \
        and value.args[0].keyword is None and not value.args[0].star:
      inner = self._resolve(value.args[0].value, owner)
      return inner if inner is not None and inner.kind == 'layer' else None
    if isinstance(value, cst.Name):
      bound = facts.local_call(value, PARTIAL_NAMES)
      if bound is not None:
        return self._resolve(bound[2], owner)
    if isinstance(value, (cst.Name, cst.Attribute)):
      for qualified in facts.qualified_names(value):
        spec = find_layer(qualified.name)
        if spec is not None and spec.nnx is not None:
          return Factory('layer', spec.linen)
    return None

  def _agree(self, key: tuple[str, str], values: list[tuple[cst.BaseExpression, str | None]]) -> Factory | str:
    name, field = key
    if not values:
      return f'no construction of {name} in this file passes {field}, so what self.{field} makes is unknown'
    factories = []
    for value, owner in values:
      factory = self._resolve(value, owner)
      code = self.facts.code(value)
      if factory is None:
        return (f'{name}.{field} is given {code}, which is not a layer, a partial of one or a class of this file: '
                f'what self.{field} makes is unknown')
      if factory.kind == 'layer' and owner is None:
        return (f'{name}.{field} is given the Linen layer {code} outside a class (module-level code is not '
                'converted): pass an NNX factory there')
      factories.append(factory)
    if len(set(factories)) > 1:
      kinds = ', '.join(sorted({f.describe() for f in factories}))
      return f'the constructions of {name} pass different kinds of {field} ({kinds}): one NNX constructor call cannot serve them'
    return factories[0]

  def _value(self, value: cst.BaseExpression, owner: str, factory: Factory, target: str) -> FactoryValue:
    local = None
    if isinstance(value, cst.Name):
      bound = self.facts.local_call(value, PARTIAL_NAMES)
      if bound is not None:
        local = (bound[0], bound[2])
    return FactoryValue(value, owner, factory, target, local)

  # --- one class -----------------------------------------------------------------------------


class ClassFactories:
  """Converts the factory fields of the class being planned; what it decides goes into the planner's plan."""

  def __init__(self, planner: ClassPlanner) -> None:
    self.planner = planner

  def prepare(self, method: cst.FunctionDef | None) -> None:
    """Before a class is planned (its train/eval switches known): converts the layer factories its code passes,
    moving each `conv = partial(nn.Conv, ...)` local of the @nn.compact method into __init__."""
    planner, fields = self.planner, self.planner.facts.factories
    name = planner.plan.name
    for built in _factory_calls(planner.facts.class_defs[name]):  # a factory of unknown kind: say so before anything else
      func = built.func
      factory = fields.fields.get((name, func.attr.value)) if isinstance(func, cst.Attribute) and _is_self(func.value) \
          else None
      if isinstance(factory, str):
        raise Unsupported(built, f'self.{func.attr.value}(...)(...) builds a submodule from a ModuleDef or '
                                       f'factory field: {factory}')
    done: dict[cst.SimpleStatementLine, str] = {}
    order = list(method.body.body) if method is not None else []
    lines: list[tuple[int, str]] = []
    for value in fields.values.get(name, ()):
      if value.target not in planner.converted:  # a class left Linen (built through nnx_bridge.from_linen): Linen layers
        continue
      if value.local is None:
        planner.plan.hoistable.add(value.node)
        planner.plan.exprs[value.node] = self._nnx_factory(value.node, value.factory)
        planner.plan.lifted.add(value.node)
        planner.plan.pending.append((value.node, f'{planner.facts.code(value.node)} -> {planner.plan.exprs[value.node]}, '
                                          'an NNX factory'))
        continue
      line, call = value.local
      local = line.body[0].targets[0].target.value
      if method is None or line not in method.body.body:
        raise Unsupported(value.node, f'the factory {local} is not bound in the @nn.compact method\'s own body')
      planner.plan.hoistable.add(value.node)
      if line in done:
        continue
      done[line] = text = self._nnx_factory(call, value.factory)
      lines.append((order.index(line), f'{local} = {text}'))
      planner.plan.removed.add(line)
      planner.plan.lifted.add(call)
      uses = []
      scope = planner.facts.scope(value.node)
      for assignment in scope[local] if scope is not None else ():
        for reference in assignment.references:
          parent = planner.facts.parent(reference.node)
          if isinstance(parent, cst.Call) and parent.func is reference.node:
            uses.append(reference.node)
          elif reference.node not in {v.node for v in fields.values.get(name, ())}:
            raise Unsupported(reference.node, f'the factory {local} used other than by calling it or passing '
                                                    'it to a factory field')
      planner.plan.factory_locals[line] = uses
      planner.plan.pending.append((call, f'{planner.facts.code(call)} -> {local} = {text} in __init__: an NNX '
                                  f'factory; each {local}(...) builds a layer there'))
    planner.plan.init_lines = [text for _, text in sorted(lines)]

  def _nnx_factory(self, node: cst.BaseExpression, factory: Factory) -> str:
    """`partial(nnx.Conv, use_bias=False)` for `partial(nn.Conv, use_bias=False, use_running_average=not train)`:
    renamed kwargs, train/eval kwargs dropped (model.train() / model.eval() set them), Linen defaults explicit."""
    planner = self.planner
    spec = find_layer(factory.target)
    short = f'nnx.{spec.nnx.rpartition(".")[2]}'
    renames, accepted, only = dict(spec.arg_renames), nnx_arguments(spec.nnx), {k.name for k in spec.linen_only}
    if isinstance(node, cst.Call):
      func, args = planner.code(node.func), node.args[1:]
    else:
      func, args = None, ()
    if any(a.star or a.keyword is None for a in args):
      raise Unsupported(node, 'a factory partial with positional or starred arguments after the layer')
    parts = []
    given = set()
    for arg in args:
      key = arg.keyword.value
      given.add(key)
      if key == 'name':
        raise Unsupported(node, 'a factory partial with name=')
      if key in LAYER_MODE_KWARGS:
        default = planner.switch(arg.value, False)
        if default is not None and default != _nnx_default(spec.nnx, key):  # else NNX's own default
          parts.append(f'{key}={default!r}')
        continue
      new = renames.get(key, key)
      if key in only or new not in accepted:
        raise Unsupported(arg.value, f'{key}= of {spec.linen} has no NNX counterpart to pass it to')
      planner.check_hoistable(arg.value)
      parts.append(f'{new}={planner.code(arg.value)}')
    parts += [f'{k}={v!r}' for k, v in spec.linen_defaults if k not in given]
    if not parts:
      return short
    if func is None:
      planner.plan.imports.append(('functools', None, None))
      func = 'functools.partial'
    return f'{func}({", ".join([short, *parts])})'

  def constructed(self, call: cst.Call) -> tuple[str, LayerSpec | None, ClassRewrite | None] | None:
    """(Linen name, layer spec, sibling plan) for a construction through a factory: `self.conv(...)` of a factory
    field, `conv(...)` of a factory local; None for other calls. Refuses a factory whose kind is unknown."""
    planner, func, fields = self.planner, call.func, self.planner.facts.factories
    current = planner.plan.name
    if isinstance(func, cst.Attribute) and _is_self(func.value):
      factory = fields.fields.get((current, func.attr.value))
      if factory is None:
        return None
      if isinstance(factory, str):
        raise Unsupported(call, f'self.{func.attr.value}(...)(...) builds a submodule from a ModuleDef or factory '
                                      f'field: {factory}')
      planner.plan.factory_callee[call] = f'self.{func.attr.value}'
      if func.attr.value not in planner.plan.reported_factories:
        planner.plan.reported_factories.add(func.attr.value)
        supplier = ', '.join(sorted(o or 'module-level code' for o in fields.suppliers.get(current, {None})))
        made = f'an NNX {find_layer(factory.target).nnx.rpartition(".")[2]}' if factory.kind == 'layer' \
            else f'the converted class {factory.target}'
        where = f' (what {supplier} passes)' if factory.kind == 'layer' else ''
        planner.plan.pending.append((call, f'self.{func.attr.value}(...): the field {func.attr.value} makes {made}'
                                    f'{where}; it is called in __init__ with the input size and rngs'))
      return self._kind(call, factory)
    if isinstance(func, cst.Name):
      line = next((line for line, uses in planner.plan.factory_locals.items() if func in uses), None)
      if line is None:
        return None
      planner.plan.factory_callee[call] = func.value
      return self._kind(call, Factory('layer', find_layer(self._factory_of(line)).linen))
    return None

  def _factory_of(self, line: cst.SimpleStatementLine) -> str:
    value = next(v for vs in self.planner.facts.factories.values.values() for v in vs
                 if v.local is not None and v.local[0] is line)
    return value.factory.target

  def _kind(self, call: cst.Call, factory: Factory) -> tuple[str, LayerSpec | None, ClassRewrite | None]:
    planner = self.planner
    if factory.kind == 'class':
      plan = planner.converted.get(factory.target)
      if plan is None:
        raise Unsupported(call, f'{factory.target}, built through {planner.facts.code(call.func)}, was '
                                      'not converted')
      return factory.target, None, plan
    spec = find_layer(factory.target)
    return spec.linen, spec, None

  def is_activation(self, expr: cst.CSTNode) -> bool:
    """`self.act(x)` for a Callable field of the class being planned: elementwise."""
    return (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and _is_self(expr.func.value)
            and expr.func.attr.value in self.planner.facts.factories.activations.get(self.planner.plan.name, ())
            and len(expr.args) == 1
            and expr.args[0].keyword is None and not expr.args[0].star)


def unconverted_suppliers(fields: FactoryFields, converted: tp.Collection[str]) -> list[tuple[str, str]]:
  """(class, supplier) pairs where a converted class takes layer factories from a class left Linen."""
  return [(name, supplier) for name, owners in fields.suppliers.items() if name in converted
          for supplier in sorted(o for o in owners if o is not None) if supplier not in converted]


def _nnx_default(nnx_name: str, key: str) -> tp.Any:
  module, _, name = nnx_name.rpartition('.')
  parameter = inspect.signature(getattr(importlib.import_module(module), name).__init__).parameters.get(key)
  return parameter.default if parameter is not None else inspect.Parameter.empty


def _factory_calls(node: cst.ClassDef) -> tp.Iterator[cst.Call]:
  """The calls in a class that build a submodule: `f(...)(x)`, and `self.<attr> = f(...)` in setup()."""
  for sub in descendants(node):
    if isinstance(sub, cst.Call) and isinstance(sub.func, cst.Call):
      yield sub.func
    if isinstance(sub, cst.FunctionDef) and sub.name.value == 'setup':
      for statement in sub.body.body:
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 \
            and isinstance(statement.body[0], cst.Assign) and isinstance(statement.body[0].value, cst.Call):
          yield statement.body[0].value


def _fields(node: cst.ClassDef) -> dict[str, tuple[cst.BaseExpression, cst.BaseExpression | None]]:
  """The annotated fields of a class body, in order: name -> (annotation, default)."""
  fields = {}
  for statement in node.body.body:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 \
        and isinstance(statement.body[0], cst.AnnAssign) and isinstance(statement.body[0].target, cst.Name):
      assign = statement.body[0]
      fields[assign.target.value] = (assign.annotation.annotation, assign.value)
  return fields


def _is_self(node: cst.CSTNode) -> bool:
  return isinstance(node, cst.Name) and node.value == 'self'


def _self_field(node: cst.CSTNode, fields: tp.Collection[str]) -> bool:
  return isinstance(node, cst.Attribute) and _is_self(node.value) and node.attr.value in fields


# --- weight tying through .apply ---------------------------------------------------------------

def tied_uses(planner: ClassPlanner, plan: ClassRewrite, methods: dict[str, cst.FunctionDef],
              setup: cst.FunctionDef | None) -> set[cst.Attribute]:
  """Weight tying through Linen's `.apply` and `.variables`, for the submodules built in setup():

  - `self.decoder.apply({'params': {'kernel': shared}}, h)` of an `nn.Dense(..., use_bias=False)` becomes the
    computation it runs, `h @ shared` (both cast to the layer's dtype when it sets one). Linen creates no params
    for a layer only run through `.apply` (its variables are given), so such a layer goes: it is not created in
    __init__; one also called directly stays.
  - `self.encoder.variables['params']['embed']['embedding']` becomes the NNX Variable's value,
    `self.encoder.embed.embedding[...]`: the same array, and gradients reach it from every use.

  Returns the `self.<attr>` nodes handled; the planner skips them when it checks the submodules' uses."""
  handled: set[cst.Attribute] = set()
  from_setup = {c.attr: c for c in plan.children if not c.hoisted and c.api is None}
  uses: dict[str, list[cst.Attribute]] = {}
  for method in methods.values():
    if method is setup:
      continue
    for sub in descendants(method):
      if isinstance(sub, cst.Attribute) and _is_self(sub.value) and sub.attr.value in from_setup:
        uses.setdefault(sub.attr.value, []).append(sub)
  call_method = methods.get('__call__')
  for attr, subs in uses.items():  # first the reads, which a tied apply's kernel may hold
    for sub in subs:
      parent = planner.facts.parent(sub)
      if isinstance(parent, cst.Attribute) and parent.value is sub and parent.attr.value == 'variables':
        _variables_read(planner, parent, from_setup[attr])
        handled.add(sub)
  for attr, subs in uses.items():
    child = from_setup[attr]
    tied, arms = [], []
    for sub in subs:
      parent = planner.facts.parent(sub)
      call = planner.facts.parent(parent)
      if isinstance(parent, cst.Attribute) and parent.value is sub and parent.attr.value == 'apply' \
          and isinstance(call, cst.Call) and call.func is parent:
        _tied_apply(planner, call, child)
        tied.append(sub)
        arms.append(_arm(planner, call, call_method, given=True))
      elif sub not in handled:
        arms.append(_arm(planner, sub, call_method, given=False))
    handled.update(tied)
    if tied and len(tied) == len(subs):  # only run with given variables: Linen creates none for it
      plan.children.remove(child)
      planner.plan.removed.add(planner.facts.parent(planner.facts.parent(child.ctor)))
      planner.plan.lifted.add(child.ctor)
      planner.plan.pending.append((child.ctor, f'self.{attr} is only run through .apply with a shared kernel, so Linen '
                                        f'creates no params for it: not created in __init__'))
    elif tied:  # `if shared is not None: <tied> else: self.decoder(h)`: it exists when called without
      params = {a for a in arms if a is not None}
      if None in arms or len(params) != 1:
        raise Unsupported(child.ctor, f'self.{attr} is run both through .apply with a shared kernel and '
                                                 'directly, other than as `if <arg> is not None: <tied> else: <own>` '
                                                 'on one __call__ argument: when Linen creates its params is unknown')
      param = params.pop()
      flag = f'tied_{attr}'
      taken = {*plan.field_names, *(n for n, _ in plan.size_params), *plan.flags, 'rngs'}
      while flag in taken:
        flag += '_'
      plan.flags.append(flag)
      plan.tie_flags[param] = flag
      child.condition = f'not {flag}'
      planner.plan.pending.append((child.ctor, f'self.{attr} is created only when not {flag}, a new constructor argument '
                                        f'(default False): Linen creates its params only when __call__ gets no '
                                        f'{param}; a parent passing {param} passes {flag}=True'))
  for child in plan.children:  # a child with tied layers: is it given their shared kernel?
    if child.sibling is not None and child.sibling.tie_flags:
      _pass_flags(planner, plan, child, methods, setup)
  return handled


def _arm(planner: ClassPlanner, node: cst.CSTNode, method: cst.FunctionDef | None, given: bool) -> str | None:
  """The __call__ argument P when `node` runs only when P is given (`given`, under `if P is not None:`) or only
  when it is not (the else, or `if P is None:`); None otherwise."""
  params = {p.name.value: p for p in method.params.params[1:]} if method is not None else {}
  current = node
  while (parent := planner.facts.parent(current)) is not None and parent is not method:
    if isinstance(parent, cst.Else):
      statement = planner.facts.parent(parent)
      if isinstance(statement, cst.If):
        found = _none_test(statement.test, params)
        if found is not None and found[1] != given:
          return found[0]
    if isinstance(parent, cst.If) and current is parent.body:
      found = _none_test(parent.test, params)
      if found is not None and found[1] == given:
        return found[0]
    current = parent
  return None


def _none_test(test: cst.BaseExpression, params: dict[str, cst.Param]) -> tuple[str, bool] | None:
  """(P, True) for `P is not None`, (P, False) for `P is None`, P a __call__ argument defaulting to None."""
  if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.left, cst.Name) \
      and test.left.value in params and isinstance(test.comparisons[0].comparator, cst.Name) \
      and test.comparisons[0].comparator.value == 'None':
    default = params[test.left.value].default
    if isinstance(default, cst.Name) and default.value == 'None':
      operator = test.comparisons[0].operator
      if isinstance(operator, cst.IsNot):
        return test.left.value, True
      if isinstance(operator, cst.Is):
        return test.left.value, False
  return None


def _pass_flags(planner: ClassPlanner, plan: ClassRewrite, child: Child, methods: dict[str, cst.FunctionDef],
                setup: cst.FunctionDef | None) -> None:
  """`tied_decoder=<when the calls pass shared_embedding>` for a child whose class ties a layer on one of its
  call arguments: every call of the child must agree, and the condition must be code __init__ can run."""
  flags = child.sibling.tie_flags
  calls = [sub for method in methods.values() if method is not setup for sub in descendants(method)
           if isinstance(sub, cst.Call) and (sub.func is child.ctor or isinstance(sub.func, cst.Attribute)
                                             and _is_self(sub.func.value) and sub.func.attr.value == child.attr
                                             and not child.hoisted)]
  if not calls:
    raise Unsupported(child.ctor, f'self.{child.attr} ties layers on its call arguments and is not '
                                             'called: when Linen creates their params is unknown')
  names = child.sibling.call_params
  for param, flag in flags.items():
    conditions = set()
    for call in calls:
      value = next((a.value for i, a in enumerate(call.args)
                    if (a.keyword.value if a.keyword is not None else names[i] if i < len(names) else None) == param),
                   None)
      conditions.add(_given(planner, value, plan, flag, methods.get('__call__')))
    if len(conditions) != 1:
      raise Unsupported(child.ctor, f'the calls of self.{child.attr} disagree on whether they pass '
                                               f'{param}: when Linen creates the tied layer\'s params is unknown')
    condition = conditions.pop()
    if condition != 'False':
      child.sizes[flag] = condition
    planner.plan.pending.append((child.ctor, f'{flag}={condition} for self.{child.attr}: its calls '
                                      f'{"pass" if condition == "True" else "do not pass" if condition == "False" else "pass, when " + condition + ","} '
                                      f'{param}'))


def _given(planner: ClassPlanner, value: cst.BaseExpression | None, plan: ClassRewrite, flag: str,
           method: cst.FunctionDef | None) -> str:
  """Code valid in __init__ that says whether `value` (an argument of a call) is not None. A `__call__` argument
  defaulting to None passed on (`self.predictions(h, shared_embedding=shared_embedding)`) gives the class a flag
  of its own, which its parents set."""
  if value is None or isinstance(value, cst.Name) and value.value == 'None':
    return 'False'
  if not isinstance(value, cst.Name):
    return 'True'
  scope = planner.facts.scope(value)
  assignments = list(scope[value.value]) if scope is not None else []
  params = list(method.params.params[1:]) if method is not None else []
  if len(assignments) == 1 and any(assignments[0].node is p for p in params):
    default = assignments[0].node.default
    if isinstance(default, cst.Name) and default.value == 'None':
      own = plan.tie_flags
      if value.value not in own:
        taken = {*plan.field_names, *(n for n, _ in plan.size_params), *plan.flags, 'rngs'}
        while flag in taken:
          flag += '_'
        plan.flags.append(flag)
        own[value.value] = flag
        planner.plan.pending.append((value, f'new constructor argument {flag} (default False): whether the callers pass '
                                     f'{value.value}, which {plan.name} passes on to a layer tied on it'))
      return own[value.value]
  values = []
  for assignment in assignments:
    target = planner.facts.parent(assignment.node) if isinstance(assignment, cst.metadata.Assignment) else None
    assign = planner.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and target.target is assignment.node):
      raise Unsupported(value, f'{value.value}, passed to a tied layer\'s argument, is not a local bound '
                                          'by plain assignments')
    values.append(assign)
  nones = [a for a in values if isinstance(a.value, cst.Name) and a.value.value == 'None']
  if not nones:
    return 'True' if values else 'False'
  if len(values) == 2 and len(nones) == 1:  # `if T: x = <array> else: x = None`
    given = next(a for a in values if a not in nones)
    line, other = planner.facts.parent(given), planner.facts.parent(nones[0])
    block, other_block = planner.facts.parent(line), planner.facts.parent(other)
    statement = planner.facts.parent(block)
    else_of = planner.facts.parent(other_block)
    if isinstance(statement, cst.If) and isinstance(else_of, cst.Else) and planner.facts.parent(else_of) is statement \
        and block is statement.body:
      test = statement.test
      try:
        planner.check_hoistable(test)
      except Exception:
        test = None
      if test is not None and not any(isinstance(n, cst.Name) and n.value in planner.plan.switches
                                      for n in (test, *descendants(test))):
        return planner.code(test)
  raise Unsupported(value, f'{value.value}, passed to a tied layer\'s argument, is None or not under a '
                                      'condition __init__ cannot evaluate (converted: `if <fields or config>: x = '
                                      '<array> else: x = None`)')


def _tied_apply(planner: ClassPlanner, call: cst.Call, child: Child) -> None:
  code = planner.facts.code(call)
  spec = child.spec
  args = call.args
  kernel = None
  if len(args) == 2 and all(a.keyword is None and not a.star for a in args):
    variables = planner.literal_dict(args[0].value)
    params = planner.literal_dict(variables['params']) if variables is not None and set(variables) == {'params'} else None
    kernel = params['kernel'] if params is not None and set(params) == {'kernel'} else None
  if spec is None or not spec.tied_kwargs or kernel is None:
    raise Unsupported(call, f'{code}: only `<nn.Dense>.apply({{"params": {{"kernel": k}}}}, x)` (a tied output '
                            'projection) is converted')
  use_bias = child.kwargs.get('use_bias')
  if not (isinstance(use_bias, cst.Name) and use_bias.value == 'False') or set(child.kwargs) - spec.tied_kwargs:
    raise Unsupported(call, f'{code}: the Dense has a bias or options other than {", ".join(sorted(spec.tied_kwargs))} '
                            '(converted: use_bias=False)')
  inputs = args[1].value
  if any(isinstance(n, cst.Call) for n in (inputs, kernel, *descendants(inputs), *descendants(kernel))):
    raise Unsupported(call, f'{code}: a tied apply of calls (bind its input and kernel to locals first)')
  left, right = planner.code(inputs), planner.code(kernel)
  if 'dtype' in child.kwargs:  # Dense casts its input and kernel to its dtype (None: their common type)
    dtype = planner.code(child.kwargs['dtype'])
    left, right = f'jnp.asarray({left}, {dtype})', f'jnp.asarray({right}, {dtype})'
  elif 'precision' not in child.kwargs:
    left, right = _operand(left), _operand(right)
  if 'precision' in child.kwargs:
    text = f'jnp.matmul({left}, {right}, precision={planner.code(child.kwargs["precision"])})'
  else:
    text = f'{left} @ {right}'
    if not isinstance(planner.facts.parent(call), (cst.Assign, cst.Return, cst.Arg, cst.AugAssign)):
      text = f'({text})'
  if 'jnp' in text and not planner.jnp_bound(call):
    planner.plan.imports.append(('jax.numpy', None, 'jnp'))
  planner.plan.exprs[call] = text
  planner.plan.pending.append((call, f'{code} -> {text}: the tied projection the Dense computes with the given kernel'))


def _variables_read(planner: ClassPlanner, variables: cst.Attribute, child: Child) -> None:
  """`self.encoder.variables['params']['embed']['embedding']` -> `self.encoder.embed.embedding[...]`."""
  node, keys = variables, []
  while isinstance(parent := planner.facts.parent(node), cst.Subscript) and parent.value is node and len(parent.slice) == 1 \
      and isinstance(parent.slice[0].slice, cst.Index) and isinstance(parent.slice[0].slice.value, cst.SimpleString):
    keys.append(parent.slice[0].slice.value.evaluated_value)
    node = parent
  code = planner.facts.code(node)
  if not keys or keys[0] != 'params':
    raise Unsupported(node, f'{code}: only reads of one param, self.<child>.variables["params"][...], are converted')
  attrs, current = [], child
  for i, key in enumerate(keys[1:], start=2):
    last = i == len(keys)
    if current.sibling is not None:
      found = next((c for c in current.sibling.children if c.linen_name == key and (c.api is None or c.api == 'param')),
                   None)
      if found is None or (found.api == 'param') != last:
        break
      attrs.append(found.attr)
      current = found
      if last:
        planner.plan.exprs[node] = f'self.{child.attr}.{".".join(attrs)}[...]'
        break
    elif current.spec is not None and last and not current.spec.params.fuse and not current.spec.params.drop:
      attrs.append(dict(current.spec.params.key_renames).get(key, key))
      planner.plan.exprs[node] = f'self.{child.attr}.{".".join(attrs)}[...]'
      break
    else:
      break
  if node not in planner.plan.exprs:
    raise Unsupported(node, f'{code}: the path does not name one param of a converted submodule')
  planner.plan.pending.append((node, f'{code} -> {planner.plan.exprs[node]}, the NNX Variable\'s value (gradients reach it from '
                              'every use)'))


def _operand(code: str) -> str:
  """`code` as an operand of `@`: a name, attribute, subscript or call as it is, anything else parenthesised."""
  try:
    node = cst.parse_expression(code)
  except cst.ParserSyntaxError:
    return f'({code})'
  return code if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) else f'({code})'
