"""A snapshot of everything `linen2nnx migrate` writes for the repository's fixtures, to show a refactor changes nothing.

Run: python benchmarks/migration_snapshot.py save BEFORE.json   (before the change)
     python benchmarks/migration_snapshot.py compare BEFORE.json  (after it: exit 1 when an output differs)

It records, for every fixture input (keyed by its content, not its path), the code and the report entries of its
own rule (under the defaults and each `<case>.<option>=<value>.out.py` variant), of all rules together under each
`--train-state` / `--step-style` option, and of whole-run migrations (the hierarchy pass included) of the demo
project, with and without its example traces, and of the training and example folders. The
snapshot holds outputs only; it asserts nothing by itself.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
import typing as tp

from codemods import rules as registry
from codemods.engine import migrate
from codemods.options import STEP_STYLES
from codemods.options import MigrationOptions
from codemods.transform import transform_source

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / 'fixtures'


def _entries(entries: tp.Iterable[tp.Any]) -> list[str]:
  return [f'{e.line}:{e.column} {e.code} {e.kind}: {e.message}' for e in entries]


def _own_variants(case: pathlib.Path) -> list[MigrationOptions]:
  """The options a case runs with in tests/codemods/rules/test_fixtures.py: the defaults, and one per `<case>.<option>=<value>.out.py`."""
  stem = case.name[:-len('.in.py')]
  variants = [MigrationOptions()]
  for output in sorted(case.parent.glob(f'{stem}.*=*.out.py')):
    options = output.name[len(stem) + 1:-len('.out.py')].split('.')
    variants.append(MigrationOptions(**{k.replace('-', '_'): v for k, v in (o.split('=', 1) for o in options)}))
  return variants


def _transform(path: pathlib.Path, rules: tp.Sequence[tp.Any], options: MigrationOptions) -> dict[str, tp.Any]:
  try:
    result = transform_source(path.read_bytes(), rules, options)
  except Exception as error:  # a refactor may change which error, and that is a difference too
    return {'error': f'{type(error).__name__}: {error}'}
  return {'source': result.source.decode(), 'entries': _entries(result.entries),
          'classes': [repr(c) for c in result.classes]}


def _run(paths: list[pathlib.Path], options: MigrationOptions) -> dict[str, tp.Any]:
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    result = migrate([str(p.relative_to(ROOT)) for p in paths], rules=registry.ALL_RULES, jobs=1, options=options)
  finally:
    os.chdir(cwd)
  return {o.path: {'status': o.status, 'diff': o.diff, 'entries': o.entry_lines(), 'error': o.error,
                   'classes': [repr(c) for c in o.classes]} for o in result.files}


def _key(kind: str, case: pathlib.Path, options: MigrationOptions) -> str:
  """What produced an output: the rules, the options and the input's content (not its path, so that a fixture
  moved or deduplicated keeps its key)."""
  digest = hashlib.sha256(case.read_bytes()).hexdigest()[:16]
  return f'{kind} {case.relative_to(FIXTURES).parts[0]} {options.train_state}/{options.step_style} {digest}'


def snapshot() -> dict[str, tp.Any]:
  """Every output, keyed by what produced it."""
  out: dict[str, tp.Any] = {}
  cases = sorted(FIXTURES.glob('L2N*/**/*.in.py'))
  variants = [MigrationOptions(), MigrationOptions(train_state='keep'),
              *(MigrationOptions(step_style=s) for s in STEP_STYLES if s != 'functional')]
  for case in cases:
    for options in _own_variants(case):
      out[_key('own-rule', case, options)] = _transform(
          case, registry.select_rules([case.relative_to(FIXTURES).parts[0]]), options)
    for options in variants:
      out[_key('all-rules', case, options)] = _transform(case, registry.ALL_RULES, options)
  demo = FIXTURES / 'demo_project'
  out['run demo_project'] = _run([demo], MigrationOptions())
  from codemods.examples import trace_examples  # imports jax and the demo's code

  with_examples = MigrationOptions(example_sizes=trace_examples(str(demo / 'examples.py')))
  out['run demo_project --examples'] = _run([demo], with_examples)
  out['run training+examples'] = _run([FIXTURES / 'training', FIXTURES / 'examples'], MigrationOptions())
  return out


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('mode', choices=('save', 'compare'))
  parser.add_argument('file')
  args = parser.parse_args(argv)
  current = snapshot()
  if args.mode == 'save':
    pathlib.Path(args.file).write_text(json.dumps(current, indent=1, sort_keys=True))
    print(f'{len(current)} outputs saved to {args.file}')
    return 0
  before = json.loads(pathlib.Path(args.file).read_text())
  differing = sorted(k for k in before.keys() & current.keys() if before[k] != current[k])
  for key in differing:
    print(f'differs: {key}')
  for key in sorted(before.keys() - current.keys()):
    print(f'only before: {key}')
  for key in sorted(current.keys() - before.keys()):
    print(f'only now: {key}')
  print(f'{len(current)} outputs, {len(differing)} differ from {args.file}, '
        f'{len(before.keys() ^ current.keys())} produced by one of the two only (an input that changed)')
  return 1 if differing else 0


if __name__ == '__main__':
  sys.exit(main())
