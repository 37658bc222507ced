"""Which files `linen2nnx migrate` looks at, and how it writes them back."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import tempfile
import typing as tp

import pathspec

SUFFIXES = ('.py', '.ipynb')
MENTIONS = (b'flax', b'linen')


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
  """
  include_spec = pathspec.GitIgnoreSpec.from_lines(include) if include else None
  exclude_spec = pathspec.GitIgnoreSpec.from_lines(exclude)
  found: set[str] = set()
  unreadable: dict[str, str] = {}
  left_out = 0
  for path in paths:
    path = os.path.normpath(os.fspath(path))
    if os.path.isdir(path):
      candidates = ((file, os.path.relpath(file, path)) for file in _walk(path, unreadable))
    elif os.path.isfile(path):
      candidates = [(path, os.path.basename(path))]
    else:
      raise FileNotFoundError(f'no such file or directory: {path}')
    for file, relative in candidates:
      relative = pathlib.PurePath(relative).as_posix()
      if include_spec is not None and not include_spec.match_file(relative) or exclude_spec.match_file(relative):
        left_out += 1
      else:
        found.add(pathlib.PurePath(file).as_posix())
  return FoundFiles(_once(found), tuple(sorted(unreadable.items())), left_out)


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
      return pathspec.GitIgnoreSpec.from_lines(file)
  except OSError:
    return None


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
