"""A dropout Linen builds only in train mode (jax-md's expert router: `if not deterministic and self.dropout_rate >
0: x = nn.Dropout(...)(x, deterministic=False)`) exists in NNX in both modes, since it holds no variables
(`layer_signatures.STATELESS`); the test stays at the call, reading the switch from `self.deterministic`. Parity in
eval mode: fixture `jax_md_routing_dropout`; here, train mode drops and eval mode does not, and a port that drops in
eval mode fails the comparison. A layer with variables under the same test still keeps its class Linen."""

import jax.numpy as jnp
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec

CASE = 'L2N002/jax_md_routing_dropout'


def test_the_dropout_runs_in_train_mode_only():
  _, _, port, xs = models(CASE, spec(CASE, 'RoutingMLP'))
  port.eval()
  assert jnp.array_equal(port(*xs), port(*xs))
  port.train()
  drawn = [port(*xs) for _ in range(2)]
  assert not jnp.allclose(drawn[0], drawn[1])  # a fresh mask per call, from the module's rng stream


def test_a_port_dropping_in_eval_mode_fails_the_comparison():
  linen_module, variables, _, xs = models(CASE, spec(CASE, 'RoutingMLP'))
  namespace = {}
  code = (FIXTURES / f'{CASE}.out.py').read_text().replace('if not self.deterministic and', 'if')
  exec(compile(code, 'port.py', 'exec'), namespace)
  wrong = namespace['RoutingMLP'](6, 3, 0.5, layers_0_in_features=4, rngs=nnx.Rngs(0))
  report = nnx_bridge.compare(linen_module, variables, wrong, *xs, train=False)
  assert not report.ok and ('output', 'output') in {(d.check, d.path) for d in report.failures}, report.to_text()


def test_a_layer_with_variables_under_the_switch_keeps_the_class_linen():
  source = (FIXTURES / f'{CASE}.in.py').read_bytes().replace(
      b'nn.Dropout(rate=self.dropout_rate)(x, deterministic=False)', b'nn.Dense(self.num_experts)(x)')
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert any('a submodule created under a train/eval switch (in NNX it exists in both modes)' in e.message
             for e in result.entries if e.kind == 'todo')
