"""Example traces (`--examples`): sizes read off abstract Linen inits become expressions of a class's fields
when exactly one simple expression agrees with every traced instance and variants the fit did not see confirm it;
an example that cannot be traced is reported and skipped; an examples file that cannot be used is a named error."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from codemods.example_sizes import resolve
from codemods.examples import ExamplesError
from codemods.examples import load_examples
from codemods.examples import trace_examples


@pytest.mark.parametrize('observations, check, expression', [
    ([({'self.a': 4, 'self.b': 6}, 4)], ({'self.a': 5, 'self.b': 6}, 5), 'self.a'),
    ([({'self.a': 4, 'self.b': 6}, 8)], ({'self.a': 5, 'self.b': 6}, 10), '2 * self.a'),  # multiples before sums
    ([({'self.a': 8, 'self.b': 3}, 4)], ({'self.a': 16, 'self.b': 3}, 8), 'self.a // 2'),
    ([({'self.a': 4, 'self.b': 6}, 10)], ({'self.a': 5, 'self.b': 6}, 11), 'self.a + self.b'),
    ([({'self.a': 4, 'self.b': 6}, 24), ({'self.a': 2, 'self.b': 6}, 12)], ({'self.a': 4, 'self.b': 7}, 28),
     'self.a * self.b'),
])
def test_the_simplest_agreeing_expression_wins(observations, check, expression):
  traced = resolve(observations, [('a variant', *check)])
  assert traced.expression == expression and traced.confirmations == 1


def test_equally_simple_expressions_are_ambiguous():
  traced = resolve([({'self.a': 4, 'self.b': 6}, 12)], [])  # 3 * self.a and 2 * self.b
  assert traced.expression is None and traced.candidates == ('3 * self.a', '2 * self.b')


def test_ambiguity_is_reported_and_more_instances_settle_it():
  one = resolve([({'self.dim': 16, 'self.hidden': 16}, 16)], [])
  assert one.expression is None and one.candidates == ('self.dim', 'self.hidden')
  assert 'self.dim and self.hidden all match' in one.describe()
  two = resolve([({'self.dim': 16, 'self.hidden': 16}, 16), ({'self.dim': 16, 'self.hidden': 32}, 16)],
                [('dim=17', {'self.dim': 17, 'self.hidden': 16}, 17)])
  assert two.expression == 'self.dim'
  assert two.describe() == '2 traced instances agree (sizes 16), confirmed on 1 of variants the fit did not see'


def test_no_expression_for_a_size_the_fields_do_not_give():
  traced = resolve([({'self.a': 4}, 49), ({'self.a': 8}, 49)], [])
  assert traced.expression is None and not traced.candidates
  assert traced.describe() == 'the example trace saw 49, which no expression of the fields matches'


def test_a_held_out_variant_refutes_an_expression_that_fits_by_coincidence():
  """A ResNet's head width is 2 * num_filters for two stages: three stages (held out) say otherwise."""
  fit = [({'self.num_filters': 8, 'len(self.stage_sizes)': 2}, 16),
         ({'self.num_filters': 16, 'len(self.stage_sizes)': 2}, 32)]
  traced = resolve(fit, [('stage_sizes=(2, 2, 2)', {'self.num_filters': 8, 'len(self.stage_sizes)': 3}, 32)])
  assert traced.expression is None and traced.unconfirmed == '2 * self.num_filters'
  assert traced.describe() == ('the example trace saw 16, 32; 2 * self.num_filters fits the examples but not the '
                               'variant stage_sizes=(2, 2, 2), which traced 32 where it gives 16')
  confirmed = resolve(fit, [('num_filters=9', {'self.num_filters': 9, 'len(self.stage_sizes)': 2}, 18)])
  assert confirmed.expression == '2 * self.num_filters' and confirmed.confirmations == 1


def test_an_expression_no_new_variant_tested_is_not_taken():
  fit = [({'self.a': 4}, 8), ({'self.a': 8}, 16)]
  traced = resolve(fit, [('b=2', {'self.a': 4}, 8)])  # the same atoms as a fitted instance: no test of the fit
  assert traced.expression is None and traced.unconfirmed == '2 * self.a'
  assert 'no variant changing its fields could be traced to confirm it' in traced.describe()
  assert resolve(fit, []).expression is None


def test_a_width_doubled_per_stage_is_an_expression_of_the_sequence_length():
  fit = [({'self.width': 4, 'len(self.stages)': 2}, 8), ({'self.width': 8, 'len(self.stages)': 2}, 16),
         ({'self.width': 4, 'len(self.stages)': 3}, 16)]
  traced = resolve(fit, [('stages=(1, 1, 1, 1)', {'self.width': 4, 'len(self.stages)': 4}, 32)])
  assert traced.expression == 'self.width * 2 ** (len(self.stages) - 1)'


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


def test_an_example_that_cannot_be_traced_is_reported_and_the_others_are_traced(tmp_path, on_path):
  examples, models = _project(tmp_path, '''
      import jax.numpy as jnp
      from models_under_trace import Block

      def broken():
        raise RuntimeError('no data')

      def wrong():
        return 3

      def bad_input():
        return Block(8, 8), (jnp.zeros((2, 3)),)

      def square():
        return Block(dim=8, hidden=8), (jnp.zeros((2, 8)),)

      def wide():
        return Block(dim=8, hidden=32), (jnp.zeros((2, 8)),)
  ''')
  sizes = trace_examples(examples)
  assert sizes.of_class(models, 'Block')[('LayerNorm_0', 'num_features')].expression == 'self.dim'
  broken, wrong, bad_input = sizes.failures
  assert (broken.function, broken.error, broken.where) == ('broken', 'RuntimeError: no data', f'{examples}:6')
  assert broken.describe() == f'{examples}: example broken() skipped, it cannot be traced: RuntimeError: no data ' \
                              f'(at {examples}:6)'
  assert wrong.function == 'wrong' and wrong.error.startswith('it returned int; an example returns (module, inputs)')
  assert bad_input.function == 'bad_input' and bad_input.error.startswith('the Linen init failed: ')
  assert bad_input.where == f'{models}:17'  # Block.__call__'s return: the 3-wide input meets the 8-wide Dense
  with pytest.raises(ExamplesError, match=r'broken\(\) skipped, it cannot be traced'):
    load_examples(examples)  # `linen2nnx demo` checks every example: there, one that fails is an error


SETUP_FIELD = '''
import dataclasses
import flax.linen as nn


class Head(nn.Module):
  width: int
  hidden: int = dataclasses.field(init=False)

  def setup(self):
    self.hidden = 2 * self.width
    self.up = nn.Dense(self.hidden)
    self.down = nn.Dense(self.width)

  def __call__(self, x):
    return self.down(nn.relu(self.up(x)))


class Net(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    return Head(self.width)(nn.Dense(self.width)(x))
'''


def test_a_field_set_in_setup_is_read_after_setup_and_is_not_an_atom(tmp_path, on_path):
  """`hidden: int = field(init=False)`, set in setup(): the trace reads it only once setup() ran (before, it has
  no value), and a size is not written in its terms (the converted __init__ may not have set it yet)."""
  (tmp_path / 'models_under_trace.py').write_text(SETUP_FIELD)
  (tmp_path / 'examples.py').write_text('import jax.numpy as jnp\nfrom models_under_trace import Net\n\n\n'
                                        'def net():\n  return Net(4), (jnp.zeros((2, 3)),)\n')
  sizes = trace_examples(str(tmp_path / 'examples.py'))
  assert not sizes.failures
  head = sizes.of_class(str(tmp_path / 'models_under_trace.py'), 'Head')
  assert head[('down', 'in_features')].expression == '2 * self.width'
  assert head[('up', 'in_features')].expression == 'self.width'


def test_trace_records_a_field_set_in_setup_with_its_value():
  import jax.numpy as jnp

  from nnx_bridge.linen_trace import trace_linen

  namespace = {}
  exec(compile(SETUP_FIELD, 'setup_field.py', 'exec'), namespace)
  trace = trace_linen(namespace['Net'](4), (jnp.zeros((2, 3)),), {})
  assert trace.first_calls[('Head_0',), 'setup'].fields['hidden'] == 8
  assert trace.first_calls[('Head_0',), '__call__'].fields['hidden'] == 8


TOWER = '''
from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp


class Stage(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.Dense(self.features)(x))


class Tower(nn.Module):
  stage_sizes: Sequence[int]
  width: int
  classes: int

  @nn.compact
  def __call__(self, x):
    for i, _ in enumerate(self.stage_sizes):
      x = Stage(self.width * 2**i)(x)
    x = jnp.mean(x, axis=1)
    return nn.Dense(self.classes)(x)
'''


def test_a_width_doubled_per_stage_holds_for_more_stages_than_the_example(tmp_path, on_path, capsys):
  """Two stages in the example: `2 * self.width` fits it, the variants with three and four stages do not; the head
  gets `self.width * 2 ** (len(self.stage_sizes) - 1)`, and the port of a four-stage tower matches Linen."""
  import runpy

  import jax
  from flax import nnx

  import nnx_bridge
  from codemods import cli

  models = tmp_path / 'models_under_trace.py'
  models.write_text(TOWER)
  (tmp_path / 'examples.py').write_text('import jax.numpy as jnp\nfrom models_under_trace import Tower\n\n\n'
                                        'def tower():\n  return Tower((1, 1), 4, 3), (jnp.zeros((2, 6, 5)),)\n')
  linen = runpy.run_path(str(models))
  assert cli.main(['migrate', str(models), '--examples', str(tmp_path / 'examples.py'), '--write']) == 0
  assert 'in_features of self.linear = self.width * 2 ** (len(self.stage_sizes) - 1), from the example trace' \
      in capsys.readouterr().err
  converted = runpy.run_path(str(models))
  x = jax.random.normal(jax.random.key(1), (2, 6, 5))
  linen_module = linen['Tower']((1, 2, 1, 1), 4, 3)
  variables = linen_module.init(jax.random.key(0), x)
  model = converted['Tower']((1, 2, 1, 1), 4, 3, stages_linear_in_features=5, rngs=nnx.Rngs(0))
  parity = nnx_bridge.compare(linen_module, variables, model, x)
  assert parity.ok, parity.to_text()


PADDED = '''
import flax.linen as nn
import jax.numpy as jnp


class Padded(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.width)(x)
    h = jnp.pad(h, ((0, 0), (0, -self.width % 8)))  # to a multiple of 8
    return nn.Dense(3)(h)


class Even(nn.Module):
  width: int

  def __post_init__(self):
    if self.width % 2:
      raise ValueError('width must be even')
    super().__post_init__()

  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(jnp.mean(nn.Dense(self.width)(x), axis=1))
'''


def test_an_expression_a_variant_refutes_or_none_confirms_stays_a_constructor_argument(tmp_path, on_path, capsys):
  """A width padded to a multiple of 8: `self.width` fits widths 8 and 16, width 9 (held out) pads to 16. A width
  that must be even: its held-out variant cannot be built, so nothing confirms `self.width`. Both stay arguments,
  and the report says why."""
  from codemods import cli

  models = tmp_path / 'models_under_trace.py'
  models.write_text(PADDED)
  (tmp_path / 'examples.py').write_text(
      'import jax.numpy as jnp\nfrom models_under_trace import Even, Padded\n\n\n'
      'def padded():\n  return Padded(8), (jnp.zeros((2, 3)),)\n\n\n'
      'def even():\n  return Even(8), (jnp.zeros((2, 5, 3)),)\n')
  sizes = trace_examples(str(tmp_path / 'examples.py'))
  padded = sizes.of_class(str(models), 'Padded')[('Dense_1', 'in_features')]
  assert padded.expression is None and padded.unconfirmed == 'self.width'
  even = sizes.of_class(str(models), 'Even')[('Dense_0', 'in_features')]  # the outer Dense, built first
  assert even.expression is None and even.unconfirmed == 'self.width'
  assert cli.main(['migrate', str(models), '--examples', str(tmp_path / 'examples.py')]) == 0
  captured = capsys.readouterr()
  assert captured.out.count('linear2_in_features: int') == 2  # Padded's and Even's
  assert ('new constructor argument linear2_in_features: in_features of self.linear2, the input dimension of '
          "self.linear2's call argument h (the example trace saw 8, 16; self.width fits the examples but not the "
          'variant padded() with width=9, which traced 16 where it gives 9)') in captured.err
  assert 'self.width fits the examples but no variant changing its fields could be traced to confirm it' \
      in captured.err


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


@pytest.mark.parametrize('body, message', [
    ('import jax.numpy as jnp\nimport no_such_models\n',
     "it cannot be imported: ModuleNotFoundError: No module named 'no_such_models' (at {examples}:2); the folder "
     'of the examples file and the working directory are importable'),
    ('def model(:\n  pass\n', 'it cannot be imported: SyntaxError at {examples}:1: '),
    ('X = 1\n', 'no example: each public top-level function of the file is called without arguments'),
])
def test_an_examples_file_that_cannot_be_used_is_one_line_and_exit_2(tmp_path, body, message):
  examples, models = _project(tmp_path, body)
  run = subprocess.run([sys.executable, '-c', 'import sys; from codemods import cli; sys.exit(cli.main())',
                        'migrate', models, '--examples', examples], capture_output=True, text=True,
                       cwd=tmp_path, env={**os.environ, 'PYTHONPATH': str(pathlib.Path(__file__).parents[2])})
  assert run.returncode == 2, run.stderr
  assert run.stderr.startswith(f'linen2nnx migrate: {examples}: {message.format(examples="examples.py")}')
  assert run.stderr.count('\n') == 1 and 'Traceback' not in run.stderr


def test_migrate_names_a_missing_examples_file(tmp_path, capsys):
  from codemods import cli

  assert cli.main(['migrate', str(tmp_path), '--examples', str(tmp_path / 'missing.py')]) == 2
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
