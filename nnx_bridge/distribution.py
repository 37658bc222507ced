"""The version of linen2nnx, installed or not.

`importlib.metadata` knows it once the package is installed; a source tree that was not (copied to a machine
without a package registry, imported through `PYTHONPATH`) reads it from its own `pyproject.toml`, so that importing
`nnx_bridge` or running `python -m codemods.cli` there does not fail.
"""

from __future__ import annotations

import pathlib

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / 'pyproject.toml'


def package_version() -> str:
  """The installed distribution's version, else the source tree's `pyproject.toml` one, else '0+unknown'.

  Its imports are here: the command line builds its `--version` without calling it."""
  import importlib.metadata
  import tomllib

  try:
    return importlib.metadata.version('linen2nnx')
  except importlib.metadata.PackageNotFoundError:
    pass
  try:
    return tomllib.loads(PYPROJECT.read_text())['project']['version']
  except (OSError, KeyError, tomllib.TOMLDecodeError):
    return '0+unknown'
