"""L2N002 on layers built in loops: an MLP over its hidden sizes, a transformer encoder stacking
named blocks by config depth, a ResNet-style stage and a setup() list become nnx.List attributes.
Outputs and every gradient match Linen on transferred params, with as many param leaves (the fixture's
parity spec, tests/codemods/rules/test_fixture_parity.py); the Linen names keep their order, a port
whose list entries are swapped is caught, and loops that cannot be converted keep a precise TODO."""

import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.report import ChildName
from codemods.rules.l2n002.loops import loop_entry
from codemods.transform import transform_source
from tests.codemods.rules import test_fixture_parity as fixture_parity

FIXTURES = fixture_parity.FIXTURES / 'L2N002'

X = jnp.linspace(-1.0, 1.0, 2 * 6).reshape(2, 6)
CASE = 'L2N002/layer_loops'


def test_the_encoder_keeps_linen_names_in_order():
  """`name=f'layer_{i}'`: Linen's layer_0, layer_1, layer_2 pair with self.layers[0], [1], [2]."""
  linen_module, variables, model, (x,) = fixture_parity.models(CASE, fixture_parity.spec(CASE, 'Encoder'))
  assert [k for k in variables['params'] if k.startswith('layer_')] == ['layer_0', 'layer_1', 'layer_2']
  mapping = nnx_bridge.derive_mapping(linen_module, model, x)
  pairs = {rule.nnx[:2]: rule.linen[0][1] for rule in mapping.rules if rule.nnx[0] == 'layers'}
  assert pairs == {('layers', str(i)): f'layer_{i}' for i in range(3)}


def test_swapped_list_entries_are_caught():
  """Params of two same-shaped list entries exchanged: the outputs no longer match Linen's."""
  linen_module, variables, model, (x,) = fixture_parity.models(CASE, fixture_parity.spec(CASE, 'Encoder'))
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_module, model, x))
  expected = linen_module.apply(variables, x)
  model.eval()
  np.testing.assert_allclose(model(x), expected, atol=1e-5)
  first, second = nnx.state(model.layers[0]), nnx.state(model.layers[1])
  nnx.update(model.layers[0], second)
  nnx.update(model.layers[1], first)
  assert not np.allclose(model(x), expected, atol=1e-3)


def _todo(source: str) -> str:
  result = transform_source(source, registry.select_rules(['L2N002']))
  (todo,) = [e for e in result.entries if e.kind == 'todo']
  return todo.message


LOOP = '''import flax.linen as nn


class M(nn.Module):
  n: int

  @nn.compact
  def __call__(self, x):
    for i in range(self.n):
{body}
    return x
'''


@pytest.mark.parametrize('body, message', [
    ('      x = nn.Dense(4)(x)\n      while x.shape[-1] > 4:\n        x = x[..., 1:]',
     'a for loop whose body holds blocks other than conditionals'),
    ('      if x.shape[-1] > 2:\n        x = nn.Dense(4)(x)',
     'a submodule created under a condition on the call (its inputs or locals)'),
    ('      x = nn.Dense(4)(x)\n      break', 'a for loop holding break'),
    ("      w = self.param('w', nn.initializers.zeros, (4,))\n      x = x * w", 'a for loop calling self.param'),
    ("      x = nn.Dense(4, name='dense')(x)", 'name= other than an f-string'),
])
def test_loops_that_stay_linen(body, message):
  source = LOOP.format(body=body)
  if 'jnp.' in body:
    source = 'import jax.numpy as jnp\n' + source
  assert message in _todo(source)


def test_a_loop_over_an_input_stays_linen():
  source = '''import flax.linen as nn


class M(nn.Module):
  @nn.compact
  def __call__(self, x, sizes):
    for f in sizes:
      x = nn.Dense(f)(x)
    return x
'''
  assert 'which __init__ cannot evaluate' in _todo(source)


def test_a_setup_list_used_otherwise_stays_linen():
  source = '''import flax.linen as nn


class M(nn.Module):
  features: tuple

  def setup(self):
    self.layers = [nn.Dense(f) for f in self.features]

  def __call__(self, x):
    for layer in self.layers[:-1]:
      x = nn.relu(layer(x))
    return self.layers[-1](x)
'''
  assert 'self.layers (a list of layers) used other than by `for layer in self.layers:`' in _todo(source)


NAMED = 'L2N002/setup_list_named'


@pytest.mark.parametrize('name, names', [('FlaxTinyLayerCollection', ['0', '1', '2']),
                                         ('FlaxTinyBlocks', ['block_0', 'block_1'])])
def test_a_named_setup_list_pairs_linen_names_with_list_entries(name, names):
  """transformers' `name=str(i)` (Linen's 0, 1, 2) and `name=f'block_{i}'`: each pairs with self.<attr>[i]."""
  linen_module, variables, model, (x,) = fixture_parity.models(NAMED, fixture_parity.spec(NAMED, name))
  assert list(variables['params']) == names
  mapping = nnx_bridge.derive_mapping(linen_module, model, x)
  attr = 'layers' if name == 'FlaxTinyLayerCollection' else 'blocks'
  pairs = {rule.nnx[:2]: rule.linen[0][1] for rule in mapping.rules if rule.nnx[0] == attr}
  assert pairs == {(attr, str(i)): linen for i, linen in enumerate(names)}
  entries = {c.linen_name: c.nnx_attribute for c in _record(NAMED, name).children}
  assert loop_entry(tuple(ChildName(k, v) for k, v in entries.items()), names[-1]) == (attr, str(len(names) - 1))


def test_only_the_first_element_of_a_returned_tuple_sizes_the_next_layer():
  """`layer_outputs[1]` read as the next input: only a tuple's first element is tracked, so the size is not
  derived (and never taken for the first element's): each layer takes its own, one per element of the list."""
  source = (fixture_parity.FIXTURES / f'{NAMED}.in.py').read_text()
  old = '      hidden_states = layer_outputs[0]\n      if output_attentions:\n        all_attentions'
  assert old in source
  wrong = source.replace(old, '      hidden_states = layer_outputs[1]\n      if output_attentions:\n        all_attentions')
  result = transform_source(wrong, registry.select_rules(['L2N002']))
  (record,) = [r for r in result.classes if r.linen_name == 'FlaxTinyAttentionCollection']
  sizes = [a for a in record.arguments if a.child_argument == 'query_in_features']
  assert [a.per_element for a in sizes] == [True], record.arguments
  assert 'query_in_features=layers_query_in_features[i]' in result.source


def _record(case: str, name: str):
  source = (fixture_parity.FIXTURES / f'{case}.in.py').read_text()
  result = transform_source(source, registry.select_rules(['L2N002']))
  (record,) = [r for r in result.classes if r.linen_name == name]
  return record


SETUP_LIST = '''import flax.linen as nn


class M(nn.Module):
  n: int

  def setup(self):
    self.layers = [nn.Dense(4, {name}) for i in range(self.n)]

  def __call__(self, x):
    for layer in self.layers:
{body}
    return x
'''


@pytest.mark.parametrize('name, body, message', [
    ('name=str(i + 1)', '      x = layer(x)', 'self.layers: name=str(i + 1) in a setup() list (converted: str(i)'),
    ("name=f'{i}_dense'", '      x = layer(x)', "name=f'{i}_dense' in a setup() list"),
    ('name=str(i)', '      if x.ndim > 2:\n        x = layer(x)\n      x = layer(x)',
     'the sizes of the nn.Dense built in this for loop cannot be derived'),  # called twice, with two sizes
    ('name=str(i)', '      with jax.named_scope("l"):\n        x = layer(x)', 'nested blocks other than ifs'),
])
def test_named_setup_lists_that_stay_linen(name, body, message):
  assert message in _todo(SETUP_LIST.format(name=name, body=body))


def test_linen_names_count_across_iterations():
  """Two Dense per iteration after one before the loop: Linen's Dense_{1 + 2 * i} and Dense_{1 + 2 * i + 1},
  and the Dense after the loop is Dense_{2 * len(features) + 1}; compare pairs them all."""
  source = '''import flax.linen as nn


class M(nn.Module):
  features: tuple

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(3)(x)
    for f in self.features:
      x = nn.Dense(f)(x)
      x = nn.Dense(f)(nn.relu(x))
    return nn.Dense(2)(x)
'''
  result = transform_source(source, registry.select_rules(['L2N002']))
  (hoisted,) = [e.message for e in result.entries if 'hoisted' in e.message]
  assert ('Dense_0 -> self.linear1, Dense_{1 + 2 * i} -> self.linears1, Dense_{1 + 2 * i + 1} -> self.linears2, '
          'Dense_{2 * len(self.features) + 1} -> self.linear2') in hoisted
  linen_module = runpy.run_path(_write(source, 'in'))['M']((4, 5))
  model = runpy.run_path(_write(result.source if isinstance(result.source, str) else result.source.decode(), 'out'))['M']((4, 5), linear1_in_features=6, rngs=nnx.Rngs(0))
  variables = linen_module.init(jax.random.key(0), X)
  assert sorted(variables['params']) == [f'Dense_{k}' for k in range(6)]
  report = nnx_bridge.compare(linen_module, variables, model, X)
  assert report.ok, report.to_text()


def _write(source: str, suffix: str) -> str:
  import tempfile
  with tempfile.NamedTemporaryFile('w', suffix=f'.{suffix}.py', delete=False) as f:
    f.write(source)
  return f.name


def test_a_loop_local_read_by_a_construction_moves_into_the_comprehension():
  """`width = self.dim * 2 ** i` in the body, read only by the construction: written into __init__'s comprehension."""
  source = '''import flax.linen as nn


class M(nn.Module):
  dim: int

  @nn.compact
  def __call__(self, x):
    for i in range(3):
      width = self.dim * 2 ** i
      x = nn.relu(nn.Dense(width)(x))
    return x
'''
  result = transform_source(source, registry.select_rules(['L2N002']))
  converted = result.source if isinstance(result.source, str) else result.source.decode()
  assert 'width' not in converted and 'out_features=(self.dim * 2 ** i)' in converted
  linen_module = runpy.run_path(_write(source, 'in'))['M'](2)
  model = runpy.run_path(_write(converted, 'out'))['M'](2, linears_in_features=6, rngs=nnx.Rngs(0))
  variables = linen_module.init(jax.random.key(0), X)
  report = nnx_bridge.compare(linen_module, variables, model, X)
  assert report.ok, report.to_text()


def _layerdrop(source: str | None = None, layerdrop: float = 1.0):
  """(Linen collection, its variables, NNX port, inputs) of the BART-style LayerDrop fixture, every layer skipped in
  train mode; `source`: the port's text, to run instead of the fixture's."""
  linen_ns = runpy.run_path(str(FIXTURES / 'hf_layerdrop.in.py'))
  nnx_ns = runpy.run_path(str(FIXTURES / 'hf_layerdrop.out.py')) if source is None else {}
  if source is not None:
    exec(compile(source, 'port', 'exec'), nnx_ns)
  linen = linen_ns['FlaxTinyBartEncoderLayerCollection'](linen_ns['TinyBartConfig'](encoder_layerdrop=layerdrop))
  x, mask = jax.random.normal(jax.random.key(0), (2, 3, 8)), jnp.ones((2, 3))
  variables = linen.init(jax.random.key(1), x, mask)
  port = nnx_ns['FlaxTinyBartEncoderLayerCollection'](
      nnx_ns['TinyBartConfig'](encoder_layerdrop=layerdrop), layers_q_proj_in_features=8,
      layers_out_proj_in_features=8, rngs=nnx.Rngs(0, dropout=1))
  return linen, variables, port, (x, mask)


def test_layerdrop_loop_converts_and_reads_the_train_switch():
  """transformers' LayerDrop: the layer is called in one arm of an `if` whose other arm leaves its outputs None
  (which has no size: the loop's sizes come from the call). The switch the test reads is the attribute
  model.train() / model.eval() set: in eval mode every layer runs, as Linen's deterministic=True; in train mode,
  at rate 1, every layer is skipped, as Linen's deterministic=False (whose hidden states are then None)."""
  linen, variables, port, (x, mask) = _layerdrop()
  nnx_bridge.linen_to_nnx(variables, port, nnx_bridge.derive_mapping(linen, port, x, mask))
  port.eval()
  np.testing.assert_allclose(port(x, mask)[0], linen.apply(variables, x, mask, deterministic=True)[0], atol=1e-5)
  port.train()
  trained = linen.apply(variables, x, mask, deterministic=False, rngs={'dropout': jax.random.key(2)})
  assert port(x, mask)[0] is None and trained[0] is None


def test_a_layerdrop_port_with_the_switch_inverted_is_rejected():
  """A port that skips the layers in eval mode: verify's mapping finds no NNX layer run for Linen's params."""
  source = (FIXTURES / 'hf_layerdrop.out.py').read_text()
  wrong = source.replace('if not self.deterministic and', 'if self.deterministic and')
  assert wrong != source
  linen, variables, port, (x, mask) = _layerdrop(wrong)
  with pytest.raises(nnx_bridge.MappingError):
    nnx_bridge.compare(linen, variables, port, x, mask)


def test_a_list_indexed_other_than_by_the_range_loop_target_stays_linen():
  """`self.layers[n](...)` converts only inside `for n in range(...)` with `n` not reassigned: iteration k calls
  layer k. An index computed in the body (ALBERT's layer groups), or a loop over something else, is refused."""
  source = (FIXTURES / 'hf_indexed_layers.in.py').read_text()
  for changed in (source.replace('layer_outputs = self.layers[layer_number](',
                                 'layer_number = layer_number // 2\n      layer_outputs = self.layers[layer_number]('),
                  source.replace('for layer_number in range(self.config.num_hidden_layers):',
                                 'for layer_number in [0, 0, 1]:')):
    result = transform_source(changed, registry.select_rules(['L2N002']))
    todos = [e.message for e in result.entries if e.kind == 'todo']
    assert any('FlaxTinyBloomBlockCollection left as Linen' in m and 'self.layers (a list of layers) used other than'
               in m for m in todos), todos


def test_an_appending_loop_whose_code_is_needed_elsewhere_stays_linen():
  """The appending loop goes whole (its list becomes an nnx.List comprehension): a loop that also does something
  else, or binds a local that setup() reads after it, keeps the class Linen (fixtures/L2N002/setup_append_locals.*
  is the converted shape)."""
  source = (FIXTURES / 'setup_append_locals.in.py').read_text()
  assert transform_source(source, registry.select_rules(['L2N002'])).classes  # the fixture converts
  read_after = source.replace('    self.resnets = resnets\n',
                              '    self.resnets = resnets\n    self.last_in_channels = in_channels\n')
  more_work = source.replace('      resnets.append(res_block)\n',
                             '      resnets.append(res_block)\n      print(i)\n')
  for changed in (read_after, more_work):
    assert changed != source
    result = transform_source(changed, registry.select_rules(['L2N002']))
    todos = [e.message for e in result.entries if e.kind == 'todo']
    assert any('FlaxTinyDownBlock2D left as Linen: a setup() list resnets other than' in m for m in todos), todos


def test_lists_filled_by_one_loop_convert_only_when_the_loop_fills_nothing_else():
  """One setup() loop may fill several lists started empty just before it (fixtures/L2N002/setup_append_zip.*, with
  parity). A loop that also appends to a list started elsewhere, whose other content the converted loop would lose,
  lists built by two loops and zipped (iteration k would need both loops' sizes), or a layer reading a value the
  loop carries from one iteration to the next (diffusers' FlaxDecoder: `prev_output_channel = output_channel` after
  the append), which the comprehension could not give it, keep the class Linen."""
  source = (FIXTURES / 'setup_append_zip.in.py').read_text()
  assert 'FlaxTinyCrossAttnDownBlock2D' in {c.linen_name for c in transform_source(source, registry.select_rules(['L2N002'])).classes}
  other_list = source.replace('    resnets = []\n    attentions = []\n',
                              '    resnets = []\n    attentions = []\n    kept = [None]\n\n    print(kept)\n') \
      .replace('      attentions.append(attn_block)\n', '      attentions.append(attn_block)\n      kept.append(i)\n')
  two_loops = source.replace('    attentions = []\n', '').replace(
      '      resnets.append(res_block)\n\n',
      '      resnets.append(res_block)\n\n    attentions = []\n    for i in range(self.num_layers):\n')
  carried = source.replace('      in_channels = self.in_channels if i == 0 else self.out_channels\n',
                            '').replace('    resnets = []\n', '    in_channels = self.in_channels\n    resnets = []\n') \
      .replace('      attentions.append(attn_block)\n',
               '      attentions.append(attn_block)\n      in_channels = self.out_channels\n')
  for changed, why in ((other_list, 'a setup() list resnets other than'),
                       (two_loops, 'a list another loop builds'),
                       (carried, 'a setup() list resnets other than')):
    assert changed != source
    result = transform_source(changed, registry.select_rules(['L2N002']))
    todos = [e.message for e in result.entries if e.kind == 'todo']
    assert any('FlaxTinyCrossAttnDownBlock2D left as Linen' in m and why in m for m in todos), todos


ZIP_OF_A_ZIP = '''import flax.linen as nn


class M(nn.Module):
  sizes: tuple = (3, 4, 6)

  @nn.compact
  def __call__(self, x):
    pairs = {pairs}
    for i, ((a, b), d) in enumerate(zip(pairs, self.sizes[1:])):
      x = nn.Dense(b + d)(x)
    return x
'''


def test_a_zip_of_a_zip_local_converts_and_runs_as_linen():
  """`for i, ((a, b), d) in enumerate(zip(pairs, ...))` with `pairs = zip(...)` (ResNet's stages): each name is read
  from its own sequence; the port computes what Linen does on its parameters."""
  source = ZIP_OF_A_ZIP.format(pairs='zip(self.sizes, self.sizes[1:])')
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert not [e for e in result.entries if e.kind == 'todo'], result.entries
  assert 'for i, ((a, b), d) in enumerate(zip(pairs, self.sizes[1:]))' in result.source
  namespaces = [{}, {}]
  for code, namespace in zip((source, result.source), namespaces):
    exec(compile(code, 'm.py', 'exec'), namespace)
  x = jax.random.normal(jax.random.key(1), (2, 3))
  linen = namespaces[0]['M']()
  variables = linen.init(jax.random.key(0), x)
  model = namespaces[1]['M'](linears_in_features=3, rngs=nnx.Rngs(0))
  for k, layer in enumerate(model.linears):
    layer.kernel[...] = variables['params'][f'Dense_{k}']['kernel']
    layer.bias[...] = variables['params'][f'Dense_{k}']['bias']
  np.testing.assert_allclose(model(x), linen.apply(variables, x), rtol=1e-6)


@pytest.mark.parametrize('pairs', ['list(zip(self.sizes, self.sizes[1:]))', 'zip(self.sizes)'])
def test_a_zip_of_other_than_a_zip_local_of_as_many_names_stays_linen(pairs):
  assert 'over enumerate(...) with other than' in _todo(ZIP_OF_A_ZIP.format(pairs=pairs))


VARYING_INNER = '''import flax.linen as nn


def squash(v):
  return v


class Inner(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.width)(x)
    return nn.Dense(3)(squash(h))


class M(nn.Module):
  widths: tuple = (4, 6)

  @nn.compact
  def __call__(self, x):
    for w in self.widths:
      x = Inner(w)(x)
    return x
'''


def test_an_unsaid_size_inside_layers_built_from_the_loop_s_names_is_one_per_element():
  """The inner Dense takes what a helper returns, a size the code does not say, and each iteration builds its
  block from another width: one constructor argument per element (a shared one would fit one block only); the port
  built with each element's size runs as Linen does."""
  result = transform_source(VARYING_INNER, registry.select_rules(['L2N002']))
  assert 'inners_linear2_in_features: tuple[int, ...]' in result.source, result.source
  namespaces = [{}, {}]
  for code, namespace in zip((VARYING_INNER, result.source), namespaces):
    exec(compile(code, 'm.py', 'exec'), namespace)
  x = jax.random.normal(jax.random.key(1), (2, 3))
  linen = namespaces[0]['M']()
  variables = linen.init(jax.random.key(0), x)
  model = namespaces[1]['M'](inners_linear1_in_features=3, inners_linear2_in_features=(4, 6), rngs=nnx.Rngs(0))
  for k, inner in enumerate(model.inners):
    for attr, name in (('linear1', 'Dense_0'), ('linear2', 'Dense_1')):
      getattr(inner, attr).kernel[...] = variables['params'][f'Inner_{k}'][name]['kernel']
      getattr(inner, attr).bias[...] = variables['params'][f'Inner_{k}'][name]['bias']
  np.testing.assert_allclose(model(x), linen.apply(variables, x), rtol=1e-6)
