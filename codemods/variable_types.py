"""The NNX Variable type flax gives a Linen collection, as the code the rules write for it."""

from __future__ import annotations

import functools


@functools.cache
def flax_variable_type(collection: str) -> str | None:
  """'nnx.BatchStat' for 'batch_stats': flax's own Variable type for `collection`, else None.

  Reads flax's registry (`params` -> Param, `cache` -> Cache, ...); imports flax when called.
  """
  from flax import nnx
  from flax.nnx import variablelib

  typ = variablelib.VariableTypeCache.get(collection)
  return f'nnx.{typ.__name__}' if typ is not None and getattr(nnx, typ.__name__, None) is typ else None
