"""What each way of writing a training step costs on the backend present, next to the Linen step.

Run: python benchmarks/step_variants.py [REPEATS]

`benchmarks/steps.py` times what `migrate` writes; this times the choices behind it, by hand, on the
same two MLPs (dispatch-bound and compute-bound), all in one process and interleaved: the Linen step
(as written, and donating its params and optimizer state), and NNX steps over `(model, optimizer)`
passing the graphdef and a dict of arrays (what `--step-style functional` writes; without and with the
state donated), closing over the graphdef, passing the `nnx.State` itself, and the model's params with a
plain optax state (no `nnx.Optimizer`). Prints µs per step, best of REPEATS loops (default 5), and the
ratio to the Linen step as written; only ratios of one run compare.
"""
import sys
import time

import jax
import jax.numpy as jnp
import optax
import flax.linen as nn
from flax import nnx

print(jax.devices(), jax.__version__, flush=True)
MODELS = {'dispatch-bound': dict(width=32, depth=3, batch=16, steps=300),
          'compute-bound': dict(width=1024, depth=4, batch=512, steps=40)}
REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 5

def build(width, depth, batch, steps):
  class L(nn.Module):
    @nn.compact
    def __call__(self, x):
      for _ in range(depth - 1):
        x = nn.relu(nn.Dense(width)(x))
      return nn.Dense(1)(x)
  class M(nnx.Module):
    def __init__(self, rngs):
      self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth - 1)])
      self.out = nnx.Linear(width, 1, rngs=rngs)
    def __call__(self, x):
      for l in self.layers:
        x = nnx.relu(l(x))
      return self.out(x)
  x = jnp.ones((batch, width)); y = jnp.zeros((batch, 1)); tx = optax.sgd(1e-3)
  lm = L(); params = lm.init(jax.random.key(0), x)['params']; los = tx.init(params)
  def lbody(params, opt_state, x, y):
    loss, g = jax.value_and_grad(lambda p: ((lm.apply({'params': p}, x) - y) ** 2).mean())(params)
    u, opt_state = tx.update(g, opt_state, params); return optax.apply_updates(params, u), opt_state, loss
  lstep = jax.jit(lbody); lstep_d = jax.jit(lbody, donate_argnums=(0, 1))
  model = M(nnx.Rngs(0)); opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
  def body(m, o, x, y):
    loss, grads = nnx.value_and_grad(lambda m: ((m(x) - y) ** 2).mean())(m)
    o.update(m, grads); return loss
  def fbody(graphdef, state, x, y):
    m, o = nnx.merge(graphdef, state); loss = body(m, o, x, y)
    return loss, nnx.to_pure_dict(nnx.state((m, o)))
  fstep = jax.jit(fbody); fstep_d = jax.jit(fbody, donate_argnums=(1,))
  gd, st = nnx.split((model, opt)); st = nnx.to_pure_dict(st)
  cstep = jax.jit(lambda state, x, y: fbody(gd, state, x, y))
  gds, sts = nnx.split((model, opt))  # nnx.State, not a pure dict
  def sbody(state, x, y):
    m, o = nnx.merge(gds, state); loss = body(m, o, x, y); return loss, nnx.state((m, o))
  sstep = jax.jit(sbody)
  gdm, pm = nnx.split(model, nnx.Param); pm = nnx.to_pure_dict(pm); pos = tx.init(pm)
  def pbody(params, opt_state, x, y):
    def loss_fn(p):
      return ((nnx.merge(gdm, p)(x) - y) ** 2).mean()
    loss, g = jax.value_and_grad(loss_fn)(params)
    u, opt_state = tx.update(g, opt_state, params); return optax.apply_updates(params, u), opt_state, loss
  pstep = jax.jit(pbody)
  def loop3(step, a, b):
    def run(n):
      p, o = a, b
      for _ in range(n): p, o, l = step(p, o, x, y)
      return l
    return run
  def loopf(step, s0, *pre):
    def run(n):
      s = s0
      for _ in range(n): l, s = step(*pre, s, x, y)
      return l
    return run
  copy = lambda t: jax.tree.map(jnp.array, t)
  runs = {'linen': loop3(lstep, params, los), 'linen donate': lambda n: loop3(lstep_d, copy(params), copy(los))(n),
          'functional': loopf(fstep, st, gd), 'functional donate': lambda n: loopf(fstep_d, copy(st), gd)(n),
          'closed graphdef': loopf(cstep, st), 'nnx.State': loopf(sstep, sts), 'params+optax': loop3(pstep, pm, pos)}
  for f in runs.values(): jax.block_until_ready(f(2))
  best = dict.fromkeys(runs, 1e9)
  for _ in range(REPEATS):
    for k, f in runs.items():
      t = time.perf_counter(); jax.block_until_ready(f(steps)); best[k] = min(best[k], (time.perf_counter() - t) / steps)
  return best

for name, size in MODELS.items():
  best = build(**size)
  print(name, flush=True)
  for k, v in best.items(): print(f'  {k:18s} {v*1e6:9.1f} us  {v/best["linen"]:.2f}x Linen', flush=True)
