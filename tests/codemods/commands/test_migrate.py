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


@pytest.mark.parametrize('report, problem', [
    ('missing/r.json', 'the folder missing does not exist; create it first (mkdir -p missing) or give a path in '
                       'another folder'),
    ('src', 'is a folder; give the path of a file, in it or elsewhere'),
    ('src/a.py/r.json', 'src/a.py is a file, not a folder; give a path in a folder'),
], ids=['no_folder', 'a_folder', 'under_a_file'])
def test_a_report_path_that_cannot_be_written_is_refused_before_anything_is_written(tree, capsys, report, problem):
  before = _snapshot()
  assert _main('src', '--write', '-j', '1', '--report-json', report) == 2
  out, err = capsys.readouterr()
  assert (out, err) == ('', f'linen2nnx migrate: --report-json {report}: {problem}\n')
  assert _snapshot() == before and not pathlib.Path('missing').exists()


def test_a_report_that_cannot_be_written_after_the_run_is_one_line_and_exit_2(tree, capsys, monkeypatch):
  from codemods import files

  monkeypatch.setattr(files, 'check_output', lambda *args, **kwargs: None)  # as if its folder went away meanwhile
  assert _main('src', '--write', '-j', '1', '--report-json', 'gone/r.json') == 2
  last = capsys.readouterr().err.splitlines()[-1]
  assert last == ('linen2nnx migrate: --report-json gone/r.json: the report could not be written (No such file or '
                  'directory); give a path in a folder you can write to')
  assert pathlib.Path('src/a.py').read_text() == MIGRATED


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
  NO_FORMULA = {'shape_formulas': [], 'example_input': None, 'per_element': False, 'element_offset': 0}
  NOT_A_SIZE = {'child': None, 'child_argument': None, 'input': None, **NO_FORMULA}
  assert mlp == {
      'line': 5, 'linen_name': 'MLP', 'nnx_name': 'MLP', 'cell': None,
      'arguments': [
          {'name': 'hidden', 'origin': 'field', 'detail': 'hidden: int', **NOT_A_SIZE},
          {'name': 'out', 'origin': 'field', 'detail': 'out: int = 3', **NOT_A_SIZE},
          {'name': 'dense1_in_features', 'origin': 'input_dimension', 'child': 'dense1',
           'detail': "in_features of self.dense1, the input dimension of self.dense1's call argument x",
           'child_argument': 'in_features', 'input': 'x', **NO_FORMULA},
          {'name': 'rngs', 'origin': 'rngs', 'detail': 'nnx.Rngs', **NOT_A_SIZE},
      ],
      'children': [{'linen_name': name, 'nnx_attribute': name, 'linen_class': f'flax.linen.{cls}'}
                   for name, cls in (('dense1', 'Dense'), ('dense2', 'Dense'), ('norm', 'LayerNorm'))],
      'call_arguments': ['x'], 'mode_arguments': [], 'cache_input': None,
      'input_sizes': {'code': 2, 'examples': 0, 'arguments': 1},  # dense2 and norm follow dense1
      'mode_defaults': {},
  }
  block, model = classes['1']['src/guide_basic_module.py']
  assert [(c['linen_name'], c['nnx_attribute']) for c in block['children']] == [('Dense_0', 'linear'), ('Dropout_0', 'dropout')]
  assert [(a['name'], a['origin'], a['child']) for a in model['arguments']] == [
      ('dmid', 'field', None), ('dout', 'field', None), ('block_linear_in_features', 'input_dimension', 'block'),
      ('rngs', 'rngs', None),
  ]
  assert [(c['linen_name'], c['nnx_attribute']) for c in model['children']] == [('Block_0', 'block'), ('Dense_0', 'linear')]


# --- the whole run decides: seams between files, the summary, --fail-on-todo -------------------------------

LAYERS = '''import flax.linen as nn


class Block(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.Dense(self.features)(x))
'''
# A Linen tower in another file that cannot be converted (nn.with_logical_constraint) builds the block in a loop,
# where Linen numbers it at run time: no to_linen wrapper can take its name.
TOWER = '''import flax.linen as nn

from pkg.layers import Block


class Tower(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    for _ in range(1):
      x = Block(self.features)(x)
    return nn.with_logical_constraint(x, ('batch', 'embed'))
'''
# The same tower building the block once: it wraps the converted block with to_linen under Linen's name for it.
WRAPPING_TOWER = TOWER.replace('    for _ in range(1):\n      x = Block(self.features)(x)\n',
                               '    x = Block(self.features)(x)\n')
TRAIN = '''import jax.numpy as jnp

from pkg.layers import Block


def init_block(rng):
  block = Block(3)
  return block.init(rng, jnp.ones((1, 4)))
'''


def _package(tmp_path, monkeypatch, **files: str) -> None:
  monkeypatch.chdir(tmp_path)
  pathlib.Path('pkg').mkdir()
  pathlib.Path('pkg/__init__.py').write_text('')
  for name, text in files.items():
    pathlib.Path(f'pkg/{name}.py').write_text(text)


def _run_tower(root: pathlib.Path) -> list:
  """Imports pkg.models from `root` in a fresh interpreter and applies the tower: what the original program ran."""
  code = ('import jax, jax.numpy as jnp\nfrom pkg.models import Tower\nm = Tower(3)\nx = jnp.ones((2, 4))\n'
          'print(m.apply(m.init(jax.random.key(0), x), x).tolist())\n')
  run = subprocess.run([sys.executable, '-c', code], cwd=root, capture_output=True, text=True)
  assert run.returncode == 0, run.stderr
  return json.loads(run.stdout)


def test_a_class_another_file_builds_from_linen_stays_linen_and_the_program_runs(tmp_path, monkeypatch, capsys):
  _package(tmp_path, monkeypatch, layers=LAYERS, models=TOWER)
  before = _run_tower(tmp_path)
  assert _main('pkg', '--write', '-j', '1') == 0
  err = capsys.readouterr().err
  assert ('pkg/layers.py:4:1: L2N002 todo: class Block kept as Linen: the class Tower of pkg/models.py, which stays '
          'Linen, builds it') in err
  assert 'class Block(nn.Module)' in pathlib.Path('pkg/layers.py').read_text()
  assert 'classes: 0 converted, 2 kept as Linen, 0 bridged with nnx_bridge; 2 TODOs left' in err
  assert '1 used by a class that stays Linen' in err
  assert _run_tower(tmp_path) == before
  assert _main('pkg', '--check', '-j', '2') == 0  # a second run changes nothing


def _run_tower_on(root: pathlib.Path, variables: pathlib.Path) -> list:
  """Like `_run_tower`, on the variables saved in `variables` (written there first if missing): the migrated
  program on the original program's parameters (a fresh init draws them from other key streams)."""
  code = ('import jax, jax.numpy as jnp, numpy as np, os\nfrom flax import traverse_util\nfrom pkg.models import Tower\n'
          f'm, x, path = Tower(3), jnp.ones((2, 4)), {str(variables)!r}\n'
          'if not os.path.exists(path):\n'
          '  np.savez(path, **{"/".join(k): v for k, v in traverse_util.flatten_dict(m.init(jax.random.key(0), x)).items()})\n'
          'v = traverse_util.unflatten_dict({tuple(k.split("/")): jnp.asarray(a) for k, a in np.load(path).items()})\n'
          'print(m.apply(v, x).tolist())\n')
  run = subprocess.run([sys.executable, '-c', code], cwd=root, capture_output=True, text=True)
  assert run.returncode == 0, run.stderr
  return json.loads(run.stdout)


def test_a_class_another_file_builds_once_from_linen_converts_wrapped_and_the_program_runs(tmp_path, monkeypatch,
                                                                                            capsys):
  _package(tmp_path, monkeypatch, layers=LAYERS, models=WRAPPING_TOWER)
  variables = tmp_path / 'variables.npz'
  before = _run_tower_on(tmp_path, variables)
  assert _main('pkg', '--write', '-j', '1') == 0
  assert 'class Block(nnx.Module)' in pathlib.Path('pkg/layers.py').read_text()
  assert "x = nnx_bridge.to_linen(Block, self.features, name='Block_0', input_sizes=" in \
      pathlib.Path('pkg/models.py').read_text()
  assert 'classes: 1 converted, 1 kept as Linen, 1 bridged with nnx_bridge; 1 TODOs left' in capsys.readouterr().err
  assert _run_tower_on(tmp_path, variables) == before
  assert _main('pkg', '--check', '-j', '2') == 0  # a second run changes nothing


# transformers' layout: a model wrapper (no module) holds the module class, which its base builds and runs the Linen way.
WRAPPERS = '''import jax.numpy as jnp

from pkg.layers import Block


class PreTrainedBlock:
  module_class = None

  def __init__(self, features):
    self.module = self.module_class(features=features)

  def init_weights(self, rng):
    return self.module.init(rng, jnp.ones((1, 4)))


class BlockModel(PreTrainedBlock):
  module_class = Block
'''


def test_a_class_a_wrapper_in_another_file_holds_stays_linen_and_the_wrapper_runs(tmp_path, monkeypatch, capsys):
  _package(tmp_path, monkeypatch, layers=LAYERS, wrappers=WRAPPERS)
  code = ('import jax\nfrom pkg.wrappers import BlockModel\n'
          'print(jax.tree.map(lambda a: a.shape, BlockModel(3).init_weights(jax.random.key(0))))')
  before = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True, text=True)
  assert before.returncode == 0, before.stderr
  assert _main('pkg', '--write', '-j', '1') == 0
  err = capsys.readouterr().err
  assert ('pkg/layers.py:4:1: L2N002 todo: class Block kept as Linen: the class BlockModel of pkg/wrappers.py, which is '
          'no module, holds it in a class attribute') in err
  assert '1 held in a class attribute for code that runs it as a Linen module' in err
  after = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True, text=True)
  assert after.returncode == 0 and after.stdout == before.stdout, after.stderr
  assert _main('pkg', '--check', '-j', '1') == 0  # a second run changes nothing


# flax's imagenet layout: models.py names a variant with partial, train.py builds it by that name (or looks it up).
VARIANT_MODELS = '''from functools import partial

import flax.linen as nn


class CNN(nn.Module):
  features: int
  num_classes: int = 10

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(self.features)(x))
    return nn.Dense(self.num_classes)(x)


SmallCNN = partial(CNN, features=8)
'''
VARIANT_TRAIN = '''import jax.numpy as jnp

from pkg import models


def create_model(rng):
  model = models.SmallCNN(num_classes=4)
  variables = model.init(rng, jnp.ones((1, 6)))
  return model, variables


def model_by_name(name):
  return getattr(models, name)(num_classes=4)
'''


def test_a_converted_class_built_through_a_partial_or_by_name_in_another_file_gets_todos_at_its_lines(tmp_path, monkeypatch,
                                                                                          capsys):
  _package(tmp_path, monkeypatch, models=VARIANT_MODELS, train=VARIANT_TRAIN)
  assert _main('pkg', '--write', '-j', '1') == 0
  err = capsys.readouterr().err
  assert ('pkg/train.py:7:3: L2N000 todo: SmallCNN (CNN) is now an NNX module and needs linear1_in_features, rngs '
          'here') in err
  assert 'pkg/train.py:8:3: L2N000 todo: .init() of a Linen module, on CNN, now an NNX module' in err
  lines = pathlib.Path('pkg/train.py').read_text().splitlines()
  assert lines[6].startswith('  # TODO(linen2nnx): SmallCNN (CNN) is now an NNX module')
  assert lines[7] == '  model = models.SmallCNN(num_classes=4)'
  assert 'pkg/train.py:13:3: L2N000 todo: getattr(models, ...) looks up a class of pkg/models.py by name, and CNN' in err
  assert _main('pkg', '--check', '-j', '1') == 0  # a second run changes nothing


def test_plain_code_using_a_converted_class_gets_a_todo_at_its_line(tmp_path, monkeypatch, capsys):
  _package(tmp_path, monkeypatch, layers=LAYERS, train=TRAIN)
  assert _main('pkg', '--write', '-j', '2', '--report-json', 'report.json') == 0
  err = capsys.readouterr().err
  assert 'pkg/train.py:7:3: L2N000 todo: Block is now an NNX module and needs linear_in_features, rngs here' in err
  assert 'pkg/train.py:8:3: L2N000 todo: .init() of a Linen module, on Block, now an NNX module' in err
  lines = pathlib.Path('pkg/train.py').read_text().splitlines()
  assert lines[6].startswith('  # TODO(linen2nnx): Block is now an NNX module') and lines[7] == '  block = Block(3)'
  fates = json.loads(pathlib.Path('report.json').read_text())['fates']
  assert fates == {'converted': 1, 'kept_linen': 0, 'kept_because': {}, 'bridged': 0, 'todos': 2, 'unsafe_fixes': 0}
  assert _main('pkg', '--check', '-j', '1') == 0  # the TODOs are not added again
  assert _main('pkg', '--check', '--fail-on-todo') == 1  # TODOs left: CI fails


# Call sites of a class another file converts, under each import style; the file never says flax.
TRAIN_IMPORTS = '''import jax
import jax.numpy as jnp

from . import layers
from .layers import Block as Layer
import pkg.layers as L


def through_the_module(rng, x):
  block = layers.Block(3)
  variables = block.init(rng, x)
  return block.apply(variables, x)


def through_an_alias(rng, x):
  block = Layer(3)
  variables = block.init(rng, x)
  return block.apply(variables, x)


def through_a_dotted_alias(rng, x):
  block = L.Block(3)
  variables = block.init(rng, x)
  return block.apply(variables, x)
'''


def _run_train_imports(root: pathlib.Path) -> list:
  code = ('import jax, jax.numpy as jnp\nfrom pkg import train\nx = jnp.ones((2, 4))\n'
          'print([list(f(jax.random.key(0), x).shape) for f in (train.through_the_module, train.through_an_alias, '
          'train.through_a_dotted_alias)])\n')
  run = subprocess.run([sys.executable, '-c', code], cwd=root, capture_output=True, text=True)
  assert run.returncode == 0, run.stderr
  return json.loads(run.stdout)


def test_call_sites_in_another_file_are_converted_under_every_import_style(tmp_path, monkeypatch, capsys):
  _package(tmp_path, monkeypatch, layers=LAYERS, train=TRAIN_IMPORTS)
  before = _run_train_imports(tmp_path)
  assert _main('pkg', '--write', '-j', '2') == 0
  err = capsys.readouterr().err
  assert 'TODO' not in pathlib.Path('pkg/train.py').read_text() and '0 TODOs left' in err, err
  lines = pathlib.Path('pkg/train.py').read_text().splitlines()
  assert '  block = layers.Block(3, linear_in_features=x.shape[-1], rngs=nnx.Rngs(rng))' in lines
  assert '  block = Layer(3, linear_in_features=x.shape[-1], rngs=nnx.Rngs(rng))' in lines
  assert '  block = L.Block(3, linear_in_features=x.shape[-1], rngs=nnx.Rngs(rng))' in lines
  assert lines.count('  return block(x)') == 3
  assert _run_train_imports(tmp_path) == before == [[2, 3]] * 3
  assert _main('pkg', '--check', '-j', '1') == 0  # a second run changes nothing


def test_fail_on_todo_from_the_project_settings(tmp_path, monkeypatch):
  _package(tmp_path, monkeypatch, layers=LAYERS)
  assert _main('pkg', '--check') == 1 and _main('pkg', '--write') == 0 and _main('pkg', '--check') == 0
  pathlib.Path('pkg/train.py').write_text(TRAIN)
  assert _main('pkg', '--write') == 0  # TODOs added, no failure without the setting
  pathlib.Path('pyproject.toml').write_text('[tool.linen2nnx]\nfail-on-todo = true\n')
  assert _main('pkg', '--check') == 1
  pathlib.Path('pyproject.toml').write_text('[tool.linen2nnx]\nfail-on-todo = "yes"\n')
  assert _main('pkg', '--check') == 2  # a wrong value is a usage error


# stdout as a pipe whose reader has gone (`linen2nnx migrate src | head -1`); this machine's pipes do not report
# it, so the closed pipe is simulated.
CLOSED_PIPE = (
    'import sys\n'
    'from codemods import cli\n'
    'class ClosedPipe:\n'
    '  def write(self, text):\n'
    '    raise BrokenPipeError(32, "Broken pipe")\n'
    '  def flush(self):\n'
    '    pass\n'
    '  def fileno(self):\n'
    '    return 1\n'
    'sys.stdout = ClosedPipe()\n'
    'sys.exit(cli.main(["migrate", sys.argv[1], "-j", "1"]))\n'
)


def test_a_closed_pipe_in_diff_mode_ends_quietly(tmp_path):
  (tmp_path / 'm.py').write_text(LINEN)
  run = subprocess.run([sys.executable, '-c', CLOSED_PIPE, str(tmp_path)], capture_output=True, text=True)
  assert 'Traceback' not in run.stderr and 'BrokenPipeError' not in run.stderr, run.stderr
  assert run.returncode == 141


def test_files_without_flax_are_skipped_without_importing_the_rules(tmp_path):
  """A pre-commit run over files that are no Flax code decides from their bytes: libcst is never imported, the
  report still lists them, and a bad --select is still a usage error. A run whose stderr is no terminal shows no
  progress bar and does not import tqdm."""
  (tmp_path / 'plain.py').write_text('def add(a, b):\n  return a + b\n')
  (tmp_path / 'tool.py').write_text('import os\n')
  probe = ('import json, sys\nfrom codemods.cli import main\ncode = main(sys.argv[1:])\n'
           'print(json.dumps([code, "libcst" in sys.modules, "pathspec" in sys.modules, "tqdm" in sys.modules]))\n')
  run = lambda *argv: subprocess.run([sys.executable, '-c', probe, 'migrate', *argv], cwd=tmp_path,
                                     capture_output=True, text=True)
  done = run('--check', '--report-json', 'r.json', 'plain.py', 'tool.py')
  assert json.loads(done.stdout) == [0, False, False, False], done.stderr
  assert '0 would change, 0 unchanged, 2 skipped (no flax), 0 failed' in done.stderr
  report = json.loads((tmp_path / 'r.json').read_text())
  assert [(f['path'], f['status']) for f in report['files']] == [('plain.py', 'skipped'), ('tool.py', 'skipped')]
  assert json.loads(run('--check', '--select', 'L2N999', 'plain.py').stdout)[0] == 2
  (tmp_path / 'model.py').write_text(LINEN)
  done = run('--check', 'plain.py', 'model.py')  # one file mentions flax: the whole run as before
  assert json.loads(done.stdout) == [1, True, False, False], done.stderr
