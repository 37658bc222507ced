"""Which files `linen2nnx migrate` looks at, and how it writes them back."""

from __future__ import annotations

import ast
import dataclasses
import os
import pathlib
import tempfile
import typing as tp

if tp.TYPE_CHECKING:
  import pathspec

SUFFIXES = ('.py', '.ipynb')
MENTIONS = (b'flax', b'linen')
# Named on the command line, these are Python too: what pre-commit's `python` type passes besides .py files (its
# `identify` table), so that the hooks of .pre-commit-hooks.yaml never hand migrate a file it refuses.
SCRIPT_SUFFIXES = ('.pyw', '.wsgi', '.tac', '.gyp', '.gypi', '.pdbrc')
ACCEPTED = 'migrate takes .py and .ipynb files, Python scripts (a #! line naming python) and folders that hold them'
_SHEBANG_BYTES = 256  # of a file's first line, read to tell a Python script


class NoPythonFiles(ValueError):
  """A path given to migrate that holds no Python file at all: a usage error (exit 2), not an empty run."""


@dataclasses.dataclass(frozen=True)
class FoundFiles:
  """The files to migrate, sorted; the directories that could not be listed, with the reason; and how many
  files `include`/`exclude` left out (a run that finds nothing because of them is no error)."""

  files: tuple[str, ...]
  unreadable: tuple[tuple[str, str], ...] = ()
  left_out: int = 0


def find_files(
    paths: tp.Iterable[str | os.PathLike[str]],
    include: tp.Sequence[str] = (),
    exclude: tp.Sequence[str] = (),
) -> FoundFiles:
  """The .py/.ipynb files under `paths`, sorted: .gitignore'd ones left out, then the globs applied.

  A file named on the command line is taken even if .gitignore'd; `include`/`exclude` are
  gitignore-style globs matched against the path relative to the directory being walked
  (`*_test.py`, `build/`, `src/**/legacy.py`); with `include`, a file must match one. A file found
  twice (a symlink and its target) is taken once, under the target's name when it is found too.

  Raises FileNotFoundError for a path that does not exist, and NoPythonFiles for one that holds no
  Python file at all, before the globs (a file that is not .py, .ipynb or a Python script, a folder
  without .py or .ipynb files but .gitignore'd ones): the command line is wrong, not the code.
  """
  include_spec = _gitignore_spec(include) if include else None
  exclude_spec = _gitignore_spec(exclude) if exclude else None
  found: set[str] = set()
  unreadable: dict[str, str] = {}
  left_out = 0
  for path in paths:
    path = os.path.normpath(os.fspath(path))
    if os.path.isdir(path):
      candidates = _walked(path, unreadable)
    elif os.path.isfile(path) and is_python_file(path):
      candidates = [(path, os.path.basename(path))]
    elif os.path.isfile(path):
      raise NoPythonFiles(f'{path}: not a Python file; {ACCEPTED}')
    else:
      raise FileNotFoundError(f'no such file or directory: {path}')
    for file, relative in candidates:
      relative = pathlib.PurePath(relative).as_posix()
      if include_spec is not None and not include_spec.match_file(relative) \
          or exclude_spec is not None and exclude_spec.match_file(relative):
        left_out += 1
      else:
        found.add(pathlib.PurePath(file).as_posix())
  return FoundFiles(_once(found), tuple(sorted(unreadable.items())), left_out)


def _walked(folder: str, unreadable: dict[str, str]) -> list[tuple[str, str]]:
  """The migratable files under `folder`, each with its path relative to it; raises NoPythonFiles when there are
  none and every directory could be listed (one that could not goes into `unreadable`, a failed outcome)."""
  denied: dict[str, str] = {}
  found = [(file, os.path.relpath(file, folder)) for file in _walk(folder, denied)]
  if not found and not denied:
    raise NoPythonFiles(f"{folder}: a folder without .py or .ipynb files (.gitignore'd ones do not count); {ACCEPTED}")
  unreadable.update(denied)
  return found


def is_python_file(path: str) -> bool:
  """A file migrate takes when it is named: a .py or .ipynb file, a script whose `#!` line runs python, or another
  file pre-commit's `python` type passes (`SCRIPT_SUFFIXES`). One that cannot be read is taken, for the run to
  report it."""
  if path.endswith(SUFFIXES + SCRIPT_SUFFIXES):
    return True
  try:
    with open(path, 'rb') as file:
      first = file.readline(_SHEBANG_BYTES)
  except OSError:
    return True
  return first.startswith(b'#!') and b'python' in first


def _once(paths: set[str]) -> tuple[str, ...]:
  """`paths` sorted, keeping one path per file: the one that is not a symlink, else the first."""
  by_file: dict[str, list[str]] = {}
  for path in sorted(paths):
    by_file.setdefault(os.path.realpath(path), []).append(path)
  kept = [next((path for path in same if not os.path.islink(path)), same[0]) for same in by_file.values()]
  return tuple(sorted(kept))


def _walk(root: str, unreadable: dict[str, str]) -> tp.Iterator[str]:
  """Files under `root` with a migratable suffix that no .gitignore (nested, or above up to the repo) ignores.

  A directory that cannot be listed goes into `unreadable` (path -> reason).
  """
  above = _ignores_above(os.path.abspath(root))
  nested: dict[str, list[tuple[str, pathspec.GitIgnoreSpec]]] = {}

  def record(error: OSError) -> None:
    unreadable[pathlib.PurePath(error.filename or root).as_posix()] = error.strerror or str(error)

  for directory, subdirs, files in os.walk(root, onerror=record):
    absolute = os.path.abspath(directory)
    ignores = nested.pop(absolute, above)
    spec = _read_gitignore(directory)
    if spec is not None:
      ignores = [*ignores, (absolute, spec)]
    subdirs[:] = sorted(
        name for name in subdirs
        if name != '.git' and not _ignored(os.path.join(absolute, name), True, ignores)
    )
    for name in subdirs:
      nested[os.path.join(absolute, name)] = ignores
    for name in sorted(files):
      if name.endswith(SUFFIXES) and not _ignored(os.path.join(absolute, name), False, ignores):
        yield os.path.join(directory, name)


def _ignores_above(root: str) -> list[tuple[str, pathspec.GitIgnoreSpec]]:
  """The .gitignore files of the directories above `root` (absolute), up to its git repository's root."""
  if os.path.exists(os.path.join(root, '.git')):
    return []
  chain = []
  directory = root
  while os.path.dirname(directory) != directory:
    directory = os.path.dirname(directory)
    chain.append(directory)
    if os.path.exists(os.path.join(directory, '.git')):
      break
  else:
    return []  # not inside a repository: only the .gitignore files under root count
  specs = [(directory, _read_gitignore(directory)) for directory in reversed(chain)]
  return [(directory, spec) for directory, spec in specs if spec is not None]


def _read_gitignore(directory: str) -> pathspec.GitIgnoreSpec | None:
  try:
    with open(os.path.join(directory, '.gitignore'), encoding='utf-8', errors='replace') as file:
      return _gitignore_spec(file)
  except OSError:
    return None


def _gitignore_spec(lines: tp.Iterable[str]) -> pathspec.GitIgnoreSpec:
  """gitignore-style patterns; pathspec is imported here, so that a run over files named on the command line
  with no globs (a pre-commit hook's) does not import it."""
  import pathspec

  return pathspec.GitIgnoreSpec.from_lines(lines)


def _ignored(path: str, is_dir: bool, ignores: list[tuple[str, pathspec.GitIgnoreSpec]]) -> bool:
  """Git's rule: the deepest .gitignore with a matching pattern decides; its last match wins."""
  for base, spec in reversed(ignores):
    relative = pathlib.PurePath(os.path.relpath(path, base)).as_posix() + ('/' if is_dir else '')
    result = spec.check_file(relative)
    if result.include is not None:
      return result.include
  return False


def mentions_flax(data: bytes) -> bool:
  """The cheap test run before any parse: a file that never says flax or linen has nothing to migrate."""
  return any(word in data for word in MENTIONS)


def imports_flax(tree: ast.Module) -> bool:
  """Whether the code has a statement importing flax (anywhere: in a function, under `try:`), which every Linen name
  the rules resolve goes through; a file that only says flax in strings or comments, as transformers'
  `__init__.py` does, has none."""
  return any(isinstance(node, ast.Import) and any(alias.name.partition('.')[0] == 'flax' for alias in node.names)
             or isinstance(node, ast.ImportFrom) and not node.level and (node.module or '').partition('.')[0] == 'flax'
             for node in ast.walk(tree))


def write_atomic(path: str, data: bytes) -> None:
  """Replaces `path` by `data` through a temporary file in the same directory, so it is never half written.

  A symlink is written through: its target is replaced, the link stays. The file keeps its mode, and its
  owner and group where this process may set them (as root, or a group the user is in).
  """
  path = os.path.realpath(path)
  directory, name = os.path.split(path)
  status = os.stat(path)
  descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f'.{name}.', suffix='.linen2nnx-tmp')
  try:
    with os.fdopen(descriptor, 'wb') as file:
      file.write(data)
      file.flush()
      os.fsync(file.fileno())
    os.chmod(temporary, status.st_mode & 0o7777)
    if hasattr(os, 'chown'):
      try:
        os.chown(temporary, status.st_uid, status.st_gid)
      except PermissionError:  # not root: the file is the writer's, as with any editor
        pass
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary):
      os.unlink(temporary)
    raise


def check_output(option: str, path: str | os.PathLike[str] | None, *, new_folder: bool = False) -> None:
  """Raises ValueError('OPTION PATH: what is wrong; how to fix it') when the output `path` cannot be written.

  Commands call it for every output they take before they write anything, so that a wrong output path costs
  neither a run nor files already rewritten. A file: its folder must exist and be writable (or the file
  itself, when it exists), and it must not be a folder. A `new_folder` (created with its parents): it must
  not exist, and its nearest existing parent must be a writable folder. Nothing for None (not given).
  """
  if path is None:
    return
  path = os.fspath(path)
  problem = _new_folder_problem(path) if new_folder else _output_file_problem(path)
  if problem:
    raise ValueError(f'{option} {path}: {problem}')


def _output_file_problem(path: str) -> str | None:
  folder = os.path.dirname(path) or '.'
  if os.path.isdir(path):
    return 'is a folder; give the path of a file, in it or elsewhere'
  if not os.path.exists(folder):
    return f'the folder {folder} does not exist; create it first (mkdir -p {folder}) or give a path in another folder'
  if not os.path.isdir(folder):
    return f'{folder} is a file, not a folder; give a path in a folder'
  if os.path.exists(path):
    return None if os.access(path, os.W_OK) else 'the file is read-only; make it writable or give another path'
  if not os.access(folder, os.W_OK | os.X_OK):
    return f'the folder {folder} is not writable; give a path in a folder you can write to'
  return None


def _new_folder_problem(path: str) -> str | None:
  if os.path.lexists(path):
    return 'already exists; give a new path'
  parent = os.path.dirname(os.path.abspath(path))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    return f'{parent} is a file, not a folder; give a path in a folder'
  if not os.access(parent, os.W_OK | os.X_OK):
    return f'the folder {parent} is not writable; give a path in a folder you can write to'
  return None
