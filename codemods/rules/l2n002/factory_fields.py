"""The factory fields of a file's Linen classes, found once per file (`FileFacts.factories`,
by `factory_scan.with_factories`): fields that hold a
layer, a partial of one or a class of the file (`conv: ModuleDef`, `block_cls: ModuleDef`), and what each makes.

What a factory field makes comes from the constructions of its class in the same file (a call of the class, a
`partial` of it, a field default, or a call through another factory field holding the class): every one of them
must pass the same kind of layer (a table layer, a partial of it, or a local bound to such a partial) or the same
class. Layers are only passed from converted classes (module-level code is not converted); a class may be passed
from anywhere (the name then refers to the converted class). `Callable` fields called with one argument
(`act: Callable = nn.relu`) are activations: elementwise, so sizes flow through them, as through an attribute
setup() binds to an activation table's entry (`ACT2FN[name]`). `factories.py` converts
them for the class being planned.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst

from codemods.nodes import descendants


@dataclasses.dataclass(frozen=True)
class Factory:
  """What a factory field makes: `kind` 'layer' (`target` the table layer's qualified Linen name) or 'class'
  (`target` the name of a Linen class of the file, or the qualified name of a class another file of the run
  converted, a key of `FileFacts.imported`)."""

  kind: str
  target: str

  def describe(self) -> str:
    return self.target.rpartition('.')[2] if self.kind == 'layer' else f'the class {self.target.rpartition(".")[2]}'


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
  # -> the layer factories its code passes. `activations`: class -> its Callable fields and the attributes its
  # setup() binds to an activation table's entry (`self.act = ACT2FN[self.config.hidden_act]`).



def unconverted_suppliers(fields: FactoryFields, converted: tp.Collection[str]) -> list[tuple[str, str]]:
  """(class, supplier) pairs where a converted class takes layer factories from a class left Linen."""
  return [(name, supplier) for name, owners in fields.suppliers.items() if name in converted
          for supplier in sorted(o for o in owners if o is not None) if supplier not in converted]


def factory_calls(node: cst.ClassDef) -> tp.Iterator[cst.Call]:
  """The calls in a class that build a submodule: `f(...)(x)`, and `self.<attr> = f(...)` in setup()."""
  for sub in descendants(node):
    if isinstance(sub, cst.Call) and isinstance(sub.func, cst.Call):
      yield sub.func
    if isinstance(sub, cst.FunctionDef) and sub.name.value == 'setup':
      for statement in sub.body.body:
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 \
            and isinstance(statement.body[0], cst.Assign) and isinstance(statement.body[0].value, cst.Call):
          yield statement.body[0].value
