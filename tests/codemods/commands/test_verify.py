"""`linen2nnx verify` on the bundled example projects: exit codes, reports, rejections."""

import json
import pathlib

import pytest

from codemods import cli

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / 'fixtures' / 'examples'
MLP_INPUT = ['--input', 'x=float32[3,8]']


def verify(*argv):
  return cli.main(['verify', *argv])


def test_right_port_exits_0_and_says_where_constructor_arguments_came_from(capsys):
  assert verify(f'{EXAMPLES}/mlp_linen.py:MLP', f'{EXAMPLES}/mlp_nnx.py:MLP', *MLP_INPUT) == 0
  out = capsys.readouterr().out
  assert "in_features=8: the first input's last axis" in out
  assert 'hidden=16: the Linen field of the same name' in out
  assert 'params/Dense_0/kernel' in out and 'linear1/kernel' in out
  assert 'RESULT: the NNX port matches the Linen model' in out


@pytest.mark.parametrize(
    'port, message',
    [
        ('TransposedKernel', 'MISMATCH'),
        ('SwappedLayers', 'Linen Dense_1 (Dense) pairs with NNX norm (LayerNorm)'),
        ('MissingBias', 'params/Dense_2/bias float32[4] has no place in NNX linear3'),
        ('WrongNorm', 'Linen LayerNorm_0 (LayerNorm) pairs with NNX norm (RMSNorm)'),
    ],
)
def test_wrong_ports_exit_1_naming_the_paths(port, message, capsys):
  assert verify(f'{EXAMPLES}/mlp_linen.py:MLP', f'{EXAMPLES}/mlp_nnx_wrong.py:{port}', *MLP_INPUT) == 1
  captured = capsys.readouterr()
  assert message in captured.out + captured.err


def test_transposed_kernel_report_names_the_kernel(capsys):
  verify(f'{EXAMPLES}/mlp_linen.py:MLP', f'{EXAMPLES}/mlp_nnx_wrong.py:TransposedKernel', *MLP_INPUT, '--json')
  report = json.loads(capsys.readouterr().out)
  assert report['ok'] is False
  failed = {(d['check'], d['path']) for d in report['differences'] if not d['ok']}
  assert ('output', 'output') in failed and ('gradient', 'linear2/kernel') in failed


def test_mapping_is_written_and_can_be_given_back(tmp_path, capsys):
  mapping = tmp_path / 'mapping.json'
  argv = [f'{EXAMPLES}/mlp_linen.py:MLP', f'{EXAMPLES}/mlp_nnx.py:MLP', *MLP_INPUT]
  assert verify(*argv, '--write-mapping', str(mapping)) == 0
  entries = json.loads(mapping.read_text())
  assert entries['params/Dense_0/kernel'] == 'linear1/kernel'
  assert verify(*argv, '--mapping', str(mapping)) == 0
  # A reviewer's edit that swaps two leaves is honoured, and caught.
  entries['params/LayerNorm_0/scale'], entries['params/LayerNorm_0/bias'] = 'norm/bias', 'norm/scale'
  mapping.write_text(json.dumps(entries))
  assert verify(*argv, '--mapping', str(mapping)) == 1
  capsys.readouterr()


@pytest.mark.parametrize(
    'argv, message',
    [
        (['nope.py:X', 'mlp_nnx.py:MLP', '--input', 'x=float32[3,8]'], 'nope.py: no such file'),
        (['mlp_linen.py:MLP', 'mlp_nnx.py:MLP'], 'give the model inputs'),
        (['mlp_linen.py:MLP', 'mlp_nnx.py:MLP', '--input', 'x=float[3'], "expected [name=]dtype[d0,d1,...]"),
        (['mlp_linen.py:MLP', 'mlp_nnx.py:MLP', '--input', 'x=float32[3,8]', '--linen-kwargs', '{"width": 3}'],
         "unexpected keyword argument 'width'"),
        (['mlp_linen.py:Nope', 'mlp_nnx.py:MLP', '--input', 'x=float32[3,8]'], "has no 'Nope'"),
        (['mlp_linen.py:MLP', 'mlp_nnx.py:MLP', '--input', 'x=float32[3,8]', '--nnx-kwargs', '{"depth": 2}'],
         'takes no'),
        # Inputs the Linen model (the reference) fails on: the command line is wrong, not the port.
        (['mlp_linen.py:MLP', 'mlp_nnx.py:MLP', '--input', 'y=float32[3,8]'],
         ("the Linen model MLP fails on the inputs y=float32[3,8]: TypeError: MLP.__call__() got an unexpected "
          "keyword argument 'y'; give --input the names, ranks and sizes MLP.__call__(x) takes")),
        (['mlp_linen.py:MLP', 'mlp_nnx.py:MLP', '--input', 'x=floot32[3,8]'], "--input 'x=floot32[3,8]': unknown dtype 'floot32'"),
        (['mlp_linen.py:MLP', 'mlp_nnx.py:MLP', '--input', 'x=float32[3,0]'],
         'the Linen model MLP fails on the inputs x=float32[3,0]: ZeroDivisionError: division by zero'),
        (['cnn_linen.py:CNN', 'cnn_nnx.py:CNN', '--input', 'x=float32[2,28,28]'],
         ('the Linen model CNN fails on the inputs x=float32[2,28,28]: ZeroDivisionError: integer modulo by zero '
          '(at cnn_linen.py:19); give --input the names, ranks and sizes CNN.__call__(x) takes')),
    ],
)
def test_usage_errors_exit_2_in_one_line(argv, message, capsys, monkeypatch):
  monkeypatch.chdir(EXAMPLES)
  assert verify(*argv) == 2
  err = capsys.readouterr().err
  assert message in err and err.count('\n') == 1, err


def test_a_mapping_path_that_cannot_be_written_is_refused_before_the_models_are_built(tmp_path, capsys):
  argv = [f'{EXAMPLES}/mlp_linen.py:MLP', f'{EXAMPLES}/mlp_nnx.py:MLP', *MLP_INPUT]
  assert verify(*argv, '--write-mapping', str(tmp_path / 'no' / 'm.json')) == 2
  assert capsys.readouterr() == ('', f'linen2nnx verify: --write-mapping {tmp_path}/no/m.json: the folder '
                                     f'{tmp_path}/no does not exist; create it first (mkdir -p {tmp_path}/no) or give '
                                     'a path in another folder\n')
  assert verify(*argv, '--write-mapping', str(tmp_path)) == 2
  assert capsys.readouterr().err == (f'linen2nnx verify: --write-mapping {tmp_path}: is a folder; give the path of a '
                                     'file, in it or elsewhere\n')


def test_inputs_from_an_examples_file_that_the_linen_model_fails_on(tmp_path, capsys):
  examples = tmp_path / 'head_examples.py'
  examples.write_text(
      'import flax.linen as nn\n'
      'import jax.numpy as jnp\n'
      'from flax import nnx\n\n'
      'class Head(nn.Module):\n'
      '  @nn.compact\n'
      '  def __call__(self, x):\n'
      '    return nn.Dense(2)(x)\n\n'
      'class NNXHead(nnx.Module):\n'
      '  def __init__(self, in_features, *, rngs):\n'
      '    self.linear = nnx.Linear(in_features, 2, rngs=rngs)\n\n'
      '  def __call__(self, x):\n'
      '    return self.linear(x)\n\n'
      'def scalar():\n'
      '  return Head(), (jnp.float32(1.0),)\n\n'
      'def batch():\n'
      '  return Head(), (jnp.ones((3, 8)),)\n'
  )
  argv = ['-', f'{examples}:NNXHead', '--examples', str(examples)]
  assert verify(*argv, '--example', 'scalar') == 2
  err = capsys.readouterr().err
  assert 'the Linen model Head fails on the inputs float32[]: IndexError' in err
  assert f'{examples.name}:8); fix the inputs {examples} returns' in err
  assert verify(*argv, '--example', 'batch') == 0  # inputs Head takes
  assert 'RESULT: the NNX port matches the Linen model' in capsys.readouterr().out


@pytest.mark.slow
def test_cnn_with_batchnorm_and_dropout_from_an_examples_file(capsys):
  argv = ['-', f'{EXAMPLES}/cnn_nnx.py:CNN', '--examples', f'{EXAMPLES}/examples.py', '--example', 'cnn']
  assert verify(*argv) == 0
  out = capsys.readouterr().out
  assert 'bn/mean' in out and 'train state' in out
  assert 'params/Dense_0/kernel' in out and 'float32[3136, 256]' in out


@pytest.mark.parametrize('precision', ['highest', 'default'])
def test_the_verdicts_hold_at_both_precisions_and_the_report_names_backend_and_precision(precision, capsys):
  import jax

  argv = [*MLP_INPUT, '--precision', precision]
  assert verify(f'{EXAMPLES}/mlp_linen.py:MLP', f'{EXAMPLES}/mlp_nnx.py:MLP', *argv) == 0
  assert f'backend {jax.default_backend()}, matmul precision {precision}' in capsys.readouterr().out
  assert verify(f'{EXAMPLES}/mlp_linen.py:MLP', f'{EXAMPLES}/mlp_nnx_wrong.py:TransposedKernel', *argv, '--json') == 1
  report = json.loads(capsys.readouterr().out)
  assert (report['backend'], report['precision'], report['ok']) == (jax.default_backend(), precision, False)
  assert report['noise_factor'] == (10.0 if precision == 'default' else 0.0)
