"""Initializers defined in the call that read the input's size (dopamine's SPR `NoisyNetwork`: `def mu_init(key,
shape)` bounds its draws by `x.shape[-1]`): the function moves to __init__ with the size argument in place of
`x.shape[-1]`, so the NNX model starts from what Linen's init gives (fixture `dopamine_noisy_init`, whose parity
sidecar checks the call on transferred parameters). Here: the initial values themselves, and a wrong port."""

from __future__ import annotations

import pathlib
import runpy

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tests.codemods.rules.test_fixture_parity import FIXTURES

CASE = FIXTURES / 'L2N002' / 'dopamine_noisy_init'
X = jax.random.normal(jax.random.key(1), (2, 4))
KEY = jnp.array([3, 7], jnp.uint32)


def _initial_values(out_code: str, tmp_path: pathlib.Path) -> tuple[dict, dict]:
  """Linen's initial params of a NoisyNetwork(features=3) on 4 input features, and the port's (from `out_code`)."""
  linen = runpy.run_path(str(CASE.with_suffix('.in.py')))['NoisyNetwork'](features=3)
  path = tmp_path / 'port.py'
  path.write_text(out_code)
  port = runpy.run_path(str(path))['NoisyNetwork'](3, kernel_features=4, rngs=nnx.Rngs(0))
  params = linen.init(jax.random.key(0), X, KEY)['params']
  return params, {k: v[...] for k, v in nnx.state(port, nnx.Param).items()}


def _same_start(linen: dict, port: dict) -> bool:
  """The deterministic sigma parameters equal; the uniform mu draws within Linen's bounds, +-1/sqrt(4)."""
  bound = 1 / np.sqrt(4)
  return all(np.array_equal(linen[k], port[k]) for k in ('kernell', 'biass')) \
      and all(linen[k].shape == port[k].shape and np.all(np.abs(port[k]) <= bound) for k in ('kernel', 'bias'))


def test_an_initializer_reading_the_input_size_starts_the_port_where_linen_starts(tmp_path):
  out = CASE.with_suffix('.out.py').read_text()
  assert 'low = -1 / jnp.power(kernel_features, 0.5)' in out
  assert 'def __init__(self, features: int = 8, *, kernel_features: int, rngs: nnx.Rngs):' in out  # one size
  linen, port = _initial_values(out, tmp_path)
  assert _same_start(linen, port), (linen, port)


def test_the_initial_values_check_rejects_a_port_whose_initializer_reads_another_size(tmp_path):
  out = CASE.with_suffix('.out.py').read_text()
  wrong = out.replace('(0.5 / onp.sqrt(kernel_features))', '(0.5 / onp.sqrt(self.features))', 1)
  assert wrong != out
  linen, port = _initial_values(wrong, tmp_path)
  assert not _same_start(linen, port)
