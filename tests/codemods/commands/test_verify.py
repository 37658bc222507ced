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
    ],
)
def test_usage_errors_exit_2(argv, message, capsys, monkeypatch):
  monkeypatch.chdir(EXAMPLES)
  assert verify(*argv) == 2
  assert message in capsys.readouterr().err


@pytest.mark.slow
def test_cnn_with_batchnorm_and_dropout_from_an_examples_file(capsys):
  argv = ['-', f'{EXAMPLES}/cnn_nnx.py:CNN', '--examples', f'{EXAMPLES}/examples.py', '--example', 'cnn']
  assert verify(*argv) == 0
  out = capsys.readouterr().out
  assert 'bn/mean' in out and 'train state' in out
  assert 'params/Dense_0/kernel' in out and 'float32[3136, 256]' in out
