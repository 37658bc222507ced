"""Per-step time of a small MLP SGD step: Linen vs a native NNX port vs the from_linen wrapper.

Run: python benchmarks/bridge_step.py [--steps N] [--repeats R]

Prints microseconds per step (best of R timed runs of N steps each) and ratios against
Linen + jax.jit and, for each NNX mode, wrapped / native. A dispatch-bound model on purpose:
this is where per-call Python overhead shows.
"""

from __future__ import annotations

import argparse
import time
import typing as tp

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import nnx

from nnx_bridge import from_linen

WIDTH, DEPTH, BATCH = 32, 3, 16


class LinenMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(DEPTH - 1):
      x = nn.relu(nn.Dense(WIDTH)(x))
    return nn.Dense(1)(x)


class NativeMLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.hidden = nnx.List([nnx.Linear(WIDTH, WIDTH, rngs=rngs) for _ in range(DEPTH - 1)])
    self.out = nnx.Linear(WIDTH, 1, rngs=rngs)

  def __call__(self, x):
    for layer in self.hidden:
      x = nnx.relu(layer(x))
    return self.out(x)


def _loss(model, x, y):
  return ((model(x) - y) ** 2).mean()


def linen_step() -> tp.Callable[[], tp.Any]:
  model, tx = LinenMLP(), optax.sgd(1e-3)
  x, y = jnp.ones((BATCH, WIDTH)), jnp.zeros((BATCH, 1))
  params = model.init(jax.random.key(0), x)['params']
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state, x, y):
    grads = jax.grad(lambda p: ((model.apply({'params': p}, x) - y) ** 2).mean())(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  carry = [params, opt_state]

  def run():
    carry[0], carry[1] = step(carry[0], carry[1], x, y)
    return carry[0]

  return run


def nnx_jit_step(model: nnx.Module, graph: bool) -> tp.Callable[[], tp.Any]:
  optimizer = nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param)
  x, y = jnp.ones((BATCH, WIDTH)), jnp.zeros((BATCH, 1))

  @nnx.jit(graph=graph)
  def step(model, optimizer, x, y):
    optimizer.update(model, nnx.grad(_loss)(model, x, y))

  return lambda: step(model, optimizer, x, y)


def split_merge_step(model: nnx.Module, pure: bool = False) -> tp.Callable[[], tp.Any]:
  """Split once, jax.jit over the state, merge back only when the model is read.

  With `pure`, the state crosses the jit boundary as plain arrays (`nnx.as_pure`), not Variables:
  fewer pytree nodes to flatten per call.
  """
  optimizer = nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  state = nnx.as_pure(state) if pure else state
  x, y = jnp.ones((BATCH, WIDTH)), jnp.zeros((BATCH, 1))

  @jax.jit
  def step(state, x, y):
    model, optimizer = nnx.merge(graphdef, state)
    optimizer.update(model, nnx.grad(_loss)(model, x, y))
    new = nnx.state((model, optimizer))
    return nnx.as_pure(new) if pure else new

  carry = [state]

  def run():
    carry[0] = step(carry[0], x, y)
    return carry[0]

  return run


def wrapped() -> nnx.Module:
  return from_linen(LinenMLP(), jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32), rngs=nnx.Rngs(0))


def time_per_step(run: tp.Callable[[], tp.Any], steps: int, repeats: int) -> float:
  jax.block_until_ready(run())  # compile
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(steps):
      out = run()
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - start) / steps)
  return best * 1e6


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--repeats', type=int, default=5)
  args = parser.parse_args()

  cases = {
      'linen + jax.jit': linen_step,
      'native nnx + nnx.jit': lambda: nnx_jit_step(NativeMLP(nnx.Rngs(0)), graph=True),
      'wrapped + nnx.jit': lambda: nnx_jit_step(wrapped(), graph=True),
      'native nnx + nnx.jit(graph=False)': lambda: nnx_jit_step(NativeMLP(nnx.Rngs(0)), graph=False),
      'wrapped + nnx.jit(graph=False)': lambda: nnx_jit_step(wrapped(), graph=False),
      'native nnx + split/merge + jax.jit': lambda: split_merge_step(NativeMLP(nnx.Rngs(0))),
      'wrapped + split/merge + jax.jit': lambda: split_merge_step(wrapped()),
      'native nnx + split/merge(as_pure) + jax.jit': lambda: split_merge_step(NativeMLP(nnx.Rngs(0)), pure=True),
      'wrapped + split/merge(as_pure) + jax.jit': lambda: split_merge_step(wrapped(), pure=True),
  }
  times = {name: time_per_step(make(), args.steps, args.repeats) for name, make in cases.items()}
  base = times['linen + jax.jit']
  print(f'{"case":46s} {"us/step":>9s} {"x linen":>8s} {"x native":>9s}')
  for name, us in times.items():
    native = times.get(name.replace('wrapped', 'native nnx'))
    vs_native = f'{us / native:9.2f}' if name.startswith('wrapped') else ''
    print(f'{name:46s} {us:9.1f} {us / base:8.2f} {vs_native}')


if __name__ == '__main__':
  main()
