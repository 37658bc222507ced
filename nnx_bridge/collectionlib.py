"""Linen collection names <-> NNX Variable types.

A thin layer over flax's own registry (`nnx.register_variable_name` /
`nnx.variable_type_from_name`): the built-in rows (params->Param, batch_stats->BatchStat,
cache->Cache, intermediates->Intermediate, perturbations->Perturbation) come from flax. What
this module adds is that an unknown collection gets a *named* Variable subclass that lives in
this module, so the same collection maps to the same importable class in every process
(pickle, orbax metadata and `nnx.graphdef` comparisons keep working), where flax would create
an anonymous `type(name, (Variable,), {})`.
"""

from __future__ import annotations

import binascii
import typing as tp

from flax import nnx
from flax.nnx import variablelib

_PREFIX = 'Collection_'  # + the collection name, when it is a Python identifier
_HEX_PREFIX = 'CollectionHex_'  # + the hex-encoded UTF-8 name, otherwise

VariableType = type[nnx.Variable]


def _class_name(collection: str) -> str:
  if collection.isidentifier():
    return f'{_PREFIX}{collection}'
  return f'{_HEX_PREFIX}{binascii.hexlify(collection.encode()).decode()}'


def _collection_from_class_name(class_name: str) -> str | None:
  if class_name.startswith(_HEX_PREFIX):
    try:
      return binascii.unhexlify(class_name[len(_HEX_PREFIX):]).decode()
    except (binascii.Error, UnicodeDecodeError):
      return None
  if class_name.startswith(_PREFIX) and len(class_name) > len(_PREFIX):
    return class_name[len(_PREFIX):]
  return None


def _make_collection_type(collection: str) -> VariableType:
  name = _class_name(collection)
  cls = type(
      name,
      (nnx.Variable,),
      {
          '__module__': __name__,
          '__doc__': f'NNX Variable type for the Linen collection {collection!r}.',
      },
  )
  globals()[name] = cls
  return cls


def __getattr__(name: str) -> VariableType:
  """Re-creates a custom collection's class on import, so pickles made in another process load."""
  collection = _collection_from_class_name(name)
  if collection is not None:
    return variable_type(collection)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def variable_type(collection: str) -> VariableType:
  """Returns the NNX Variable type for a Linen collection, creating a named one if it is new."""
  if collection not in variablelib.VariableTypeCache:
    nnx.register_variable_name(collection, _make_collection_type(collection))
  return nnx.variable_type_from_name(collection)


def collection_name(var_type: VariableType) -> str:
  """Returns the Linen collection name of an NNX Variable type.

  A Variable subclass that was never registered maps to its registered parent's collection
  (a user's `class Counter(nnx.BatchStat)` lives in `batch_stats`); a type with no registered
  ancestor is an error, since inventing a collection name would silently change where the
  value lives in the Linen tree.
  """
  for cls in var_type.__mro__:
    for name, registered in variablelib.VariableTypeCache.items():
      if cls is registered:
        return name
  raise ValueError(
      f'Variable type {var_type.__qualname__} has no Linen collection. Register one with '
      f'nnx_bridge.register_collection("my_collection", {var_type.__qualname__}).'
  )


@tp.overload
def register_collection(collection: str, var_type: VariableType) -> VariableType: ...


@tp.overload
def register_collection(collection: str) -> tp.Callable[[VariableType], VariableType]: ...


def register_collection(collection: str, var_type: VariableType | None = None):
  """Maps a Linen collection to an NNX Variable type; usable as a class decorator.

  Registering a second type for a collection that already has one is an error: the mapping
  must stay one-to-one for round trips to be exact.
  """
  if var_type is None:
    return lambda cls: register_collection(collection, cls)
  existing = variablelib.VariableTypeCache.get(collection)
  if existing is not None and existing is not var_type:
    raise ValueError(
        f'Collection {collection!r} is already mapped to {existing.__qualname__}; '
        f'cannot map it to {var_type.__qualname__} as well.'
    )
  for name, registered in variablelib.VariableTypeCache.items():
    if registered is var_type and name != collection:
      raise ValueError(
          f'{var_type.__qualname__} is already the type of collection {name!r}; '
          f'one Variable type maps to one collection.'
      )
  if existing is None:
    nnx.register_variable_name(collection, var_type)
  return var_type
