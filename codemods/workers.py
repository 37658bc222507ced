"""Worker processes for `migrate -j N`: isolated from the migrated tree, bounded per task, replaced when one dies.

Each worker is a fresh interpreter started in safe-path mode (`python -P`): neither the working directory nor
the migrated tree is on its `sys.path`, so a `json.py`, `multiprocessing.py` or `sitecustomize.py` at the root of
the tree is never imported, let alone run (multiprocessing's spawn workers put the working directory first on
`sys.path`, and import the parent's `__main__`). The parent's `sys.path`, less `''` and the working directory,
is what the worker imports from; when `codemods` itself lives in the working directory (a source checkout), that
directory comes last, after the standard library and site-packages.

A task runs under `Limits`: a worker past its time is killed, one out of address space fails the task with a
MemoryError (or crashes), and a crashed worker is reported for its task and replaced by a fresh one, so the
other tasks go on. Workers ignore SIGINT (the parent handles it) and die with the parent on Linux
(PR_SET_PDEATHSIG); the parent kills them on SIGTERM and on any exit from `run_tasks`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
import typing as tp
from multiprocessing.connection import Connection
from multiprocessing.connection import wait

import codemods

TIMEOUT_ENV = 'LINEN2NNX_FILE_TIMEOUT'
MEMORY_ENV = 'LINEN2NNX_FILE_MEMORY_MB'

# Runs in the worker before anything but the standard library is imported: takes the import path from the
# parent, then serves tasks.
_BOOTSTRAP = (
    'import sys\n'
    'from multiprocessing.connection import Connection\n'
    'tasks = Connection(0, writable=False)\n'
    'sys.path[:] = tasks.recv()\n'
    'from codemods.workers import serve\n'
    'serve(tasks)\n'
)

T = tp.TypeVar('T')


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one task may take: `seconds` of wall time and `memory_mb` of address space (RLIMIT_AS)."""

  seconds: float = 300.0
  memory_mb: int = 4096

  def time_exceeded(self) -> str:
    """The reason a task past `seconds` failed."""
    return f'took longer than {self.seconds:g} s, the per-file limit (set {TIMEOUT_ENV} to change it)'

  @classmethod
  def from_environment(cls) -> Limits:
    """The defaults, or LINEN2NNX_FILE_TIMEOUT (seconds) and LINEN2NNX_FILE_MEMORY_MB where set."""
    default = cls()
    return cls(float(os.environ.get(TIMEOUT_ENV, default.seconds)), int(os.environ.get(MEMORY_ENV, default.memory_mb)))


@dataclasses.dataclass(frozen=True)
class TaskFailure:
  """A task the worker did not finish: `reason` is one line, e.g. 'worker crashed (signal SIGSEGV)'."""

  reason: str


class TimeLimitExceeded(BaseException):
  """Raised by `time_limit`; a BaseException, so that the code it interrupts does not report it as its own error."""


@contextlib.contextmanager
def time_limit(seconds: float) -> tp.Iterator[None]:
  """Raises TimeLimitExceeded in the block after `seconds`, for `jobs=1` runs in this process.

  Through SIGALRM, so only in the main thread of a POSIX process (elsewhere the block runs unbounded), and only
  between Python instructions: a long call into libcst's native parser ends before it is interrupted.
  """
  if not hasattr(signal, 'setitimer') or threading.current_thread() is not threading.main_thread():
    yield
    return

  def expire(signum: int, frame: tp.Any) -> None:
    raise TimeLimitExceeded

  previous = signal.signal(signal.SIGALRM, expire)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


@dataclasses.dataclass
class _Worker:
  process: subprocess.Popen
  tasks: Connection
  results: Connection
  item: tp.Any = None
  deadline: float = 0.0


def worker_path(path: tp.Sequence[str] = (), cwd: str | None = None) -> list[str]:
  """The import path of a worker: `path` (default `sys.path`) without `''`, `.` or `cwd`; `codemods` stays findable."""
  cwd = os.path.realpath(cwd or os.getcwd())
  local = lambda entry: entry in ('', '.') or os.path.realpath(entry) == cwd
  kept = [entry for entry in path or sys.path if not local(entry)]
  root = os.path.dirname(os.path.dirname(os.path.abspath(codemods.__file__)))
  return kept if root in kept else [*kept, root]


def run_tasks(function: tp.Callable[..., T], arguments: tuple[tp.Any, ...], items: tp.Iterable[tp.Any], jobs: int,
              limits: Limits) -> tp.Iterator[tuple[tp.Any, T | TaskFailure]]:
  """Yields `(item, function(item, *arguments))` for each item, in completion order, from `jobs` workers.

  `function` and `arguments` are pickled once per worker; a task that crashes its worker, raises, or runs past
  `limits` yields a `TaskFailure` instead. Closing the iterator (or SIGTERM) kills the workers.
  """
  pending = collections.deque(items)
  idle: list[_Worker] = []
  busy: list[_Worker] = []
  restore = _terminate_on_sigterm()
  try:
    while pending or busy:
      while pending and len(busy) < jobs:
        worker = idle.pop() if idle else _start(function, arguments, limits)
        _assign(worker, pending.popleft(), limits)
        busy.append(worker)
      timeout = max(0.0, min(worker.deadline for worker in busy) - time.monotonic())
      ready = wait([worker.results for worker in busy], timeout)
      for worker in list(busy):
        if worker.results in ready:
          item, result = worker.item, _receive(worker)
        elif time.monotonic() >= worker.deadline:
          item, result = worker.item, TaskFailure(limits.time_exceeded())
          _kill(worker)
        else:
          continue
        busy.remove(worker)
        if worker.process.poll() is None:
          idle.append(worker)
        else:
          _kill(worker)
        yield item, result
  finally:
    for worker in idle + busy:
      _kill(worker)
    restore()


def serve(tasks: Connection) -> None:
  """The worker's loop: receives `(function, arguments)`, then items, and sends back each result."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  results = Connection(os.dup(1), readable=False)
  os.dup2(2, 1)  # whatever the code prints goes to stderr, never into the results
  function, arguments, limits, parent = tasks.recv()
  _die_with_parent(parent)
  _limit_memory(limits.memory_mb)
  while True:
    try:
      item = tasks.recv()
    except EOFError:
      return
    try:
      results.send((True, function(item, *arguments)))
    except MemoryError:
      reason = f'ran out of memory: over {limits.memory_mb} MB, the per-file limit (set {MEMORY_ENV} to change it)'
      results.send((False, reason))
    except Exception as error:  # a bug of `function`: fail this task only
      results.send((False, f'{type(error).__name__}: {error}'))


def _start(function: tp.Callable[..., tp.Any], arguments: tuple[tp.Any, ...], limits: Limits) -> _Worker:
  process = subprocess.Popen([sys.executable, '-P', '-c', _BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
  worker = _Worker(process, Connection(os.dup(process.stdin.fileno()), readable=False),
                   Connection(os.dup(process.stdout.fileno()), writable=False))
  process.stdin.close()
  process.stdout.close()
  try:
    worker.tasks.send(worker_path())
    worker.tasks.send((function, arguments, limits, os.getpid()))
  except OSError:  # died at once: its first task reports it
    pass
  return worker


def _assign(worker: _Worker, item: tp.Any, limits: Limits) -> None:
  worker.item, worker.deadline = item, time.monotonic() + limits.seconds
  try:
    worker.tasks.send(item)
  except OSError:  # died: `_receive` reports it
    pass


def _receive(worker: _Worker) -> tp.Any:
  try:
    ok, value = worker.results.recv()
  except (EOFError, OSError):
    return TaskFailure(_death(worker.process.wait()))
  except Exception as error:  # a result that does not unpickle here
    _kill(worker)
    return TaskFailure(f'worker result unreadable: {type(error).__name__}: {error}')
  return value if ok else TaskFailure(value)


def _death(code: int) -> str:
  if code < 0:
    name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
    return f'the worker process crashed (signal {-code}, {name}); the file may be too large or too deeply nested'
  return f'the worker process exited with status {code}'


def _kill(worker: _Worker) -> None:
  if worker.process.poll() is None:
    worker.process.kill()
  worker.process.wait()
  worker.tasks.close()
  worker.results.close()


def _terminate_on_sigterm() -> tp.Callable[[], None]:
  """Turns SIGTERM into SystemExit while workers run, so that `finally` kills them; returns the undo."""
  if threading.current_thread() is not threading.main_thread():
    return lambda: None

  def exit_on_signal(signum: int, frame: tp.Any) -> None:
    raise SystemExit(128 + signum)

  previous = signal.signal(signal.SIGTERM, exit_on_signal)
  return lambda: signal.signal(signal.SIGTERM, previous)


def _die_with_parent(parent: int) -> None:
  """Linux: the kernel kills this worker when the parent dies, even by SIGKILL; elsewhere EOF on the pipe ends it."""
  if not sys.platform.startswith('linux'):
    return
  import ctypes

  ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  if os.getppid() != parent:  # the parent died before the call
    sys.exit(1)


def _limit_memory(megabytes: int) -> None:
  """RLIMIT_AS for this worker, within the hard limit; nothing where there is no such limit (not POSIX)."""
  try:
    import resource
  except ImportError:
    return
  _, hard = resource.getrlimit(resource.RLIMIT_AS)
  memory = megabytes << 20
  if hard != resource.RLIM_INFINITY:
    memory = min(memory, hard)
  resource.setrlimit(resource.RLIMIT_AS, (memory, hard))
