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
  corpus = "pip install transformers==4.46.3"
  assert f"pip install -e '.[test]' && {corpus} && {command}" in readme
  assert ci.strip().splitlines()[-1] == command
  assert "pip install --quiet --disable-pip-version-check 'transformers==4.46.3'" in ci


def test_rule_examples_are_the_fixture_files():
  text = (ROOT / 'docs' / 'migrate.md').read_text()
  cases = re.findall(r'<!-- example: (fixtures/\S+) -->\n.*?```python\n(.*?)```.*?```python\n(.*?)```', text, re.DOTALL)
  assert len(cases) >= 4
  for case, before, after in cases:
    assert before == (ROOT / f'{case}.in.py').read_text(), case
    assert after == (ROOT / f'{case}.out.py').read_text(), case


def test_project_excerpts_are_the_fixture_project_and_its_migration(tmp_path):
  import shutil

  from codemods import rules as registry
  from codemods.engine import migrate

  text = (ROOT / 'docs' / 'migrate.md').read_text()
  cases = re.findall(r'<!-- project: (fixtures/\S+)/(\w+\.py) -->\nBefore:\n\n(.*?)After:\n\n(.*?)\n#', text, re.DOTALL)
  assert cases
  for folder, name, before, after in cases:
    copy = tmp_path / pathlib.Path(folder).name
    shutil.copytree(ROOT / folder, copy)
    migrate([copy], rules=registry.ALL_RULES, write=True, jobs=1)
    original, migrated = (ROOT / folder / name).read_text(), (copy / name).read_text()
    for blocks, source in ((before, original), (after, migrated)):
      excerpts = re.findall(r'```py\n(.*?)```', blocks, re.DOTALL)
      assert excerpts and all(excerpt in source for excerpt in excerpts), f'{folder}/{name}: {excerpts}'


RULE_DOC_SECTIONS = ('## What it does', '## Why', '## Example', '## What stays a TODO')


def _rule_doc(rule) -> str:
  """The docstring of the module or package a rule lives in (`codemods.rules.l2n002` for its `rule` module)."""
  import importlib

  return importlib.import_module('.'.join(rule.__module__.split('.')[:3])).__doc__ or ''


def missing_doc_sections(doc: str) -> list[str]:
  """The ruff-style headings a rule's docstring lacks, or has out of order."""
  lines = doc.splitlines()
  positions = [lines.index(h) if h in lines else -1 for h in RULE_DOC_SECTIONS]
  missing = [h for h, at in zip(RULE_DOC_SECTIONS, positions) if at < 0]
  present = [at for at in positions if at >= 0]
  return missing or ([] if present == sorted(present) else ['(headings out of order)'])


def test_every_rule_doc_has_the_four_sections_and_its_row_in_the_rule_table():
  from codemods.rules import ALL_RULES

  table = (ROOT / 'docs' / 'migrate.md').read_text()
  for rule in ALL_RULES:
    doc = _rule_doc(rule)
    assert not missing_doc_sections(doc), (rule.CODE, missing_doc_sections(doc))
    code, _, summary = doc.splitlines()[0].partition(': ')
    assert code == rule.CODE, (rule.CODE, doc.splitlines()[0])
    rows = re.findall(rf'^\| {rule.CODE} \| [^|]+ \| (.+) \|$', table, re.MULTILINE)
    assert rows == [summary], f'docs/migrate.md: the rule table row of {rule.CODE} must say {summary!r}, says {rows}'


def test_the_doc_checker_rejects_missing_and_misordered_sections():
  assert missing_doc_sections('L2N9: x\n\n## What it does\n## Why\n## Example\n## What stays a TODO\n') == []
  assert missing_doc_sections('L2N9: x\n\n## What it does\n## Example\n') == ['## Why', '## What stays a TODO']
  assert missing_doc_sections('## Why\n## What it does\n## Example\n## What stays a TODO\n') == [
      '(headings out of order)']
