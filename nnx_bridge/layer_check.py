"""Verifies each layer row by running Linen and NNX side by side on its example.

The Linen layer is initialised, its weights replaced by random "trained" values (so zero biases
or a zero carry cannot hide a wrong mapping), converted with the row's transforms into a fresh
NNX layer, and both are run on the same inputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import typing as tp
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util

from nnx_bridge.errors import LossyConversionError
from nnx_bridge.errors import StateMismatchError
from nnx_bridge.layer_params import linen_to_nnx_params, nnx_constructor_kwargs
from nnx_bridge.layer_table import LAYERS, MODE_ARGUMENTS, Example, ExampleArray, LayerSpec

TOLERANCE = 1e-5
"""Largest absolute output difference that still counts as a match."""

_WEIGHTS = nnx.Not(nnx.RngState)  # every NNX leaf a Linen variable must set


@dataclasses.dataclass(frozen=True)
class LayerCheck:
  """The outcome of checking one row: exact rows pass on a match, inexact on a mismatch."""

  linen: str
  nnx: str | None
  max_abs_diff: float
  expected_exact: bool
  passed: bool
  detail: str


@contextlib.contextmanager
def _quiet_self_attention() -> tp.Iterator[None]:
  """Silences Linen's SelfAttention deprecation warning, which that row triggers by design."""
  with warnings.catch_warnings():
    warnings.filterwarnings('ignore', 'SelfAttention will be deprecated', DeprecationWarning)
    yield


def _resolve(dotted: str) -> tp.Any:
  module, _, name = dotted.rpartition('.')
  return getattr(importlib.import_module(module), name)


def _example_inputs(
    example: Example, linen_layer: tp.Any, rng: np.random.Generator
) -> tuple[tp.Any, ...]:
  arrays: dict[int, tp.Any] = {}
  for index, item in enumerate(example.inputs):
    if isinstance(item, ExampleArray):
      if np.issubdtype(item.dtype, np.integer):
        arrays[index] = jnp.asarray(rng.integers(0, item.maxval, item.shape), item.dtype)
      else:
        arrays[index] = jnp.asarray(rng.standard_normal(item.shape), item.dtype)
  for index, item in enumerate(example.inputs):
    if index not in arrays:  # an ExampleCarry: random values in initialize_carry's structure
      template = linen_layer.initialize_carry(jax.random.key(0), arrays[item.like_arg].shape)
      arrays[index] = jax.tree.map(
          lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), template
      )
  return tuple(arrays[index] for index in range(len(example.inputs)))


def _perturb(variables: tp.Any, rng: np.random.Generator) -> dict[str, tp.Any]:
  """Shifts every leaf by a random positive amount, standing in for trained weights."""
  flat = traverse_util.flatten_dict(variables)
  return traverse_util.unflatten_dict({
      path: jnp.asarray(np.asarray(leaf) + rng.uniform(0.1, 1.0, leaf.shape), leaf.dtype)
      for path, leaf in flat.items()
  })


def _mode_kwargs(example: Example, eval_mode: bool) -> dict[str, bool]:
  if example.mode_argument is None:
    return {}
  (argument,) = [m for m in MODE_ARGUMENTS if m.name == example.mode_argument]
  return {argument.name: argument.value(eval_mode)}


def _load(spec: LayerSpec, layer: nnx.Module, variables: tp.Any) -> None:
  """Sets every non-rng NNX leaf from the Linen variables, failing on any leaf left unset."""
  flat = list(nnx.to_flat_state(nnx.state(layer, _WEIGHTS)))
  # An inexact row is converted anyway: the check exists to show the documented difference.
  converted = linen_to_nnx_params(
      spec, variables, expected={p: v.get_value() for p, v in flat}, allow_lossy=not spec.exact
  )
  wrong_type = [
      f'{"/".join(map(str, path))} is {type(var).__name__}'
      for path, var in flat
      if not isinstance(var, nnx.variable_type_from_name(spec.params.collection(path)))
  ]
  if wrong_type:
    raise StateMismatchError('NNX leaves of the wrong Variable type: ' + '; '.join(wrong_type))
  nnx.update(layer, nnx.from_flat_state([(p, v.replace(converted[p])) for p, v in flat]))
  stale = [
      '/'.join(map(str, path))
      for path, var in nnx.to_flat_state(nnx.state(layer, _WEIGHTS))
      if not np.array_equal(var.get_value(), converted[path])
  ]
  if stale:
    raise StateMismatchError('NNX leaves not set by the update: ' + ', '.join(stale))


def _max_abs_diff(a: tp.Any, b: tp.Any) -> float:
  if jax.tree.structure(a) != jax.tree.structure(b):
    return float('inf')
  diffs = [
      float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)), initial=0.0))
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  ]
  return max(diffs, default=0.0)


def _measure(
    spec: LayerSpec, linen_layer: tp.Any, variables: tp.Any, inputs: tuple[tp.Any, ...]
) -> dict[str, float]:
  """Max |Linen - NNX| per mode for one set of Linen variables, via a freshly built NNX layer."""
  example = spec.example
  assert example is not None and spec.nnx is not None
  kwargs = nnx_constructor_kwargs(spec, dict(example.linen_kwargs), *inputs)
  layer = _resolve(spec.nnx)(**kwargs, rngs=nnx.Rngs(0))
  _load(spec, layer, variables)
  layer.eval()
  expected = linen_layer.apply(variables, *inputs, **_mode_kwargs(example, True))
  diffs = {'eval': _max_abs_diff(expected, layer(*inputs))}
  if example.check_train:
    mutable = sorted({col for _, col in spec.params.collections})
    expected, updated = linen_layer.apply(
        variables, *inputs, mutable=mutable, **_mode_kwargs(example, False)
    )
    layer.train()
    out = layer(*inputs)
    state = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(layer, _WEIGHTS))}
    expected_state = linen_to_nnx_params(spec, {**variables, **updated})
    diffs['train'] = max(_max_abs_diff(expected, out), _max_abs_diff(expected_state, state))
  return diffs


def _without_dropped(spec: LayerSpec, variables: dict[str, tp.Any]) -> dict[str, tp.Any]:
  flat = traverse_util.flatten_dict(variables)
  for drop in spec.params.drop:
    key = (drop.collection, *drop.path)
    flat[key] = jnp.zeros_like(flat[key])
  return traverse_util.unflatten_dict(flat)


def linen_example(spec: LayerSpec) -> tuple[tp.Any, dict[str, tp.Any], tuple[tp.Any, ...]]:
  """The row's Linen layer, its initialised-then-perturbed variables and its example inputs."""
  example = spec.example
  if example is None:
    raise ValueError(f'{spec.linen} has no example')
  linen_layer = _resolve(spec.linen)(**dict(example.linen_kwargs))
  rng = np.random.default_rng(0)
  inputs = _example_inputs(example, linen_layer, rng)
  with _quiet_self_attention():
    variables = linen_layer.init(jax.random.key(0), *inputs, **_mode_kwargs(example, True))
  return linen_layer, _perturb(variables, rng), inputs


def check_layer(spec: LayerSpec) -> LayerCheck:
  """Runs the row's example through Linen and through NNX with converted weights and compares."""
  if spec.nnx is None:
    raise ValueError(f'{spec.linen} has no NNX class to check')
  linen_layer, variables, inputs = linen_example(spec)
  with _quiet_self_attention():
    try:
      diffs = _measure(spec, linen_layer, variables, inputs)
      if not spec.exact:
        clean = _measure(spec, linen_layer, _without_dropped(spec, variables), inputs)
    except (StateMismatchError, LossyConversionError) as e:
      return LayerCheck(spec.linen, spec.nnx, float('inf'), spec.exact, False, str(e))
  diff = max(diffs.values())
  detail = ', '.join(f'{mode} {value:.3g}' for mode, value in diffs.items())
  if spec.exact:
    passed = diff <= TOLERANCE
  else:  # the mismatch must be real, and due only to the leaves the row drops
    clean_diff = max(clean.values())
    passed = diff > TOLERANCE and clean_diff <= TOLERANCE
    detail += f'; with dropped leaves zeroed {clean_diff:.3g}'
  return LayerCheck(spec.linen, spec.nnx, diff, spec.exact, passed, f'max |Linen - NNX|: {detail}')


def check_all() -> list[LayerCheck]:
  """Checks every row of LAYERS."""
  return [check_layer(spec) for spec in LAYERS]
