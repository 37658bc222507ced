"""Per-step time of a Linen training script vs the code `linen2nnx migrate` makes of it.

Run: python benchmarks/steps.py [--steps N] [--repeats R] [--skip-compile]

The Linen script (an MLP trained with optax under `@jax.jit`, its timing loop included) is
generated for a dispatch-bound model (narrow, few layers, small batch) and a compute-bound one
(wide, large batch), migrated with all the rules, and both versions are run. Prints µs/step
(best of R loops of N steps) and the migrated / Linen ratio.

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

from codemods import rules as registry
from codemods.transform import transform_source

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCAN_FIXTURE = ROOT / 'fixtures' / 'L2N002' / 'scan_layers.in.py'
COMPILE_DEPTHS = (4, 32)
COMPILE_SIZE = dict(features=64, batch=8)

MODELS = {'dispatch-bound': dict(width=32, depth=3, batch=16), 'compute-bound': dict(width=1024, depth=4, batch=512)}

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


params, opt_state, loss = train_step(params, opt_state, x, y)  # compile
best = float('inf')
for _ in range({repeats}):
  start = time.perf_counter()
  for _ in range({steps}):
    params, opt_state, loss = train_step(params, opt_state, x, y)
  jax.block_until_ready(loss)
  best = min(best, (time.perf_counter() - start) / {steps})
'''


def linen_script(width: int, depth: int, batch: int, steps: int, repeats: int) -> str:
  layers = ''.join(f'    x = nn.relu(nn.Dense({width})(x))\n' for _ in range(depth - 1))
  return _SCRIPT.format(layers=layers, width=width, batch=batch, steps=steps, repeats=repeats)


def seconds_per_step(source: str, folder: pathlib.Path, name: str) -> float:
  path = folder / f'{name}.py'
  path.write_text(source)
  return runpy.run_path(str(path), run_name=name)['best']


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


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=200)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--skip-compile', action='store_true', help='skip the compile-time section (scanned layers)')
  args = parser.parse_args()
  print(f'{"model":16s} {"Linen us/step":>14s} {"migrated us/step":>17s} {"migrated / Linen":>17s}')
  with tempfile.TemporaryDirectory() as folder:
    for name, size in MODELS.items():
      steps = args.steps if name == 'dispatch-bound' else max(args.steps // 20, 5)
      linen = linen_script(**size, steps=steps, repeats=args.repeats)
      result = transform_source(linen, registry.ALL_RULES)
      todos = [e.message for e in result.entries if e.kind == 'todo']
      if todos:
        raise SystemExit(f'the benchmark script did not migrate cleanly: {todos}')
      before = seconds_per_step(linen, pathlib.Path(folder), f'linen_{name.replace("-", "_")}')
      after = seconds_per_step(result.source, pathlib.Path(folder), f'nnx_{name.replace("-", "_")}')
      print(f'{name:16s} {before * 1e6:14.1f} {after * 1e6:17.1f} {after / before:17.2f}')
  if not args.skip_compile:
    print_compile_times()


if __name__ == '__main__':
  main()
