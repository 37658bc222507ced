"""`linen2nnx convert` on the bundled MLP: both directions, and refusals that write nothing."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from codemods import cli
from nnx_bridge import checkpoint

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / 'fixtures' / 'examples'
MODELS = [f'--linen={EXAMPLES}/mlp_linen.py:MLP', f'--nnx={EXAMPLES}/mlp_nnx.py:MLP', '--input', 'x=float32[3,8]']


@pytest.fixture(scope='module')
def example_classes():
  sys.path.insert(0, str(EXAMPLES))
  import mlp_linen
  import mlp_nnx

  return mlp_linen.MLP, mlp_nnx.MLP


@pytest.fixture()
def linen_checkpoint(tmp_path, example_classes):
  linen_class, _ = example_classes
  variables = linen_class().init(jax.random.key(7), np.ones((3, 8), np.float32))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / 'linen', variables)
  return tmp_path / 'linen', variables


def test_converts_both_ways(tmp_path, linen_checkpoint, example_classes, capsys):
  src, variables = linen_checkpoint
  linen_class, nnx_class = example_classes
  assert cli.main(['convert', str(src), str(tmp_path / 'nnx'), *MODELS]) == 0
  # Restored as the flax guide does, into the state of a model built with its own Rngs.
  model = nnx_class(8, rngs=nnx.Rngs(0))
  with ocp.StandardCheckpointer() as checkpointer:
    state = checkpointer.restore(tmp_path / 'nnx', nnx.state(model, nnx.Not(nnx.RngState)))
  nnx.update(model, state)
  x = jax.random.normal(jax.random.key(1), (3, 8))
  np.testing.assert_array_equal(model(x), linen_class().apply(variables, x))

  assert cli.main(['convert', str(tmp_path / 'nnx'), str(tmp_path / 'back'), '--to', 'linen', *MODELS]) == 0
  with ocp.StandardCheckpointer() as checkpointer:
    back = checkpointer.restore(tmp_path / 'back')
  jax.tree.map(np.testing.assert_array_equal, back, jax.device_get(variables))
  assert 'wrote' in capsys.readouterr().out
  # No device is recorded, so both restore on any backend and topology (docs/checkpoints.md; the restores on
  # other topologies: tests/nnx_bridge/test_checkpoint.py::test_a_converted_checkpoint_restores_on_another_topology).
  assert (src / '_sharding').exists()  # what StandardCheckpointer records
  assert not (tmp_path / 'nnx' / '_sharding').exists() and not (tmp_path / 'back' / '_sharding').exists()


def test_existing_destination_is_a_usage_error(tmp_path, linen_checkpoint, capsys):
  src, _ = linen_checkpoint
  (tmp_path / 'taken').mkdir()
  assert cli.main(['convert', str(src), str(tmp_path / 'taken'), *MODELS]) == 2
  assert 'exists' in capsys.readouterr().err


def test_checkpoint_of_another_model_writes_nothing(tmp_path, linen_checkpoint, capsys):
  src, _ = linen_checkpoint
  argv = ['convert', str(src), str(tmp_path / 'nnx'), *MODELS, '--linen-kwargs', '{"hidden": 32}']
  assert cli.main(argv) == 1
  assert 'nothing written' in capsys.readouterr().err
  assert not (tmp_path / 'nnx').exists()


def test_relative_paths_from_the_working_directory(tmp_path, linen_checkpoint, example_classes, monkeypatch):
  _, variables = linen_checkpoint
  linen_class, nnx_class = example_classes
  monkeypatch.chdir(tmp_path)
  assert cli.main(['convert', 'linen', 'nnx', *MODELS]) == 0
  model = nnx_class(8, rngs=nnx.Rngs(0))
  with ocp.StandardCheckpointer() as checkpointer:
    nnx.update(model, checkpointer.restore(tmp_path / 'nnx', nnx.state(model, nnx.Not(nnx.RngState))))
  x = jax.random.normal(jax.random.key(1), (3, 8))
  np.testing.assert_array_equal(model(x), linen_class().apply(variables, x))


def _one_line_error(argv, capsys) -> str:
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and 'Traceback' not in err, err
  return err


def test_a_folder_that_is_not_a_checkpoint_is_a_usage_error(tmp_path, capsys):
  (tmp_path / 'logs').mkdir()
  (tmp_path / 'logs' / 'events.txt').write_text('step 1')
  err = _one_line_error(['convert', str(tmp_path / 'logs'), str(tmp_path / 'nnx'), *MODELS], capsys)
  assert f'{tmp_path / "logs"} is not an orbax checkpoint (no _METADATA file)' in err
  assert not (tmp_path / 'nnx').exists()


@pytest.mark.parametrize('src, dst, extra, message', [
    ('missing', 'nnx', [], 'SRC {root}/missing: no such folder; give the folder an orbax checkpointer saved'),
    ('linen', 'linen/nnx', MODELS,
     'DST {root}/linen/nnx is inside SRC {root}/linen; convert into a new path outside SRC'),
    ('linen', 'linen', MODELS, 'DST {root}/linen is SRC; convert into a new path'),
    ('linen/inner', 'linen', MODELS,
     'SRC {root}/linen/inner is inside DST {root}/linen; convert into a new path outside SRC'),
    ('linen', 'nnx', [*MODELS, '--write-mapping', '{root}/no/m.json'],
     '--write-mapping {root}/no/m.json: the folder {root}/no does not exist; create it first (mkdir -p {root}/no) or '
     'give a path in another folder'),
    ('linen', 'nnx', [], 'name the NNX class: --nnx path/to/file.py:Class'),
], ids=['missing_src_before_models', 'dst_in_src', 'dst_is_src', 'src_in_dst', 'mapping_folder', 'no_nnx'])
def test_paths_are_checked_first_in_one_line_and_nothing_is_written(tmp_path, capsys, src, dst, extra, message):
  (tmp_path / 'linen' / 'inner').mkdir(parents=True)
  argv = [str(tmp_path / src), str(tmp_path / dst), *(arg.format(root=tmp_path) for arg in extra)]
  err = _one_line_error(['convert', *argv], capsys)
  assert err == f'linen2nnx convert: {message.format(root=tmp_path)}\n'
  assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob('*')) == ['linen', 'linen/inner']


def test_inputs_the_linen_model_does_not_take_are_a_usage_error(tmp_path, linen_checkpoint, capsys):
  src, _ = linen_checkpoint
  argv = ['convert', str(src), str(tmp_path / 'nnx'), *MODELS[:2], '--input', 'y=float32[3,8]']
  err = _one_line_error(argv, capsys)
  assert "the Linen model MLP fails on the inputs y=float32[3,8]: TypeError: " in err
  assert 'give --input the names, ranks and sizes MLP.__call__(x) takes' in err


_CLI = 'import sys; from codemods.cli import main; sys.exit(main(sys.argv[1:]))'


def test_a_damaged_checkpoint_is_one_line_on_stderr_and_exit_2(tmp_path, linen_checkpoint):
  """In a process of its own: orbax's abandoned reads are reported after the error, as the process ends."""
  src, _ = linen_checkpoint
  (node,) = (src / 'd').iterdir()  # the b-tree node every leaf's metadata is read through
  with open(node, 'r+b') as stream:
    stream.truncate(100)
  result = subprocess.run([sys.executable, '-c', _CLI, 'convert', str(src), str(tmp_path / 'nnx'), *MODELS],
                          capture_output=True, text=True, check=False)
  lines = result.stderr.splitlines()
  assert result.returncode == 2 and len(lines) == 1, result.stderr
  assert lines[0].startswith(f'linen2nnx convert: {src} cannot be read as an orbax checkpoint (OUT_OF_RANGE: ')
  assert lines[0].endswith('the checkpoint is damaged (truncated or overwritten): save it or copy it again')
  assert sorted(os.listdir(tmp_path)) == ['linen']


def _leftover(tmp_path, owner: dict | None) -> pathlib.Path:
  """A staging folder as a killed `convert SRC nnx` leaves it, with its owner record (None: none)."""
  staging = tmp_path / '.nnx.k1ll3d.converting'
  (staging / 'nnx').mkdir(parents=True)
  (staging / 'nnx' / 'part').write_bytes(b'\0' * 2_000_000)
  if owner is not None:
    record = {'dst': str(tmp_path / 'nnx'), 'host': socket.gethostname(), 'pid': os.getpid(), **owner}
    (staging / 'linen2nnx-owner.json').write_text(json.dumps(record))
  return staging


def test_a_killed_conversions_staging_folder_is_removed_by_the_next_run(tmp_path, linen_checkpoint, capsys):
  src, _ = linen_checkpoint
  staging = _leftover(tmp_path, {'started': 'not this process'})  # its pid now belongs to another process
  assert cli.main(['convert', str(src), str(tmp_path / 'nnx'), *MODELS]) == 0
  assert f'removed {staging}, left by a conversion that was killed' in capsys.readouterr().err
  assert sorted(os.listdir(tmp_path)) == ['linen', 'nnx']


def test_a_staging_folder_without_an_owner_is_named_and_kept(tmp_path, linen_checkpoint, capsys):
  src, _ = linen_checkpoint
  staging = _leftover(tmp_path, None)
  assert cli.main(['convert', str(src), str(tmp_path / 'nnx'), *MODELS]) == 0
  err = capsys.readouterr().err
  assert f'note: {staging} (2 MB) was left by an earlier conversion into {tmp_path / "nnx"}' in err
  assert staging.is_dir() and (tmp_path / 'nnx').is_dir()


def test_a_staging_folder_of_a_running_conversion_is_a_usage_error(tmp_path, linen_checkpoint, capsys):
  src, _ = linen_checkpoint
  staging = _leftover(tmp_path, {'started': checkpoint._process_start(os.getpid())})  # this very process
  err = _one_line_error(['convert', str(src), str(tmp_path / 'nnx'), *MODELS], capsys)
  assert f'{staging} is being written by process {os.getpid()}' in err and 'still running' in err
  assert staging.is_dir() and not (tmp_path / 'nnx').exists()


# --- --train-state: a whole TrainState checkpoint --------------------------------------------------

CNN_MODELS = [f'--linen={EXAMPLES}/cnn_linen.py:CNN', f'--nnx={EXAMPLES}/cnn_nnx.py:CNN',
              '--nnx-kwargs', '{"image_size": 8}', '--input', 'x=float32[2,8,8,1]']


@pytest.fixture(scope='module')
def train_state_checkpoint(tmp_path_factory):
  """The CNN's TrainState (batch_stats field, adam) after one update, saved whole, and its --optimizer file; made
  once for the tests below, which read it and write into their own folders."""
  tmp_path = tmp_path_factory.mktemp('train_state')
  import typing as tp

  import optax
  from flax.training import train_state

  sys.path.insert(0, str(EXAMPLES))
  import cnn_linen

  class TrainState(train_state.TrainState):
    batch_stats: tp.Any

  (tmp_path / 'optim.py').write_text('import optax\n\n\ndef make_optimizer():\n  return optax.adam(1e-3)\n')
  variables = cnn_linen.CNN().init(jax.random.key(0), np.ones((2, 8, 8, 1), np.float32), train=False)
  state = TrainState.create(apply_fn=cnn_linen.CNN().apply, params=variables['params'],
                            batch_stats=variables['batch_stats'], tx=optax.adam(1e-3))
  state = jax.jit(lambda s: s.apply_gradients(grads=jax.tree.map(jnp.ones_like, s.params)))(state)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / 'linen', state)
  return tmp_path / 'linen', state, f'--optimizer={tmp_path}/optim.py:make_optimizer'


def test_a_train_state_checkpoint_converts_both_ways(tmp_path, train_state_checkpoint, capsys):
  import optax

  src, state, optimizer_ref = train_state_checkpoint
  argv = ['convert', str(src), str(tmp_path / 'nnx'), *CNN_MODELS, '--train-state', optimizer_ref]
  assert cli.main(argv) == 0
  assert 'leaves: the model, the optimizer state and the step' in capsys.readouterr().out
  sys.path.insert(0, str(EXAMPLES))
  import cnn_nnx

  model = cnn_nnx.CNN(image_size=8, rngs=nnx.Rngs(3))
  optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
  with ocp.StandardCheckpointer() as checkpointer:
    nnx.update((model, optimizer), checkpointer.restore(
        tmp_path / 'nnx', nnx.state((model, optimizer), nnx.Not(nnx.RngState))))
  assert int(optimizer.step.get_value()) == 1
  adam = optimizer.opt_state[0]
  np.testing.assert_array_equal(adam.mu['linear1']['kernel'].get_value(), state.opt_state[0].mu['Dense_0']['kernel'])
  np.testing.assert_array_equal(model.bn.var.get_value(), state.batch_stats['BatchNorm_0']['var'])

  back = ['convert', str(tmp_path / 'nnx'), str(tmp_path / 'back'), '--to', 'linen', *CNN_MODELS,
          '--train-state', optimizer_ref]
  assert cli.main(back) == 0
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(tmp_path / 'back', state)
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(got, want)


def test_a_train_state_checkpoint_of_another_optimizer_writes_nothing(tmp_path, train_state_checkpoint, capsys):
  src, _, _ = train_state_checkpoint
  (tmp_path / 'sgd.py').write_text('import optax\n\nTX = optax.sgd(0.1, momentum=0.9)\n')
  argv = ['convert', str(src), str(tmp_path / 'nnx'), *CNN_MODELS, '--train-state', f'--optimizer={tmp_path}/sgd.py:TX']
  assert cli.main(argv) == 1
  err = capsys.readouterr().err
  assert 'nothing written' in err and '1/opt_state/0/trace/conv1/kernel/value' in err
  assert not (tmp_path / 'nnx').exists()


def test_a_train_state_checkpoint_without_its_optimizer_state_writes_nothing(tmp_path, train_state_checkpoint, capsys):
  _, state, optimizer_ref = train_state_checkpoint
  with ocp.StandardCheckpointer() as checkpointer:  # a partial save: the model and the step only
    checkpointer.save(tmp_path / 'partial', {'step': state.step, 'params': state.params, 'batch_stats': state.batch_stats})
  argv = ['convert', str(tmp_path / 'partial'), str(tmp_path / 'nnx'), *CNN_MODELS, '--train-state', optimizer_ref]
  assert cli.main(argv) == 1
  err = capsys.readouterr().err
  assert 'nothing written' in err
  assert '1/opt_state/0/mu/conv1/kernel/value: in the NNX model and optimizer, nothing in the mapping makes it' in err
  assert not (tmp_path / 'nnx').exists()


@pytest.mark.parametrize('extra, expected', [
    (['--linen-collection', 'params'], '--train-state and --linen-collection describe different checkpoints'),
    (['--to', 'linen'], '--train-state --to linen needs --optimizer path/to/file.py:NAME'),
    (['--optimizer', 'optax:adam'], 'optax:adam: calling it with no arguments failed'),
    (['--optimizer', 'optax:__version__'], 'optax:__version__ is a str, not an optax GradientTransformation'),
])
def test_train_state_usage_errors(tmp_path, train_state_checkpoint, capsys, extra, expected):
  src, _, _ = train_state_checkpoint
  err = _one_line_error(['convert', str(src), str(tmp_path / 'nnx'), *CNN_MODELS, '--train-state', *extra], capsys)
  assert expected in err


def _load_train_module(folder: pathlib.Path, name: str) -> dict:
  """`folder/train.py`'s globals, with `import models` finding `folder/models.py`."""
  import runpy

  sys.path.insert(0, str(folder))
  sys.modules.pop('models', None)
  try:
    return runpy.run_path(str(folder / 'train.py'), run_name=name)
  finally:
    sys.path.remove(str(folder))
    sys.modules.pop('models', None)


@pytest.mark.slow
def test_a_checkpoint_of_the_linen_project_resumes_in_the_migrated_project(tmp_path, capsys):
  """fixtures/training/cnn_project: trained 4 steps in Linen and saved, converted from the command line, then trained
  3 more steps by the migrated train.py's own train_step: the same next losses as the Linen program's."""
  import shutil

  project = EXAMPLES.parent / 'training' / 'cnn_project'
  linen = _load_train_module(project, '_l2n_linen_cnn_project')
  images, labels = linen['make_batch'](jax.random.key(1234), 64)
  state = linen['create_train_state'](jax.random.key(0), 0.05, 0.9)
  for _ in range(4):
    state, _, _ = linen['train_step'](state, images, labels)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / 'linen_ckpt', state)
  linen_losses = []
  for _ in range(3):
    state, loss, _ = linen['train_step'](state, images, labels)
    linen_losses.append(float(loss))

  folder = tmp_path / 'project'
  shutil.copytree(project, folder)
  report = tmp_path / 'migrate.json'  # its record of CNN gives the NNX constructor's sizes
  assert cli.main(['migrate', '--write', '--report-json', str(report), str(folder)]) == 0
  (tmp_path / 'optim.py').write_text('import optax\n\nTX = optax.sgd(0.05, 0.9)\n')
  argv = ['convert', str(tmp_path / 'linen_ckpt'), str(tmp_path / 'nnx_ckpt'), '--train-state',
          f'--optimizer={tmp_path}/optim.py:TX', f'--linen={project}/models.py:CNN', f'--nnx={folder}/models.py:CNN',
          '--migrate-report', str(report), '--linen-kwargs', '{"num_classes": 4}', '--input', 'x=float32[2,8,8,1]']
  assert cli.main(argv) == 0, capsys.readouterr().err

  ported = _load_train_module(folder, '_l2n_nnx_cnn_project')
  model, optimizer = ported['create_train_state'](jax.random.key(1), 0.05, 0.9)  # another init: all is restored
  with ocp.StandardCheckpointer() as checkpointer:
    nnx.update((model, optimizer), checkpointer.restore(
        tmp_path / 'nnx_ckpt', nnx.state((model, optimizer), nnx.Not(nnx.RngState))))
  model.train()  # as the migrated train() resumes its loop
  graphdef, pure = nnx.split((model, optimizer))
  pure = nnx.to_pure_dict(pure)
  losses = []
  for _ in range(3):
    (loss, _), pure = ported['train_step'](graphdef, pure, images, labels)
    losses.append(float(loss))
  np.testing.assert_allclose(losses, linen_losses, rtol=1e-5)
