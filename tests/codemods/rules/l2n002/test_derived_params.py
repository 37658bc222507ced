"""L2N002 on setup() attributes computed from a parameter (`codemods/rules/l2n002/derived_params.py`): the parameter
becomes a child and the attribute a property over it, which follows the parameter as Linen's setup() did at each apply
(parity with trained parameters: fixtures/L2N002/setup_derived_param.parity.json). A port that computes the attribute
once in __init__ is caught; code a property cannot run keeps the class Linen."""

import pathlib
import types

import jax
import jax.numpy as jnp
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002'
RULES = registry.select_rules(['L2N002'])
X = jnp.linspace(-1.0, 1.0, 2 * 3 * 4).reshape(2, 3, 4)


def _module(source: str, name: str) -> types.ModuleType:
  module = types.ModuleType(name)
  exec(compile(source, f'<{name}>', 'exec'), module.__dict__)
  return module


def _compare(port_source: str) -> nnx_bridge.ParityReport:
  linen = _module((FIXTURES / 'setup_derived_param.in.py').read_text(), 'linen_layer_scale')
  ported = _module(port_source, 'nnx_layer_scale')
  model = linen.FlaxTinyLayer(4)
  variables = model.init(jax.random.key(0), X)
  trained = jax.tree.map(lambda leaf: leaf * 1.7 + 0.1, variables)  # the parameter away from its initial value
  port = ported.FlaxTinyLayer(4, norm_num_features=4, rngs=nnx.Rngs(0))
  return nnx_bridge.compare(model, trained, port, X)


def test_the_property_follows_the_parameter_it_is_computed_from():
  report = _compare((FIXTURES / 'setup_derived_param.out.py').read_text())
  assert report.ok, report.to_text()
  assert 'layer_scale/lambda1_param' in {d.path for d in report.differences if d.check == 'gradient'}


def test_a_port_computing_the_attribute_once_in_init_is_caught():
  source = (FIXTURES / 'setup_derived_param.out.py').read_text()
  frozen = source.replace(
      "    self.lambda1_param = nnx.Param(jax.nn.initializers.ones(rngs.params(), (self.hidden_size,)))\n",
      "    self.lambda1_param = nnx.Param(jax.nn.initializers.ones(rngs.params(), (self.hidden_size,)))\n"
      "    self.frozen = nnx.softplus(LAYERSCALE_VALUE * self.lambda1_param[...]) * LAYERSCALE_VALUE\n",
  ).replace('    return self.lambda1 * hidden_states\n', '    return self.frozen * hidden_states\n')
  assert frozen.count('self.frozen') == 2
  report = _compare(frozen)
  assert not report.ok and 'output' in {d.check for d in report.failures}


def test_a_value_a_property_cannot_compute_keeps_the_class_linen():
  """A local of setup() is out of a property's reach; the parameter's TODO names it as before."""
  source = (FIXTURES / 'setup_derived_param.in.py').read_text()
  local = source.replace('    self.lambda1 = LAYERSCALE_VALUE * self.param(\n',
                         '    scale = LAYERSCALE_VALUE\n    self.lambda1 = scale * self.param(\n')
  read_later = source.replace('    self.lambda1 = nn.softplus(self.lambda1) * LAYERSCALE_VALUE\n',
                              '    self.lambda1 = nn.softplus(self.lambda1) * LAYERSCALE_VALUE\n'
                              '    self.lambda2 = 2 * self.lambda1\n')
  for changed in (local, read_later):  # a later setup() statement reading it would run once in NNX: refused too
    assert changed != source
    result = transform_source(changed, RULES)
    todos = [e.message for e in result.entries if e.kind == 'todo']
    assert any('FlaxTinyLayerScale left as Linen: self.param(...) inside a setup() statement' in m for m in todos), todos
    assert 'FlaxTinyLayerScale' not in {c.linen_name for c in result.classes}
