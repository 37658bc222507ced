"""The Linen classes of a whole run, across files: the first pass of `linen2nnx migrate`.

A class is a Linen module when one of its bases is `flax.linen.Module` or a Linen class of the
run, maybe of another file (`class Encoder(BaseModel)` with `from models.base import BaseModel`).
Rules see one file at a time, so the engine parses the run's .py files once beforehand (their
module-level classes and imports only), and hands every rule the result in
`context.scratch[HIERARCHY_KEY]` (`MigrationRule.hierarchy`).

Classes are named like `QualifiedNameProvider` names what a file imports: the file's module
name (`models.base`) plus the class name. A file's module name is computed from its package
root (the top directory of the `__init__.py` chain above it), from each directory of the run
and from the current directory, so that `from models.base import X` resolves whichever of them
the code is run from; relative imports are resolved from the package root's name.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing as tp

import libcst as cst
from libcst.helpers import ModuleNameAndPackage
from libcst.helpers import calculate_module_and_package
from libcst.helpers import get_absolute_module_from_package
from libcst.helpers import get_absolute_module_from_package_for_import
from libcst.helpers import get_full_name_for_node

from codemods.files import mentions_flax
from codemods.nodes import descendants
from codemods.vocabulary import MODULE_NAMES
from codemods.vocabulary import STATE_APIS

HIERARCHY_KEY = 'linen2nnx.hierarchy'  # where rules find it in the codemod context's scratch
_STATE_METHODS = frozenset({'setup', '__call__'})
_WORD = re.compile(rb'[A-Za-z_][A-Za-z0-9_]*')


@dataclasses.dataclass(frozen=True)
class LinenHierarchy:
  """The Linen classes of a run (fully qualified, each under every module name of its file).

  `bases`: those some class of the run subclasses; `plain_bases`: those of `bases` that only add
  helper methods (no annotated field, setup, @nn.compact method, `__call__`, Linen layer built
  nor `self.param`-like scope API, and so for their own project bases), which a subclass can
  keep as its base when both become NNX modules.
  `files`: the files defining them. `plain_modules`: the module names of the run's files that mention neither
  flax nor a Linen class of the run, whose functions build no Linen module (jax-md's `so3.py` of precomputed
  tables). `module` and `package`: the file being migrated, set by `for_file`; they resolve the names its rules
  see (`Base`, `.base.Base`). `settled`: the classes of other files that the run keeps Linen there, as far as the
  engine told the file being migrated (`engine._settle`): a converted class of that file wraps them with
  nnx_bridge.from_linen rather than waiting for their NNX records.
  """

  classes: frozenset[str] = frozenset()
  bases: frozenset[str] = frozenset()
  plain_bases: frozenset[str] = frozenset()
  files: frozenset[str] = frozenset()
  plain_modules: frozenset[str] = frozenset()
  module: str = ''
  package: str = ''
  settled: frozenset[str] = frozenset()

  def for_file(self, path: str) -> LinenHierarchy:
    """The hierarchy as seen from the file `path`: its own classes and relative imports resolve."""
    if not self.classes or not path.endswith('.py'):
      return self
    name = _package_module(path)
    return dataclasses.replace(self, module=name.name, package=name.package)

  def resolve(self, qualified: str) -> str | None:
    """The class of the hierarchy that a qualified name of the file (`models.base.BaseModel`,
    `.base.BaseModel`, or `BaseModel` for a class of the file itself) denotes, else None."""
    qualified = self._absolute(qualified)
    return qualified if qualified in self.classes else None

  def stays_linen(self, qualified: str) -> str | None:
    """The class of another file that a qualified name of the file denotes, when the run keeps it Linen there
    (`settled`), else None."""
    resolved = self.resolve(qualified)
    return resolved if resolved in self.settled else None

  def in_plain_module(self, qualified: str) -> bool:
    """Whether a qualified name of the file (`..common.so3.create_coefficient_mapping`) is defined in one of the
    `plain_modules`."""
    return self._absolute(qualified).rpartition('.')[0] in self.plain_modules

  def _absolute(self, qualified: str) -> str:
    stripped = qualified.lstrip('.')
    if stripped != qualified:
      absolute = get_absolute_module_from_package(self.package or None, stripped, len(qualified) - len(stripped))
      return absolute or qualified  # above the top package: unresolved
    if '.' not in qualified and self.module:
      return f'{self.module}.{qualified}'
    return qualified

  def named_in(self, data: bytes) -> bool:
    """Whether the code names a Linen class of the run (the last part of its name, as a word): it may subclass,
    build or call one."""
    return bool({name.rpartition('.')[2].encode() for name in self.classes} & set(_WORD.findall(data)))

  def base_words(self) -> tuple[str, ...]:
    """The last part of each base's name: in every file that subclasses one, however it is imported."""
    return tuple(sorted({name.rpartition('.')[2] for name in self.bases}))


@dataclasses.dataclass
class _Class:
  names: tuple[str, ...]  # fully qualified, one per module name of its file
  bases: tuple[str, ...]  # fully qualified as far as the file's imports tell
  path: str
  own_plain: bool  # its own body adds no Linen state (`_own_plain`)
  linen: bool = False  # found to derive from flax.linen.Module


def build_hierarchy(sources: tp.Mapping[str, bytes], roots: tp.Sequence[str] = ()) -> LinenHierarchy:
  """The Linen classes defined in `sources` (.py path -> content: the run's Python files), whatever their order.

  Files that mention flax are parsed, then the files that mention the name of a class found so far,
  until no new class appears; a file that does not parse is left out (the engine reports it).
  `roots`: directories the files' module names are also computed from.
  """
  classes: list[_Class] = []
  parsed: set[str] = set()
  linen: dict[str, list[_Class]] = {}  # name -> the Linen classes of that name (same-named modules may clash)
  words: set[bytes] = set()
  defining = {path: data for path, data in sources.items() if b'class' in data}  # only these are parsed
  pending = sorted(path for path, data in defining.items() if mentions_flax(data))
  while pending:
    for path in pending:
      parsed.add(path)
      classes += _classes_of(path, defining[path], roots)
    changed = True
    while changed:  # to a fixpoint: the result does not depend on the order of the files
      changed = False
      for found in classes:
        if not found.linen and any(b in MODULE_NAMES or b in linen for b in found.bases):
          found.linen = changed = True
          for name in found.names:
            linen.setdefault(name, []).append(found)
    new_words = {name.rpartition('.')[2].encode() for name in linen} - words
    words |= new_words
    pending = sorted(path for path, data in defining.items()
                     if path not in parsed and any(word in data for word in new_words))
  bases = {base for found in classes if found.linen for base in found.bases if base in linen}
  bases |= {name for base in bases for found in linen[base] for name in found.names}
  plain = {name for name in bases if all(_plain(found, linen, set()) for found in linen[name])}
  plain_modules = {name for path, data in sources.items() if not mentions_flax(data)
                   and not any(word in data for word in words) for name in module_names(path, roots)}
  return LinenHierarchy(frozenset(linen), frozenset(bases), frozenset(plain),
                        frozenset(found.path for found in classes if found.linen), frozenset(plain_modules))


def _plain(found: _Class, linen: dict[str, list[_Class]], seen: set[int]) -> bool:
  """Only helpers, in the class and in its project bases; `seen` stops at a cycle of imports."""
  seen.add(id(found))
  return found.own_plain and all(_plain(base, linen, seen) for name in found.bases
                                 for base in linen.get(name, ()) if id(base) not in seen)


def _classes_of(path: str, data: bytes, roots: tp.Sequence[str]) -> list[_Class]:
  """The module-level classes of the file, their bases resolved through its imports; none if it does not parse."""
  try:
    module = cst.parse_module(data)
  except (cst.ParserSyntaxError, UnicodeDecodeError, SyntaxError, ValueError):
    return []
  package_name = _package_module(path)
  names = module_names(path, roots)
  aliases: dict[str, str] = {}
  defined = {s.name.value for s in module.body if isinstance(s, cst.ClassDef)}
  found = []
  for statement in _top_level(module.body, classes=True):
    if isinstance(statement, (cst.Import, cst.ImportFrom)):
      aliases.update(_bindings(statement, package_name.package))
    elif isinstance(statement, cst.ClassDef):
      bases = []
      for arg in statement.bases:
        dotted = get_full_name_for_node(arg.value) if arg.keyword is None else None
        if dotted is None:
          continue
        head, dot, rest = dotted.partition('.')
        if head in aliases:
          bases.append(aliases[head] + dot + rest)
        elif head in defined:
          bases += [f'{name}.{dotted}' for name in names]
        else:
          bases.append(dotted)
      found.append(_Class(tuple(f'{name}.{statement.name.value}' for name in names), tuple(bases), path,
                          _own_plain(statement, aliases)))
  return found


def _top_level(body: tp.Sequence[cst.CSTNode], classes: bool) -> tp.Iterator[cst.CSTNode]:
  """The module's classes (those the rules convert) and imports, also the imports under a module-level if/try."""
  for statement in body:
    if isinstance(statement, cst.SimpleStatementLine):
      yield from statement.body
    elif isinstance(statement, cst.ClassDef) and classes:
      yield statement
    elif isinstance(statement, (cst.If, cst.Try)):
      blocks = [statement.body]
      if isinstance(statement, cst.Try):
        blocks += [h.body for h in statement.handlers] + [b.body for b in (statement.orelse, statement.finalbody) if b]
      elif isinstance(statement.orelse, cst.Else):
        blocks.append(statement.orelse.body)
      elif isinstance(statement.orelse, cst.If):  # elif
        yield from _top_level([statement.orelse], classes=False)
      for block in blocks:
        yield from _top_level(block.body if isinstance(block, cst.IndentedBlock) else [block], classes=False)


def _bindings(statement: cst.Import | cst.ImportFrom, package: str) -> dict[str, str]:
  """The names an import binds -> what they denote (`nn` -> `flax.linen`)."""
  if isinstance(statement, cst.Import):
    return {
        (alias.evaluated_alias or alias.evaluated_name.partition('.')[0]):
            (alias.evaluated_name if alias.evaluated_alias else alias.evaluated_name.partition('.')[0])
        for alias in statement.names
    }
  if isinstance(statement.names, cst.ImportStar):
    return {}
  module = get_absolute_module_from_package_for_import(package or None, statement)
  if module is None:
    return {}
  return {alias.evaluated_alias or alias.evaluated_name: f'{module}.{alias.evaluated_name}'
          for alias in statement.names}


def _own_plain(node: cst.ClassDef, aliases: dict[str, str]) -> bool:
  """Whether the class body adds no Linen state: no annotated field, setup, __call__, @compact method, Linen
  layer construction (`nn.Dense(...)`) nor `self.param`-like scope API."""
  for statement in node.body.body:
    if isinstance(statement, cst.SimpleStatementLine) and any(isinstance(s, cst.AnnAssign) for s in statement.body):
      return False
    if isinstance(statement, cst.FunctionDef) and (statement.name.value in _STATE_METHODS or any(
        (get_full_name_for_node(d.decorator) or '').rpartition('.')[2] == 'compact' for d in statement.decorators)):
      return False
  for sub in descendants(node.body):
    if isinstance(sub, cst.Attribute) and isinstance(sub.value, cst.Name) and sub.value.value == 'self' \
        and sub.attr.value in STATE_APIS:
      return False
    if isinstance(sub, cst.Call) and (name := get_full_name_for_node(sub.func)) is not None:
      head, dot, rest = name.partition('.')
      module, _, last = (aliases.get(head, head) + dot + rest).rpartition('.')
      if module.startswith('flax.linen') and last[:1].isupper():
        return False
  return True


def module_names(path: str, roots: tp.Sequence[str] = ()) -> list[str]:
  """The module names `path` is imported by: from the top of its `__init__.py` chain first, then from each root."""
  names = [_package_module(path).name]
  for root in roots:
    if _is_under(path, root):
      name = calculate_module_and_package(os.path.abspath(root), os.path.abspath(path)).name
      if name not in names:
        names.append(name)
  return names


def package_of(path: str) -> str:
  """The package `path` is part of, as relative imports in it resolve."""
  return _package_module(path).package


def absolute_import(package: str, module: str | None, level: int) -> str | None:
  """The module `from <level dots><module> import ...` in `package` names; None when it cannot be told."""
  return get_absolute_module_from_package(package or None, module, level)


def _package_module(path: str) -> ModuleNameAndPackage:
  """The module name and package of `path` as imported from the top of its `__init__.py` chain."""
  directory = os.path.dirname(os.path.abspath(path))
  while os.path.exists(os.path.join(directory, '__init__.py')) and os.path.dirname(directory) != directory:
    directory = os.path.dirname(directory)
  return calculate_module_and_package(directory, os.path.abspath(path))


def _is_under(path: str, root: str) -> bool:
  """Whether `path` lies in the directory `root`."""
  path, root = os.path.abspath(path), os.path.abspath(root)
  return os.path.commonpath([path, root]) == root and os.path.isdir(root)
