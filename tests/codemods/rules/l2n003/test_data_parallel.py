"""The jax.pmap fixture and its nnx.pmap port train identically on a simulated 8-device CPU mesh; so do the
two-file project `fixtures/training/pmap_project/` (a replicated TrainState subclass) and its migration.

Runs in a subprocess, so the 8 host devices do not leak into the other tests.
"""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[4]
CASE = ROOT / 'fixtures' / 'L2N003' / 'pmap_data_parallel'

_SCRIPT = f"""
import runpy
import jax
from tests.codemods.rules import training_parity as parity

assert jax.device_count() == 8
with parity.recording_linen('Net') as linen:
  linen_globals = runpy.run_path({str(CASE) + '.in.py'!r})
with parity.transferring_into('Net', linen) as ported:
  nnx_globals = runpy.run_path({{path!r}})
parity.assert_close(linen_globals['losses'], nnx_globals['losses'])
parity.assert_close(linen_globals['predictions'], nnx_globals['predictions'])
parity.assert_same_state(linen.final, ported)  # params and the cross-replica BatchNorm statistics
print('ok')
"""


def _run(port: pathlib.Path) -> subprocess.CompletedProcess:
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu',
             PYTHONPATH=str(ROOT))
  script = _SCRIPT.replace('{path!r}', repr(str(port)))
  return subprocess.run([sys.executable, '-c', script], env=env, cwd=ROOT, capture_output=True, text=True,
                        timeout=600)


@pytest.mark.slow
def test_pmap_port_trains_like_the_linen_pmap_on_8_devices():
  result = _run(pathlib.Path(str(CASE) + '.out.py'))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith('ok')


@pytest.mark.slow
def test_a_port_without_the_cross_replica_mean_is_caught(tmp_path):
  wrong = tmp_path / 'wrong.py'
  source = pathlib.Path(str(CASE) + '.out.py').read_text()
  wrong.write_text(source.replace("grads = jax.lax.pmean(grads, axis_name='batch')", 'grads = grads'))
  assert wrong.read_text() != source
  result = _run(wrong)
  assert result.returncode != 0 and 'AssertionError' in result.stderr


PROJECT = ROOT / 'fixtures' / 'training' / 'pmap_project'
_PROJECT_SCRIPT = """
import runpy, sys
import jax
from tests.codemods.rules import training_parity as parity


def run(folder):
  sys.path.insert(0, folder)
  sys.modules.pop('models', None)
  try:
    return runpy.run_path(folder + '/train.py', run_name='_l2n_' + folder.replace('/', '_'))['train']()
  finally:
    sys.path.remove(folder)
    sys.modules.pop('models', None)


assert jax.device_count() == 8
with parity.recording_linen('CNN') as linen:
  linen_losses, linen_logits = run(sys.argv[1])
with parity.transferring_into('CNN', linen) as ported:
  losses, logits = run(sys.argv[2])
parity.assert_close(linen_losses, losses)
parity.assert_close(linen_logits, logits)
parity.assert_same_state(linen.final, ported)  # params and the cross-replica batch statistics
assert linen_losses[-1] < 0.95 * linen_losses[0]
print('ok')
"""


# flax's and transformers' examples pmap their steps where they run them: `p_train_step = jax.pmap(...)`.
_WRAPPED = (
    ("@functools.partial(jax.pmap, axis_name='batch')\ndef train_step(state, images, labels):",
     'def train_step(state, images, labels, learning_rate_scale=1.0):'),
    ('@jax.pmap\ndef eval_step(state, images):', 'def eval_step(state, images):'),
    ('  state = jax_utils.replicate(state)\n',
     '  state = jax_utils.replicate(state)\n'
     "  p_train_step = jax.pmap(functools.partial(train_step, learning_rate_scale=1.0), 'batch', donate_argnums=(0,))\n"
     "  p_eval_step = jax.pmap(eval_step, axis_name='batch')\n"),
    ('    state, loss, accuracy = train_step(state, images, labels)',
     '    state, loss, accuracy = p_train_step(state, images, labels)'),
    ('  return losses, eval_step(state,', '  return losses, p_eval_step(state,'),
)
_EXPECTED = {
    'decorated': ["@nnx.pmap(axis_name='batch', in_axes=(None, None, 0, 0))"],
    'wrapped': ["  p_train_step = nnx.pmap(functools.partial(train_step, learning_rate_scale=1.0), axis_name='batch', "
                'in_axes=(None, None, 0, 0))',
                "  p_eval_step = nnx.pmap(eval_step, axis_name='batch', in_axes=(None, 0))"],
}


@pytest.mark.slow
@pytest.mark.parametrize('steps', ['decorated', 'wrapped'])
def test_a_two_file_pmap_project_migrates_and_trains_like_the_linen_pmap_on_8_devices(tmp_path, steps):
  import shutil

  from codemods import rules as registry
  from codemods.engine import migrate

  linen = tmp_path / 'linen'
  shutil.copytree(PROJECT, linen)
  if steps == 'wrapped':
    source = (linen / 'train.py').read_text()
    for old, new in _WRAPPED:
      assert old in source
      source = source.replace(old, new)
    (linen / 'train.py').write_text(source)
  folder = tmp_path / 'pmap_project'
  shutil.copytree(linen, folder)
  result = migrate([folder], rules=registry.ALL_RULES, write=True, jobs=1)
  assert not [e.message for o in result.files for e in o.entries if e.kind == 'todo']
  lines = (folder / 'train.py').read_text().splitlines()
  assert all(line in lines for line in _EXPECTED[steps]) and 'from flax import jax_utils' not in lines, lines
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu',
             PYTHONPATH=str(ROOT))
  done = subprocess.run([sys.executable, '-c', _PROJECT_SCRIPT, str(linen), str(folder)], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.strip().endswith('ok')
