"""`migrate()`: run the rules over files and directories, in parallel, and report per file.

First the .py files are looked over together for the run's Linen class hierarchy
(`analysis/hierarchy.py`), so that a subclass of a project base class of another file is known to be a
Linen module. Then each file is skipped unless it mentions flax or linen or defines such a
subclass, migrated (`transform.py`, or `notebooks.py` for .ipynb), checked to still parse,
diffed and, with `write=True`, replaced atomically. A file that fails is reported and left
untouched; the others go on. Outcomes are sorted by path, so the result does not depend on the
order of `paths` nor on `jobs`.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time
import tokenize
import typing as tp

from codemods import files
from codemods.diffs import unified_diff
from codemods.analysis.hierarchy import LinenHierarchy
from codemods.analysis.hierarchy import build_hierarchy
from codemods.notebooks import transform_notebook
from codemods.options import MigrationOptions
from codemods.report import CHANGED
from codemods.report import FAILED
from codemods.report import SKIPPED
from codemods.report import UNCHANGED
from codemods.report import FileOutcome
from codemods.report import MigrationResult
from codemods.rule import MigrationRule
from codemods.transform import MigrationError
from codemods.transform import transform_source

# Test hook: seconds to sleep after each file, so a test can kill a `--write` run mid-way.
SLEEP_ENV = 'LINEN2NNX_TEST_SLEEP_PER_FILE'


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
) -> MigrationResult:
  """Migrates the .py/.ipynb files under `paths` with `rules`; writes them only when `write`.

  `jobs` processes (default: all cores) share the files that mention flax; `progress` shows a
  tqdm bar on stderr; `options` are the user's choices for the generated code. Raises FileNotFoundError for a path that does not exist.
  """
  rules = tuple(rules)
  paths = [os.fspath(path) for path in paths]
  outcomes: dict[str, FileOutcome] = {}
  candidates = []
  sources: dict[str, bytes] = {}  # the .py files that define classes, for the hierarchy pass
  for path in files.collect_files(paths, include, exclude):
    try:
      with open(path, 'rb') as file:
        data = file.read()
    except OSError as error:
      outcomes[path] = FileOutcome(path, FAILED, error=f'cannot read: {error}')
      continue
    if path.endswith('.py') and b'class' in data:
      sources[path] = data
    if files.mentions_flax(data):
      candidates.append(path)
    else:
      outcomes[path] = FileOutcome(path, SKIPPED)
  hierarchy = build_hierarchy(sources, [os.getcwd(), *(path for path in paths if os.path.isdir(path))])
  for path in sorted(hierarchy.files - set(candidates)):  # subclasses of a Linen class, never saying flax
    candidates.append(path)
    del outcomes[path]
  jobs = min(jobs or os.cpu_count() or 1, max(len(candidates), 1))
  bar = _progress_bar(len(candidates), progress)
  try:
    for outcome in _run(candidates, rules, write, jobs, options, hierarchy):
      outcomes[outcome.path] = outcome
      bar.update()
  finally:
    bar.close()
  return MigrationResult(tuple(outcomes[path] for path in sorted(outcomes)), written=write)


def migrate_file(path: str, rules: tp.Sequence[type[MigrationRule]], write: bool,
                 options: MigrationOptions = MigrationOptions(),
                 hierarchy: LinenHierarchy = LinenHierarchy()) -> FileOutcome:
  """Migrates one file: never raises; a failure is an outcome, and the file is then left untouched.

  `hierarchy`: the Linen classes of the whole run (`build_hierarchy`).
  """
  try:
    with open(path, 'rb') as file:
      old = file.read()
    if path.endswith('.ipynb'):
      result = transform_notebook(old, rules, options, hierarchy.for_file(path), path)
    else:
      result = transform_source(old, rules, options, hierarchy.for_file(path), path)
    if result.source == old:
      return FileOutcome(path, UNCHANGED, entries=result.entries, classes=result.classes)
    encoding = 'utf-8' if path.endswith('.ipynb') else _encoding(old)
    diff = unified_diff(old.decode(encoding, 'surrogateescape'), result.source.decode(encoding, 'surrogateescape'), path)
    if write:
      with open(path, 'rb') as file:
        if file.read() != old:
          raise MigrationError('the file changed on disk during the run, left untouched')
      files.write_atomic(path, result.source)
    return FileOutcome(path, CHANGED, diff=diff, entries=result.entries, classes=result.classes)
  except MigrationError as error:
    return FileOutcome(path, FAILED, error=str(error))
  except Exception as error:  # unreadable file, unknown encoding, a bug: report it, go on
    return FileOutcome(path, FAILED, error=f'{type(error).__name__}: {error}')
  finally:
    if os.environ.get(SLEEP_ENV):
      time.sleep(float(os.environ[SLEEP_ENV]))


def _run(paths: list[str], rules: tuple[type[MigrationRule], ...], write: bool, jobs: int,
         options: MigrationOptions, hierarchy: LinenHierarchy) -> tp.Iterator[FileOutcome]:
  if jobs <= 1:
    for path in paths:
      yield migrate_file(path, rules, write, options, hierarchy)
    return
  # spawn, not fork: the parent may have imported jax, whose threads make fork unsafe.
  context = multiprocessing.get_context('spawn')
  with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
    futures = {pool.submit(migrate_file, path, rules, write, options, hierarchy): path for path in paths}
    for future in concurrent.futures.as_completed(futures):
      try:
        yield future.result()
      except Exception as error:  # a worker died (killed, out of memory): the file is unprocessed
        yield FileOutcome(futures[future], FAILED, error=f'worker process failed: {type(error).__name__}: {error}')


def _encoding(data: bytes) -> str:
  """The source encoding, keeping a UTF-8 BOM in the text so that diffs apply to the bytes."""
  encoding, _ = tokenize.detect_encoding(iter(data.splitlines(keepends=True)).__next__)
  return 'utf-8' if encoding == 'utf-8-sig' else encoding


def _progress_bar(total: int, enabled: bool) -> tp.Any:
  import tqdm

  return tqdm.tqdm(total=total, unit='file', desc='linen2nnx migrate', leave=False, disable=not enabled or total == 0)
