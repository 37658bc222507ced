"""`--migrate-report`: verify and convert build a migrated port from `linen2nnx migrate`'s record of it."""

import json
import pathlib
import runpy
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from codemods import cli
from codemods import report
from codemods.ports import model_refs

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / 'fixtures' / 'L2N002'

# (fixture, class) -> (Linen kwargs, --input specs, a line the constructor report must hold). Every
# model is 4 wide on a [2, 4] input, so that the parity checks reuse each other's compiled ops.
CASES = {
    ('guide_basic_module', 'Model'): (
        {'dmid': 4, 'dout': 4}, ['x=float32[2,4]'],
        'block_linear_in_features=4: in_features of Linen Block_0/Dense_0 (Dense) = inputs.shape[-1]',
    ),
    ('guide_basic_module', 'Block'): (
        {'features': 4}, ['x=float32[2,4]'], 'linear_in_features=4: in_features of Linen Dense_0 (Dense)',
    ),
    ('setup_mlp', 'MLP'): (
        {'hidden': 4, 'out': 4}, ['x=float32[2,4]'], 'dense1_in_features=4: in_features of Linen dense1',
    ),
    ('compact_dropout_batchnorm', 'Net'): ({'width': 4}, ['x=float32[2,4]'], 'stem_in_features=4'),
    ('guide_collections', 'Block'): ({'features': 4}, ['x=float32[2,4]'], 'dense_in_features=4'),
    ('guide_multiple_methods', 'AutoEncoder'): (
        {'embed_dim': 4, 'output_dim': 4}, ['x=float32[2,4]'], 'encoder_in_features=4',
    ),
    ('compact_other_method', 'Encoder'): (
        {'width': 4}, ['float32[2,4]', 'float32[2,2]'],
        'linear2_in_features=2: in_features of Linen Dense_1 (Dense) = inputs.shape[-1], measured on its call (inputs [2, 2])',
    ),
    ('bridged_grandchild', 'FlaxTinyModel'): (  # example inputs measured two classes down, keywords bound
        {'features': 4}, ['input_ids=int32[2,4]:10', 'attention_mask=float32[2,4]'],
        'encoder_layer_example_inputs: the inputs of the first call of Linen encoder/layer '
        '(FlaxTinyLayerCollection) ([2, 4, 4], [2, 4])',
    ),
    ('scope_variables', 'Scale'): (
        {}, ['x=float32[2,4]'], 'scale_features=4: the last axis of x of Linen <root> (Scale).__call__',
    ),
    ('t5_gated_feed_forward', 'FlaxT5LayerFF'): (  # the record names the gated arm's argument; the plain arm is built
        {'d_model': 4, 'd_ff': 4}, ['hidden_states=float32[2,4]'],
        'DenseReluDense_wi_0_in_features=4: in_features of Linen DenseReluDense/wi (Dense)',
    ),
    ('per_element_sizes', 'MLP'): (  # one size per element of a loop's layers, each measured on its own call
        {'features': [6, 5, 3], 'nonlinearity': 'swish'}, ['x=float32[2,4]'],
        'linears_in_features=(4, 6): in_features of Linen Dense_0 (Dense) = inputs.shape[-1], measured on its call '
        '(inputs [2, 4]); in_features of Linen Dense_1 (Dense)',
    ),
    ('setup_arm_sizes', 'FlaxTinyLayer'): (  # a size only the arm not built reads: any value does
        {'hidden_size': 4}, ['hidden_states=float32[2,4]'],
        'mlp_weights_out_in_features=1: unused: FlaxTinyLayer(mlp_weights_out_in_features=...) sizes the mlp another '
        'arm of an if builds, where this model built FlaxTinyMLP',
    ),
}


@pytest.fixture(scope='module')
def migrated(tmp_path_factory):
  """The L2N002 fixtures copied as `<case>.py` and migrated in place, and the JSON report."""
  folder = tmp_path_factory.mktemp('migrated')
  for source in FIXTURES.glob('*.in.py'):
    shutil.copy(source, folder / source.name.replace('.in.py', '.py'))
  report_path = folder / 'report.json'
  cli.main(['migrate', str(folder), '--write', '--report-json', str(report_path), '-j', '1'])
  return folder, report_path


def _argv(migrated, case, cls, report_path=None, nnx_case=None, nnx_class=None):
  """verify's LINEN NNX and model options for a case: no NNX kwargs, only the report."""
  folder, default_report = migrated
  linen_kwargs, inputs, _ = CASES[case, cls]
  return [
      f'{FIXTURES}/{case}.in.py:{cls}', f'{folder}/{nnx_case or case}.py:{nnx_class or cls}',
      '--linen-kwargs', json.dumps(linen_kwargs), *(arg for spec in inputs for arg in ('--input', spec)),
      '--migrate-report', str(report_path or default_report),
  ]


def _edited(migrated, tmp_path, case, cls, edit):
  """A copy of the report with `edit` applied to the record of `cls` in `case`."""
  document = json.loads(migrated[1].read_text())
  for entry in document['files']:
    for record in entry['classes']:
      if pathlib.Path(entry['path']).name == f'{case}.py' and record['nnx_name'] == cls:
        edit(record)
  path = tmp_path / 'edited.json'
  path.write_text(json.dumps(document))
  return path


def _swap(a, b):
  """An edit that swaps two Linen child names of a record."""

  def edit(record):
    for child in record['children']:
      child['linen_name'] = {a: b, b: a}.get(child['linen_name'], child['linen_name'])

  return edit


@pytest.mark.slow
@pytest.mark.parametrize('case, cls', sorted(CASES))
def test_migrated_port_verifies_with_only_its_inputs(migrated, case, cls, capsys):
  assert cli.main(['verify', *_argv(migrated, case, cls)]) == 0
  out = capsys.readouterr().out
  assert CASES[case, cls][2] in out
  assert 'RESULT: the NNX port matches the Linen model' in out


def _constructor(argv):
  """The abstract NNX model and its constructor report, as verify builds them."""
  args = cli.build_parser().parse_args(['verify', *argv])
  model, origins, _ = model_refs.build_nnx(args, args.nnx, model_refs.build_example(args, args.linen), abstract=True)
  return model, origins


def test_nnx_kwargs_still_win_over_the_report(migrated):
  argv = _argv(migrated, 'compact_dropout_batchnorm', 'Net')
  model, origins = _constructor([*argv, '--nnx-kwargs', '{"stem_in_features": 7}'])
  assert 'stem_in_features=7: from --nnx-kwargs' in origins and 'width=4: the Linen field of the same name' in origins
  assert model.stem.kernel.shape == (7, 4)


def test_a_variable_size_of_a_nested_class_comes_from_the_code(migrated):
  """Scale's `x.shape[-1]` is the width of `linear(x) + bias`: the bias param's last axis, self.hidden; only the
  input's width is measured."""
  folder, report_path = migrated
  argv = [f'{FIXTURES}/scope_variables.in.py:NoisyHead', f'{folder}/scope_variables.py:NoisyHead',
          '--linen-kwargs', '{"hidden": 3}', '--input', 'x=float32[2,4]', '--migrate-report', str(report_path)]
  model, origins = _constructor(argv)
  assert [o for o in origins if '_features=' in o] == [
      o for o in origins if o.startswith('linear_in_features=4')]
  assert model.linear.kernel.shape == (4, 3) and model.scale.scale.shape == (3,)


def test_a_model_drawing_another_rng_stream_verifies_once_the_stream_is_named(migrated, capsys):
  folder, report_path = migrated
  argv = ['verify', f'{FIXTURES}/scope_variables.in.py:NoisyHead', f'{folder}/scope_variables.py:NoisyHead',
          '--linen-kwargs', '{"hidden": 4, "noise": 0.0}', '--input', 'x=float32[2,4]',
          '--migrate-report', str(report_path)]
  assert cli.main(argv) == 2
  assert 'draws from an rng stream it was not given' in capsys.readouterr().err
  assert cli.main([*argv, '--rng-streams', 'noise']) == 0


# --- Wrong reports -----------------------------------------------------------------------------


def test_swapped_children_that_do_not_fit_are_refused_naming_the_call_order(migrated, tmp_path, capsys):
  edited = _edited(migrated, tmp_path, 'compact_dropout_batchnorm', 'Net', _swap('Dense_0', 'Dense_1'))
  assert cli.main(['verify', *_argv(migrated, 'compact_dropout_batchnorm', 'Net', edited)]) == 1
  err = capsys.readouterr().err
  assert 'layers paired by the given names' in err
  assert 'Linen params/Dense_0/kernel float32[4,4] does not fit NNX linear2/kernel float32[4,2]' in err
  assert 'Linen Dense_0: the report says NNX linear2, the mapping puts its leaves in linear1' in err


@pytest.mark.slow
def test_swapped_children_of_one_shape_fail_parity_and_say_why(migrated, tmp_path, capsys):
  edited = _edited(migrated, tmp_path, 'compact_dropout_batchnorm', 'Net', _swap('stem', 'Dense_0'))
  argv = _argv(migrated, 'compact_dropout_batchnorm', 'Net', edited)  # stem and Dense_0 are both 4 x 4
  assert cli.main(['verify', *argv, '--no-train-step']) == 1
  captured = capsys.readouterr()
  assert 'RESULT: MISMATCH' in captured.out
  assert "the call order pairs layers unlike the migrate report's names" in captured.err
  assert 'Linen stem: the report says NNX linear1, the mapping puts its leaves in stem' in captured.err


def test_child_names_the_port_lacks_are_a_mismatch(migrated, tmp_path, capsys):
  edited = _edited(migrated, tmp_path, 'guide_basic_module', 'Model', _swap('Block_0', 'Dense_0'))
  argv = [*_argv(migrated, 'guide_basic_module', 'Model', edited), '--nnx-kwargs', '{"block_linear_in_features": 4}']
  assert cli.main(['verify', *argv]) == 1
  err = capsys.readouterr().err
  assert 'the leaf mapping does not agree with the record of Model' in err
  assert 'Linen Block_0/Dense_0: the report says NNX linear/linear, the mapping puts its leaves in block/linear' in err


def _drop_argument(record):
  record['arguments'] = [a for a in record['arguments'] if a['name'] != 'width']


def _size_of_another_child(record):
  size = next(a for a in record['arguments'] if a['name'] == 'stem_in_features')
  size['child'], size['detail'] = 'batch_norm', 'in_features of self.batch_norm, made up'


@pytest.mark.parametrize(
    'case, cls, edit, nnx_class, message',
    [
        ('guide_basic_module', 'Model', None, 'Block', 'converts Linen Block, but the Linen model is a Model'),
        ('compact_dropout_batchnorm', 'Net', _drop_argument, None,
         "lists the arguments ['stem_in_features', 'rngs'], but Net.__init__ takes ['width', 'stem_in_features', 'rngs']"),
        ('compact_dropout_batchnorm', 'Net', _size_of_another_child, None,
         'the layer table does not say how in_features of Linen BatchNorm_0 (BatchNorm) is read off its inputs; '
         'pass it: --nnx-kwargs \'{"stem_in_features": ...}\''),
        ('guide_basic_module', 'Model', _swap('Block_0', 'Dense_0'), None,
         'how linear_in_features of Linen Dense_0 (Dense) is read off its inputs'),
    ],
)
def test_records_that_do_not_fit_the_models_are_usage_errors(
    migrated, tmp_path, case, cls, edit, nnx_class, message, capsys
):
  edited = _edited(migrated, tmp_path, case, cls, edit) if edit else None
  assert cli.main(['verify', *_argv(migrated, case, cls, edited, nnx_class=nnx_class)]) == 2
  assert message in capsys.readouterr().err


def test_a_class_the_report_does_not_record_is_a_usage_error(migrated, capsys):
  argv = _argv(migrated, 'setup_mlp', 'MLP')
  argv[1] = f'{FIXTURES}/setup_mlp.out.py:MLP'  # the same class, but not the file migrate wrote
  assert cli.main(['verify', *argv]) == 2
  assert 'has no record of class MLP of' in capsys.readouterr().err


def test_two_records_of_one_class_are_a_usage_error(migrated, tmp_path, capsys):
  folder, report_path = migrated
  document = json.loads(report_path.read_text())
  entry = next(e for e in document['files'] if e['path'].endswith('setup_mlp.py'))
  document['files'].append({**entry, 'path': 'setup_mlp.py'})  # relative to the report's folder
  edited = folder / 'twice.json'
  edited.write_text(json.dumps(document))
  assert cli.main(['verify', *_argv(migrated, 'setup_mlp', 'MLP', edited)]) == 2
  assert 'has 2 records of class MLP' in capsys.readouterr().err


@pytest.mark.parametrize('text, message', [('{"version": 99}', 'not a linen2nnx migrate report of version 1'),
                                           ('{"version": 1, "files": [{}]}', 'not a linen2nnx migrate report'),
                                           ('[', 'not JSON')])
def test_a_file_that_is_no_report_is_a_usage_error(migrated, tmp_path, text, message, capsys):
  (tmp_path / 'bad.json').write_text(text)
  assert cli.main(['verify', *_argv(migrated, 'setup_mlp', 'MLP', tmp_path / 'bad.json')]) == 2
  assert message in capsys.readouterr().err


def test_report_json_reads_back_into_the_records_it_was_written_from():
  record = report.ConvertedClass(
      3, 'MLP', 'MLP', (report.ConstructorArgument('x_in', report.INPUT_DIMENSION, 'in_features of self.x', 'x'),),
      (report.ChildName('Dense_0', 'x'),),
  )
  document = report.MigrationResult((report.FileOutcome('m.py', report.CHANGED, classes=(record,)),)).to_json_dict()
  document['files'][0]['classes'][0]['added_later'] = True  # a field a later version adds is ignored
  assert report.converted_classes_from_json(json.loads(json.dumps(document))) == {'m.py': (record,)}


# --- convert -----------------------------------------------------------------------------------


def _linen_checkpoint(tmp_path):
  linen_module = runpy.run_path(str(FIXTURES / 'compact_dropout_batchnorm.in.py'))['Net'](width=4)
  x = jax.random.normal(jax.random.key(3), (2, 4))
  variables = linen_module.init(jax.random.key(7), x, train=False)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / 'linen', variables)
  return linen_module, variables, x


def test_convert_builds_the_port_from_the_report(migrated, tmp_path, capsys):
  linen_module, variables, x = _linen_checkpoint(tmp_path)
  linen_ref, nnx_ref, *options = _argv(migrated, 'compact_dropout_batchnorm', 'Net')
  argv = ['convert', str(tmp_path / 'linen'), str(tmp_path / 'nnx'), f'--linen={linen_ref}', f'--nnx={nnx_ref}']
  assert cli.main([*argv, *options]) == 0
  model = runpy.run_path(str(migrated[0] / 'compact_dropout_batchnorm.py'))['Net'](4, stem_in_features=4, rngs=nnx.Rngs(0))
  with ocp.StandardCheckpointer() as checkpointer:
    nnx.update(model, checkpointer.restore(tmp_path / 'nnx', nnx.state(model, nnx.Not(nnx.RngState))))
  model.eval()
  np.testing.assert_allclose(model(x), linen_module.apply(variables, x, train=False), atol=1e-6)
  assert 'wrote' in capsys.readouterr().out


def test_convert_writes_nothing_when_call_order_and_report_disagree(migrated, tmp_path, capsys):
  _linen_checkpoint(tmp_path)
  edited = _edited(migrated, tmp_path, 'compact_dropout_batchnorm', 'Net', _swap('stem', 'Dense_0'))
  linen_ref, nnx_ref, *options = _argv(migrated, 'compact_dropout_batchnorm', 'Net', edited)
  argv = ['convert', str(tmp_path / 'linen'), str(tmp_path / 'nnx'), f'--linen={linen_ref}', f'--nnx={nnx_ref}']
  assert cli.main([*argv, *options]) == 1
  assert "nothing written: the call order pairs layers unlike the migrate report's names" in capsys.readouterr().err
  assert not (tmp_path / 'nnx').exists()


def test_a_shared_module_may_be_mapped_through_any_of_its_paths():
  """NNX lists a module reached by several paths under one of them: the record's path and the mapping's may
  differ only when they lead to the very same object; two equal-looking modules are still told apart."""
  from flax import nnx

  from codemods.ports.migrate_report import _same_object

  class Pair(nnx.Module):
    def __init__(self, rngs):
      self.shared = nnx.Embed(5, 3, rngs=rngs)
      self.encoder = nnx.Dict(embed=self.shared)
      self.other = nnx.Embed(5, 3, rngs=rngs)
      self.layers = nnx.List([self.shared])

  model = Pair(nnx.Rngs(0))
  assert _same_object(model, ('encoder', 'embed'), ('shared',))
  assert _same_object(model, ('layers', '0'), ('shared',))
  assert not _same_object(model, ('other',), ('shared',))
  assert not _same_object(model, ('missing',), ('shared',))
  assert not _same_object(None, ('shared',), ('shared',))


@pytest.mark.parametrize('cls, size, where', [
    ('FlaxTinyLayerCollection', 'layers_dense_in_features', 'Linen 0/dense (Dense)'),
    ('FlaxTinyBlocks', 'blocks_dense_in_features', 'Linen block_0/dense (Dense)'),
])
def test_a_size_of_a_layer_list_is_measured_on_its_first_element(migrated, cls, size, where):
  """Linen names the list's elements `0, 1, ...` (`name=str(i)`) or `block_0, ...`; the record names them by the
  pattern (`{i}`, `block_{i}`): the size is read off the first element's call, not left unmeasured."""
  from codemods.ports import migrate_report

  folder, report_path = migrated
  config = model_refs.load_object(f'{FIXTURES}/setup_list_named.in.py:TinyConfig')()
  linen = model_refs.load_object(f'{FIXTURES}/setup_list_named.in.py:{cls}')(config)
  port = migrate_report.load_port(str(report_path), model_refs.load_object(f'{folder}/setup_list_named.py:{cls}'),
                                  linen, (jax.numpy.ones((2, 3, 6)),), {})
  value, read = port.measured_sizes()[size]()
  assert value == 6 and read.startswith(f'in_features of {where}'), read


MIXED_LIST = '''import flax.linen as nn


def squash(v):
  return v


class Proj(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features)(x)


class Gate(nn.Module):
  features: int

  def setup(self):
    self.gate = nn.Dense(self.features)

  def __call__(self, x):
    return self.gate(squash(x))


class Stack(nn.Module):
  def setup(self):
    self.layer = [Proj(6, name="0"), Gate(5, name="1")]

  def __call__(self, x):
    for layer in self.layer:
      x = layer(x)
    return x
'''


def test_a_size_of_a_later_element_of_a_list_of_several_classes_is_measured_on_that_element(tmp_path):
  """RegNet's Y layer holds convolutions, then a squeeze-and-excitation layer: a size only the third element's
  class takes is read off that element's call (6, what the first returned), not the first's (3), which does not
  take it."""
  from codemods.ports import migrate_report

  (tmp_path / 'stack.py').write_text(MIXED_LIST)
  report_path = tmp_path / 'report.json'
  cli.main(['migrate', str(tmp_path), '--write', '--report-json', str(report_path), '-j', '1'])
  namespace: dict = {}
  exec(compile(MIXED_LIST, 'stack_linen.py', 'exec'), namespace)
  port = migrate_report.load_port(str(report_path), model_refs.load_object(f'{tmp_path}/stack.py:Stack'),
                                  namespace['Stack'](), (jax.numpy.ones((2, 3)),), {})
  measured = port.measured_sizes()
  assert measured['layer_linear_in_features']()[0] == 3
  value, read = measured['layer_gate_in_features']()
  assert value == 6 and 'Linen 1/gate (Dense)' in read, read


HEAD_AND_LOOP = '''import jax.numpy as jnp
import flax.linen as nn


def widen(x):
  return jnp.concatenate([x, x], axis=-1)


class Block(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features)(widen(x))


class Stack(nn.Module):
  widths: tuple = (3, 5)

  def setup(self):
    layers = [Block(4, name='0')]
    for i, width in enumerate(self.widths):
      layers.append(Block(width, name=str(i + 1)))
    self.layers = layers

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x
'''


def test_sizes_of_a_loops_elements_after_a_layer_written_out_are_measured_on_those_elements(tmp_path, capsys):
  """RegNet's stage collection: its first stage written out, the others appended in a loop, with a size the code does
  not say inside each. The loop's tuple starts at the element after the one written out (8 and 6, read off layers 1
  and 2), and verify passes; read from the list's first element on (6, 8, 6) it built layers that do not fit."""
  from codemods.ports import migrate_report

  (tmp_path / 'stack.py').write_text(HEAD_AND_LOOP)
  (tmp_path / 'linen_stack.py').write_text(HEAD_AND_LOOP)
  report_path = tmp_path / 'report.json'
  assert cli.main(['migrate', str(tmp_path / 'stack.py'), '--write', '--report-json', str(report_path), '-j', '1']) == 0
  namespace: dict = {}
  exec(compile(HEAD_AND_LOOP, 'stack_linen.py', 'exec'), namespace)
  port = migrate_report.load_port(str(report_path), model_refs.load_object(f'{tmp_path}/stack.py:Stack'),
                                  namespace['Stack'](), (jax.numpy.ones((2, 3)),), {})
  measured = port.measured_sizes()
  assert measured['layers_linear_in_features']()[0] == 6
  value, read = measured['layers_linear_in_features_']()
  assert value == (8, 6) and read.startswith('in_features of Linen 1/Dense_0 (Dense)'), read
  argv = ['verify', f'{tmp_path}/linen_stack.py:Stack', f'{tmp_path}/stack.py:Stack', '--input', 'x=float32[2,3]']
  capsys.readouterr()
  assert cli.main([*argv, '--migrate-report', str(report_path)]) == 0, capsys.readouterr()
  document = json.loads(report_path.read_text())
  for entry in document['files']:
    for record in entry['classes']:
      for argument in record['arguments']:
        argument.pop('element_offset', None)  # as a report without it reads: from the list's first element
  unshifted = tmp_path / 'unshifted.json'
  unshifted.write_text(json.dumps(document))
  assert cli.main([*argv, '--migrate-report', str(unshifted)]) != 0
