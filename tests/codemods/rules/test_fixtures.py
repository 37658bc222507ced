"""Every fixture pair `fixtures/L2N*/<case>.in.py` -> `.out.py`, run with its folder's rule only.

Both files are executed too: they assert their own values, so a pair shows the rewrite keeps
what the code computes. `<case>.report.txt` holds the expected `line:col CODE kind: message`
entries of the folder's rule (the rules it builds on run too, their entries are not listed).
An option variant of a case is `<case>.<option>=<value>.out.py` (and `.report.txt`) beside the
one input, its options written as on the command line: `step_style_epochs.step-style=cached.out.py`
is what `linen2nnx migrate --step-style cached` makes of `step_style_epochs.in.py`.
"""

import pathlib
import runpy

import pytest

from codemods import rules as registry
from codemods.options import MigrationOptions
from codemods.transform import transform_source

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / 'fixtures'


def _variants() -> list[tuple[pathlib.Path, pathlib.Path]]:
  """(input, expected output) for every case and option variant: `<case>.out.py` and each `<case>.<options>.out.py`."""
  pairs = []
  for case in sorted(FIXTURES.glob('L2N*/*.in.py')):
    stem = case.name[:-len('.in.py')]
    outputs = [case.with_name(f'{stem}.out.py'), *sorted(case.parent.glob(f'{stem}.*=*.out.py'))]
    pairs.extend((case, output) for output in outputs)
  return pairs


VARIANTS = [pytest.param(case, out, id=f'{case.parent.name}/{out.name[:-len(".out.py")]}') for case, out in _variants()]


def _options_of(output: pathlib.Path) -> MigrationOptions:
  """The options a `<case>[.<option>=<value>...].out.py` name gives: `step-style=cached` -> step_style='cached'."""
  _, *options = output.name[:-len('.out.py')].split('.')
  return MigrationOptions(**{key.replace('-', '_'): value for key, value in (o.split('=', 1) for o in options)})


def _report(entries, code: str) -> str:
  return ''.join(f'{e.line}:{e.column} {e.code} {e.kind}: {e.message}\n' for e in entries if e.code == code)


@pytest.mark.parametrize('case, expected', VARIANTS)
def test_fixture(case, expected):
  code = case.parent.name
  rules, options = registry.select_rules([code]), _options_of(expected)
  result = transform_source(case.read_bytes(), rules, options)
  assert result.source.decode() == expected.read_text()
  report = expected.with_name(expected.name.replace('.out.py', '.report.txt'))
  if report.exists():
    assert _report(result.entries, code) == report.read_text()
  assert transform_source(result.source, rules, options).source == result.source  # idempotent
  runpy.run_path(str(case))
  runpy.run_path(str(expected))


def test_every_variant_names_real_options_and_every_file_belongs_to_a_case():
  for _, expected in _variants():
    _options_of(expected)  # raises on an unknown option or value
  cases = {p.name[:-len('.in.py')] for p in FIXTURES.glob('L2N*/*.in.py')}
  for path in FIXTURES.glob('L2N*/*'):
    assert path.name.split('.')[0] in cases, f'{path} has no {path.name.split(".")[0]}.in.py'
  assert not list(FIXTURES.glob('L2N*/*/')), 'a case\'s options go in its file name, not in a folder'


def test_every_rule_has_fixtures_and_a_unique_code():
  codes = [rule.CODE for rule in registry.ALL_RULES]
  assert len(set(codes)) == len(codes)
  assert codes == sorted(codes)
  for code in codes:
    assert list((FIXTURES / code).glob('*.in.py')), f'no fixtures for {code}'
