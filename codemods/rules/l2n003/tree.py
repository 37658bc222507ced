"""Questions about the original syntax tree of one file: parents, statements, scopes, positions, code."""

from __future__ import annotations

import typing as tp

import libcst as cst
from libcst.metadata import Assignment
from libcst.metadata import ParentNodeProvider
from libcst.metadata import PositionProvider
from libcst.metadata import QualifiedName
from libcst.metadata import QualifiedNameProvider
from libcst.metadata import Scope
from libcst.metadata import ScopeProvider

from codemods.rules.l2n003.syntax import resolves_to

N = tp.TypeVar('N', bound=cst.CSTNode)
MetadataLookup = tp.Callable[..., tp.Any]
"""A rule's `get_metadata(provider, node[, default])`."""


class Tree:
  """The file being migrated (`module`) and the metadata libcst computed for its original nodes."""

  def __init__(self, module: cst.Module, get_metadata: MetadataLookup) -> None:
    self.module = module
    self._get_metadata = get_metadata

  def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
    """The parent of `node` in the original tree (None for the module)."""
    return self._get_metadata(ParentNodeProvider, node, None)

  def statement(self, node: cst.CSTNode) -> cst.BaseStatement:
    """The simple or compound statement that holds `node`."""
    while not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
      node = self.parent(node)
    return node

  def block(self, statement: cst.BaseStatement) -> tuple[cst.BaseStatement, ...]:
    """The statements of the block (a function body, the module) `statement` is in."""
    return tuple(getattr(self.parent(statement), 'body', ()))

  def enclosing_function(self, node: cst.CSTNode) -> cst.CSTNode | None:
    """The innermost function or lambda around `node`, or None."""
    node = self.parent(node)
    while node is not None and not isinstance(node, (cst.FunctionDef, cst.Lambda)):
      node = self.parent(node)
    return node

  def encloses(self, outer: cst.CSTNode, node: cst.CSTNode) -> bool:
    """Whether `node` is `outer` or inside it."""
    while node is not None:
      if node is outer:
        return True
      node = self.parent(node)
    return False

  def depth(self, node: cst.CSTNode) -> int:
    """How many nodes lie from `node` up to the module, both included."""
    depth = 0
    while node is not None:
      node, depth = self.parent(node), depth + 1
    return depth

  def position(self, node: cst.CSTNode) -> tuple[int, int]:
    """The (line, column) where `node` starts, for sorting and messages."""
    start = self._get_metadata(PositionProvider, node).start
    return start.line, start.column

  def code(self, node: cst.CSTNode) -> str:
    """The code of `node`, without surrounding whitespace."""
    return self.module.code_for_node(node).strip()

  def source(self, node: cst.CSTNode) -> str:
    """The code of `node` as written, with its surrounding whitespace."""
    return self.module.code_for_node(node)

  def scope(self, node: cst.CSTNode) -> Scope:
    """The libcst scope of `node`."""
    return self._get_metadata(ScopeProvider, node)

  def scope_or_none(self, node: cst.CSTNode) -> Scope | None:
    """The libcst scope of `node`, or None where libcst gives none."""
    return self._get_metadata(ScopeProvider, node, None)

  def qualified_names(self, node: cst.CSTNode, default: set[QualifiedName]) -> tp.Collection[QualifiedName]:
    """The qualified names `node` can refer to (`default` where libcst has none)."""
    return self._get_metadata(QualifiedNameProvider, node, default)

  def assignments(self, scope: Scope | None, name: str) -> list[Assignment]:
    """The assignments of `name` in `scope` (none without a scope)."""
    return [a for a in scope.assignments[name]] if scope is not None else []

  def function_uses(self, function: cst.FunctionDef) -> tuple[int, list[cst.CSTNode]]:
    """How often the function's name is bound in its scope, and the reads of it that refer to the function (not
    to a shadowing binding in an inner scope)."""
    name, scope = function.name.value, self.scope(function)
    assignments = self.assignments(scope, name)
    return len(assignments), [a.node for assignment in assignments for a in assignment.references
                              if resolves_to(a.scope, name, scope)]

  def function_def(self, name: cst.Name) -> cst.FunctionDef | None:
    """The function `name` is bound to, when it is bound once, to a `def`."""
    return self._bound_once(name, cst.FunctionDef)

  def class_def(self, name: cst.Name) -> cst.ClassDef | None:
    """The class `name` is bound to, when it is bound once, to a `class` statement."""
    return self._bound_once(name, cst.ClassDef)

  def _bound_once(self, name: cst.Name, kind: type[N]) -> N | None:
    scope = self.scope_or_none(name)
    assignments = list(scope[name.value]) if scope is not None else []
    return assignments[0].node if len(assignments) == 1 and isinstance(assignments[0].node, kind) else None

  def binding_scope(self, node: cst.Name) -> Scope | None:
    """The scope, from `node` outwards, that binds the name `node` reads."""
    scope = self.scope_or_none(node)
    while scope is not None and not scope.assignments[node.value] and scope.parent is not scope:
      scope = scope.parent
    return scope

  def bound_inside(self, node: cst.Name, outer: Scope | None) -> bool:
    """Whether the name `node` reads is bound in `outer` or a scope inside it."""
    scope = self.binding_scope(node)
    while scope is not None and scope is not outer and scope.parent is not scope:
      scope = scope.parent
    return scope is outer

  @staticmethod
  def name_of(function: cst.CSTNode) -> str:
    """A function's name for messages ('a lambda' for a lambda)."""
    return function.name.value if isinstance(function, cst.FunctionDef) else 'a lambda'
