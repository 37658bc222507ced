"""Parity and checkpoints on this machine's JAX backend, side by side with the CPU: markdown tables in $OUT.

    python benchmarks/device_parity.py            # from a source tree; $OUT defaults to a temporary folder
    python benchmarks/device_parity.py --sections demo          # one part only (demo, verify, checkpoints)

On an accelerator machine (a TPU, a GPU) it records, each check one row with what is expected and what happened:

- demo: the bundled project's models (`linen2nnx demo`), migrated once, checked at `highest` matmul precision and
  at the backend's `default` (with the tolerance calibrated in the same run: docs/verify.md, "Precision");
- verify: `linen2nnx verify` of a correct port (the bundled MLP) and a wrong one (the MLP with a transposed
  kernel) at both precisions: the correct one must pass and the wrong one fail, in both modes (the demo's ResNet
  and ViT cover convolutions and attention);
- checkpoints: a Linen checkpoint and its `linen2nnx convert` output written here and restored here with the flax
  guide's code (`nnx.eval_shape`, `StandardCheckpointer().restore(path, abstract_state)`, `nnx.merge`), without
  and with shardings; the same written on the CPU (a child process with JAX_PLATFORMS=cpu) and restored here
  (the guide's code, `restore_linen_checkpoint`, `convert` here), and written here and restored on the CPU. Every
  restored parameter must be bit-exact. A control row restores, the other side, what the guide's own save wrote:
  it records the device, so on a TPU it fails ("Topology mismatch detected"), which is what convert avoids.

On a CPU-only machine both sides are the CPU: a run of the script itself (4 to 5 minutes on 2 busy cores, most
of it compiling the demo's operations once per precision; `--sections` splits a run that must fit a time limit).
The package is imported from this tree, without installing it; the demo migrates code, so libcst must import
(`bash benchmarks/device_check.sh` installs what is missing into $TMPDIR/linen2nnx-device-site: add that folder
to PYTHONPATH). Nothing else is needed: jax, flax, optax and orbax are used as installed.

$OUT gets device_parity.md (the tables, with the date, versions and devices), device_parity.json (the same rows)
and device_parity.log (tracebacks, and what the commands and child processes printed). Exit 0 when every row is
as expected, 1 when not.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import io
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import typing as tp

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the package from this tree, installed or not

EXAMPLES = ROOT / 'fixtures' / 'examples'
MLP_LINEN, MLP_NNX = f'{EXAMPLES}/mlp_linen.py:MLP', f'{EXAMPLES}/mlp_nnx.py:MLP'
MLP_INPUT = 'x=float32[3,8]'
VERIFY_CASES = (  # name, LINEN, NNX, --input, expected
    ('MLP', MLP_LINEN, MLP_NNX, MLP_INPUT, 'PASS'),
    ('MLP, transposed kernel (wrong)', MLP_LINEN, f'{EXAMPLES}/mlp_nnx_wrong.py:TransposedKernel', MLP_INPUT, 'FAIL'),
)
PRECISIONS = ('highest', 'default')
OK, CONTROL = 'ok', 'control'  # expected outcomes of a restore: restored bit-exact, or only recorded
MAIN, CHILD = 'main process', 'child, JAX_PLATFORMS=cpu'  # where the checkpoints are written and restored
Row = dict[str, str]


def markdown_table(rows: tp.Sequence[Row]) -> str:
  """The rows as a markdown table, columns in the order of the first row's keys."""
  if not rows:
    return '(no rows)'
  columns = list(rows[0])
  lines = ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)]
  lines += ['| ' + ' | '.join(str(row.get(c, '')).replace('|', '/') for c in columns) + ' |' for row in rows]
  return '\n'.join(lines)


def unexpected(rows: tp.Sequence[Row]) -> list[Row]:
  """The rows whose result is not the expected one (a control row's result is only recorded)."""
  return [row for row in rows if row['expected'] != CONTROL and row['result'].split(':')[0] != row['expected']]


def demo_rows(log: tp.TextIO) -> list[Row]:
  """The bundled project migrated once, every model checked at both precisions."""
  from codemods.commands import demo

  rows = []
  with tempfile.TemporaryDirectory(prefix='device-parity-demo-') as folder:
    work = pathlib.Path(folder)
    for copy in ('linen', 'nnx'):
      shutil.copytree(demo.BUNDLED_PROJECT, work / copy, ignore=shutil.ignore_patterns('__pycache__'))
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
      result = demo.migrate_project(work / 'nnx', examples=True)
    (work / 'report.json').write_text(result.to_json())
    for precision in PRECISIONS:
      start = time.perf_counter()
      checked = demo.check_models(work / 'linen', work / 'nnx', work / 'report.json', result, atol=1e-5,
                                  precision=precision)
      seconds = f'{time.perf_counter() - start:.0f}'
      for row in checked:
        rows.append({'model': row.model, 'precision': precision, 'max forward diff': f'{row.max_forward_diff:.1e}',
                     'max grad diff': f'{row.max_grad_diff:.1e}', 'check s (all models)': seconds,
                     'expected': 'PASS', 'result': row.verdict + (f': {row.error}' if row.error else '')})
  return rows


def verify_rows(log: tp.TextIO) -> list[Row]:
  """`linen2nnx verify --json` of each case at each precision, in this process."""
  from codemods import cli

  rows = []
  for precision in PRECISIONS:
    for name, linen, port, inputs, expected in VERIFY_CASES:
      out = io.StringIO()
      start = time.perf_counter()
      with contextlib.redirect_stdout(out), contextlib.redirect_stderr(log):
        code = cli.main(['verify', linen, port, '--input', inputs, '--precision', precision, '--json'])
      report = json.loads(out.getvalue()) if out.getvalue().strip() else {'differences': []}
      largest = lambda key, check: max((d[key] for d in report['differences'] if d['check'] == check), default=0.0)
      rows.append({'port': name, 'precision': precision, 'max output diff': f'{largest("max_abs", "output"):.1e}',
                   'max grad diff': f'{largest("max_abs", "gradient"):.1e}',
                   'max output noise': f'{largest("noise", "output"):.1e}', 'exit': str(code),
                   'seconds': f'{time.perf_counter() - start:.1f}', 'expected': expected,
                   'result': {0: 'PASS', 1: 'FAIL'}.get(code, f'usage error (exit {code})')})
  return rows


# --- checkpoints: what one side writes and the other restores ------------------------------------------------


def _convert(src: pathlib.Path, dst: pathlib.Path, log: tp.TextIO, *extra: str) -> None:
  """`linen2nnx convert` of the MLP's Linen checkpoint, in this process; raises when it does not exit 0."""
  from codemods import cli

  with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    code = cli.main(['convert', str(src), str(dst), f'--linen={MLP_LINEN}', f'--nnx={MLP_NNX}', '--input', MLP_INPUT,
                     *extra])
  if code:
    raise RuntimeError(f'linen2nnx convert exited {code} (see device_parity.log)')


def _guide_restore(path: pathlib.Path, sharding: tp.Any = None) -> tp.Any:
  """The flax guide's restore of the MLP port, its abstract state given `sharding` on every leaf if any."""
  import jax
  import orbax.checkpoint as ocp
  from flax import nnx

  from codemods.ports import model_refs

  nnx_class = model_refs.load_object(MLP_NNX)
  graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: nnx_class(8, rngs=nnx.Rngs(0))))
  if sharding is not None:
    abstract_state = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
                                  abstract_state)
  with ocp.StandardCheckpointer() as checkpointer:
    return nnx.merge(graphdef, checkpointer.restore(path, abstract_state))


def write_checkpoints(folder: pathlib.Path, log: tp.TextIO, process: str) -> None:
  """The MLP's Linen checkpoint (`linen`), its conversion (`nnx`, and the mapping used), the variables as numpy
  (`want.npz`, to compare with), and the guide's own save of the converted model on this backend (`guide`)."""
  import jax
  import numpy as np
  import orbax.checkpoint as ocp
  from flax import nnx

  from codemods.ports import model_refs
  from nnx_bridge.checkpoint import flatten
  from nnx_bridge.treemap import path_str

  folder.mkdir(parents=True, exist_ok=True)
  variables = model_refs.load_object(MLP_LINEN)().init(jax.random.key(3), np.ones((3, 8), np.float32))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(folder / 'linen', variables)
  np.savez(folder / 'want.npz', **{path_str(key): np.asarray(leaf) for key, leaf in flatten(variables).items()})
  _convert(folder / 'linen', folder / 'nnx', log, '--write-mapping', str(folder / 'mapping.json'))
  model = _guide_restore(folder / 'nnx', jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(folder / 'guide', nnx.state(model))
  (folder / 'written_on.txt').write_text(f'{jax.default_backend()} ({process})')


def _bit_exact(model: tp.Any, folder: pathlib.Path) -> str:
  """'ok: ...' when every parameter of the restored model is the written Linen one, bit for bit, else 'FAIL: ...'."""
  import numpy as np

  from nnx_bridge import nnx_to_linen
  from nnx_bridge.checkpoint import flatten
  from nnx_bridge.treemap import TreeMapping
  from nnx_bridge.treemap import path_str

  got = {path_str(key): leaf for key, leaf in flatten(nnx_to_linen(model, TreeMapping.load(folder / 'mapping.json')))
         .items()}
  want = np.load(folder / 'want.npz')
  differ = [key for key in want.files if key not in got or not np.array_equal(np.asarray(got[key]), want[key])]
  kernel = model.linear1.kernel.get_value()
  where = 'numpy arrays' if isinstance(kernel, np.ndarray) else f'on {", ".join(map(str, kernel.devices()))}'
  return f'FAIL: {", ".join(differ)} differ' if differ else f'{OK}: bit-exact, {where}'


def restore_checkpoints(folder: pathlib.Path, log: tp.TextIO, process: str) -> list[Row]:
  """Every way to restore what `write_checkpoints` wrote in `folder`, in this process: one row each."""
  import jax
  from flax import nnx

  from codemods.ports import model_refs
  from nnx_bridge import restore_linen_checkpoint
  from nnx_bridge.treemap import TreeMapping

  written, here = (folder / 'written_on.txt').read_text(), jax.default_backend()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  converted_here = folder / f'nnx_converted_on_{here}_{os.getpid()}'

  def linen_into_abstract_state() -> tp.Any:
    nnx_class = model_refs.load_object(MLP_NNX)
    graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: nnx_class(8, rngs=nnx.Rngs(0))))
    mapping = TreeMapping.load(folder / 'mapping.json')
    return nnx.merge(graphdef, restore_linen_checkpoint(abstract_state, folder / 'linen', mapping))

  def convert_here() -> tp.Any:
    _convert(folder / 'linen', converted_here, log)
    return _guide_restore(converted_here)

  ways = (
      ('convert output', "the guide's restore", OK, lambda: _guide_restore(folder / 'nnx')),
      ('convert output', "the guide's restore, shardings on device 0", OK, lambda: _guide_restore(folder / 'nnx', device)),
      ('Linen checkpoint', 'restore_linen_checkpoint into nnx.eval_shape state', OK, linen_into_abstract_state),
      ('Linen checkpoint', "linen2nnx convert here, then the guide's restore", OK, convert_here),
      ("the guide's own save", "the guide's restore", CONTROL, lambda: _guide_restore(folder / 'guide')),
  )
  rows = []
  for checkpoint, how, expected, restore in ways:
    try:
      result = _bit_exact(restore(), folder)
    except Exception as error:  # any failure is the row's result; the traceback goes to the log
      traceback.print_exc(file=log)
      result = f'FAIL: {type(error).__name__}: {(str(error).splitlines() or [""])[0][:160]}'
    rows.append({'written on': written, 'restored on': f'{here} ({process})', 'checkpoint': checkpoint,
                 'restored with': how,
                 'expected': expected, 'result': result})
  return rows


def _on_cpu(mode: str, folder: pathlib.Path, log: tp.TextIO) -> list[Row]:
  """This script's `--child MODE FOLDER` in a CPU-only process: the rows it prints."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
  child = subprocess.run([sys.executable, __file__, '--child', mode, str(folder)], env=env, capture_output=True,
                         text=True, timeout=300)
  log.write(f'--- cpu child {mode} {folder}: exit {child.returncode}\n{child.stderr}\n')
  if child.returncode:
    raise RuntimeError(f'the CPU child ({mode}) exited {child.returncode}: {child.stderr.strip().splitlines()[-1:]}')
  return json.loads(child.stdout) if mode == 'restore' else []


def checkpoint_rows(work: pathlib.Path, log: tp.TextIO) -> list[Row]:
  """Written here and restored here and on the CPU; written on the CPU and restored here."""
  here, on_cpu = work / 'written_here', work / 'written_on_cpu'
  write_checkpoints(here, log, MAIN)
  rows = restore_checkpoints(here, log, MAIN) + _on_cpu('restore', here, log)
  _on_cpu('write', on_cpu, log)
  return rows + restore_checkpoints(on_cpu, log, MAIN)


# --- the run -------------------------------------------------------------------------------------------------


def environment() -> list[Row]:
  import jax

  rows = [{'what': 'date (UTC)', 'value': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M')},
          {'what': 'host / python', 'value': f'{platform.node()} / {platform.python_version()}'},
          {'what': 'backend', 'value': jax.default_backend()},
          {'what': 'devices', 'value': ', '.join(map(str, jax.devices()))},
          {'what': 'JAX_DEFAULT_MATMUL_PRECISION', 'value': os.environ.get('JAX_DEFAULT_MATMUL_PRECISION', '(unset)')}]
  for name in ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'libcst', 'numpy'):
    try:
      rows.append({'what': name, 'value': importlib.metadata.version(name)})
    except importlib.metadata.PackageNotFoundError:
      rows.append({'what': name, 'value': 'not installed'})
  return rows


SECTIONS = ('demo', 'verify', 'checkpoints')


def run(out: pathlib.Path, names: tp.Sequence[str] = SECTIONS) -> int:
  """The sections `names`, each one guarded (a section that raises is one FAIL row); the files into `out`."""
  sections: dict[str, list[Row]] = {'environment': environment()}
  seconds: dict[str, float] = {}
  with open(out / 'device_parity.log', 'w') as log, tempfile.TemporaryDirectory(prefix='device-parity-') as work:
    make = {'demo': demo_rows, 'verify': verify_rows, 'checkpoints': lambda log: checkpoint_rows(pathlib.Path(work), log)}
    for name in names:
      start = time.perf_counter()
      try:
        sections[name] = make[name](log)
      except Exception as error:  # the other sections still run
        traceback.print_exc(file=log)
        sections[name] = [{'expected': 'rows', 'result': f'FAIL: {type(error).__name__}: {error}'}]
      seconds[name] = time.perf_counter() - start
      print(f'device_parity: {name} in {seconds[name]:.0f} s', file=sys.stderr)
  bad = [row for name, rows in sections.items() if name != 'environment' for row in unexpected(rows)]
  backend = next(row['value'] for row in sections['environment'] if row['what'] == 'backend')
  text = [f'# Parity on {backend}, side by side with the CPU', '']
  for name, rows in sections.items():
    took = f' ({seconds[name]:.0f} s)' if name in seconds else ''
    text += [f'## {name}{took}', '', markdown_table(rows), '']
  text.append(f'{len(bad)} rows not as expected' if bad else 'every row as expected')
  (out / 'device_parity.md').write_text('\n'.join(text) + '\n')
  (out / 'device_parity.json').write_text(json.dumps(sections, indent=2))
  print('\n'.join(text))
  return 1 if bad else 0


def main(argv: tp.Sequence[str]) -> int:
  if argv[:1] == ['--child']:  # a CPU process of `_on_cpu`: rows (restore) as JSON on stdout, the rest on stderr
    mode, folder = argv[1], pathlib.Path(argv[2])
    if mode == 'write':
      write_checkpoints(folder, sys.stderr, CHILD)
    else:
      print(json.dumps(restore_checkpoints(folder, sys.stderr, CHILD)))
    return 0
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sections', default=','.join(SECTIONS), help=f'comma-separated, of {", ".join(SECTIONS)}')
  names = parser.parse_args(argv).sections.split(',')
  if not set(names) <= set(SECTIONS):
    parser.error(f'--sections: {", ".join(sorted(set(names) - set(SECTIONS)))} is none of {", ".join(SECTIONS)}')
  out = pathlib.Path(os.environ.get('OUT') or tempfile.mkdtemp(prefix='device-parity-out-'))
  out.mkdir(parents=True, exist_ok=True)
  code = run(out, names)
  print(f'results in {out}', file=sys.stderr)
  return code


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
