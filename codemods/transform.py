"""Run rules over one Python source, checking that the result is still valid Python.

The rules run in order, each followed by the import changes it asked for, as libcst's
`VisitorBasedCodemodCommand.transform_module` runs them one after the other (tests check that
the results are the same), without the work that cannot change them:

- Metadata (scopes, qualified names, positions) is computed once per tree, not once per rule
  and per import step: a step that leaves the tree as it was hands the next one the same tree,
  with the metadata computed so far, and the tree straight from the parser is not copied.
- A rule with `REQUIRES` words does not run on code that holds none of them as a whole word, nor the name of
  a base class of the run's Linen hierarchy (a subclass of one may never say Module); one with a
  `REQUIRES_PATTERN` not on code the pattern does not find.
- An import a rule asks to remove goes to libcst's `RemoveImportsVisitor` (a scope analysis) only when
  the code no longer reads its name anywhere; it and `AddImportsVisitor` run on the import statements their
  result depends on, not over the whole tree (`import_steps`).
- The check that a second run leaves a bridged result as it is runs only the rules that decide classes.
- libcst looks each visitor class over once, not at each new visitor, and finds parents without a
  second visit (`libcst_speedups`).
"""

from __future__ import annotations

import ast
import codecs
import contextlib
import dataclasses
import functools
import gc
import io
import re
import tokenize
import typing as tp

import libcst as cst
from libcst import MetadataWrapper
from libcst.metadata import PositionProvider
from libcst.codemod import Codemod
from libcst.codemod import CodemodContext
from libcst.codemod import SkipFile
from libcst.codemod.visitors import AddImportsVisitor
from libcst.codemod.visitors import RemoveImportsVisitor

from codemods import import_steps
from codemods import libcst_speedups
from codemods.analysis.hierarchy import HIERARCHY_KEY
from codemods.analysis.hierarchy import LinenHierarchy
from codemods.nodes import children_cached
from codemods.options import OPTIONS_KEY
from codemods.options import MigrationOptions
from codemods.positions import PositionMap
from codemods.report import ConvertedClass
from codemods.report import Entry
from codemods.report import TO_LINEN_BRIDGED
from codemods.report import Source
from codemods.report import Transformed
from codemods.rule import AWAITED_KEY
from codemods.rule import CLASSES_KEY
from codemods.rule import IMPORTED_CLASSES_KEY
from codemods.rule import KEPT_CLASSES_KEY
from codemods.rule import KNOWN_CLASSES_KEY
from codemods.rule import REPORT_KEY
from codemods.rule import UNBRIDGED_CLASSES_KEY
from codemods.rule import MigrationRule
from codemods.unsafe_fixes import with_unsafe_fixes

libcst_speedups.install()

_COLLECT_AFTER = 100_000  # container objects allocated, less those freed, since the last collection


class MigrationError(Exception):
  """A file that could not be migrated; the message says why, and the file is left untouched."""


def transform_source(source: Source, rules: tp.Sequence[type[MigrationRule]],
                     options: MigrationOptions = MigrationOptions(),
                     hierarchy: LinenHierarchy = LinenHierarchy(),
                     filename: str | None = None,
                     kept_classes: tp.Mapping[str, str] = {},
                     imported_classes: tp.Mapping[str, ConvertedClass] = {}) -> Transformed[Source]:
  """Applies `rules` in order; bytes keep their encoding, BOM and line endings (libcst does).

  `hierarchy`: the Linen classes of the run the source is part of, seen from its file
  (`LinenHierarchy.for_file`); empty, only the source's own classes are known. `filename`: the
  source's file, whose classes the options' example traces are looked up by. `kept_classes`:
  module-level classes of the source to keep as Linen, with why. `imported_classes`: the records of
  classes other files of the run converted, by qualified name, for the source's call sites.

  A rule that fails inside a class, or whose code for a class does not parse, costs that class,
  not the file: the class is kept as Linen (with a TODO saying so) and the rules run again.

  Rules that only tidy (`MigrationRule.TIDYING`: L2N001's initializers) are left out of a source whose Linen
  classes all stay Linen (the other rules converted nothing and left TODOs), which then changes only by its TODOs.

  A result where a Linen class now builds a converted one through `nnx_bridge.to_linen` is migrated
  once more, as a second run would: the Linen classes that run would change again (a TODO of theirs
  depended on what the bridge replaced) build their classes as before, and the rules run again; when
  that does not settle them, no class of the file bridges. A second run leaves the same classes
  unbridged on its way (it starts as this run did), so the check after a round starts from those
  found so far. So a run on its own output changes nothing.

  With `options.unsafe_fixes`, a class refused at a statement of a method converts anyway, that statement kept as
  written under a TODO (`unsafe_fixes.py`).
  """
  if isinstance(source, bytes):
    check_encoding(source)
  run = functools.partial(_transform_source, rules=rules, options=options, hierarchy=hierarchy, filename=filename,
                          kept_classes=kept_classes, imported_classes=imported_classes)
  if not options.unsafe_fixes:
    return run(source)
  if isinstance(source, str):
    return with_unsafe_fixes(source, run)
  encoding = _text_encoding(source)
  result = with_unsafe_fixes(source.decode(encoding), lambda text: _decoded(run(text.encode(encoding)), encoding))
  return dataclasses.replace(result, source=result.source.encode(encoding))


def _transform_source(source: Source, *, rules: tp.Sequence[type[MigrationRule]], options: MigrationOptions,
                      hierarchy: LinenHierarchy, filename: str | None, kept_classes: tp.Mapping[str, str],
                      imported_classes: tp.Mapping[str, ConvertedClass]) -> Transformed[Source]:
  """`transform_source` without unsafe fixes."""
  try:
    tree = cst.parse_module(source)
  except (cst.ParserSyntaxError, UnicodeDecodeError, SyntaxError) as error:
    raise MigrationError(f'does not parse, left untouched: {_one_line(error)}') from None
  with children_cached():
    result = _transform_settled(source, tree, rules, options, hierarchy, filename, kept_classes, imported_classes)
    tidying = {rule.CODE for rule in rules if rule.TIDYING}
    if tidying and _only_tidied(result, tidying):  # its Linen classes all stay Linen: the TODO lines only
      rules = [rule for rule in rules if not rule.TIDYING]
      result = _transform_settled(source, tree, rules, options, hierarchy, filename, kept_classes, imported_classes)
  return result


def _text_encoding(source: bytes) -> str:
  """The encoding Python reads `source` in (checked by `check_encoding`), a UTF-8 BOM kept in the text."""
  encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
  return 'utf-8' if encoding == 'utf-8-sig' else encoding


def _decoded(result: Transformed[bytes], encoding: str) -> Transformed[str]:
  return dataclasses.replace(result, source=result.source.decode(encoding))


def _only_tidied(result: Transformed[Source], tidying: tp.Collection[str]) -> bool:
  """Whether the tidying rules changed the code while the others converted nothing and left TODOs."""
  ours = [e for e in result.entries if e.code not in tidying]
  return not result.classes and any(e.code in tidying and e.kind == 'change' for e in result.entries) \
      and any(e.kind == 'todo' for e in ours) and not any(e.kind == 'change' for e in ours)


def _transform_settled(source: Source, tree: cst.Module, rules: tp.Sequence[type[MigrationRule]],
                       options: MigrationOptions, hierarchy: LinenHierarchy, filename: str | None,
                       kept_classes: tp.Mapping[str, str],
                       imported_classes: tp.Mapping[str, ConvertedClass]) -> Transformed[Source]:
  """The rules over `tree`, again with a class kept Linen when a rule fails inside it, and with the to_linen bridges
  settled as a second run would find them (`transform_source`)."""
  kept = dict(kept_classes)
  unbridged: frozenset[str] = frozenset()
  with _collections_between_rules():
    while True:
      try:
        result = _transform(source, tree, rules, options, hierarchy, filename, kept, imported_classes, unbridged)
      except _ClassFailed as failed:
        if failed.name in kept:
          raise MigrationError(failed.message) from None
        kept[failed.name] = f'{failed.message}; please report this'
        continue
      if not any(TO_LINEN_BRIDGED in e.message for e in result.entries):
        return result
      first = cst.parse_module(result.source)
      deciding = [rule for rule in rules if rule.DECIDES_CLASSES]  # the others change no class of their own output
      try:
        again = _transform(result.source, first, deciding, options, hierarchy, filename, kept, imported_classes,
                           unbridged)  # a second run finds the same users to leave unbridged on its way here
      except (_ClassFailed, MigrationError):  # a converter bug the second run would report: not the bridges' doing
        return result
      changed = _changed_classes(first, cst.parse_module(again.source))
      if not changed:
        return result
      # Leaving the changed classes' bridges out did not settle them: no class of the file bridges, so that a
      # second run plans the same classes as this one.
      unbridged |= changed if not changed <= unbridged else _changed_classes(first, cst.Module([]))


def check_encoding(source: bytes) -> None:
  """Raises MigrationError, naming the line and how to fix it, when `source` is not text in its encoding.

  The encoding is what Python reads the file in (PEP 263): a coding comment on line 1 or 2, else UTF-8 (a
  byte-order mark says UTF-8 too). A Latin-1 file without a coding comment is the usual case; libcst's own
  error would be a codec message with an offset into the file, which says neither the line nor the fix.
  """
  try:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
  except SyntaxError as error:
    if str(error).startswith('unknown encoding'):
      name = str(error).rpartition(': ')[2]
      raise MigrationError(f'its coding comment names an unknown encoding ({name}); name one Python knows, '
                           'such as utf-8 or latin-1') from None
    if str(error).startswith('encoding problem'):
      raise MigrationError('it starts with a UTF-8 byte-order mark but its coding comment names another '
                           'encoding; remove the mark or the comment') from None
    encoding = 'utf-8'  # line 1 or 2 is not UTF-8, so no coding comment could be read
  try:
    source.decode(encoding)
  except UnicodeDecodeError as error:
    before = source[:error.start]
    line = len(before.splitlines()) + (not before or before.endswith((b'\n', b'\r')))
    byte = f'byte 0x{source[error.start]:02x}'
    if codecs.lookup(encoding).name == 'utf-8':
      raise MigrationError(f'line {line} is not UTF-8 ({byte}); save the file as UTF-8, or declare its encoding '
                           'with a first-line comment such as # -*- coding: latin-1 -*-') from None
    raise MigrationError(f'line {line} is not {encoding} ({byte}), the encoding its coding comment declares; save '
                         'the file in that encoding, or declare the one it is in') from None


@contextlib.contextmanager
def _collections_between_rules() -> tp.Iterator[None]:
  """The cyclic garbage collector run between rules (`_collect_if_due`) rather than whenever allocations
  trigger it.

  Each rule builds a new tree and its metadata, enough long-lived objects to set off full collections
  again and again, each scanning every object alive: their number grows with the file and so does each
  one's cost (2.9x the time for a 2x larger file, `benchmarks/big_files.py`). Collecting between rules
  costs a fixed number of full collections per file, for some 20% more peak memory. The objects alive before the
  file (the imported libraries, flax and jax among them: some 140,000) are frozen out of those collections
  (`gc.freeze`), so that each scans only what the file's migration made.
  """
  enabled = gc.isenabled()
  gc.disable()
  gc.freeze()
  try:
    yield
  finally:
    gc.unfreeze()
    if enabled:
      gc.enable()


def _collect_if_due() -> None:
  """A collection after a rule, when more than `_COLLECT_AFTER` new objects wait: small files skip it."""
  if gc.get_count()[0] > _COLLECT_AFTER:
    gc.collect()


@dataclasses.dataclass
class _ClassFailed(Exception):
  """A rule failed on the module-level class `name`, or its code for it does not parse: `message` says how."""

  name: str
  message: str


def _changed_classes(first: cst.Module, second: cst.Module) -> frozenset[str]:
  """The module-level classes whose code differs between two versions of a module."""
  codes = [{s.name.value: cst.Module([s]).code for s in module.body if isinstance(s, cst.ClassDef)}
           for module in (first, second)]
  return frozenset(name for name in codes[0] if codes[0][name] != codes[1].get(name))


def _transform(source: Source, tree: cst.Module, rules: tp.Sequence[type[MigrationRule]], options: MigrationOptions,
               hierarchy: LinenHierarchy, filename: str | None, kept: tp.Mapping[str, str],
               imported: tp.Mapping[str, ConvertedClass], unbridged: frozenset[str]) -> Transformed[Source]:
  # A freshly parsed tree holds each node once: no need for the copy MetadataWrapper makes.
  wrapper = MetadataWrapper(tree, unsafe_skip_copy=True)
  code = _Code()
  original = code(wrapper)
  entries: list[Entry] = []
  classes: list[ConvertedClass] = []
  awaited: set[str] = set()
  base_words = hierarchy.base_words()
  for rule in rules:
    if rule.REQUIRES and not _names_any(code(wrapper), (*rule.REQUIRES, *base_words)) \
        or rule.REQUIRES_PATTERN is not None and not rule.REQUIRES_PATTERN.search(code(wrapper)):
      continue
    context = CodemodContext(filename=filename, scratch={KNOWN_CLASSES_KEY: tuple(classes), OPTIONS_KEY: options,
                                                         HIERARCHY_KEY: hierarchy, KEPT_CLASSES_KEY: kept,
                                                         IMPORTED_CLASSES_KEY: imported,
                                                         UNBRIDGED_CLASSES_KEY: unbridged})
    codemod = rule(context)
    before, rule_input = wrapper, code(wrapper)
    try:
      wrapper = _next(wrapper, _apply(codemod, wrapper))
      if context.scratch.get(AddImportsVisitor.CONTEXT_KEY):
        wrapper = import_steps.added(context, wrapper)
      if context.scratch.get(RemoveImportsVisitor.CONTEXT_KEY):
        wrapper = import_steps.removed(context, wrapper, code(wrapper)) \
            or _next(wrapper, _apply(RemoveImportsVisitor(context), wrapper))
    except SkipFile:
      continue
    except Exception as error:  # a bug in a rule must not stop the run, nor write a file
      message = f'rule {rule.CODE} failed: {type(error).__name__}: {_one_line(error)}'
      if codemod.current_class is not None:
        raise _ClassFailed(codemod.current_class, message) from error
      raise MigrationError(message) from error
    if wrapper is not before:
      _check_parses(rule, wrapper, code(wrapper))
    rule_entries, rule_classes = context.scratch.get(REPORT_KEY, ()), context.scratch.get(CLASSES_KEY, ())
    if rule_input != original:  # earlier rules moved code: the entries point at the user's source
      positions = PositionMap(original, rule_input)
      rule_entries = [dataclasses.replace(e, **dict(zip(('line', 'column'), positions.original(e.line, e.column))))
                      for e in rule_entries]
      rule_classes = [dataclasses.replace(c, line=positions.original(c.line, 1)[0]) for c in rule_classes]
    entries.extend(rule_entries)
    classes.extend(rule_classes)
    awaited |= context.scratch.get(AWAITED_KEY, set())
    _collect_if_due()
  tree = wrapper.module
  new = tree.bytes if isinstance(source, bytes) else tree.code
  entries.sort(key=Entry.sort_key)
  classes.sort(key=ConvertedClass.sort_key)
  return Transformed(new, tuple(entries), tuple(classes), tuple(sorted(awaited)))


def _names_any(code: str, words: tp.Sequence[str]) -> bool:
  """Whether `code` holds one of `words` as a whole word (`init` in `model.init(x)`, not in `__init__`)."""
  return re.search(rf'\b(?:{"|".join(map(re.escape, words))})\b', code) is not None


def _check_parses(rule: type[MigrationRule], wrapper: MetadataWrapper, new: str) -> None:
  """Raises _ClassFailed naming the module-level class that holds the first line of `rule`'s output `new` that
  does not parse, MigrationError when no class holds it."""
  try:
    ast.parse(new)
  except (SyntaxError, ValueError) as error:
    line = getattr(error, 'lineno', None)
    if line is not None:
      positions = wrapper.resolve(PositionProvider)
      for statement in wrapper.module.body:
        span = positions[statement]
        if isinstance(statement, cst.ClassDef) and span.start.line <= line <= span.end.line:
          raise _ClassFailed(statement.name.value,
                             f'the code {rule.CODE} wrote for it does not parse ({_one_line(error)})') from None
    raise MigrationError(f'the migrated code does not parse, left untouched: {rule.CODE}: {_one_line(error)}') from None


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
