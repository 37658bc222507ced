"""jax-md's UMA convolutions (fixture `jax_md_so2_convolution`, whose parity sidecar checks the ports on transferred
parameters): a layer built in a loop and bound to a local that the next statement calls becomes an element of an
`nnx.List` the loop indexes, and a size bound once then rebound under an `if` on fields folds into one conditional
expression in `__init__`. A port that runs the loop's layers in another order, or sizes fc_m0 without the rebinding,
fails the same comparison."""

import textwrap

import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
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


def test_a_subscript_target_reading_the_loop_variable_is_not_a_rebinding_of_it():
  """jax-md's MoE convolution fills `so2_m_conv_modules[m] = SO2MConvMoE(...)` in a loop over m: the reason it stays
  Linen is the layer kept in a dict for another loop, not `m` assigned; a real rebinding of `m` is still refused."""
  source = textwrap.dedent('''\
      import flax.linen as nn

      class Conv(nn.Module):
        @nn.compact
        def __call__(self, x):
          modules = {}
          for m in range(1, 3):
            modules[m] = nn.Dense(3, name=f'conv_{m}')
          for m in range(1, 3):
            x = modules[m](x)
          return x

      class Rebind(nn.Module):
        @nn.compact
        def __call__(self, x):
          for m in range(2):
            m = m + 1
            x = nn.Dense(3)(x) * m
          return x
      ''')
  result = transform_source(source.encode(), registry.select_rules(['L2N002']))
  todos = [e.message for e in result.entries if e.kind == 'todo']
  assert 'class Conv left as Linen: a for loop building a submodule not called where it is built (bind it outside ' \
         'the loop, or call it at once)' in todos, todos
  assert 'class Rebind left as Linen: a for loop assigning its loop variable m' in todos, todos
