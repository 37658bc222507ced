"""Per-step time of a Linen training script vs the code `linen2nnx migrate` makes of it.

Run: python benchmarks/steps.py [--steps N] [--repeats R]

The Linen script (an MLP trained with optax under `@jax.jit`, its timing loop included) is
generated for a dispatch-bound model (narrow, few layers, small batch) and a compute-bound one
(wide, large batch), migrated with all the rules, and both versions are run. Prints µs/step
(best of R loops of N steps) and the migrated / Linen ratio.
"""

from __future__ import annotations

import argparse
import pathlib
import runpy
import tempfile

from codemods import rules as registry
from codemods.transform import transform_source

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


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=200)
  parser.add_argument('--repeats', type=int, default=5)
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


if __name__ == '__main__':
  main()
