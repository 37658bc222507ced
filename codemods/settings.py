"""`[tool.linen2nnx]` settings in a project's pyproject.toml, the defaults of `linen2nnx migrate`.

```toml
[tool.linen2nnx]
include = ["src/**"]          # globs, as --include
exclude = ["tests/legacy/"]   # globs, as --exclude
select = ["L2N"]              # rule codes or prefixes, as --select
jobs = 2                      # as -j
train-state = "keep"          # as --train-state
step-style = "cached"         # as --step-style
fail-on-todo = true           # as --fail-on-todo
unsafe-fixes = true           # as --unsafe-fixes
```

The nearest pyproject.toml at or above the current directory is read. Command-line globs add
to the configured ones; `--select`, `-j`, `--train-state` and `--step-style` replace them, and
`--fail-on-todo` and `--unsafe-fixes` turn theirs on.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing as tp

_KEYS = {'include': list, 'exclude': list, 'select': list, 'jobs': int, 'train-state': str, 'step-style': str,
         'fail-on-todo': bool, 'unsafe-fixes': bool}


@dataclasses.dataclass(frozen=True)
class Settings:
  """The `[tool.linen2nnx]` table, validated; `source` is the file it came from, if any."""

  include: tuple[str, ...] = ()
  exclude: tuple[str, ...] = ()
  select: tuple[str, ...] = ()
  jobs: int | None = None
  train_state: str | None = None
  step_style: str | None = None
  fail_on_todo: bool = False
  unsafe_fixes: bool = False
  source: str | None = None


def find_pyproject(start: str | os.PathLike[str]) -> str | None:
  """The nearest pyproject.toml at or above `start`."""
  directory = os.path.abspath(start)
  while True:
    candidate = os.path.join(directory, 'pyproject.toml')
    if os.path.isfile(candidate):
      return candidate
    parent = os.path.dirname(directory)
    if parent == directory:
      return None
    directory = parent


def load_settings(start: str | os.PathLike[str] = '.') -> Settings:
  """Reads `[tool.linen2nnx]` from the nearest pyproject.toml; ValueError names a bad key."""
  path = find_pyproject(start)
  if path is None:
    return Settings()
  with open(path, 'rb') as file:
    try:
      table: dict[str, tp.Any] = tomllib.load(file).get('tool', {}).get('linen2nnx', {})
    except tomllib.TOMLDecodeError as error:
      raise ValueError(f'{path}: {error}') from None
  unknown = sorted(set(table) - set(_KEYS))
  if unknown:
    raise ValueError(f'{path}: [tool.linen2nnx] has unknown keys {unknown}; known: {sorted(_KEYS)}')
  for key, kind in _KEYS.items():
    value = table.get(key)
    if value is None:
      continue
    wrong = not isinstance(value, kind) or (kind is int and isinstance(value, bool))  # `jobs = true` is no int
    if wrong or (kind is list and not all(isinstance(v, str) for v in value)):
      expected = {list: 'a list of strings', int: 'an integer', str: 'a string', bool: 'true or false'}[kind]
      raise ValueError(f'{path}: [tool.linen2nnx] {key} must be {expected}, got {value!r}')
  return Settings(
      include=tuple(table.get('include', ())),
      exclude=tuple(table.get('exclude', ())),
      select=tuple(table.get('select', ())),
      jobs=table.get('jobs'),
      train_state=table.get('train-state'),
      step_style=table.get('step-style'),
      fail_on_todo=table.get('fail-on-todo', False),
      unsafe_fixes=table.get('unsafe-fixes', False),
      source=path,
  )
