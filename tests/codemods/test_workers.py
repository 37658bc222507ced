"""`codemods.workers`: migrate's worker processes never import from the migrated tree, a task that crashes,
hangs or runs out of memory fails alone, and the workers end with the parent."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from codemods import rules as registry
from codemods import workers
from codemods.engine import SLEEP_ENV
from codemods.engine import migrate

LINEN = 'import flax.linen as nn\n\nW = nn.initializers.zeros\n'
MIGRATED = 'from flax import nnx\n\nW = nnx.initializers.zeros\n'
# Modules a Python process, multiprocessing's spawn workers or migrate import; at the root of a tree they
# would shadow the real ones for any process that puts the working directory on sys.path.
SHADOWS = ('multiprocessing', 'subprocess', 'weakref', 'json', 'pickle', 'selectors', 'sitecustomize',
           'libcst', 'tqdm', 'codemods', 'flax')
SCRIPT = pathlib.Path(sys.executable).with_name('linen2nnx')


def _hostile_tree(root: pathlib.Path) -> pathlib.Path:
  """A tree whose root modules each write `markers/<name>` when imported, next to two Linen files."""
  markers = root / 'markers'
  markers.mkdir()
  for name in SHADOWS:
    (root / f'{name}.py').write_text(f'open({str(markers / name)!r}, "w").close()\n')
  for name in ('a.py', 'b.py'):
    (root / name).write_text(LINEN)
  return markers


def test_a_process_that_puts_the_tree_on_its_path_runs_the_shadowing_modules(tmp_path):
  """The check of the test below can fail: `python -c` from the tree imports its json.py."""
  markers = _hostile_tree(tmp_path)
  subprocess.run([sys.executable, '-c', 'import json'], cwd=tmp_path, check=True)
  assert (markers / 'json').exists()


@pytest.mark.skipif(not SCRIPT.exists(), reason='the linen2nnx console script is not installed next to python')
@pytest.mark.parametrize('jobs', ['1', '2'])
def test_migrate_never_imports_modules_of_the_tree_it_runs_in(tmp_path, jobs):
  markers = _hostile_tree(tmp_path)
  run = subprocess.run([str(SCRIPT), 'migrate', '.', '--check', '-j', jobs], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60, check=False)
  assert run.returncode == 1, run.stderr  # would change a.py and b.py
  assert 'would change: a.py' in run.stderr and 'would change: b.py' in run.stderr
  assert sorted(os.listdir(markers)) == []


def test_the_worker_path_leaves_out_the_working_directory_and_keeps_codemods_findable(tmp_path):
  root = str(pathlib.Path(workers.__file__).resolve().parents[1])
  path = workers.worker_path(['', '.', str(tmp_path), '/usr/lib/python3.11', root], cwd=str(tmp_path))
  assert path == ['/usr/lib/python3.11', root]
  assert workers.worker_path([str(tmp_path), '/usr/lib/python3.11'], cwd=str(tmp_path)) == ['/usr/lib/python3.11', root]


def test_a_task_that_crashes_hangs_or_exhausts_memory_fails_alone_and_its_worker_is_replaced():
  items = ['1 + 1', '__import__("os").abort()', '2 + 2', '__import__("time").sleep(60)', '3 + 3',
           'bytearray(1 << 31)', '1 / 0', '4 + 4']
  limits = workers.Limits(seconds=5, memory_mb=1024)
  results = dict(workers.run_tasks(eval, (), items, 2, limits))
  assert {item: results[item] for item in ('1 + 1', '2 + 2', '3 + 3', '4 + 4')} == {
      '1 + 1': 2, '2 + 2': 4, '3 + 3': 6, '4 + 4': 8}
  assert results['__import__("os").abort()'] == workers.TaskFailure(
      'the worker process crashed (signal 6, SIGABRT); the file may be too large or too deeply nested')
  assert results['__import__("time").sleep(60)'] == workers.TaskFailure(
      f'took longer than 5 s, the per-file limit (set {workers.TIMEOUT_ENV} to change it)')
  assert results['bytearray(1 << 31)'] == workers.TaskFailure(
      f'ran out of memory: over 1024 MB, the per-file limit (set {workers.MEMORY_ENV} to change it)')
  assert results['1 / 0'] == workers.TaskFailure('ZeroDivisionError: division by zero')


def test_limits_come_from_the_environment(monkeypatch):
  assert workers.Limits.from_environment() == workers.Limits(300.0, 4096)
  monkeypatch.setenv(workers.TIMEOUT_ENV, '2.5')
  monkeypatch.setenv(workers.MEMORY_ENV, '512')
  assert workers.Limits.from_environment() == workers.Limits(2.5, 512)


@pytest.mark.parametrize('jobs', [1, 2])
def test_a_file_past_the_time_limit_fails_and_the_run_goes_on(tmp_path, monkeypatch, jobs):
  for name in ('a.py', 'b.py', 'c.py'):
    (tmp_path / name).write_text(LINEN)
  monkeypatch.setenv(SLEEP_ENV, '30')  # workers inherit it: every file sleeps past the limit, after its write
  result = migrate([tmp_path], rules=registry.select_rules(['L2N001']), write=True, jobs=jobs,
                   limits=workers.Limits(seconds=1))
  assert [o.status for o in result.files] == ['failed'] * 3
  assert {o.error for o in result.files} == {
      f'took longer than 1 s, the per-file limit (set {workers.TIMEOUT_ENV} to change it)'}


def _children(pid: int) -> set[int]:
  children = set()
  for entry in pathlib.Path('/proc').iterdir():
    if entry.name.isdigit():
      try:
        fields = (entry / 'stat').read_text().rsplit(')', 1)[1].split()
      except OSError:
        continue
      if int(fields[1]) == pid and fields[0] != 'Z':
        children.add(int(entry.name))
  return children


def _alive(pid: int) -> bool:
  try:
    state = pathlib.Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0]
  except OSError:
    return False
  return state != 'Z'


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='reads /proc')
@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=['TERM', 'INT', 'KILL'])
def test_killing_migrate_ends_its_workers(tmp_path, signum):
  for i in range(4):
    (tmp_path / f'm{i}.py').write_text(LINEN)
  process = subprocess.Popen(
      [sys.executable, '-m', 'codemods.cli', 'migrate', str(tmp_path), '--write', '-j', '2'],
      env={**os.environ, SLEEP_ENV: '60'}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
  )
  deadline = time.monotonic() + 30
  while len(_children(process.pid)) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
  children = _children(process.pid)
  assert len(children) == 2
  process.send_signal(signum)
  process.wait(timeout=30)
  deadline = time.monotonic() + 30
  while any(map(_alive, children)) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not any(map(_alive, children))
