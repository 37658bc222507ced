"""Leaf-by-leaf mapping between a Linen variables tree and an NNX state.

A `TreeMapping` says, for every NNX leaf, which Linen leaf (or which Linen leaves, fused along
an axis, as for OptimizedLSTMCell's gates) it is made of, and which Linen leaves have no NNX
place (GRUCell's `hn/bias`). It is plain data: derived automatically (`derive.py`), read from or
written to a reviewable JSON file, and applied leaf by leaf, so the transfer functions and the
streaming checkpoint converter share one plan.

Paths are tuples of strings: Linen keys are `(collection, *path)`, NNX paths are the state path
with integer keys (`nnx.List` children) written as strings, the form orbax stores them in.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import typing as tp

import jax.numpy as jnp
import numpy as np

from nnx_bridge.errors import LossyConversionError
from nnx_bridge.errors import StateMismatchError

LinenKey = tuple[str, ...]
NNXPath = tuple[str, ...]


def normalize_path(path: tp.Iterable[tp.Any]) -> tuple[str, ...]:
  """A path with every key as a string (`('layers', 0)` -> `('layers', '0')`)."""
  return tuple(str(getattr(key, 'key', getattr(key, 'name', getattr(key, 'idx', key)))) for key in path)


def path_str(path: tp.Sequence[str]) -> str:
  """'params/Dense_0/kernel'; keys holding '/' cannot be spelled this way and are refused."""
  if any('/' in key for key in path):
    raise ValueError(f'cannot write the path {tuple(path)}: a key contains "/"')
  return '/'.join(path)


def parse_path(text: str) -> tuple[str, ...]:
  return tuple(part for part in text.split('/') if part)


@dataclasses.dataclass(frozen=True)
class LeafRule:
  """One NNX leaf, made of one Linen leaf or of several concatenated along `concat_axis`."""

  nnx: NNXPath
  linen: tuple[LinenKey, ...]
  concat_axis: int | None = None

  def __post_init__(self):
    if (len(self.linen) > 1) != (self.concat_axis is not None):
      raise ValueError(f'{path_str(self.nnx)}: a concat_axis is given exactly when several Linen leaves are')


@dataclasses.dataclass(frozen=True)
class TreeMapping:
  """Every NNX leaf's Linen source, and the Linen leaves NNX has no place for (must be zero)."""

  rules: tuple[LeafRule, ...]
  dropped: tuple[LinenKey, ...] = ()

  def __post_init__(self):
    seen: dict[LinenKey, NNXPath] = {}
    problems = []
    counts = collections.Counter(rule.nnx for rule in self.rules)
    for path in sorted(p for p, n in counts.items() if n > 1):
      problems.append(f'NNX leaf {path_str(path)} has two rules')
    for rule in self.rules:
      for key in rule.linen:
        if key in seen:
          problems.append(
              f'Linen leaf {path_str(key)} is used twice ({path_str(seen[key])}, {path_str(rule.nnx)})'
          )
        seen[key] = rule.nnx
    for key in self.dropped:
      if key in seen:
        problems.append(f'Linen leaf {path_str(key)} is both dropped and used')
    if problems:
      raise ValueError('Invalid mapping, every leaf must be used exactly once:\n  ' + '\n  '.join(problems))

  # --- views ---------------------------------------------------------------------------------

  @property
  def linen_keys(self) -> set[LinenKey]:
    return {key for rule in self.rules for key in rule.linen} | set(self.dropped)

  @property
  def nnx_paths(self) -> set[NNXPath]:
    return {rule.nnx for rule in self.rules}

  def only(self, collection: str) -> 'TreeMapping':
    """The rules (and dropped leaves) whose Linen leaves all live in `collection`."""
    rules = tuple(r for r in self.rules if all(key[0] == collection for key in r.linen))
    return TreeMapping(rules, tuple(k for k in self.dropped if k[0] == collection))

  # --- applying ------------------------------------------------------------------------------

  def linen_to_nnx(
      self, linen_flat: tp.Mapping[LinenKey, tp.Any], *, allow_lossy: bool = False
  ) -> dict[NNXPath, tp.Any]:
    """Flat Linen leaves -> flat NNX leaves; every Linen leaf must be used exactly once."""
    linen_flat = {normalize_path(k): v for k, v in linen_flat.items()}
    _check_keys(self.linen_keys, set(linen_flat), 'Linen leaf', 'mapping')
    if not allow_lossy:
      nonzero = [key for key in self.dropped if np.any(np.asarray(linen_flat[key]) != 0)]
      if nonzero:
        raise LossyConversionError(
            f'{", ".join(map(path_str, nonzero))} is not zero and the NNX model has no place '
            'for it, so the NNX model would compute something else. Pass allow_lossy=True '
            'to convert anyway.'
        )
    return {rule.nnx: self.build_nnx_leaf(rule, linen_flat) for rule in self.rules}

  @staticmethod
  def build_nnx_leaf(rule: LeafRule, linen_flat: tp.Mapping[LinenKey, tp.Any]) -> tp.Any:
    """The NNX leaf of one rule from the Linen leaves it names."""
    parts = [linen_flat[key] for key in rule.linen]
    if len(parts) == 1:
      return parts[0]
    return jnp.concatenate(parts, axis=rule.concat_axis)

  def nnx_to_linen(
      self,
      nnx_flat: tp.Mapping[NNXPath, tp.Any],
      dropped_like: tp.Mapping[LinenKey, tp.Any] | None = None,
  ) -> dict[LinenKey, tp.Any]:
    """Flat NNX leaves -> flat Linen leaves; fused leaves are split back into equal widths.

    Dropped Linen leaves come back as zeros shaped like `dropped_like[key]` (the Linen model's
    own abstract variables); without it a mapping that drops leaves cannot be inverted.
    """
    nnx_flat = {normalize_path(k): v for k, v in nnx_flat.items()}
    if dropped_like is not None:
      dropped_like = {normalize_path(k): v for k, v in dropped_like.items()}
    _check_keys(self.nnx_paths, set(nnx_flat), 'NNX leaf', 'mapping')
    out: dict[LinenKey, tp.Any] = {}
    for rule in self.rules:
      value = nnx_flat[rule.nnx]
      if len(rule.linen) == 1:
        out[rule.linen[0]] = value
      else:
        for key, part in zip(rule.linen, jnp.split(value, len(rule.linen), axis=rule.concat_axis)):
          out[key] = part
    for key in self.dropped:
      if dropped_like is None or key not in dropped_like:
        raise StateMismatchError(f'{path_str(key)} was dropped; its shape is needed to restore it')
      like = dropped_like[key]
      out[key] = jnp.zeros(like.shape, like.dtype)
    return out

  # --- JSON ----------------------------------------------------------------------------------

  def to_json(self) -> str:
    """`{"collection/linen/path": "nnx/path", ...}`; fused parts and dropped leaves as objects."""
    entries: dict[str, tp.Any] = {}
    for rule in self.rules:
      if len(rule.linen) == 1:
        entries[path_str(rule.linen[0])] = path_str(rule.nnx)
      else:
        for index, key in enumerate(rule.linen):
          entries[path_str(key)] = {
              'nnx': path_str(rule.nnx),
              'part': index,
              'of': len(rule.linen),
              'axis': rule.concat_axis,
          }
    for key in self.dropped:
      entries[path_str(key)] = None
    return json.dumps(dict(sorted(entries.items())), indent=2) + '\n'

  @classmethod
  def from_json(cls, text: str) -> 'TreeMapping':
    """Reads `to_json`'s format; a plain string value maps one leaf to one leaf."""
    entries = json.loads(text)
    if not isinstance(entries, dict):
      raise ValueError('a mapping file is a JSON object of "linen/path": "nnx/path" entries')
    simple, fused, dropped = [], {}, []
    for linen, target in entries.items():
      key = parse_path(linen)
      if target is None:
        dropped.append(key)
      elif isinstance(target, str):
        simple.append(LeafRule(parse_path(target), (key,)))
      elif isinstance(target, dict) and {'nnx', 'part', 'of', 'axis'} <= target.keys():
        group = fused.setdefault(parse_path(target['nnx']), {'of': target['of'], 'axis': target['axis'], 'parts': {}})
        group['parts'][int(target['part'])] = key
      else:
        raise ValueError(f'{linen}: expected an NNX path, null, or a {{"nnx", "part", "of", "axis"}} object')
    for nnx_path, group in fused.items():
      if sorted(group['parts']) != list(range(group['of'])):
        raise ValueError(f'{path_str(nnx_path)}: fused parts {sorted(group["parts"])} of {group["of"]}')
      parts = tuple(group['parts'][i] for i in range(group['of']))
      simple.append(LeafRule(nnx_path, parts, group['axis']))
    return cls(tuple(sorted(simple, key=lambda r: r.nnx)), tuple(sorted(dropped)))

  def save(self, path: str | os.PathLike[str]) -> None:
    """Writes the JSON form, for review or as an explicit override."""
    with open(path, 'w') as f:
      f.write(self.to_json())

  @classmethod
  def load(cls, path: str | os.PathLike[str]) -> 'TreeMapping':
    with open(path) as f:
      return cls.from_json(f.read())


def _check_keys(expected: set[tuple[str, ...]], given: set[tuple[str, ...]], what: str, where: str) -> None:
  missing = sorted(expected - given)
  extra = sorted(given - expected)
  if missing or extra:
    lines = [f'  {path_str(p)}: in the {where}, not given' for p in missing]
    lines += [f'  {path_str(p)}: given, not in the {where}' for p in extra]
    raise StateMismatchError(f'{what}s do not match the {where}:\n' + '\n'.join(lines))
