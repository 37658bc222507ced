"""Run rules over one Python source, checking that the result is still valid Python."""

from __future__ import annotations

import ast
import dataclasses
import typing as tp

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod import SkipFile

from codemods.report import ConvertedClass
from codemods.report import Entry
from codemods.rule import CLASSES_KEY
from codemods.rule import REPORT_KEY
from codemods.rule import MigrationRule

Source = tp.TypeVar('Source', str, bytes)


class MigrationError(Exception):
  """A file that could not be migrated; the message says why, and the file is left untouched."""


@dataclasses.dataclass(frozen=True)
class Transformed(tp.Generic[Source]):
  """The migrated source (same type as the input), the report entries and the classes converted."""

  source: Source
  entries: tuple[Entry, ...]
  classes: tuple[ConvertedClass, ...] = ()


def transform_source(source: Source, rules: tp.Sequence[type[MigrationRule]]) -> Transformed[Source]:
  """Applies `rules` in order; bytes keep their encoding, BOM and line endings (libcst does)."""
  try:
    tree = cst.parse_module(source)
  except (cst.ParserSyntaxError, UnicodeDecodeError, SyntaxError) as error:
    raise MigrationError(f'does not parse, left untouched: {_one_line(error)}') from None
  entries: list[Entry] = []
  classes: list[ConvertedClass] = []
  for rule in rules:
    context = CodemodContext()
    try:
      tree = rule(context).transform_module(tree)
    except SkipFile:
      continue
    except Exception as error:  # a bug in a rule must not stop the run, nor write a file
      raise MigrationError(f'rule {rule.CODE} failed: {type(error).__name__}: {error}') from error
    entries.extend(context.scratch.get(REPORT_KEY, ()))
    classes.extend(context.scratch.get(CLASSES_KEY, ()))
  new = tree.bytes if isinstance(source, bytes) else tree.code
  if new != source:
    try:
      ast.parse(new)
    except (SyntaxError, ValueError) as error:
      raise MigrationError(f'the migrated code does not parse, left untouched: {_one_line(error)}') from None
  entries.sort(key=Entry.sort_key)
  classes.sort(key=ConvertedClass.sort_key)
  return Transformed(new, tuple(entries), tuple(classes))


def _one_line(error: Exception) -> str:
  return ' '.join(str(error).split())
