"""Streaming checkpoint conversion against a plain directory copy: time, throughput and peak memory.

Run: python benchmarks/checkpoint_convert.py [--arrays N] [--array-mb MB] [--dir DIR]

Writes a Linen checkpoint of N float32 kernels of about MB MiB each (default 5 x 512 MiB) with
`ocp.StandardCheckpointer` in a temporary directory, then times `shutil.copytree` of it,
`linen_to_nnx_checkpoint` of it, and, for reference, orbax restoring the whole tree and saving
it again (what a converter without streaming does). Each conversion runs in its own child
process, whose peak resident memory comes from `os.wait4`; the parent never holds the arrays.
Everything is deleted afterwards. Targets: conversion throughput >= 0.5x the copy's, peak RSS
< 1.5x the largest array + 300 MiB.
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


CHILDREN = {'generate': generate, 'convert': convert, 'orbax': orbax_whole_tree}


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
  parser.add_argument('--child', nargs='+', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print(json.dumps(CHILDREN[args.child[0]](*args.child[1:])))
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


if __name__ == '__main__':
  main()
