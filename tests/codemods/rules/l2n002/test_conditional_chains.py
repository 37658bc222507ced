"""Submodules built in if / elif / else chains and nested conditionals on fields (`planner._construction_conditions`)
exist in NNX exactly when Linen creates them (parity: fixtures/L2N002/conditional_chains.parity.json); a port with
a wrong condition fails, and constructions under a loop in an arm or under a test on the call keep the class Linen
with a TODO at the conditional or the test."""

import re
import runpy
import textwrap

import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec

CASE = 'L2N002/conditional_chains'
RULES = registry.select_rules(['L2N002'])


def test_a_port_that_builds_the_layer_of_another_arm_fails(tmp_path):
  entry = spec(CASE, 'Block', 'layer without bias')
  linen_module, variables, _, xs = models(CASE, entry)
  text = (FIXTURES / f'{CASE}.out.py').read_text()
  wrong = text.replace("(self.norm == 'layer') and self.use_bias else None",
                       "(self.norm == 'layer') and not self.use_bias else None")  # the bias-free layer's test
  assert wrong != text
  (tmp_path / 'port.py').write_text(wrong)
  port = runpy.run_path(str(tmp_path / 'port.py'))['Block'](norm='layer', use_bias=False, **entry['sizes'],
                                                            rngs=nnx.Rngs(0))
  with pytest.raises(nnx_bridge.MappingError, match='NNX layer_norm1 \\(LayerNorm\\) has no Linen counterpart'):
    nnx_bridge.compare(linen_module, variables, port, *xs)  # Linen's LayerNorm_0 has no bias: the port's has one


@pytest.mark.parametrize('arm, todo', [
    ('for _ in range(2):\n  x = nn.LayerNorm()(x)',
     r'^9:5 .*the @nn.compact body has loops, conditionals or nested blocks'),
    (None, r'^11:10 .*a submodule created under a condition on the call'),
])
def test_constructions_a_conditional_cannot_hold_keep_the_class_linen_with_a_todo(arm, todo):
  body = arm or 'x = nn.LayerNorm()(x)'
  test = 'x.ndim == 3' if arm is None else "self.norm == 'layer'"
  source = textwrap.dedent('''\
      import flax.linen as nn


      class Block(nn.Module):
        norm: str = 'layer'

        @nn.compact
        def __call__(self, x):
          if self.norm == 'batch':
            pass
          elif {test}:
      {body}
          return x
      ''').format(test=test, body=textwrap.indent(body, ' ' * 6))
  result = transform_source(source.encode(), RULES)
  todos = [f'{e.line}:{e.column} {e.message}' for e in result.entries if e.kind == 'todo']
  assert result.classes == () and len(todos) == 1 and re.match(todo, todos[0]), todos


ARMS = 'L2N002/hf_alternative_arms'


def test_a_port_that_builds_the_class_of_the_other_arm_fails(tmp_path):
  """transformers' T5 builds `self.DenseReluDense` as one class or another by `config.is_gated_act` (parity:
  fixtures/L2N002/hf_alternative_arms.parity.json); a port with the arms' classes swapped is rejected."""
  entry = spec(ARMS, 'FlaxTinyLayerFF', 'gated')
  linen_module, variables, _, xs = models(ARMS, entry)
  text = (FIXTURES / f'{ARMS}.out.py').read_text()
  wrong = text.replace('if self.config.is_gated_act:', 'if not self.config.is_gated_act:')
  assert wrong != text
  (tmp_path / 'port.py').write_text(wrong)
  scope = runpy.run_path(str(tmp_path / 'port.py'))
  port = scope['FlaxTinyLayerFF'](scope['TinyT5Config'](is_gated_act=True), **entry['sizes'], rngs=nnx.Rngs(0))
  with pytest.raises(nnx_bridge.MappingError):
    nnx_bridge.compare(linen_module, variables, port, *xs)  # Linen's wi_0 / wi_1 have no NNX counterpart


def test_arms_building_modules_called_otherwise_stay_linen_with_a_todo_at_the_second():
  source = (FIXTURES / f'{ARMS}.in.py').read_text().replace(
      '  def __call__(self, hidden_states, deterministic):\n    hidden_gelu',
      '  def __call__(self, hidden_states, scale=1.0, deterministic=True):\n    hidden_gelu').replace(
      'self.DenseReluDense(forwarded_states, deterministic=deterministic)',
      'self.DenseReluDense(forwarded_states, deterministic)')  # the gated block takes it as its scale
  result = transform_source(source, RULES)
  assert 'class FlaxTinyLayerFF(nn.Module)' in result.source
  (todo,) = [e for e in result.entries if e.kind == 'todo' and e.message.startswith('class FlaxTinyLayerFF ')]
  assert todo.message.endswith('self.DenseReluDense is built by two arms of an if, as modules that take other call '
                               'arguments'), todo.message
  assert source.splitlines()[todo.line - 1].strip().startswith('self.DenseReluDense = FlaxTinyDenseActDense(')


LAYERS = 'L2N002/alternative_layers'


def test_alternative_table_layers_convert_only_when_the_call_fits_both():
  """diffusers' `self.proj_in`: an nn.Dense or a 1x1 nn.Conv by a field, both called on the hidden states alone
  (parity in both arms: fixtures/L2N002/alternative_layers.parity.json). A layer with a train/eval switch in the
  other arm (nn.Dropout takes `deterministic`) keeps the class Linen with the TODO at that arm."""
  source = (FIXTURES / f'{LAYERS}.in.py').read_text()
  assert transform_source(source, RULES).classes[0].linen_name == 'FlaxTinyTransformer2DModel'
  dropout = source.replace('''      self.proj_out = nn.Conv(
          inner_dim,
          kernel_size=(1, 1),
          strides=(1, 1),
          padding="VALID",
          dtype=self.dtype,
      )''', '      self.proj_out = nn.Dropout(0.1)')
  assert dropout != source
  result = transform_source(dropout, RULES)
  (todo,) = [e for e in result.entries if e.kind == 'todo']
  assert todo.message.endswith('self.proj_out is built by two arms of an if, as modules that take other call '
                               'arguments'), todo.message
  assert result.classes == ()


def test_a_port_that_swaps_the_projection_arms_fails(tmp_path):
  """The port with proj_in built as the other arm's layer does not pass as the Linen model."""
  entry = spec(LAYERS, 'FlaxTinyTransformer2DModel', 'conv')
  linen_module, variables, _, xs = models(LAYERS, entry)
  text = (FIXTURES / f'{LAYERS}.out.py').read_text()
  wrong = text.replace('    if self.use_linear_projection:\n      self.proj_in',
                       '    if not self.use_linear_projection:\n      self.proj_in', 1)
  assert wrong != text
  (tmp_path / 'port.py').write_text(wrong)
  port = runpy.run_path(str(tmp_path / 'port.py'))['FlaxTinyTransformer2DModel'](
      **entry['fields'], **entry['sizes'], rngs=nnx.Rngs(0))
  with pytest.raises(nnx_bridge.MappingError):  # Linen's 1x1 conv kernel has no NNX counterpart of its shape
    nnx_bridge.compare(linen_module, variables, port, *xs)


def test_alternative_layers_of_one_kind_with_a_switch_still_convert():
  """Two arms building the same layer with a train/eval switch (nn.Dropout at two rates) fit the same calls."""
  source = '''import flax.linen as nn


class M(nn.Module):
  strong: bool = False

  def setup(self):
    self.dense = nn.Dense(4)
    if self.strong:
      self.drop = nn.Dropout(0.5)
    else:
      self.drop = nn.Dropout(0.1)

  def __call__(self, x, deterministic: bool = True):
    return self.drop(self.dense(x), deterministic=deterministic)
'''
  result = transform_source(source, RULES)
  assert [c.linen_name for c in result.classes] == ['M'], [e.message for e in result.entries if e.kind == 'todo']
  assert 'self.drop = nnx.Dropout(rate=0.5' in result.source and 'self.drop = nnx.Dropout(rate=0.1' in result.source


ARM_CALLS = 'L2N002/hf_arm_calls'


def test_arms_called_under_their_own_test_each_with_their_own_arguments_convert(tmp_path):
  """transformers' BigBird: `self.self` is full or block-sparse attention by the config, each called under the
  same test with the arguments its class takes (parity in both arms: fixtures/L2N002/hf_arm_calls.parity.json). A
  port building the other arm's class for the sparse config is rejected; a call the test does not separate from
  the other arm (both classes could run there) keeps the class Linen."""
  entry = spec(ARM_CALLS, 'FlaxTinyAttention', 'block_sparse')
  linen_module, variables, _, xs = models(ARM_CALLS, entry)
  text = (FIXTURES / f'{ARM_CALLS}.out.py').read_text()
  wrong = text.replace('elif self.config.attention_type == "block_sparse":', 'elif False:').replace(
      'if self.config.attention_type == "original_full":\n      self.self', 'if True:\n      self.self')
  assert wrong != text
  (tmp_path / 'port.py').write_text(wrong)
  scope = runpy.run_path(str(tmp_path / 'port.py'))
  port = scope['FlaxTinyAttention'](scope['TinyBigBirdConfig'](attention_type='block_sparse'), **entry['sizes'],
                                    rngs=nnx.Rngs(0))
  with pytest.raises(nnx_bridge.MappingError):
    nnx_bridge.compare(linen_module, variables, port, *xs)  # Linen's qkv has no NNX counterpart
  source = (FIXTURES / f'{ARM_CALLS}.in.py').read_text()
  unguarded = source.replace('    if self.config.attention_type == "original_full":\n      attn_outputs',
                             '    if layer_head_mask is not None:\n      attn_outputs')
  assert unguarded != source
  result = transform_source(unguarded, RULES)
  assert 'class FlaxTinyAttention(nn.Module)' in result.source
  assert any(e.message.endswith('self.self is built by two arms of an if, as modules that take other call arguments')
             for e in result.entries if e.kind == 'todo')
