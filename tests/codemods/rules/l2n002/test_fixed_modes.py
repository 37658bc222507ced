"""A train/eval argument that reads no switch of the call (flax's wmt `deterministic=config.deterministic`, ogbg's
field with a default, a literal) stays where the code gives it (fixtures/L2N002/config_modes.*, with parity): in a
layer's call it overrides what `model.train()` sets, as the config overrode everything in Linen; a port that drops it
from the call drops units in train mode, and is caught."""

import runpy

import jax
import numpy as np
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES

X = jax.random.normal(jax.random.key(1), (2, 3, 8))


def _train_mode_outputs(port_text: str, tmp_path) -> tuple[np.ndarray, np.ndarray]:
  """The Linen block (config deterministic, dropout 0.3) and its port after model.train(), on the same parameters."""
  source = runpy.run_path(str(FIXTURES / 'L2N002/config_modes.in.py'))
  linen = source['Encoder1DBlock'](source['TransformerConfig'](attention_dropout_rate=0.0))
  variables = linen.init(jax.random.key(0), X)
  (tmp_path / 'port.py').write_text(port_text)
  module = runpy.run_path(str(tmp_path / 'port.py'))
  port = module['Encoder1DBlock'](module['TransformerConfig'](attention_dropout_rate=0.0), layer_norm1_num_features=8,
                                  rngs=nnx.Rngs(0, dropout=1))
  nnx_bridge.linen_to_nnx(variables, port, nnx_bridge.derive_mapping(linen, port, X))
  port.train()
  return np.asarray(linen.apply(variables, X)), np.asarray(port(X))


def test_a_call_argument_of_the_config_keeps_its_mode_in_train_mode(tmp_path):
  want, got = _train_mode_outputs((FIXTURES / 'L2N002/config_modes.out.py').read_text(), tmp_path)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_port_that_leaves_the_mode_to_train_and_eval_is_caught(tmp_path):
  port = (FIXTURES / 'L2N002/config_modes.out.py').read_text()
  wrong = port.replace('x = self.dropout1(x, deterministic=config.deterministic)', 'x = self.dropout1(x)')
  assert wrong != port
  want, got = _train_mode_outputs(wrong, tmp_path)
  assert not np.allclose(got, want)


@pytest.mark.parametrize('old, new', [
    ('  def __call__(self, inputs, encoder_mask=None):\n    config = self.config\n',
     '  def __call__(self, inputs, encoder_mask=None, deterministic=True):\n    config = self.config\n'),
])
def test_a_mode_mixing_a_switch_with_the_config_keeps_the_class_linen(old, new):
  """`deterministic=deterministic or config.deterministic` reads the call's switch: it is no fixed mode, and no
  switch alone either."""
  source = (FIXTURES / 'L2N002/config_modes.in.py').read_text()
  mixed = source.replace(old, new).replace(
      '(x, deterministic=config.deterministic)\n    x = x + inputs',
      '(x, deterministic=deterministic or config.deterministic)\n    x = x + inputs')
  assert mixed.count('deterministic or config') == 1
  todos = [e.message for e in transform_source(mixed, registry.select_rules(['L2N002'])).entries if e.kind == 'todo']
  assert any('class Encoder1DBlock left as Linen: a train/eval argument that is not a matching __call__ switch' in m
             for m in todos), todos
