"""A class of the run called without its train/eval argument runs in eval mode in NNX too, as Linen runs it in
the mode of the argument's default (`modes._eval_view`; parity: fixtures/L2N002/switch_left_to_default.parity.json):
in train mode, the Linen encoder's layers drop nothing, the port's neither, and a port that calls the layers
plainly drops units; a default that means train mode keeps the class Linen, bridged where it is built. A table
layer's switch given by position (`self.dropout(h, deterministic)`) goes as a keyword one does."""

import runpy

import numpy as np
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec

CASE = 'L2N002/switch_left_to_default'
RULES = registry.select_rules(['L2N002'])
VIEW = 'nnx.with_attributes(self.layers, deterministic=True, use_running_average=True, raise_if_not_found=False)'


def _train_outputs(tmp_path, port_text: str) -> tuple[np.ndarray, np.ndarray]:
  """The port's output in train mode and the Linen encoder's with deterministic=False, on the same parameters."""
  entry = spec(CASE, 'FlaxEncoder')
  linen_module, variables, _, xs = models(CASE, entry)
  (tmp_path / 'port.py').write_text(port_text)
  model = runpy.run_path(str(tmp_path / 'port.py'))['FlaxEncoder'](**entry['sizes'], rngs=nnx.Rngs(0, dropout=1))
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_module, model, *xs))
  model.train()
  return np.asarray(model(*xs)), np.asarray(linen_module.apply(variables, *xs, deterministic=False))


def test_in_train_mode_the_layers_called_without_their_switch_drop_nothing(tmp_path):
  text = (FIXTURES / f'{CASE}.out.py').read_text()
  got, want = _train_outputs(tmp_path, text)
  np.testing.assert_allclose(got, want, atol=1e-6)
  plain, _ = _train_outputs(tmp_path, text.replace(VIEW, 'self.layers'))  # the layers in the caller's mode
  assert not np.allclose(plain, want, atol=1e-3)


def test_a_default_that_means_train_mode_keeps_the_class_linen_bridged_as_it_runs():
  """With `deterministic: bool = False` Linen runs the layers in train mode whatever the caller's: the class stays
  Linen and the converted encoder wraps it with nnx_bridge.from_linen, which calls it as Linen does."""
  source = (FIXTURES / f'{CASE}.in.py').read_text().replace(
      'def __call__(self, hidden_states, deterministic: bool = True):\n    return self.dropout(',
      'def __call__(self, hidden_states, deterministic: bool = False):\n    return self.dropout(')
  result = transform_source(source.encode(), RULES)
  todos = [e.message for e in result.entries if e.kind == 'todo']
  assert [c.linen_name for c in result.classes] == ['FlaxEncoder'] and 'with_attributes' not in result.source.decode()
  assert any(m.startswith('class FlaxFeedForward kept as Linen') for m in todos), todos
  assert 'nnx_bridge.from_linen(FlaxFeedForward(self.hidden)' in result.source.decode()


POSITIONAL = '''import flax.linen as nn


class Head(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    return {call}
'''


@pytest.mark.parametrize('call, converted', [
    ('nn.Dropout(0.5)(nn.Dense(4)(x), deterministic)', 'self.dropout(self.linear(x))'),
    ('nn.BatchNorm()(x, deterministic)', 'self.batch_norm(x)'),
    ('nn.Dense(4)(x, deterministic)', None),
    ('nn.Dropout(0.5)(x, deterministic, None, 1)', None),
])
def test_a_layer_switch_given_by_position_goes_as_a_keyword_one_does(call, converted):
  """Linen's `__call__(inputs, deterministic=None, ...)`: `self.dropout(h, deterministic)` gives the switch by
  position; any other argument past the layer inputs keeps the class Linen."""
  result = transform_source(POSITIONAL.format(call=call).encode(), registry.ALL_RULES)
  todos = [e.message for e in result.entries if e.kind == 'todo']
  if converted is None:
    assert todos == ['class Head left as Linen: positional arguments beyond the layer inputs'], todos
  else:
    assert not todos and f'return {converted}' in result.source.decode(), result.source.decode()
