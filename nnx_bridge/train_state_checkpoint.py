"""Converts a whole flax TrainState checkpoint to the NNX layout of `nnx.state((model, optimizer))`, and back.

A Linen training checkpoint is usually the TrainState itself, `ocp.StandardCheckpointer().save(
path, state)`: `step`, `params`, one field per other collection (`batch_stats`), and `opt_state`,
the optax state, whose params-shaped subtrees (Adam's `mu` and `nu`) are laid out like `params`.
Its NNX counterpart is `nnx.state((model, optimizer))` for `optimizer = nnx.Optimizer(model, tx,
wrt=nnx.Param)`: the model's state under `0`, the optimizer's `step` and `opt_state` under `1`,
with every params-shaped subtree in the model's layout. Resuming training from it is

    state = checkpointer.restore(path, nnx.state((model, optimizer), nnx.Not(nnx.RngState)))
    nnx.update((model, optimizer), state)

The mapping's `params` rules convert each params-shaped subtree of the optax state; its other
leaves (`count`, injected hyperparameters) keep their path. The optimizer's layout is derived
from the checkpoint, as `tx.init` would build it (optax maps each params-shaped subtree over the
params); an abstract optimizer state, when given, is checked against it too. The arrays stream
through `checkpoint`'s writer: same checks before anything is written, same atomic output.
"""

from __future__ import annotations

import dataclasses
import os
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np

from nnx_bridge import checkpoint
from nnx_bridge import transfer
from nnx_bridge.checkpoint import BATCH_BYTES
from nnx_bridge.checkpoint import Job
from nnx_bridge.checkpoint import Key
from nnx_bridge.checkpoint import PathLike
from nnx_bridge.errors import StateMismatchError
from nnx_bridge.treemap import TreeMapping
from nnx_bridge.treemap import path_str

MODEL, OPTIMIZER = '0', '1'
"""The top-level keys of `nnx.state((model, optimizer))`."""
STEP, OPT_STATE = 'step', 'opt_state'
"""The TrainState fields that are not model collections, and the nnx.Optimizer attributes that hold them."""
_VALUE = ('value',)  # the key orbax stores under every nnx.Variable of a saved nnx.State


def train_state_to_nnx_checkpoint(
    src: PathLike,
    dst: PathLike,
    mapping: TreeMapping,
    *,
    model_abstract_state: tp.Any = None,
    optimizer_abstract_state: tp.Any = None,
    allow_lossy: bool = False,
    batch_bytes: int = BATCH_BYTES,
) -> int:
  """Writes the TrainState checkpoint at `src` as the `nnx.state((model, optimizer))` checkpoint `dst`.

  `model_abstract_state` (`nnx.state(nnx.eval_shape(...), nnx.Not(nnx.RngState))`) and
  `optimizer_abstract_state` (`nnx.state(nnx.eval_shape(lambda: nnx.Optimizer(model, tx,
  wrt=nnx.Param)))`) are checked against when given; a leaf they shard over a mesh is written with that
  sharding recorded (`checkpoint.records_sharding`). The step,
  an int32 in a TrainState (int64 while it is still the Python int `TrainState.create` sets),
  becomes the optimizer's uint32. Dropped model leaves must be zero unless `allow_lossy`; their
  optimizer statistics are dropped with them. Returns the number of leaves written; nothing is
  written unless every check passes, and `dst` appears complete or not at all.
  """
  src, dst = os.path.abspath(src), os.path.abspath(dst)  # orbax takes absolute paths only
  checkpoint.refuse_existing(dst)
  checkpoint.clear_staging(dst)
  source = step_as_int32(checkpoint.read_metadata(src))
  jobs = [Job(rule.linen, ((MODEL, *rule.nnx, *_VALUE),), checkpoint.joiner(rule)) for rule in mapping.rules]
  optimizer = optimizer_jobs(source, mapping)
  jobs += [Job(job.sources, tuple((OPTIMIZER, *key, *_VALUE) for key in job.targets), job.make) for job in optimizer.jobs]
  dropped = [*mapping.dropped, *optimizer.dropped]
  abstract = {MODEL: model_abstract_state, OPTIMIZER: optimizer_abstract_state}
  target = {
      (name, *path, *_VALUE): leaf
      for name, state in abstract.items() if state is not None
      for path, leaf in checkpoint.flatten_nnx_abstract(state).items()
  }
  covers = tuple((name,) for name, state in abstract.items() if state is not None)
  made = checkpoint.plan(source, jobs, tuple(dropped), target, 'NNX model and optimizer', src, covers=covers)
  if not allow_lossy:
    checkpoint.refuse_lossy(src, source, mapping.dropped, batch_bytes)
  checkpoint.write(src, dst, source, jobs, made, target, batch_bytes)
  return len(made)


@dataclasses.dataclass(frozen=True)
class OptimizerJobs:
  """How a TrainState's `step` and `opt_state` leaves become an nnx.Optimizer's state."""

  jobs: list[Job]
  """Targets are nnx.Optimizer state paths: `('step',)`, `('opt_state', '0', 'mu', 'linear', 'kernel')`."""
  concat_axes: list[int | None]
  """Each job's concatenation axis, for a fused leaf (its rule's), or None."""
  dropped: list[Key]
  """The optax statistics of the model leaves the mapping drops: dropped with them."""


def optimizer_jobs(source: tp.Iterable[Key], mapping: TreeMapping) -> OptimizerJobs:
  """The jobs that make an nnx.Optimizer's state from the `step` and `opt_state` keys among the checkpoint keys `source`.

  Each params-shaped subtree of the optax state is converted with the mapping's `params` rules;
  its other leaves keep their path. The step becomes the optimizer's uint32.
  """
  params = mapping.only('params')
  jobs, axes, dropped = [Job(((STEP,),), ((STEP,),), _cast(jnp.uint32))], [None], []
  linen_params = {key[1:] for key in params.linen_keys}
  prefixes, others = _split_optimizer_state([key[1:] for key in source if key[0] == OPT_STATE], linen_params)
  for path in others:
    jobs.append(Job(((OPT_STATE, *path),), ((OPT_STATE, *path),), _same))
    axes.append(None)
  for prefix in prefixes:
    for rule in params.rules:
      linen = tuple((OPT_STATE, *prefix, *key[1:]) for key in rule.linen)
      jobs.append(Job(linen, ((OPT_STATE, *prefix, *rule.nnx),), checkpoint.joiner(rule)))
      axes.append(rule.concat_axis)
    dropped += [(OPT_STATE, *prefix, *key[1:]) for key in params.dropped]
  return OptimizerJobs(jobs, axes, dropped)


def nnx_to_train_state_checkpoint(
    src: PathLike,
    dst: PathLike,
    mapping: TreeMapping,
    *,
    train_state_like: tp.Any,
    batch_bytes: int = BATCH_BYTES,
) -> int:
  """Writes the `nnx.state((model, optimizer))` checkpoint at `src` as the TrainState checkpoint `dst`.

  `src` holds the nnx.State or its pure dict (`nnx.to_pure_dict`). `train_state_like` is the
  TrainState to restore into, abstract or not (`jax.eval_shape(create_train_state, ...)`), or a
  dict laid out like one (`step`, `params`, `opt_state`, one entry per other collection): every
  leaf of it is checked against and `dst` restores into it (`checkpointer.restore(dst, state)`).
  Dropped model leaves come back as zeros, and so do their optimizer statistics. Returns the
  number of leaves written; nothing is written unless every check passes, and `dst` appears
  complete or not at all.
  """
  src, dst = os.path.abspath(src), os.path.abspath(dst)  # orbax takes absolute paths only
  checkpoint.refuse_existing(dst)
  checkpoint.clear_staging(dst)
  source = checkpoint.read_metadata(src)
  value = _VALUE if all(key[-1:] == _VALUE for key in source) else ()
  params = mapping.only('params')
  target = {key: _abstract(leaf) for key, leaf in checkpoint.flatten_linen_abstract(train_state_like).items()}
  jobs = [Job(((MODEL, *rule.nnx, *value),), rule.linen, checkpoint.splitter(rule)) for rule in mapping.rules]
  jobs.append(Job(((OPTIMIZER, STEP, *value),), ((STEP,),), _cast(_abstract(target.get((STEP,), 0)).dtype)))
  zeros = {key: key for key in mapping.dropped}  # Linen key -> the model leaf whose shape it has
  optimizer_paths = [key[2:len(key) - len(value)] for key in source if key[:2] == (OPTIMIZER, OPT_STATE)]
  prefixes, others = _split_optimizer_state(optimizer_paths, params.nnx_paths)
  for path in others:
    jobs.append(Job(((OPTIMIZER, OPT_STATE, *path, *value),), ((OPT_STATE, *path),), _same))
  for prefix in prefixes:
    for rule in params.rules:
      keys = tuple((OPT_STATE, *prefix, *key[1:]) for key in rule.linen)
      jobs.append(Job(((OPTIMIZER, OPT_STATE, *prefix, *rule.nnx, *value),), keys, checkpoint.splitter(rule)))
    zeros.update({(OPT_STATE, *prefix, *key[1:]): key for key in params.dropped})
  for key, model_key in zeros.items():
    if model_key not in target:
      raise StateMismatchError(f'{path_str(model_key)} (dropped): not in the TrainState, so its zeros have no shape')
    jobs.append(Job((), (key,), checkpoint.zeros_like(target[model_key])))
  made = checkpoint.plan(source, jobs, (), target, 'TrainState', src)
  checkpoint.write(src, dst, source, jobs, made, target, batch_bytes, layout=train_state_like)
  return len(made)


def _split_optimizer_state(paths: tp.Iterable[Key], params_paths: tp.Collection[Key]) -> tuple[list[Key], list[Key]]:
  """The prefixes of an optax state's params-shaped subtrees (Adam's `0/mu`), and the paths of its other leaves.

  A leaf whose path ends with a params path sits in the subtree under the rest of its path.
  """
  prefixes: dict[Key, None] = {}
  others = []
  for path in paths:
    split = transfer.split_at_params(path, params_paths)
    if split is None:
      others.append(path)
    else:
      prefixes[split[0]] = None
  return list(prefixes), others


def step_as_int32(source: dict[Key, tp.Any]) -> dict[Key, tp.Any]:
  """The checkpoint's leaves with an int64 step read as int32: the Python int 0 that `TrainState.create` sets."""
  step = source.get((STEP,))
  if step is None or np.dtype(step.dtype) != np.int64 or step.shape != ():
    return source
  return {**source, (STEP,): jax.ShapeDtypeStruct((), np.int32)}


def _cast(dtype: tp.Any) -> tp.Callable[[list[tp.Any]], list[tp.Any]]:
  """A Job's `make` for the step counter, which TrainState and nnx.Optimizer keep in different dtypes."""
  return lambda parts: [jnp.asarray(parts[0], dtype)]


def _same(parts: list[tp.Any]) -> list[tp.Any]:
  return parts


def _abstract(leaf: tp.Any) -> jax.ShapeDtypeStruct:
  """A TrainState leaf's shape and dtype; the Python int step of a fresh TrainState is an int32 scalar."""
  if isinstance(leaf, jax.ShapeDtypeStruct):
    return leaf
  return jax.ShapeDtypeStruct(np.shape(leaf), jnp.result_type(leaf), sharding=getattr(leaf, 'sharding', None))
