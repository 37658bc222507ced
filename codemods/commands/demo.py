"""`linen2nnx demo`: migrate the bundled Linen project in a temporary folder and check every model's parity.

The project (`fixtures/demo_project`) is copied twice, the Linen original kept and the other copy
migrated with its example traces; each example function then builds the Linen model, the NNX
class of the same name from the migrated copy is built from the migrate report, and the two are
compared as `linen2nnx verify` compares them. One table row per model.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import os
import pathlib
import shutil
import sys
import tempfile
import typing as tp

from codemods.report import FIELD
from codemods.report import RNGS
from nnx_bridge.precision import PRECISIONS

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
TODO = 'todo'  # the kind of a report entry left for a human
BUNDLED_PROJECT = pathlib.Path(__file__).resolve().parents[2] / 'fixtures' / 'demo_project'
EXAMPLES_FILE = 'examples.py'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
  parser = subparsers.add_parser(
      'demo',
      help='migrate the bundled Linen project and check every model against its original',
      description=(
          'Copy the bundled Linen project (a config-driven Transformer LM with a decode cache, a ResNet '
          'built from ModuleDefs, a ViT with scanned remat blocks and a MAP head, an encoder-decoder '
          'with shared embeddings, a VAE, a seq2seq LSTM) to a temporary folder, migrate it with its '
          'example traces, then check each model as `linen2nnx verify` does: forward outputs and every '
          'parameter gradient on transferred parameters, at one matmul precision (--precision). Prints the '
          'backend and the precision, then one table; exit 0 when every model converted without a TODO and '
          'matches, 1 otherwise, 2 on usage errors. Walkthrough: docs/real-world.md.'
      ),
  )
  parser.add_argument('--project', metavar='DIR', default=str(BUNDLED_PROJECT),
                      help=f'a project laid out like the bundled one, with an {EXAMPLES_FILE} (default: the bundled one)')
  parser.add_argument('--keep', metavar='DIR', help='work in DIR (created; must not exist) and keep it, to read the migrated code')
  parser.add_argument('--no-examples', action='store_true',
                      help='migrate without the example traces, to see what the code alone determines')
  parser.add_argument('--atol', type=float, default=1e-5, help='absolute tolerance (default 1e-5)')
  parser.add_argument('--precision', choices=PRECISIONS, default=PRECISIONS[0],
                      help='the matmul precision both sides run at, as for linen2nnx verify (default highest)')
  parser.add_argument('--json', action='store_true', help='print the rows as JSON')
  parser.set_defaults(run=run)


@dataclasses.dataclass(frozen=True)
class ModelRow:
  """One model of the project: how its migration went and how close the port is."""

  model: str
  linen_class: str
  classes_converted: int
  todos: int
  size_arguments: int  # constructor arguments the model still needs beyond its Linen fields: input sizes
  params: int
  max_forward_diff: float
  max_grad_diff: float
  ok: bool
  error: str = ''

  @property
  def verdict(self) -> str:
    return 'PASS' if self.ok and not self.todos and not self.error else 'FAIL'


def run(args: argparse.Namespace) -> int:
  project = pathlib.Path(args.project).resolve()
  if not project.is_dir() and project == BUNDLED_PROJECT:
    print(f'linen2nnx demo: the bundled project ships with the source tree ({project} is missing): install '
          'linen2nnx from a checkout (pip install -e .) or pass --project DIR', file=sys.stderr)
    return EXIT_USAGE
  if not (project / EXAMPLES_FILE).is_file():
    print(f'linen2nnx demo: {project} has no {EXAMPLES_FILE}', file=sys.stderr)
    return EXIT_USAGE
  if args.keep:
    work = pathlib.Path(args.keep).resolve()
    try:
      work.mkdir(parents=True)
    except FileExistsError:
      print(f'linen2nnx demo: --keep {work}: already exists (give a new folder)', file=sys.stderr)
      return EXIT_USAGE
    except OSError as error:  # a parent that is a file, or a folder this user cannot write to
      print(f'linen2nnx demo: --keep {work}: cannot be created ({error.strerror or error}); give a new folder in a '
            'folder you can write to', file=sys.stderr)
      return EXIT_USAGE
    return _demo(project, work, args)
  with tempfile.TemporaryDirectory(prefix='linen2nnx-demo-') as folder:
    print(f'linen2nnx demo: working in {folder}, deleted at the end (--keep DIR keeps the migrated code)',
          file=sys.stderr)
    return _demo(project, pathlib.Path(folder), args)


def _demo(project: pathlib.Path, work: pathlib.Path, args: argparse.Namespace) -> int:
  from nnx_bridge import precision as precision_lib

  linen_dir, nnx_dir = work / 'linen', work / 'nnx'
  for target in (linen_dir, nnx_dir):
    shutil.copytree(project, target, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
  print(f'linen2nnx demo: migrating {project.name}'
        f'{"" if args.no_examples else f" with the traces of {EXAMPLES_FILE}"} ...', file=sys.stderr)
  result = migrate_project(nnx_dir, examples=not args.no_examples)
  report_path = work / 'migrate-report.json'
  report_path.write_text(result.to_json(), encoding='utf-8')
  sizes = result.input_sizes()
  print(f'linen2nnx demo: migrated {len(result.changed)} files of {project.name} in {work / "nnx"}'
        f'{"" if args.no_examples else f" with {EXAMPLES_FILE}"}: {_sizes_line(sizes)}', file=sys.stderr)
  rows = check_models(linen_dir, nnx_dir, report_path, result, atol=args.atol, precision=args.precision,
                      progress=True)
  if args.json:
    print(json.dumps({'backend': precision_lib.backend(), 'precision': args.precision, 'input_sizes': sizes,
                      'models': [dataclasses.asdict(r) | {'verdict': r.verdict} for r in rows]}, indent=2))
  else:
    print(precision_lib.describe(precision_lib.backend(), args.precision))
    print(format_table(rows))
  failed = [f.path for f in result.failed]
  for path in failed:
    print(f'linen2nnx demo: {path} failed to migrate', file=sys.stderr)
  return EXIT_OK if rows and all(r.verdict == 'PASS' for r in rows) and not failed else EXIT_FAILED


def migrate_project(folder: pathlib.Path, *, examples: bool) -> tp.Any:
  """Migrates every file of `folder` but its examples file, in place, with the examples' traces if asked."""
  from codemods import engine
  from codemods import examples as example_traces
  from codemods import rules as registry
  from codemods.options import MigrationOptions

  with _importable(folder):
    sizes = example_traces.trace_examples(str(folder / EXAMPLES_FILE)) if examples else None
  options = MigrationOptions() if sizes is None else MigrationOptions(example_sizes=sizes)
  return engine.migrate([folder], rules=registry.ALL_RULES, write=True, jobs=1, exclude=[EXAMPLES_FILE],
                        options=options)


def check_models(linen_dir: pathlib.Path, nnx_dir: pathlib.Path, report_path: pathlib.Path, result: tp.Any,
                 *, atol: float, precision: str = PRECISIONS[0], progress: bool = False) -> list[ModelRow]:
  """One row per example of the Linen copy, its NNX port taken from the migrated copy, compared at `precision`;
  with `progress`, a line on stderr as each model is checked (each compiles both models: seconds apiece)."""
  from codemods import examples as example_traces

  todos = {os.path.realpath(f.path): sum(e.kind == TODO for e in f.entries) for f in result.files}
  rows = []
  with _importable(linen_dir), _migrated_imports():
    examples = example_traces.load_examples(str(linen_dir / EXAMPLES_FILE))
    for index, (name, linen, inputs, kwargs) in enumerate(examples, 1):
      if progress:
        print(f'linen2nnx demo: checking {name} ({index} of {len(examples)}) ...', file=sys.stderr)
      try:
        rows.append(_check_model(name, linen, inputs, kwargs, linen_dir, nnx_dir, report_path, todos, atol,
                                 precision))
      except Exception as error:  # one model's failure is a FAIL row; the others are still checked
        left = todos.get(_migrated_file(type(linen), linen_dir, nnx_dir), 0)
        rows.append(ModelRow(name, type(linen).__name__, 0, left, 0, 0, float('nan'), float('nan'), False,
                             f'{type(error).__name__}: {error}'))
  return rows


def build_port(linen: tp.Any, inputs: tuple, kwargs: dict, linen_dir: pathlib.Path, nnx_dir: pathlib.Path,
               report_path: pathlib.Path) -> tuple[tp.Any, tp.Any]:
  """The migrated class of a Linen example model, built as `linen2nnx verify --migrate-report` builds it:
  (NNX model, the report's record of it). Call it where `check_models` does, with both copies importable."""
  from codemods.ports import migrate_report
  from codemods.ports import model_refs

  nnx_class = model_refs.load_object(f'{_migrated_file(type(linen), linen_dir, nnx_dir)}:{type(linen).__name__}')
  port = migrate_report.load_port(str(report_path), nnx_class, linen, inputs, kwargs)
  explicit = _migrated_fields(linen, linen_dir, nnx_dir)
  constructor, _ = model_refs.nnx_constructor_kwargs(nnx_class, linen, (*inputs, *kwargs.values()), explicit, 0,
                                                     measured=port.measured_sizes())
  return nnx_class(**constructor), port


def _check_model(name: str, linen: tp.Any, inputs: tuple, kwargs: dict, linen_dir: pathlib.Path,
                 nnx_dir: pathlib.Path, report_path: pathlib.Path, todos: dict[str, int], atol: float,
                 precision: str) -> ModelRow:
  import jax
  from flax import nnx

  from codemods.commands import verify
  from codemods.ports import model_refs

  linen_class = type(linen)
  model, port = build_port(linen, inputs, kwargs, linen_dir, nnx_dir, report_path)
  example = model_refs.Example(linen, inputs, kwargs)
  report, _ = verify.check_port(example, model, port, init_seed=0, atol=atol, rtol=atol, precision=precision)
  classes = {type(m) for _, m in nnx.iter_modules(model) if type(m).__module__.startswith(model_refs.USER_MODULE_PREFIX)}
  files = {os.path.realpath(sys.modules[c.__module__].__file__) for c in classes}
  files.add(_migrated_file(linen_class, linen_dir, nnx_dir))
  params = sum(v.size for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
  diffs = lambda check: max((d.max_abs for d in report.differences if d.check == check), default=0.0)
  sizes = [a for a in port.record.arguments if a.origin not in (FIELD, RNGS)]
  return ModelRow(name, linen_class.__name__, len(classes), sum(todos.get(f, 0) for f in files), len(sizes), params,
                  diffs('output'), diffs('gradient'), report.ok)


def format_table(rows: tp.Sequence[ModelRow]) -> str:
  header = ('model', 'classes converted', 'TODOs', 'size args', 'params', 'max forward diff', 'max grad diff', 'result')
  body = [(r.model, str(r.classes_converted), str(r.todos), str(r.size_arguments), f'{r.params:,}',
           f'{r.max_forward_diff:.1e}', f'{r.max_grad_diff:.1e}', r.verdict) for r in rows]
  widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]
  lines = ['  '.join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in (header, *body)]
  lines.insert(1, '  '.join('-' * w for w in widths))
  lines.append("size args: the input sizes a model's own constructor takes (verify fills them from its example "
               'inputs); classes inside get theirs from the class that builds them')
  errors = [f'{r.model}: {r.error}' for r in rows if r.error]
  passed = sum(r.verdict == 'PASS' for r in rows)
  return '\n'.join([*lines, *errors, f'{passed} of {len(rows)} models PASS'])


def _sizes_line(sizes: dict[str, int]) -> str:
  total = sum(sizes.values())
  if not total:
    return 'no layer input sizes to derive'
  derived = sizes['code'] + sizes['examples']
  return (f'layer input sizes: {sizes["code"]} from the code, {sizes["examples"]} from example traces, '
          f'{sizes["arguments"]} from an argument of their class ({derived / total:.0%} derived)')


def _migrated_file(linen_class: type, linen_dir: pathlib.Path, nnx_dir: pathlib.Path) -> str:
  """The real path of the migrated copy of the file defining a Linen class of the project."""
  return os.path.realpath(nnx_dir / pathlib.Path(inspect.getsourcefile(linen_class)).resolve().relative_to(linen_dir.resolve()))


def _migrated_fields(linen: tp.Any, linen_dir: pathlib.Path, nnx_dir: pathlib.Path) -> dict[str, tp.Any]:
  """Fields holding a Linen class of the project (`block_cls=ResNetBlock`) get the migrated class instead."""
  from codemods.ports import model_refs

  package = type(linen).__module__.partition('.')[0]
  fields = {}
  for field in dataclasses.fields(linen):
    value = getattr(linen, field.name)
    if isinstance(value, type) and value.__module__.partition('.')[0] == package:
      fields[field.name] = model_refs.load_object(f'{_migrated_file(value, linen_dir, nnx_dir)}:{value.__name__}')
  return fields


class _importable:
  """`folder` first on sys.path meanwhile, and its packages forgotten before and after: the Linen and the
  migrated copy share package names."""

  def __init__(self, folder: pathlib.Path) -> None:
    self.folder = str(folder)
    self.packages = {p.name for p in folder.iterdir() if (p / '__init__.py').is_file()}

  def __enter__(self) -> None:
    _forget(lambda name: name.partition('.')[0] in self.packages)
    sys.path.insert(0, self.folder)

  def __exit__(self, *exc_info: tp.Any) -> None:
    sys.path.remove(self.folder)
    _forget(lambda name: name.partition('.')[0] in self.packages)


@contextlib.contextmanager
def _migrated_imports() -> tp.Iterator[None]:
  """The migrated files are imported by path (`model_refs.load_object`); forget them before and after, as
  they may have changed on disk in between."""
  from codemods.ports import model_refs

  _forget(lambda name: name.startswith(model_refs.USER_MODULE_PREFIX))
  try:
    yield
  finally:
    _forget(lambda name: name.startswith(model_refs.USER_MODULE_PREFIX))


def _forget(which: tp.Callable[[str], bool]) -> None:
  for name in [n for n in sys.modules if which(n)]:
    del sys.modules[name]
