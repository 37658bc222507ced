"""`linen2nnx migrate`: diff / --check / --write exit codes, the JSON report and an interrupted --write."""

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from codemods.commands import migrate as migrate_command
from codemods.engine import SLEEP_ENV

LINEN = 'import flax.linen as nn\n\nW = nn.initializers.zeros\n'
MIGRATED = 'from flax import nnx\n\nW = nnx.initializers.zeros\n'
# The subcommand on its own parser, so the tests do not depend on its registration in cli.py.
RUNNER = (
    'import argparse, sys\n'
    'from codemods.commands import migrate\n'
    'parser = argparse.ArgumentParser()\n'
    'migrate.add_parser(parser.add_subparsers())\n'
    'args = parser.parse_args(["migrate", *sys.argv[1:]])\n'
    'sys.exit(args.run(args))\n'
)


def _main(*argv: str) -> int:
  parser = argparse.ArgumentParser()
  migrate_command.add_parser(parser.add_subparsers())
  args = parser.parse_args(['migrate', *argv])
  return args.run(args)


@pytest.fixture()
def tree(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  files = {
      'src/a.py': LINEN.encode(),
      'src/crlf.py': LINEN.replace('\n', '\r\n').encode(),
      'src/no_final_newline.py': LINEN.rstrip('\n').encode(),
      'src/other.py': b'import os\n',
      'src/todo.py': b'import flax.linen as nn\nx = nn.initializers.nope\n',
  }
  for name, content in files.items():
    pathlib.Path(name).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(name).write_bytes(content)
  return files


def _snapshot(root='src'):
  return {str(p): p.read_bytes() for p in sorted(pathlib.Path(root).rglob('*.py'))}


@pytest.mark.parametrize('apply', [['git', 'apply'], ['patch', '-p1', '--quiet', '--binary']], ids=['git_apply', 'patch'])
def test_default_prints_a_diff_that_applies_and_writes_nothing(tree, capsys, tmp_path, apply):
  if shutil.which(apply[0]) is None:
    pytest.skip(f'{apply[0]} is not installed')
  before = _snapshot()
  assert _main('src', '-j', '1') == 0
  out, err = capsys.readouterr()
  assert _snapshot() == before
  assert out.startswith('--- a/src/a.py\n+++ b/src/a.py\n')
  assert 'src/todo.py:2:5: L2N001 todo: nn.initializers.nope' in err
  shutil.copytree('src', 'patched')
  subprocess.run([*apply], input=out.replace('a/src/', 'a/patched/').replace('b/src/', 'b/patched/').encode(), check=True)
  assert _main('src', '--write', '-j', '1') == 0
  assert _snapshot('patched') == {k.replace('src', 'patched', 1): v for k, v in _snapshot().items()}
  assert pathlib.Path('src/crlf.py').read_bytes() == MIGRATED.replace('\n', '\r\n').encode()


def test_check_exit_codes(tree, capsys):
  before = _snapshot()
  assert _main('src', '--check', '-j', '1') == 1
  out, err = capsys.readouterr()
  assert out == '' and 'would change: src/a.py' in err and _snapshot() == before
  assert _main('src/other.py', '--check') == 0
  assert _main('src', '--write', '-j', '1') == 0
  assert _main('src', '--check', '-j', '1') == 0  # idempotent: nothing left to change


def test_a_failed_file_exits_2_and_the_others_are_written(tree, capsys):
  pathlib.Path('src/bad.py').write_bytes(b'import flax\ndef (:\n')
  assert _main('src', '--write', '-j', '1', '--report-json', 'report.json') == 2
  err = capsys.readouterr().err
  assert 'src/bad.py: error: does not parse, left untouched' in err
  assert pathlib.Path('src/bad.py').read_bytes() == b'import flax\ndef (:\n'
  assert pathlib.Path('src/a.py').read_text() == MIGRATED
  report = json.loads(pathlib.Path('report.json').read_text())
  assert report['version'] == 1 and report['written'] is True
  assert report['summary'] == {'changed': 4, 'unchanged': 0, 'skipped': 1, 'failed': 1}
  files = {f['path']: f for f in report['files']}
  assert files['src/bad.py']['status'] == 'failed' and files['src/bad.py']['error'].startswith('does not parse')
  assert files['src/a.py']['entries'] == [{
      'line': 3, 'column': 5, 'code': 'L2N001', 'kind': 'change',
      'message': 'nn.initializers.zeros -> nnx.initializers.zeros', 'cell': None,
  }]
  assert files['src/todo.py']['status'] == 'changed'  # its TODO comment
  assert '# TODO(linen2nnx): nn.initializers.nope' in pathlib.Path('src/todo.py').read_text()


@pytest.mark.parametrize('argv, message', [
    (['src', '--select', 'L2N999'], 'unknown rule code(s) L2N999; known codes: L2N001'),
    (['missing_dir'], 'no such file or directory: missing_dir'),
    (['src', '-j', '0'], '-j must be at least 1, got 0'),
])
def test_usage_errors_exit_2(tree, capsys, argv, message):
  assert _main(*argv) == 2
  assert f'linen2nnx migrate: {message}' in capsys.readouterr().err


def test_select_and_globs(tree, capsys):
  assert _main('src', '--check', '--select', 'L2N', '--exclude', '*.py') == 0
  assert _main('src', '--check', '--select', 'l2n001', '--include', 'a.py') == 1
  assert 'would change: src/a.py' in capsys.readouterr().err


def test_parallel_run_in_a_subprocess_prints_the_same_as_a_serial_one(tree):
  run = lambda jobs: subprocess.run(
      [sys.executable, '-c', RUNNER, 'src', '-j', jobs], capture_output=True, text=True, check=True
  )
  one, two = run('1'), run('2')
  assert one.stdout == two.stdout and one.stderr == two.stderr
  assert '\r' not in one.stderr.replace('\r\n', '')  # no progress bar when stderr is not a terminal


def test_an_interrupted_write_leaves_every_file_old_or_new(tmp_path):
  names = [tmp_path / f'm{i}.py' for i in range(8)]
  for path in names:
    path.write_text(LINEN)
  env = {**os.environ, SLEEP_ENV: '0.25'}
  process = subprocess.Popen(
      [sys.executable, '-c', RUNNER, str(tmp_path), '--write', '-j', '1'],
      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
  )
  deadline = time.monotonic() + 30
  while time.monotonic() < deadline and all(p.read_text() == LINEN for p in names):
    time.sleep(0.02)
  process.send_signal(signal.SIGKILL)
  process.wait()
  contents = [p.read_text() for p in names]
  assert set(contents) <= {LINEN, MIGRATED}
  assert MIGRATED in contents and LINEN in contents  # killed mid-run
  assert _main(str(tmp_path), '--write', '-j', '1') == 0
  assert all(p.read_text() == MIGRATED for p in names)


def test_the_json_report_records_each_converted_class_the_same_with_any_jobs(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  fixtures = pathlib.Path(__file__).resolve().parents[3] / 'fixtures' / 'L2N002'
  pathlib.Path('src').mkdir()
  for case in ('setup_mlp', 'guide_basic_module'):
    shutil.copy(fixtures / f'{case}.in.py', f'src/{case}.py')
  classes = {}
  for jobs in ('1', '2'):
    assert _main('src', '-j', jobs, '--select', 'L2N002', '--report-json', f'report{jobs}.json') == 0
    report = json.loads(pathlib.Path(f'report{jobs}.json').read_text())
    classes[jobs] = {f['path']: f['classes'] for f in report['files']}
  assert classes['1'] == classes['2']
  mlp, = classes['1']['src/setup_mlp.py']
  NOT_A_SIZE = {'child': None, 'child_argument': None, 'input': None}
  assert mlp == {
      'line': 5, 'linen_name': 'MLP', 'nnx_name': 'MLP', 'cell': None,
      'arguments': [
          {'name': 'hidden', 'origin': 'field', 'detail': 'hidden: int', **NOT_A_SIZE},
          {'name': 'out', 'origin': 'field', 'detail': 'out: int = 3', **NOT_A_SIZE},
          {'name': 'dense1_in_features', 'origin': 'input_dimension', 'child': 'dense1',
           'detail': "in_features of self.dense1, the input dimension of self.dense1's call argument x",
           'child_argument': 'in_features', 'input': 'x'},
          {'name': 'rngs', 'origin': 'rngs', 'detail': 'nnx.Rngs', **NOT_A_SIZE},
      ],
      'children': [{'linen_name': name, 'nnx_attribute': name, 'linen_class': f'flax.linen.{cls}'}
                   for name, cls in (('dense1', 'Dense'), ('dense2', 'Dense'), ('norm', 'LayerNorm'))],
      'call_arguments': ['x'], 'mode_arguments': [], 'cache_input': None,
      'input_sizes': {'code': 2, 'examples': 0, 'arguments': 1},  # dense2 and norm follow dense1
  }
  block, model = classes['1']['src/guide_basic_module.py']
  assert [(c['linen_name'], c['nnx_attribute']) for c in block['children']] == [('Dense_0', 'linear'), ('Dropout_0', 'dropout')]
  assert [(a['name'], a['origin'], a['child']) for a in model['arguments']] == [
      ('dmid', 'field', None), ('dout', 'field', None), ('block_linear_in_features', 'input_dimension', 'block'),
      ('rngs', 'rngs', None),
  ]
  assert [(c['linen_name'], c['nnx_attribute']) for c in model['children']] == [('Block_0', 'block'), ('Dense_0', 'linear')]
