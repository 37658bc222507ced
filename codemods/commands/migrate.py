"""`linen2nnx migrate PATH...`: rewrite Linen code into NNX code, as a diff, a check or in place."""

from __future__ import annotations

import argparse
import os
import sys

from codemods.example_sizes import ExampleSizes
from codemods.options import STEP_STYLES
from codemods.options import TRAIN_STATE_STYLES
from codemods.options import MigrationOptions
from codemods.report import SKIPPED
from codemods.report import FileOutcome
from codemods.report import MigrationResult

EXIT_OK, EXIT_WOULD_CHANGE, EXIT_FAILED = 0, 1, 2
_REASONS = 5  # the most frequent reasons for keeping classes Linen the summary names


def add_parser(subparsers: argparse._SubParsersAction) -> None:
  parser = subparsers.add_parser(
      'migrate',
      help='rewrite Flax Linen code into Flax NNX code (prints a diff unless --write)',
      description=(
          'Run the migration rules over the .py and .ipynb files under PATH... (directories are '
          'walked, .gitignore respected; files that never mention flax or linen are skipped). '
          'By default print a unified diff (a/ b/ prefixes: apply it with `git apply` or '
          '`patch -p1` from this directory) and write nothing; the report goes to stderr. '
          'Exit 0 when done, 1 with --check when a file would change or with --fail-on-todo when a '
          'TODO is left, 2 when a file could not be processed (the other files are still processed) or '
          'on usage errors, among them a PATH that holds no Python file at all (a file that is not .py, '
          '.ipynb or a Python script, a folder without .py or .ipynb files) and an output path that cannot be '
          'written (checked before anything is written); a .py file that never mentions flax is skipped (exit 0). '
          'Defaults come from [tool.linen2nnx] in the nearest pyproject.toml (include, exclude, select, jobs, '
          'train-state, step-style, fail-on-todo, unsafe-fixes); command-line globs add to them, the other options '
          'replace them.'
      ),
  )
  parser.add_argument('paths', nargs='+', metavar='PATH',
                      help='.py and .ipynb files, Python scripts (#! line naming python), and folders holding them')
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument('--write', action='store_true', help='rewrite the files in place (atomically)')
  mode.add_argument('--check', action='store_true', help='write nothing, print no diff; exit 1 if a file would change')
  parser.add_argument('-j', '--jobs', type=int, default=None, metavar='N', help='processes (default: all cores)')
  parser.add_argument('--include', action='append', default=[], metavar='GLOB', help='only files matching GLOB (repeatable)')
  parser.add_argument('--exclude', action='append', default=[], metavar='GLOB', help='skip files matching GLOB (repeatable)')
  parser.add_argument('--report-json', metavar='FILE', help='write the report as JSON (schema: docs/migrate.md)')
  parser.add_argument(
      '--select', metavar='CODE,...',
      help='run only these rules (codes or prefixes, e.g. L2N001), with the rules they build on '
           '(L2N003 brings L2N002); the rules are listed in docs/migrate.md',
  )
  parser.add_argument(
      '--train-state', choices=TRAIN_STATE_STYLES, default=None,
      help='what a flax TrainState becomes: nnx (default: nnx.Optimizer, steps over the model) or keep '
           '(the TrainState stays, around nnx.split state, as in the migration guide; a TrainState with a field '
           'that is neither model nor optimizer state, such as clu metrics, is kept either way)',
  )
  parser.add_argument(
      '--step-style', choices=STEP_STYLES, default=None,
      help='how a converted training step is jitted and called (docs/performance.md): functional (default: '
           '@jax.jit over nnx.split state, which it donates, split and copied before the loop, nnx.update after it; '
           'the fastest), cached (@nnx.jit called through nnx.cached_partial) or nnx-jit (@nnx.jit over the model '
           'and optimizer); '
           'a step a style cannot be applied to stays nnx-jit, with a report entry',
  )
  parser.add_argument(
      '--fail-on-todo', action='store_true', default=None,
      help='exit 1 when a TODO(linen2nnx) is left anywhere (for CI; [tool.linen2nnx] fail-on-todo = true)',
  )
  parser.add_argument(
      '--unsafe-fixes', action='store_true', default=None,
      help='convert a class L2N002 refuses at a statement of a method anyway: that statement is kept as written '
           'under a TODO(linen2nnx) saying why, and the class may not run until it is rewritten by hand (the '
           'default keeps such a class Linen; [tool.linen2nnx] unsafe-fixes = true)',
  )
  parser.add_argument(
      '--examples', metavar='FILE.py',
      help='a Python file whose public functions each return (linen_module, inputs[, call_kwargs]): the models '
           'are initialised abstractly (this imports and runs your code) and each layer input size the code does '
           'not determine becomes the expression of its class\'s fields every traced instance agrees with '
           '(docs/migrate.md, "Example traces")',
  )
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  from codemods import files
  from codemods import settings as project_settings

  try:
    files.check_output('--report-json', args.report_json)  # before anything is written
    settings = project_settings.load_settings()
    select = args.select.split(',') if args.select else settings.select
    jobs = args.jobs if args.jobs is not None else settings.jobs
    if jobs is not None and jobs < 1:
      raise ValueError(f'-j must be at least 1, got {jobs}')
    include, exclude = [*settings.include, *args.include], [*settings.exclude, *args.exclude]
    result = None if select or args.examples else _nothing_to_migrate(args.paths, include, exclude, args.write)
    if result is None:
      from codemods import engine  # libcst and the rules: most of a small run's time
      from codemods import rules as registry

      rules = registry.select_rules(select) if select else registry.ALL_RULES
      options = MigrationOptions(train_state=args.train_state or settings.train_state or 'nnx',
                                 step_style=args.step_style or settings.step_style or 'functional',
                                 example_sizes=_example_sizes(args.examples),
                                 unsafe_fixes=bool(args.unsafe_fixes or settings.unsafe_fixes))
      for failure in options.example_sizes.failures:
        print(f'linen2nnx migrate: warning: {failure.describe()}', file=sys.stderr)
      result = engine.migrate(args.paths, rules=rules, write=args.write, jobs=jobs, include=include, exclude=exclude,
                              progress=sys.stderr.isatty(), options=options)
  except (ValueError, FileNotFoundError) as error:  # ExamplesError is a ValueError
    print(f'linen2nnx migrate: {error}', file=sys.stderr)
    return EXIT_FAILED
  for outcome in result.files:
    if not args.write and not args.check:
      sys.stdout.write(outcome.diff)
    for line in outcome.entry_lines():
      print(line, file=sys.stderr)
    if outcome.error:
      print(f'{outcome.path}: error: {outcome.error}', file=sys.stderr)
    if args.check and outcome.diff:
      print(f'would change: {outcome.path}', file=sys.stderr)
  summary = result.summary()
  verb = 'changed' if args.write else 'would change'
  print(
      f'linen2nnx migrate: {summary["changed"]} {verb}, {summary["unchanged"]} unchanged, '
      f'{summary["skipped"]} skipped (no flax), {summary["failed"]} failed',
      file=sys.stderr,
  )
  fates = result.fates()
  print(
      f'linen2nnx migrate: classes: {fates["converted"]} converted, {fates["kept_linen"]} kept as Linen, '
      f'{fates["bridged"]} bridged with nnx_bridge; {fates["todos"]} TODOs left'
      + (f' ({fates["unsafe_fixes"]} of them statements an unsafe fix kept as written)' if fates['unsafe_fixes']
         else ''),
      file=sys.stderr,
  )
  if fates['kept_because']:
    reasons = '; '.join(f'{count} {why}' for why, count in list(fates['kept_because'].items())[:_REASONS])
    more = len(fates['kept_because']) - _REASONS
    print(f'linen2nnx migrate: kept as Linen because: {reasons}' + (f'; {more} other reasons' if more > 0 else ''),
          file=sys.stderr)
  sizes = result.input_sizes()
  total = sum(sizes.values())
  if total:
    derived = sizes['code'] + sizes['examples']
    print(
        f'linen2nnx migrate: layer input sizes: {sizes["code"]} derived from the code, {sizes["examples"]} from '
        f'example traces, {sizes["arguments"]} left as constructor arguments ({derived / total:.0%} derived)',
        file=sys.stderr,
    )
  if args.report_json and not _write_report(args.report_json, result.to_json()):
    return EXIT_FAILED
  if result.failed:
    return EXIT_FAILED
  if args.check and result.changed:
    return EXIT_WOULD_CHANGE
  return EXIT_WOULD_CHANGE if (args.fail_on_todo or settings.fail_on_todo) and fates['todos'] else EXIT_OK


def _write_report(path: str, text: str) -> bool:
  """Writes the JSON report; False, with one line on stderr, when that fails although the path was checked
  before the run (the folder went away or filled up meanwhile)."""
  try:
    with open(path, 'w', encoding='utf-8') as file:
      file.write(text)
  except OSError as error:
    print(f'linen2nnx migrate: --report-json {path}: the report could not be written ({error.strerror or error}); '
          'give a path in a folder you can write to', file=sys.stderr)
    return False
  return True


def _nothing_to_migrate(paths: list[str], include: list[str], exclude: list[str], write: bool) -> MigrationResult | None:
  """The result of a run none of whose files mentions flax or linen, decided from their bytes before libcst and the
  rules are imported (a pre-commit hook over staged files that are no Flax code); None when there may be work, a
  file cannot be read, or no file is found (`engine.migrate` then says why)."""
  from codemods import files

  found = files.find_files(paths, include, exclude)
  if not found.files or found.unreadable:
    return None
  for path in found.files:
    try:
      with open(path, 'rb') as file:
        if files.mentions_flax(file.read()):
          return None
    except OSError:
      return None
  return MigrationResult(tuple(FileOutcome(path, SKIPPED) for path in sorted(found.files)), written=write)


def _example_sizes(path: str | None) -> ExampleSizes:
  """What the examples file's traces say of layer sizes; empty without one (the user's code is not imported)."""
  if path is None:
    return ExampleSizes()
  if not os.path.isfile(path):
    raise FileNotFoundError(f'--examples {path}: no such file')
  from codemods import examples  # imports jax and the user's code: only in this mode

  return examples.trace_examples(path)
