"""Runs Linen training code and its NNX port from the same initial parameters (and dropout masks).

`recording_linen(name)` records the first `init` of a Linen model of class `name` (its inputs
and the variables it made) and the variables of the last inference `apply` of a model of that
class (no `rngs=`, nothing mutable but a decode `cache`: the eval or decoding call after
training, also inside `jax.jit`, through a debug callback), less the decode cache.
`transferring_into(name, linen)` copies those initial variables into the first outermost NNX
model of class `name` built inside the block, right after it is built, with `nnx_bridge`, so
both sides train from the same start.

Dropout masks: Linen derives them from `rngs={'dropout': key}` by folding in module paths, NNX
from the model's own `nnx.Rngs` stream, so no choice of keys makes the random masks agree;
`same_masks()` makes both sides draw one deterministic mask from the mask's shape, which is
what lets a dropout model's training be compared exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from flax.nnx import pytreelib

import nnx_bridge


@dataclasses.dataclass
class LinenRecord:
  """The Linen model's first init (module, inputs, variables) and the last inference apply's variables."""

  model: nn.Module | None = None
  init_args: tuple = ()
  init_kwargs: dict = dataclasses.field(default_factory=dict)
  initial: tp.Any = None
  final: tp.Any = None


@dataclasses.dataclass
class NNXRecord:
  """The NNX model the port built (trained in place) and the Linen -> NNX mapping of its leaves."""

  model: nnx.Module | None = None
  mapping: nnx_bridge.TreeMapping | None = None


def _traced(tree: tp.Any) -> bool:
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


def _concrete(tree: tp.Any) -> dict:
  return jax.tree.map(np.asarray, dict(tree))


@contextlib.contextmanager
def recording_linen(model_class: str) -> tp.Iterator[LinenRecord]:
  """Records what `LinenRecord` says for the first Linen model of class `model_class`."""
  record = LinenRecord()
  original_init, original_apply = nn.Module.init, nn.Module.apply
  finals: list[dict] = []

  def init(module, rngs, *args, **kwargs):
    variables = original_init(module, rngs, *args, **kwargs)
    if record.model is None and type(module).__name__ == model_class:
      assert not _traced(variables), 'the model is initialised under a transform'
      record.model, record.init_args, record.init_kwargs = module, args, kwargs
      record.initial = _concrete(variables)
    return variables

  def apply(module, variables, *args, rngs=None, mutable=False, **kwargs):
    decoding = mutable in (['cache'], ('cache',), 'cache')
    if type(module).__name__ == model_class and rngs is None and (mutable is False or decoding):
      state = {k: v for k, v in dict(variables).items() if k != 'cache'}
      if _traced(state):
        jax.debug.callback(lambda v: finals.append(_concrete(v)), state)
      else:
        finals.append(_concrete(state))
    return original_apply(module, variables, *args, rngs=rngs, mutable=mutable, **kwargs)

  nn.Module.init, nn.Module.apply = init, apply
  try:
    yield record
    jax.effects_barrier()  # the callbacks of a jitted eval step have run
  finally:
    nn.Module.init, nn.Module.apply = original_init, original_apply
  assert record.model is not None, f'no Linen {model_class} was initialised'
  record.final = finals[-1] if finals else None


@contextlib.contextmanager
def transferring_into(model_class: str, linen: LinenRecord) -> tp.Iterator[NNXRecord]:
  """The first outermost NNX `model_class` built in the block starts from `linen.initial`."""
  record = NNXRecord()
  original = pytreelib._graph_node_meta_call
  depth = [0]

  def construct(cls, *args, **kwargs):
    depth[0] += 1
    try:
      node = original(cls, *args, **kwargs)
    finally:
      depth[0] -= 1
    if record.model is None and depth[0] == 0 and cls.__name__ == model_class:
      mapping = nnx_bridge.derive_mapping(linen.model, node, *linen.init_args, **linen.init_kwargs)
      nnx_bridge.linen_to_nnx(linen.initial, node, mapping)
      record.model, record.mapping = node, mapping
    return node

  pytreelib._graph_node_meta_call = construct
  try:
    yield record
  finally:
    pytreelib._graph_node_meta_call = original
  assert record.model is not None, f'no NNX {model_class} was built'


def _deterministic_bernoulli(key: jax.Array, p: float = 0.5, shape: tp.Sequence[int] | None = None,
                             **unused: tp.Any) -> jax.Array:
  """A fixed keep-mask that depends only on the shape, with about a fraction `p` kept (options such as
  `out_sharding` are ignored)."""
  shape = tuple(shape) if shape is not None else jnp.shape(p)
  hashed = (jnp.arange(math.prod(shape), dtype=jnp.uint32) * jnp.uint32(2654435761)) % jnp.uint32(1000)
  return (hashed.reshape(shape) / 1000.0) < p


@contextlib.contextmanager
def same_masks() -> tp.Iterator[None]:
  """Both libraries' Dropout call `jax.random.bernoulli`; within this block it ignores the key."""
  original = jax.random.bernoulli
  jax.random.bernoulli = _deterministic_bernoulli
  try:
    yield
  finally:
    jax.random.bernoulli = original


def assert_close(linen_value: tp.Any, nnx_value: tp.Any, *, rtol: float = 1e-5, atol: float = 1e-6) -> None:
  """Equal trees of arrays / floats (loss lists, logits) within float32 tolerance."""
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=rtol, atol=atol),
               linen_value, nnx_value)


def flat_state(model: nnx.Module) -> dict[tuple[str, ...], np.ndarray]:
  """Every non-rng leaf of `model` by path (params, batch stats, custom variables)."""
  state = nnx.state(model, nnx.Not(nnx.RngState))
  return {tuple(map(str, path)): np.asarray(v.get_value()) for path, v in nnx.to_flat_state(state)}


def expected_state(linen_variables: tp.Any, ported: NNXRecord) -> dict[tuple[str, ...], np.ndarray]:
  """`linen_variables` laid out as the port's model (by the mapping used at its construction)."""
  return flat_state(nnx_bridge.linen_to_nnx(linen_variables, nnx.clone(ported.model), ported.mapping))


def assert_same_state(linen_variables: tp.Any, ported: NNXRecord, *, rtol: float = 1e-5, atol: float = 1e-6) -> None:
  """The trained NNX model holds what the trained Linen variables hold, leaf by leaf."""
  want, got = expected_state(linen_variables, ported), flat_state(ported.model)
  assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
  for path in sorted(want):
    np.testing.assert_allclose(got[path], want[path], rtol=rtol, atol=atol, err_msg='/'.join(path))
