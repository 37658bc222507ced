"""Every fixture pair `fixtures/L2N*/<case>.in.py` -> `.out.py`, run with its folder's rule only.

Both files are executed too: they assert their own values, so a pair shows the rewrite keeps
what the code computes. `<case>.report.txt` holds the expected `line:col CODE kind: message`.
A folder with a pyproject.toml runs its fixtures with that `[tool.linen2nnx]` table's options.
"""

import pathlib
import runpy

import pytest

from codemods import rules as registry
from codemods.options import MigrationOptions
from codemods.settings import load_settings
from codemods.transform import transform_source

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / 'fixtures'
CASES = sorted(FIXTURES.glob('L2N*/**/*.in.py'))


def _rule_of(case: pathlib.Path):
  code = case.relative_to(FIXTURES).parts[0]
  return registry.select_rules([code])


def _options_of(case: pathlib.Path) -> MigrationOptions:
  settings = load_settings(case.parent)
  if settings.source is None or not pathlib.Path(settings.source).is_relative_to(FIXTURES):
    return MigrationOptions()
  return MigrationOptions(train_state=settings.train_state or 'nnx', step_style=settings.step_style or 'functional')


def _report(entries) -> str:
  return ''.join(f'{e.line}:{e.column} {e.code} {e.kind}: {e.message}\n' for e in entries)


@pytest.mark.parametrize('case', CASES, ids=lambda p: f'{p.parent.name}/{p.name[:-6]}')
def test_fixture(case):
  expected = case.with_name(case.name.replace('.in.py', '.out.py'))
  result = transform_source(case.read_bytes(), _rule_of(case), _options_of(case))
  assert result.source.decode() == expected.read_text()
  report = case.with_name(case.name.replace('.in.py', '.report.txt'))
  if report.exists():
    assert _report(result.entries) == report.read_text()
  assert transform_source(result.source, _rule_of(case), _options_of(case)).source == result.source  # idempotent
  runpy.run_path(str(case))
  runpy.run_path(str(expected))


def test_every_rule_has_fixtures_and_a_unique_code():
  codes = [rule.CODE for rule in registry.ALL_RULES]
  assert len(set(codes)) == len(codes)
  assert codes == sorted(codes)
  for code in codes:
    assert list((FIXTURES / code).glob('*.in.py')), f'no fixtures for {code}'


def test_l2n001_names_exist_in_nnx_and_compute_the_same():
  import jax
  import numpy as np
  from flax import linen as nn
  from flax import nnx

  from codemods.rules import l2n001_convert_initializers as l2n001

  linen_names = {name for name in dir(nn.initializers) if not name.startswith('_')}
  assert linen_names <= l2n001.NNX_INITIALIZERS  # nothing Linen has is left as a TODO today
  for name in l2n001.NNX_INITIALIZERS:
    assert hasattr(nnx.initializers, name), name
    if getattr(nn.initializers, name) is not getattr(nnx.initializers, name):
      assert name in ('zeros_init', 'ones_init'), name
      key = jax.random.key(0)
      np.testing.assert_array_equal(getattr(nn.initializers, name)()(key, (2,)), getattr(nnx.initializers, name)()(key, (2,)))
  for name in l2n001.LINEN_TOP_LEVEL:
    assert getattr(nn, name) is getattr(nn.initializers, name)
