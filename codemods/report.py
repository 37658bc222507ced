"""What `linen2nnx migrate` reports: per-file outcomes, their entries and converted classes, as text and JSON."""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import typing as tp

SCHEMA_VERSION = 1
CHANGED, UNCHANGED, SKIPPED, FAILED = 'changed', 'unchanged', 'skipped', 'failed'
FIELD, INPUT_DIMENSION, UNDETERMINED, RNGS = 'field', 'input_dimension', 'undetermined', 'rngs'
TO_LINEN_BRIDGED = 'wrapped with nnx_bridge.to_linen'  # in the entry of each construction L2N002 bridges so
UNSAFE_FIX = 'unsafe fix: '  # the start of the TODO over each statement `--unsafe-fixes` kept as written
INPUT_SIZE_SOURCES = ('code', 'examples', 'arguments')
"""Where a layer's NNX input size came from: derived from the code, from example traces, or left as a constructor
argument."""
EXAMPLE_INPUTS = 'example_inputs'  # a tuple of example inputs for a Linen child wrapped by nnx_bridge.from_linen
FLAG = 'flag'  # a keyword-only `bool = False` switch of the converted class (a tied layer's)
_KEPT_END = '; a converted class building it wraps it with nnx_bridge.from_linen'
_USER_END = ', and cannot wrap it with nnx_bridge.to_linen: '


BUILT_BY_LINEN = 'which stays Linen, builds it'  # a class kept because a Linen class of another file builds it


def kept_message(name: str, why: str) -> str:
  """The TODO of a class kept as Linen for a use outside its body (`why`)."""
  return f'class {name} kept as Linen: {why}{_KEPT_END}'


def used_message(user: str, why: str) -> str:
  """Why a class is kept: the Linen class `user` uses it and cannot wrap it with to_linen (`why`)."""
  return f'the class {user}, left as Linen, uses it{_USER_END}{why}'


def todo_key(comment: str) -> str:
  """What makes two TODO comments one: their text, but for a class kept as Linen because another class uses it,
  that class (a later run, starting from this one's output, may word why it cannot wrap it otherwise)."""
  head, end, _ = comment.partition(_USER_END)
  return head if end and ' kept as Linen: the class ' in head else comment


@dataclasses.dataclass(frozen=True)
class Entry:
  """One change made, or one construct left unconverted (`kind` 'todo'), at a 1-based line:column."""

  line: int
  column: int
  code: str
  kind: str  # 'change' | 'todo'
  message: str
  cell: int | None = None  # index of the notebook cell, for .ipynb files; lines are cell-relative

  def sort_key(self) -> tuple[int, int, int, str, str, str]:
    return (-1 if self.cell is None else self.cell, self.line, self.column, self.code, self.kind, self.message)


@dataclasses.dataclass(frozen=True)
class ConstructorArgument:
  """One argument of a converted class's NNX `__init__` and where its value comes from."""

  name: str
  origin: str  # FIELD | INPUT_DIMENSION | UNDETERMINED | FLAG | EXAMPLE_INPUTS | RNGS
  detail: str = ''  # the field's declaration, or which size of which child it is and why
  child: str | None = None  # for sizes: the NNX attribute of the child (or variable) that takes it
  child_argument: str | None = None  # for a child's size: the argument of the child's NNX constructor it feeds
  input: str | None = None  # the `__call__` argument whose last axis it is, when the code says so
  # A size the input's whole shape decides: (rank, formula over `input_shape`) of the call argument `example_input`.
  shape_formulas: tuple[tuple[int, str], ...] = ()
  example_input: str | None = None
  per_element: bool = False  # a tuple of sizes, one per element of the list `child` (a loop whose size changes)
  element_offset: int = 0  # per_element: the list's elements written out before the loop's, which it skips


@dataclasses.dataclass(frozen=True)
class ChildName:
  """A submodule's Linen name (`Dense_0`, or its `name=` / setup attribute) and its NNX attribute."""

  linen_name: str
  nnx_attribute: str
  linen_class: str | None = None  # 'flax.linen.Dense' (a layer-table row), 'Block' (a class converted with it); None for a variable


@dataclasses.dataclass(frozen=True)
class ConvertedClass:
  """A Linen class converted to NNX, at a 1-based line: its new constructor and its children."""

  line: int
  linen_name: str
  nnx_name: str
  arguments: tuple[ConstructorArgument, ...]
  children: tuple[ChildName, ...]
  cell: int | None = None  # as in Entry
  call_arguments: tuple[str, ...] = ()  # the Linen `__call__` arguments, in order (less self)
  mode_arguments: tuple[str, ...] = ()  # those of them NNX dropped: train/eval switches
  cache_input: str | None = None  # the `__call__` argument whose shape `init_cache(input_shape, dtype=jnp.float32)` takes; None: no init_cache
  input_sizes: dict[str, int] = dataclasses.field(default_factory=dict)  # INPUT_SIZE_SOURCES -> layer sites
  mode_defaults: dict[str, bool] = dataclasses.field(default_factory=dict)  # of mode_arguments with a literal default
  # what a class of another file needs to build it as a submodule (L2N002's `ClassInterface`); not in the JSON report
  interface: tp.Any = dataclasses.field(default=None, repr=False, compare=False)

  def sort_key(self) -> tuple[int, int, str]:
    return (-1 if self.cell is None else self.cell, self.line, self.linen_name)


Source = tp.TypeVar('Source', str, bytes)


@dataclasses.dataclass(frozen=True)
class Transformed(tp.Generic[Source]):
  """The migrated source (same type as the input), the report entries and the classes converted."""

  source: Source
  entries: tuple[Entry, ...]
  classes: tuple[ConvertedClass, ...] = ()
  awaited: tuple[str, ...] = ()  # Linen classes of other files (qualified) whose fate a class of this one waits on


@dataclasses.dataclass(frozen=True)
class FileOutcome:
  """The result for one file: its status, the unified diff, the report entries and the classes converted."""

  path: str
  status: str  # CHANGED | UNCHANGED | SKIPPED | FAILED
  diff: str = ''
  entries: tuple[Entry, ...] = ()
  error: str = ''
  classes: tuple[ConvertedClass, ...] = ()
  source: bytes | None = dataclasses.field(default=None, repr=False)  # a changed file's new content (not in JSON)
  todos: int = 0  # the TODO(linen2nnx) lines the file holds after the run, old ones included
  awaited: tuple[str, ...] = ()  # as in Transformed (not in JSON)

  def entry_lines(self) -> list[str]:
    """`path:line:col: CODE kind: message` lines, the format compilers and editors link to."""
    where = lambda e: self.path if e.cell is None else f'{self.path}[cell {e.cell}]'
    return [f'{where(e)}:{e.line}:{e.column}: {e.code} {e.kind}: {e.message}' for e in self.entries]


@dataclasses.dataclass(frozen=True)
class MigrationResult:
  """The outcome of one run, files sorted by path so it does not depend on order or `-j`."""

  files: tuple[FileOutcome, ...]
  written: bool = False

  def with_status(self, status: str) -> list[FileOutcome]:
    return [outcome for outcome in self.files if outcome.status == status]

  @property
  def changed(self) -> list[FileOutcome]:
    return self.with_status(CHANGED)

  @property
  def failed(self) -> list[FileOutcome]:
    return self.with_status(FAILED)

  def summary(self) -> dict[str, int]:
    return {status: len(self.with_status(status)) for status in (CHANGED, UNCHANGED, SKIPPED, FAILED)}

  def fates(self) -> dict[str, tp.Any]:
    """What became of the Linen classes: `converted`, `kept_linen` (with `kept_because`: reason -> count),
    `bridged` (Linen children wrapped with nnx_bridge.from_linen, NNX classes a Linen class builds through
    nnx_bridge.to_linen), `todos` (the TODO(linen2nnx) lines the files hold) and `unsafe_fixes` (those of
    them over statements `--unsafe-fixes` kept as written in converted classes)."""
    entries = [e for outcome in self.files for e in outcome.entries]
    reasons = [_kept_reason(m.group(2)) for e in entries if e.kind == 'todo' and (m := _KEPT.match(e.message))]
    return {
        'converted': sum(len(outcome.classes) for outcome in self.files),
        'kept_linen': len(reasons),
        'kept_because': dict(collections.Counter(reasons).most_common()),
        'bridged': sum(1 for e in entries if 'wrapped with nnx_bridge.' in e.message and not _KEPT.match(e.message)),
        'todos': sum(outcome.todos for outcome in self.files),
        'unsafe_fixes': sum(1 for e in entries if e.kind == 'todo' and e.message.startswith(UNSAFE_FIX)),
    }

  def input_sizes(self) -> dict[str, int]:
    """How the converted classes' layers got their NNX input sizes, summed: `code`, `examples`, `arguments`."""
    return {source: sum(record.input_sizes.get(source, 0) for outcome in self.files for record in outcome.classes)
            for source in INPUT_SIZE_SOURCES}

  def to_json_dict(self) -> dict[str, tp.Any]:
    """The `--report-json` document; its schema is in docs/migrate.md."""
    return {
        'version': SCHEMA_VERSION,
        'written': self.written,
        'summary': self.summary(),
        'fates': self.fates(),
        'input_sizes': self.input_sizes(),
        'files': [
            {
                'path': outcome.path,
                'status': outcome.status,
                'error': outcome.error or None,
                'todos': outcome.todos,
                'entries': [dataclasses.asdict(entry) for entry in outcome.entries],
                'classes': [{k: v for k, v in dataclasses.asdict(record).items() if k != 'interface'}
                            for record in outcome.classes],
            }
            for outcome in self.files
        ],
    }

  def to_json(self) -> str:
    return json.dumps(self.to_json_dict(), indent=2) + '\n'


_KEPT = re.compile(r'class (\w+) (?:left|kept) as Linen: (.*)')


def _kept_reason(reason: str) -> str:
  """A kept class's reason, grouped: the classes kept because another class stays Linen count as one reason."""
  if re.search(r'(?:, left as Linen,|, which stays Linen,) (?:uses|builds|subclasses) it', reason):
    return 'used by a class that stays Linen'
  if re.search(r', which is no module, holds it in a class attribute', reason):
    return 'held in a class attribute for code that runs it as a Linen module'
  return reason.split('; ')[0]


def _from_json(cls: type, record: tp.Mapping[str, tp.Any]) -> tp.Any:
  """`cls` from a JSON record; keys a later schema version adds are ignored."""
  return cls(**{f.name: record[f.name] for f in dataclasses.fields(cls) if f.name in record})


def _argument_from_json(data: dict[str, tp.Any]) -> ConstructorArgument:
  argument = _from_json(ConstructorArgument, data)
  return dataclasses.replace(argument, shape_formulas=tuple((int(r), str(f)) for r, f in argument.shape_formulas))


def converted_classes_from_json(document: tp.Any) -> dict[str, tuple[ConvertedClass, ...]]:
  """The `classes` of a `--report-json` document by file path, as `MigrationResult` made them.

  Raises ValueError for another schema version or a document of another shape.
  """
  if not isinstance(document, dict) or document.get('version') != SCHEMA_VERSION:
    raise ValueError(f'not a linen2nnx migrate report of version {SCHEMA_VERSION}')
  try:
    return {
        entry['path']: tuple(
            dataclasses.replace(
                _from_json(ConvertedClass, record),
                arguments=tuple(_argument_from_json(a) for a in record['arguments']),
                children=tuple(_from_json(ChildName, c) for c in record['children']),
                call_arguments=tuple(record.get('call_arguments', ())),
                mode_arguments=tuple(record.get('mode_arguments', ())),
            )
            for record in entry['classes']
        )
        for entry in document['files']
    }
  except (KeyError, TypeError) as error:
    raise ValueError(f'not a linen2nnx migrate report ({type(error).__name__}: {error})') from None
