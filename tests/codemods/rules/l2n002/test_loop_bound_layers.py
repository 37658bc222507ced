"""jax-md's UMA convolutions (fixture `jax_md_so2_convolution`, whose parity sidecar checks the ports on transferred
parameters): a layer built in a loop and bound to a local that the next statement calls becomes an element of an
`nnx.List` the loop indexes, and a size bound once then rebound under an `if` on fields folds into one conditional
expression in `__init__`. A port that runs the loop's layers in another order, or sizes fc_m0 without the rebinding,
fails the same comparison."""

import pytest
from flax import nnx

import nnx_bridge
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec

CASE = 'L2N002/jax_md_so2_convolution'


def test_the_loop_s_local_goes_and_the_rebound_size_is_one_expression():
  out = (FIXTURES / f'{CASE}.out.py').read_text()
  assert 'so2_m_conv = ' not in out and 'x_m_r, x_m_i = self.so2_m_convs[i](x_m)' in out
  assert 'out_features=(((self.m_output_channels * (self.lmax + 1)) + self.extra_m0_output_channels) if ' \
         'self.extra_m0_output_channels is not None else (self.m_output_channels * (self.lmax + 1)))' in out


def test_a_port_running_the_loop_s_layers_in_another_order_fails():
  linen_module, variables, nnx_model, xs = models(CASE, spec(CASE, 'SO2Convolution', 'plain'), perturb=True)
  assert nnx_bridge.compare(linen_module, variables, nnx_model, *xs).ok
  first, second = nnx_model.so2_m_convs
  swapped = nnx.List([second, first])  # each order's convolution run on the other's slice
  nnx_model.so2_m_convs = swapped
  with pytest.raises(nnx_bridge.MappingError, match='does not fit NNX so2_m_convs/0'):  # order 1 has 2 coefficients,
    nnx_bridge.compare(linen_module, variables, nnx_model, *xs)  # order 2 one: their kernels do not even line up


def test_a_port_sizing_fc_m0_without_the_rebinding_cannot_take_the_linen_parameters():
  linen_module, variables, _, xs = models(CASE, spec(CASE, 'SO2Convolution', 'extra'))
  namespace = {}
  exec(compile((FIXTURES / f'{CASE}.out.py').read_text().replace(
      ') + self.extra_m0_output_channels) if', ')) if'), 'port.py', 'exec'), namespace)
  wrong = namespace['SO2Convolution'](2, 2, 2, 3, fc_m0_in_features=5, so2_m_convs_fc_in_features=(5, 5),
                                      rngs=nnx.Rngs(0))
  with pytest.raises(nnx_bridge.MappingError, match=r'fc_m0/bias float32\[9\] does not fit NNX fc_m0/bias float32\[6\]'):
    nnx_bridge.compare(linen_module, variables, wrong, *xs)
