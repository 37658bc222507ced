"""The interface every `linen2nnx migrate` rule implements.

A rule is a libcst `VisitorBasedCodemodCommand` with two class attributes and two helpers:

```
class ConvertFooRule(MigrationRule):
  CODE = 'L2N042'                       # unique; the fixture folder is fixtures/L2N042/
  DESCRIPTION = 'flax.linen.foo -> flax.nnx.foo.'
  METADATA_DEPENDENCIES = (QualifiedNameProvider,)   # added to the base class's own

  def leave_Attribute(self, original_node, updated_node):
    if QualifiedNameProvider.has_name(self, original_node, 'flax.linen.foo'):
      self.add_needed_import('flax', 'nnx')            # AddImportsVisitor, run afterwards
      self.report_change(original_node, 'nn.foo -> nnx.foo')
      return cst.parse_expression('nnx.foo')
    return updated_node
```

- Match by qualified name (`QualifiedNameProvider`), never by spelling, so that every import
  style resolves and a shadowed local `nn` is left alone.
- Add and remove imports only through `self.add_needed_import` / `self.remove_unused_import`
  (libcst's `AddImportsVisitor` / `RemoveImportsVisitor`, run once the rule is done).
- Call `self.report_change(node, message)` for every rewrite and `self.report_todo(node,
  message)` for every construct left unconverted. Pass the *original* node: positions come
  from `PositionProvider` on the original tree. `report_todo` also puts a
  `# TODO(linen2nnx): message` line above the statement that holds the node (once: not again
  when the same line is already there, so a second run changes nothing). A line of its own
  rather than an end-of-line comment keeps existing trailing comments and pragmas intact.
- A rule that converts a class calls `self.report_class(node, nnx_name, arguments, children)`
  too: the structured record of its new constructor that `--report-json` carries.
- `self.nnx_is_free(node)` and `self.remove_import_of(node)` are the scope helpers rules share
  (declare `ScopeProvider` to use them).
- A rule must be idempotent: its output, migrated again, is unchanged.
- Optional, for speed: `REQUIRES = ('initializers', 'zeros_init')` runs the rule only on code
  that holds at least one of these words as a whole word (`init` is not in `__init__`). Every
  part of a qualified name is in each way of writing it, whatever the import style (`import flax`
  + `flax.linen.Dense` and `from flax.linen import Dense as D` both contain `Dense`; the alias `nn`
  need not be there), so listing the last part of each name the rule matches is safe.
  `REQUIRES_PATTERN`, sharper, runs it only on code a regular expression finds (L2N003: a call
  `name.init(`, where each of its rewrites starts).
"""

from __future__ import annotations

import re
import typing as tp

import libcst as cst
from libcst.codemod import VisitorBasedCodemodCommand
from libcst.metadata import ImportAssignment
from libcst.metadata import ParentNodeProvider
from libcst.metadata import PositionProvider
from libcst.metadata import ScopeProvider

from codemods.analysis.hierarchy import HIERARCHY_KEY
from codemods.analysis.hierarchy import LinenHierarchy
from codemods.options import OPTIONS_KEY
from codemods.options import MigrationOptions
from codemods.report import ChildName
from codemods.report import ConstructorArgument
from codemods.report import ConvertedClass
from codemods.report import Entry
from codemods.report import todo_key

REPORT_KEY = 'linen2nnx.report'
CLASSES_KEY = 'linen2nnx.classes'
KNOWN_CLASSES_KEY = 'linen2nnx.known_classes'  # the records of earlier rules, for the rules after them
KEPT_CLASSES_KEY = 'linen2nnx.kept_classes'  # classes of the file decided to stay Linen -> why
IMPORTED_CLASSES_KEY = 'linen2nnx.imported_classes'  # classes other files of the run converted, by qualified name
UNBRIDGED_CLASSES_KEY = 'linen2nnx.unbridged_classes'  # Linen classes that wrap no converted class with to_linen
AWAITED_KEY = 'linen2nnx.awaited'  # Linen classes of other files whose fate a class of the file waited on
TODO_PREFIX = '# TODO(linen2nnx): '
_STATEMENTS = (cst.SimpleStatementLine, cst.BaseCompoundStatement, cst.Decorator)


class MigrationRule(VisitorBasedCodemodCommand):
  """Base class of the migration rules: a libcst codemod that also records report entries."""

  CODE: tp.ClassVar[str] = ''
  DESCRIPTION: tp.ClassVar[str] = ''
  REQUIRES: tp.ClassVar[tuple[str, ...]] = ()  # empty: the rule runs on every file
  REQUIRES_PATTERN: tp.ClassVar[re.Pattern[str] | None] = None  # None: REQUIRES alone decides
  AFTER: tp.ClassVar[tuple[str, ...]] = ()  # the codes of the rules it builds on, selected with it
  # True: the rule's rewrites only tidy (the same objects under NNX names), no reason to change a file where the other
  # rules converted nothing and left TODOs (its Linen classes all stay Linen): there they are left out
  TIDYING: tp.ClassVar[bool] = False
  # True: the rule decides which classes convert (L2N002), so that a second run over its output may decide again (a
  # class left Linen that builds a converted one through nnx_bridge.to_linen); the others, idempotent, change no class
  # of a first run's output, and `transform_source` runs only the deciding rules when it checks a second run
  DECIDES_CLASSES: tp.ClassVar[bool] = False
  METADATA_DEPENDENCIES = (PositionProvider, ParentNodeProvider)

  def __init__(self, context: cst.codemod.CodemodContext) -> None:
    super().__init__(context)
    self._todo_comments: dict[cst.CSTNode, list[str]] = {}
    self._outer_class: cst.ClassDef | None = None

  @property
  def current_class(self) -> str | None:
    """The outermost class the rule is visiting (None outside classes): the class to blame for an error."""
    return self._outer_class.name.value if self._outer_class is not None else None

  def on_visit(self, node: cst.CSTNode) -> bool:
    if self._outer_class is None and isinstance(node, cst.ClassDef):
      self._outer_class = node
    return super().on_visit(node)

  @property
  def options(self) -> MigrationOptions:
    """The user's choices for the generated code (`linen2nnx migrate --train-state`, ...)."""
    return self.context.scratch.get(OPTIONS_KEY, MigrationOptions())

  @property
  def hierarchy(self) -> LinenHierarchy:
    """The Linen classes of the whole run, seen from this file (empty when one source is migrated alone)."""
    return self.context.scratch.get(HIERARCHY_KEY, LinenHierarchy())

  @property
  def kept_classes(self) -> tp.Mapping[str, str]:
    """The module-level classes of this file the run decided to keep as Linen, with why (`transform_source`)."""
    return self.context.scratch.get(KEPT_CLASSES_KEY, {})

  @property
  def unbridged_classes(self) -> tp.Collection[str]:
    """The module-level Linen classes of this file that must not build converted classes through
    nnx_bridge.to_linen: with such bridges a second run would change them again (`transform_source`)."""
    return self.context.scratch.get(UNBRIDGED_CLASSES_KEY, frozenset())

  @property
  def imported_classes(self) -> tp.Mapping[str, ConvertedClass]:
    """The classes other files of the run converted, by fully qualified name (every module name of their file):
    their records, for the call sites of this file (`engine._settle`); empty on the first pass."""
    return self.context.scratch.get(IMPORTED_CLASSES_KEY, {})

  def report_awaited(self, names: tp.Iterable[str]) -> None:
    """Records the Linen classes of other files (qualified) that a class of the file stays Linen for until the run
    says whether they convert: the engine then migrates the file again with their fate (`engine._settle`)."""
    self.context.scratch.setdefault(AWAITED_KEY, set()).update(names)

  def report_change(self, node: cst.CSTNode, message: str) -> None:
    """Records that `node` (of the original tree) was rewritten."""
    self._record(node, 'change', message)

  def report_todo(self, node: cst.CSTNode, message: str) -> None:
    """Records that `node` was left unconverted and flags its statement with a TODO comment."""
    self._record(node, 'todo', message)
    statement = self._statement_of(node)
    if statement is not None:
      self._todo_comments.setdefault(statement, []).append(TODO_PREFIX + ' '.join(message.split()))

  def report_class(self, node: cst.ClassDef, nnx_name: str, arguments: tp.Sequence[ConstructorArgument],
                   children: tp.Sequence[ChildName], *, call_arguments: tp.Sequence[str] = (),
                   mode_arguments: tp.Sequence[str] = ()) -> None:
    """Records that the class `node` (of the original tree) was converted, for the JSON report.

    Later rules read the records of the classes converted before them from
    `self.context.scratch[KNOWN_CLASSES_KEY]`.
    """
    line = self.get_metadata(PositionProvider, node).start.line
    record = ConvertedClass(line, node.name.value, nnx_name, tuple(arguments), tuple(children),
                            call_arguments=tuple(call_arguments), mode_arguments=tuple(mode_arguments))
    self.context.scratch.setdefault(CLASSES_KEY, []).append(record)

  def on_leave(self, original_node: cst.CSTNode, updated_node: tp.Any) -> tp.Any:
    updated_node = super().on_leave(original_node, updated_node)
    if original_node is self._outer_class:
      self._outer_class = None
    comments = self._todo_comments.pop(original_node, None)
    if comments and isinstance(updated_node, _STATEMENTS):
      updated_node = _with_comments(updated_node, comments)
    return updated_node

  def nnx_is_free(self, node: cst.CSTNode) -> bool:
    """Whether the name `nnx` at `node` is unbound or bound to `flax.nnx` (needs ScopeProvider)."""
    scope = self.get_metadata(ScopeProvider, node, None)
    if scope is None:
      return False
    names = {qn.name for assignment in scope['nnx'] for qn in assignment.get_qualified_names_for('nnx')}
    return names <= {'flax.nnx'}

  def remove_import_of(self, node: cst.BaseExpression) -> None:
    """Schedules removal of the import `node` goes through; libcst keeps it while still used.

    Needs ScopeProvider in the rule's METADATA_DEPENDENCIES.
    """
    base = node
    while isinstance(base, cst.Attribute):
      base = base.value
    scope = self.get_metadata(ScopeProvider, base, None)
    if not isinstance(base, cst.Name) or scope is None:
      return
    for assignment in scope[base.value]:
      if not isinstance(assignment, ImportAssignment) or isinstance(assignment.node.names, cst.ImportStar):
        continue
      statement = assignment.node
      for alias in statement.names:
        if (alias.evaluated_alias or alias.evaluated_name.split('.')[0]) != base.value:
          continue
        if isinstance(statement, cst.Import):
          self.remove_unused_import(alias.evaluated_name, asname=alias.evaluated_alias)
        elif not statement.relative:
          module = cst.helpers.get_full_name_for_node(statement.module)
          self.remove_unused_import(module, alias.evaluated_name, alias.evaluated_alias)

  def _record(self, node: cst.CSTNode, kind: str, message: str) -> None:
    start = self.get_metadata(PositionProvider, node).start
    entry = Entry(line=start.line, column=start.column + 1, code=self.CODE, kind=kind, message=message)
    self.context.scratch.setdefault(REPORT_KEY, []).append(entry)

  def _statement_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
    """The statement a TODO goes above; for the first decorator, the decorated definition, whose leading lines
    a comment above the decorators parses back into (so that a second run finds it there)."""
    while node is not None and not isinstance(node, _STATEMENTS):
      node = self.get_metadata(ParentNodeProvider, node, None)
    if isinstance(node, cst.Decorator):
      owner = self.get_metadata(ParentNodeProvider, node, None)
      if isinstance(owner, (cst.FunctionDef, cst.ClassDef)) and owner.decorators and owner.decorators[0] is node:
        return owner
    return node


def _with_comments(statement: tp.Any, comments: list[str]) -> tp.Any:
  """`statement` with the TODO comments it does not hold yet (`report.todo_key`: one per class kept for another's
  use, however a run words why)."""
  present = {todo_key(line.comment.value) for line in statement.leading_lines if line.comment is not None}
  new = [
      cst.EmptyLine(indent=True, comment=cst.Comment(text))
      for text in dict.fromkeys(comments) if todo_key(text) not in present
  ]
  return statement.with_changes(leading_lines=(*statement.leading_lines, *new)) if new else statement

