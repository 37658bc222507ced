"""The jax.pmap fixture and its nnx.pmap port train identically on a simulated 8-device CPU mesh.

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
