"""Every python block in README.md and docs/*.md runs, so the docs stay true to the code."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
_BLOCK = re.compile(r'```python\n(.*?)```', re.DOTALL)


def _blocks(path):
  return _BLOCK.findall(path.read_text())


@pytest.mark.slow
@pytest.mark.parametrize('path', [p for p in DOCS if _blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run(path):
  namespace = {}
  for block in _blocks(path):  # blocks of one page share a namespace, as a reader's session
    exec(compile(block, str(path), 'exec'), namespace)


def test_readme_test_command_is_what_ci_runs():
  readme = (ROOT / 'README.md').read_text()
  ci = (ROOT / '.ci' / 'run').read_text()
  command = 'python -m pytest -q -n 2'
  assert f"pip install -e '.[test]' && {command}" in readme
  assert ci.strip().splitlines()[-1] == command


def test_rule_examples_are_the_fixture_files():
  text = (ROOT / 'docs' / 'migrate.md').read_text()
  cases = re.findall(r'<!-- example: (fixtures/\S+) -->\n.*?```python\n(.*?)```.*?```python\n(.*?)```', text, re.DOTALL)
  assert len(cases) >= 4
  for case, before, after in cases:
    assert before == (ROOT / f'{case}.in.py').read_text(), case
    assert after == (ROOT / f'{case}.out.py').read_text(), case
