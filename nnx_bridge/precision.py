"""The matmul precision a parity check runs at, and the tolerance it calibrates at the backend's default.

A parity verdict must mean the same on every backend. On a TPU, float32 matrix products and
convolutions at the backend's default precision run in bfloat16 passes (on a GPU, in TF32): a Linen
model and its exact NNX port then differ by 1e-3 to 1e-2, far above the 1e-5 that a CPU shows,
and a tolerance loose enough for that would pass wrong ports on a CPU. So there are two modes:

- `highest` (the default): both sides run under `jax.default_matmul_precision('highest')`, float32
  products in full float32 on every backend, and the tolerances are the CPU's.
- `default`: both sides run at the backend's default precision, and the Linen model runs once more
  at `highest` in the same run. For each compared leaf, the largest difference between its two
  Linen results is the noise of the backend's default precision on that leaf; the port's leaf
  passes when `|nnx - linen| <= atol + rtol * |linen| + NOISE_FACTOR * noise`. Two correct
  computations at the default precision differ by about that noise (each is one rounding away from
  the `highest` result), so a correct port passes, and a wrong one, off by far more than rounding,
  fails (an error below ten times the noise hides in it: `highest` is for that). On a CPU the two
  precisions agree, the noise is 0 and the modes give the same verdict.

The precision is a `jax.config` context: it is part of jit's cache key, so functions the models
jit are traced and compiled again inside it, at its precision. jax and numpy are imported where they are used,
so that the command line reads `PRECISIONS` for its parser without importing them.
"""

from __future__ import annotations

import contextlib
import typing as tp

HIGHEST, DEFAULT = 'highest', 'default'
PRECISIONS = (HIGHEST, DEFAULT)
NOISE_FACTOR = 10.0
"""How many times the calibrated noise a difference may be, on top of atol and rtol, in `default` mode."""


def matmul_precision(precision: str) -> contextlib.AbstractContextManager[None]:
  """The context both sides of a parity check run in: `highest`, or the backend's `default` precision.

  `default` is set explicitly, so that a `JAX_DEFAULT_MATMUL_PRECISION` in the environment does not
  turn it into another precision.
  """
  import jax

  if precision not in PRECISIONS:
    raise ValueError(f'unknown matmul precision {precision!r}; give one of {", ".join(PRECISIONS)}')
  return jax.default_matmul_precision(precision)


def backend() -> str:
  """The JAX backend the computations run on (`cpu`, `gpu`, `tpu`)."""
  import jax

  return jax.default_backend()


def describe(backend_name: str, precision: str) -> str:
  """One line: the backend and the matmul precision both sides ran at, and what the tolerance adds to atol and rtol."""
  if precision == DEFAULT:
    return (f"backend {backend_name}, matmul precision default (the backend's) on both sides; tolerance + "
            f"{NOISE_FACTOR:g} x noise, per leaf the Linen model's own difference from highest precision")
  return f'backend {backend_name}, matmul precision {precision} on both sides'


def noise(at_default: tp.Any, at_highest: tp.Any) -> float:
  """The noise scale of one leaf: the largest difference between the Linen model's results at both precisions.

  Leaves of different shapes, or not finite, have no noise scale to calibrate from: 0, so the
  comparison keeps the plain tolerances.
  """
  import numpy as np

  at_default, at_highest = np.asarray(at_default, np.float64), np.asarray(at_highest, np.float64)
  if at_default.shape != at_highest.shape:
    return 0.0
  difference = np.abs(at_default - at_highest)
  return float(difference.max(initial=0.0)) if np.all(np.isfinite(difference)) else 0.0


def within(got: tp.Any, want: tp.Any, *, atol: float, rtol: float, noise: float = 0.0,
           factor: float = NOISE_FACTOR) -> bool:
  """Whether `|got - want| <= atol + rtol * |want| + factor * noise` everywhere (shapes must agree)."""
  import numpy as np

  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  if got.shape != want.shape:
    return False
  return bool(np.all(np.abs(got - want) <= atol + rtol * np.abs(want) + factor * noise))
