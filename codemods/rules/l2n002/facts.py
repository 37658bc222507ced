"""What L2N002 knows of a file before it plans any class: `FileFacts`, computed once in `visit_Module`.

The facts hold the file's Linen classes and what is said of them across the file (the classes some
nn.scan runs, those Linen-only code keeps Linen, the factory fields and what each makes), and wrap
the libcst metadata the passes read (qualified names, parents, scopes, positions).
"""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst
from libcst.metadata import (
  CodePosition,
  ParentNodeProvider,
  PositionProvider,
  QualifiedName,
  QualifiedNameProvider,
  QualifiedNameSource,
  Scope,
  ScopeProvider,
)

from codemods.analysis.hierarchy import LinenHierarchy
from codemods.nodes import descendants
from codemods.options import MigrationOptions
from codemods.rules.l2n002.factory_fields import FactoryFields
from codemods.vocabulary import (
  CONTROL_FLOW,
  JIT_NAMES,
  MODULE_NAMES,
  PARTIAL_NAMES,
  PARTITIONING_REMAT_NAMES,
  REMAT_NAMES,
  SCAN_NAMES,
  VMAP_NAMES,
)

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.plan import ClassRewrite

Metadata = tp.Callable[..., tp.Any]
"""`MetadataDependent.get_metadata`: (provider, node, default) -> the node's metadata."""


@dataclasses.dataclass(frozen=True)
class FileFacts:
  """One file as L2N002 sees it."""

  module: cst.Module
  metadata: Metadata = dataclasses.field(repr=False)  # the rule's libcst metadata lookup
  filename: str | None
  options: MigrationOptions
  hierarchy: LinenHierarchy
  linen_classes: frozenset[str] = frozenset()  # module-level Linen classes of the file
  class_defs: tp.Mapping[str, cst.ClassDef] = dataclasses.field(default_factory=dict)  # module-level classes
  global_names: frozenset[str] = frozenset()  # names bound at module level
  aliases: tp.Mapping[str, frozenset[QualifiedName]] = dataclasses.field(default_factory=dict)  # `remat = nn.remat`
  scanned_cells: frozenset[str] = frozenset()  # classes of the file some nn.scan(<class>, ...) runs
  kept_linen: tp.Mapping[str, str] = dataclasses.field(default_factory=dict)  # classes that stay Linen -> why
  unbridged: frozenset[str] = frozenset()  # Linen classes that wrap no converted class with nnx_bridge.to_linen
  factories: FactoryFields | None = None  # ModuleDef / partial factory fields and what they make
  imported: tp.Mapping[str, ClassRewrite] = dataclasses.field(default_factory=dict)  # other files' converted classes
  awaited: set[str] = dataclasses.field(default_factory=set)  # Linen classes of other files planning waited on

  # --- metadata --------------------------------------------------------------------------------

  def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
    return self.metadata(ParentNodeProvider, node, None)

  def inside(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
    """Whether `node` is `ancestor` or one of its descendants."""
    while node is not None and node is not ancestor:
      node = self.parent(node)
    return node is ancestor

  def qualified_names(self, node: cst.CSTNode) -> tp.Collection[QualifiedName]:
    """What `node` names, a module-level alias of a flax name (`remat = nn_partitioning.remat`) followed."""
    names = self.metadata(QualifiedNameProvider, node, set())
    if isinstance(node, cst.Name) and node.value in self.aliases and any(q.name == node.value for q in names):
      return self.aliases[node.value]
    return names

  def scope(self, node: cst.CSTNode) -> Scope | None:
    return self.metadata(ScopeProvider, node, None)

  def position(self, node: cst.CSTNode) -> CodePosition:
    """Where `node` starts in the original file."""
    return self.metadata(PositionProvider, node).start

  def code(self, node: cst.CSTNode) -> str:
    return self.module.code_for_node(node)

  def has_name(self, node: cst.CSTNode, names: tp.Collection[str]) -> bool:
    return any(q.name in names for q in self.qualified_names(node))

  def is_linen_name(self, node: cst.CSTNode) -> bool:
    """Whether `node` names something of flax.linen."""
    return isinstance(node, (cst.Name, cst.Attribute)) and any(
        q.name == 'flax.linen' or q.name.startswith('flax.linen.') for q in self.qualified_names(node))

  def imported_class(self, node: cst.CSTNode) -> str | None:
    """The qualified name (the key of `imported`) of the class another file of the run converted that the name or
    attribute `node` denotes (`FlaxTimesteps`, `base_networks.ImpalaEncoder`), else None."""
    if not isinstance(node, (cst.Name, cst.Attribute)):
      return None
    for qualified in self.qualified_names(node):
      key = self.hierarchy.resolve(qualified.name) or qualified.name
      if key in self.imported:
        return key
    return None

  def settled_class(self, node: cst.CSTNode) -> str | None:
    """The qualified name of the Linen class of another file that the name or attribute `node` denotes, when the
    run keeps it Linen there (`LinenHierarchy.settled`): a converted class wraps it with nnx_bridge.from_linen, as
    a Linen class of its own file; else None."""
    if not isinstance(node, (cst.Name, cst.Attribute)):
      return None
    return next((found for q in self.qualified_names(node) if q.source is QualifiedNameSource.IMPORT
                 and (found := self.hierarchy.stays_linen(q.name)) is not None), None)

  def ancestors(self, node: cst.CSTNode) -> tp.Iterator[cst.CSTNode]:
    """The nodes above `node` up to its statement, that one included."""
    parent = self.parent(node)
    while parent is not None and not isinstance(parent, (cst.BaseStatement, cst.BaseSmallStatement)):
      yield parent
      parent = self.parent(parent)
    if parent is not None:
      yield parent

  def local_call(self, name: cst.Name, funcs: tp.Collection[str]
                 ) -> tuple[cst.SimpleStatementLine, cst.metadata.Assignment, cst.Call] | None:
    """The statement `name = f(...)` binding a function-scope local once, with `f` one of `funcs`: the statement,
    the local's assignment and the call; None otherwise."""
    scope = self.scope(name)
    if scope is None or isinstance(scope, (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)):
      return None
    assignments = list(scope[name.value])
    if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
      return None
    target = self.parent(assignments[0].node)
    assign = self.parent(target) if isinstance(target, cst.AssignTarget) else None
    line = self.parent(assign) if isinstance(assign, cst.Assign) else None
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and len(assign.targets) == 1
            and isinstance(assign.value, cst.Call) and isinstance(assign.value.func, (cst.Name, cst.Attribute))
            and self.has_name(assign.value.func, funcs)):
      return None
    return line, assignments[0], assign.value

  def unremat(self, node: cst.CSTNode) -> cst.CSTNode:
    """`Block` for `nn.remat(Block, ...)`; `node` itself otherwise."""
    if isinstance(node, cst.Call) and self.has_name(node.func, REMAT_NAMES) and node.args:
      return node.args[0].value
    return node

  def nnx_is_free(self, node: cst.CSTNode) -> bool:
    """Whether the name `nnx` at `node` is unbound or bound to `flax.nnx`."""
    return self.names_of(node, 'nnx') <= {'flax.nnx'} if self.scope(node) is not None else False

  def names_of(self, node: cst.CSTNode, name: str) -> set[str]:
    """The qualified names `name` is bound to at `node` (empty: unbound)."""
    scope = self.scope(node)
    return {q.name for a in scope[name] for q in a.get_qualified_names_for(name)} if scope is not None else set()

  # --- classes ---------------------------------------------------------------------------------

  def run_base(self, base: cst.BaseExpression) -> str | None:
    """The fully qualified name of the Linen class of the run that `base` names, else None."""
    return next((found for q in self.qualified_names(base) if (found := self.hierarchy.resolve(q.name)) is not None), None)

  def linen_bases(self, node: cst.ClassDef) -> list[int]:
    """The positions of the bases of `node` that make it a Linen class: flax.linen.Module or a Linen class of the
    run (`codemods/analysis/hierarchy.py`)."""
    return [i for i, base in enumerate(node.bases) if base.keyword is None
            and (self.has_name(base.value, MODULE_NAMES) or self.run_base(base.value) is not None)]

  def linen_base(self, node: cst.ClassDef) -> cst.Arg:
    """The (first) base of `node` that makes it a Linen class; the others are plain Python, kept as they are."""
    return node.bases[(self.linen_bases(node) or [0])[0]]

  def project_base(self, node: cst.ClassDef) -> str | None:
    """The fully qualified name of the Linen base of `node` when it is a Linen class of the run, else None."""
    indices = self.linen_bases(node)
    return self.run_base(node.bases[indices[0]].value) if indices else None

  def is_linen_class(self, node: cst.ClassDef) -> bool:
    """Whether a base is flax.linen.Module or a Linen class of the run (`codemods/analysis/hierarchy.py`)."""
    return bool(self.linen_bases(node))


def analyse_file(module: cst.Module, metadata: Metadata, filename: str | None, options: MigrationOptions,
                 hierarchy: LinenHierarchy, kept: tp.Mapping[str, str] = {},
                 unbridged: tp.Collection[str] = (), imported: tp.Mapping[str, ClassRewrite] = {}) -> FileFacts:
  """The facts of one file, but its factory fields (`factory_scan.with_factories` adds them).

  `kept`: classes of the file the run has decided to keep as Linen (`MigrationRule.kept_classes`), with why.
  `unbridged`: Linen classes that must not wrap converted classes with to_linen (`MigrationRule.unbridged_classes`).
  `imported`: the classes other files of the run converted, by qualified name, as plans that stand in for them
  (`interface.sibling_plan`).
  """
  facts = FileFacts(module, metadata, filename, options, hierarchy, unbridged=frozenset(unbridged), imported=imported)
  scope = facts.scope(module)
  facts = dataclasses.replace(facts, aliases=_flax_aliases(facts, scope))
  linen = frozenset(s.name.value for s in module.body if isinstance(s, cst.ClassDef) and facts.is_linen_class(s))
  scanned = frozenset(
      target.value for sub in descendants(module)
      if isinstance(sub, cst.Call) and sub.args and facts.has_name(sub.func, SCAN_NAMES)
      and isinstance(target := facts.unremat(sub.args[0].value), cst.Name) and target.value in linen) \
      | frozenset(s.name.value for s in module.body if isinstance(s, cst.ClassDef) and s.name.value in linen
                  and _scans_its_call(facts, s))
  global_names = frozenset(a.name for a in scope.assignments) if scope is not None else frozenset()
  class_defs = {s.name.value: s for s in module.body if isinstance(s, cst.ClassDef)}
  facts = dataclasses.replace(facts, linen_classes=linen, class_defs=class_defs, global_names=global_names,
                              scanned_cells=scanned)
  return dataclasses.replace(facts, kept_linen={**_held_classes(facts), **_linen_only_uses(facts), **kept})


def _scans_its_call(facts: FileFacts, node: cst.ClassDef) -> bool:
  """Whether the class's `__call__` is decorated `@functools.partial(nn.scan, ...)`: a cell scanned over its own
  inputs, which its callers call with whole sequences (`lifted.py` converts the decorator)."""
  return any(isinstance(method, cst.FunctionDef) and method.name.value == '__call__'
             and isinstance(d.decorator, cst.Call) and facts.has_name(d.decorator.func, PARTIAL_NAMES)
             and d.decorator.args and facts.has_name(d.decorator.args[0].value, SCAN_NAMES)
             for method in node.body.body for d in getattr(method, 'decorators', ()))


def _flax_aliases(facts: FileFacts, scope: Scope | None) -> dict[str, frozenset[QualifiedName]]:
  """Module-level names bound once to a flax name (`remat = nn_partitioning.remat` in transformers' files) or to
  `functools.partial` (jax-md's `partial = functools.partial`): what they name, so that `remat(...)` is read as the
  flax function it is."""
  aliases = {}
  for line in facts.module.body:
    assign = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
            and isinstance(assign.value, (cst.Name, cst.Attribute))):
      continue
    name, names = assign.targets[0].target.value, frozenset(facts.qualified_names(assign.value))
    if names and all(q.name.startswith('flax.') or q.name in PARTIAL_NAMES for q in names) and scope is not None \
        and len(scope[name]) == 1:
      aliases[name] = names
  return aliases


def _held_classes(facts: FileFacts) -> dict[str, str]:
  """Classes of the file that a class attribute of a class that is no module holds (transformers'
  `class FlaxBertModel(FlaxBertPreTrainedModel): module_class = FlaxBertModule`): code out of sight (a base
  class, a library) builds them with a Linen module's arguments and runs them with `.init` / `.apply`, so they
  stay Linen; the converted classes they build go through nnx_bridge.to_linen where they can
  (`linen_parents.py`). The run's post-condition finds holders in other files (`analysis/seams.py`)."""
  held: dict[str, str] = {}
  for holder in facts.class_defs.values():
    if holder.name.value in facts.linen_classes or any(
        q.name.startswith('flax.') for base in holder.bases for q in facts.qualified_names(base.value)):
      continue
    for line in holder.body.body:
      statement = line.body[0] if isinstance(line, cst.SimpleStatementLine) else None
      target = statement.targets[0].target if isinstance(statement, cst.Assign) and len(statement.targets) == 1 \
          else statement.target if isinstance(statement, cst.AnnAssign) else None
      value = statement.value if target is not None else None
      if isinstance(target, cst.Name) and isinstance(value, cst.Name) and value.value in facts.linen_classes:
        held.setdefault(value.value, f'the class {holder.name.value}, which is no module, holds it in a class '
                                     f'attribute ({holder.name.value}.{target.value}) for code that builds it with a '
                                     "Linen module's arguments and runs it with .init / .apply")
  return held


def _linen_only_uses(facts: FileFacts) -> dict[str, str]:
  """Classes of the file that Linen-only code uses (`nn.map_variables(Block, ...)`, a Linen function NNX has no
  counterpart of, given the class itself), and the classes those use: they stay Linen, so that code keeps
  running on Linen modules; a converted class building one wraps it with nnx_bridge.from_linen."""
  converted = SCAN_NAMES | REMAT_NAMES | PARTITIONING_REMAT_NAMES | JIT_NAMES | VMAP_NAMES | set(CONTROL_FLOW)
  kept: dict[str, str] = {}
  for call in descendants(facts.module):
    if not (isinstance(call, cst.Call) and isinstance(call.func, (cst.Name, cst.Attribute))) \
        or not facts.is_linen_name(call.func) or facts.has_name(call.func, converted):
      continue
    for arg in call.args:
      if arg.keyword is None and isinstance(arg.value, cst.Name) and arg.value.value in facts.linen_classes:
        kept.setdefault(arg.value.value, f'{facts.code(call.func)} has no NNX counterpart')
  pending = list(kept)
  while pending:  # what a kept class builds stays Linen with it
    user = pending.pop()
    for sub in descendants(facts.class_defs[user]):
      if isinstance(sub, cst.Name) and sub.value in facts.linen_classes and sub.value not in kept:
        kept[sub.value] = f'the Linen class {user}, kept as Linen, uses it'
        pending.append(sub.value)
  return kept
