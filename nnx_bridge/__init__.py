"""nnx_bridge: run Linen modules inside NNX models and NNX modules inside Linen ones.

The public names are imported on first use (PEP 562), so that `import nnx_bridge.layer_table`
(plain data the codemod reads) does not import jax and flax.
"""

from __future__ import annotations

import importlib
import typing as tp

if tp.TYPE_CHECKING:
  from nnx_bridge.checkpoint_restore import restore_linen_checkpoint as restore_linen_checkpoint
  from nnx_bridge.collectionlib import collection_name as collection_name
  from nnx_bridge.collectionlib import register_collection as register_collection
  from nnx_bridge.collectionlib import variable_type as variable_type
  from nnx_bridge.derive import MappingError as MappingError
  from nnx_bridge.derive import derive_mapping as derive_mapping
  from nnx_bridge.derive import mapping_by_path as mapping_by_path
  from nnx_bridge.errors import BridgeError as BridgeError
  from nnx_bridge.errors import ImmutableCollectionError as ImmutableCollectionError
  from nnx_bridge.errors import LossyConversionError as LossyConversionError
  from nnx_bridge.errors import MissingRngError as MissingRngError
  from nnx_bridge.errors import StateMismatchError as StateMismatchError
  from nnx_bridge.layer_table import MODE_ARGUMENTS as MODE_ARGUMENTS
  from nnx_bridge.layer_table import ModeArgument as ModeArgument
  from nnx_bridge.linen_in_nnx import LinenModule as LinenModule
  from nnx_bridge.linen_in_nnx import from_linen as from_linen
  from nnx_bridge.nnx_in_linen import ToLinen as ToLinen
  from nnx_bridge.nnx_in_linen import is_instance as is_instance
  from nnx_bridge.nnx_in_linen import to_linen as to_linen
  from nnx_bridge.parity import ParityReport as ParityReport
  from nnx_bridge.parity import compare as compare
  from nnx_bridge.transfer import linen_to_nnx as linen_to_nnx
  from nnx_bridge.transfer import nnx_to_linen as nnx_to_linen
  from nnx_bridge.transfer import optimizer_state_to_linen as optimizer_state_to_linen
  from nnx_bridge.transfer import optimizer_state_to_nnx as optimizer_state_to_nnx
  from nnx_bridge.treemap import LeafRule as LeafRule
  from nnx_bridge.treemap import TreeMapping as TreeMapping

_DEFINED_IN = {
    'restore_linen_checkpoint': 'checkpoint_restore',
    'collection_name': 'collectionlib',
    'register_collection': 'collectionlib',
    'variable_type': 'collectionlib',
    'MappingError': 'derive',
    'derive_mapping': 'derive',
    'mapping_by_path': 'derive',
    'BridgeError': 'errors',
    'ImmutableCollectionError': 'errors',
    'LossyConversionError': 'errors',
    'MissingRngError': 'errors',
    'StateMismatchError': 'errors',
    'MODE_ARGUMENTS': 'layer_table',
    'ModeArgument': 'layer_table',
    'LinenModule': 'linen_in_nnx',
    'from_linen': 'linen_in_nnx',
    'ToLinen': 'nnx_in_linen',
    'to_linen': 'nnx_in_linen',
    'is_instance': 'nnx_in_linen',
    'ParityReport': 'parity',
    'compare': 'parity',
    'linen_to_nnx': 'transfer',
    'nnx_to_linen': 'transfer',
    'optimizer_state_to_linen': 'transfer',
    'optimizer_state_to_nnx': 'transfer',
    'LeafRule': 'treemap',
    'TreeMapping': 'treemap',
}
"""The submodule of `nnx_bridge` defining each public name."""

__all__ = [
    'LeafRule',
    'MappingError',
    'ParityReport',
    'TreeMapping',
    'compare',
    'derive_mapping',
    'linen_to_nnx',
    'mapping_by_path',
    'nnx_to_linen',
    'optimizer_state_to_linen',
    'optimizer_state_to_nnx',
    'BridgeError',
    'ImmutableCollectionError',
    'LinenModule',
    'LossyConversionError',
    'MODE_ARGUMENTS',
    'MissingRngError',
    'ModeArgument',
    'StateMismatchError',
    'ToLinen',
    'collection_name',
    'from_linen',
    'is_instance',
    'register_collection',
    'restore_linen_checkpoint',
    'to_linen',
    'variable_type',
]


def __getattr__(name: str) -> tp.Any:
  """Imports the submodule defining a public name on first use and caches the name here; `__version__` too (read
  from the installed distribution only when asked for)."""
  if name == '__version__':
    from nnx_bridge.distribution import package_version

    globals()[name] = package_version()
    return globals()[name]
  module = _DEFINED_IN.get(name)
  if module is None:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  value = getattr(importlib.import_module(f'{__name__}.{module}'), name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted({*globals(), *__all__})
