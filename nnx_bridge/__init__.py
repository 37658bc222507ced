"""nnx_bridge: run Linen modules inside NNX models and NNX modules inside Linen ones."""

from nnx_bridge.collectionlib import collection_name as collection_name
from nnx_bridge.collectionlib import register_collection as register_collection
from nnx_bridge.collectionlib import variable_type as variable_type
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

__version__ = '0.1.0'

__all__ = [
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
