"""L2N002 on nn.vmap ensembles, nn.jit submodules and scans with metadata_params: the converted code holds
Linen's stacked params with the same shapes, and outputs and gradients match (the fixture's parity spec,
tests/codemods/rules/test_fixture_parity.py); a swapped ensemble member is caught; train/eval arguments a
lifted call drops leave static_argnums renumbered; other options stay Linen with a TODO naming them."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules import test_fixture_parity as fixture_parity
from tests.codemods.rules.l2n002.kept_linen import kept_with

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002'
RULES = registry.select_rules(['L2N002'])
CASE = 'L2N002/vmap_jit_stack'


def test_ensemble_members_differ_and_a_swapped_member_is_caught():
  """Each member has its own params (split_rngs params), and the parity check sees a reordered ensemble only
  through the mean: swapping two members' first kernels changes the output."""
  linen_module, variables, model, (x,) = fixture_parity.models(CASE, fixture_parity.spec(CASE, 'Ensemble'))
  kernel = variables['params']['VmapHead_0']['Dense_0']['kernel']
  assert not np.allclose(kernel[0], kernel[1])
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_module, model, x))
  np.testing.assert_allclose(model(x), linen_module.apply(variables, x), atol=1e-5)
  swapped = model.heads.linear1.kernel[...]
  model.heads.linear1.kernel[...] = swapped[jnp.array([1, 0, 2])]
  assert not np.allclose(model(x), linen_module.apply(variables, x), atol=1e-3)


def test_metadata_params_become_transform_metadata():
  source = (FIXTURES / 'vmap_jit_stack.out.py').read_text()
  assert source.count("transform_metadata={nnx.PARTITION_NAME: 'layers'}") == 2  # vmap creation and scan call


MODES = '''import flax.linen as nn


class Block(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x, deterministic, scale):
    y = nn.Dropout(0.5)(nn.Dense(self.features)(x), deterministic=deterministic)
    return y * scale if scale > 1 else y


class M(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool):
    return nn.remat(Block, static_argnums=(2, 3))(4)(x, not train, 2.0)
'''


def test_static_argnums_skip_the_dropped_train_eval_argument():
  """Linen's `(2, 3)` names `deterministic` (dropped: model.train() / eval() set it) and `scale`, now argument 2."""
  result = transform_source(MODES, RULES)
  assert 'nnx.remat(lambda module, x1, x2: module(x1, x2), static_argnums=(2,))(self.block, x, 2.0)' in result.source, \
      result.source
  linen, converted = {}, {}
  exec(compile(MODES, 'linen', 'exec'), linen)
  exec(compile(result.source, 'nnx', 'exec'), converted)
  x = jnp.ones((2, 3))
  linen_module = linen['M']()
  variables = linen_module.init(jax.random.key(0), x, train=False)
  model = converted['M'](block_linear_in_features=3, rngs=nnx.Rngs(0))
  report = nnx_bridge.compare(linen_module, variables, model, x)
  assert report.ok, report.to_text()


LIFTED = '''import flax.linen as nn


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return nn.Dense(3)(x), None


class M(nn.Module):
  @nn.compact
  def __call__(self, x):
    return {lifted}()(x, None)
'''


@pytest.mark.parametrize('lifted, reason', [
    ("nn.vmap(Block, variable_axes={'params': 0}, split_rngs={'params': True})", 'with axis_size='),
    ("nn.scan(Block, variable_axes={'params': 1}, split_rngs={'params': True}, length=2)", 'stacked on axis 0'),
    ("nn.scan(Block, variable_axes={'params': 0}, split_rngs={'params': False}, length=2)",
     "split_rngs={'params': True, ...}"),
    ("nn.vmap(Block, variable_axes={'params': 0}, split_rngs={'params': True}, in_axes=1, axis_size=2)",
     'in_axes of 0 or None'),
    ("nn.scan(Block, variable_axes={'params': 0}, split_rngs={'params': True}, length=2, unroll=2)",
     'with the options length, variable_axes'),
    ("nn.jit(Block, backend='cpu')", 'with the options static_argnums, donate_argnums'),
    ("nn.scan(nn.remat(Block, static_argnums=(2,)), variable_axes={'params': 0}, split_rngs={'params': True}, "
     "length=2)", 'static arguments other than train/eval switches'),
])
def test_other_lifted_options_stay_linen_with_a_todo(lifted, reason):
  result = transform_source(LIFTED.format(lifted=lifted), RULES)
  assert 'class M(nn.Module)' in result.source
  todo = kept_with(result, 'Block')  # M stays Linen and lifts Block with a Linen transform: Block stays Linen too
  assert todo.message.startswith('class M left as Linen: ') and reason in todo.message, todo.message
