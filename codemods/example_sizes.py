"""What example traces say of layer input sizes (and of the inputs of user classes), as expressions of a class's fields (no jax here).

`codemods/examples.py` traces the user's models; this module holds what it found, in the form the
rules read from `MigrationOptions.example_sizes` (small, picklable, cheap to import in workers), and
the search for the simplest expression of a class's integer fields that every traced instance
agrees with.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import typing as tp

Atoms = dict[str, int]
"""Integer values of a class instance, by the code reading them in `__init__` (`self.features`)."""

_MULTIPLES = (2, 3, 4, 8)
_DIVISORS = (2, 4)


@dataclasses.dataclass(frozen=True)
class TracedSize:
  """One NNX input size of one layer of a class: the expression every traced instance agrees with, or None."""

  expression: str | None
  values: tuple[int, ...]  # the sizes traced, one per instance
  candidates: tuple[str, ...] = ()  # the equally simple expressions that also agree (ambiguous)

  def describe(self) -> str:
    seen = ', '.join(map(str, sorted(set(self.values))))
    if self.expression is not None:
      return f'{len(self.values)} traced instances agree (sizes {seen})'
    if self.candidates:
      return f'the example trace saw {seen}, which {" and ".join(self.candidates)} all match'
    return f'the example trace saw {seen}, which no expression of the fields matches'


ClassSizes = dict[tuple[str, str], TracedSize]
"""(Linen child name, NNX argument or `input:<i>` for a user class called with it) -> what the trace says, for one class."""


@dataclasses.dataclass(frozen=True)
class ExampleSizes:
  """What the example traces say of the classes of each source file (by real path, then class name)."""

  by_file: dict[str, dict[str, ClassSizes]] = dataclasses.field(default_factory=dict)

  def of_class(self, path: str | None, name: str) -> ClassSizes:
    if path is None:
      return {}
    return self.by_file.get(os.path.realpath(path), {}).get(name, {})


def resolve(observations: tp.Sequence[tuple[Atoms, int]]) -> TracedSize:
  """The simplest expression of the atoms that gives every observed value; None when none or several do."""
  values = tuple(value for _, value in observations)
  names = sorted(set.intersection(*(set(atoms) for atoms, _ in observations)))
  for tier in _tiers(names):
    agreeing = [code for code, evaluate in tier
                if all(evaluate(atoms) == value for atoms, value in observations)]
    if len(agreeing) == 1:
      return TracedSize(agreeing[0], values)
    if agreeing:
      return TracedSize(None, values, tuple(agreeing))
  return TracedSize(None, values)


def _tiers(names: list[str]) -> tp.Iterator[list[tuple[str, tp.Callable[[Atoms], int | None]]]]:
  """Candidate expressions, simplest first: an atom; a multiple or exact fraction of one; a sum or product."""
  yield [(name, lambda atoms, n=name: atoms[n]) for name in names]
  yield [(f'{k} * {name}', lambda atoms, n=name, k=k: k * atoms[n]) for name in names for k in _MULTIPLES] + [
      (f'{name} // {k}', lambda atoms, n=name, k=k: atoms[n] // k if atoms[n] % k == 0 else None)
      for name in names for k in _DIVISORS
  ]
  pairs = list(itertools.combinations(names, 2))
  yield [(f'{a} + {b}', lambda atoms, a=a, b=b: atoms[a] + atoms[b]) for a, b in pairs] + [
      (f'{a} * {b}', lambda atoms, a=a, b=b: atoms[a] * atoms[b]) for a, b in pairs
  ]
