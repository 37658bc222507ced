"""Applies a layer row's declarative transforms to real values.

Weights: one Linen layer's variables ({collection: nested dict}) <-> the flat NNX state of the
matching NNX layer ({path: array}), exactly inverse to each other. Constructor: Linen kwargs plus
call inputs -> NNX kwargs, the same knowledge the codemod emits as code.
"""

from __future__ import annotations

import typing as tp
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from nnx_bridge.errors import LossyConversionError
from nnx_bridge.errors import StateMismatchError
from nnx_bridge.state_check import check_state
from nnx_bridge.layer_table import LayerSpec, Path
from nnx_bridge.treemap import LeafRule
from nnx_bridge.treemap import TreeMapping

Array = jax.Array
LinenPath = tuple[str, ...]  # (collection, *path)


def _show(path: tuple[tp.Any, ...]) -> str:
  return '/'.join(str(key) for key in path)


def row_mapping(spec: LayerSpec, linen_keys: tp.Iterable[LinenPath]) -> tuple[TreeMapping, list[str]]:
  """How one layer's Linen leaves `(collection, *path)` become its NNX leaves, per the row.

  Fused parts become one rule, dropped leaves `dropped`, the rest keep their path with the
  row's key renames, from the collection the row names. Returns the problems (a missing part,
  a leaf from the wrong collection, two leaves for one NNX path) instead of guessing.
  """
  params = spec.params
  rest = [tuple(key) for key in linen_keys]
  rules: list[LeafRule] = []
  dropped: list[LinenPath] = []
  problems: list[str] = []
  for fuse in params.fuse:
    keys = [(fuse.collection, *part) for part in fuse.parts]
    missing = [key for key in keys if key not in rest]
    if missing:
      problems += [f'missing {_show(key)} (fused into {_show(fuse.nnx_path)})' for key in missing]
      continue
    rest = [key for key in rest if key not in keys]
    rules.append(LeafRule(fuse.nnx_path, tuple(keys), fuse.axis))
  for drop in params.drop:
    key = (drop.collection, *drop.path)
    if key in rest:
      rest.remove(key)
      dropped.append(key)
    else:
      problems.append(f'missing {_show(key)} (the row drops it)')
  renames = dict(params.key_renames)
  taken = {rule.nnx for rule in rules}
  for collection, *path in rest:
    nnx_path = tuple(renames.get(key, key) for key in path)
    if params.collection(nnx_path) != collection:
      problems.append(
          f'extra {_show((collection, *path))} (this row takes {_show(nnx_path)} from '
          f'{params.collection(nnx_path)!r})'
      )
    elif nnx_path in taken:
      problems.append(f'extra {_show((collection, *path))} (two leaves for {_show(nnx_path)})')
    else:
      taken.add(nnx_path)
      rules.append(LeafRule(nnx_path, ((collection, *path),)))
  return TreeMapping(tuple(rules), tuple(dropped)), problems


def linen_to_nnx_params(
    spec: LayerSpec,
    linen_variables: Mapping[str, tp.Any],
    expected: Mapping[Path, tp.Any] | None = None,
    *,
    allow_lossy: bool = False,
) -> dict[Path, Array]:
  """Converts one Linen layer's variables to the flat NNX state of `spec.nnx`.

  `expected` (NNX path -> array or ShapeDtypeStruct, e.g. the NNX layer's own state) makes any
  missing, extra or mis-shaped leaf an error instead of a silently partial state. A Linen leaf
  the NNX layer has no place for (GRUCell's `hn/bias`) must be all zeros, or the conversion
  would change the outputs: it raises LossyConversionError unless `allow_lossy`.
  """
  flat: dict[LinenPath, tp.Any] = traverse_util.flatten_dict(linen_variables)
  mapping, problems = row_mapping(spec, flat)
  for rule in mapping.rules:
    if len(rule.linen) > 1 and len({np.shape(flat[key])[rule.concat_axis] for key in rule.linen}) != 1:
      problems.append(f'unequal widths fused into {_show(rule.nnx)}: cannot split back')
  if problems:
    raise StateMismatchError(f'{spec.linen} variables do not match the row: ' + '; '.join(problems))
  try:
    out = mapping.linen_to_nnx(flat, allow_lossy=allow_lossy)
  except LossyConversionError as error:
    raise LossyConversionError(f'{error} {spec.note}') from None
  if expected is not None:
    check_state(expected, out, context=f'{spec.nnx} state converted from {spec.linen}')
  return out


def nnx_to_linen_params(
    spec: LayerSpec,
    nnx_flat: Mapping[Path, tp.Any],
    expected: Mapping[LinenPath, tp.Any] | None = None,
) -> dict[str, dict[str, tp.Any]]:
  """Converts the flat NNX state of `spec.nnx` back to Linen variables (exact inverse).

  Fused leaves split into equal widths; dropped Linen leaves come back as zeros. `expected`
  ((collection, *path) -> array) checks the result leaf by leaf.
  """
  flat = dict(nnx_flat)
  params = spec.params
  out: dict[LinenPath, tp.Any] = {}
  problems: list[str] = []
  for fuse in params.fuse:
    if fuse.nnx_path not in flat:
      problems.append(f'missing {_show(fuse.nnx_path)}')
      continue
    value = flat.pop(fuse.nnx_path)
    if np.shape(value)[fuse.axis] % len(fuse.parts):
      problems.append(f'wrong {_show(fuse.nnx_path)}: width not divisible by {len(fuse.parts)}')
      continue
    for part, piece in zip(fuse.parts, jnp.split(value, len(fuse.parts), axis=fuse.axis)):
      out[(fuse.collection, *part)] = piece
  inverse = {new: old for old, new in params.key_renames}
  for path, leaf in flat.items():
    out[(params.collection(path), *(inverse.get(key, key) for key in path))] = leaf
  for drop in params.drop:
    like = out.get((drop.collection, *drop.zeros_like))
    if like is None:
      problems.append(f'missing {_show((drop.collection, *drop.zeros_like))} to shape the zeros')
    else:
      out[(drop.collection, *drop.path)] = jnp.zeros_like(like)
  if problems:
    raise StateMismatchError(f'{spec.nnx} state does not match the row: ' + '; '.join(problems))
  if expected is not None:
    check_state(expected, out, context=f'{spec.linen} variables converted from {spec.nnx}')
  return traverse_util.unflatten_dict(out)


def nnx_constructor_kwargs(
    spec: LayerSpec, linen_kwargs: Mapping[str, tp.Any], *call_inputs: tp.Any
) -> dict[str, tp.Any]:
  """The NNX constructor kwargs (all but `rngs`) for a Linen layer built with `linen_kwargs`.

  Renames kwargs, makes Linen defaults that NNX lacks explicit, drops Linen-only kwargs at their
  default (other values have no NNX meaning and raise ValueError) and fills the NNX size
  arguments from the call inputs' shapes.
  """
  if spec.nnx is None:
    raise ValueError(f'{spec.linen} has no NNX counterpart: {spec.note}')
  renames = dict(spec.arg_renames)
  linen_only = {kwarg.name: kwarg for kwarg in spec.linen_only}
  out: dict[str, tp.Any] = {renames.get(name, name): value for name, value in spec.linen_defaults}
  for name, value in linen_kwargs.items():
    kwarg = linen_only.get(name)
    if kwarg is None:
      out[renames.get(name, name)] = value
    elif kwarg.feeds is None and value != kwarg.default:
      raise ValueError(
          f'{spec.linen}({name}={value!r}) has no {spec.nnx} counterpart ({kwarg.note}); only '
          f'the default {kwarg.default!r} converts.'
      )
  shapes = tuple(tuple(x.shape) if hasattr(x, 'shape') else None for x in call_inputs)
  kwargs = dict(linen_kwargs)
  for name, source in spec.derived:
    value = source.evaluate(kwargs, shapes)
    if value is not None:
      out[name] = value
  return out
