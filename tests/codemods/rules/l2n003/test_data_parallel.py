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


@pytest.mark.slow
def test_a_two_file_pmap_project_migrates_and_trains_like_the_linen_pmap_on_8_devices(tmp_path):
  import shutil

  from codemods import rules as registry
  from codemods.engine import migrate

  folder = tmp_path / 'pmap_project'
  shutil.copytree(PROJECT, folder)
  result = migrate([folder], rules=registry.ALL_RULES, write=True, jobs=1)
  assert not [e.message for o in result.files for e in o.entries if e.kind == 'todo']
  source = (folder / 'train.py').read_text()
  assert "@nnx.pmap(axis_name='batch', in_axes=(None, None, 0, 0))" in source and 'import jax_utils' not in source
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu',
             PYTHONPATH=str(ROOT))
  done = subprocess.run([sys.executable, '-c', _PROJECT_SCRIPT, str(PROJECT), str(folder)], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.strip().endswith('ok')
