"""The search for a file's factory fields (`with_factories`), once per file after its facts: see `factory_fields.py`
for what a factory field is and what the search finds."""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002.facts import FileFacts
from codemods.rules.l2n002.factory_fields import Factory, FactoryFields, FactoryValue, factory_calls
from codemods.rules.l2n002.nodes import assigned_name, is_self_attr, self_assignment
from codemods.vocabulary import ACTIVATION_TABLES, CALLABLE, PARTIAL_NAMES
from nnx_bridge.layer_table import find_layer


def with_factories(facts: FileFacts) -> FileFacts:
  """The file's facts (`facts.analyse_file`) with the factory fields of its Linen classes and what each makes."""
  return dataclasses.replace(facts, factories=_FileScan(facts).scan())


class _FileScan:
  """The search for the factory fields of one file (`with_factories`)."""

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
    assigned: dict[str, list[cst.BaseExpression]] = {}  # module-level `name = value`, for aliases of Callable
    for statement in module.body:
      if isinstance(statement, cst.SimpleStatementLine) and (name := assigned_name(statement)) is not None:
        assigned.setdefault(name, []).append(statement.body[0].value)
    self.activations = {
        name: {f for f, (annotation, _) in fields[name].items() if _callable(facts, annotation, assigned)}
        | _table_activations(facts, node) for name, node in classes.items()}
    used = {(name, built.func.attr.value) for name, node in classes.items() for built in factory_calls(node)
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
    if owner is not None and isinstance(func, cst.Attribute) and is_self_attr(func):
      factory = self.fields.get((owner, func.attr.value))
      if isinstance(factory, Factory) and factory.kind == 'class' and factory.target in classes:
        return factory.target, args
    return None, ()

  def _resolve(self, value: cst.BaseExpression, owner: str | None) -> Factory | None:
    """What a value passed for a factory field makes: a class of the file, a table layer or a partial of one
    (bound to a local or not), or what a factory field of the class passing it makes."""
    facts = self.facts
    if isinstance(value, cst.Name) and value.value in facts.linen_classes:
      return Factory('class', value.value)
    imported = facts.imported_class(value)
    if imported is not None:  # `continuous_networks.ActorCriticNetwork`, a class another file of the run converted
      return Factory('class', imported)
    if owner is not None and isinstance(value, cst.Attribute) and is_self_attr(value):
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
        return (f'{name}.{field} is given {code}, which is not a layer, a partial of one, a class of this file or '
                f'a class another file of the run converted: what self.{field} makes is unknown')
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

def _callable(facts: FileFacts, annotation: cst.BaseExpression, assigned: dict[str, list[cst.BaseExpression]]) -> bool:
  """Whether a field's annotation names a callable: `Callable[...]`, or a module-level alias of one (brax's
  `ActivationFn = Callable[[jnp.ndarray], jnp.ndarray]`; `assigned`: the module-level assignments by name)."""
  values = assigned.get(annotation.value, []) if isinstance(annotation, cst.Name) else []
  return bool(CALLABLE.match(facts.code(values[0] if len(values) == 1 else annotation)))


def _table_activations(facts: FileFacts, node: cst.ClassDef) -> set[str]:
  """The attributes the class's setup() binds to an entry of an activation table (`vocabulary.ACTIVATION_TABLES`:
  transformers' `self.act = ACT2FN[self.config.hidden_act]`): elementwise, like a Callable field."""
  setup = next((s for s in node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == 'setup'), None)
  found = set()
  for statement in setup.body.body if setup is not None else ():
    attr = self_assignment(statement)
    value = statement.body[0].value if attr is not None else None
    if isinstance(value, cst.Subscript) and any(q.name.endswith(table) for q in facts.qualified_names(value.value)
                                                for table in ACTIVATION_TABLES):
      found.add(attr)
  return found


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
