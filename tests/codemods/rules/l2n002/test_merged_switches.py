"""A train/eval switch both a field and a call argument, merged with `nn.merge_param` (flax's sst2 example, the
idiom of Linen's own Dropout): the statement goes, the switch is the field, which `model.train()` / `model.eval()`
set, and the children start in the field's mode (fixtures/L2N002/merged_switch.*, parity in both modes). The field
set at construction keeps dropout off as the merged Linen call did; a port that does not hand it on is caught."""

import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES

RULES = registry.select_rules(['L2N002'])
X = jax.random.normal(jax.random.key(1), (4, 4))


def _outputs(port_text: str, tmp_path) -> tuple[np.ndarray, np.ndarray]:
  """The Linen MLP (dropout 0.9, the field deterministic=True) and its port built alike, on the same parameters."""
  linen = runpy.run_path(str(FIXTURES / 'L2N002/merged_switch.in.py'))['MLP'](dropout_rate=0.9, deterministic=True)
  variables = linen.init(jax.random.key(0), X)
  (tmp_path / 'port.py').write_text(port_text)
  port = runpy.run_path(str(tmp_path / 'port.py'))['MLP'](
      dropout_rate=0.9, deterministic=True, intermediate_layer_in_features=4, rngs=nnx.Rngs(0, dropout=1))
  nnx_bridge.linen_to_nnx(variables, port, nnx_bridge.derive_mapping(linen, port, X))
  return np.asarray(linen.apply(variables, X)), np.asarray(port(X))


def test_the_field_set_at_construction_keeps_the_children_in_its_mode(tmp_path):
  port = (FIXTURES / 'L2N002/merged_switch.out.py').read_text()
  assert 'nnx.Dropout(rate=self.dropout_rate, deterministic=self.deterministic, rngs=rngs)' in port
  assert 'WordDropout(self.word_dropout_rate, self.unk_idx, deterministic=self.deterministic, rngs=rngs)' in port
  want, got = _outputs(port, tmp_path)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_port_that_does_not_hand_the_field_on_is_caught(tmp_path):
  port = (FIXTURES / 'L2N002/merged_switch.out.py').read_text()
  wrong = port.replace('nnx.Dropout(rate=self.dropout_rate, deterministic=self.deterministic, rngs=rngs)',
                       'nnx.Dropout(rate=self.dropout_rate, rngs=rngs)')
  assert wrong != port
  want, got = _outputs(wrong, tmp_path)
  assert not np.allclose(got, want)


def test_train_and_eval_set_the_merged_field():
  module = runpy.run_path(str(FIXTURES / 'L2N002/merged_switch.out.py'))
  model = module['Embedder'](word_dropout_rate=0.5, dropout_rate=0.5, rngs=nnx.Rngs(0, dropout=1))
  tokens = jnp.arange(12).reshape(3, 4) % 11
  model.eval()
  assert model.deterministic and model.word_dropout_layer.deterministic
  np.testing.assert_array_equal(model(tokens), model.embedding[...][tokens])
  model.train()
  assert not np.allclose(model(tokens), model.embedding[...][tokens])


@pytest.mark.parametrize('old, new, reason', [
    ("    deterministic = nn.module.merge_param(\n        'deterministic', self.deterministic, deterministic\n    )\n"
     "    hidden = self.activation",
     "    deterministic = nn.module.merge_param(\n        'deterministic', self.deterministic, not deterministic\n    )\n"
     "    hidden = self.activation",
     'the train/eval switch deterministic is read, and self.deterministic, which would hold it, is taken'),
    ('  deterministic: Optional[bool] = None\n\n  def setup(self):\n    self.intermediate_layer',
     '  is_deterministic: Optional[bool] = None\n\n  def setup(self):\n    self.intermediate_layer',
     'the train/eval switch deterministic is assigned to'),
], ids=['other-merge', 'field-of-another-name'])
def test_a_merge_other_than_of_the_switch_with_its_field_keeps_the_class_linen(old, new, reason):
  source = (FIXTURES / 'L2N002/merged_switch.in.py').read_text()
  assert old in source
  result = transform_source(source.replace(old, new), RULES)
  todos = [e.message for e in result.entries if e.kind == 'todo']
  assert any(m.startswith('class MLP left as Linen') and reason in m for m in todos), todos
