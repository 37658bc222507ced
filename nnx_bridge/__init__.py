"""nnx_bridge: run Linen modules inside NNX models and NNX modules inside Linen ones."""

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
from nnx_bridge.linen_in_nnx import LinenModule as LinenModule
from nnx_bridge.linen_in_nnx import from_linen as from_linen
from nnx_bridge.nnx_in_linen import ToLinen as ToLinen
from nnx_bridge.nnx_in_linen import to_linen as to_linen
from nnx_bridge.layer_table import MODE_ARGUMENTS as MODE_ARGUMENTS
from nnx_bridge.layer_table import ModeArgument as ModeArgument
from nnx_bridge.parity import ParityReport as ParityReport
from nnx_bridge.parity import compare as compare
from nnx_bridge.transfer import linen_to_nnx as linen_to_nnx
from nnx_bridge.transfer import nnx_to_linen as nnx_to_linen
from nnx_bridge.transfer import optimizer_state_to_linen as optimizer_state_to_linen
from nnx_bridge.transfer import optimizer_state_to_nnx as optimizer_state_to_nnx
from nnx_bridge.treemap import LeafRule as LeafRule
from nnx_bridge.treemap import TreeMapping as TreeMapping

__version__ = '0.1.0'

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
    'register_collection',
    'to_linen',
    'variable_type',
]
