"""The row types of the layer table (`nnx_bridge.layer_table`), plain data: stdlib only.

A `LayerSpec` says what it takes to turn one Linen layer class into its NNX counterpart (renamed
kwargs, sizes read off the call's inputs, parameter transforms, decode cache, ...), a
`WrapperSpec` a Linen layer that runs a row's layer it is given, a `ModeArgument` a Linen
argument that follows NNX's train/eval mode. The rows themselves, and the lookups over them,
are in `layer_table.py`, the one source of truth.
"""

from __future__ import annotations

import dataclasses


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


# --- Layer row types ---------------------------------------------------------------------------

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
class Window:
  """How a convolution (or a pooling) sizes the `len(window)` axes right before the last one.

  Each such axis of size `n`, with window `k` and stride `s` (1 by default), becomes `ceil(n / s)`
  with 'SAME' padding, `(n - k) // s + 1` with 'VALID', and `(n + lo + hi - k) // s + 1` with
  explicit `(lo, hi)` pads (or one int for both sides); the axes before them (batch) are kept.
  `window`, `strides`, `padding`: the Linen kwargs holding them. Valid only when none of the
  kwargs `unless` (dilations) is passed.
  """

  window: str
  strides: str = 'strides'
  padding: str = 'padding'
  default_padding: str = 'SAME'
  unless: tuple[str, ...] = ()

  @staticmethod
  def axis_code(n: str, k: int, s: int, padding: str | tuple[int, int]) -> str:
    """The code of one windowed axis's size from the code `n` of the input's."""
    if padding == 'SAME':
      return n if s == 1 else f'-(-({n}) // {s})'
    lo, hi = (0, 0) if padding == 'VALID' else padding
    body = f'{n} + {lo + hi - k}' if lo + hi - k > 0 else f'{n} - {k - lo - hi}' if lo + hi - k < 0 else n
    return f'{body} + 1' if s == 1 else f'({body}) // {s} + 1'


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
  output shape, when known (the codemod derives decode-cache shapes from it); `window` how a
  convolution sizes the axes before the last (the codemod follows example shapes through it); `cache` the
  layer's decode cache, if it has one; `exact` says whether
  converted weights reproduce Linen's outputs, `note` why not or what else to know, and
  `inexact` (for an inexact row) what differs, in one sentence the codemod's TODO quotes.
  `draws_dropout` says when a call draws from the 'dropout' rng stream: 'always', or the kwarg
  (`dropout_rate`) whose being set turns it on; None: never.
  `tied_kwargs`: for a layer the codemod converts when it is run with given params (`.apply({'params': ...}, x)`:
  a Dense as Linen's output projection through an embedding, `x @ w` with its bias off; a Conv with a kernel
  computed in the call, the convolution it runs), the constructor kwargs such a layer may have; empty: the codemod
  converts no such call.
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
  window: Window | None = None
  cache: DecodeCache | None = None
  exact: bool = True
  note: str = ''
  example: Example | None = None
  inexact: str = ''
  draws_dropout: str | None = None
  tied_kwargs: frozenset[str] = frozenset()


SAME_AS_INPUT = '<input>'
"""`LayerSpec.output_size` of layers whose output keeps the input's last axis (norms, Dropout)."""

LAST_AXIS_SIZES = ('in_features', 'num_features')
"""The NNX constructor arguments of table layers that are the last-axis size of the first call argument, kept as
attributes of the same name (`nnx.Linear.in_features`, `nnx.LayerNorm.num_features`): `nnx_bridge.size_probe`
reads them off a run of the call."""

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
