"""What example traces say of layer input sizes (and of the inputs of user classes), as expressions of a class's fields (no jax here).

`codemods/examples.py` traces the user's models; this module holds what it found, in the form the
rules read from `MigrationOptions.example_sizes` (small, picklable, cheap to import in workers), and
the search for the simplest expression of a class's integer fields that every traced instance
agrees with, confirmed on variants of the models the fit did not see.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import typing as tp

Atoms = dict[str, int]
"""Integer values of a class instance, by the code reading them in `__init__` (`self.features`,
`len(self.stage_sizes)` for a sequence field)."""

Check = tuple[str, Atoms, int]
"""A traced instance of a variant the fit did not see: the variant (`num_filters=9`), atoms, size."""

_MULTIPLES = (2, 3, 4, 8)
_DIVISORS = (2, 4)


@dataclasses.dataclass(frozen=True)
class TracedSize:
  """One NNX input size of one layer of a class: the expression every traced instance agrees with, or None."""

  expression: str | None
  values: tuple[int, ...]  # the sizes traced, one per instance
  candidates: tuple[str, ...] = ()  # the equally simple expressions that also agree (ambiguous)
  confirmations: int = 0  # traced instances of variants the fit did not see that the expression predicts
  unconfirmed: str | None = None  # the expression that fits the examples but not a variant (or no variant traced)
  refuted_by: str = ''  # why it was not confirmed: the variant and the sizes, or that no variant traced

  def describe(self) -> str:
    seen = ', '.join(map(str, sorted(set(self.values))))
    if self.expression is not None:
      return (f'{len(self.values)} traced instances agree (sizes {seen}), confirmed on {self.confirmations} '
              f'of variants the fit did not see')
    if self.unconfirmed is not None:
      return f'the example trace saw {seen}; {self.unconfirmed} fits the examples but {self.refuted_by}'
    if self.candidates:
      return f'the example trace saw {seen}, which {" and ".join(self.candidates)} all match'
    return f'the example trace saw {seen}, which no expression of the fields matches'


ClassSizes = dict[tuple[str, str], TracedSize]
"""(Linen child name, NNX argument or `input:<i>` for a user class called with it) -> what the trace says, for one class."""


@dataclasses.dataclass(frozen=True)
class ExampleFailure:
  """An example that could not be traced, so the sizes were derived without it."""

  file: str  # the examples file, as the user named it
  function: str
  error: str  # `AttributeError: "Head" object has no attribute "scale".`
  where: str | None = None  # `models.py:12`: the line of the user's code that raised, when there is one

  def describe(self) -> str:
    at = f' (at {self.where})' if self.where else ''
    return f'{self.file}: example {self.function}() skipped, it cannot be traced: {self.error}{at}'


@dataclasses.dataclass(frozen=True)
class ExampleSizes:
  """What the example traces say of the classes of each source file (by real path, then class name), and the
  examples that could not be traced (`failures`, one line each in the migrate report)."""

  by_file: dict[str, dict[str, ClassSizes]] = dataclasses.field(default_factory=dict)
  failures: tuple[ExampleFailure, ...] = ()

  def of_class(self, path: str | None, name: str) -> ClassSizes:
    if path is None:
      return {}
    return self.by_file.get(os.path.realpath(path), {}).get(name, {})


def resolve(observations: tp.Sequence[tuple[Atoms, int]], checks: tp.Sequence[Check]) -> TracedSize:
  """The simplest expression of the atoms that gives every observed value; None when none or several do.

  The expression must also predict each of `checks` (instances of variants the fit did not see), and at least one
  of them must be new to the fit (atoms no observation had): an expression that fits the examples by coincidence
  (`2 * self.num_filters` for a ResNet of two stages) is refuted by a variant (three stages), and one that no
  variant could test is not taken either; both stay constructor arguments.
  """
  values = tuple(value for _, value in observations)
  names = sorted(set.intersection(*(set(atoms) for atoms, _ in observations)))
  for tier in _tiers(names):
    agreeing = [(code, evaluate) for code, evaluate in tier
                if all(evaluate(atoms) == value for atoms, value in observations)]
    if len(agreeing) > 1:
      return TracedSize(None, values, tuple(code for code, _ in agreeing))
    if agreeing:
      return _confirmed(*agreeing[0], observations, checks)
  return TracedSize(None, values)


def _confirmed(code: str, evaluate: tp.Callable[[Atoms], int | None],
               observations: tp.Sequence[tuple[Atoms, int]], checks: tp.Sequence[Check]) -> TracedSize:
  """The fitted expression if every check agrees and one is new to the fit; otherwise why it is not taken."""
  values = tuple(value for _, value in observations)
  for variant, atoms, value in checks:
    predicted = _evaluate(evaluate, atoms)
    if predicted != value:
      gives = f'it gives {predicted}' if predicted is not None else 'the fields do not give it'
      return TracedSize(None, values, unconfirmed=code,
                        refuted_by=f'not the variant {variant}, which traced {value} where {gives}')
  seen = [atoms for atoms, _ in observations]
  new = sum(1 for _, atoms, _ in checks if atoms not in seen)
  if not new:
    return TracedSize(None, values, unconfirmed=code,
                      refuted_by='no variant changing its fields could be traced to confirm it')
  return TracedSize(code, values, confirmations=new)


def _evaluate(evaluate: tp.Callable[[Atoms], int | None], atoms: Atoms) -> int | None:
  try:
    return evaluate(atoms)
  except KeyError:  # an atom the variant's instance lacks
    return None


def _tiers(names: list[str]) -> tp.Iterator[list[tuple[str, tp.Callable[[Atoms], int | None]]]]:
  """Candidate expressions, simplest first: an atom; a multiple or exact fraction of one; a sum or product; an
  atom doubled once per element of a sequence field but one (a ResNet's width after its stages)."""
  yield [(name, lambda atoms, n=name: atoms[n]) for name in names]
  yield [(f'{k} * {name}', lambda atoms, n=name, k=k: k * atoms[n]) for name in names for k in _MULTIPLES] + [
      (f'{name} // {k}', lambda atoms, n=name, k=k: atoms[n] // k if atoms[n] % k == 0 else None)
      for name in names for k in _DIVISORS
  ]
  pairs = list(itertools.combinations(names, 2))
  yield [(f'{a} + {b}', lambda atoms, a=a, b=b: atoms[a] + atoms[b]) for a, b in pairs] + [
      (f'{a} * {b}', lambda atoms, a=a, b=b: atoms[a] * atoms[b]) for a, b in pairs
  ]
  lengths = [name for name in names if name.startswith('len(')]
  yield [(f'{a} * 2 ** ({n} - 1)', lambda atoms, a=a, n=n: atoms[a] * 2 ** (atoms[n] - 1) if atoms[n] else None)
         for a in names for n in lengths if a not in lengths]
