"""The constructor signatures of the layer table's classes, recorded so that the codemod reads them without
importing flax (which imports jax); `tests/nnx_bridge/test_layer_table.py` checks them against the installed flax.

`layer_table.linen_fields` / `nnx_arguments` read them, and a class the table has no row for off the
installed class (`installed_linen_fields` / `installed_nnx_arguments`, which import it).
"""

from __future__ import annotations

import importlib
import inspect
import typing as tp

LINEN_FIELDS: dict[str, tuple[str, ...]] = {
    'flax.linen.BatchNorm': (
        'use_running_average', 'axis', 'momentum', 'epsilon', 'dtype', 'param_dtype', 'use_bias', 'use_scale',
        'bias_init', 'scale_init', 'axis_name', 'axis_index_groups', 'use_fast_variance',
        'force_float32_reductions'
    ),
    'flax.linen.Conv': (
        'features', 'kernel_size', 'strides', 'padding', 'input_dilation', 'kernel_dilation',
        'feature_group_count', 'use_bias', 'mask', 'dtype', 'param_dtype', 'precision', 'kernel_init',
        'bias_init', 'promote_dtype', 'conv_general_dilated', 'conv_general_dilated_cls'
    ),
    'flax.linen.ConvTranspose': (
        'features', 'kernel_size', 'strides', 'padding', 'kernel_dilation', 'use_bias', 'mask', 'dtype',
        'param_dtype', 'precision', 'kernel_init', 'bias_init', 'transpose_kernel', 'promote_dtype',
        'preferred_element_type'
    ),
    'flax.linen.Dense': (
        'features', 'use_bias', 'dtype', 'param_dtype', 'precision', 'kernel_init', 'bias_init',
        'promote_dtype', 'dot_general', 'dot_general_cls'
    ),
    'flax.linen.DenseGeneral': (
        'features', 'axis', 'batch_dims', 'use_bias', 'dtype', 'param_dtype', 'kernel_init', 'bias_init',
        'precision', 'promote_dtype', 'dot_general', 'dot_general_cls'
    ),
    'flax.linen.Dropout': (
        'rate', 'broadcast_dims', 'deterministic', 'rng_collection'
    ),
    'flax.linen.Einsum': (
        'shape', 'einsum_str', 'use_bias', 'dtype', 'param_dtype', 'precision', 'kernel_init', 'bias_init',
        'promote_dtype', 'preferred_element_type'
    ),
    'flax.linen.Embed': (
        'num_embeddings', 'features', 'dtype', 'param_dtype', 'embedding_init', 'promote_dtype'
    ),
    'flax.linen.GRUCell': (
        'features', 'gate_fn', 'activation_fn', 'kernel_init', 'recurrent_kernel_init', 'bias_init', 'dtype',
        'param_dtype', 'carry_init'
    ),
    'flax.linen.GroupNorm': (
        'num_groups', 'group_size', 'epsilon', 'dtype', 'param_dtype', 'use_bias', 'use_scale', 'bias_init',
        'scale_init', 'reduction_axes', 'axis_name', 'axis_index_groups', 'use_fast_variance',
        'force_float32_reductions'
    ),
    'flax.linen.LSTMCell': (
        'features', 'gate_fn', 'activation_fn', 'kernel_init', 'recurrent_kernel_init', 'bias_init', 'dtype',
        'param_dtype', 'carry_init'
    ),
    'flax.linen.LayerNorm': (
        'epsilon', 'dtype', 'param_dtype', 'use_bias', 'use_scale', 'bias_init', 'scale_init', 'reduction_axes',
        'feature_axes', 'axis_name', 'axis_index_groups', 'use_fast_variance', 'force_float32_reductions'
    ),
    'flax.linen.MultiHeadDotProductAttention': (
        'num_heads', 'dtype', 'param_dtype', 'qkv_features', 'out_features', 'broadcast_dropout',
        'dropout_rate', 'deterministic', 'precision', 'kernel_init', 'out_kernel_init', 'bias_init',
        'out_bias_init', 'use_bias', 'attention_fn', 'decode', 'normalize_qk', 'force_fp32_for_softmax',
        'qkv_dot_general', 'out_dot_general', 'qkv_dot_general_cls', 'out_dot_general_cls',
        'qk_attn_weights_einsum_cls', 'attn_weights_value_einsum_cls'
    ),
    'flax.linen.OptimizedLSTMCell': (
        'features', 'gate_fn', 'activation_fn', 'kernel_init', 'recurrent_kernel_init', 'bias_init', 'dtype',
        'param_dtype', 'carry_init'
    ),
    'flax.linen.RMSNorm': (
        'epsilon', 'dtype', 'param_dtype', 'use_scale', 'scale_init', 'reduction_axes', 'feature_axes',
        'axis_name', 'axis_index_groups', 'use_fast_variance', 'force_float32_reductions'
    ),
    'flax.linen.RNN': (
        'cell', 'time_major', 'return_carry', 'reverse', 'keep_order', 'unroll', 'variable_axes',
        'variable_broadcast', 'variable_carry', 'split_rngs'
    ),
    'flax.linen.SelfAttention': (
        'num_heads', 'dtype', 'param_dtype', 'qkv_features', 'out_features', 'broadcast_dropout',
        'dropout_rate', 'deterministic', 'precision', 'kernel_init', 'out_kernel_init', 'bias_init',
        'out_bias_init', 'use_bias', 'attention_fn', 'decode', 'normalize_qk', 'force_fp32_for_softmax',
        'qkv_dot_general', 'out_dot_general', 'qkv_dot_general_cls', 'out_dot_general_cls',
        'qk_attn_weights_einsum_cls', 'attn_weights_value_einsum_cls'
    ),
}
"""Each Linen layer's constructor fields in positional order, less `parent` and `name`."""

NNX_ARGUMENTS: dict[str, frozenset[str]] = {
    'flax.nnx.BatchNorm': frozenset((
        'axis', 'axis_index_groups', 'axis_name', 'bias_init', 'bias_metadata', 'dtype', 'epsilon', 'momentum',
        'num_features', 'param_dtype', 'promote_dtype', 'rngs', 'scale_init', 'scale_metadata', 'self',
        'use_bias', 'use_fast_variance', 'use_running_average', 'use_scale'
    )),
    'flax.nnx.Conv': frozenset((
        'bias_init', 'bias_metadata', 'conv_general_dilated', 'dtype', 'feature_group_count', 'in_features',
        'input_dilation', 'kernel_dilation', 'kernel_init', 'kernel_metadata', 'kernel_size', 'mask',
        'out_features', 'padding', 'param_dtype', 'precision', 'preferred_element_type', 'promote_dtype',
        'rngs', 'self', 'strides', 'use_bias'
    )),
    'flax.nnx.ConvTranspose': frozenset((
        'bias_init', 'bias_metadata', 'dtype', 'in_features', 'kernel_dilation', 'kernel_init',
        'kernel_metadata', 'kernel_size', 'mask', 'out_features', 'padding', 'param_dtype', 'precision',
        'preferred_element_type', 'promote_dtype', 'rngs', 'self', 'strides', 'transpose_kernel', 'use_bias'
    )),
    'flax.nnx.Dropout': frozenset((
        'broadcast_dims', 'deterministic', 'rate', 'rng_collection', 'rngs', 'self'
    )),
    'flax.nnx.Einsum': frozenset((
        'bias_init', 'bias_metadata', 'bias_shape', 'dtype', 'einsum_op', 'einsum_str', 'kernel_init',
        'kernel_metadata', 'kernel_shape', 'param_dtype', 'precision', 'preferred_element_type',
        'promote_dtype', 'rngs', 'self'
    )),
    'flax.nnx.Embed': frozenset((
        'dtype', 'embedding_init', 'embedding_metadata', 'features', 'num_embeddings', 'param_dtype',
        'promote_dtype', 'rngs', 'self'
    )),
    'flax.nnx.GRUCell': frozenset((
        'activation_fn', 'bias_init', 'bias_metadata', 'carry_init', 'dtype', 'gate_fn', 'hidden_features',
        'in_features', 'keep_rngs', 'kernel_init', 'kernel_metadata', 'param_dtype', 'promote_dtype',
        'recurrent_kernel_init', 'recurrent_kernel_metadata', 'rngs', 'self'
    )),
    'flax.nnx.GroupNorm': frozenset((
        'axis_index_groups', 'axis_name', 'bias_init', 'bias_metadata', 'dtype', 'epsilon', 'group_size',
        'num_features', 'num_groups', 'param_dtype', 'promote_dtype', 'reduction_axes', 'rngs', 'scale_init',
        'scale_metadata', 'self', 'use_bias', 'use_fast_variance', 'use_scale'
    )),
    'flax.nnx.LSTMCell': frozenset((
        'activation_fn', 'bias_init', 'bias_metadata', 'carry_init', 'dtype', 'gate_fn', 'hidden_features',
        'in_features', 'keep_rngs', 'kernel_init', 'kernel_metadata', 'param_dtype', 'promote_dtype',
        'recurrent_kernel_init', 'recurrent_kernel_metadata', 'rngs', 'self'
    )),
    'flax.nnx.LayerNorm': frozenset((
        'axis_index_groups', 'axis_name', 'bias_init', 'bias_metadata', 'dtype', 'epsilon', 'feature_axes',
        'num_features', 'param_dtype', 'promote_dtype', 'reduction_axes', 'rngs', 'scale_init',
        'scale_metadata', 'self', 'use_bias', 'use_fast_variance', 'use_scale'
    )),
    'flax.nnx.Linear': frozenset((
        'bias_init', 'bias_metadata', 'dot_general', 'dtype', 'in_features', 'kernel_init', 'kernel_metadata',
        'out_features', 'param_dtype', 'precision', 'preferred_element_type', 'promote_dtype', 'rngs', 'self',
        'use_bias'
    )),
    'flax.nnx.LinearGeneral': frozenset((
        'axis', 'batch_axis', 'bias_init', 'bias_metadata', 'dot_general', 'dot_general_cls', 'dtype',
        'in_features', 'kernel_init', 'kernel_metadata', 'out_features', 'param_dtype', 'precision',
        'preferred_element_type', 'promote_dtype', 'rngs', 'self', 'use_bias'
    )),
    'flax.nnx.MultiHeadAttention': frozenset((
        'attention_fn', 'bias_init', 'bias_metadata', 'broadcast_dropout', 'decode', 'deterministic',
        'dropout_rate', 'dtype', 'in_features', 'in_kv_features', 'keep_rngs', 'kernel_init', 'kernel_metadata',
        'key_ln_scale_metadata', 'ln_promote_dtype', 'normalize_qk', 'num_heads', 'num_kv_heads',
        'out_bias_init', 'out_bias_metadata', 'out_dot_general', 'out_dot_general_cls', 'out_features',
        'out_kernel_init', 'out_kernel_metadata', 'out_promote_dtype', 'param_dtype', 'precision',
        'qkv_dot_general', 'qkv_dot_general_cls', 'qkv_features', 'qkv_promote_dtype',
        'query_ln_scale_metadata', 'rngs', 'self', 'use_bias'
    )),
    'flax.nnx.OptimizedLSTMCell': frozenset((
        'activation_fn', 'bias_init', 'bias_metadata', 'carry_init', 'dtype', 'gate_fn', 'hidden_features',
        'in_features', 'keep_rngs', 'kernel_init', 'kernel_metadata', 'param_dtype', 'promote_dtype',
        'recurrent_kernel_init', 'recurrent_kernel_metadata', 'rngs', 'self'
    )),
    'flax.nnx.RMSNorm': frozenset((
        'axis_index_groups', 'axis_name', 'dtype', 'epsilon', 'feature_axes', 'num_features', 'param_dtype',
        'promote_dtype', 'reduction_axes', 'rngs', 'scale_init', 'scale_metadata', 'self', 'use_fast_variance',
        'use_scale'
    )),
    'flax.nnx.RNN': frozenset((
        'broadcast_rngs', 'cell', 'keep_order', 'return_carry', 'reverse', 'rngs', 'self', 'state_axes',
        'time_major', 'unroll'
    )),
}
"""The argument names each NNX layer's constructor accepts."""


LINEN_CALL_PARAMS: dict[str, tuple[str, ...]] = {
    'flax.linen.BatchNorm': ('x', 'use_running_average'),
    'flax.linen.Dropout': ('inputs', 'deterministic', 'rng'),
    'flax.linen.Einsum': ('inputs', 'einsum_str'),
    'flax.linen.SelfAttention': ('inputs_q', 'mask', 'deterministic', 'dropout_rng', 'sow_weights'),
}
"""The parameters a Linen layer's `__call__` takes by position, where they go beyond the table's `call_args` (the
layer inputs): `self.dropout(h, deterministic)` gives `deterministic` by position."""


STATELESS: frozenset[str] = frozenset({'flax.linen.Dropout'})
"""The table's Linen layers that hold no variables (their `init` gives none): built where Linen would not build
them (under a train/eval test), they change no state."""


NNX_CALL_MODES: dict[str, frozenset[str]] = {
    'flax.nnx.BatchNorm': frozenset({'use_running_average'}),
    'flax.nnx.Dropout': frozenset({'deterministic'}),
    'flax.nnx.MultiHeadAttention': frozenset({'deterministic'}),
}
"""The train/eval arguments (`MODE_ARGUMENTS` under their own name) each NNX layer's `__call__` takes, overriding the
attribute `model.train()` / `model.eval()` set for that call."""


def installed_nnx_call_modes(nnx_name: str, modes: tp.Collection[str]) -> frozenset[str]:
  """Which of the train/eval argument names `modes` an NNX layer's `__call__` takes, read off the installed class."""
  return frozenset(inspect.signature(_class_of(nnx_name).__call__).parameters) & frozenset(modes)


def installed_linen_call_params(linen_name: str) -> tuple[str, ...]:
  """A Linen layer's `__call__` parameters that may be given by position, read off the installed class."""
  parameters = list(inspect.signature(_class_of(linen_name).__call__).parameters.values())[1:]
  return tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def installed_linen_fields(linen_name: str) -> tuple[str, ...]:
  """A Linen layer's constructor fields in positional order, less parent/name, read off the installed class."""
  return tuple(p for p in inspect.signature(_class_of(linen_name)).parameters if p not in ('parent', 'name'))


def installed_linen_default(linen_name: str, field: str) -> tp.Any:
  """The default of a Linen layer's constructor field, read off the installed class; `inspect.Parameter.empty` when
  it has none (or no such field)."""
  parameter = inspect.signature(_class_of(linen_name)).parameters.get(field)
  return parameter.default if parameter is not None else inspect.Parameter.empty


def installed_nnx_arguments(nnx_name: str) -> frozenset[str]:
  """The argument names an NNX layer's constructor accepts, read off the installed class."""
  return frozenset(inspect.signature(_class_of(nnx_name).__init__).parameters)


def _class_of(dotted: str) -> type:
  module, _, name = dotted.rpartition('.')
  return getattr(importlib.import_module(module), name)
