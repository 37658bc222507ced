"""nnx_bridge.precision: the context both sides of a parity check run in, and the calibrated tolerance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_bridge import precision


def test_a_difference_within_ten_times_the_noise_passes_and_one_well_above_fails():
  want = np.array([1.0, -2.0])
  # noise 1e-3: the tolerance is 1e-5 + 1e-5 * |want| + 10 * 1e-3, about 1e-2
  assert precision.within(want + 5e-3, want, atol=1e-5, rtol=1e-5, noise=1e-3)
  assert not precision.within(want + 5e-2, want, atol=1e-5, rtol=1e-5, noise=1e-3)
  assert not precision.within(want + [0.0, 0.011], want, atol=1e-5, rtol=1e-5, noise=1e-3)  # one element is enough
  assert precision.within(want + 5e-2, want, atol=1e-5, rtol=1e-5, noise=1e-3, factor=100)


def test_without_noise_the_tolerance_is_atol_and_rtol():
  want = np.array([1.0, -2.0])
  assert precision.within(want + 1.5e-5, want, atol=1e-5, rtol=1e-5)
  assert not precision.within(want + 1e-4, want, atol=1e-5, rtol=1e-5)
  assert not precision.within(want[:1], want, atol=1.0, rtol=1.0, noise=1.0)  # shapes must agree


def test_the_noise_is_the_largest_difference_between_the_two_precisions():
  assert precision.noise(np.array([1.0, 2.003]), np.array([1.001, 2.0])) == pytest.approx(3e-3)
  assert precision.noise(np.ones(2), np.ones(3)) == 0.0  # nothing to calibrate from
  assert precision.noise(np.array([np.nan]), np.array([1.0])) == 0.0


def test_the_context_sets_the_precision_also_for_functions_jitted_before_it():
  product = jax.jit(lambda a, b: a @ b)
  x = jnp.ones((2, 2))
  product(x, x)  # compiled at whatever precision the environment sets
  with precision.matmul_precision('highest'):
    assert jax.config.jax_default_matmul_precision == 'highest'
    assert 'precision = [HIGHEST, HIGHEST]' in product.lower(x, x).as_text()
  with precision.matmul_precision('default'):
    assert 'precision = [DEFAULT, DEFAULT]' in product.lower(x, x).as_text()


def test_an_unknown_precision_is_refused():
  with pytest.raises(ValueError, match="unknown matmul precision 'bf16'; give one of highest, default"):
    precision.matmul_precision('bf16')
