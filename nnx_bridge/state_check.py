"""Compares a flat tree of given arrays against the flat tree a module expects.

Used wherever outside state is merged into a module (a Linen variables dict, a checkpoint):
every missing, extra, wrong-shape or wrong-dtype leaf is reported in one error, sorted by
path, instead of failing later inside a matmul or being replaced by a fresh random init.
"""

from __future__ import annotations

import typing as tp

import numpy as np

from nnx_bridge.errors import StateMismatchError

Path = tuple[tp.Hashable, ...]


def path_str(path: Path) -> str:
  """Formats a path as 'params/dense/kernel', the spelling used in every error message."""
  return '/'.join(str(key) for key in path)


def describe(leaf: tp.Any) -> str:
  """Formats a leaf's dtype and shape as 'float32[3,4]' so two leaves compare at a glance."""
  shape = getattr(leaf, 'shape', None)
  shape = np.shape(leaf) if shape is None else shape
  dtype = getattr(leaf, 'dtype', None)
  dtype = np.result_type(leaf) if dtype is None else dtype
  return f'{dtype}[{",".join(map(str, shape))}]'


def check_state(
    expected: tp.Mapping[Path, tp.Any],
    given: tp.Mapping[Path, tp.Any],
    *,
    context: str,
) -> None:
  """Raises StateMismatchError listing every missing, extra, wrong-shape or wrong-dtype leaf.

  `expected` leaves only need `.shape` and `.dtype` (e.g. `jax.ShapeDtypeStruct`); `given`
  leaves are arrays or anything numpy can take the shape and dtype of.
  """
  problems = []
  for path in expected.keys() | given.keys():
    if path not in given:
      problems.append((path, f'expected {describe(expected[path])}, got nothing (missing)'))
    elif path not in expected:
      problems.append((path, f'expected nothing (unexpected key), got {describe(given[path])}'))
    else:
      want, got = describe(expected[path]), describe(given[path])
      if want != got:
        problems.append((path, f'expected {want}, got {got}'))
  if problems:
    lines = sorted(f'  {path_str(path)}: {message}' for path, message in problems)
    raise StateMismatchError(
        f'{context} ({len(problems)} mismatched leaves):\n'
        + '\n'.join(lines)
    )
