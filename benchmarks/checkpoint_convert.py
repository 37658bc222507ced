"""Streaming checkpoint conversion against a plain directory copy: time, throughput and peak memory.

Run: python benchmarks/checkpoint_convert.py [--arrays N] [--array-mb MB] [--dir DIR] [--restore]

Writes a Linen checkpoint of N float32 kernels of about MB MiB each (default 5 x 512 MiB) with
`ocp.StandardCheckpointer` in a temporary directory, then times `shutil.copytree` of it,
`linen_to_nnx_checkpoint` of it, and, for reference, orbax restoring the whole tree and saving
it again (what a converter without streaming does). Each conversion runs in its own child
process, whose peak resident memory comes from `os.wait4`; the parent never holds the arrays.
Everything is deleted afterwards. Targets: conversion throughput >= 0.5x the copy's, peak RSS
< 1.5x the largest array + 300 MiB.

`--restore` times `restore_linen_checkpoint` of the same checkpoint into an abstract NNX state
(the leaves `mapping_by_path` pairs, on the default device) against orbax's own
`StandardCheckpointer().restore` of it into the Linen abstract tree (same device), each in its
own child process: time and peak RSS, and their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

MB = 2**20


def side(array_mb: int) -> int:
  """The side of a square float32 kernel of about `array_mb` MiB."""
  return int((array_mb * MB // 4) ** 0.5)


def mapping(arrays: int):
  from nnx_bridge.treemap import LeafRule
  from nnx_bridge.treemap import TreeMapping

  return TreeMapping(tuple(
      LeafRule(('layers', str(i), 'kernel'), (('params', f'Dense_{i}', 'kernel'),)) for i in range(arrays)
  ))


def generate(src: str, arrays: str, array_mb: str) -> dict:
  import numpy as np
  import orbax.checkpoint as ocp

  rng = np.random.default_rng(0)
  n = side(int(array_mb))
  params = {f'Dense_{i}': {'kernel': rng.standard_normal((n, n), dtype=np.float32)} for i in range(int(arrays))}
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(src, {'params': params})
  checkpointer.wait_until_finished()
  return {}


def convert(src: str, dst: str, arrays: str) -> dict:
  import jax

  from nnx_bridge.checkpoint import linen_to_nnx_checkpoint

  jax.devices()  # the runtime is up before the baseline is read
  baseline = _rss_now()
  start = time.perf_counter()
  linen_to_nnx_checkpoint(src, dst, mapping(int(arrays)))
  return {'seconds': time.perf_counter() - start, 'baseline_rss': baseline}


def orbax_whole_tree(src: str, dst: str) -> dict:
  import orbax.checkpoint as ocp

  checkpointer = ocp.StandardCheckpointer()
  start = time.perf_counter()
  checkpointer.save(dst, checkpointer.restore(src))
  checkpointer.wait_until_finished()
  return {'seconds': time.perf_counter() - start}


def _abstract_kernels(arrays: int, array_mb: int, nnx_state: bool):
  """The checkpoint's kernels as ShapeDtypeStructs on the default device: NNX Params, or the Linen tree."""
  import jax
  import numpy as np
  from flax import nnx

  n = side(array_mb)
  leaf = jax.ShapeDtypeStruct((n, n), np.float32, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  if nnx_state:
    return nnx.State({f'Dense_{i}': {'kernel': nnx.Param(leaf)} for i in range(arrays)})
  return {'params': {f'Dense_{i}': {'kernel': leaf} for i in range(arrays)}}


def restore_into_nnx(src: str, arrays: str, array_mb: str) -> dict:
  import jax

  from nnx_bridge.checkpoint_restore import restore_linen_checkpoint

  target = _abstract_kernels(int(arrays), int(array_mb), nnx_state=True)
  baseline = _rss_now()
  start = time.perf_counter()
  jax.block_until_ready(restore_linen_checkpoint(target, src))
  return {'seconds': time.perf_counter() - start, 'baseline_rss': baseline}


def orbax_restore(src: str, arrays: str, array_mb: str) -> dict:
  import jax
  import orbax.checkpoint as ocp

  target = _abstract_kernels(int(arrays), int(array_mb), nnx_state=False)
  baseline = _rss_now()
  start = time.perf_counter()
  jax.block_until_ready(ocp.StandardCheckpointer().restore(src, target))
  return {'seconds': time.perf_counter() - start, 'baseline_rss': baseline}


CHILDREN = {
    'generate': generate, 'convert': convert, 'orbax': orbax_whole_tree,
    'restore': restore_into_nnx, 'orbax_restore': orbax_restore,
}


def _rss_now() -> int:
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def run_child(mode: str, *args: object) -> tuple[dict, int]:
  """Runs one of CHILDREN in a fresh process: its result and its own peak RSS in bytes."""
  child = subprocess.Popen(
      [sys.executable, __file__, '--child', mode, *map(str, args)], stdout=subprocess.PIPE, text=True
  )
  out = child.stdout.read()
  _, status, usage = os.wait4(child.pid, 0)
  child.returncode = os.waitstatus_to_exitcode(status)
  if child.returncode:
    raise SystemExit(f'{mode} failed with exit code {child.returncode}')
  return json.loads(out.strip().splitlines()[-1]), usage.ru_maxrss * 1024  # ru_maxrss is in KiB


def timed_with_sync(seconds: float) -> float:
  """Adds the time to flush what the step left in the page cache, as the copy's figure includes it."""
  start = time.perf_counter()
  os.sync()
  return seconds + time.perf_counter() - start


def dir_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--arrays', type=int, default=5)
  parser.add_argument('--array-mb', type=int, default=512)
  parser.add_argument('--dir', default=None, help='where the temporary checkpoints go (default: $TMPDIR)')
  parser.add_argument('--restore', action='store_true',
                      help='time restore_linen_checkpoint against orbax restoring the same checkpoint')
  parser.add_argument('--child', nargs='+', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print(json.dumps(CHILDREN[args.child[0]](*args.child[1:])))
    return

  if args.restore:
    compare_restores(args)
    return
  work = tempfile.mkdtemp(prefix='ckpt-bench-', dir=args.dir)
  try:
    src = os.path.join(work, 'linen')
    run_child('generate', src, args.arrays, args.array_mb)
    size, largest = dir_bytes(src), side(args.array_mb) ** 2 * 4
    os.sync()

    start = time.perf_counter()
    shutil.copytree(src, os.path.join(work, 'copy'))
    copy_s = timed_with_sync(time.perf_counter() - start)

    result, peak = run_child('convert', src, os.path.join(work, 'nnx'), args.arrays)
    convert_s = timed_with_sync(result['seconds'])

    reference, reference_peak = run_child('orbax', src, os.path.join(work, 'orbax'))
    reference_s = timed_with_sync(reference['seconds'])
  finally:
    shutil.rmtree(work, ignore_errors=True)

  budget = 1.5 * largest + 300 * MB
  print(f'checkpoint: {args.arrays} float32 arrays of {largest / MB:.0f} MiB, {size / MB:.0f} MiB on disk')
  print(f'copytree:                  {copy_s:6.2f} s {size / MB / copy_s:6.0f} MiB/s')
  print(
      f'conversion (streaming):    {convert_s:6.2f} s {size / MB / convert_s:6.0f} MiB/s  '
      f'= {copy_s / convert_s:.2f}x the copy (target >= 0.5x)'
  )
  print(
      f'orbax restore+save, whole: {reference_s:6.2f} s {size / MB / reference_s:6.0f} MiB/s  '
      f'= {copy_s / reference_s:.2f}x the copy'
  )
  print(
      f'peak RSS, conversion: {peak / MB:.0f} MiB ({result["baseline_rss"] / MB:.0f} MiB after imports) '
      f'= {peak / largest:.2f}x the largest array (target < 1.5x + 300 MiB = {budget / MB:.0f} MiB)'
  )
  print(f'peak RSS, orbax restore+save of the whole tree: {reference_peak / MB:.0f} MiB')


def compare_restores(args: argparse.Namespace) -> None:
  """`--restore`: restore_linen_checkpoint against StandardCheckpointer().restore, as ratios of one run."""
  work = tempfile.mkdtemp(prefix='ckpt-bench-', dir=args.dir)
  try:
    src = os.path.join(work, 'linen')
    run_child('generate', src, args.arrays, args.array_mb)
    size = dir_bytes(src)
    os.sync()
    ours, ours_peak = run_child('restore', src, args.arrays, args.array_mb)
    orbax, orbax_peak = run_child('orbax_restore', src, args.arrays, args.array_mb)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  print(f'checkpoint: {args.arrays} float32 arrays of {side(args.array_mb) ** 2 * 4 / MB:.0f} MiB, '
        f'{size / MB:.0f} MiB on disk')
  for name, result, peak in (('restore_linen_checkpoint', ours, ours_peak),
                             ('StandardCheckpointer.restore', orbax, orbax_peak)):
    print(f'{name + ":":30s}{result["seconds"]:6.2f} s  peak RSS {peak / MB:6.0f} MiB '
          f'({result["baseline_rss"] / MB:.0f} MiB before the restore)')
  print(f'ratio (restore_linen_checkpoint / orbax): time {ours["seconds"] / orbax["seconds"]:.2f}x, '
        f'peak RSS {ours_peak / orbax_peak:.2f}x, '
        f'peak RSS above the baseline '
        f'{(ours_peak - ours["baseline_rss"]) / (orbax_peak - orbax["baseline_rss"]):.2f}x')


if __name__ == '__main__':
  main()
