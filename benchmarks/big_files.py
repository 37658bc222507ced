"""`linen2nnx migrate` time and memory on one big generated Linen file, and how they grow with its size.

Run: python benchmarks/big_files.py [--sizes 50,100,200] [--kind classes|wide|dict] [--dict-entries M] [--profile N]

Generates a file like the ones code generators write: `classes` makes N small Linen modules
(`@nn.compact` Dense/Conv stacks, `setup()` variants with a list of layers and a child of the
previous class, dataclass fields), N module-level init/apply call sites and a module-level dict
literal of M entries (`--dict-entries`, default 0); `dict` makes one module and a dict literal
of N entries; `wide` makes two modules of N layers each (one `@nn.compact` method of N
Dense calls, one `setup()` of N layers called in turn). Each size is migrated in a fresh
subprocess the way one file of `migrate` is (the hierarchy pass, then all the rules with the
default options), which prints its wall time, CPU time and peak resident memory (ru_maxrss,
the interpreter and libcst included; +MB: above the imports). Prints one row per size and the
ratio CPU(size) / CPU(previous size), CPU time as the wall time depends on what else the machine
runs: with sizes doubling, ~2 is linear, ~4 quadratic; only ratios measured in the same run mean
anything. `--profile N` runs size N once under cProfile instead and prints the top functions by
cumulative and by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time

_HEADER = '''"""Generated: {count} Linen modules."""
import jax
import jax.numpy as jnp
import flax.linen as nn

'''

_COMPACT = '''
class Dense{i}(nn.Module):
  features: int = {width}
  layers: int = 2

  @nn.compact
  def __call__(self, x):
    for _ in range(self.layers):
      x = nn.Dense(self.features)(x)
      x = nn.relu(x)
    return nn.Dense({width})(x)
'''

_CONV = '''
class Conv{i}(nn.Module):
  channels: int = {width}

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Conv(self.channels, kernel_size=(3, 3))(x)
    x = nn.BatchNorm(use_running_average=not train)(x)
    x = nn.relu(x)
    x = nn.Conv(self.channels, kernel_size=(1, 1), use_bias=False)(x)
    return jnp.mean(x, axis=(1, 2))
'''

_SETUP = '''
class Block{i}(nn.Module):
  hidden: int = {width}
  depth: int = 3

  def setup(self):
    self.inner = Dense{j}()
    self.hidden_layers = [nn.Dense(self.hidden) for _ in range(self.depth)]
    self.norm = nn.LayerNorm()
    self.out = nn.Dense({width})

  def __call__(self, x):
    x = self.inner(x)
    for layer in self.hidden_layers:
      x = nn.gelu(layer(x))
    return self.out(self.norm(x))
'''

_WIDE_COMPACT = '''
class WideCompact(nn.Module):
  features: int = 8

  @nn.compact
  def __call__(self, x):
{lines}    return x
'''

_WIDE_SETUP = '''
class WideSetup(nn.Module):
  features: int = 8

  def setup(self):
{assigns}
  def __call__(self, x):
{calls}    return x
'''

_CALLS = '''
def run_{i}(x):
  model = {name}()
  variables = model.init(jax.random.key({i}), x)
  return model.apply(variables, x)
'''


def generate(size: int, kind: str, dict_entries: int) -> str:
  """The source of a generated Linen file: `size` classes (kind 'classes'), two classes of `size`
  layers each ('wide': one @nn.compact method, one setup) or a `size`-entry dict ('dict')."""
  parts = [_HEADER.format(count={'classes': size, 'wide': 2}.get(kind, 1))]
  if kind == 'wide':
    parts.append(_WIDE_COMPACT.format(lines=''.join(
        f'    x = nn.Dense(self.features + {k % 5}, name="d{k}")(x)\n    x = nn.relu(x)\n' for k in range(size))))
    parts.append(_WIDE_SETUP.format(
        assigns=''.join(f'    self.layer{k} = nn.Dense(self.features + {k % 5})\n' for k in range(size)),
        calls=''.join(f'    x = nn.relu(self.layer{k}(x))\n' for k in range(size))))
    parts.append(_CALLS.format(i=0, name='WideCompact'))
    parts.append(_CALLS.format(i=1, name='WideSetup'))
  elif kind == 'dict':
    parts.append(_COMPACT.format(i=0, width=8))
    parts.append(_CALLS.format(i=0, name='Dense0'))
    dict_entries = size
  else:
    names = []
    for i in range(size):
      width = 4 + i % 13
      if i % 3 == 0:
        parts.append(_COMPACT.format(i=i, width=width))
        names.append(f'Dense{i}')
      elif i % 3 == 1:
        parts.append(_CONV.format(i=i, width=width))
        names.append(f'Conv{i}')
      else:
        parts.append(_SETUP.format(i=i, j=i - 2, width=width))
        names.append(f'Block{i}')
    for i, name in enumerate(names):
      parts.append(_CALLS.format(i=i, name=name))
  if dict_entries:
    entries = ''.join(f"    'key_{k}': ({k}, {k % 7}.5, 'v{k}'),\n" for k in range(dict_entries))
    parts.append(f'\n\nTABLE = {{\n{entries}}}\n')
  return ''.join(parts)


def migrate_source(source: bytes, path: str) -> None:
  """What the engine does for one file: the hierarchy pass over it, then all the rules, default options."""
  from codemods.analysis.hierarchy import build_hierarchy
  from codemods.options import MigrationOptions
  from codemods.rules import ALL_RULES
  from codemods.transform import transform_source

  hierarchy = build_hierarchy({path: source}, [os.path.dirname(path)])
  transform_source(source, ALL_RULES, MigrationOptions(), hierarchy.for_file(path), path)


def _child(path: str) -> None:
  """In the subprocess: migrates `path`, prints JSON with seconds, peak and baseline ru_maxrss (MB)."""
  import codemods.rules  # noqa: F401 -- imports are not part of the figure

  base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  with open(path, 'rb') as file:
    source = file.read()
  start, cpu = time.perf_counter(), time.process_time()
  migrate_source(source, path)
  seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print(json.dumps({'seconds': seconds, 'cpu': cpu, 'peak_mb': peak, 'base_mb': base}))


def _write(directory: str, size: int, kind: str, dict_entries: int) -> tuple[str, int]:
  path = os.path.join(directory, f'generated_{kind}_{size}.py')
  source = generate(size, kind, dict_entries).encode()
  with open(path, 'wb') as file:
    file.write(source)
  return path, len(source)


def _profile(path: str, top: int) -> None:
  with open(path, 'rb') as file:
    source = file.read()
  import codemods.rules  # noqa: F401

  profiler = cProfile.Profile()
  start = time.perf_counter()
  profiler.runcall(migrate_source, source, path)
  print(f'{path}: {time.perf_counter() - start:.2f} s under cProfile')
  stats = pstats.Stats(profiler)
  for order in ('cumulative', 'tottime'):
    print(f'--- by {order}')
    stats.sort_stats(order).print_stats(top)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sizes', default='50,100,200', help='comma-separated sizes (classes, or dict entries)')
  parser.add_argument('--kind', choices=('classes', 'wide', 'dict'), default='classes')
  parser.add_argument('--dict-entries', type=int, default=0, help="a dict literal of M entries too ('classes')")
  parser.add_argument('--profile', type=int, default=0, help='profile this size instead of timing the sizes')
  parser.add_argument('--top', type=int, default=40)
  parser.add_argument('--child', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    _child(args.child)
    return
  with tempfile.TemporaryDirectory() as directory:
    if args.profile:
      _profile(_write(directory, args.profile, args.kind, args.dict_entries)[0], args.top)
      return
    print(f'{"size":>8} {"KB":>8} {"wall s":>8} {"CPU s":>8} {"ratio":>6} {"peak MB":>8} {"+MB":>7}')
    previous = None
    for size in (int(s) for s in args.sizes.split(',')):
      path, length = _write(directory, size, args.kind, args.dict_entries)
      out = subprocess.run([sys.executable, __file__, '--child', path], capture_output=True, text=True, check=True)
      row = json.loads(out.stdout.splitlines()[-1])
      ratio = f'{row["cpu"] / previous:6.2f}' if previous else '     -'
      print(f'{size:>8} {length / 1024:8.0f} {row["seconds"]:8.2f} {row["cpu"]:8.2f} {ratio} {row["peak_mb"]:8.0f} '
            f'{row["peak_mb"] - row["base_mb"]:7.0f}', flush=True)
      previous = row['cpu']


if __name__ == '__main__':
  main()
