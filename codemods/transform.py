"""Run rules over one Python source, checking that the result is still valid Python.

The rules run in order, each followed by the import changes it asked for, as libcst's
`VisitorBasedCodemodCommand.transform_module` runs them one after the other (tests check that
the results are the same), without the work that cannot change them:

- Metadata (scopes, qualified names, positions) is computed once per tree, not once per rule
  and per import step: a step that leaves the tree as it was hands the next one the same tree,
  with the metadata computed so far, and the tree straight from the parser is not copied.
- A rule with `REQUIRES` words does not run on code that contains none of them, nor the name of
  a base class of the run's Linen hierarchy (a subclass of one may never say Module).
- libcst looks each visitor class over once, not at each new visitor (`libcst_speedups`).
"""

from __future__ import annotations

import ast
import dataclasses
import typing as tp

import libcst as cst
from libcst import MetadataWrapper
from libcst.codemod import Codemod
from libcst.codemod import CodemodContext
from libcst.codemod import SkipFile
from libcst.codemod.visitors import AddImportsVisitor
from libcst.codemod.visitors import RemoveImportsVisitor

from codemods import libcst_speedups
from codemods.analysis.hierarchy import HIERARCHY_KEY
from codemods.analysis.hierarchy import LinenHierarchy
from codemods.options import OPTIONS_KEY
from codemods.options import MigrationOptions
from codemods.report import ConvertedClass
from codemods.report import Entry
from codemods.rule import CLASSES_KEY
from codemods.rule import KNOWN_CLASSES_KEY
from codemods.rule import REPORT_KEY
from codemods.rule import MigrationRule

libcst_speedups.install()

# What VisitorBasedCodemodCommand.transform_module runs after a rule, in this order, when asked to.
_IMPORT_VISITORS: dict[str, type[Codemod]] = {
    AddImportsVisitor.CONTEXT_KEY: AddImportsVisitor,
    RemoveImportsVisitor.CONTEXT_KEY: RemoveImportsVisitor,
}

Source = tp.TypeVar('Source', str, bytes)


class MigrationError(Exception):
  """A file that could not be migrated; the message says why, and the file is left untouched."""


@dataclasses.dataclass(frozen=True)
class Transformed(tp.Generic[Source]):
  """The migrated source (same type as the input), the report entries and the classes converted."""

  source: Source
  entries: tuple[Entry, ...]
  classes: tuple[ConvertedClass, ...] = ()


def transform_source(source: Source, rules: tp.Sequence[type[MigrationRule]],
                     options: MigrationOptions = MigrationOptions(),
                     hierarchy: LinenHierarchy = LinenHierarchy(),
                     filename: str | None = None) -> Transformed[Source]:
  """Applies `rules` in order; bytes keep their encoding, BOM and line endings (libcst does).

  `hierarchy`: the Linen classes of the run the source is part of, seen from its file
  (`LinenHierarchy.for_file`); empty, only the source's own classes are known. `filename`: the
  source's file, whose classes the options' example traces are looked up by.
  """
  try:
    tree = cst.parse_module(source)
  except (cst.ParserSyntaxError, UnicodeDecodeError, SyntaxError) as error:
    raise MigrationError(f'does not parse, left untouched: {_one_line(error)}') from None
  # A freshly parsed tree holds each node once: no need for the copy MetadataWrapper makes.
  wrapper = MetadataWrapper(tree, unsafe_skip_copy=True)
  code = _Code()
  entries: list[Entry] = []
  classes: list[ConvertedClass] = []
  base_words = hierarchy.base_words()
  for rule in rules:
    if rule.REQUIRES and not any(word in code(wrapper) for word in (*rule.REQUIRES, *base_words)):
      continue
    context = CodemodContext(filename=filename, scratch={KNOWN_CLASSES_KEY: tuple(classes), OPTIONS_KEY: options,
                                                         HIERARCHY_KEY: hierarchy})
    try:
      wrapper = _next(wrapper, _apply(rule(context), wrapper))
      for key, visitor in _IMPORT_VISITORS.items():
        if key in context.scratch:
          wrapper = _next(wrapper, _apply(visitor(context), wrapper))
    except SkipFile:
      continue
    except Exception as error:  # a bug in a rule must not stop the run, nor write a file
      raise MigrationError(f'rule {rule.CODE} failed: {type(error).__name__}: {error}') from error
    entries.extend(context.scratch.get(REPORT_KEY, ()))
    classes.extend(context.scratch.get(CLASSES_KEY, ()))
  tree = wrapper.module
  new = tree.bytes if isinstance(source, bytes) else tree.code
  if new != source:
    try:
      ast.parse(new)
    except (SyntaxError, ValueError) as error:
      raise MigrationError(f'the migrated code does not parse, left untouched: {_one_line(error)}') from None
  entries.sort(key=Entry.sort_key)
  classes.sort(key=ConvertedClass.sort_key)
  return Transformed(new, tuple(entries), tuple(classes))


class _Code:
  """The code of the last tree asked for, generated once per tree."""

  def __init__(self) -> None:
    self._module: cst.Module | None = None
    self._code = ''

  def __call__(self, wrapper: MetadataWrapper) -> str:
    if wrapper.module is not self._module:
      self._module, self._code = wrapper.module, wrapper.module.code
    return self._code


def _next(wrapper: MetadataWrapper, tree: cst.Module) -> MetadataWrapper:
  """`wrapper` when `tree` equals its module (its metadata still holds), else a new one over `tree`."""
  if tree.deep_equals(wrapper.module):
    return wrapper
  return MetadataWrapper(tree)  # a copy: a rule may put a node at two places, which metadata can't tell apart


def _apply(codemod: Codemod, wrapper: MetadataWrapper) -> cst.Module:
  """`codemod` over `wrapper.module`, reusing the metadata `wrapper` already holds.

  What `Codemod.transform_module` does, minus the copy of the tree and the metadata it would
  compute again, and minus the import visitors a `VisitorBasedCodemodCommand` runs after it.
  """
  if codemod.should_allow_multiple_passes():
    return Codemod.transform_module(codemod, wrapper.module)
  with codemod.resolve(wrapper):
    codemod.context = dataclasses.replace(codemod.context, wrapper=wrapper)
    return codemod.transform_module_impl(wrapper.module)


def _one_line(error: Exception) -> str:
  return ' '.join(str(error).split())
