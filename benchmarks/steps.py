"""Per-step time of a Linen training script vs the code `linen2nnx migrate` makes of it, in each step style.

Run: python benchmarks/steps.py [--steps N] [--repeats R] [--skip-compile] [--project-only]

The Linen script (an MLP trained with optax under `@jax.jit`, called in a loop in a `train`
function, its timing loop included) is generated for a dispatch-bound model (narrow, few layers,
small batch) and a compute-bound one (wide, large batch), migrated with all the rules once per
`--step-style` (nnx-jit, cached, functional), and every version is run. Prints µs/step (best of R
loops of N steps, the versions taking turns in each round) and each style's ratio to Linen; the
functional port's `train` splits again on each call, so a second figure drives its step from
one `nnx.split` (a loop entered once). Then the same migrated scripts with the model swapped
for the Linen MLP wrapped by `nnx_bridge.from_linen` (the bridge-wrapped model trained by the
same step): µs/step and the wrapped / native-port ratio per style.

Then the two-file project `fixtures/training/cnn_project/` (`models.py` + `train.py` with a TrainState
subclass and `create_train_state`, as flax's examples lay it out), migrated over its folder in each
style: µs/step of its `train()` (the best time of `train(steps=N + 20)` less the best of
`train(steps=20)`, over N steps, so building the state and compiling cancel out), as is
(dispatch-bound) and widened to a compute-bound size.

Then (unless --skip-compile) the compile time of scanned layers: the migration guide's MLP of
`nn.scan`-ned Blocks (fixtures/L2N002/scan_layers.in.py) and what rule L2N002 makes of it
(converted here, at run time), for 4 and 32 layers, eval mode. Times `lower(...).compile()` of a
fresh jitted function after `jax.clear_caches()` (median of 3) for the forward pass and an SGD
training step: Linen, the port under `nnx.jit` and the port split once under `jax.jit`; an
unrolled Linen MLP (a Python loop of `nn.Dense`) shows what scanning saves. Prints seconds, the
32 / 4 ratio and each NNX row's ratio to the scanned Linen row at the same depth.
"""

from __future__ import annotations

import argparse
import pathlib
import runpy
import statistics
import tempfile
import time
import typing as tp

from codemods import rules as registry
from codemods.options import STEP_STYLES
from codemods.options import MigrationOptions
from codemods.transform import transform_source

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCAN_FIXTURE = ROOT / 'fixtures' / 'L2N002' / 'scan_layers.in.py'
COMPILE_DEPTHS = (4, 32)
COMPILE_SIZE = dict(features=64, batch=8)

MODELS = {'dispatch-bound': dict(width=32, depth=3, batch=16), 'compute-bound': dict(width=1024, depth=4, batch=512)}
STYLES = tuple(reversed(STEP_STYLES))  # nnx-jit, cached, functional (the default)
_NATIVE_MODEL = 'model = MLP(linear1_in_features=x.shape[-1], rngs=nnx.Rngs(0))\n'

_SCRIPT = '''import time

import jax
import jax.numpy as jnp
import optax
import flax.linen as nn


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
{layers}    return nn.Dense(1)(x)


x = jnp.ones(({batch}, {width}))
y = jnp.zeros(({batch}, 1))
model = MLP()
params = model.init(jax.random.key(0), x)['params']
tx = optax.sgd(1e-3)
opt_state = tx.init(params)


@jax.jit
def train_step(params, opt_state, x, y):
  def loss_fn(params):
    return ((model.apply({{'params': params}}, x) - y) ** 2).mean()
  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = tx.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  return params, opt_state, loss


def train(params, opt_state, steps):
  for _ in range(steps):
    params, opt_state, loss = train_step(params, opt_state, x, y)
  return jax.block_until_ready(loss)


def seconds_per_step(steps):
  start = time.perf_counter()
  train(params, opt_state, steps)
  return (time.perf_counter() - start) / steps


seconds_per_step(2)  # compile
'''


def linen_script(width: int, depth: int, batch: int) -> str:
  layers = ''.join(f'    x = nn.relu(nn.Dense({width})(x))\n' for _ in range(depth - 1))
  return _SCRIPT.format(layers=layers, width=width, batch=batch)


def load(source: str, folder: pathlib.Path, name: str) -> dict[str, tp.Any]:
  """Runs the script (building and compiling its step); returns its globals (`seconds_per_step(steps)`, ...)."""
  path = folder / f'{name}.py'
  path.write_text(source)
  return runpy.run_path(str(path), run_name=name)


def split_once(port: dict[str, tp.Any]) -> tp.Callable[[int], float]:
  """The functional port's step driven from one `nnx.split`, the graphdef it is compiled with (a loop entered once).

  `train` splits again on each call: `jax.jit` then compares that new, equal GraphDef with the
  one it compiled with on every call. Clears the jit caches to compile afresh with this one. Each timed loop
  starts from a copy of the state, which the step donates.
  """
  import jax
  from flax import nnx

  jax.clear_caches()
  graphdef, state = nnx.split((port['model'], port['optimizer']))
  state = nnx.to_pure_dict(state)
  step, x, y = port['train_step'], port['x'], port['y']
  jax.block_until_ready(step(graphdef, jax.device_put(state, may_alias=False), x, y))  # the step donates its state

  def seconds_per_step(steps: int) -> float:
    carried = jax.device_put(state, may_alias=False)
    start = time.perf_counter()
    for _ in range(steps):
      loss, carried = step(graphdef, carried, x, y)
    jax.block_until_ready(loss)
    return (time.perf_counter() - start) / steps
  return seconds_per_step


def best_times(runs: dict[str, tp.Callable[[int], float]], steps: int, repeats: int) -> dict[str, float]:
  """Best seconds per step of each run over `repeats` rounds, the runs interleaved in each round (fair under load)."""
  best = dict.fromkeys(runs, float('inf'))
  for _ in range(repeats):
    for name, run in runs.items():
      best[name] = min(best[name], run(steps))
  return best


def compile_seconds(make_compiled, repeats: int = 3) -> float:
  """Median wall time of lowering + compiling, each time a fresh function with empty caches."""
  import jax
  times = []
  for _ in range(repeats):
    jax.clear_caches()
    start = time.perf_counter()
    make_compiled()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def scan_models():
  """The fixture's Linen MLP module and its L2N002 conversion, as the tool emits it now."""
  source = SCAN_FIXTURE.read_text()
  result = transform_source(source, registry.select_rules(['L2N002']))
  todos = [e.message for e in result.entries if e.kind == 'todo']
  if todos:
    raise SystemExit(f'{SCAN_FIXTURE.name} did not migrate cleanly: {todos}')
  linen = runpy.run_path(str(SCAN_FIXTURE), run_name='scan_layers_linen')
  nnx_namespace = {'__name__': 'scan_layers_nnx'}
  exec(compile(result.source, 'scan_layers.out.py (generated)', 'exec'), nnx_namespace)
  return linen['MLP'], nnx_namespace['MLP']


def compile_rows(depth: int, linen_mlp, nnx_mlp) -> dict[str, float]:
  """Compile seconds of each model / step at one depth."""
  import jax
  import jax.numpy as jnp
  import optax
  import flax.linen as nn
  from flax import nnx

  features, batch = COMPILE_SIZE['features'], COMPILE_SIZE['batch']
  x = jnp.ones((batch, features))
  y = jnp.zeros((batch, features))
  tx = optax.sgd(1e-3)

  class Unrolled(nn.Module):
    @nn.compact
    def __call__(self, x, training: bool):
      for _ in range(depth):
        x = jax.nn.relu(nn.Dense(features)(x))
      return x

  rows = {}
  for name, module in (('Linen unrolled', Unrolled()), ('Linen scanned', linen_mlp(features=features, num_layers=depth))):
    params = module.init(jax.random.key(0), x, training=False)['params']
    opt_state = tx.init(params)

    def forward_fn(module=module):
      return lambda params, x: module.apply({'params': params}, x, training=False)

    def train_fn(module=module):
      def train_step(params, opt_state, x, y):
        def loss_fn(params):
          return ((module.apply({'params': params}, x, training=False) - y) ** 2).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
      return train_step

    rows[f'{name} forward'] = compile_seconds(lambda: jax.jit(forward_fn()).lower(params, x).compile())
    rows[f'{name} train'] = compile_seconds(lambda: jax.jit(train_fn()).lower(params, opt_state, x, y).compile())

  model = nnx_mlp(features, depth, rngs=nnx.Rngs(0))
  model.eval()
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

  def nnx_train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(lambda m: ((m(x) - y) ** 2).mean())(model)
    optimizer.update(model, grads)
    return loss

  rows['NNX nnx.jit forward'] = compile_seconds(lambda: nnx.jit(lambda m, x: m(x)).lower(model, x).compile())
  rows['NNX nnx.jit train'] = compile_seconds(
    lambda: nnx.jit(lambda m, o, x, y: nnx_train_step(m, o, x, y)).lower(model, optimizer, x, y).compile())

  graphdef, state = nnx.split((model, optimizer))
  state = nnx.as_pure(state)

  def split_forward(state, x):
    model, _ = nnx.merge(graphdef, state)
    return model(x)

  def split_train(state, x, y):
    model, optimizer = nnx.merge(graphdef, state)
    loss = nnx_train_step(model, optimizer, x, y)
    return nnx.as_pure(nnx.state((model, optimizer))), loss

  rows['NNX split forward'] = compile_seconds(lambda: jax.jit(lambda s, x: split_forward(s, x)).lower(state, x).compile())
  rows['NNX split train'] = compile_seconds(
    lambda: jax.jit(lambda s, x, y: split_train(s, x, y)).lower(state, x, y).compile())
  return rows


def print_compile_times() -> None:
  linen_mlp, nnx_mlp = scan_models()
  low, high = COMPILE_DEPTHS
  by_depth = {depth: compile_rows(depth, linen_mlp, nnx_mlp) for depth in COMPILE_DEPTHS}
  print()
  print(f'compile time, scanned layers (features {COMPILE_SIZE["features"]}, batch {COMPILE_SIZE["batch"]}, '
        f'lower + compile, median of 3; NNX = {SCAN_FIXTURE.relative_to(ROOT)} migrated by L2N002)')
  print(f'{"model":24s} {f"L={low} s":>8s} {f"L={high} s":>8s} {f"{high}/{low}":>7s} '
        f'{f"x Linen L={low}":>13s} {f"x Linen L={high}":>14s}')
  for row in by_depth[low]:
    a, b = by_depth[low][row], by_depth[high][row]
    line = f'{row:24s} {a:8.3f} {b:8.3f} {b / a:7.2f}'
    if row.startswith('NNX'):
      base = 'Linen scanned ' + row.rsplit(' ', 1)[1]
      line += f' {a / by_depth[low][base]:13.2f} {b / by_depth[high][base]:14.2f}'
    print(line)


def migrated(linen: str, style: str) -> str:
  result = transform_source(linen, registry.ALL_RULES, MigrationOptions(step_style=style))
  problems = [e.message for e in result.entries if e.kind == 'todo' or 'not applied' in e.message]
  if problems:
    raise SystemExit(f'the benchmark script did not migrate cleanly in style {style}: {problems}')
  return result.source


def bridge_wrapped(linen: str, port: str) -> str:
  """`port` training the Linen MLP of `linen` wrapped by `nnx_bridge.from_linen` instead of the native port."""
  if port.count(_NATIVE_MODEL) != 1:
    raise SystemExit('the migrated benchmark script no longer builds its model as expected')
  linen_class = linen[linen.index('class MLP(nn.Module):'):linen.index('\n\n\nx = ')].replace('class MLP(', 'class LinenMLP(')
  head, tail = port.split(_NATIVE_MODEL)
  imports = 'import flax.linen as nn\nfrom nnx_bridge import from_linen\n'
  return (imports + head + linen_class + '\n\n\n' + 'model = from_linen(LinenMLP(), x, rngs=nnx.Rngs(0))\n' + tail)


PROJECT = ROOT / 'fixtures' / 'training' / 'cnn_project'
PROJECT_SIZES = {  # text replacements giving each size of the project
    'dispatch-bound': {},
    'compute-bound': {'features=8,': 'features=64,', 'features=16,': 'features=128,',
                      'make_batch(jax.random.key(1234), 64)': 'make_batch(jax.random.key(1234), 512)'},
}


def _project_copy(folder: pathlib.Path, name: str, size: dict[str, str], style: str | None) -> pathlib.Path:
  """The project at `size` under `folder/name`, migrated over its folder in `style` (None: the Linen original)."""
  import shutil

  from codemods.engine import migrate

  copy = folder / name
  shutil.copytree(PROJECT, copy)
  for path in copy.glob('*.py'):
    text = path.read_text()
    for old, new in size.items():
      text = text.replace(old, new)
    path.write_text(text)
  if style is not None:
    result = migrate([copy], rules=registry.ALL_RULES, write=True, jobs=1, options=MigrationOptions(step_style=style))
    todos = [e.message for o in result.files for e in o.entries if e.kind == 'todo']
    if todos or [o.status for o in result.files] != ['changed', 'changed']:
      raise SystemExit(f'the project did not migrate cleanly in style {style}: {todos}')
  return copy


def project_run(copy: pathlib.Path) -> tp.Callable[[int], float]:
  """Seconds of the project's `train(steps=n)` at `copy`, compiled beforehand (building the state is in it)."""
  import sys

  import jax

  sys.path.insert(0, str(copy))
  sys.modules.pop('models', None)
  try:
    train = runpy.run_path(str(copy / 'train.py'), run_name=f'_project_{copy.name}')['train']
  finally:
    sys.path.remove(str(copy))
    sys.modules.pop('models', None)
  jax.block_until_ready(train(steps=2)[1])  # compiled

  def timed(steps: int) -> float:
    start = time.perf_counter()
    jax.block_until_ready(train(steps=steps)[1])
    return time.perf_counter() - start

  return timed


def per_step_times(runs: dict[str, tp.Callable[[int], float]], steps: int, repeats: int) -> dict[str, float]:
  """Seconds per step of each `train()`: its best time for `steps + 20` steps less its best for 20, over `steps`.

  Building the state (eager initialisation) and the first steps cancel out. The best of each length is taken on
  its own: the best of the differences would pick the round whose short run was slowest. The runs are
  interleaved in each round (fair under load).
  """
  long, short = dict.fromkeys(runs, float('inf')), dict.fromkeys(runs, float('inf'))
  for _ in range(repeats):
    for name, run in runs.items():
      long[name] = min(long[name], run(steps + 20))
      short[name] = min(short[name], run(20))
  return {name: (long[name] - short[name]) / steps for name in runs}


def print_project_times(steps: int, repeats: int) -> None:
  with tempfile.TemporaryDirectory() as folder:
    rows = {}
    for name, size in PROJECT_SIZES.items():
      n = steps if name == 'dispatch-bound' else max(steps // 10, 10)
      label = name.replace('-', '_')
      runs = {'linen': project_run(_project_copy(pathlib.Path(folder), f'linen_{label}', size, None))}
      for style in STYLES:
        runs[style] = project_run(_project_copy(pathlib.Path(folder), f'{style.replace("-", "_")}_{label}', size, style))
      rows[name] = per_step_times(runs, n, repeats)
  print()
  print(f'the two-file project fixtures/training/cnn_project, migrated over its folder (x Linen; best of {repeats})')
  print(f'{"model":16s} {"Linen us/step":>14s} ' + ' '.join(f'{style + " us":>14s} {"x Linen":>8s}' for style in STYLES))
  for name, row in rows.items():
    print(f'{name:16s} {row["linen"] * 1e6:14.1f} '
          + ' '.join(f'{row[style] * 1e6:14.1f} {row[style] / row["linen"]:8.2f}' for style in STYLES))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=200)
  parser.add_argument('--repeats', type=int, default=7)
  parser.add_argument('--skip-compile', action='store_true', help='skip the compile-time section (scanned layers)')
  parser.add_argument('--project-only', action='store_true', help='only the two-file project section')
  args = parser.parse_args()
  if args.project_only:
    return print_project_times(args.steps, args.repeats)
  times: dict[str, dict[str, float]] = {}
  with tempfile.TemporaryDirectory() as folder:
    for name, size in MODELS.items():
      steps = args.steps if name == 'dispatch-bound' else max(args.steps // 20, 5)
      linen, label = linen_script(**size), name.replace('-', '_')
      runs = {'linen': load(linen, pathlib.Path(folder), f'linen_{label}')['seconds_per_step']}
      for style in STYLES:
        port, tag = migrated(linen, style), style.replace('-', '_')
        runs[style] = load(port, pathlib.Path(folder), f'nnx_{label}_{tag}')['seconds_per_step']
        runs[f'bridge {style}'] = load(bridge_wrapped(linen, port), pathlib.Path(folder),
                                       f'bridge_{label}_{tag}')['seconds_per_step']
      times[name] = best_times(runs, steps, args.repeats)
      functional = load(migrated(linen, 'functional'), pathlib.Path(folder), f'once_{label}')
      once = best_times({'linen': runs['linen'], 'once': split_once(functional)}, steps, args.repeats)
      times[name]['functional, split once'] = once['once'] / once['linen'] * times[name]['linen']
  print(f'per step, migrated in each --step-style (x Linen; best of {args.repeats} loops)')
  print(f'{"model":16s} {"Linen us/step":>14s} ' + ' '.join(f'{style + " us":>14s} {"x Linen":>8s}' for style in STYLES))
  for name, row in times.items():
    print(f'{name:16s} {row["linen"] * 1e6:14.1f} '
          + ' '.join(f'{row[style] * 1e6:14.1f} {row[style] / row["linen"]:8.2f}' for style in STYLES))
  for name, row in times.items():
    print(f'{name:16s} functional, the loop entered once (one nnx.split): '
          f'{row["functional, split once"] / row["linen"]:.2f} x Linen')
  print()
  print('the same steps training the Linen MLP wrapped by nnx_bridge.from_linen (x the native port, same style)')
  print(f'{"model":16s} ' + ' '.join(f'{style + " us":>14s} {"x native":>8s}' for style in STYLES))
  for name, row in times.items():
    print(f'{name:16s} ' + ' '.join(f'{row[f"bridge {style}"] * 1e6:14.1f} {row[f"bridge {style}"] / row[style]:8.2f}'
                                    for style in STYLES))
  print_project_times(args.steps, args.repeats)
  if not args.skip_compile:
    print_compile_times()


if __name__ == '__main__':
  main()
