"""Example traces (`--examples`): sizes read off abstract Linen inits become expressions of a class's fields
when exactly one simple expression agrees with every traced instance; bad examples files are named errors."""

import pathlib
import textwrap

import pytest

from codemods.example_sizes import resolve
from codemods.examples import ExamplesError
from codemods.examples import trace_examples


@pytest.mark.parametrize('observations, expression', [
    ([({'self.a': 4, 'self.b': 6}, 4)], 'self.a'),
    ([({'self.a': 4, 'self.b': 6}, 8)], '2 * self.a'),  # multiples come before sums
    ([({'self.a': 8, 'self.b': 3}, 4)], 'self.a // 2'),
    ([({'self.a': 4, 'self.b': 6}, 10)], 'self.a + self.b'),
    ([({'self.a': 4, 'self.b': 6}, 24), ({'self.a': 2, 'self.b': 6}, 12)], 'self.a * self.b'),
])
def test_the_simplest_agreeing_expression_wins(observations, expression):
  assert resolve(observations).expression == expression


def test_equally_simple_expressions_are_ambiguous():
  traced = resolve([({'self.a': 4, 'self.b': 6}, 12)])  # 3 * self.a and 2 * self.b
  assert traced.expression is None and traced.candidates == ('3 * self.a', '2 * self.b')


def test_ambiguity_is_reported_and_more_instances_settle_it():
  one = resolve([({'self.dim': 16, 'self.hidden': 16}, 16)])
  assert one.expression is None and one.candidates == ('self.dim', 'self.hidden')
  assert 'self.dim and self.hidden all match' in one.describe()
  two = resolve([({'self.dim': 16, 'self.hidden': 16}, 16), ({'self.dim': 16, 'self.hidden': 32}, 16)])
  assert two.expression == 'self.dim'


def test_no_expression_for_a_size_the_fields_do_not_give():
  traced = resolve([({'self.a': 4}, 49), ({'self.a': 8}, 49)])
  assert traced.expression is None and not traced.candidates
  assert traced.describe() == 'the example trace saw 49, which no expression of the fields matches'


MODELS = '''
import dataclasses
import flax.linen as nn


@dataclasses.dataclass
class Config:
  width: int


class Block(nn.Module):
  dim: int
  hidden: int

  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(self.dim)(nn.relu(nn.Dense(self.hidden)(nn.LayerNorm()(x))))


class Model(nn.Module):
  config: Config

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.config.width)(x.reshape((x.shape[0], -1)))
    return Block(self.config.width, self.config.width)(x)
'''


def _project(tmp_path, examples: str):
  (tmp_path / 'models_under_trace.py').write_text(MODELS)
  (tmp_path / 'examples.py').write_text(textwrap.dedent(examples))
  return str(tmp_path / 'examples.py'), str(tmp_path / 'models_under_trace.py')


@pytest.fixture
def on_path(tmp_path, monkeypatch):
  monkeypatch.syspath_prepend(str(tmp_path))
  yield
  import sys
  sys.modules.pop('models_under_trace', None)


def test_trace_resolves_sizes_by_class_with_doubled_fields_to_disambiguate(tmp_path, on_path):
  examples, models = _project(tmp_path, '''
      import jax.numpy as jnp
      from models_under_trace import Config, Model

      def model():
        return Model(Config(width=8)), (jnp.zeros((2, 3, 5)),)
  ''')
  sizes = trace_examples(examples)
  block = sizes.of_class(models, 'Block')
  # dim == hidden == width in the example: only the variant doubling the root's width keeps them equal, so
  # the trace cannot tell them apart for the first layer norm; its input is x, of the model's width.
  assert block[('LayerNorm_0', 'num_features')].expression is None
  assert block[('LayerNorm_0', 'num_features')].candidates == ('self.dim', 'self.hidden')
  model = sizes.of_class(models, 'Model')
  assert model[('Dense_0', 'in_features')].expression is None  # 15 = 3 * 5, the flattened input
  assert set(model[('Dense_0', 'in_features')].values) == {15}


def test_several_examples_settle_what_one_cannot(tmp_path, on_path):
  examples, models = _project(tmp_path, '''
      import jax.numpy as jnp
      from models_under_trace import Block

      def square():
        return Block(dim=8, hidden=8), (jnp.zeros((2, 8)),)

      def wide():
        return Block(dim=8, hidden=32), (jnp.zeros((2, 8)),)
  ''')
  block = trace_examples(examples).of_class(models, 'Block')
  assert block[('LayerNorm_0', 'num_features')].expression == 'self.dim'
  assert block[('Dense_0', 'in_features')].expression == 'self.hidden'  # the outer Dense, built first
  assert block[('Dense_1', 'in_features')].expression == 'self.dim'


SHARED = '''
import flax.linen as nn


class Encoder(nn.Module):
  embed: nn.Module
  proj: nn.Module
  hidden: int

  @nn.compact
  def __call__(self, tokens):
    return self.proj(nn.Dense(self.hidden, name='mix')(self.embed(tokens)))


class Head(nn.Module):
  classes: int

  @nn.compact
  def __call__(self, z):
    return nn.Dense(self.classes, name='out')(z)


class Model(nn.Module):
  vocab: int
  width: int
  latents: int

  def setup(self):
    self.embed = nn.Embed(self.vocab, self.width)
    self.encoder = Encoder(self.embed, nn.Dense(self.latents), 12)
    self.head = Head(3)

  def __call__(self, tokens):
    return self.head(self.encoder(tokens))
'''


def test_module_fields_and_user_class_inputs_are_atoms(tmp_path, on_path):
  """A shared `nn.Embed` field offers `self.embed.features` (nnx.Embed has the attribute too), a `nn.Dense` field
  not its `features` (nnx.Linear calls it out_features); the width a user class is called with is traced in its
  parent's terms (`input:0`), so the parent can pass `self.latents` for it."""
  (tmp_path / 'models_under_trace.py').write_text(SHARED)
  (tmp_path / 'examples.py').write_text(
      'import jax.numpy as jnp\nfrom models_under_trace import Model\n\n\n'
      'def model():\n  return Model(vocab=20, width=6, latents=4), (jnp.zeros((2, 5), jnp.int32),)\n')
  sizes = trace_examples(str(tmp_path / 'examples.py'))
  models = str(tmp_path / 'models_under_trace.py')
  encoder = sizes.of_class(models, 'Encoder')
  assert encoder[('mix', 'in_features')].expression == 'self.embed.features'
  model = sizes.of_class(models, 'Model')
  assert model[('head', 'input:0')].expression == 'self.latents'
  assert model[('encoder', 'input:0')].expression is None  # token ids: a 2-D input, its last axis is the length
  head = sizes.of_class(models, 'Head')
  assert head[('out', 'in_features')].expression is None  # no field of Head gives the width it is called with


def test_a_module_field_renamed_in_nnx_is_not_an_atom(tmp_path, on_path):
  (tmp_path / 'models_under_trace.py').write_text(SHARED.replace(
      "nn.Dense(self.hidden, name='mix')(self.embed(tokens))", "nn.Dense(self.hidden, name='mix')(self.proj(self.embed(tokens)))"
  ).replace('return self.proj(', 'return (').replace('Encoder(self.embed, nn.Dense(self.latents), 12)',
                                                     'Encoder(self.embed, nn.Dense(7), 12)'))
  (tmp_path / 'examples.py').write_text(
      'import jax.numpy as jnp\nfrom models_under_trace import Model\n\n\n'
      'def model():\n  return Model(vocab=20, width=6, latents=4), (jnp.zeros((2, 5), jnp.int32),)\n')
  encoder = trace_examples(str(tmp_path / 'examples.py')).of_class(str(tmp_path / 'models_under_trace.py'), 'Encoder')
  assert encoder[('mix', 'in_features')].expression is None  # 7 is self.proj.features in Linen, out_features in NNX
  assert 'no expression' in encoder[('mix', 'in_features')].describe()


@pytest.mark.parametrize('body, message', [
    ('def broken():\n  raise RuntimeError("no data")\n', 'broken() raised RuntimeError: no data'),
    ('def wrong():\n  return 3\n', 'wrong() must return (module, inputs)'),
    ('X = 1\n', 'no public function returning (module, inputs)'),
    ('import jax.numpy as jnp\nfrom models_under_trace import Block\n\n'
     'def bad_input():\n  return Block(8, 8), (jnp.zeros((2, 3)),)\n', 'bad_input(): the Linen init failed'),
])
def test_a_bad_examples_file_is_a_named_error(tmp_path, on_path, body, message):
  examples, _ = _project(tmp_path, body)
  with pytest.raises(ExamplesError, match=message.replace('(', r'\(').replace(')', r'\)')):
    trace_examples(examples)


def test_migrate_with_examples_writes_the_traced_sizes_and_the_port_matches_linen(tmp_path, on_path, capsys):
  """`linen2nnx migrate --examples`: Block's sizes come from its fields, and the NNX model matches Linen."""
  import runpy

  import jax
  import jax.numpy as jnp
  from flax import nnx

  import nnx_bridge
  from codemods import cli

  examples, models = _project(tmp_path, '''
      import jax.numpy as jnp
      from models_under_trace import Block

      def square():
        return Block(dim=8, hidden=8), (jnp.zeros((2, 8)),)

      def wide():
        return Block(dim=8, hidden=32), (jnp.zeros((2, 8)),)
  ''')
  linen = runpy.run_path(models)
  without = cli.main(['migrate', models])
  assert without == 0 and 'layer_norm_num_features' in capsys.readouterr().out  # the static result
  assert cli.main(['migrate', models, '--examples', examples, '--write']) == 0
  report = capsys.readouterr().err
  assert 'num_features of self.layer_norm = self.dim, from the example trace: 4 traced instances agree' in report
  source = open(models).read()
  assert 'nnx.LayerNorm(num_features=self.dim, rngs=rngs)' in source
  assert 'def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs):' in source  # no size arguments left
  converted = runpy.run_path(models)
  x = jax.random.normal(jax.random.key(1), (2, 8))
  linen_module = linen['Block'](dim=8, hidden=16)  # a size no example used
  variables = linen_module.init(jax.random.key(0), x)
  parity = nnx_bridge.compare(linen_module, variables, converted['Block'](8, 16, rngs=nnx.Rngs(0)), x)
  assert parity.ok, parity.to_text()
  assert jnp.shape(converted['Block'](8, 16, rngs=nnx.Rngs(0))(x)) == (2, 8)


def test_migrate_names_a_broken_examples_file(tmp_path, on_path, capsys):
  from codemods import cli

  examples, models = _project(tmp_path, 'def broken():\n  raise RuntimeError("no data")\n')
  assert cli.main(['migrate', models, '--examples', examples]) == 2
  assert 'broken() raised RuntimeError: no data' in capsys.readouterr().err
  assert cli.main(['migrate', models, '--examples', str(tmp_path / 'missing.py')]) == 2
  assert 'no such file' in capsys.readouterr().err


def test_the_report_counts_where_layer_sizes_came_from(tmp_path, on_path, capsys):
  """Without examples some sizes are constructor arguments; the traces turn them into expressions, and the
  JSON report and the command's last line say how many of each."""
  import json

  from codemods import cli

  examples, models = _project(tmp_path, '''
      import jax.numpy as jnp
      from models_under_trace import Block

      def square():
        return Block(dim=8, hidden=8), (jnp.zeros((2, 8)),)

      def wide():
        return Block(dim=8, hidden=32), (jnp.zeros((2, 8)),)
  ''')
  report = str(tmp_path / 'report.json')
  assert cli.main(['migrate', models, '--report-json', report]) == 0
  without = json.load(open(report))['input_sizes']
  assert cli.main(['migrate', models, '--examples', examples, '--report-json', report]) == 0
  with_examples = json.load(open(report))['input_sizes']
  assert sum(without.values()) == sum(with_examples.values())  # the same layer sites
  assert without['arguments'] > with_examples['arguments'] and with_examples['examples'] > 0
  block = next(c for f in json.load(open(report))['files'] for c in f['classes'] if c['nnx_name'] == 'Block')
  assert block['input_sizes'] == {'code': 1, 'examples': 2, 'arguments': 0}  # the LayerNorm and the Dense after it
  assert 'from example traces' in capsys.readouterr().err


def test_the_vit_fixture_with_an_example_keeps_only_the_image_channels(tmp_path, monkeypatch, capsys):
  """The scanned, rematted ViT encoder: with one example, every size but the image's channel count (an input's,
  no field's) comes from the code or the trace, including through the lifted nn.scan; the port still matches."""
  import json
  import runpy
  import shutil
  import sys

  import jax
  import jax.numpy as jnp
  from flax import nnx

  import nnx_bridge
  from codemods import cli

  models = tmp_path / 'vit_under_trace.py'
  shutil.copy(pathlib.Path(__file__).resolve().parents[2] / 'fixtures' / 'L2N002' / 'scan_remat_encoder.in.py', models)
  (tmp_path / 'examples.py').write_text(
      'import jax.numpy as jnp\nfrom vit_under_trace import ViT\n\n\n'
      'def vit():\n  return ViT(num_classes=5, patch=4, num_patches=4, depth=3, dim=16, mlp_dim=32, num_heads=2), '
      '(jnp.zeros((2, 8, 8, 3)),)\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  linen = runpy.run_path(str(models))
  report = tmp_path / 'report.json'
  try:
    assert cli.main(['migrate', str(models), '--examples', str(tmp_path / 'examples.py'), '--write',
                     '--report-json', str(report)]) == 0
  finally:
    sys.modules.pop('vit_under_trace', None)
  assert json.load(open(report))['input_sizes'] == {'code': 6, 'examples': 2, 'arguments': 1}
  assert '(89% derived)' in capsys.readouterr().err
  converted = runpy.run_path(str(models))
  sizes = dict(num_classes=5, patch=4, num_patches=4, depth=2, dim=8, mlp_dim=16, num_heads=2)  # not the example's
  images = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
  linen_module = linen['ViT'](**sizes)
  variables = linen_module.init({'params': jax.random.key(0), 'dropout': jax.random.key(0)}, images)
  model = converted['ViT'](**sizes, embedding_in_features=3, rngs=nnx.Rngs(0))
  parity = nnx_bridge.compare(linen_module, variables, model, images)
  assert parity.ok, parity.to_text()
