"""`linen2nnx migrate --check` on one file, as a pre-commit hook runs it: seconds against `python -c pass`.

Run: python benchmarks/startup.py [--repeats N]

Times, in the same run (median of N, default 9, each a fresh process): `python -c pass`; `migrate --check` on a
file that never mentions flax (decided from its bytes: libcst and the rules are not imported); and on a 6-line
Linen file (the whole migration). Targets (issue 35, item 8): <= 0.15 s and <= 0.5 s.
"""

from __future__ import annotations

import argparse
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
  with tempfile.TemporaryDirectory() as folder:
    root = pathlib.Path(folder)
    (root / 'plain.py').write_text(PLAIN)
    (root / 'model.py').write_text(LINEN)
    migrate = [sys.executable, '-m', 'codemods.cli', 'migrate', '--check']
    baseline = seconds([sys.executable, '-c', 'pass'], args.repeats, root)
    plain = seconds([*migrate, 'plain.py'], args.repeats, root)
    linen = seconds([*migrate, 'model.py'], args.repeats, root)
  print(f'python -c pass: {baseline:.3f} s')
  print(f'migrate --check, a file without flax: {plain:.3f} s ({plain / baseline:.1f}x python -c pass; target 0.15 s)')
  print(f'migrate --check, a 6-line Linen file: {linen:.3f} s ({linen / baseline:.1f}x python -c pass; target 0.5 s)')
  return 0


if __name__ == '__main__':
  sys.exit(main())
