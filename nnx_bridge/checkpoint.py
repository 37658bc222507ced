"""Converts an orbax checkpoint between the Linen layout and the NNX layout, a few arrays at a time.

A Linen checkpoint is what `ocp.StandardCheckpointer().save(path, variables)` writes: leaves
grouped by collection (`params/Dense_0/kernel`). An NNX checkpoint is what the flax guide
writes, `ocp.StandardCheckpointer().save(path, nnx.state(model))`: every Variable's array under
`<path>/value`, `nnx.List` indices as strings, restored with `checkpointer.restore(path,
abstract_state)` and `nnx.merge`. Both directions follow one `TreeMapping`.

Streaming: orbax writes a checkpoint in one `save` call, so the tree handed to it holds
`_Pending` leaves (shape, dtype, sharding, no data). `_StreamingHandler`, the TypeHandler for
them, reads one batch of source arrays (orbax partial restore), builds the target arrays, hands
them to orbax's own jax.Array handler and waits until they are written before the next batch.
So one batch (`batch_bytes`, or one rule's arrays if larger) is in memory, plus orbax's and
tensorstore's buffers for it; the files are those orbax writes for jax.Arrays, with arrays over
`CHUNK_BYTES` stored in chunks (orbax's `SaveArgs.chunk_byte_size`).

Sharding metadata: orbax records each array's sharding in the checkpoint's `_sharding` file, and a
restore whose target gives a leaf no sharding (the flax guide's `restore(path, abstract_state)` with
`nnx.eval_shape`'s state) places the leaf there. A single device is recorded by name (`cpu:0`), so
such a checkpoint fails to restore on another backend ("Topology mismatch detected" on a TPU host,
whose devices are no `cpu:0`). So a leaf is recorded only when its target leaf is sharded over a
mesh (`NamedSharding`, a layout the caller asked for); every other leaf is written with no sharding
metadata, so on any backend the guide's restore gives it back as a numpy array, and a target with a
sharding places it there (`docs/checkpoints.md`, "Restoring on another backend or topology").

The plan (`Job`, `plan`, the `make` functions), the readers (`read_metadata`, `restore_arrays`)
and the writer (`write`) are public because `checkpoint_restore.restore_linen_checkpoint` checks
and reads a Linen checkpoint with them too, and `train_state_checkpoint` converts whole training
states with them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import pathlib
import re
import shutil
import socket
import tempfile
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from flax.core import meta
# The store of the array metadata files StandardCheckpointer writes: orbax exports no public name for it.
from orbax.checkpoint._src.metadata import array_metadata_store

from nnx_bridge.errors import ConversionInProgressError
from nnx_bridge.errors import LossyConversionError
from nnx_bridge.errors import StateMismatchError
from nnx_bridge.errors import UnreadableCheckpointError
from nnx_bridge.state_check import describe
from nnx_bridge.treemap import LeafRule
from nnx_bridge.treemap import TreeMapping
from nnx_bridge.treemap import normalize_path
from nnx_bridge.treemap import path_str

Key = tuple[str, ...]
T = tp.TypeVar('T')
PathLike = str | os.PathLike[str]
BATCH_BYTES = 256 * 2**20
CHUNK_BYTES = 64 * 2**20  # larger arrays are stored in chunks, so reading them back streams too
_VALUE = ('value',)  # the key orbax stores under every nnx.Variable of a saved nnx.State


@dataclasses.dataclass(frozen=True)
class Job:
  """One mapping rule in checkpoint keys: `make` turns the `sources` arrays into the `targets` arrays."""

  sources: tuple[Key, ...]
  targets: tuple[Key, ...]
  make: tp.Callable[[list[tp.Any]], list[tp.Any]]

  def describe(self) -> str:
    return f'{" + ".join(map(path_str, self.sources)) or "zeros"} -> {" + ".join(map(path_str, self.targets))}'


@dataclasses.dataclass(frozen=True)
class _Pending:
  """A target leaf handed to orbax before it exists: where it goes, what it is, which job makes it."""

  key: Key
  job: int
  shape: tuple[int, ...]
  dtype: np.dtype
  sharding: jax.sharding.Sharding
  recorded: bool  # whether its sharding goes into the checkpoint's metadata (`records_sharding`)

  @property
  def nbytes(self) -> int:
    return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def linen_to_nnx_checkpoint(
    src: PathLike,
    dst: PathLike,
    mapping: TreeMapping,
    *,
    nnx_abstract_state: tp.Any = None,
    linen_collection: str | None = None,
    allow_lossy: bool = False,
    batch_bytes: int = BATCH_BYTES,
) -> None:
  """Writes the Linen checkpoint at `src` as the NNX checkpoint `dst`, restorable as the flax guide does.

  `nnx_abstract_state` (`nnx.split(nnx.eval_shape(...))[1]`) is checked against; a leaf it shards
  over a mesh is written with that sharding recorded (`records_sharding`). `linen_collection` names the collection when `src` holds one collection's
  tree without its name (a TrainState's `params`). Dropped Linen leaves must be zero unless
  `allow_lossy`. Nothing is written unless every check passes; `dst` appears complete or not at all.
  Staging folders that killed conversions into `dst` left are removed first (`clear_staging`).
  """
  src, dst = os.path.abspath(src), os.path.abspath(dst)  # orbax takes absolute paths only
  refuse_existing(dst)
  clear_staging(dst)
  source = read_metadata(src)
  linen_key = linen_key_fn(linen_collection)
  jobs = [
      Job(tuple(map(linen_key, rule.linen)), (rule.nnx + _VALUE,), joiner(rule)) for rule in mapping.rules
  ]
  dropped = tuple(map(linen_key, mapping.dropped))
  target = None if nnx_abstract_state is None else {
      path + _VALUE: leaf for path, leaf in flatten_nnx_abstract(nnx_abstract_state).items()
  }
  made = plan(source, jobs, dropped, target, 'NNX model', src)
  if not allow_lossy:
    refuse_lossy(src, source, dropped, batch_bytes)
  write(src, dst, source, jobs, made, target or {}, batch_bytes)


def nnx_to_linen_checkpoint(
    src: PathLike,
    dst: PathLike,
    mapping: TreeMapping,
    *,
    linen_abstract_variables: tp.Any = None,
    linen_collection: str | None = None,
    batch_bytes: int = BATCH_BYTES,
) -> None:
  """Writes the NNX checkpoint at `src` (an nnx.State or its pure dict) as the Linen checkpoint `dst`.

  `linen_abstract_variables` (`jax.eval_shape(model.init, ...)`) is checked against, gives the
  shapes of dropped leaves, which come back as zeros, and the recorded shardings (`records_sharding`). With
  `linen_collection`, `dst` holds that collection's tree without its name. Nothing is written
  unless every check passes; `dst` appears complete or not at all. Staging folders that killed
  conversions into `dst` left are removed first (`clear_staging`).
  """
  src, dst = os.path.abspath(src), os.path.abspath(dst)  # orbax takes absolute paths only
  refuse_existing(dst)
  clear_staging(dst)
  source = read_metadata(src)
  suffix = _VALUE if all(key[-1:] == _VALUE for key in source) else ()
  linen_key = linen_key_fn(linen_collection)
  target = None
  if linen_abstract_variables is not None:
    flat = flatten_linen_abstract(linen_abstract_variables)
    target = {linen_key(key): leaf for key, leaf in flat.items() if linen_collection in (None, key[0])}
  jobs = [Job((rule.nnx + suffix,), tuple(map(linen_key, rule.linen)), splitter(rule)) for rule in mapping.rules]
  for key in map(linen_key, mapping.dropped):
    if target is None or key not in target:
      raise StateMismatchError(
          f'{path_str(key)} has no NNX leaf; pass linen_abstract_variables so that it can be '
          'written back as zeros of the right shape'
      )
    jobs.append(Job((), (key,), zeros_like(target[key])))
  made = plan(source, jobs, (), target, 'Linen model', src)
  write(src, dst, source, jobs, made, target or {}, batch_bytes)


# --- the plan ----------------------------------------------------------------------------------


def linen_key_fn(collection: str | None) -> tp.Callable[[Key], Key]:
  """Mapping key -> checkpoint key: the same, or without the collection for a one-collection checkpoint."""

  def linen_key(key: Key) -> Key:
    if collection is None:
      return key
    if key[0] != collection:
      raise StateMismatchError(
          f'{path_str(key)} is not in the {collection!r} collection, so a checkpoint of that '
          'collection alone cannot hold it'
      )
    return key[1:]

  return linen_key


def joiner(rule: LeafRule) -> tp.Callable[[list[tp.Any]], list[tp.Any]]:
  """A Job's `make` for a Linen -> NNX rule: the rule's Linen arrays -> [its NNX array] (concatenated if fused)."""
  return lambda parts: [TreeMapping.build_nnx_leaf(rule, dict(zip(rule.linen, parts)))]


def splitter(rule: LeafRule) -> tp.Callable[[list[tp.Any]], list[tp.Any]]:
  """A Job's `make` for an NNX -> Linen rule: [its NNX array] -> the rule's Linen arrays (split if fused)."""

  def split(values: list[tp.Any]) -> list[tp.Any]:
    linen = TreeMapping((rule,)).nnx_to_linen({rule.nnx: values[0]})
    return [linen[key] for key in rule.linen]

  return split


def zeros_like(like: tp.Any) -> tp.Callable[[list[tp.Any]], list[tp.Any]]:
  """A Job's `make` for a dropped Linen leaf written back: zeros of `like`'s shape and dtype."""
  return lambda _: [jnp.zeros(like.shape, like.dtype)]


def flatten_nnx_abstract(state: tp.Any) -> dict[Key, tp.Any]:
  """An nnx.State (of Variables) or a pure dict as {NNX path: leaf}, integer keys as strings."""
  if isinstance(state, nnx.State):
    return {normalize_path(path): leaf.get_value() for path, leaf in nnx.to_flat_state(state)}
  return flatten(state)


def flatten_linen_abstract(variables: tp.Any) -> dict[Key, tp.Any]:
  """Linen variables (boxed or not, abstract or not) as {checkpoint key: leaf}."""
  return flatten(meta.unbox(variables))


def flatten(tree: tp.Any) -> dict[Key, tp.Any]:
  """A pytree as {path with every key a string: leaf}, the keys orbax stores."""
  return {normalize_path(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def nest(flat: tp.Mapping[Key, tp.Any]) -> dict[str, tp.Any]:
  """The inverse of `flatten` for trees of dicts: {('a', 'b'): x} -> {'a': {'b': x}}."""
  tree: dict[str, tp.Any] = {}
  for key, leaf in flat.items():
    node = tree
    for part in key[:-1]:
      node = node.setdefault(part, {})
    node[key[-1]] = leaf
  return tree


def plan(
    source: dict[Key, tp.Any],
    jobs: list[Job],
    dropped: tuple[Key, ...],
    target: dict[Key, tp.Any] | None,
    target_name: str,
    src: PathLike,
    outcome: str = 'nothing written',
    covers: tuple[Key, ...] | None = None,
) -> dict[Key, jax.ShapeDtypeStruct]:
  """Every target leaf's shape and dtype, or StateMismatchError naming both sides of every problem.

  `outcome` says in the error what the caller did not do because of it. `covers` are the key
  prefixes whose leaves `target` describes (default: all); leaves made elsewhere are not checked
  against it (a TrainState's optimizer state, when only the model is known).
  """
  problems = []
  used = {key: job for job in jobs for key in job.sources}
  for key in sorted(used.keys() - source.keys()):
    problems.append(f'{used[key].describe()}: {path_str(key)} is in the mapping, not in the checkpoint')
  for key in sorted(set(dropped) - source.keys()):
    problems.append(f'{path_str(key)} (dropped): in the mapping, not in the checkpoint')
  for key in sorted(source.keys() - used.keys() - set(dropped)):
    problems.append(f'{path_str(key)}: in the checkpoint, not in the mapping (neither used nor dropped)')
  if not jax.config.jax_enable_x64:
    for key in sorted(key for key in used.keys() & source.keys() if np.dtype(source[key].dtype).itemsize == 8):
      problems.append(f'{path_str(key)}: {describe(source[key])} needs jax.config.update("jax_enable_x64", True)')
  made = {}
  for job in jobs:
    if any(key not in source for key in job.sources):
      continue
    inputs = [jax.ShapeDtypeStruct(source[key].shape, source[key].dtype) for key in job.sources]
    try:
      made.update(zip(job.targets, jax.eval_shape(job.make, inputs)))
    except (TypeError, ValueError) as error:
      problems.append(f'{job.describe()}: cannot be built from {", ".join(map(describe, inputs))}: {error}')
  if target is not None:
    covered = lambda key: covers is None or any(key[:len(prefix)] == prefix for prefix in covers)
    producer = {key: job for job in jobs for key in job.targets if covered(key)}
    for key in sorted(producer.keys() - target.keys()):
      problems.append(f'{producer[key].describe()}: the {target_name} has no leaf {path_str(key)}')
    for key in sorted(target.keys() - producer.keys()):
      problems.append(f'{path_str(key)}: in the {target_name}, nothing in the mapping makes it')
    for key in sorted(made.keys() & target.keys()):
      if describe(made[key]) != describe(target[key]):
        problems.append(
            f'{producer[key].describe()}: the checkpoint gives {describe(made[key])}, '
            f'the {target_name} expects {describe(target[key])}'
        )
  if problems:
    raise StateMismatchError(
        f'{src} does not match the mapping ({len(problems)} problems, {outcome}):\n  '
        + '\n  '.join(problems)
    )
  return made


# --- orbax ---------------------------------------------------------------------------------------


def host_sharding() -> jax.sharding.Sharding:
  """Where arrays without a target sharding go: host memory, so a conversion needs no accelerator."""
  return jax.sharding.SingleDeviceSharding(jax.devices('cpu')[0])


def records_sharding(sharding: jax.sharding.Sharding | None) -> bool:
  """Whether a target leaf's sharding is written into the checkpoint's metadata: only a layout over a mesh.

  A single device (where an array happens to live, or the host) names a device of this host only, and
  a restore on another backend without a target sharding would fail on it.
  """
  return isinstance(sharding, jax.sharding.NamedSharding)


_JSON_FILES = ('_METADATA', '_sharding', 'array_metadatas')  # what orbax reads as JSON (a folder: its files)
_DAMAGED = 'the checkpoint is damaged (truncated or overwritten): save it or copy it again'


def read_metadata(path: str) -> dict[Key, tp.Any]:
  """Shape, dtype and sharding of every leaf of the orbax checkpoint at `path`, reading no array data.

  Raises FileNotFoundError or UnreadableCheckpointError, one line naming the path and what is
  wrong with it, where orbax would fail with an AttributeError or a tensorstore traceback.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(f'No checkpoint at {path}: no such folder')
  if not os.path.isdir(path):
    raise UnreadableCheckpointError(f'{path} is a file; give the folder an orbax checkpointer saved')
  if not os.path.isfile(os.path.join(path, '_METADATA')):
    inner = [os.path.relpath(found, path) for found in _checkpoints_under(path)]
    fix = 'give the folder ocp.StandardCheckpointer().save(path, ...) wrote'
    if inner:
      more = ', ...' if len(inner) > 3 else ''
      fix = f'it holds the checkpoints {", ".join(inner[:3])}{more}: give one of those'
    raise UnreadableCheckpointError(f'{path} is not an orbax checkpoint (no _METADATA file); {fix}')
  for file in _json_files(path):
    try:
      with open(file, 'rb') as stream:
        json.load(stream)
    except (OSError, ValueError) as error:
      raise UnreadableCheckpointError(f'{file} cannot be read ({one_line_reason(error)}); {_DAMAGED}') from None
  try:
    tree = read_structure(path)
  except (OSError, ValueError, KeyError, TypeError) as error:
    raise UnreadableCheckpointError(
        f'{path} cannot be read as an orbax checkpoint ({one_line_reason(error)}); {_DAMAGED}'
    ) from None
  return flatten(tree)


def _json_files(path: str) -> list[str]:
  """The JSON files of the checkpoint at `path` that orbax reads, those it wrote."""
  files = []
  for name in _JSON_FILES:
    file = os.path.join(path, name)
    if os.path.isdir(file):
      files += sorted(os.path.join(file, inner) for inner in os.listdir(file))
    elif os.path.exists(file):
      files.append(file)
  return files


def _checkpoints_under(path: str, depth: int = 2) -> list[str]:
  """Folders up to `depth` levels below `path` that hold an orbax checkpoint (a CheckpointManager's steps)."""
  found = []
  for entry in sorted(os.scandir(path), key=lambda entry: entry.name):
    if not entry.is_dir() or entry.name.startswith('.'):
      continue
    if os.path.isfile(os.path.join(entry.path, '_METADATA')):
      found.append(entry.path)
    elif depth > 1:
      found += _checkpoints_under(entry.path, depth - 1)
  return found


def one_line_reason(error: BaseException) -> str:
  """A read error in one line: the first of its root cause (tensorstore's, which names the file), without
  the tensorstore spec and source locations appended to it."""
  for _ in range(8):
    cause = error.__cause__ or error.__context__
    if cause is None:
      break
    error = cause
  text = (str(error).strip().splitlines() or [type(error).__name__])[0]
  text = re.sub(r'\s*\[(tensorstore_spec|source locations)=.*$', '', text)
  return text if len(text) <= 300 else text[:297] + '...'


def restore_arrays(
    path: PathLike,
    source: dict[Key, tp.Any],
    keys: tp.Iterable[Key],
    shardings: tp.Mapping[Key, jax.sharding.Sharding] | None = None,
    structure: tp.Any = None,
) -> dict[Key, jax.Array]:
  """Reads only `keys` from the checkpoint at `path` (orbax partial restore), each with its sharding.

  `structure` is the checkpoint's tree (`read_structure`), read here when not given: a caller
  reading a checkpoint batch by batch reads it once.
  """
  shardings = shardings or {}
  item = {
      key: jax.ShapeDtypeStruct(source[key].shape, source[key].dtype, sharding=shardings.get(key) or host_sharding())
      for key in keys
  }
  if not item:
    return {}
  try:
    tree = _partial_template(read_structure(path) if structure is None else structure, (), item)
    args = ocp.args.PyTreeRestore(
        item=tree, restore_args=ocp.checkpoint_utils.construct_restore_args(tree), partial_restore=True
    )
    restored = flatten(ocp.PyTreeCheckpointer().restore(path, args=args))
    return {key: restored[key] for key in item}
  except Exception as error:  # orbax raises a bare Exception; the metadata was read: the arrays' files are damaged
    names = [path_str(key) for key in item]
    names = ('one of ' if len(names) > 1 else '') + ', '.join(names[:3]) + (
        f' and {len(names) - 3} more' if len(names) > 3 else '')
    raise UnreadableCheckpointError(f'{path}: cannot read {names} ({one_line_reason(error)}); {_DAMAGED}') from None


def read_structure(path: PathLike) -> tp.Any:
  """The tree of the orbax checkpoint at `path` as orbax saved it (dicts, and lists for tuples), from its metadata."""
  return ocp.PyTreeCheckpointHandler().metadata(pathlib.Path(path)).tree


def _partial_template(structure: tp.Any, prefix: Key, item: dict[Key, tp.Any]) -> tp.Any:
  """The restore template for the leaves `item` names, shaped as the checkpoint's tree `structure` is.

  Dicts keep only the entries with a leaf to read; a list (a saved tuple: an optax state) keeps
  its length, with orbax's PLACEHOLDER where nothing is read, as partial restore requires.
  """
  if isinstance(structure, dict):
    kept = {name: _partial_template(node, (*prefix, str(name)), item) for name, node in structure.items()}
    kept = {name: node for name, node in kept.items() if node is not ocp.PLACEHOLDER}
    return kept or ocp.PLACEHOLDER
  if isinstance(structure, (list, tuple)):
    kept = [_partial_template(node, (*prefix, str(index)), item) for index, node in enumerate(structure)]
    return kept if any(node is not ocp.PLACEHOLDER for node in kept) else ocp.PLACEHOLDER
  return item.get(prefix, ocp.PLACEHOLDER)


class _StreamingHandler(ocp.type_handlers.TypeHandler):
  """Saves `_Pending` leaves as jax.Arrays, making each batch just before orbax's array handler writes it.

  `array_handler` writes the leaves whose sharding is recorded, `unrecorded_handler` (the same, without
  the sharding file) the others.
  """

  def __init__(
      self,
      array_handler: ocp.type_handlers.TypeHandler,
      unrecorded_handler: ocp.type_handlers.TypeHandler,
      produce: tp.Callable[[tp.Sequence[_Pending]], list[jax.Array]],
      batch_bytes: int,
  ):
    self._array_handler = array_handler
    self._unrecorded_handler = unrecorded_handler
    self._produce = produce
    self._batch_bytes = batch_bytes

  def typestr(self) -> str:
    return self._array_handler.typestr()  # what is on disk is a plain jax.Array

  async def metadata(self, infos):
    return await self._array_handler.metadata(infos)

  async def deserialize(self, infos, args=None):
    return await self._array_handler.deserialize(infos, args)

  async def serialize(self, values, infos, args=None):
    args = args or [ocp.SaveArgs()] * len(values)
    by_job: dict[int, list[tuple[_Pending, tp.Any, tp.Any]]] = {}
    for entry in zip(values, infos, args):  # orbax's order, so the metadata files list leaves as it would
      by_job.setdefault(entry[0].job, []).append(entry)
    for batch in _by_bytes(by_job.values(), lambda entry: entry[0].nbytes, self._batch_bytes):
      arrays = await asyncio.to_thread(self._produce, [entry[0] for entry in batch])
      for handler, recorded in ((self._array_handler, True), (self._unrecorded_handler, False)):
        part = [(array, info, arg) for array, (leaf, info, arg) in zip(arrays, batch) if leaf.recorded is recorded]
        if part:  # one after the other: both append to the checkpoint's array metadata file
          await _written(await handler.serialize(*map(list, zip(*part))))
      del arrays, part  # orbax held them until written; the next batch may take their memory
    return []


async def _written(commits: tp.Sequence[tp.Any]) -> None:
  """Waits until every commit future of one `serialize` call has finished; raises the first failure."""
  outcomes = await asyncio.gather(*(asyncio.to_thread(c.result) for c in commits), return_exceptions=True)
  for outcome in outcomes:  # all have finished: nothing writes into the staging directory any more
    if isinstance(outcome, BaseException):
      raise outcome


def _by_bytes(groups: tp.Iterable[list[T]], nbytes: tp.Callable[[T], int], limit: int) -> tp.Iterator[list[T]]:
  """Consecutive groups joined while they fit in `limit` bytes; a larger group goes alone."""
  batch, size = [], 0
  for group in groups:
    group_bytes = sum(map(nbytes, group))
    if batch and size + group_bytes > limit:
      yield batch
      batch, size = [], 0
    batch += group
    size += group_bytes
  if batch:
    yield batch


def refuse_existing(dst: PathLike) -> None:
  """Raises FileExistsError if `dst` exists: a conversion never writes over anything."""
  if os.path.lexists(dst):
    raise FileExistsError(f'{dst} exists; convert into a new path')


def refuse_lossy(src: PathLike, source: dict[Key, tp.Any], dropped: tuple[Key, ...], batch_bytes: int) -> None:
  """Raises LossyConversionError if a dropped leaf is not zero, reading them a batch at a time."""
  nbytes = lambda key: math.prod(source[key].shape) * np.dtype(source[key].dtype).itemsize
  nonzero, structure = [], read_structure(src) if dropped else None
  for batch in _by_bytes(([key] for key in dropped), nbytes, batch_bytes):
    read = restore_arrays(src, source, batch, structure=structure)
    nonzero += [key for key, value in read.items() if np.any(np.asarray(value) != 0)]
  if nonzero:
    raise LossyConversionError(
        f'{", ".join(map(path_str, nonzero))} in {src} is not zero and the NNX model has no place '
        'for it, so the NNX model would compute something else. Pass allow_lossy=True to convert anyway.'
    )


def write(
    src: PathLike,
    dst: PathLike,
    source: dict[Key, tp.Any],
    jobs: list[Job],
    made: dict[Key, jax.ShapeDtypeStruct],
    target: dict[Key, tp.Any],
    batch_bytes: int,
    layout: tp.Any = None,
) -> None:
  """Streams the jobs' outputs into a new orbax checkpoint beside `dst`, renamed to `dst` once complete.

  `layout` is a pytree whose leaves sit at the output's keys (a TrainState, whose optax state
  holds tuples that a restore into it needs as such); without it, the output is nested dicts.
  """
  pending = {}
  for index, job in enumerate(jobs):
    for key in job.targets:
      sharding = getattr(target.get(key), 'sharding', None)
      pending[key] = _Pending(key, index, tuple(made[key].shape), np.dtype(made[key].dtype),
                              sharding or host_sharding(), records_sharding(sharding))
  structure = read_structure(src)

  def produce(batch: tp.Sequence[_Pending]) -> list[jax.Array]:
    batch_jobs = [jobs[index] for index in dict.fromkeys(leaf.job for leaf in batch)]
    shardings = {  # a one-to-one leaf is read straight into its target sharding
        job.sources[0]: pending[job.targets[0]].sharding
        for job in batch_jobs
        if len(job.sources) == len(job.targets) == 1
    }
    read = restore_arrays(src, source, [key for job in batch_jobs for key in job.sources], shardings, structure)
    made_arrays = {}
    for job in batch_jobs:
      made_arrays.update(zip(job.targets, job.make([read.pop(key) for key in job.sources])))
    return [jax.device_put(made_arrays.pop(leaf.key), leaf.sharding) for leaf in batch]

  # orbax's own jax.Array handler, as StandardCheckpointer saves with it, and the same without the sharding
  # file; they share the array metadata store, which the registry's jax.Array handler gives the pytree handler.
  store = array_metadata_store.Store()
  array_handler = ocp.type_handlers.ArrayHandler(array_metadata_store=store)
  unrecorded = ocp.type_handlers.ArrayHandler(array_metadata_store=store, enable_write_sharding_file=False)
  registry = ocp.type_handlers.create_type_handler_registry(
      (jax.Array, array_handler), (_Pending, _StreamingHandler(array_handler, unrecorded, produce, batch_bytes))
  )
  dst = os.path.abspath(dst)
  parent, name = os.path.split(dst)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f'.{name}.', suffix='.converting', dir=parent)
  try:
    _claim(staging, dst)
    # save_concurrent_gb as StandardCheckpointer sets it
    handler = ocp.PyTreeCheckpointHandler(save_concurrent_gb=96, type_handler_registry=registry)
    if layout is None:
      item = nest(pending)
    else:
      item = jax.tree_util.tree_map_with_path(lambda path, _: pending[normalize_path(path)], layout)
    save_args = jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=CHUNK_BYTES), item)
    ocp.Checkpointer(handler).save(os.path.join(staging, name), args=ocp.args.PyTreeSave(item, save_args))
    os.rename(os.path.join(staging, name), dst)
  finally:
    shutil.rmtree(staging, ignore_errors=True)


# --- staging folders -----------------------------------------------------------------------------

_OWNER_FILE = 'linen2nnx-owner.json'  # in a staging folder: the conversion writing it


@dataclasses.dataclass(frozen=True)
class Leftovers:
  """The staging folders of earlier conversions into one destination, as `clear_staging` left them."""

  removed: tuple[str, ...]
  """Left by a conversion on this host whose process has ended: nothing would ever finish them."""
  kept: tuple[str, ...]
  """Without an owner this host can check (written on another host, or before owners were recorded)."""


def clear_staging(dst: PathLike) -> Leftovers:
  """Removes the staging folders (`.<name>.*.converting`) that killed conversions into `dst` left.

  Each staging folder records its owner (host, pid, process start time). One is removed only
  when its owner is a process of this host that has ended (a reused pid has another start
  time); one whose owner cannot be checked is kept, for the caller to name; a live owner raises
  ConversionInProgressError, and nothing is removed: two conversions into one `dst` would race for it.
  """
  dst = os.path.abspath(dst)
  parent, name = os.path.split(dst)
  stale, kept = [], []
  for entry in sorted(os.listdir(parent)) if os.path.isdir(parent) else ():
    path = os.path.join(parent, entry)
    if not (entry.startswith(f'.{name}.') and entry.endswith('.converting') and os.path.isdir(path)):
      continue
    owner = _owner(path)
    if owner is not None and owner['dst'] != dst:
      continue  # another destination's: `.nnx.v2.*.converting` beside `nnx`
    if owner is None or owner['host'] != socket.gethostname():
      kept.append(path)
    elif _process_start(owner['pid']) == owner['started'] and _exists(owner['pid']):
      raise ConversionInProgressError(
          f'{path} is being written by process {owner["pid"]}, a conversion into {dst} that is still '
          'running; wait for it to finish, or stop it and run again'
      )
    else:
      stale.append(path)
  for path in stale:
    shutil.rmtree(path)
  return Leftovers(tuple(stale), tuple(kept))


def _claim(staging: str, dst: str) -> None:
  """Records in `staging` which process writes it, so that a later run can tell when it was abandoned."""
  pid = os.getpid()
  owner = {'dst': dst, 'host': socket.gethostname(), 'pid': pid, 'started': _process_start(pid)}
  with open(os.path.join(staging, _OWNER_FILE), 'w') as stream:
    json.dump(owner, stream)


def _owner(staging: str) -> dict[str, tp.Any] | None:
  """The owner `_claim` recorded in `staging`, or None when there is none or it is unreadable."""
  try:
    with open(os.path.join(staging, _OWNER_FILE)) as stream:
      owner = json.load(stream)
  except (OSError, ValueError):
    return None
  fields = {'dst': str, 'host': str, 'pid': int, 'started': (str, type(None))}
  if not isinstance(owner, dict) or any(k not in owner or not isinstance(owner[k], t) for k, t in fields.items()):
    return None
  return owner if owner['pid'] > 0 else None


def _process_start(pid: int) -> str | None:
  """When process `pid` started (Linux /proc: clock ticks since boot); None without /proc or such a process.

  A zombie (ended, not yet reaped) counts as ended.
  """
  try:
    with open(f'/proc/{pid}/stat') as stream:
      fields = stream.read().rpartition(')')[2].split()  # after the command name, which may hold spaces
  except OSError:
    return None
  return None if fields[0] == 'Z' else fields[19]


def _exists(pid: int) -> bool:
  """Whether a process `pid` exists (where there is no /proc to read its start time from)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True
