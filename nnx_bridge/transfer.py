"""Strict state transfer between a Linen variables tree and an NNX model, through a TreeMapping.

Every leaf is used exactly once; a missing, extra, wrong-shape or wrong-dtype leaf is one error
naming the NNX paths and their Linen sources. Integer and string keys are the same key
(`nnx.List` children come back from orbax as strings). The NNX model's rng state is not part of
a Linen tree and is left as the model has it. Optimizer state follows the parameters: an optax
state of a Linen TrainState maps onto `nnx.Optimizer` state and back.
"""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp
from flax import nnx
from flax import traverse_util

from nnx_bridge import collectionlib
from nnx_bridge import linen_state
from nnx_bridge.errors import StateMismatchError
from nnx_bridge.state_check import check_state
from nnx_bridge.treemap import LinenKey
from nnx_bridge.treemap import NNXPath
from nnx_bridge.treemap import TreeMapping
from nnx_bridge.treemap import normalize_path
from nnx_bridge.treemap import path_str

_NOT_RNG = nnx.All(nnx.Variable, nnx.Not(nnx.RngState))  # raw array attributes are constants, not state


def flat_linen(variables: tp.Mapping[str, tp.Any]) -> dict[LinenKey, tp.Any]:
  """`{(collection, *path): array}` with metadata boxes removed and keys as strings."""
  return {
      normalize_path(key): value
      for key, value in traverse_util.flatten_dict(linen_state.unboxed(dict(variables))).items()
  }


def flat_nnx_variables(node: tp.Any) -> dict[NNXPath, nnx.Variable]:
  """`{path: Variable}` of an NNX module or optimizer, rng state excluded, keys as strings."""
  return {
      normalize_path(path): variable
      for path, variable in nnx.to_flat_state(nnx.state(node, _NOT_RNG))
  }


def _mapping_or_same_paths(mapping: TreeMapping | None, variables, nnx_model) -> TreeMapping:
  if mapping is not None:
    return mapping
  from nnx_bridge import derive  # imported here: derive traces models and imports much more

  return derive.mapping_by_path(variables, nnx.state(nnx_model, _NOT_RNG))


def _sources(mapping: TreeMapping, nnx_paths: tp.Iterable[NNXPath]) -> str:
  by_nnx = {rule.nnx: rule.linen for rule in mapping.rules}
  lines = [
      f'  {path_str(p)} <- {", ".join(map(path_str, by_nnx[p]))}'
      for p in sorted(nnx_paths) if p in by_nnx
  ]
  return '\nLinen sources of those NNX leaves:\n' + '\n'.join(lines) if lines else ''


def _checked(expected: dict[NNXPath, tp.Any], given: dict[NNXPath, tp.Any], mapping: TreeMapping, context: str):
  try:
    check_state(expected, given, context=context)
  except StateMismatchError as error:
    raise StateMismatchError(f'{error}{_sources(mapping, expected.keys() | given.keys())}') from None


def _set(variable: nnx.Variable, value: tp.Any) -> None:
  """Sets a Variable's value, keeping the sharding of the array it holds."""
  current = variable.get_value()
  sharding = getattr(current, 'sharding', None)
  if isinstance(current, jax.Array) and sharding is not None:
    value = jax.device_put(value, sharding)
  variable.set_value(value)


def linen_to_nnx(
    variables: tp.Mapping[str, tp.Any],
    nnx_model: nnx.Module,
    mapping: TreeMapping | None = None,
    *,
    allow_lossy: bool = False,
) -> nnx.Module:
  """Writes a Linen variables tree into `nnx_model` in place (and returns it).

  Without `mapping` the per-module layouts must already agree (`derive.mapping_by_path`);
  derive one for differently named ports with `derive.derive_mapping`.
  """
  linen = flat_linen(variables)
  targets = flat_nnx_variables(nnx_model)
  mapping = _mapping_or_same_paths(mapping, variables, nnx_model)
  converted = mapping.linen_to_nnx(linen, allow_lossy=allow_lossy)
  _checked(
      {path: var.get_value() for path, var in targets.items()},
      converted,
      mapping,
      f'The Linen variables do not fit {type(nnx_model).__name__}',
  )
  for path, variable in targets.items():
    _set(variable, converted[path])
  return nnx_model


def nnx_to_linen(
    nnx_model: nnx.Module,
    mapping: TreeMapping | None = None,
    *,
    linen_abstract_variables: tp.Mapping[str, tp.Any] | None = None,
) -> dict[str, tp.Any]:
  """The NNX model's state as a Linen variables tree (raw arrays), through `mapping`.

  Without `mapping` the tree follows the model's own per-module layout, regrouped by collection.
  `linen_abstract_variables` (e.g. `jax.eval_shape` of Linen `init`) gives the shapes of Linen
  leaves the mapping drops, and checks the result.
  """
  variables = flat_nnx_variables(nnx_model)
  nnx_flat = {path: var.get_value() for path, var in variables.items()}
  abstract = flat_linen(linen_abstract_variables) if linen_abstract_variables is not None else None
  if mapping is None:
    flat = {
        (collectionlib.collection_name(type(var)), *path): nnx_flat[path]
        for path, var in variables.items()
    }
  else:
    flat = mapping.nnx_to_linen(nnx_flat, dropped_like=abstract)
  if abstract is not None:
    check_state(abstract, flat, context=f'{type(nnx_model).__name__} state does not fit the Linen variables')
  return traverse_util.unflatten_dict(flat)


# --- optimizer state --------------------------------------------------------------------------


def split_at_params(path: tuple[str, ...], param_suffixes: set[tuple[str, ...]]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
  """(prefix, params path) when the leaf sits in a params-shaped subtree of an optax state."""
  for start in range(len(path)):
    if path[start:] in param_suffixes:
      return path[:start], path[start:]
  return None


def optimizer_state_to_nnx(
    opt_state: tp.Any,
    optimizer: nnx.Optimizer,
    mapping: TreeMapping,
    *,
    step: tp.Any | None = None,
) -> nnx.Optimizer:
  """Writes a Linen-side optax state (e.g. `TrainState.opt_state`) into `optimizer` in place.

  Every params-shaped subtree (Adam's `mu` and `nu`, ...) is converted with the mapping's
  `params` rules; other leaves (`count`) keep their path. `step` is the TrainState's step.
  """
  params = mapping.only('params')
  suffixes = {key[1:] for key in params.linen_keys}
  groups: dict[tuple[str, ...], dict[LinenKey, tp.Any]] = {}
  converted: dict[NNXPath, tp.Any] = {}
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
    path = normalize_path(keypath)
    split = split_at_params(path, suffixes)
    if split is None:
      converted[('opt_state', *path)] = leaf
    else:
      groups.setdefault(split[0], {})[('params', *split[1])] = leaf
  for prefix, flat in groups.items():
    for nnx_path, value in params.linen_to_nnx(flat, allow_lossy=True).items():
      converted[('opt_state', *prefix, *nnx_path)] = value
  targets = {
      path: var for path, var in flat_nnx_variables(optimizer).items()
      if path[0] == 'opt_state' or (path == ('step',) and step is not None)
  }
  if step is not None:  # TrainState keeps a Python int; nnx.Optimizer a uint32 counter
    converted[('step',)] = jnp.asarray(step, dtype=targets[('step',)].get_value().dtype)
  _checked(
      {path: var.get_value() for path, var in targets.items()},
      converted,
      params,
      'The optax state does not fit the nnx.Optimizer',
  )
  for path, variable in targets.items():
    _set(variable, converted[path])
  return optimizer


def optimizer_state_to_linen(optimizer: nnx.Optimizer, mapping: TreeMapping, opt_state_like: tp.Any) -> tp.Any:
  """The `nnx.Optimizer` state as an optax state shaped like `opt_state_like` (e.g. `tx.init(params)`)."""
  params = mapping.only('params')
  suffixes = {key[1:] for key in params.linen_keys}
  nnx_flat = {path: var.get_value() for path, var in flat_nnx_variables(optimizer).items()}
  leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(opt_state_like)
  paths = [normalize_path(keypath) for keypath, _ in leaves_with_paths]
  splits = [split_at_params(path, suffixes) for path in paths]
  linen_by_prefix: dict[tuple[str, ...], dict[LinenKey, tp.Any]] = {}
  for prefix in {s[0] for s in splits if s is not None}:
    sub = {
        path[len(prefix) + 1:]: value for path, value in nnx_flat.items()
        if path[:len(prefix) + 1] == ('opt_state', *prefix)
    }
    sub = {p: v for p, v in sub.items() if p in params.nnx_paths}
    linen_by_prefix[prefix] = params.nnx_to_linen(sub)
  leaves = []
  for path, split in zip(paths, splits):
    if split is None:
      key = ('opt_state', *path)
      if key not in nnx_flat:
        raise StateMismatchError(f'{path_str(key)}: not in the nnx.Optimizer state')
      leaves.append(nnx_flat[key])
    else:
      leaves.append(linen_by_prefix[split[0]][('params', *split[1])])
  return jax.tree_util.tree_unflatten(treedef, leaves)
