"""`linen2nnx migrate` throughput: Linen files/s, skipped non-Flax files/s and the -j 2 / -j 1 speed-up.

Run: python benchmarks/migrate_files.py [--copies N] [--other-files N]

Builds a corpus in a temporary directory: the repository's fixtures (`fixtures/**/*.py`)
replicated N times (default 50) and N other (default 2,000) non-Flax .py files copied from
the installed site-packages, then times `migrate` (no write) over the Linen part with -j 1 and
-j 2, and over the non-Flax part with -j 1. Targets (issue 4): >= 15 Linen files/s per core,
>= 1,000 skipped files/s, >= 1.7x on 2 cores.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import sysconfig
import tempfile
import time

from codemods.engine import migrate
from codemods.files import mentions_flax
from codemods.rules import ALL_RULES

ROOT = pathlib.Path(__file__).resolve().parent.parent


def build_corpus(root: pathlib.Path, copies: int, other_files: int) -> tuple[pathlib.Path, pathlib.Path]:
  """`root/linen` (fixtures x copies) and `root/other` (site-packages files that never mention flax)."""
  linen, other = root / 'linen', root / 'other'
  sources = [p for p in sorted((ROOT / 'fixtures').rglob('*.py')) if mentions_flax(p.read_bytes())]
  for copy in range(copies):
    for i, source in enumerate(sources):
      target = linen / f'c{copy:04d}' / f'{i:02d}_{source.name}'
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(source, target)
  other.mkdir()
  count = 0
  for path in sorted(pathlib.Path(sysconfig.get_paths()['purelib']).rglob('*.py')):
    if count == other_files:
      break
    data = path.read_bytes()
    if not mentions_flax(data):
      (other / f'{count:05d}_{path.name}').write_bytes(data)
      count += 1
  return linen, other


def timed(path: pathlib.Path, jobs: int) -> tuple[int, float]:
  start = time.perf_counter()
  result = migrate([path], rules=ALL_RULES, jobs=jobs)
  return len(result.files), time.perf_counter() - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--copies', type=int, default=50)
  parser.add_argument('--other-files', type=int, default=2000)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as directory:
    linen, other = build_corpus(pathlib.Path(directory), args.copies, args.other_files)
    files, one = timed(linen, 1)
    _, two = timed(linen, 2)
    skipped, skip_time = timed(other, 1)
  print(f'Linen files, -j 1: {files} in {one:.2f}s = {files / one:.1f} files/s')
  print(f'Linen files, -j 2: {files} in {two:.2f}s = {files / two:.1f} files/s')
  print(f'speed-up -j 2 / -j 1: {one / two:.2f}x')
  print(f'skipped non-Flax files, -j 1: {skipped} in {skip_time:.2f}s = {skipped / skip_time:.0f} files/s')


if __name__ == '__main__':
  sys.exit(main())
