"""`migrate()`: run the rules over files and directories, in parallel, and report per file.

First the .py files are looked over together for the run's Linen class hierarchy
(`analysis/hierarchy.py`), so that a subclass of a project base class of another file is known to be a
Linen module. Then each file is skipped unless it mentions flax or linen or defines such a
subclass, migrated in memory (`transform.py`, or `notebooks.py` for .ipynb), checked to still
parse and diffed. Then the run is decided across files (`decisions.py`: classes another file's
Linen class uses are kept Linen and their files migrated again; other broken uses of NNX classes
get a TODO), and only then, with `write=True`, are the changed files replaced atomically. A file
that fails is reported and left untouched; the others go on. Outcomes are sorted by path, so the
result does not depend on the order of `paths` nor on `jobs`.

With more than one job, files are migrated in worker processes (`workers.py`) that never import from the
migrated tree or the working directory, under a per-file time and memory limit (`workers.Limits`), and a
worker that crashes is replaced. With `jobs=1`, or a single file to migrate, the files are migrated in this
process, under the time limit only;
in both modes a file nested deeper than `MAX_NESTING` is failed before libcst parses it, since libcst's
recursive parser overflows the C stack (a segfault) on such input, and so is a file bigger than `MAX_KB`.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import json
import os
import re
import time
import tokenize
import typing as tp

from codemods import files
from codemods import workers
from codemods.analysis.hierarchy import LinenHierarchy
from codemods.analysis.hierarchy import build_hierarchy
from codemods.analysis.hierarchy import module_names
from codemods.analysis.seams import IMPORTABLE_SEAMS
from codemods.decisions import SEAMS_CODE
from codemods.decisions import decide_run
from codemods.decisions import with_todos
from codemods.diffs import unified_diff
from codemods.notebooks import transform_notebook
from codemods.options import MigrationOptions
from codemods.positions import PositionMap
from codemods.report import CHANGED
from codemods.report import FAILED
from codemods.report import SKIPPED
from codemods.report import UNCHANGED
from codemods.report import ConvertedClass
from codemods.report import Entry
from codemods.report import FileOutcome
from codemods.report import MigrationResult
from codemods.rule import TODO_PREFIX
from codemods.rule import MigrationRule
from codemods.transform import MigrationError
from codemods.transform import transform_source

# Test hook: seconds to sleep after each file migrated and each file written, so a test can kill a run mid-way.
SLEEP_ENV = 'LINEN2NNX_TEST_SLEEP_PER_FILE'

MAX_NESTING = 500
"""The deepest expression `migrate` parses, as `nesting_depth` counts it. libcst crashes the interpreter with a C
stack overflow from about 1,500 nested brackets, and runs for minutes on a 10,000-term sum; Python's recursion
limit fails the file (a RecursionError, reported) from about 200 nested brackets or 500 chained operators anyway.
Hand-written code stays far below: a few tens."""
MAX_KB_ENV = 'LINEN2NNX_FILE_MAX_KB'
MAX_KB = 1024
"""The biggest file `migrate` parses, in KB (LINEN2NNX_FILE_MAX_KB overrides it): the codemod takes about a second
per 3 KB of Linen code (benchmarks/big_files.py), so a bigger file, generated code mostly, would take minutes
before the time limit fails it; it is failed at once instead."""
# Tokens that nest one more expression node in libcst's tree when they chain: a + b + c, a.b.c, not not a.
_CHAIN_OPERATORS = frozenset({'.', '+', '-', '*', '/', '//', '%', '@', '**', '<<', '>>', '&', '|', '^', '~'})
_CHAIN_KEYWORDS = frozenset({'and', 'or', 'not', 'if', 'else', 'lambda', 'await'})
_SEPARATORS = frozenset({',', ':', '=', ';'})
_CLASS_NAME = re.compile(rb'^class\s+(\w+)', re.MULTILINE)
_TODO_LINE = re.compile(rb'^[ \t"]*' + re.escape(TODO_PREFIX.encode()), re.MULTILINE)
_TRIVIA = frozenset({tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT})

Task = tuple[str, tp.Mapping[str, str], tp.Mapping[str, ConvertedClass], frozenset[str]]
"""One file to migrate: its path, its classes the run keeps Linen (-> why), the records of classes other files
converted that its call sites use (by qualified name), the Linen classes of those files that stay Linen there
(`LinenHierarchy.settled`)."""


def migrate(
    paths: tp.Iterable[str | os.PathLike[str]],
    *,
    rules: tp.Sequence[type[MigrationRule]],
    write: bool = False,
    jobs: int | None = None,
    include: tp.Sequence[str] = (),
    exclude: tp.Sequence[str] = (),
    progress: bool = False,
    options: MigrationOptions = MigrationOptions(),
    limits: workers.Limits | None = None,
) -> MigrationResult:
  """Migrates the .py/.ipynb files under `paths` with `rules`; writes them only when `write`.

  `jobs` worker processes (default: all cores) share the files that mention flax, each file under `limits`
  (default: `workers.Limits.from_environment()`); `jobs=1` migrates them in this process. `progress` shows a
  tqdm bar on stderr; `options` are the user's choices for the generated code. A directory that cannot be read
  is a failed outcome. Raises FileNotFoundError for a path that does not exist, and ValueError for a path that
  holds no Python file (`files.NoPythonFiles`: .gitignore'd ones do not count; none left by the globs is an empty
  result) or for no `paths` at all.
  """
  rules = tuple(rules)
  paths = [os.fspath(path) for path in paths]
  found = files.find_files(paths, include, exclude)
  if not found.files and not found.unreadable and not found.left_out:
    raise ValueError(f'no Python files found under {" ".join(paths)}')
  outcomes = {path: FileOutcome(path, FAILED, error=f'cannot read directory: {error}')
              for path, error in found.unreadable}
  candidates = []
  sources: dict[str, bytes] = {}  # the .py files, for the hierarchy pass
  originals: dict[str, bytes] = {}  # every file read, as it was
  for path in found.files:
    try:
      with open(path, 'rb') as file:
        data = file.read()
    except OSError as error:
      outcomes[path] = FileOutcome(path, FAILED, error=f'cannot read: {error}')
      continue
    originals[path] = data
    if path.endswith('.py'):
      sources[path] = data
    if files.mentions_flax(data):
      candidates.append(path)
    else:
      outcomes[path] = FileOutcome(path, SKIPPED)
  # where imports resolve from: a folder of the run that is no package (a package imports from above its top)
  roots = [os.getcwd(), *(path for path in paths
                          if os.path.isdir(path) and not os.path.isfile(os.path.join(path, '__init__.py')))]
  hierarchy = build_hierarchy(sources, roots)
  for path in sorted(hierarchy.files - set(candidates)):  # subclasses of a Linen class, never saying flax
    candidates.append(path)
    del outcomes[path]
  jobs = jobs or os.cpu_count() or 1
  limits = limits or workers.Limits.from_environment()
  bar = _progress_bar(len(candidates), progress)
  try:
    outcomes.update(_outcomes(_run([(path, {}, {}, frozenset()) for path in candidates], rules, jobs, options,
                                   hierarchy, limits),
                              bar))
  finally:
    bar.close()
  rerun = lambda tasks: _outcomes(_run(tasks, rules, jobs, options, hierarchy, limits))
  outcomes = _settle(outcomes, originals, roots, hierarchy, rerun)
  outcomes = {path: dataclasses.replace(outcome, todos=_todos(outcome.source or originals.get(path, b'')))
              for path, outcome in outcomes.items()}
  if write:
    outcomes = {path: _write(outcome, originals.get(path, b'')) for path, outcome in outcomes.items()}
  return MigrationResult(tuple(outcomes[path] for path in sorted(outcomes)), written=write)


def _outcomes(run: tp.Iterator[FileOutcome], bar: tp.Any = None) -> dict[str, FileOutcome]:
  with contextlib.closing(run):  # on an interrupt, the workers are killed now, not when collected
    found = {}
    for outcome in run:
      found[outcome.path] = outcome
      if bar is not None:
        bar.update()
    return found


def _settle(outcomes: dict[str, FileOutcome], originals: tp.Mapping[str, bytes], roots: tp.Sequence[str],
            hierarchy: LinenHierarchy, rerun: tp.Callable[[list[Task]], dict[str, FileOutcome]]) -> dict[str, FileOutcome]:
  """The run-wide decisions (`decisions.py`): files whose Linen classes build a class another file converted are
  migrated again with its record (`imported_classes`), so that they build the NNX class in turn; classes some
  Linen class of another file still uses are kept Linen (their files migrated again); files whose call sites use
  a class another file converted are migrated again with its record, so that `train.py` builds what `models.py`
  now defines; files whose classes waited on a Linen class of another file (`FileOutcome.awaited`) are migrated
  again knowing which of that file's classes stay Linen (`LinenHierarchy.settled`); then the broken uses left get
  their TODO."""
  kept: dict[str, dict[str, str]] = {}
  sources_of: dict[str, set[str]] = {}  # file -> the files whose converted classes its call sites use
  given: dict[str, dict[str, ConvertedClass]] = {}  # file -> the records it was last migrated with
  waits_on: dict[str, set[str]] = {}  # file -> the files of the Linen classes its classes waited on
  told: dict[str, frozenset[str]] = {}  # file -> the Linen classes of those files it was told stay Linen
  path_of = {module: path for path in outcomes for module in module_names(path, roots)}
  while True:
    converted = {path: {c.linen_name for c in outcome.classes} for path, outcome in outcomes.items()}
    words = {name for path, outcome in outcomes.items() if outcome.status != SKIPPED
             for name in _CLASS_NAME.findall(originals.get(path, b''))}  # of the classes that may be NNX now
    texts = {path: _text(outcome.source if outcome.source is not None else originals[path], originals[path])
             for path, outcome in outcomes.items()
             if path.endswith('.py') and outcome.status != FAILED
             and (outcome.status != SKIPPED or any(word in originals[path] for word in words))}
    decision = decide_run(texts, converted, roots, sources_of)
    for path, names in decision.keep.items():
      kept[path] = {**kept.get(path, {}), **names}
    for path, seams in decision.todos.items():
      sources_of.setdefault(path, set()).update(
          s.target_path for s in seams if s.kind in IMPORTABLE_SEAMS and s.target_path != path)
    for path, targets in decision.retry.items():
      sources_of.setdefault(path, set()).update(targets)
    for path, outcome in outcomes.items():
      waits_on.setdefault(path, set()).update(
          found for name in outcome.awaited if (found := path_of.get(name.rpartition('.')[0])) not in (None, path))
    wanted = {path: _records(outcomes, sources, roots) for path, sources in sources_of.items()}
    staying = {path: _staying(converted, files, roots, hierarchy) for path, files in waits_on.items() if files}
    stale = sorted({*decision.keep, *(path for path, records in wanted.items() if records != given.get(path, {})),
                    *(path for path, names in staying.items() if names != told.get(path, frozenset()))})
    if not stale:
      break
    given.update({path: wanted[path] for path in stale if path in wanted})
    told.update({path: staying[path] for path in stale if path in staying})
    outcomes = {**outcomes, **rerun([(path, kept.get(path, {}), given.get(path, {}), told.get(path, frozenset()))
                                     for path in stale])}
  for path, seams in decision.todos.items():
    old = _text(originals[path], originals[path])
    new = with_todos(texts[path], seams)
    positions = PositionMap(old, texts[path])
    entries = [Entry(*positions.original(s.line, s.column + 1), SEAMS_CODE, 'todo', s.message) for s in seams]
    outcome = outcomes[path]
    entries = tuple(sorted([*outcome.entries, *entries], key=Entry.sort_key))
    if new == old:
      outcomes[path] = dataclasses.replace(outcome, entries=entries)
    else:
      data = new.encode(_encoding(originals[path]), 'surrogateescape')
      outcomes[path] = FileOutcome(path, CHANGED, diff=unified_diff(old, new, path), entries=entries,
                                   classes=outcome.classes, source=data)
  return outcomes


def _records(outcomes: tp.Mapping[str, FileOutcome], sources: tp.Iterable[str],
             roots: tp.Sequence[str]) -> dict[str, ConvertedClass]:
  """The records of the classes the files `sources` converted, under every qualified name of each (as
  `QualifiedNameProvider` names them in an importing file, relative imports resolved)."""
  return {f'{module}.{record.linen_name}': record for path in sorted(sources) if path in outcomes
          for module in module_names(path, roots) for record in outcomes[path].classes}


def _staying(converted: tp.Mapping[str, tp.Collection[str]], sources: tp.Iterable[str], roots: tp.Sequence[str],
             hierarchy: LinenHierarchy) -> frozenset[str]:
  """The Linen classes of the files `sources` that their migration kept Linen, under every qualified name."""
  modules = {module: path for path in sources for module in module_names(path, roots)}
  return frozenset(name for name in hierarchy.classes if (path := modules.get(name.rpartition('.')[0])) is not None
                   and name.rpartition('.')[2] not in converted.get(path, ()))


def _write(outcome: FileOutcome, original: bytes) -> FileOutcome:
  """Writes a changed file atomically, unless it changed on disk since it was read (then it fails, untouched)."""
  if outcome.status != CHANGED:
    return outcome
  try:
    with open(outcome.path, 'rb') as file:
      if file.read() != original:
        return dataclasses.replace(outcome, status=FAILED, diff='',
                                   error='the file changed on disk during the run, left untouched')
    files.write_atomic(outcome.path, outcome.source)
  except OSError as error:
    return dataclasses.replace(outcome, status=FAILED, diff='', error=f'cannot write: {error}')
  finally:
    if os.environ.get(SLEEP_ENV):
      time.sleep(float(os.environ[SLEEP_ENV]))
  return outcome


def _todos(data: bytes) -> int:
  """The TODO(linen2nnx) comment lines of a file (of a notebook's JSON too: one per line of a cell's source)."""
  return len(_TODO_LINE.findall(data))


def _text(data: bytes, original: bytes) -> str:
  return data.decode(_encoding(original), 'surrogateescape')


def migrate_file(path: str, rules: tp.Sequence[type[MigrationRule]],
                 options: MigrationOptions = MigrationOptions(),
                 hierarchy: LinenHierarchy = LinenHierarchy(),
                 kept_classes: tp.Mapping[str, str] = {},
                 imported_classes: tp.Mapping[str, ConvertedClass] = {},
                 settled: frozenset[str] = frozenset()) -> FileOutcome:
  """Migrates one file in memory: never raises; a failure is an outcome. The outcome of a changed file holds
  its new content (`source`), which `migrate` writes once the whole run is decided.

  `hierarchy`: the Linen classes of the whole run (`build_hierarchy`); `kept_classes`: classes of the file the
  run keeps Linen, with why; `imported_classes`: records of classes other files converted, by qualified name;
  `settled`: classes of those files that stay Linen there (`LinenHierarchy.settled`).
  """
  try:
    with open(path, 'rb') as file:
      old = file.read()
    limit = int(os.environ.get(MAX_KB_ENV, MAX_KB))
    if len(old) > limit * 1024:
      raise MigrationError(f'too big to migrate ({len(old) / 1024:,.0f} KB > {limit:,} KB): split the file, '
                           f'--exclude it, or set {MAX_KB_ENV} higher')
    depth = max(map(nesting_depth, _code(path, old)), default=0)
    if depth > MAX_NESTING:
      raise MigrationError(f'too deeply nested to parse safely (nesting depth {depth} > {MAX_NESTING}): split '
                           'the expression into smaller ones, or --exclude the file')
    if not kept_classes and not imported_classes and not settled and _no_rule_applies(path, old, hierarchy):
      return FileOutcome(path, UNCHANGED)
    seen_from = dataclasses.replace(hierarchy.for_file(path), settled=settled)
    if path.endswith('.ipynb'):
      result = transform_notebook(old, rules, options, seen_from, path)
    else:
      result = transform_source(old, rules, options, seen_from, path, kept_classes, imported_classes)
    if result.source == old:
      return FileOutcome(path, UNCHANGED, entries=result.entries, classes=result.classes, awaited=result.awaited)
    encoding = 'utf-8' if path.endswith('.ipynb') else _encoding(old)
    diff = unified_diff(old.decode(encoding, 'surrogateescape'), result.source.decode(encoding, 'surrogateescape'), path)
    return FileOutcome(path, CHANGED, diff=diff, entries=result.entries, classes=result.classes, source=result.source,
                       awaited=result.awaited)
  except MigrationError as error:
    return FileOutcome(path, FAILED, error=str(error))
  except RecursionError:
    return FileOutcome(path, FAILED, error="too deeply nested to migrate (Python's recursion limit): split the "
                                           'expression into smaller ones, or --exclude the file')
  except Exception as error:  # unreadable file, unknown encoding, a bug: report it, go on
    return FileOutcome(path, FAILED, error=f'{type(error).__name__}: {error}')
  finally:
    if os.environ.get(SLEEP_ENV):
      time.sleep(float(os.environ[SLEEP_ENV]))


def _no_rule_applies(path: str, data: bytes, hierarchy: LinenHierarchy) -> bool:
  """Whether no rule can change the .py file, which is then not parsed by libcst (most of a run's files that mention
  flax only in strings or comments, as `transformers/__init__.py`): it imports no flax, names no Linen class of the
  run, and parses (a file that does not is reported by libcst's parse, as any other)."""
  if not path.endswith('.py') or hierarchy.named_in(data):
    return False
  try:
    tree = ast.parse(data)
  except (SyntaxError, ValueError):
    return False
  return not files.imports_flax(tree)


def _migrate_task(task: Task, rules: tp.Sequence[type[MigrationRule]], options: MigrationOptions,
                  hierarchy: LinenHierarchy) -> FileOutcome:
  """`migrate_file` of a worker task: a path, the classes of it the run keeps Linen, the records it imports, the
  classes of other files it is told stay Linen."""
  path, kept, imported, settled = task
  return migrate_file(path, rules, options, hierarchy, kept, imported, settled)


def nesting_depth(source: bytes) -> int:
  """How deep libcst's tree of `source`'s deepest expression is, at most: open brackets plus chained operators.

  Counted on tokens (no parse, so no recursion): each open bracket, and, per bracket, the operators, keywords
  (`and`, `not`, `if`, ...), trailers (`f(...)(...)`, `x[...]`) and adjacent strings chained since the last
  `,` `:` `=` or `;`. Code that does not tokenize counts up to where it stops; the parser then reports it.
  """
  chained = [0]  # per open bracket
  total = deepest = 0
  previous: tokenize.TokenInfo | None = None
  try:
    for token in tokenize.tokenize(io.BytesIO(source).readline):
      kind, text = token.type, token.string
      if kind in _TRIVIA:
        continue
      chains = (kind == tokenize.OP and text in _CHAIN_OPERATORS
                or kind == tokenize.NAME and text in _CHAIN_KEYWORDS
                or kind == tokenize.STRING and previous is not None and previous.type == tokenize.STRING
                or text in ('(', '[') and previous is not None and (previous.type in (tokenize.NAME, tokenize.STRING)
                                                                    or previous.string in (')', ']')))
      if chains:
        chained[-1] += 1
        total += 1
      if kind == tokenize.OP and text in '([{':
        chained.append(0)
      elif kind == tokenize.OP and text in ')]}' and len(chained) > 1:
        total -= chained.pop()
      elif kind == tokenize.NEWLINE:
        chained, total = [0], 0
      elif kind == tokenize.OP and text in _SEPARATORS:
        total -= chained[-1]
        chained[-1] = 0
      deepest = max(deepest, len(chained) - 1 + total)
      previous = token
  except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):  # not text in its encoding: check_encoding says so
    pass
  return deepest


def _code(path: str, data: bytes) -> list[bytes]:
  """The Python code of a file: itself, or a notebook's code cells (none when the notebook does not load)."""
  if not path.endswith('.ipynb'):
    return [data]
  try:
    cells = json.loads(data).get('cells', [])
    sources = [cell.get('source', '') for cell in cells if cell.get('cell_type') == 'code']
    return [(''.join(source) if isinstance(source, list) else source).encode() for source in sources]
  except (ValueError, AttributeError, TypeError, RecursionError):  # not a notebook: transform_notebook reports it
    return []


def _run(tasks: list[Task], rules: tuple[type[MigrationRule], ...], jobs: int,
         options: MigrationOptions, hierarchy: LinenHierarchy, limits: workers.Limits) -> tp.Iterator[FileOutcome]:
  if jobs <= 1 or len(tasks) <= 1:  # one file: no worker to start (the pre-commit hook's usual run)
    for task in tasks:
      try:
        with workers.time_limit(limits.seconds):
          outcome = _migrate_task(task, rules, options, hierarchy)
      except workers.TimeLimitExceeded:
        outcome = FileOutcome(task[0], FAILED, error=limits.time_exceeded())
      yield outcome
    return
  run = workers.run_tasks(_migrate_task, (rules, options, hierarchy), tasks, min(jobs, len(tasks)), limits)
  with contextlib.closing(run):
    for task, outcome in run:
      yield FileOutcome(task[0], FAILED, error=outcome.reason) if isinstance(outcome, workers.TaskFailure) else outcome


def _encoding(data: bytes) -> str:
  """The source encoding, keeping a UTF-8 BOM in the text so that diffs apply to the bytes.

  UTF-8 when the coding comment cannot be read (an unknown encoding, lines 1-2 not UTF-8): such a file fails
  with `transform.check_encoding`'s message, and a skipped one is decoded with surrogateescape, byte for byte.
  """
  try:
    encoding, _ = tokenize.detect_encoding(iter(data.splitlines(keepends=True)).__next__)
  except SyntaxError:
    return 'utf-8'
  return 'utf-8' if encoding == 'utf-8-sig' else encoding


class _NoBar:
  """The progress bar of a run that shows none, without importing tqdm (a pre-commit run of one file)."""

  def update(self) -> None:
    pass

  def close(self) -> None:
    pass


def _progress_bar(total: int, enabled: bool) -> tp.Any:
  if not enabled or total == 0:
    return _NoBar()
  import tqdm

  return tqdm.tqdm(total=total, unit='file', desc='linen2nnx migrate', leave=False)
