"""Restores a Linen checkpoint straight into an NNX model: sharded, strict, nothing converted on disk.

A team that ported a model from Linen to NNX usually still has its Linen checkpoints (orbax, or
the legacy msgpack files `flax.training.checkpoints` wrote). Converting them on disk first
(`checkpoint.linen_to_nnx_checkpoint`) doubles the storage and adds a step; MaxText and flax's
own gemma NNX port read the Linen checkpoint directly instead. `restore_linen_checkpoint` does
that with the same plan and the same checks as the converter (`checkpoint.plan`): every leaf is
checked against the NNX model from the checkpoint's metadata before any array is read, and each
array is read by orbax straight into the sharding of the NNX leaf it becomes, so a sharded model
gets sharded arrays without a full copy in host memory.

The Linen layout: `ocp.StandardCheckpointer().save(path, variables)` (`params/Dense_0/kernel`,
`batch_stats/...`), one collection's tree without its name (`linen_collection='params'`), or a
whole TrainState-like dict (`params`, `batch_stats`, ..., `opt_state`, `step`), whose
`opt_state` and `step` go into an `nnx.Optimizer` when one is given and are left unread
otherwise.
"""

from __future__ import annotations

import dataclasses
import os
import typing as tp

import jax
import numpy as np
from flax import nnx
from flax import serialization

from nnx_bridge import checkpoint
from nnx_bridge import collectionlib
from nnx_bridge import train_state_checkpoint
from nnx_bridge.derive import MappingError
from nnx_bridge.derive import mapping_by_path
from nnx_bridge.errors import LossyConversionError
from nnx_bridge.errors import StateMismatchError
from nnx_bridge.errors import UnreadableCheckpointError
from nnx_bridge.treemap import TreeMapping
from nnx_bridge.treemap import normalize_path
from nnx_bridge.treemap import path_str

Key = checkpoint.Key
PathLike = checkpoint.PathLike
TRAINING_KEYS = ('opt_state', 'step')
"""The top-level keys of a TrainState checkpoint without model variables: read only into an optimizer."""

_MAPPING_HINT = (
    'The NNX model is not laid out like the Linen variables, or a leaf differs. If the layouts differ, '
    'pass mapping=: TreeMapping.load("mapping.json") after `linen2nnx verify ... --write-mapping '
    'mapping.json`, or nnx_bridge.derive_mapping(linen_module, nnx_model, *inputs).'
)
_UNCHANGED = 'nothing restored, the model is unchanged'
_OPTIMIZER = 'optimizer'  # the optimizer's paths among the model's, in the plan and its errors


@dataclasses.dataclass(frozen=True)
class _Target:
  """The NNX Variables to restore (every Variable but rng state), by normalized path."""

  paths: dict[Key, tuple[tp.Any, ...]]
  """Normalized path -> the state's own path (integer keys for `nnx.List` children)."""
  variables: dict[Key, nnx.Variable]
  abstract: dict[Key, jax.ShapeDtypeStruct]
  """Each Variable's shape, dtype and concrete sharding (the default device where it has none)."""

  def collections(self) -> set[str]:
    return {collectionlib.collection_name(type(variable)) for variable in self.variables.values()}

  def state(self, values: tp.Mapping[Key, tp.Any] | None = None) -> nnx.State:
    """The Variables as an nnx.State, with `values` in place of their own when given."""
    return nnx.from_flat_state([
        (self.paths[key], variable if values is None else variable.replace(values[key]))
        for key, variable in self.variables.items()
    ])


@dataclasses.dataclass(frozen=True)
class _Checkpoint:
  """An opened checkpoint: every leaf's shape and dtype (the metadata; arrays for msgpack) and how to read it."""

  path: str
  leaves: dict[Key, tp.Any]
  msgpack: bool = False

  def read(self, keys: tp.Sequence[Key], shardings: tp.Mapping[Key, jax.sharding.Sharding]) -> dict[Key, jax.Array]:
    """The arrays at `keys`, each placed with its sharding (orbax reads only the shards each device holds)."""
    if not self.msgpack:
      return checkpoint.restore_arrays(self.path, self.leaves, keys, shardings)
    return {key: jax.device_put(self.leaves[key], shardings[key]) for key in keys}


def restore_linen_checkpoint(
    target: nnx.Module | nnx.State,
    path: PathLike,
    mapping: TreeMapping | None = None,
    *,
    optimizer: nnx.Optimizer | nnx.State | None = None,
    linen_collection: str | None = None,
    allow_lossy: bool = False,
) -> nnx.State | tuple[nnx.State, nnx.State]:
  """Reads the Linen checkpoint at `path` into an NNX model, each array in its NNX leaf's sharding.

  `target` is an NNX model, updated in place (`nnx.update`), or an abstract NNX state
  (`nnx.state(nnx.eval_shape(...))`, `jax.ShapeDtypeStruct` leaves, with or without
  shardings); either way the restored state is returned, for `nnx.merge(graphdef, state)`.
  Every Variable but rng state is restored (rng state has no Linen source: it is left out of
  the returned state and left as it is in a model). A leaf without a sharding goes to the
  default device; one sharded on an abstract mesh (`nnx.eval_shape` under `jax.set_mesh`) takes
  the current concrete mesh, so call this inside the same `jax.set_mesh`.

  `path` is an orbax checkpoint folder of Linen variables, of one collection's tree without its
  name (`linen_collection='params'`: a TrainState's params), or of a TrainState-like dict, whose
  `opt_state` and `step` are left unread unless the mapping names them (any other top-level key
  that is not a collection the mapping uses is refused); or a legacy
  `flax.training.checkpoints.save_checkpoint` file or folder (msgpack, or orbax: the latest
  `checkpoint_<step>` in a folder, as `restore_checkpoint` takes it).

  `optimizer`, an `nnx.Optimizer(model, tx, wrt=nnx.Param)` (updated in place) or its abstract
  state, gets the TrainState's `step` and `opt_state` too, so that training resumes where it
  stopped: each params-shaped subtree of the optax state (Adam's `mu`, `nu`) through the
  mapping's `params` rules, every other optax leaf at its own path, and
  `(model state, optimizer state)` is returned. Its paths are named `optimizer/...` in errors.

  `mapping` defaults to `mapping_by_path` of the checkpoint's metadata and the target, for an NNX
  model laid out like the Linen variables. Strict: a missing, extra, wrong-shape or wrong-dtype
  leaf raises StateMismatchError (or MappingError for the default mapping) naming the checkpoint
  key and the NNX path; a dropped Linen leaf that is not zero raises LossyConversionError unless
  `allow_lossy`; a damaged checkpoint raises UnreadableCheckpointError, a missing path
  FileNotFoundError. Everything is checked on the metadata before any array is read, and the
  model is updated only once every array has been read, so a failure leaves it unchanged.
  """
  if optimizer is not None and linen_collection is not None:
    raise ValueError(
        'A checkpoint of one collection holds no optimizer state: restore the optimizer from the '
        'TrainState checkpoint, or leave optimizer= out'
    )
  wanted = _target(target)
  wanted_optimizer = None if optimizer is None else _target(optimizer)
  source = _open(path)
  leaves = _model_leaves(source, mapping, wanted, linen_collection)
  if mapping is None:
    mapping = _mapping_by_path(source.path, leaves, wanted, linen_collection)
  linen_key = checkpoint.linen_key_fn(linen_collection)
  jobs = [checkpoint.Job(tuple(map(linen_key, rule.linen)), (rule.nnx,), checkpoint.joiner(rule))
          for rule in mapping.rules]
  concat_axes = [rule.concat_axis for rule in mapping.rules]
  dropped = tuple(map(linen_key, mapping.dropped))
  abstract = dict(wanted.abstract)
  if wanted_optimizer is not None:
    training = train_state_checkpoint.step_as_int32(
        {key: leaf for key, leaf in source.leaves.items() if key[0] in TRAINING_KEYS})
    leaves = {**leaves, **training}
    planned = train_state_checkpoint.optimizer_jobs(training, mapping)
    jobs += [checkpoint.Job(job.sources, tuple((_OPTIMIZER, *key) for key in job.targets), job.make)
             for job in planned.jobs]
    concat_axes += planned.concat_axes
    dropped += tuple(planned.dropped)
    abstract.update({(_OPTIMIZER, *key): leaf for key, leaf in wanted_optimizer.abstract.items()})
  checkpoint.plan(leaves, jobs, dropped, abstract, 'NNX model', source.path, _UNCHANGED)
  if mapping.dropped and not allow_lossy:
    _refuse_lossy(source, tuple(map(linen_key, mapping.dropped)))
  # A one-to-one leaf is read straight into its target sharding; fused parts go through host memory.
  shardings = {}
  for job in jobs:
    one_to_one = len(job.sources) == 1
    for key in job.sources:
      shardings[key] = abstract[job.targets[0]].sharding if one_to_one else checkpoint.host_sharding()
  read = source.read(list(shardings), shardings)
  values = {}
  for job, axis in zip(jobs, concat_axes):
    parts = [read.pop(key) for key in job.sources]
    # Fused parts are concatenated in host memory by numpy: no jit, so also inside a `jax.set_mesh`.
    value = parts[0] if len(parts) == 1 else np.concatenate([np.asarray(p) for p in parts], axis)
    leaf = abstract[job.targets[0]]
    if value.dtype != leaf.dtype:  # the step: a TrainState's int32, an nnx.Optimizer's uint32
      value = np.asarray(value).astype(leaf.dtype)
    values[job.targets[0]] = jax.device_put(value, leaf.sharding)
  state = wanted.state(values)
  if isinstance(target, nnx.Module):
    nnx.update(target, state)
  if wanted_optimizer is None:
    return state
  optimizer_state = wanted_optimizer.state({key[1:]: value for key, value in values.items() if key[0] == _OPTIMIZER})
  if isinstance(optimizer, nnx.Optimizer):
    nnx.update(optimizer, optimizer_state)
  return state, optimizer_state


# --- the target ----------------------------------------------------------------------------------


def _target(target: nnx.Module | nnx.Optimizer | nnx.State) -> _Target:
  """The Variables `target` holds, less rng state, with where each of their arrays goes."""
  if isinstance(target, (nnx.Module, nnx.Optimizer)):
    state = nnx.state(target)
  elif isinstance(target, nnx.State):
    state = target
  else:
    raise TypeError(
        f'restore_linen_checkpoint restores into an nnx.Module or an nnx.State, not {type(target).__name__}; '
        'for an abstract target pass nnx.state(nnx.eval_shape(lambda: Model(...)))'
    )
  paths, variables, abstract = {}, {}, {}
  for state_path, variable in nnx.to_flat_state(state):
    key = normalize_path(state_path)
    if not isinstance(variable, nnx.Variable):
      raise TypeError(f'{path_str(key)} is not an nnx.Variable; pass nnx.state(model), not a pure dict')
    if isinstance(variable, nnx.RngState):
      continue
    value = variable.get_value()
    paths[key], variables[key] = tuple(state_path), variable
    abstract[key] = jax.ShapeDtypeStruct(
        tuple(value.shape), value.dtype, sharding=_placement(key, getattr(value, 'sharding', None))
    )
  return _Target(paths, variables, abstract)


def _placement(key: Key, sharding: tp.Any) -> jax.sharding.Sharding:
  """The concrete sharding an NNX leaf's array is read into."""
  if sharding is None:
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])
  if isinstance(sharding, jax.sharding.NamedSharding) and isinstance(sharding.mesh, jax.sharding.AbstractMesh):
    mesh = jax.sharding.get_mesh()
    if mesh.empty or mesh.abstract_mesh != sharding.mesh:
      raise StateMismatchError(
          f'{path_str(key)} is sharded on an abstract mesh ({sharding.mesh}), and the current mesh is '
          f'{"none" if mesh.empty else mesh}: call restore_linen_checkpoint inside the `with '
          'jax.set_mesh(mesh):` the abstract state was made in'
      )
    return jax.sharding.NamedSharding(mesh, sharding.spec, memory_kind=sharding.memory_kind)
  return sharding


# --- the checkpoint ------------------------------------------------------------------------------


def _open(path: PathLike) -> _Checkpoint:
  """The checkpoint at `path`: an orbax folder, a flax msgpack file, or a folder of flax `checkpoint_<step>`s."""
  path = os.path.abspath(path)  # orbax takes absolute paths only
  if not os.path.exists(path):
    raise FileNotFoundError(f'No checkpoint at {path}: no such file or folder')
  if os.path.isdir(path) and not os.path.isfile(os.path.join(path, '_METADATA')):
    from flax.training import checkpoints  # only here: its import warns about a missing TensorFlow

    latest = checkpoints.latest_checkpoint(path)  # what checkpoints.restore_checkpoint(path, None) reads
    path = latest if latest is not None else path
  if os.path.isfile(path):
    return _Checkpoint(path, _read_msgpack(path), msgpack=True)
  return _Checkpoint(path, checkpoint.read_metadata(path))


def _read_msgpack(file: str) -> dict[Key, np.ndarray]:
  """Every leaf of a legacy flax checkpoint file, as numpy arrays (msgpack has no metadata apart from the data)."""
  try:
    with open(file, 'rb') as stream:
      tree = serialization.msgpack_restore(stream.read())
  except Exception as error:  # msgpack raises its own exception types, ValueError and others
    raise UnreadableCheckpointError(
        f'{file} cannot be read as a flax msgpack checkpoint ({checkpoint.one_line_reason(error)}); give an '
        'orbax checkpoint folder or a file flax.training.checkpoints.save_checkpoint wrote'
    ) from None
  if not isinstance(tree, dict):
    raise UnreadableCheckpointError(
        f'{file} is not a flax checkpoint: it holds a {type(tree).__name__}, not a tree of variables'
    )
  return {key: np.asarray(leaf) for key, leaf in checkpoint.flatten(tree).items()}


def _model_leaves(
    source: _Checkpoint, mapping: TreeMapping | None, wanted: _Target, linen_collection: str | None
) -> dict[Key, tp.Any]:
  """The checkpoint's leaves of the model collections: all of them for a one-collection checkpoint;
  otherwise those of the collections the mapping (or, without one, the NNX model) uses, leaving out
  a TrainState's `opt_state` and `step` and refusing any other top-level key."""
  if linen_collection is not None:
    return source.leaves
  used = {key[0] for key in mapping.linen_keys} if mapping is not None else wanted.collections()
  top = {key[0] for key in source.leaves}
  unknown = sorted(top - used - set(TRAINING_KEYS))
  if unknown:
    raise StateMismatchError(
        f'{source.path}: the top-level keys {", ".join(unknown)} of the checkpoint are neither collections '
        f'the {"mapping" if mapping is not None else "NNX model"} uses ({", ".join(sorted(used)) or "none"}) '
        f'nor a TrainState\'s {" / ".join(TRAINING_KEYS)}; {_UNCHANGED}. A checkpoint of one collection\'s '
        "tree without its name (a TrainState's params) needs linen_collection='params'; a collection the "
        'model has no place for needs a mapping that lists its leaves as dropped'
    )
  return {key: leaf for key, leaf in source.leaves.items() if key[0] in used}


def _mapping_by_path(
    src: str, leaves: dict[Key, tp.Any], wanted: _Target, linen_collection: str | None
) -> TreeMapping:
  """`mapping_by_path` of the checkpoint's metadata and the target; a MappingError says how to give one instead."""
  prefix = () if linen_collection is None else (linen_collection,)
  linen_abstract = checkpoint.nest(
      {prefix + key: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for key, leaf in leaves.items()}
  )
  try:
    return mapping_by_path(linen_abstract, wanted.state())
  except MappingError as error:
    raise MappingError(f'{src}: {error}\n{_MAPPING_HINT} {_UNCHANGED.capitalize()}.') from None


def _refuse_lossy(source: _Checkpoint, dropped: tuple[Key, ...]) -> None:
  """LossyConversionError when a Linen leaf the NNX model has no place for is not zero."""
  read = source.read(dropped, dict.fromkeys(dropped, checkpoint.host_sharding()))
  nonzero = [key for key in dropped if np.any(np.asarray(read[key]) != 0)]
  if nonzero:
    raise LossyConversionError(
        f'{", ".join(map(path_str, nonzero))} in {source.path} is not zero and the NNX model has no place '
        f'for it, so the NNX model would compute something else; {_UNCHANGED}. Pass allow_lossy=True to '
        'restore anyway.'
    )
