"""THE table of Linen -> NNX knowledge.

One frozen row per Linen layer, read by the runtime bridge, the codemod, the parity checker and
the checkpoint converter. It is plain data (stdlib only, classes named by dotted strings) so
the codemod can import it without importing jax; only `linen_fields` / `nnx_arguments` import
a layer's class, when called, to read its constructor's signature.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect


@dataclasses.dataclass(frozen=True)
class ModeArgument:
  """A Linen call or field argument whose value follows NNX's train/eval mode.

  `nnx_attribute` is the attribute that `nnx.Module.train()` / `.eval()` set on every
  submodule (`deterministic` or `use_running_average`, both True in eval mode); `inverted`
  is True for arguments that are True in *train* mode (`train=True`).
  """

  name: str
  nnx_attribute: str
  inverted: bool = False

  def value(self, nnx_attribute_value: bool) -> bool:
    """The argument's value given the NNX attribute's value."""
    return (not nnx_attribute_value) if self.inverted else nnx_attribute_value


MODE_ARGUMENTS: tuple[ModeArgument, ...] = (
    ModeArgument('deterministic', 'deterministic'),
    ModeArgument('use_running_average', 'use_running_average'),
    ModeArgument('train', 'deterministic', inverted=True),
    ModeArgument('training', 'deterministic', inverted=True),
    ModeArgument('is_training', 'deterministic', inverted=True),
)
"""Linen argument names that mean "train or eval"; `nnx.Module.train()` sets the attribute."""


# --- Layer rows --------------------------------------------------------------------------------

Path = tuple[str, ...]
Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class InputDim:
  """An NNX size argument read off a call input, `args[arg].shape[axis]` (NNX builds eagerly).

  With `optional`, it is left out when the call has no input `arg` (NNX's default applies).
  """

  arg: int
  axis: int = -1
  optional: bool = False

  def evaluate(self, linen_kwargs: dict[str, object], shapes: tuple[Shape | None, ...]) -> object:
    """The NNX argument's value given the input shapes, or None to leave it out."""
    shape = _input_shape(shapes, self.arg, self.optional)
    return None if shape is None else shape[self.axis]

  def describe(self, call_args: tuple[str, ...]) -> str:
    """A human-readable expression for docs."""
    text = f'{call_args[self.arg]}.shape[{self.axis}]'
    return f'{text} (if {call_args[self.arg]} is given)' if self.optional else text


@dataclasses.dataclass(frozen=True)
class InputDimsAt:
  """An NNX size argument read off a call input at the axes a Linen kwarg names (default `default`).

  An int axis gives an int, a sequence of axes a tuple; `as_mapping` gives `{axis: size}` (Linen
  DenseGeneral `batch_dims` -> NNX LinearGeneral `batch_axis`), left out when empty.
  """

  arg: int
  axes_kwarg: str
  default: int | tuple[int, ...]
  as_mapping: bool = False

  def evaluate(self, linen_kwargs: dict[str, object], shapes: tuple[Shape | None, ...]) -> object:
    """The NNX argument's value given the Linen kwargs and input shapes, or None to leave it out."""
    axes = linen_kwargs.get(self.axes_kwarg, self.default)
    if self.as_mapping and not axes:
      return None
    shape = _input_shape(shapes, self.arg, False)
    assert shape is not None
    if self.as_mapping:
      return {axis: shape[axis] for axis in axes}  # type: ignore[union-attr]
    if isinstance(axes, int):
      return shape[axes]
    return tuple(shape[axis] for axis in axes)  # type: ignore[union-attr]

  def describe(self, call_args: tuple[str, ...]) -> str:
    """A human-readable expression for docs."""
    x = call_args[self.arg]
    if self.as_mapping:
      return f'{{d: {x}.shape[d] for d in {self.axes_kwarg}}} (Linen default {self.default!r})'
    return f'{x}.shape at Linen `{self.axes_kwarg}` (default {self.default!r})'


@dataclasses.dataclass(frozen=True)
class EinsumBiasShape:
  """NNX Einsum's `bias_shape`: the kernel dims whose subscripts reach the output, as in Linen.

  Left out (no bias, NNX's default) when Linen `use_bias` is False; Linen's default is True.
  """

  einsum_kwarg: str = 'einsum_str'
  shape_kwarg: str = 'shape'
  use_bias_kwarg: str = 'use_bias'

  def evaluate(self, linen_kwargs: dict[str, object], shapes: tuple[Shape | None, ...]) -> object:
    """The bias shape given the Linen kwargs, or None when Linen has no bias."""
    if not linen_kwargs.get(self.use_bias_kwarg, True):
      return None
    einsum_str = linen_kwargs.get(self.einsum_kwarg)
    if not isinstance(einsum_str, str):
      raise ValueError(
          f'NNX Einsum needs `{self.einsum_kwarg}` in the constructor (Linen also allows it at '
          'call time); pass it to the Linen constructor to derive `bias_shape`.'
      )
    return einsum_bias_shape(einsum_str, linen_kwargs[self.shape_kwarg])  # type: ignore[arg-type]

  def describe(self, call_args: tuple[str, ...]) -> str:
    """A human-readable expression for docs."""
    return (
        f'dims of `{self.shape_kwarg}` whose `{self.einsum_kwarg}` kernel subscripts appear in the '
        f'output, if `{self.use_bias_kwarg}` (Linen default True); else no bias'
    )


SizeSource = InputDim | InputDimsAt | EinsumBiasShape


def _input_shape(shapes: tuple[Shape | None, ...], arg: int, optional: bool) -> Shape | None:
  shape = shapes[arg] if arg < len(shapes) else None
  if shape is None and not optional:
    raise ValueError(f'deriving an NNX size needs the shape of call argument {arg}; got {shapes!r}')
  return shape


def einsum_bias_shape(einsum_str: str, kernel_shape: tuple[int, ...]) -> Shape:
  """Linen Einsum's bias shape: the kernel dims whose subscripts reach the output, in order."""
  operands, _, result = einsum_str.replace(' ', '').partition('->')
  _, _, rhs = operands.partition(',')
  if '.' in rhs or len(rhs) != len(kernel_shape):
    raise ValueError(f'kernel subscripts {rhs!r} do not name the {len(kernel_shape)} kernel dims')
  return tuple(kernel_shape[rhs.index(c)] for c in result if c in rhs)


@dataclasses.dataclass(frozen=True)
class LinenOnlyKwarg:
  """A Linen constructor kwarg with no NNX counterpart.

  With `feeds`, its value is consumed by the derivation of that NNX argument; otherwise only
  Linen's `default` can be carried over (NNX always behaves that way) and other values are errors.
  """

  name: str
  default: object
  feeds: str | None = None
  note: str = ''


@dataclasses.dataclass(frozen=True)
class Fuse:
  """One NNX leaf made by concatenating Linen leaves of `collection` along `axis` in `parts` order.

  The inverse splits it back into `len(parts)` equal widths.
  """

  nnx_path: Path
  parts: tuple[Path, ...]
  collection: str = 'params'
  axis: int = -1


@dataclasses.dataclass(frozen=True)
class Drop:
  """A Linen leaf NNX has no place for: conversion discards it, the inverse restores zeros.

  The zeros take the shape and dtype of the Linen leaf `zeros_like` of the same collection.
  """

  path: Path
  zeros_like: Path
  collection: str = 'params'


@dataclasses.dataclass(frozen=True)
class ParamMap:
  """How one layer's Linen variables become its NNX state; the default is identity on 'params'.

  Leaves not fused or dropped keep their path with `key_renames` applied to each key; an NNX leaf
  comes from the Linen collection `collections` gives for its last key, else from 'params'.
  """

  key_renames: tuple[tuple[str, str], ...] = ()
  fuse: tuple[Fuse, ...] = ()
  drop: tuple[Drop, ...] = ()
  collections: tuple[tuple[str, str], ...] = ()

  def collection(self, nnx_path: Path) -> str:
    """The Linen collection the NNX leaf at `nnx_path` comes from."""
    for fuse in self.fuse:
      if fuse.nnx_path == nnx_path:
        return fuse.collection
    return dict(self.collections).get(nnx_path[-1], 'params')


@dataclasses.dataclass(frozen=True)
class OutputShape:
  """A layer's output shape in terms of its first input's: kept input axes, then new trailing axes.

  `keep` is 'leading' (every input axis but the last: Dense, norms, attention) or 'all' (Embed:
  every input axis). The trailing axes come from the first Linen kwarg of `trailing` that the
  construction passes (an int; also a tuple of ints when `tuple_ok`), or are the input's last
  axis at SAME_AS_INPUT. Valid only when none of the Linen kwargs `unless` is passed.
  """

  keep: str
  trailing: tuple[str, ...]
  tuple_ok: bool = False
  unless: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class DecodeCache:
  """A layer's autoregressive decode cache.

  Linen creates the `leaves` in the `cache` collection on the first call with its `switch`
  kwarg on (at init, shaped like that call's keys and values); NNX creates them in
  `method(input_shape, dtype)`, `input_shape` being the shape of the first call input of
  `shape_args` that the call passes.
  """

  leaves: tuple[str, ...]
  shape_args: tuple[int, ...] = (0,)
  switch: str = 'decode'
  method: str = 'init_cache'


@dataclasses.dataclass(frozen=True)
class ExampleArray:
  """A random example input: standard normal floats, or integers in [0, maxval) for an int dtype."""

  shape: Shape
  dtype: str = 'float32'
  maxval: int | None = None


@dataclasses.dataclass(frozen=True)
class ExampleCarry:
  """A random RNN carry shaped like the Linen cell's `initialize_carry(rng, args[like_arg].shape)`.

  Random rather than the zeros `initialize_carry` gives, so the hidden-state weights matter.
  """

  like_arg: int


@dataclasses.dataclass(frozen=True)
class Example:
  """Tiny Linen constructor kwargs and call inputs that exercise one row.

  `mode_argument` is the Linen call kwarg (one of MODE_ARGUMENTS) set for eval mode, matching
  NNX's `.eval()`; with `check_train` the train mode is also compared, including the updated
  non-'params' collections.
  """

  linen_kwargs: tuple[tuple[str, object], ...]
  inputs: tuple[ExampleArray | ExampleCarry, ...]
  mode_argument: str | None = None
  check_train: bool = False


@dataclasses.dataclass(frozen=True)
class LayerSpec:
  """What it takes to turn one Linen layer class into its NNX counterpart, as data.

  `call_args` names the Linen call's array inputs in positional order (the derivations index
  them); `linen_defaults` are Linen kwargs whose Linen default NNX must be given explicitly
  because NNX's own default behaves differently; `output_size` says what the output's last
  axis is, for following sizes through a chain of layers: the Linen kwarg that sets it
  ('features'), SAME_AS_INPUT, or None when not known statically; `output_shape` the whole
  output shape, when known (the codemod derives decode-cache shapes from it); `cache` the
  layer's decode cache, if it has one; `exact` says whether
  converted weights reproduce Linen's outputs, `note` why not or what else to know, and
  `inexact` (for an inexact row) what differs, in one sentence the codemod's TODO quotes.
  `draws_dropout` says when a call draws from the 'dropout' rng stream: 'always', or the kwarg
  (`dropout_rate`) whose being set turns it on; None: never.
  `tied_kwargs`: for a layer whose weight may be tied (`dense.apply({'params': {'kernel': w}}, x)`, Linen's
  output projection through an embedding), the constructor kwargs such a layer may have for the call to be
  `x @ w` (its bias off); empty: the codemod converts no such call.
  """

  linen: str
  nnx: str | None
  call_args: tuple[str, ...]
  arg_renames: tuple[tuple[str, str], ...] = ()
  derived: tuple[tuple[str, SizeSource], ...] = ()
  linen_defaults: tuple[tuple[str, object], ...] = ()
  linen_only: tuple[LinenOnlyKwarg, ...] = ()
  params: ParamMap = ParamMap()
  output_size: str | None = None
  output_shape: OutputShape | None = None
  cache: DecodeCache | None = None
  exact: bool = True
  note: str = ''
  example: Example | None = None
  inexact: str = ''
  draws_dropout: str | None = None
  tied_kwargs: frozenset[str] = frozenset()


SAME_AS_INPUT = '<input>'
"""`LayerSpec.output_size` of layers whose output keeps the input's last axis (norms, Dropout)."""

_IN = InputDim(0)
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
        linen_only=(
            LinenOnlyKwarg(
                'conv_general_dilated_cls', None, note='NNX takes `conv_general_dilated` only'
            ),
        ),
        example=Example(
            (('features', 3), ('kernel_size', (3, 3)), ('strides', (2, 1))),
            (ExampleArray((2, 5, 5, 2)),),
        ),
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


@dataclasses.dataclass(frozen=True)
class WrapperSpec:
  """A Linen layer that runs a table layer it is given (a cell) and owns no variables itself.

  The wrapped layer's variables are the cell row's: Linen keeps them at the cell's own path
  (`LSTMCell_0` beside the wrapper in an `@nn.compact` method, `<wrapper>/cell` when the
  wrapper is built in `setup`), NNX at `<wrapper>/<cell_attribute>`; the leaf mapping pairs the
  cell layers and applies the cell's row (`derive_mapping`). `cell_kwarg` is the constructor
  argument holding the cell, one of the Linen rows `cells`, built in the constructor call;
  `cell_inputs` says which wrapper call input feeds each cell call input (so the cell's derived
  sizes are read off the wrapper's inputs); the output's last axis is the cell's Linen kwarg
  `output_size`, unless a constructor or call kwarg of `output_unless` is passed. `linen_only`
  constructor kwargs and `linen_only_call` call kwargs have no NNX counterpart; the NNX
  wrapper takes no `rngs` when `rngs` is False (its default carry stream).
  """

  linen: str
  nnx: str
  call_args: tuple[str, ...]
  cell_kwarg: str
  cells: tuple[str, ...]
  cell_inputs: tuple[tuple[int, int], ...]
  cell_attribute: str
  output_size: str
  output_unless: tuple[str, ...] = ()
  linen_only: tuple[LinenOnlyKwarg, ...] = ()
  linen_only_call: tuple[str, ...] = ()
  rngs: bool = True
  note: str = ''


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
  """A Linen layer's constructor fields in positional order ('features', 'use_bias', ...), less parent/name."""
  return tuple(p for p in inspect.signature(_class_of(linen_name)).parameters if p not in ('parent', 'name'))


@functools.cache
def nnx_arguments(nnx_name: str) -> frozenset[str]:
  """The argument names an NNX layer's constructor accepts."""
  return frozenset(inspect.signature(_class_of(nnx_name).__init__).parameters)


def _class_of(dotted: str) -> type:
  module, _, name = dotted.rpartition('.')
  return getattr(importlib.import_module(module), name)


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
