"""Linen variables tree <-> NNX state, for one module's variables.

Linen groups variables by collection first (`{'params': {'Dense_0': {'kernel': ...}}}`); NNX
groups them by module, each leaf a Variable whose type says its collection (`Dense_0/kernel`
is a `Param`, BatchNorm's `mean` a `BatchStat` beside its `scale`). Metadata boxes
(`nn.Partitioned`, `nn.LogicallyPartitioned`, ...) become Variable metadata and come back as
the same box. A name used by several collections at one module path (legal in Linen) keeps its
plain name in `params` and is stored as `"<collection>:<name>"` for every other collection, so
the mapping is one-to-one and round trips are exact.
"""

from __future__ import annotations

import copy
import dataclasses
import typing as tp

import jax
from flax import nnx
from flax.core import meta
from flax.nnx import traversals
from flax.nnx.bridge import variables as flax_bridge_variables

from nnx_bridge import collectionlib

Path = tuple[str, ...]
LinenVariables = tp.Mapping[str, tp.Mapping[str, tp.Any]]


def _is_box(_: tp.Any, x: tp.Any) -> bool:
  return isinstance(x, meta.AxisMetadata)


def _mesh_is_set() -> bool:
  return not jax.sharding.get_abstract_mesh().empty


def raw_value(leaf: tp.Any) -> tp.Any:
  """A Linen leaf's array, out of its metadata box without applying sharding constraints.

  (`unbox()` of a `LogicallyPartitioned` under a mesh constrains the value, which fails on
  abstract values and moves data on concrete ones.)
  """
  while isinstance(leaf, meta.AxisMetadata):
    leaf = leaf.value if hasattr(leaf, 'value') else leaf.unbox()
  return leaf


def unboxed(variables: tp.Any) -> tp.Any:
  """A Linen variables tree with every metadata box replaced by its raw array."""
  return jax.tree.map(raw_value, variables, is_leaf=lambda x: isinstance(x, meta.AxisMetadata))


def to_variable(collection: str, value: tp.Any) -> nnx.Variable:
  """One Linen leaf (raw, or in a metadata box) as an NNX Variable of its collection's type."""
  var_type = collectionlib.variable_type(collection)
  if not isinstance(value, meta.AxisMetadata):
    return var_type(value)
  # On a copy: flax 0.12.8's LogicallyPartitioned.to_nnx_metadata pops `names` out of the box
  # itself, which would corrupt the caller's Linen variables.
  box = copy.copy(value)
  metadata = dict(box.to_nnx_metadata() if hasattr(box, 'to_nnx_metadata') else vars(box))
  raw = metadata.pop('value')
  if metadata.get('out_sharding') is not None and not _mesh_is_set():
    # Eager sharding needs a mesh; without one the metadata is kept and applied later
    # (`nnx.get_partition_spec` + `jax.device_put`), as Linen leaves placement to jit.
    metadata['eager_sharding'] = False
  return var_type(raw, linen_meta_type=type(value), **metadata)


def to_linen_leaf(variable: nnx.Variable) -> tp.Any:
  """An NNX Variable as a Linen leaf: the box it came from; `nn.Partitioned` for plain sharding
  names; flax's `NNXMeta` for other metadata; else the bare value."""
  metadata = dict(variable.get_metadata())
  box_type = metadata.pop('linen_meta_type', None)
  value = variable.get_value()
  if box_type is not None:
    if hasattr(box_type, 'from_nnx_metadata'):
      return box_type.from_nnx_metadata({'value': value, **metadata})
    fields = {f.name for f in dataclasses.fields(box_type)}
    return box_type(**{k: v for k, v in {'value': value, **metadata}.items() if k in fields})
  sharding = metadata.get('out_sharding')
  extra = metadata.keys() - nnx.Variable.required_metadata - {'out_sharding', 'mesh'}
  if isinstance(sharding, (tuple, jax.sharding.PartitionSpec)) and not extra:
    return meta.Partitioned(value, names=tuple(sharding), mesh=metadata.get('mesh'))
  return flax_bridge_variables.to_linen_var(variable)


def nnx_path_of(collection: str, linen_path: Path, shared: bool) -> Path:
  """The NNX path of a Linen leaf; `shared` when another collection uses the same path."""
  if shared and collection != 'params':
    return (*linen_path[:-1], f'{collection}:{linen_path[-1]}')
  return linen_path


def linen_path_of(collection: str, nnx_path: Path) -> Path:
  """Inverse of `nnx_path_of`."""
  prefix = f'{collection}:'
  if nnx_path[-1].startswith(prefix):
    return (*nnx_path[:-1], nnx_path[-1][len(prefix):])
  return nnx_path


def flat_linen_variables(variables: LinenVariables) -> dict[tuple[str, Path], tp.Any]:
  """`{(collection, path): leaf}`, keeping metadata boxes as leaves."""
  return {
      (collection, tuple(path)): leaf
      for collection, tree in variables.items()
      for path, leaf in traversals.flatten_mapping(tree, is_leaf=_is_box).items()
  }


def nnx_paths(keys: tp.Iterable[tuple[str, Path]]) -> dict[tuple[str, Path], Path]:
  """NNX path for each `(collection, linen_path)`."""
  keys = list(keys)
  owners: dict[Path, int] = {}
  for _, path in keys:
    owners[path] = owners.get(path, 0) + 1
  return {(c, p): nnx_path_of(c, p, owners[p] > 1) for c, p in keys}


def linen_to_nnx_state(variables: LinenVariables) -> nnx.State:
  """A Linen variables tree as an `nnx.State` of typed Variables, grouped per module."""
  flat = flat_linen_variables(variables)
  paths = nnx_paths(flat)
  return nnx.State(
      traversals.unflatten_mapping(
          {paths[key]: to_variable(key[0], leaf) for key, leaf in flat.items()}
      )
  )


def nnx_to_linen_variables(state: tp.Mapping[str, tp.Any], *, boxed: bool = True) -> dict[str, tp.Any]:
  """An NNX state (nested mapping of Variables) as a Linen variables tree.

  With `boxed=False` leaves are raw arrays, which is what `Module.apply` needs at run time.
  """
  flat: dict[tuple[str, ...], tp.Any] = {}
  for path, variable in traversals.flatten_mapping(
      state, is_leaf=lambda _, x: isinstance(x, nnx.Variable)
  ).items():
    if not isinstance(variable, nnx.Variable):
      raise TypeError(f'{"/".join(map(str, path))} is not an nnx.Variable: {type(variable).__name__}')
    collection = collectionlib.collection_name(type(variable))
    leaf = to_linen_leaf(variable) if boxed else variable.get_value()
    flat[(collection, *linen_path_of(collection, tuple(map(str, path))))] = leaf
  return traversals.unflatten_mapping(flat)
