"""`linen2nnx migrate --check` on one file, as a pre-commit hook runs it: seconds against `python -c pass`.

Run: python benchmarks/startup.py [--repeats N]

Times, in the same run (median of N, default 9, each a fresh process): `python -c pass`; `migrate --check` on a
file that never mentions flax (decided from its bytes: libcst and the rules are not imported); and on a 6-line
Linen file (the whole migration). Targets (issue 35, item 8): <= 0.15 s and <= 0.5 s.

The package's bytecode is compiled first, as `pip install` leaves it: a source tree run with
PYTHONDONTWRITEBYTECODE=1 (or read-only) would otherwise compile ~100 modules on every run (~0.13 s here).
"""

from __future__ import annotations

import argparse
import compileall
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

PLAIN = 'def add(a, b):\n  return a + b\n'
LINEN = ('import flax.linen as nn\n\n\nclass M(nn.Module):\n  @nn.compact\n  def __call__(self, x):\n'
         '    return nn.Dense(3)(x)\n')


def seconds(command: list[str], repeats: int, cwd: pathlib.Path) -> float:
  """The median wall time of `command`, each run a fresh process."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, capture_output=True, check=False)
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repeats', type=int, default=9)
  args = parser.parse_args()
  root = pathlib.Path(__file__).resolve().parent.parent
  for package in ('codemods', 'nnx_bridge'):
    compileall.compile_dir(root / package, quiet=1)
  with tempfile.TemporaryDirectory() as folder:
    work = pathlib.Path(folder)
    (work / 'plain.py').write_text(PLAIN)
    (work / 'model.py').write_text(LINEN)
    migrate = [sys.executable, '-m', 'codemods.cli', 'migrate', '--check']
    baseline = seconds([sys.executable, '-c', 'pass'], args.repeats, work)
    plain = seconds([*migrate, 'plain.py'], args.repeats, work)
    linen = seconds([*migrate, 'model.py'], args.repeats, work)
  print(f'python -c pass: {baseline:.3f} s')
  print(f'migrate --check, a file without flax: {plain:.3f} s ({plain / baseline:.1f}x python -c pass; target 0.15 s)')
  print(f'migrate --check, a 6-line Linen file: {linen:.3f} s ({linen / baseline:.1f}x python -c pass; target 0.5 s)')
  return 0


if __name__ == '__main__':
  sys.exit(main())
