"""THE table of Linen -> NNX knowledge.

One frozen row per Linen layer, read by the runtime bridge, the codemod, the parity checker and
the checkpoint converter. It is plain data (stdlib only, classes named by dotted strings) so
the codemod can import it without importing jax; only `linen_fields` / `nnx_arguments` import
a layer's class, when called, to read the signature of a class it has no row for. The row types
are defined in `layer_spec.py` and exported from here with the rows and the lookups.
"""

from __future__ import annotations

import functools

from nnx_bridge.layer_signatures import LINEN_FIELDS
from nnx_bridge.layer_signatures import NNX_ARGUMENTS
from nnx_bridge.layer_signatures import installed_linen_fields
from nnx_bridge.layer_signatures import installed_nnx_arguments
from nnx_bridge.layer_spec import DecodeCache
from nnx_bridge.layer_spec import Drop
from nnx_bridge.layer_spec import EinsumBiasShape
from nnx_bridge.layer_spec import Example
from nnx_bridge.layer_spec import ExampleArray
from nnx_bridge.layer_spec import ExampleCarry
from nnx_bridge.layer_spec import Fuse
from nnx_bridge.layer_spec import InputDim
from nnx_bridge.layer_spec import InputDimsAt
from nnx_bridge.layer_spec import LayerSpec
from nnx_bridge.layer_spec import LinenOnlyKwarg
from nnx_bridge.layer_spec import ModeArgument
from nnx_bridge.layer_spec import OutputShape
from nnx_bridge.layer_spec import ParamMap
from nnx_bridge.layer_spec import Path
from nnx_bridge.layer_spec import SAME_AS_INPUT
from nnx_bridge.layer_spec import Shape
from nnx_bridge.layer_spec import SizeSource
from nnx_bridge.layer_spec import Window
from nnx_bridge.layer_spec import WrapperSpec
from nnx_bridge.layer_spec import einsum_bias_shape

__all__ = [
  'LAYERS',
  'MODE_ARGUMENTS',
  'SAME_AS_INPUT',
  'WRAPPERS',
  'DecodeCache',
  'Drop',
  'EinsumBiasShape',
  'Example',
  'ExampleArray',
  'ExampleCarry',
  'Fuse',
  'InputDim',
  'InputDimsAt',
  'LayerSpec',
  'LinenOnlyKwarg',
  'ModeArgument',
  'OutputShape',
  'ParamMap',
  'Path',
  'Shape',
  'SizeSource',
  'WrapperSpec',
  'einsum_bias_shape',
  'find_layer',
  'find_layer_of_class',
  'find_wrapper',
  'linen_fields',
  'nnx_arguments',
  'render_markdown',
]

MODE_ARGUMENTS: tuple[ModeArgument, ...] = (
    ModeArgument('deterministic', 'deterministic'),
    ModeArgument('use_running_average', 'use_running_average'),
    ModeArgument('train', 'deterministic', inverted=True),
    ModeArgument('training', 'deterministic', inverted=True),
    ModeArgument('is_training', 'deterministic', inverted=True),
)
"""Linen argument names that mean "train or eval"; `nnx.Module.train()` sets the attribute."""


# --- Layer rows --------------------------------------------------------------------------------

_IN = InputDim(0)
# Attributes a Linen layer and its NNX twin hold under one name with one value (`conv.dtype`): converted code may read
# them off either as it is.
SHARED_LAYER_ATTRIBUTES = frozenset({'dtype', 'param_dtype', 'precision'})
_FLOAT32_REDUCTIONS = LinenOnlyKwarg(
    'force_float32_reductions', True, note='NNX always reduces in at least float32'
)
_ATTENTION_ONLY = (
    LinenOnlyKwarg('force_fp32_for_softmax', False, note='NNX has no such switch'),
    LinenOnlyKwarg('qk_attn_weights_einsum_cls', None, note='NNX takes `attention_fn` only'),
    LinenOnlyKwarg('attn_weights_value_einsum_cls', None, note='NNX takes `attention_fn` only'),
)
_ATTENTION_DEFAULTS = (('decode', False),)
_ATTENTION_SHAPE = OutputShape('leading', ('out_features', SAME_AS_INPUT))
_ATTENTION_CACHE_LEAVES = ('cached_key', 'cached_value', 'cache_index')
_ATTENTION_PARAMS = ParamMap(collections=tuple((leaf, 'cache') for leaf in _ATTENTION_CACHE_LEAVES))
_SAME_SHAPE = OutputShape('leading', (SAME_AS_INPUT,))
_CELL_NOTE = (
    ' Linen `carry_init` belongs in NNX `initialize_carry(..., carry_init=)` (NNX warns when it'
    ' is given to the constructor).'
)
_GATES = ('i', 'f', 'g', 'o')
_GRU_GATES = ('r', 'z', 'n')


_CELL_EXAMPLE = Example((('features', 4),), (ExampleCarry(like_arg=1), ExampleArray((2, 3))))
_CELL_SIZES: tuple[tuple[str, SizeSource], ...] = (('in_features', InputDim(1)),)
_ATTENTION_EXAMPLE_KWARGS = (('num_heads', 2), ('qkv_features', 8), ('out_features', 5))

LAYERS: tuple[LayerSpec, ...] = (
    LayerSpec(
        'flax.linen.Dense',
        'flax.nnx.Linear',
        output_size='features',
        output_shape=OutputShape('leading', ('features',)),
        call_args=('inputs',),
        arg_renames=(('features', 'out_features'),),
        derived=(('in_features', _IN),),
        linen_only=(LinenOnlyKwarg('dot_general_cls', None, note='NNX takes `dot_general` only'),),
        example=Example((('features', 3),), (ExampleArray((2, 4)),)),
        tied_kwargs=frozenset({'features', 'use_bias', 'dtype', 'param_dtype', 'precision', 'kernel_init',
                               'bias_init'}),
    ),
    LayerSpec(
        'flax.linen.DenseGeneral',
        'flax.nnx.LinearGeneral',
        call_args=('inputs',),
        output_shape=OutputShape('leading', ('features',), tuple_ok=True, unless=('axis', 'batch_dims')),
        arg_renames=(('features', 'out_features'),),
        derived=(
            ('in_features', InputDimsAt(0, 'axis', -1)),
            ('batch_axis', InputDimsAt(0, 'batch_dims', (), as_mapping=True)),
        ),
        linen_only=(
            LinenOnlyKwarg('batch_dims', (), feeds='batch_axis', note='NNX wants each batch size'),
        ),
        example=Example(
            (('features', (2, 3)), ('axis', (-2, -1)), ('batch_dims', (0,))),
            (ExampleArray((3, 2, 4, 5)),),
        ),
    ),
    LayerSpec(
        'flax.linen.Conv',
        'flax.nnx.Conv',
        output_size='features',
        call_args=('inputs',),
        arg_renames=(('features', 'out_features'),),
        derived=(('in_features', _IN),),
        window=Window('kernel_size', unless=('input_dilation', 'kernel_dilation')),
        linen_only=(
            LinenOnlyKwarg(
                'conv_general_dilated_cls', None, note='NNX takes `conv_general_dilated` only'
            ),
        ),
        example=Example(
            (('features', 3), ('kernel_size', (3, 3)), ('strides', (2, 1))),
            (ExampleArray((2, 5, 5, 2)),),
        ),
        tied_kwargs=frozenset({'features', 'kernel_size', 'strides', 'padding', 'feature_group_count', 'use_bias',
                               'dtype', 'param_dtype', 'precision', 'kernel_init', 'bias_init'}),
    ),
    LayerSpec(
        'flax.linen.ConvTranspose',
        'flax.nnx.ConvTranspose',
        output_size='features',
        call_args=('inputs',),
        arg_renames=(('features', 'out_features'),),
        derived=(('in_features', _IN),),
        example=Example(
            (('features', 3), ('kernel_size', (3, 3)), ('strides', (2, 2))),
            (ExampleArray((2, 4, 4, 2)),),
        ),
    ),
    LayerSpec(
        'flax.linen.Embed',
        'flax.nnx.Embed',
        output_size='features',
        output_shape=OutputShape('all', ('features',)),
        call_args=('inputs',),
        example=Example(
            (('num_embeddings', 7), ('features', 3)),
            (ExampleArray((2, 5), 'int32', maxval=7),),
        ),
    ),
    LayerSpec(
        'flax.linen.LayerNorm',
        'flax.nnx.LayerNorm',
        output_size=SAME_AS_INPUT,
        output_shape=_SAME_SHAPE,
        call_args=('x',),
        derived=(('num_features', InputDimsAt(0, 'feature_axes', -1)),),
        linen_only=(_FLOAT32_REDUCTIONS,),
        note='NNX takes a single feature axis (`num_features` is an int).',
        example=Example((), (ExampleArray((2, 3, 4)),)),
    ),
    LayerSpec(
        'flax.linen.RMSNorm',
        'flax.nnx.RMSNorm',
        output_size=SAME_AS_INPUT,
        output_shape=_SAME_SHAPE,
        call_args=('x',),
        derived=(('num_features', InputDimsAt(0, 'feature_axes', -1)),),
        linen_only=(_FLOAT32_REDUCTIONS,),
        note='NNX takes a single feature axis (`num_features` is an int).',
        example=Example((), (ExampleArray((2, 3, 4)),)),
    ),
    LayerSpec(
        'flax.linen.GroupNorm',
        'flax.nnx.GroupNorm',
        output_size=SAME_AS_INPUT,
        output_shape=_SAME_SHAPE,
        call_args=('x',),
        derived=(('num_features', _IN),),
        linen_only=(_FLOAT32_REDUCTIONS,),
        example=Example((('num_groups', 2),), (ExampleArray((2, 3, 4)),)),
    ),
    LayerSpec(
        'flax.linen.BatchNorm',
        'flax.nnx.BatchNorm',
        output_size=SAME_AS_INPUT,
        output_shape=_SAME_SHAPE,
        call_args=('x',),
        derived=(('num_features', InputDimsAt(0, 'axis', -1)),),
        linen_only=(_FLOAT32_REDUCTIONS,),
        params=ParamMap(collections=(('mean', 'batch_stats'), ('var', 'batch_stats'))),
        note=(
            'mean/var move from the Linen `batch_stats` collection to BatchStat leaves beside'
            ' scale/bias. Linen `use_running_average` defaults to None (must be given), NNX to'
            ' False; NNX `.eval()`/`.train()` set it.'
        ),
        example=Example(
            (('momentum', 0.9),),
            (ExampleArray((4, 3)),),
            mode_argument='use_running_average',
            check_train=True,
        ),
    ),
    LayerSpec(
        'flax.linen.Dropout',
        'flax.nnx.Dropout',
        draws_dropout='always',
        output_size=SAME_AS_INPUT,
        output_shape=_SAME_SHAPE,
        call_args=('inputs',),
        note=(
            'Linen `deterministic` defaults to None, NNX to False; NNX needs `rngs` (constructor'
            ' or call) in train mode, and its masks differ from Linen\'s, so only eval mode is'
            ' compared.'
        ),
        example=Example(
            (('rate', 0.5),), (ExampleArray((2, 4)),), mode_argument='deterministic'
        ),
    ),
    LayerSpec(
        'flax.linen.MultiHeadDotProductAttention',
        'flax.nnx.MultiHeadAttention',
        call_args=('inputs_q', 'inputs_k', 'inputs_v'),
        derived=(
            ('in_features', _IN),
            ('in_kv_features', InputDim(1, optional=True)),
        ),
        linen_defaults=_ATTENTION_DEFAULTS,
        linen_only=_ATTENTION_ONLY,
        params=_ATTENTION_PARAMS,
        draws_dropout='dropout_rate',
        output_shape=_ATTENTION_SHAPE,
        cache=DecodeCache(_ATTENTION_CACHE_LEAVES, shape_args=(1, 0)),
        note=(
            'NNX keys and values share `in_kv_features`. NNX `decode` defaults to None, which'
            ' raises at call time unless set. With `decode`, Linen creates the `cache` collection'
            ' at init; NNX creates the same leaves in `init_cache(inputs_k.shape)` (inputs_q when'
            ' there are no inputs_k), which must be called before decoding.'
        ),
        example=Example(
            _ATTENTION_EXAMPLE_KWARGS,
            (ExampleArray((2, 3, 4)), ExampleArray((2, 5, 6))),
            mode_argument='deterministic',
        ),
    ),
    LayerSpec(
        'flax.linen.SelfAttention',
        'flax.nnx.MultiHeadAttention',
        call_args=('inputs_q',),
        derived=(('in_features', _IN),),
        linen_defaults=_ATTENTION_DEFAULTS,
        linen_only=_ATTENTION_ONLY,
        params=_ATTENTION_PARAMS,
        draws_dropout='dropout_rate',
        output_shape=_ATTENTION_SHAPE,
        cache=DecodeCache(_ATTENTION_CACHE_LEAVES),
        note=(
            'Linen deprecates SelfAttention; NNX MultiHeadAttention called with one input. With'
            ' `decode`, NNX creates the `cache` leaves in `init_cache(inputs_q.shape)`.'
        ),
        example=Example(
            _ATTENTION_EXAMPLE_KWARGS, (ExampleArray((2, 3, 4)),), mode_argument='deterministic'
        ),
    ),
    LayerSpec(
        'flax.linen.Einsum',
        'flax.nnx.Einsum',
        call_args=('inputs',),
        arg_renames=(('shape', 'kernel_shape'),),
        derived=(('bias_shape', EinsumBiasShape()),),
        linen_only=(
            LinenOnlyKwarg(
                'use_bias', True, feeds='bias_shape', note='NNX has a bias only given `bias_shape`'
            ),
        ),
        note=(
            'Linen has a bias by default, NNX none unless `bias_shape` is given. NNX needs'
            ' `einsum_str` in the constructor; Linen also allows it at call time.'
        ),
        example=Example(
            (('shape', (4, 2, 3)), ('einsum_str', 'abc,cde->abde')),
            (ExampleArray((2, 3, 4)),),
        ),
    ),
    LayerSpec(
        'flax.linen.LSTMCell',
        'flax.nnx.LSTMCell',
        call_args=('carry', 'inputs'),
        arg_renames=(('features', 'hidden_features'),),
        derived=_CELL_SIZES,
        params=ParamMap(key_renames=(('if', 'if_'),)),
        note=(
            '`if` is a Python keyword, so NNX names that gate `if_`. Fresh inits differ: Linen'
            ' `recurrent_kernel_init` defaults to orthogonal, NNX to modified_orthogonal.'
            + _CELL_NOTE
        ),
        example=_CELL_EXAMPLE,
    ),
    LayerSpec(
        'flax.linen.OptimizedLSTMCell',
        'flax.nnx.OptimizedLSTMCell',
        call_args=('carry', 'inputs'),
        arg_renames=(('features', 'hidden_features'),),
        derived=_CELL_SIZES,
        params=ParamMap(
            fuse=(
                Fuse(('dense_i', 'kernel'), tuple((f'i{g}', 'kernel') for g in _GATES)),
                Fuse(('dense_h', 'kernel'), tuple((f'h{g}', 'kernel') for g in _GATES)),
                Fuse(('dense_h', 'bias'), tuple((f'h{g}', 'bias') for g in _GATES)),
            )
        ),
        note=(
            'Linen keeps 8 gate layers (input ones without bias); NNX fuses them into'
            ' `dense_i`/`dense_h` in i, f, g, o order.' + _CELL_NOTE
        ),
        example=_CELL_EXAMPLE,
    ),
    LayerSpec(
        'flax.linen.GRUCell',
        'flax.nnx.GRUCell',
        call_args=('carry', 'inputs'),
        arg_renames=(('features', 'hidden_features'),),
        derived=_CELL_SIZES,
        params=ParamMap(
            fuse=(
                Fuse(('dense_i', 'kernel'), tuple((f'i{g}', 'kernel') for g in _GRU_GATES)),
                Fuse(('dense_i', 'bias'), tuple((f'i{g}', 'bias') for g in _GRU_GATES)),
                Fuse(('dense_h', 'kernel'), tuple((f'h{g}', 'kernel') for g in _GRU_GATES)),
            ),
            drop=(Drop(('hn', 'bias'), zeros_like=('in', 'bias')),),
        ),
        exact=False,
        inexact=(
            'NNX GRUCell has no b_hn (Linen\'s `hn` bias, applied inside r * (W_hn h + b_hn)), so'
            ' the outputs differ unless it is zero (flax issue #5594); nnx_bridge.linen_to_nnx'
            ' refuses a nonzero one unless allow_lossy=True'
        ),
        note=(
            'NNX fuses r, z, n into `dense_i` (with bias) and `dense_h` (without); Linen\'s `hn`'
            ' bias b_hn, applied inside r * (W_hn h + b_hn), has no NNX counterpart and is dropped,'
            ' so a trained Linen GRU (b_hn != 0) cannot be converted exactly (flax issue #5594).'
            + _CELL_NOTE
        ),
        example=_CELL_EXAMPLE,
    ),
)
"""One row per supported Linen layer class."""


_RNN_LIFT = 'NNX RNN lifts the cell with nnx.scan; pass `state_axes` / `broadcast_rngs` instead'
WRAPPERS: tuple[WrapperSpec, ...] = (
    WrapperSpec(
        'flax.linen.RNN',
        'flax.nnx.RNN',
        call_args=('inputs',),
        cell_kwarg='cell',
        cells=('flax.linen.LSTMCell', 'flax.linen.OptimizedLSTMCell', 'flax.linen.GRUCell'),
        cell_inputs=((1, 0),),
        cell_attribute='cell',
        output_size='features',
        output_unless=('return_carry',),
        linen_only=(
            LinenOnlyKwarg('variable_axes', {}, note=_RNN_LIFT),
            LinenOnlyKwarg('variable_broadcast', 'params', note=_RNN_LIFT),
            LinenOnlyKwarg('variable_carry', False, note=_RNN_LIFT),
            LinenOnlyKwarg('split_rngs', {'params': False}, note=_RNN_LIFT),
        ),
        linen_only_call=('init_key',),
        rngs=False,
        note=(
            'Sizes: the cell\'s `in_features` is the last axis of the RNN\'s `inputs`. Linen'
            ' initialises the carry from a fixed key (`init_key` defaults to key 0); NNX RNN'
            ' without `rngs` from its own fixed stream. Parameters: the cell row\'s; NNX keeps'
            ' the cell at `<rnn>/cell`, Linen at the cell\'s own path (`LSTMCell_0` in an'
            ' `@nn.compact` method, `<rnn>/cell` in `setup`).'
        ),
    ),
)
"""Linen layers that wrap a table row's layer (RNN around a cell)."""

_DEFINED_IN = {
    'linear': ('Dense', 'DenseGeneral', 'Conv', 'ConvTranspose', 'Embed', 'Einsum'),
    'normalization': ('LayerNorm', 'RMSNorm', 'GroupNorm', 'BatchNorm'),
    'stochastic': ('Dropout',),
    'attention': ('MultiHeadDotProductAttention', 'SelfAttention'),
    'recurrent': ('LSTMCell', 'OptimizedLSTMCell', 'GRUCell'),
}
"""The flax.linen submodule defining each row's class, so the long import paths resolve too."""

_BY_NAME = {spec.linen: spec for spec in LAYERS}
_BY_NAME |= {
    f'flax.linen.{module}.{name}': _BY_NAME[f'flax.linen.{name}']
    for module, names in _DEFINED_IN.items()
    for name in names
}


_WRAPPERS_BY_NAME = {spec.linen: spec for spec in WRAPPERS}
_WRAPPERS_BY_NAME |= {f'flax.linen.recurrent.{spec.linen.rpartition(".")[2]}': spec for spec in WRAPPERS}


def find_wrapper(linen_name: str) -> WrapperSpec | None:
  """The wrapper row for a dotted Linen class name, 'flax.linen.RNN' or 'flax.linen.recurrent.RNN'."""
  return _WRAPPERS_BY_NAME.get(linen_name)


def find_layer(linen_name: str) -> LayerSpec | None:
  """The row for a dotted Linen class name, 'flax.linen.Dense' or 'flax.linen.linear.Dense'."""
  return _BY_NAME.get(linen_name)


def find_layer_of_class(cls: type) -> LayerSpec | None:
  """The row of a Linen class, or of its nearest base class that has one with an NNX counterpart."""
  for base in cls.__mro__:
    spec = find_layer(f'{base.__module__}.{base.__qualname__}')
    if spec is not None and spec.nnx is not None:
      return spec
  return None


@functools.cache
def linen_fields(linen_name: str) -> tuple[str, ...]:
  """A Linen layer's constructor fields in positional order ('features', 'use_bias', ...), less parent/name.

  Recorded for the table's classes (`layer_signatures`), so the codemod does not import flax for them.
  """
  row = find_layer(linen_name) or find_wrapper(linen_name)
  recorded = LINEN_FIELDS.get(row.linen) if row is not None else None
  return recorded if recorded is not None else installed_linen_fields(linen_name)


@functools.cache
def nnx_arguments(nnx_name: str) -> frozenset[str]:
  """The argument names an NNX layer's constructor accepts (recorded for the table's classes)."""
  recorded = NNX_ARGUMENTS.get(nnx_name)
  return recorded if recorded is not None else installed_nnx_arguments(nnx_name)


# --- Markdown ----------------------------------------------------------------------------------


def _code(text: object) -> str:
  return f'`{text}`'


def _slash(path: Path) -> str:
  return '/'.join(path)


def _describe_params(params: ParamMap) -> str:
  parts = [f'{_code(old)} -> {_code(new)}' for old, new in params.key_renames]
  for fuse in params.fuse:
    joined = ', '.join(_code(_slash(p)) for p in fuse.parts)
    parts.append(f'{_code(_slash(fuse.nnx_path))} = concat({joined}; axis {fuse.axis})')
  parts += [f'{_code(_slash(d.path))} dropped (inverse: zeros)' for d in params.drop]
  parts += [f'{_code(leaf)} from {_code(col)}' for leaf, col in params.collections]
  return '; '.join(parts) if parts else 'identity'


def _describe_kwargs(spec: LayerSpec) -> str:
  parts = [f'{_code(old)} -> {_code(new)}' for old, new in spec.arg_renames]
  parts += [f'{_code(f"{name}={value!r}")} made explicit' for name, value in spec.linen_defaults]
  return ', '.join(parts) or '-'


def _describe_linen_only(kwarg: LinenOnlyKwarg) -> str:
  text = f'{_code(kwarg.name)} (Linen default {kwarg.default!r})'
  if kwarg.feeds:
    text += f' feeds {_code(kwarg.feeds)}'
  return f'{text}: {kwarg.note}' if kwarg.note else text


def _describe_output(spec: LayerSpec) -> str:
  if spec.output_size == SAME_AS_INPUT:
    return "the input's"
  return f'`{spec.output_size}`' if spec.output_size else 'not derived'


def _wrapper_row(spec: WrapperSpec) -> str:
  cells = [
      _code(spec.linen),
      _code(spec.nnx),
      f'{_code(spec.cell_kwarg)}: one of ' + ', '.join(_code(c) for c in spec.cells),
      ', '.join(
          f'cell {_code(_BY_NAME[spec.cells[0]].call_args[cell])} = {_code(spec.call_args[arg])}'
          for cell, arg in spec.cell_inputs
      ),
      f'the cell\'s {_code(spec.output_size)}'
      + (f' (unless {", ".join(_code(k) for k in spec.output_unless)})' if spec.output_unless else ''),
      '; '.join([*(_describe_linen_only(k) for k in spec.linen_only),
                 *(f'call {_code(k)}' for k in spec.linen_only_call)]) or '-',
      spec.note or '-',
  ]
  return '| ' + ' | '.join(cell.replace('|', '\\|') for cell in cells) + ' |'


def _row(spec: LayerSpec) -> str:
  cells = [
      _code(spec.linen),
      _code(spec.nnx) if spec.nnx else 'none',
      _describe_kwargs(spec),
      '; '.join(f'{_code(n)} = {s.describe(spec.call_args)}' for n, s in spec.derived) or '-',
      _describe_output(spec),
      '; '.join(_describe_linen_only(k) for k in spec.linen_only) or '-',
      _describe_params(spec.params),
      'yes' if spec.exact else '**no**',
      spec.note or '-',
  ]
  return '| ' + ' | '.join(cell.replace('|', '\\|') for cell in cells) + ' |'


def render_markdown() -> str:
  """The Markdown table of LAYERS in docs/layer_table.md, generated so the doc cannot drift."""
  header = (
      '# Linen -> NNX layer table\n\n'
      'Generated by `nnx_bridge.layer_table.render_markdown()`; do not edit by hand.'
      ' Paths are relative to one layer; NNX leaves come from the Linen `params` collection'
      ' unless stated.\n\n'
      '| Linen | NNX | Renamed kwargs | Derived NNX sizes | Output last axis | Linen-only kwargs'
      ' | Param transforms | Exact | Note |\n'
      '|---|---|---|---|---|---|---|---|---|\n'
  )
  wrappers = (
      '\n## Wrappers\n\n'
      'Layers that run a cell from the table above and own no variables: the cell row converts'
      ' the parameters.\n\n'
      '| Linen | NNX | Cell | Cell inputs | Output last axis | Linen-only kwargs | Note |\n'
      '|---|---|---|---|---|---|---|\n'
  )
  return (
      header + '\n'.join(_row(spec) for spec in LAYERS) + '\n'
      + wrappers + '\n'.join(_wrapper_row(spec) for spec in WRAPPERS) + '\n'
  )
