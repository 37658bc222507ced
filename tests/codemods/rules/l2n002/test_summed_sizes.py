"""A size summed in a loop (jax-md's `num_channels_rad += num_coeffs * self.sphere_channels` per order m) and a local
of the `if` arm that builds a layer from it: the parity of `fixtures/L2N002/jax_md_radial_channels.*` proves the port
(tests/codemods/rules/test_fixture_parity.py); here, that a port summing over other orders is caught, and that a
sum reading what only the call knows keeps the class Linen."""

import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec, wrong_port

CASE = 'L2N002/jax_md_radial_channels'


def test_a_port_summing_over_other_orders_is_caught(tmp_path):
  entry = spec(CASE, 'SO2Radial', 'external weights')
  linen_module, variables, _, xs = models(CASE, entry)
  scope = wrong_port(CASE, 'for m in range(1, self.mmax + 1)))]), linears_in_features',
                     'for m in range(1, self.mmax)))]), linears_in_features', tmp_path)
  port = scope['SO2Radial'](**entry['fields'], **entry['sizes'], rngs=nnx.Rngs(0))
  with pytest.raises(nnx_bridge.MappingError):  # the radial MLP's last layer has 10 outputs, Linen's 12
    nnx_bridge.compare(linen_module, variables, port, *xs)


def test_a_sum_over_what_only_the_call_knows_keeps_the_class_linen():
  source = (FIXTURES / f'{CASE}.in.py').read_text().replace(
      'num_channels_rad += num_coeffs * self.sphere_channels', 'num_channels_rad += num_coeffs * x.shape[-2]')
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert 'class SO2Radial(nn.Module):' in result.source
  todos = [e.message for e in result.entries if e.kind == 'todo']
  assert any(m.startswith('class SO2Radial left as Linen: a constructor argument uses the local edge_channels, whose '
                          'value reads num_channels_rad, which only the call knows') for m in todos), todos
