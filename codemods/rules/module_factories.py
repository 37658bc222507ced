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

The rule (`l2n002_module_definitions.py`) calls this module from small hooks; the state lives in `Factories`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing as tp

import libcst as cst
from libcst.metadata import QualifiedNameProvider
from libcst.metadata import ScopeProvider

from codemods.rule import descendants
from codemods.vocabulary import CALLABLE
from codemods.vocabulary import LAYER_MODE_KWARGS
from codemods.vocabulary import PARTIAL_NAMES
from nnx_bridge.layer_table import find_layer
from nnx_bridge.layer_table import nnx_arguments



@dataclasses.dataclass(frozen=True)
class Factory:
  """What a factory field makes: `kind` 'layer' (`target` the table layer's qualified Linen name) or 'class'
  (`target` the name of a Linen class of the file)."""

  kind: str
  target: str

  def describe(self) -> str:
    return self.target.rpartition('.')[2] if self.kind == 'layer' else f'the class {self.target}'


@dataclasses.dataclass
class _Value:
  """A value passed for a factory field from inside a class: a layer name, a partial of one, or a local bound to
  such a partial (then `local`, the statement binding it)."""

  node: cst.BaseExpression
  owner: str
  factory: Factory
  target: str  # the class whose field it is
  local: tuple[cst.SimpleStatementLine, cst.Call] | None = None


class Factories:
  """The factory fields of a file and their conversion, for one L2N002 run."""

  def __init__(self, rule: tp.Any, unsupported: tp.Callable[[cst.CSTNode, str], Exception]) -> None:
    self.rule = rule
    self._unsupported = unsupported  # the rule's exception: the class stays Linen with a TODO
    self.fields: dict[tuple[str, str], Factory | str] = {}  # (class, field) -> what it makes, or why unknown
    self.activations: dict[str, set[str]] = {}  # class -> its Callable fields
    self.suppliers: dict[str, set[str]] = {}  # class with layer factories -> the classes whose code passes them
    self.callee: dict[cst.Call, str] = {}  # a construction through a factory -> the NNX callee code
    self.hoistable: set[cst.CSTNode] = set()  # nodes valid in __init__ as they are (factory locals)
    self.lines: dict[str, list[str]] = {}  # class -> statements __init__ runs before its hoisted layers
    self.flags: dict[str, dict[str, str]] = {}  # class -> __call__ argument tying a layer -> its constructor flag
    self._values: dict[str, list[_Value]] = {}  # class -> the layer factories its code passes
    self._locals: dict[cst.SimpleStatementLine, list[cst.Name]] = {}  # a factory local -> its call uses
    self._current: str | None = None
    self._reported: set[tuple[str, str]] = set()

  # --- the file ------------------------------------------------------------------------------

  def scan(self, module: cst.Module) -> None:
    """Finds the factory fields of the file's Linen classes and what each makes."""
    rule = self.rule
    classes = {s.name.value: s for s in module.body
               if isinstance(s, cst.ClassDef) and s.name.value in rule._linen_classes}
    fields = {name: _fields(node) for name, node in classes.items()}
    self.activations = {
        name: {f for f, (annotation, _) in fields[name].items() if CALLABLE.match(rule.module.code_for_node(annotation))}
        for name in classes}
    used = {(name, built.func.attr.value) for name, node in classes.items() for built in _factory_calls(node)
            if _self_field(built.func, fields[name])}
    if not used:
      return
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

  def _built(self, call: cst.Call, owner: str | None, classes: dict[str, cst.ClassDef]
             ) -> tuple[str | None, tp.Sequence[cst.Arg]]:
    """The class of the file `call` builds (`Block(...)`, `partial(Block, ...)`, `self.block_cls(...)`) and the
    arguments it gives the class's fields."""
    func, args = call.func, call.args
    if self.rule._has_name(func, PARTIAL_NAMES) and args and args[0].keyword is None and not args[0].star:
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
    rule = self.rule
    if isinstance(value, cst.Name) and value.value in rule._linen_classes:
      return Factory('class', value.value)
    if owner is not None and isinstance(value, cst.Attribute) and _is_self(value.value):
      factory = self.fields.get((owner, value.attr.value))
      return factory if isinstance(factory, Factory) else None
    if isinstance(value, cst.Call) and rule._has_name(value.func, PARTIAL_NAMES) and value.args \
        and value.args[0].keyword is None and not value.args[0].star:
      inner = self._resolve(value.args[0].value, owner)
      return inner if inner is not None and inner.kind == 'layer' else None
    if isinstance(value, cst.Name):
      bound = rule._local_call(value, PARTIAL_NAMES)
      if bound is not None:
        return self._resolve(bound[2], owner)
    if isinstance(value, (cst.Name, cst.Attribute)):
      for qualified in rule.get_metadata(QualifiedNameProvider, value, set()):
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
      code = self.rule.module.code_for_node(value)
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

  def _value(self, value: cst.BaseExpression, owner: str, factory: Factory, target: str) -> _Value:
    local = None
    if isinstance(value, cst.Name):
      bound = self.rule._local_call(value, PARTIAL_NAMES)
      if bound is not None:
        local = (bound[0], bound[2])
    return _Value(value, owner, factory, target, local)

  # --- one class -----------------------------------------------------------------------------

  def prepare(self, name: str, method: cst.FunctionDef | None) -> None:
    """Before a class is planned (its train/eval switches known): converts the layer factories its code passes,
    moving each `conv = partial(nn.Conv, ...)` local of the @nn.compact method into __init__."""
    rule = self.rule
    self._current = name
    self.lines[name] = []
    for built in _factory_calls(rule._class_defs[name]):  # a factory of unknown kind: say so before anything else
      func = built.func
      factory = self.fields.get((name, func.attr.value)) if isinstance(func, cst.Attribute) and _is_self(func.value) \
          else None
      if isinstance(factory, str):
        raise self._unsupported(built, f'self.{func.attr.value}(...)(...) builds a submodule from a ModuleDef or '
                                       f'factory field: {factory}')
    done: dict[cst.SimpleStatementLine, str] = {}
    order = list(method.body.body) if method is not None else []
    lines: list[tuple[int, str]] = []
    for value in self._values.get(name, ()):
      if value.target not in rule._plans:  # a class left Linen (built through nnx_bridge.from_linen): Linen layers
        continue
      if value.local is None:
        self.hoistable.add(value.node)
        rule._exprs[value.node] = self._nnx_factory(value.node, value.factory)
        rule._lifted.add(value.node)
        rule._pending.append((value.node, f'{rule.module.code_for_node(value.node)} -> {rule._exprs[value.node]}, '
                                          'an NNX factory'))
        continue
      line, call = value.local
      local = line.body[0].targets[0].target.value
      if method is None or line not in method.body.body:
        raise self._unsupported(value.node, f'the factory {local} is not bound in the @nn.compact method\'s own body')
      self.hoistable.add(value.node)
      if line in done:
        continue
      done[line] = text = self._nnx_factory(call, value.factory)
      lines.append((order.index(line), f'{local} = {text}'))
      rule._removed.add(line)
      rule._lifted.add(call)
      uses = []
      scope = rule.get_metadata(ScopeProvider, value.node, None)
      for assignment in scope[local] if scope is not None else ():
        for reference in assignment.references:
          parent = rule._parent(reference.node)
          if isinstance(parent, cst.Call) and parent.func is reference.node:
            uses.append(reference.node)
          elif reference.node not in {v.node for v in self._values.get(name, ())}:
            raise self._unsupported(reference.node, f'the factory {local} used other than by calling it or passing '
                                                    'it to a factory field')
      self._locals[line] = uses
      rule._pending.append((call, f'{rule.module.code_for_node(call)} -> {local} = {text} in __init__: an NNX '
                                  f'factory; each {local}(...) builds a layer there'))
    self.lines[name] = [text for _, text in sorted(lines)]

  def _nnx_factory(self, node: cst.BaseExpression, factory: Factory) -> str:
    """`partial(nnx.Conv, use_bias=False)` for `partial(nn.Conv, use_bias=False, use_running_average=not train)`:
    renamed kwargs, train/eval kwargs dropped (model.train() / model.eval() set them), Linen defaults explicit."""
    rule = self.rule
    spec = find_layer(factory.target)
    short = f'nnx.{spec.nnx.rpartition(".")[2]}'
    renames, accepted, only = dict(spec.arg_renames), nnx_arguments(spec.nnx), {k.name for k in spec.linen_only}
    if isinstance(node, cst.Call):
      func, args = rule._code(node.func), node.args[1:]
    else:
      func, args = None, ()
    if any(a.star or a.keyword is None for a in args):
      raise self._unsupported(node, 'a factory partial with positional or starred arguments after the layer')
    parts = []
    given = set()
    for arg in args:
      key = arg.keyword.value
      given.add(key)
      if key == 'name':
        raise self._unsupported(node, 'a factory partial with name=')
      if key in LAYER_MODE_KWARGS:
        default = rule._switch(arg.value, False)
        if default is not None and default != _nnx_default(spec.nnx, key):  # else NNX's own default
          parts.append(f'{key}={default!r}')
        continue
      new = renames.get(key, key)
      if key in only or new not in accepted:
        raise self._unsupported(arg.value, f'{key}= of {spec.linen} has no NNX counterpart to pass it to')
      rule._check_hoistable(arg.value)
      parts.append(f'{new}={rule._code(arg.value)}')
    parts += [f'{k}={v!r}' for k, v in spec.linen_defaults if k not in given]
    if not parts:
      return short
    if func is None:
      rule.add_needed_import('functools')
      func = 'functools.partial'
    return f'{func}({", ".join([short, *parts])})'

  def constructed(self, call: cst.Call) -> tuple[str, tp.Any, tp.Any] | None:
    """(Linen name, layer spec, sibling plan) for a construction through a factory: `self.conv(...)` of a factory
    field, `conv(...)` of a factory local; None for other calls. Refuses a factory whose kind is unknown."""
    rule, func = self.rule, call.func
    if isinstance(func, cst.Attribute) and _is_self(func.value) and self._current is not None:
      factory = self.fields.get((self._current, func.attr.value))
      if factory is None:
        return None
      if isinstance(factory, str):
        raise self._unsupported(call, f'self.{func.attr.value}(...)(...) builds a submodule from a ModuleDef or factory '
                                      f'field: {factory}')
      self.callee[call] = f'self.{func.attr.value}'
      if (self._current, func.attr.value) not in self._reported:
        self._reported.add((self._current, func.attr.value))
        supplier = ', '.join(sorted(o or 'module-level code' for o in self.suppliers.get(self._current, {None})))
        made = f'an NNX {find_layer(factory.target).nnx.rpartition(".")[2]}' if factory.kind == 'layer' \
            else f'the converted class {factory.target}'
        where = f' (what {supplier} passes)' if factory.kind == 'layer' else ''
        rule._pending.append((call, f'self.{func.attr.value}(...): the field {func.attr.value} makes {made}'
                                    f'{where}; it is called in __init__ with the input size and rngs'))
      return self._kind(call, factory)
    if isinstance(func, cst.Name):
      line = next((line for line, uses in self._locals.items() if func in uses), None)
      if line is None:
        return None
      self.callee[call] = func.value
      return self._kind(call, Factory('layer', find_layer(self._factory_of(line)).linen))
    return None

  def _factory_of(self, line: cst.SimpleStatementLine) -> str:
    value = next(v for vs in self._values.values() for v in vs if v.local is not None and v.local[0] is line)
    return value.factory.target

  def _kind(self, call: cst.Call, factory: Factory) -> tuple[str, tp.Any, tp.Any]:
    rule = self.rule
    if factory.kind == 'class':
      plan = rule._plans.get(factory.target)
      if plan is None:
        raise self._unsupported(call, f'{factory.target}, built through {rule.module.code_for_node(call.func)}, was '
                                      'not converted')
      return factory.target, None, plan
    spec = find_layer(factory.target)
    return spec.linen, spec, None

  def is_activation(self, expr: cst.CSTNode) -> bool:
    """`self.act(x)` for a Callable field of the class being planned: elementwise."""
    return (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and _is_self(expr.func.value)
            and expr.func.attr.value in self.activations.get(self._current, ()) and len(expr.args) == 1
            and expr.args[0].keyword is None and not expr.args[0].star)

  def unconverted_suppliers(self) -> list[tuple[str, str]]:
    """(class, supplier) pairs where a converted class takes layer factories from a class left Linen."""
    plans = self.rule._plans
    return [(name, supplier) for name, owners in self.suppliers.items() if name in plans
            for supplier in sorted(o for o in owners if o is not None) if supplier not in plans]


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

def tied_uses(factories: Factories, plan: tp.Any, methods: dict[str, cst.FunctionDef],
              setup: cst.FunctionDef | None) -> set[cst.Attribute]:
  """Weight tying through Linen's `.apply` and `.variables`, for the submodules built in setup():

  - `self.decoder.apply({'params': {'kernel': shared}}, h)` of an `nn.Dense(..., use_bias=False)` becomes the
    computation it runs, `h @ shared` (both cast to the layer's dtype when it sets one). Linen creates no params
    for a layer only run through `.apply` (its variables are given), so such a layer goes: it is not created in
    __init__; one also called directly stays.
  - `self.encoder.variables['params']['embed']['embedding']` becomes the NNX Variable's value,
    `self.encoder.embed.embedding[...]`: the same array, and gradients reach it from every use.

  Returns the `self.<attr>` nodes handled; the rule skips them when it checks the submodules' uses."""
  rule = factories.rule
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
      parent = rule._parent(sub)
      if isinstance(parent, cst.Attribute) and parent.value is sub and parent.attr.value == 'variables':
        _variables_read(factories, parent, from_setup[attr])
        handled.add(sub)
  for attr, subs in uses.items():
    child = from_setup[attr]
    tied, arms = [], []
    for sub in subs:
      parent = rule._parent(sub)
      call = rule._parent(parent)
      if isinstance(parent, cst.Attribute) and parent.value is sub and parent.attr.value == 'apply' \
          and isinstance(call, cst.Call) and call.func is parent:
        _tied_apply(factories, call, child)
        tied.append(sub)
        arms.append(_arm(rule, call, call_method, given=True))
      elif sub not in handled:
        arms.append(_arm(rule, sub, call_method, given=False))
    handled.update(tied)
    if tied and len(tied) == len(subs):  # only run with given variables: Linen creates none for it
      plan.children.remove(child)
      rule._removed.add(rule._parent(rule._parent(child.ctor)))
      rule._lifted.add(child.ctor)
      rule._pending.append((child.ctor, f'self.{attr} is only run through .apply with a shared kernel, so Linen '
                                        f'creates no params for it: not created in __init__'))
    elif tied:  # `if shared is not None: <tied> else: self.decoder(h)`: it exists when called without
      params = {a for a in arms if a is not None}
      if None in arms or len(params) != 1:
        raise factories._unsupported(child.ctor, f'self.{attr} is run both through .apply with a shared kernel and '
                                                 'directly, other than as `if <arg> is not None: <tied> else: <own>` '
                                                 'on one __call__ argument: when Linen creates its params is unknown')
      param = params.pop()
      flag = f'tied_{attr}'
      taken = {*plan.field_names, *(n for n, _ in plan.size_params), *plan.flags, 'rngs'}
      while flag in taken:
        flag += '_'
      plan.flags.append(flag)
      factories.flags.setdefault(plan.name, {})[param] = flag
      child.condition = f'not {flag}'
      rule._pending.append((child.ctor, f'self.{attr} is created only when not {flag}, a new constructor argument '
                                        f'(default False): Linen creates its params only when __call__ gets no '
                                        f'{param}; a parent passing {param} passes {flag}=True'))
  for child in plan.children:  # a child with tied layers: is it given their shared kernel?
    if child.sibling is not None and factories.flags.get(child.sibling.name):
      _pass_flags(factories, plan, child, methods, setup)
  return handled


def _arm(rule: tp.Any, node: cst.CSTNode, method: cst.FunctionDef | None, given: bool) -> str | None:
  """The __call__ argument P when `node` runs only when P is given (`given`, under `if P is not None:`) or only
  when it is not (the else, or `if P is None:`); None otherwise."""
  params = {p.name.value: p for p in method.params.params[1:]} if method is not None else {}
  current = node
  while (parent := rule._parent(current)) is not None and parent is not method:
    if isinstance(parent, cst.Else):
      statement = rule._parent(parent)
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


def _pass_flags(factories: Factories, plan: tp.Any, child: tp.Any, methods: dict[str, cst.FunctionDef],
                setup: cst.FunctionDef | None) -> None:
  """`tied_decoder=<when the calls pass shared_embedding>` for a child whose class ties a layer on one of its
  call arguments: every call of the child must agree, and the condition must be code __init__ can run."""
  rule = factories.rule
  flags = factories.flags[child.sibling.name]
  calls = [sub for method in methods.values() if method is not setup for sub in descendants(method)
           if isinstance(sub, cst.Call) and (sub.func is child.ctor or isinstance(sub.func, cst.Attribute)
                                             and _is_self(sub.func.value) and sub.func.attr.value == child.attr
                                             and not child.hoisted)]
  if not calls:
    raise factories._unsupported(child.ctor, f'self.{child.attr} ties layers on its call arguments and is not '
                                             'called: when Linen creates their params is unknown')
  names = child.sibling.call_params
  for param, flag in flags.items():
    conditions = set()
    for call in calls:
      value = next((a.value for i, a in enumerate(call.args)
                    if (a.keyword.value if a.keyword is not None else names[i] if i < len(names) else None) == param),
                   None)
      conditions.add(_given(factories, value, plan, flag, methods.get('__call__')))
    if len(conditions) != 1:
      raise factories._unsupported(child.ctor, f'the calls of self.{child.attr} disagree on whether they pass '
                                               f'{param}: when Linen creates the tied layer\'s params is unknown')
    condition = conditions.pop()
    if condition != 'False':
      child.sizes[flag] = condition
    rule._pending.append((child.ctor, f'{flag}={condition} for self.{child.attr}: its calls '
                                      f'{"pass" if condition == "True" else "do not pass" if condition == "False" else "pass, when " + condition + ","} '
                                      f'{param}'))


def _given(factories: Factories, value: cst.BaseExpression | None, plan: tp.Any, flag: str,
           method: cst.FunctionDef | None) -> str:
  """Code valid in __init__ that says whether `value` (an argument of a call) is not None. A `__call__` argument
  defaulting to None passed on (`self.predictions(h, shared_embedding=shared_embedding)`) gives the class a flag
  of its own, which its parents set."""
  rule = factories.rule
  if value is None or isinstance(value, cst.Name) and value.value == 'None':
    return 'False'
  if not isinstance(value, cst.Name):
    return 'True'
  scope = rule.get_metadata(ScopeProvider, value, None)
  assignments = list(scope[value.value]) if scope is not None else []
  params = list(method.params.params[1:]) if method is not None else []
  if len(assignments) == 1 and any(assignments[0].node is p for p in params):
    default = assignments[0].node.default
    if isinstance(default, cst.Name) and default.value == 'None':
      own = factories.flags.setdefault(plan.name, {})
      if value.value not in own:
        taken = {*plan.field_names, *(n for n, _ in plan.size_params), *plan.flags, 'rngs'}
        while flag in taken:
          flag += '_'
        plan.flags.append(flag)
        own[value.value] = flag
        rule._pending.append((value, f'new constructor argument {flag} (default False): whether the callers pass '
                                     f'{value.value}, which {plan.name} passes on to a layer tied on it'))
      return own[value.value]
  values = []
  for assignment in assignments:
    target = rule._parent(assignment.node) if isinstance(assignment, cst.metadata.Assignment) else None
    assign = rule._parent(target) if isinstance(target, cst.AssignTarget) else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and target.target is assignment.node):
      raise factories._unsupported(value, f'{value.value}, passed to a tied layer\'s argument, is not a local bound '
                                          'by plain assignments')
    values.append(assign)
  nones = [a for a in values if isinstance(a.value, cst.Name) and a.value.value == 'None']
  if not nones:
    return 'True' if values else 'False'
  if len(values) == 2 and len(nones) == 1:  # `if T: x = <array> else: x = None`
    given = next(a for a in values if a not in nones)
    line, other = rule._parent(given), rule._parent(nones[0])
    block, other_block = rule._parent(line), rule._parent(other)
    statement = rule._parent(block)
    else_of = rule._parent(other_block)
    if isinstance(statement, cst.If) and isinstance(else_of, cst.Else) and rule._parent(else_of) is statement \
        and block is statement.body:
      test = statement.test
      try:
        rule._check_hoistable(test)
      except Exception:
        test = None
      if test is not None and not any(isinstance(n, cst.Name) and n.value in rule._switches
                                      for n in (test, *descendants(test))):
        return rule._code(test)
  raise factories._unsupported(value, f'{value.value}, passed to a tied layer\'s argument, is None or not under a '
                                      'condition __init__ cannot evaluate (converted: `if <fields or config>: x = '
                                      '<array> else: x = None`)')


def _tied_apply(factories: Factories, call: cst.Call, child: tp.Any) -> None:
  rule, unsupported = factories.rule, factories._unsupported
  code = rule.module.code_for_node(call)
  spec = child.spec
  args = call.args
  kernel = None
  if len(args) == 2 and all(a.keyword is None and not a.star for a in args):
    variables = rule._literal_dict(args[0].value)
    params = rule._literal_dict(variables['params']) if variables is not None and set(variables) == {'params'} else None
    kernel = params['kernel'] if params is not None and set(params) == {'kernel'} else None
  if spec is None or not spec.tied_kwargs or kernel is None:
    raise unsupported(call, f'{code}: only `<nn.Dense>.apply({{"params": {{"kernel": k}}}}, x)` (a tied output '
                            'projection) is converted')
  use_bias = child.kwargs.get('use_bias')
  if not (isinstance(use_bias, cst.Name) and use_bias.value == 'False') or set(child.kwargs) - spec.tied_kwargs:
    raise unsupported(call, f'{code}: the Dense has a bias or options other than {", ".join(sorted(spec.tied_kwargs))} '
                            '(converted: use_bias=False)')
  inputs = args[1].value
  if any(isinstance(n, cst.Call) for n in (inputs, kernel, *descendants(inputs), *descendants(kernel))):
    raise unsupported(call, f'{code}: a tied apply of calls (bind its input and kernel to locals first)')
  left, right = rule._code(inputs), rule._code(kernel)
  if 'dtype' in child.kwargs:  # Dense casts its input and kernel to its dtype (None: their common type)
    dtype = rule._code(child.kwargs['dtype'])
    left, right = f'jnp.asarray({left}, {dtype})', f'jnp.asarray({right}, {dtype})'
  elif 'precision' not in child.kwargs:
    left, right = _operand(left), _operand(right)
  if 'precision' in child.kwargs:
    text = f'jnp.matmul({left}, {right}, precision={rule._code(child.kwargs["precision"])})'
  else:
    text = f'{left} @ {right}'
    if not isinstance(rule._parent(call), (cst.Assign, cst.Return, cst.Arg, cst.AugAssign)):
      text = f'({text})'
  if 'jnp' in text and not rule._jnp_bound(call):
    rule.add_needed_import('jax.numpy', asname='jnp')
  rule._exprs[call] = text
  rule._pending.append((call, f'{code} -> {text}: the tied projection the Dense computes with the given kernel'))


def _variables_read(factories: Factories, variables: cst.Attribute, child: tp.Any) -> None:
  """`self.encoder.variables['params']['embed']['embedding']` -> `self.encoder.embed.embedding[...]`."""
  rule, unsupported = factories.rule, factories._unsupported
  node, keys = variables, []
  while isinstance(parent := rule._parent(node), cst.Subscript) and parent.value is node and len(parent.slice) == 1 \
      and isinstance(parent.slice[0].slice, cst.Index) and isinstance(parent.slice[0].slice.value, cst.SimpleString):
    keys.append(parent.slice[0].slice.value.evaluated_value)
    node = parent
  code = rule.module.code_for_node(node)
  if not keys or keys[0] != 'params':
    raise unsupported(node, f'{code}: only reads of one param, self.<child>.variables["params"][...], are converted')
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
        rule._exprs[node] = f'self.{child.attr}.{".".join(attrs)}[...]'
        break
    elif current.spec is not None and last and not current.spec.params.fuse and not current.spec.params.drop:
      attrs.append(dict(current.spec.params.key_renames).get(key, key))
      rule._exprs[node] = f'self.{child.attr}.{".".join(attrs)}[...]'
      break
    else:
      break
  if node not in rule._exprs:
    raise unsupported(node, f'{code}: the path does not name one param of a converted submodule')
  rule._pending.append((node, f'{code} -> {rule._exprs[node]}, the NNX Variable\'s value (gradients reach it from '
                              'every use)'))


def _operand(code: str) -> str:
  """`code` as an operand of `@`: a name, attribute, subscript or call as it is, anything else parenthesised."""
  try:
    node = cst.parse_expression(code)
  except cst.ParserSyntaxError:
    return f'({code})'
  return code if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) else f'({code})'
