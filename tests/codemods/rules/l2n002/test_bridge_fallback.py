"""L2N002's fallback: a Linen class that cannot become NNX (used through nn.map_variables, or not
convertible itself) stays Linen, and a converted class building it wraps it with
nnx_bridge.from_linen, initialised from example inputs given to the constructor. The converted
program runs and matches Linen: outputs and gradients, train mode with the same dropout masks."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules import test_fixture_parity as fixture_parity
from tests.codemods.rules import training_parity as parity


def _models():
  """The Linen model, its variables, the converted model and the input, as the fixture's parity spec builds them."""
  case = 'L2N002/map_variables_bridge'
  linen_module, variables, model, (x,) = fixture_parity.models(case, fixture_parity.spec(case))
  return linen_module, variables, model, x


def test_map_variables_block_is_wrapped():
  """Parity with Linen (outputs and the 4 gradients): fixtures/L2N002/map_variables_bridge.parity.json."""
  _, _, model, _ = _models()
  assert isinstance(model.map_variables_block, nnx_bridge.LinenModule)
  assert model.map_variables_block.deterministic  # Linen's train=False default: the wrapper starts in eval mode


def test_wrapped_block_matches_in_train_mode_with_the_same_masks():
  linen_module, variables, model, x = _models()
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_module, model, x))
  model.train()
  with parity.same_masks():
    want = linen_module.apply(variables, x, train=True, rngs={'dropout': jax.random.key(2)})
    got = model(x)
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert not np.allclose(got, linen_module.apply(variables, x), atol=1e-4)  # dropout really ran


def test_a_wrong_transfer_is_caught():
  """Swapping the wrapped block's kernel for another of the same shape changes the outputs."""
  linen_module, variables, model, x = _models()
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_module, model, x))
  model.map_variables_block.Dense_0['kernel'][...] = -model.map_variables_block.Dense_0['kernel'][...]
  model.eval()
  assert not np.allclose(model(x), linen_module.apply(variables, x), atol=1e-3)


UNCONVERTIBLE = '''import flax.linen as nn
import jax.numpy as jnp


class Counter(nn.Module):
  @nn.compact
  def __call__(self, x):
    self.put_variable('stats', 'last', jnp.mean(x))
    return nn.Dense(4)(x) * 2


class Model(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(Counter()(x))
'''


def test_a_class_that_is_not_converted_is_wrapped_where_it_is_used():
  result = transform_source(UNCONVERTIBLE, registry.select_rules(['L2N002']))
  source = result.source.decode() if isinstance(result.source, bytes) else result.source
  assert 'class Counter(nn.Module)' in source and 'class Model(nnx.Module)' in source
  assert 'self.counter = nnx_bridge.from_linen(Counter(), *counter_example_inputs, rngs=rngs)' in source
  todos = [e.message for e in result.entries if e.kind == 'todo']
  assert any(m.startswith('class Counter left as Linen: self.put_variable') for m in todos), todos
  assert any('self.counter: Counter stays Linen (it was not converted (see its TODO))' in m for m in todos), todos
  linen, converted = {}, {}
  exec(compile(UNCONVERTIBLE, 'linen', 'exec'), linen)
  exec(compile(source, 'nnx', 'exec'), converted)
  x = jnp.ones((2, 3))
  linen_module = linen['Model']()
  variables = linen_module.init(jax.random.key(0), x)
  model = converted['Model'](linear_in_features=4, counter_example_inputs=(x,), rngs=nnx.Rngs(0))
  report = nnx_bridge.compare(linen_module, variables, model, x)
  assert report.ok, report.to_text()
  model(x)
  np.testing.assert_allclose(model.counter.last[...], jnp.mean(x))  # the wrapper holds its 'stats' variable


KEPT = '''import flax.linen as nn


class Leaf(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(x)


class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    return Leaf()(x)


class Model(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.map_variables(Block, 'params', init=True)()(x)
'''


def test_classes_linen_only_code_uses_stay_linen_with_what_they_build():
  result = transform_source(KEPT, registry.select_rules(['L2N002']))
  source = result.source.decode() if isinstance(result.source, bytes) else result.source
  assert 'class Leaf(nn.Module)' in source and 'class Block(nn.Module)' in source
  todos = {e.message for e in result.entries if e.kind == 'todo'}
  assert 'class Block kept as Linen: nn.map_variables has no NNX counterpart; a converted class building it wraps ' \
         'it with nnx_bridge.from_linen' in todos
  assert any(m.startswith('class Leaf kept as Linen: the Linen class Block, kept as Linen, uses it') for m in todos)
  converted = {}
  exec(compile(source, 'nnx', 'exec'), converted)
  x = jnp.ones((2, 5))
  linen = {}
  exec(compile(KEPT, 'linen', 'exec'), linen)
  linen_module = linen['Model']()
  variables = linen_module.init(jax.random.key(0), x)
  model = converted['Model'](map_variables_block_example_inputs=(x,), rngs=nnx.Rngs(0))
  report = nnx_bridge.compare(linen_module, variables, model, x)
  assert report.ok, report.to_text()


def test_init_call_sites_of_a_model_with_a_wrapped_child_get_a_todo():
  source = KEPT + '''

import jax
import jax.numpy as jnp
model = Model()
variables = model.init(jax.random.key(0), jnp.ones((2, 5)))
y = model.apply(variables, jnp.ones((2, 5)))
'''
  result = transform_source(source, registry.select_rules(['L2N003']))
  todos = [e.message for e in result.entries if e.kind == 'todo' and e.code == 'L2N003']
  assert any('map_variables_block_example_inputs' in m and 'not derived from its inputs' in m for m in todos), todos


def _namespaces(linen_source: str, port: str, wrong: tuple[str, str]) -> tuple[dict, dict, dict]:
  """The Linen module, its port and the port with `wrong[0]` replaced by `wrong[1]`, each run as a module."""
  spaces = ({}, {}, {})
  for namespace, source in zip(spaces, (linen_source, port, port.replace(*wrong))):
    exec(compile(source, 'module', 'exec'), namespace)
  return spaces


ACTIVATIONS = '''import flax.linen as nn


@nn.jit
class GateActivation(nn.Module):
  @nn.compact
  def __call__(self, gating, x):
    return x * nn.sigmoid(nn.Dense(x.shape[-1], name='gate')(gating))


@nn.jit
class SeparableActivation(nn.Module):
  @nn.compact
  def __call__(self, scalars, x):
    return x + nn.silu(nn.Dense(x.shape[-1], name='scalars')(scalars))


class Edgewise(nn.Module):
  hidden: int = 4
  act_type: str = 'gate'

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.hidden, name='so2_conv')(x)
    if self.act_type == 'gate':
      act = GateActivation(name='act')
    else:
      act = SeparableActivation(name='act')
    return act(h, h)
'''


def test_two_linen_classes_an_if_binds_to_one_local_are_each_wrapped_in_their_arm():
  """jax-md's Edgewise: `act = GateActivation(...)` or `act = SeparableS2Activation(...)` by a field, both Linen;
  one call serves either wrapper, whose example inputs are one constructor argument, and each arm runs as Linen."""
  result = transform_source(ACTIVATIONS, registry.select_rules(['L2N002']))
  assert 'class Edgewise(nnx.Module)' in result.source, result.source
  assert ", *, so2_conv_in_features: int, act_example_inputs: tuple, rngs: nnx.Rngs):" in result.source
  assert "nnx_bridge.from_linen(SeparableActivation(name='act'), *act_example_inputs, rngs=rngs)" in result.source
  linen, converted, wrong = _namespaces(ACTIVATIONS, result.source, ('return act(h, h)', 'return act(h, -h)'))
  x = jax.random.normal(jax.random.key(1), (2, 3))
  h = jnp.ones((2, 4))
  for act_type in ('gate', 'separable'):
    linen_module = linen['Edgewise'](act_type=act_type)
    variables = linen_module.init(jax.random.key(0), x)
    for namespace, same in ((converted, True), (wrong, False)):
      model = namespace['Edgewise'](act_type=act_type, so2_conv_in_features=3, act_example_inputs=(h, h),
                                    rngs=nnx.Rngs(0))
      assert nnx_bridge.compare(linen_module, variables, model, x, train=False).ok == same, act_type


EXPERTS = '''import flax.linen as nn
import jax.numpy as jnp


class NoisyNetwork(nn.Module):
  @nn.compact
  def __call__(self, x, features):
    self.put_variable('stats', 'last', jnp.mean(x))
    return nn.Dense(features, name='noisy')(x)


class ExpertModel(nn.Module):
  expert_hidden_size: int = 6
  noisy: bool = False

  def setup(self):
    if self.noisy:
      self.net = NoisyNetwork()
    else:
      self.net = nn.Dense(features=self.expert_hidden_size)

  @nn.compact
  def __call__(self, x):
    if self.noisy:
      x = self.net(x, self.expert_hidden_size)
    else:
      x = self.net(x)
    return nn.Dense(2)(nn.relu(x))
'''


def test_a_wrapped_linen_arm_and_a_layer_arm_each_called_under_its_own_test_convert():
  """dopamine's MoE experts: `self.net` is the noisy network (Linen, wrapped) or an nn.Dense by a field, and
  `__call__` calls each under the same test with its own arguments; the Dense is sized at its own call."""
  result = transform_source(EXPERTS, registry.select_rules(['L2N002']))
  assert 'class ExpertModel(nnx.Module)' in result.source, result.source
  assert 'self.net = nnx.Linear(in_features=net_in_features, out_features=self.expert_hidden_size' in result.source
  linen, converted, wrong = _namespaces(EXPERTS, result.source, ('nnx.relu(', 'nnx.tanh('))
  x = jax.random.normal(jax.random.key(1), (2, 3))
  for noisy in (False, True):
    linen_module = linen['ExpertModel'](noisy=noisy)
    variables = linen_module.init(jax.random.key(0), x)
    for namespace, same in ((converted, True), (wrong, False)):
      model = namespace['ExpertModel'](noisy=noisy, net_in_features=3, linear_in_features=6,
                                       net_example_inputs=(x, 6), rngs=nnx.Rngs(0))
      assert nnx_bridge.compare(linen_module, variables, model, x, train=False).ok == same, noisy
