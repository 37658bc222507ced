"""L2N002 on config-driven code: `partial(nn.Dense, ...)` ModuleDefs become constructions with their
arguments, and layers created under a construction-time `if` (a config flag) exist in NNX exactly when
the flag says so. Both settings of the flag match Linen (outputs, gradients, train mode with the same
dropout masks); tests on the call (its inputs, a train/eval switch) stay Linen with a TODO."""

import jax
import numpy as np
import pytest

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules import test_fixture_parity as fixture_parity
from tests.codemods.rules import training_parity as parity

RULES = registry.select_rules(['L2N002'])
CASE = 'L2N002/config_partial_conditional'


@pytest.mark.parametrize('use_norm', [True, False])
def test_both_settings_of_the_flag_build_what_linen_builds_and_train_alike(use_norm):
  """Eval-mode parity for both settings: fixtures/L2N002/config_partial_conditional.parity.json; here the layers
  each setting builds and a train-mode call with the same dropout masks."""
  entry = fixture_parity.spec(CASE, entry_id='norm' if use_norm else 'no-norm')
  linen_module, variables, model, (x,) = fixture_parity.models(CASE, entry)
  assert (model.layer_norm is None) != use_norm and (model.dropout is None) == use_norm
  assert model.linear1.bias is None  # use_bias=False from the partial
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_module, model, x))
  model.train()
  with parity.same_masks():
    want = linen_module.apply(variables, x, train=True, rngs={'dropout': jax.random.key(3)})
    np.testing.assert_allclose(model(x), want, atol=1e-5)
  assert use_norm or not np.allclose(want, linen_module.apply(variables, x))  # dropout ran without the norm


SOURCE = '''import functools
import flax.linen as nn


class M(nn.Module):
  width: int
  deep: bool

  @nn.compact
  def __call__(self, x, train: bool = False):
{body}
'''


@pytest.mark.parametrize('body, reason', [
    ('    if x.shape[-1] > 4:\n      x = nn.Dense(self.width)(x)\n    return x',
     'a submodule created under a condition on the call'),
    ('    if train:\n      x = nn.Dense(self.width)(x)\n    return x', 'a submodule created under a train/eval switch'),
    ('    if self.deep:\n      x = nn.Dense(self.width)(x)\n    elif x.ndim > 2:\n      x = nn.Dense(2)(x)\n    return x',
     'a submodule created under a condition on the call'),  # in an elif chain too
    ('    dense = functools.partial(nn.Dense, use_bias=False)\n    layers = [dense]\n    return dense(self.width)(x)',
     'the partial dense used other than by calling it'),
])
def test_conditions_and_partials_it_cannot_keep_stay_linen(body, reason):
  result = transform_source(SOURCE.format(body=body), RULES)
  assert 'class M(nn.Module)' in result.source
  (todo,) = [e for e in result.entries if e.kind == 'todo']
  assert todo.message.startswith('class M left as Linen: ') and reason in todo.message, todo.message


def test_the_report_names_layers_as_linen_does_when_the_condition_holds():
  """Linen numbers auto-named layers in creation order, so Dense_1 is Dense_0 when `deep` is False: the report
  gives the names with every conditional layer created, and says that they shift."""
  source = SOURCE.format(body='    if self.deep:\n      x = nn.Dense(self.width)(x)\n    return nn.Dense(2)(x)')
  result = transform_source(source, RULES)
  (record,) = result.classes
  assert [(c.linen_name, c.nnx_attribute) for c in record.children] == [('Dense_0', 'linear1'), ('Dense_1', 'linear2')]
  assert 'self.linear1 = nnx.Linear(in_features=linear1_in_features, out_features=self.width, rngs=rngs) if self.deep ' \
         'else None' in result.source
  assert any('the auto-named layers created after it shift down' in e.message for e in result.entries)
