"""`codemods.engine.migrate`: import styles, safety, encodings, walking, notebooks and parallelism;
`transform_source` running rules as libcst would, rule after rule."""

import json
import pathlib
import pickle
import subprocess
import sys

import libcst as cst
import libcst.matchers as m
import pytest
from libcst.metadata import PositionProvider
from libcst.metadata import QualifiedNameProvider

from codemods import rules as registry
from codemods.engine import MAX_NESTING
from codemods.engine import migrate
from codemods.engine import nesting_depth
from codemods.rule import MigrationRule
from codemods import transform as transform_module
from codemods.transform import transform_source

RULES = registry.select_rules(['L2N001'])  # engine behaviour, shown with one rule
LINEN = 'import flax.linen as nn\n\nW = nn.initializers.zeros\n'
MIGRATED = 'from flax import nnx\n\nW = nnx.initializers.zeros\n'


def _tree(root: pathlib.Path, files: dict[str, str | bytes]) -> pathlib.Path:
  for name, content in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
  return root


def _status(result) -> dict[str, str]:
  return {pathlib.Path(o.path).name: o.status for o in result.files}


@pytest.mark.parametrize('source, expected', [
    ('import flax.linen as nn\nx = nn.initializers.zeros\n', 'from flax import nnx\n\nx = nnx.initializers.zeros\n'),
    ('from flax import linen\nx = linen.initializers.zeros\n', 'from flax import nnx\nx = nnx.initializers.zeros\n'),
    ('from flax.linen import initializers as I\nx = I.zeros\n', 'from flax import nnx\n\nx = nnx.initializers.zeros\n'),
    ('import flax\nx = flax.linen.initializers.zeros\n', 'from flax import nnx\n\nx = nnx.initializers.zeros\n'),
    ('from flax.linen.initializers import zeros\nx = zeros\n', 'from flax import nnx\n\nx = nnx.initializers.zeros\n'),
    ('from flax import nnx\nimport flax.linen as nn\nx = nn.initializers.zeros\n', 'from flax import nnx\nx = nnx.initializers.zeros\n'),
], ids=['import_as_nn', 'from_flax_import_linen', 'initializers_as_I', 'import_flax', 'from_initializers', 'nnx_present'])
def test_import_styles(tmp_path, source, expected):
  path = _tree(tmp_path, {'m.py': source}) / 'm.py'
  result = migrate([path], rules=RULES, write=True, jobs=1)
  assert path.read_text() == expected, result.files[0].diff
  assert [e.kind for e in result.files[0].entries] == ['change']


def test_shadowed_nn_is_left_alone(tmp_path):
  source = 'import flax.linen as nn\n\ndef f(nn):\n  return nn.initializers.zeros\n'
  path = _tree(tmp_path, {'m.py': source}) / 'm.py'
  result = migrate([path], rules=RULES, write=True, jobs=1)
  assert _status(result) == {'m.py': 'unchanged'} and path.read_text() == source


def test_a_file_that_does_not_parse_is_reported_and_the_others_are_migrated(tmp_path):
  bad = b'import flax.linen as nn\nx = (nn.initializers.zeros\n'
  _tree(tmp_path, {'a.py': LINEN, 'b_bad.py': bad, 'c.py': LINEN})
  result = migrate([tmp_path], rules=RULES, write=True, jobs=1)
  assert _status(result) == {'a.py': 'changed', 'b_bad.py': 'failed', 'c.py': 'changed'}
  assert 'does not parse' in result.failed[0].error
  assert (tmp_path / 'b_bad.py').read_bytes() == bad
  assert (tmp_path / 'c.py').read_text() == MIGRATED


class _BreakingRule(MigrationRule):
  CODE = 'L2N900'
  DESCRIPTION = 'turns every name `x` into a keyword, to test the re-parse check.'

  def leave_Name(self, original_node, updated_node):
    return cst.Name('class') if updated_node.value == 'x' else updated_node


class _CrashingRule(MigrationRule):
  CODE = 'L2N901'
  DESCRIPTION = 'raises, to test that a rule bug fails one file only.'

  def visit_Module(self, node):
    raise RuntimeError('boom')


@pytest.mark.parametrize('rule, message', [
    (_BreakingRule, 'the migrated code does not parse, left untouched'),
    (_CrashingRule, 'rule L2N901 failed: RuntimeError: boom'),
])
def test_a_rule_that_breaks_the_code_or_raises_writes_nothing(tmp_path, rule, message):
  source = 'import flax\nx = 1\n'
  path = _tree(tmp_path, {'m.py': source}) / 'm.py'
  result = migrate([path], rules=[rule], write=True, jobs=1)
  assert result.failed[0].error.startswith(message)
  assert path.read_text() == source


def test_crlf_bom_and_encoding_are_preserved(tmp_path):
  crlf_bom = b'\xef\xbb\xbf' + LINEN.replace('\n', '\r\n').encode()
  latin1 = '# -*- coding: latin-1 -*-\n' + LINEN + "NAME = 'caf\xe9'\n"
  _tree(tmp_path, {'crlf_bom.py': crlf_bom, 'latin1.py': latin1.encode('latin-1')})
  result = migrate([tmp_path], rules=RULES, write=True, jobs=1)
  assert _status(result) == {'crlf_bom.py': 'changed', 'latin1.py': 'changed'}
  assert (tmp_path / 'crlf_bom.py').read_bytes() == b'\xef\xbb\xbf' + MIGRATED.replace('\n', '\r\n').encode()
  assert (tmp_path / 'latin1.py').read_bytes() == ('# -*- coding: latin-1 -*-\n' + MIGRATED + "NAME = 'caf\xe9'\n").encode('latin-1')


@pytest.mark.parametrize('jobs', [1, 2])
def test_a_file_that_is_not_text_in_its_encoding_fails_saying_the_line_and_the_fix(tmp_path, jobs):
  latin1 = (LINEN + "NAME = 'caf\xe9'\n").encode('latin-1')
  _tree(tmp_path, {
      'lat.py': latin1,
      'declared.py': b'# -*- coding: latin-1 -*-\n' + latin1,
      'ascii.py': b'# coding: ascii\n' + latin1,
      'unknown.py': b'# coding: nope\n' + LINEN.encode() + b'class Model: pass\n',
      'plain.py': b'# coding: nope\nfrom unknown import Model\n',  # skipped (no flax), read for Model: no crash
  })
  result = migrate([tmp_path], rules=RULES, write=True, jobs=jobs)
  assert {pathlib.Path(o.path).name: o.error for o in result.failed} == {
      'lat.py': ('line 4 is not UTF-8 (byte 0xe9); save the file as UTF-8, or declare its encoding with a '
                 'first-line comment such as # -*- coding: latin-1 -*-'),
      'ascii.py': ('line 5 is not ascii (byte 0xe9), the encoding its coding comment declares; save the file in '
                   'that encoding, or declare the one it is in'),
      'unknown.py': 'its coding comment names an unknown encoding (nope); name one Python knows, such as utf-8 or latin-1',
  }
  assert _status(result)['declared.py'] == 'changed' and _status(result)['plain.py'] == 'skipped'
  assert (tmp_path / 'declared.py').read_bytes() == (
      b'# -*- coding: latin-1 -*-\n' + MIGRATED.encode() + "NAME = 'caf\xe9'\n".encode('latin-1'))
  assert (tmp_path / 'lat.py').read_bytes() == latin1


def test_a_non_utf8_byte_on_the_first_line_is_named_too(tmp_path):
  path = _tree(tmp_path, {'first.py': b"X = '\xe9'  # flax\n"}) / 'first.py'
  assert migrate([path], rules=RULES, jobs=1).failed[0].error.startswith('line 1 is not UTF-8 (byte 0xe9); ')


def test_formatting_outside_rewrites_is_kept_and_a_second_run_changes_nothing(tmp_path):
  source = (
      'import flax.linen as nn   # the layers\n\n\n'
      'class Block(nn.Module):  # odd   spacing kept\n'
      '  features : int=3\n'
      '  @nn.compact\n'
      '  def __call__(self, x):\n'
      '    return nn.Dense( self.features,\n'
      '                     kernel_init = nn.initializers.lecun_normal() )(x)\n'
  )
  path = _tree(tmp_path, {'m.py': source}) / 'm.py'
  migrate([path], rules=RULES, write=True, jobs=1)
  assert path.read_text() == source.replace(
      'import flax.linen as nn   # the layers\n', 'import flax.linen as nn   # the layers\nfrom flax import nnx\n'
  ).replace('nn.initializers', 'nnx.initializers')
  again = migrate([path], rules=RULES, write=True, jobs=1)
  assert _status(again) == {'m.py': 'unchanged'} and not again.files[0].diff


def test_files_without_linen_are_skipped_before_parsing_and_stay_byte_identical(tmp_path):
  other = b'import os\r\n\xef\xbb\xbf = 1 ( not even python\n'
  plain = b'# uses flax elsewhere\nimport os\n'
  _tree(tmp_path, {'other.py': other, 'plain.py': plain})
  result = migrate([tmp_path], rules=RULES, write=True, jobs=1)
  assert _status(result) == {'other.py': 'skipped', 'plain.py': 'unchanged'}
  assert (tmp_path / 'other.py').read_bytes() == other and (tmp_path / 'plain.py').read_bytes() == plain


def test_gitignore_nested_and_above_and_globs(tmp_path):
  (tmp_path / '.git').mkdir()
  _tree(tmp_path, {
      '.gitignore': 'build/\n*_gen.py\n',
      'src/.gitignore': 'vendored/\n!keep_gen.py\n',
      'src/a.py': LINEN, 'src/a_gen.py': LINEN, 'src/keep_gen.py': LINEN,
      'src/vendored/v.py': LINEN, 'src/tests/a_test.py': LINEN, 'build/b.py': LINEN,
  })
  names = lambda result: sorted(o.path.split(str(tmp_path) + '/')[-1] for o in result.files)
  assert names(migrate([tmp_path / 'src'], rules=RULES, jobs=1)) == ['src/a.py', 'src/keep_gen.py', 'src/tests/a_test.py']
  assert names(migrate([tmp_path], rules=RULES, jobs=1, exclude=['tests/'])) == ['src/a.py', 'src/keep_gen.py']
  assert names(migrate([tmp_path], rules=RULES, jobs=1, include=['*_test.py'])) == ['src/tests/a_test.py']
  # A file named on the command line is taken even when ignored.
  assert names(migrate([tmp_path / 'build' / 'b.py'], rules=RULES, jobs=1)) == ['build/b.py']
  with pytest.raises(FileNotFoundError, match='no such file or directory'):
    migrate([tmp_path / 'missing'], rules=RULES)


def _notebook(cells):
  return {'cells': cells, 'metadata': {'kernelspec': {'name': 'python3'}}, 'nbformat': 4, 'nbformat_minor': 5}


def test_notebook_code_cells_are_migrated_and_magics_and_outputs_kept(tmp_path):
  outputs = [{'output_type': 'stream', 'name': 'stdout', 'text': ['nn.initializers.zeros\n']}]
  cells = [
      {'cell_type': 'markdown', 'metadata': {}, 'source': ['Uses `nn.initializers.zeros`.']},
      {'cell_type': 'code', 'execution_count': 1, 'id': 'a', 'metadata': {}, 'outputs': [],
       'source': ['%matplotlib inline\n', '!pip install flax\n', 'import flax.linen as nn']},
      {'cell_type': 'code', 'execution_count': 2, 'id': 'b', 'metadata': {}, 'outputs': outputs,
       'source': ['if True:\n', '  %time w = nn.initializers.zeros\n', 'w = nn.initializers.ones\n']},
      {'cell_type': 'code', 'execution_count': 3, 'id': 'c', 'metadata': {}, 'outputs': [],
       'source': ['%%bash\n', 'echo nn.initializers.zeros\n']},
  ]
  text = json.dumps(_notebook(cells), indent=1, ensure_ascii=False) + '\n'
  path = _tree(tmp_path, {'nb.ipynb': text}) / 'nb.ipynb'
  result = migrate([path], rules=RULES, write=True, jobs=1)
  new = json.loads(path.read_text())
  assert new['cells'][1]['source'] == ['from flax import nnx\n', '\n', '%matplotlib inline\n', '!pip install flax']
  assert new['cells'][2]['source'] == ['if True:\n', '  %time w = nn.initializers.zeros\n', 'w = nnx.initializers.ones\n']
  assert new['cells'][0] == cells[0] and new['cells'][3] == cells[3] and new['cells'][2]['outputs'] == outputs
  entry, = result.files[0].entries
  assert (entry.cell, entry.line, entry.column) == (2, 3, 5)
  assert result.files[0].entry_lines()[0].startswith(f'{path.as_posix()}[cell 2]:3:5: L2N001 change:')
  assert _status(migrate([path], rules=RULES, write=True, jobs=1)) == {'nb.ipynb': 'unchanged'}


def test_notebook_classes_are_recorded_by_cell(tmp_path):
  cells = [
      {'cell_type': 'code', 'execution_count': 1, 'metadata': {}, 'outputs': [], 'source': 'import flax.linen as nn\n'},
      {'cell_type': 'code', 'execution_count': 2, 'metadata': {}, 'outputs': [],
       'source': 'x = 1\nclass M(nn.Module):\n  @nn.compact\n  def __call__(self, x):\n    return nn.Dense(2)(x)\n'},
  ]
  path = _tree(tmp_path, {'nb.ipynb': json.dumps(_notebook(cells))}) / 'nb.ipynb'
  record, = migrate([path], rules=registry.select_rules(['L2N002']), jobs=1).files[0].classes
  assert (record.cell, record.line, record.linen_name) == (1, 2, 'M')
  assert [(c.linen_name, c.nnx_attribute) for c in record.children] == [('Dense_0', 'linear')]


_CODE_CELL = {'cell_type': 'code', 'execution_count': 1, 'metadata': {}, 'outputs': [], 'source': 'import flax\n'}


@pytest.mark.parametrize('content, error', [
    ({'cells': [_CODE_CELL, {**_CODE_CELL, 'source': 5}]},
     'cell 1: source must be a string or a list of strings, not a number; fix the notebook'),
    ({'cells': [{**_CODE_CELL, 'source': ['import flax\n', None]}]},
     'cell 0: source must be a string or a list of strings, not a list with null in it; fix the notebook'),
    ({'cells': [_CODE_CELL, 'flax']}, 'cell 1: must be a JSON object, not a string; fix the notebook'),
    ({'cells': {'flax': 1}}, 'not a notebook: no "cells" list at the top of its JSON; give a Jupyter notebook or '
                             '--exclude the file'),
    ({'metadata': 'flax'}, 'not a notebook: no "cells" list at the top of its JSON; give a Jupyter notebook or '
                           '--exclude the file'),
    (['flax'], 'not a notebook: no "cells" list at the top of its JSON; give a Jupyter notebook or --exclude the file'),
    (b'{"cells": [flax]}', 'not a notebook: not valid JSON at line 1 column 12 (Expecting value); fix the file or '
                           '--exclude it'),
    (b'{"cells": [],\n "flax": "\xe9"}', 'not a notebook: line 2 is not UTF-8 (byte 0xe9); save it as UTF-8, as '
                                         'Jupyter does'),
], ids=['number_source', 'null_line', 'string_cell', 'cells_object', 'no_cells', 'list', 'not_json', 'latin1'])
def test_a_notebook_this_cannot_read_fails_in_one_line_saying_what_is_wrong(tmp_path, content, error):
  data = content if isinstance(content, bytes) else json.dumps(content).encode()
  path = _tree(tmp_path, {'nb.ipynb': data}) / 'nb.ipynb'
  failed, = migrate([path], rules=RULES, write=True, jobs=1).failed
  assert failed.error == error
  assert path.read_bytes() == data


def test_results_do_not_depend_on_jobs_or_order(tmp_path):
  files = {f'p{i}/m{i}.py': LINEN for i in range(4)}
  files.update({'bad.py': 'import flax\nx = (\n', 'other.py': 'import os\n', 'todo.py': 'import flax.linen as nn\nx = nn.initializers.nope\n'})
  _tree(tmp_path, files)
  paths = sorted(tmp_path.iterdir())
  one = migrate(paths, rules=RULES, jobs=1)
  two = migrate(list(reversed(paths)), rules=RULES, jobs=2)
  assert one == two
  assert one.to_json() == two.to_json()
  assert json.loads(one.to_json())['summary'] == {'changed': 5, 'unchanged': 0, 'skipped': 1, 'failed': 1}


# --- transform_source: the shortcuts it takes do not change what the rules produce ----------

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / 'fixtures'
BOTH_RULES = (
    'import flax\nfrom flax import linen as nn\n\n\nclass MLP(nn.Module):\n  features: int\n\n'
    '  @nn.compact\n  def __call__(self, x):\n'
    '    x = nn.Dense(self.features, kernel_init=nn.initializers.lecun_normal())(x)\n'
    '    return flax.linen.relu(x)\n'
)


# libcst's own way, rule after rule, in a process that does not import codemods.transform (and so
# leaves libcst as it is, without codemods.libcst_speedups): what transform_source must give, the
# positions each rule reports traced back to the original source. Where transform_source settled a
# file's to_linen bridges (a second run would have changed its classes), the rules get the classes
# it left unbridged: settling is what a run means, not a shortcut.
_RULE_AFTER_RULE = """
import dataclasses, pickle, sys
import libcst as cst
from libcst.codemod import CodemodContext
from codemods import rules as registry
from codemods.positions import PositionMap
from codemods.report import ConvertedClass, Entry
from codemods.rule import CLASSES_KEY, KNOWN_CLASSES_KEY, REPORT_KEY, UNBRIDGED_CLASSES_KEY

def rule_after_rule(source, rules, unbridged):
  tree, entries, classes = cst.parse_module(source), [], []
  original = tree.code
  for rule in rules:
    context = CodemodContext(scratch={KNOWN_CLASSES_KEY: tuple(classes), UNBRIDGED_CLASSES_KEY: unbridged})
    positions = PositionMap(original, tree.code)
    tree = rule(context).transform_module(tree)
    for e in context.scratch.get(REPORT_KEY, []):
      line, column = positions.original(e.line, e.column)
      entries.append(dataclasses.replace(e, line=line, column=column))
    classes += [dataclasses.replace(c, line=positions.original(c.line, 1)[0])
                for c in context.scratch.get(CLASSES_KEY, [])]
  return tree.bytes, sorted(entries, key=Entry.sort_key), sorted(classes, key=ConvertedClass.sort_key)

results = {}
for name, source, reverse, unbridged in pickle.load(sys.stdin.buffer):
  rules = registry.ALL_RULES[::-1] if reverse else registry.ALL_RULES
  result = rule_after_rule(source, rules, unbridged)
  tidying = {r.CODE for r in rules if r.TIDYING}
  others = [e for e in result[1] if e.code not in tidying]
  if not result[2] and any(e.code in tidying and e.kind == 'change' for e in result[1]) \
      and any(e.kind == 'todo' for e in others) and not any(e.kind == 'change' for e in others):
    result = rule_after_rule(source, [r for r in rules if not r.TIDYING], unbridged)  # its Linen classes all stay Linen
  results[name] = result
assert 'codemods.libcst_speedups' not in sys.modules
pickle.dump(results, sys.stdout.buffer)
"""
CASES = {
    **{str(p.relative_to(FIXTURES)): (p.read_bytes(), False) for p in sorted(FIXTURES.glob('**/*.py'))
       if not p.name.endswith('.out.py')},
    'both_rules': (BOTH_RULES.encode(), False),
    'both_rules_reversed': (BOTH_RULES.encode(), True),
}


def _rule_after_rule(cases: list[tuple[str, bytes, bool, frozenset[str]]]) -> dict:
  run = subprocess.run([sys.executable, '-c', _RULE_AFTER_RULE], input=pickle.dumps(cases), capture_output=True,
                       check=True)
  return pickle.loads(run.stdout)


@pytest.fixture(scope='module')
def rule_after_rule():
  """Each case rule after rule with no class left unbridged, computed in one process."""
  return _rule_after_rule([(name, source, reverse, frozenset()) for name, (source, reverse) in CASES.items()])


@pytest.mark.slow
@pytest.mark.parametrize('name', CASES)
def test_transform_source_gives_what_libcst_gives_rule_after_rule(name, rule_after_rule, monkeypatch):
  source, reverse = CASES[name]
  calls, real = [], transform_module._transform
  monkeypatch.setattr(transform_module, '_transform', lambda *args: calls.append(args) or real(*args))
  result = transform_source(source, registry.ALL_RULES[::-1] if reverse else registry.ALL_RULES)
  unbridged = [args[-1] for args in calls if not all(rule.DECIDES_CLASSES for rule in args[2])][-1]  # its last round
  expected = _rule_after_rule([(name, source, reverse, unbridged)])[name] if unbridged else rule_after_rule[name]
  assert (result.source, list(result.entries), list(result.classes)) == expected


class _RenameXRule(MigrationRule):
  CODE = 'L2N902'
  DESCRIPTION = 'renames `x` to `needle` and imports it, to test what the next rule sees.'

  def leave_Name(self, original_node, updated_node):
    if updated_node.value != 'x':
      return updated_node
    self.add_needed_import('haystack', 'needle')
    return updated_node.with_changes(value='needle')


class _NeedleRule(MigrationRule):
  CODE = 'L2N903'
  DESCRIPTION = 'reports each `needle`, with its position and qualified name.'
  REQUIRES = ('needle',)
  METADATA_DEPENDENCIES = (QualifiedNameProvider,)

  def visit_ImportFrom(self, node):
    return False

  def visit_Name(self, node):
    if node.value == 'needle':
      names = ', '.join(sorted(q.name for q in self.get_metadata(QualifiedNameProvider, node)))
      self.report_change(node, names)


def test_a_rule_sees_the_code_and_the_imports_the_rules_before_it_made():
  result = transform_source('import flax\n\nprint(x)\n', [_RenameXRule, _NeedleRule])
  assert result.source == 'import flax\nfrom haystack import needle\n\nprint(needle)\n'
  # The position is the user's source's (print(x) is on line 3 there), not the one L2N902's import moved it to.
  assert [(e.line, e.column, e.message) for e in result.entries if e.code == 'L2N903'] == [(3, 7, 'haystack.needle')]


class _PinRule(MigrationRule):
  CODE = 'L2N904'
  DESCRIPTION = 'reports the module, on code that says needle or pin anywhere.'
  REQUIRES = ('needle', 'pin')

  def visit_Module(self, node):
    self.report_change(node, 'ran')


def test_a_rule_runs_only_on_code_with_a_word_it_requires():
  assert not transform_source('import flax\n\nprint(x)\n', [_PinRule]).entries
  assert not transform_source('import flax\n\ndef _pin_it(needles):\n  return needles\n', [_PinRule]).entries  # words
  assert transform_source('import flax  # a pin\n\nprint(x)\n', [_PinRule]).entries
  assert transform_source('import flax\n\nprint(x)\n', [_RenameXRule, _PinRule]).entries  # the needle L2N902 wrote


class _InitPatternRule(MigrationRule):
  CODE = 'L2N909'
  DESCRIPTION = 'reports the module, on code where L2N003 looks for model sites.'
  REQUIRES_PATTERN = registry.select_rules(['L2N003'])[-1].REQUIRES_PATTERN

  def visit_Module(self, node):
    self.report_change(node, 'ran')


@pytest.mark.parametrize('code, runs', [
    ('variables = model.init(key, x)\n', True),
    ('variables = (model) \\\n  .init(key, x)\n', True),
    ('params = freeze(cnn.init(key, x))["params"]\n', True),
    ('random_params = self.module.init(rngs, input_ids)\n', False),  # transformers' wrappers: no model site
    ('class A:\n  def __init__(self):\n    self.cache = x.init_cache(1)\n', False),
])
def test_a_rule_with_a_pattern_runs_only_on_code_it_finds(code, runs):
  assert bool(transform_source('import flax\n' + code, [_InitPatternRule]).entries) is runs


class _DecoratedRule(MigrationRule):
  CODE = 'L2N905'
  DESCRIPTION = 'renames `x` to `y` inside functions only, through libcst matcher decorators.'

  @m.call_if_inside(m.FunctionDef())
  @m.leave(m.Name('x'))
  def rename(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
    return updated_node.with_changes(value='y')


def test_matcher_decorators_apply_every_time_next_to_undecorated_rules():
  source = 'import flax\nx = 1\n\ndef f():\n  return x\n'
  for rules in ([_DecoratedRule], [*RULES, _DecoratedRule], [_DecoratedRule]):
    assert transform_source(source, rules).source == source.replace('return x', 'return y')


# --- pathological files: reported failed, never a crash of the run ---------------------------

HEAD = 'import flax.linen as nn\n'
PATHOLOGICAL = {
    'sum.py': HEAD + 'x = ' + ' + '.join(['1'] * 10_000) + '\n',
    'lists.py': HEAD + 'x = ' + '[' * 5_000 + ']' * 5_000 + '\n',
    'chain.py': HEAD + 'x = a' + '.b' * 50_000 + '\n',
}


@pytest.mark.parametrize('jobs', [1, 2])
def test_a_too_deeply_nested_file_fails_alone_at_any_jobs(tmp_path, jobs):
  _tree(tmp_path, {**PATHOLOGICAL, 'good.py': LINEN})
  result = migrate([tmp_path], rules=RULES, write=True, jobs=jobs)
  assert _status(result) == {'chain.py': 'failed', 'good.py': 'changed', 'lists.py': 'failed', 'sum.py': 'failed'}
  assert {pathlib.Path(o.path).name: o.error.split(')')[0] for o in result.failed} == {
      'chain.py': 'too deeply nested to parse safely (nesting depth 50000 > 500',
      'lists.py': 'too deeply nested to parse safely (nesting depth 5000 > 500',
      'sum.py': 'too deeply nested to parse safely (nesting depth 9999 > 500',
  }
  assert (tmp_path / 'good.py').read_text() == MIGRATED
  assert all((tmp_path / name).read_text() == source for name, source in PATHOLOGICAL.items())


def test_the_migrate_command_exits_2_on_pathological_files_and_migrates_the_others(tmp_path):
  _tree(tmp_path, {**PATHOLOGICAL, 'good.py': LINEN})
  run = subprocess.run([sys.executable, '-m', 'codemods.cli', 'migrate', '.', '--write', '-j', '2'],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
  assert run.returncode == 2, run.stderr
  assert 'linen2nnx migrate: 1 changed, 0 unchanged, 0 skipped (no flax), 3 failed' in run.stderr
  assert (tmp_path / 'good.py').read_text() == MIGRATED


@pytest.mark.parametrize('source, depth', [
    ('x = 1\n', 0),
    ('x = a + b * c\n', 2),
    ('x = [[1, 2], [3, [4]]]\n', 3),
    ('x = [-1, -2, -3, -4]\n', 2),  # a comma starts a new element: flat
    ('x = {"a": 1 + 2, "b": 3 + 4}\n', 2),
    ('x = f(a)(b)(c)\n', 4),
    ("x = ('a'\n     'b'\n     'c')\n", 3),
    ('x = a.b.c.d\ny = 1\n', 3),  # per statement
    ('x = not not a and b\n', 3),
    ('x = (1 +\n', 2),  # does not tokenize: counted up to the end
], ids=['flat', 'operators', 'brackets', 'elements', 'dict', 'calls', 'strings', 'statements', 'keywords', 'broken'])
def test_nesting_depth(source, depth):
  assert nesting_depth(source.encode()) == depth


def test_nesting_depth_of_real_code_is_far_below_the_limit():
  sources = [*pathlib.Path(cst.__file__).parent.glob('_nodes/*.py'), *FIXTURES.glob('**/*.in.py')]
  assert max(nesting_depth(path.read_bytes()) for path in sources) < MAX_NESTING // 10


def test_a_notebook_cell_too_deeply_nested_fails_the_notebook(tmp_path):
  cells = [{'cell_type': 'code', 'execution_count': 1, 'metadata': {}, 'outputs': [],
            'source': PATHOLOGICAL['lists.py']}]
  path = _tree(tmp_path, {'nb.ipynb': json.dumps(_notebook(cells))}) / 'nb.ipynb'
  result = migrate([path], rules=RULES, jobs=1)
  assert result.failed[0].error.startswith('too deeply nested to parse safely (nesting depth 5000 > 500)')


def test_a_file_whose_linen_classes_all_stay_linen_changes_only_by_its_todo_lines(tmp_path):
  """Issue 35's churn: L2N001 renames initializers (the same functions) only where something converts."""
  fixtures = pathlib.Path(__file__).resolve().parents[2] / 'fixtures' / 'L2N002'
  source = (fixtures / 'kept_linen_file.in.py').read_text()
  result = transform_source(source, registry.ALL_RULES)
  assert result.source == (fixtures / 'kept_linen_file.out.py').read_text()
  assert {e.code for e in result.entries} == {'L2N002'}
  converting = source.replace('    return nn.Sequential([nn.Dense(self.features), nn.relu])(x)\n', '    return x\n')
  converted = transform_source(converting, registry.ALL_RULES)  # Tower converts: the initializers are NNX's too
  assert [c.linen_name for c in converted.classes] == ['Tower']
  assert 'default_init = nnx.initializers.xavier_uniform()' in converted.source
  assert 'flax.linen' not in converted.source


def test_a_file_over_the_size_limit_fails_before_it_is_parsed(tmp_path, monkeypatch):
  big = LINEN + '#' * 3000 + '\n'
  _tree(tmp_path, {'big.py': big, 'good.py': LINEN})
  monkeypatch.setenv('LINEN2NNX_FILE_MAX_KB', '2')
  result = migrate([tmp_path], rules=RULES, write=True, jobs=1)
  assert _status(result) == {'big.py': 'failed', 'good.py': 'changed'}
  assert result.failed[0].error == 'too big to migrate (3 KB > 2 KB): split the file, --exclude it, or set ' \
                                   'LINEN2NNX_FILE_MAX_KB higher'
  assert (tmp_path / 'big.py').read_text() == big


def test_a_run_parses_with_libcst_only_the_files_that_import_flax_or_name_a_linen_class_of_it(tmp_path, monkeypatch):
  """transformers' __init__.py names flax only in strings: no rule can change it, and libcst never parses it."""
  base = 'import flax.linen as nn\n\n\nclass Base(nn.Module):\n  features: int = 2\n'
  user = 'from models import Base\n\n\nclass Head(Base):\n  pass\n'  # no flax import: a Linen class of the run
  strings = '_IMPORTS = {"modeling_flax_bert": ["FlaxBertModel"]}  # flax\n'
  broken = '# flax\nthis is not python (\n'
  _tree(tmp_path, {'models.py': base, 'user.py': user, 'strings.py': strings, 'broken.py': broken})
  parsed = []
  parse = cst.parse_module
  monkeypatch.setattr(cst, 'parse_module', lambda source, *a, **k: parsed.append(source) or parse(source, *a, **k))
  monkeypatch.chdir(tmp_path)
  result = migrate(['.'], rules=registry.ALL_RULES, jobs=1)
  status = _status(result)
  assert status['strings.py'] == 'unchanged' and status['broken.py'] == 'failed'
  assert not any(b'_IMPORTS' in (s if isinstance(s, bytes) else s.encode()) for s in parsed)
  assert any(b'class Head' in (s if isinstance(s, bytes) else s.encode()) for s in parsed)  # a class of the run
  assert 'does not parse' in next(o.error for o in result.files if o.path.endswith('broken.py'))


def test_parents_read_off_the_fields_are_libcst_s():
  """codemods.libcst_speedups's ParentNodeProvider gives what libcst's own visitor gives, on this project's code."""
  from libcst.metadata import MetadataWrapper, ParentNodeProvider
  from libcst.metadata.parent_node_provider import ParentNodeVisitor

  from codemods import libcst_speedups

  libcst_speedups.install()
  assert ParentNodeProvider.visit_Module.__module__ == 'codemods.libcst_speedups'

  class Recorder:
    def __init__(self):
      self.parents = {}

    def set_metadata(self, node, parent):
      self.parents[node] = parent

  root = pathlib.Path(__file__).resolve().parents[2]
  sources = [*sorted((root / 'codemods' / 'rules' / 'l2n002').glob('*.py'))[:6], *sorted(FIXTURES.glob('L2N002/*.py'))]
  for path in sources:
    module = cst.parse_module(path.read_bytes())
    expected = Recorder()
    module.visit(ParentNodeVisitor(expected))
    found = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    assert dict(found) == expected.parents, path


class _DropLinenRule(MigrationRule):
  CODE = 'L2N906'
  DESCRIPTION = 'asks for `import flax.linen as nn` and `from flax.linen import Dense` to go, as L2N002 does.'

  def visit_Module(self, node):
    self.remove_unused_import('flax.linen', asname='nn')
    self.remove_unused_import('flax.linen', 'Dense')


@pytest.mark.parametrize('code, kept', [
    ('x = 1\n', ''),
    ('x = nn.relu\n', 'import flax.linen as nn\n'),
    ('def f():\n  return Dense(3)\n', 'from flax.linen import Dense\n'),
    ('x = [nn for nn in range(3)]\ny = Dense\n',  # a name read anywhere keeps its import, whatever it binds there
     'import flax.linen as nn\nfrom flax.linen import Dense\n'),
])
def test_an_import_a_rule_asks_to_remove_goes_only_when_nothing_reads_its_name(code, kept):
  source = 'import flax.linen as nn\nfrom flax.linen import Dense\n' + code
  assert transform_source(source, [_DropLinenRule]).source == kept + code


class _TwiceRule(MigrationRule):
  CODE = 'L2N907'
  DESCRIPTION = 'appends one statement node twice: a node at two places of the tree.'

  def leave_Module(self, original_node, updated_node):
    twice = cst.SimpleStatementLine([cst.Expr(cst.parse_expression('needle(1)'))])
    return updated_node.with_changes(body=[*updated_node.body, twice, twice])


class _CallLinesRule(MigrationRule):
  CODE = 'L2N908'
  DESCRIPTION = 'records the line of each call it visits, from the metadata.'
  lines: list[int] = []

  def visit_Call(self, node):
    _CallLinesRule.lines.append(self.get_metadata(PositionProvider, node).start.line)


def test_a_node_a_rule_puts_at_two_places_has_each_place_s_metadata_in_the_next_rule():
  _CallLinesRule.lines = []
  result = transform_source('import flax\n', [_TwiceRule, _CallLinesRule])
  assert result.source == 'import flax\nneedle(1)\nneedle(1)\n'
  assert _CallLinesRule.lines == [2, 3]
