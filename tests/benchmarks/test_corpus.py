"""`benchmarks/corpus.py`: `linen2nnx migrate` over public packages' Flax code, downloaded from the package registry.

The slow test runs the benchmark over the two smallest packages, evojax 0.2.17 and jax-md 0.2.29 (their wheels are
kept in `~/.cache/linen2nnx/corpus`; it skips when they are not there and the registry cannot be reached): no file
fails, a second run changes nothing, at least as many classes convert as today, and every class the harness
verifies is within `corpus.TOLERANCE` of its Linen original. The fast tests check the counting (the classes a
wrapper holds as `module_class` are counted apart, a malformed report is rejected) and what the slow test skips on.
"""

import io
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile

import pytest

from benchmarks import corpus

ROOT = pathlib.Path(__file__).resolve().parents[2]
SLOW_PACKAGES = ('evojax', 'jax-md')
# Measured on 2026-12-05 (codemod at eb0b5d5). A floor to raise when the codemod converts more, never to lower.
CONVERTED_FLOOR = {'evojax': 2, 'jax-md': 8}
VERIFIED_FLOOR = {'evojax': {'CNN'}, 'jax-md': {'ScaledSiLU'}}  # the classes the harness builds and verifies today
HELD = 'held in a class attribute for code that runs it as a Linen module'


def _report(**fates):
  files = fates.pop('files', [{'path': 'a.py', 'status': 'changed', 'classes': [{}]},
                              {'path': 'b.py', 'status': 'failed', 'classes': []}])
  document = {'fates': {'converted': 1, 'kept_linen': 3, 'bridged': 0, 'todos': 3,
                        'kept_because': {HELD: 2, 'used by a class that stays Linen': 1}}, 'files': files}
  document['fates'].update(fates)
  return document


def test_module_class_held_classes_are_counted_apart():
  fates = corpus.fates_of(_report())
  assert (fates.linen_classes, fates.converted, fates.held, fates.counted) == (4, 1, 2, 2)
  assert fates.percent == 50.0
  assert fates.kept_because == {'used by a class that stays Linen': 1}
  assert fates.failed_files == ('b.py',)
  assert corpus.fates_of(_report(converted=0, files=[], kept_because={HELD: 3})).percent is None


@pytest.mark.parametrize('document, message', [
    ([], 'expected an object'),
    ({'fates': {}}, 'expected an object'),
    (_report(converted=-1), 'fates.converted is -1'),
    (_report(todos=True), 'fates.todos is True'),
    (_report(kept_linen='3'), "fates.kept_linen is '3'"),
    (_report(kept_because=['used by a class that stays Linen']), 'not an object'),
    (_report(kept_because={HELD: 2}), 'the reasons count 2 classes kept Linen, fates.kept_linen says 3'),
    (_report(converted=2), 'the files record 1 converted classes'),
    (_report(files=[{'path': 'a.py', 'status': 'changed'}]), 'every file needs a "classes" list'),
])
def test_a_malformed_report_is_rejected(document, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    corpus.fates_of(document)


def test_the_reason_counted_apart_is_the_one_migrate_gives_a_module_class(tmp_path, monkeypatch):
  """transformers' wrappers in miniature: a class that is no module holds a Linen class as `module_class`."""
  from codemods import rules as registry
  from codemods.engine import migrate

  (tmp_path / 'models.py').write_text(
      'from flax import linen as nn\n\n\n'
      'class Block(nn.Module):\n  @nn.compact\n  def __call__(self, x):\n    return nn.Dense(4)(x)\n\n\n'
      'class Model:\n  module_class = Block\n')
  monkeypatch.chdir(tmp_path)
  fates = corpus.fates_of(migrate(['models.py'], rules=registry.ALL_RULES, write=False, jobs=1).to_json_dict())
  assert (fates.converted, fates.held, fates.counted) == (0, 1, 0)


def test_packages_are_selected_by_registry_or_import_name():
  assert [p.name for p in corpus.select('jax_md, evojax')] == ['jax-md', 'evojax']
  assert corpus.select('dopamine-rl')[0].wheel_prefix == 'dopamine_rl-4.1.2-'
  with pytest.raises(SystemExit, match='unknown packages'):
    corpus.select('flaxformer')


def test_flax_examples_come_from_the_source_archive_below_its_top_folder(tmp_path):
  """flax's example programs are only in its source archive (`flax-0.8.5/examples/...`): selected by their label,
  cached as the archive, extracted as `examples/...` with the files that mention flax and every `__init__.py`."""
  package = corpus.select('flax-examples')[0]
  assert (package.name, package.root, package.sdist) == ('flax', 'examples', True)
  archive = tmp_path / 'flax-0.8.5.tar.gz'
  files = {'flax-0.8.5/examples/__init__.py': b'', 'flax-0.8.5/examples/mnist/train.py': b'from flax import linen\n',
           'flax-0.8.5/examples/mnist/input_pipeline.py': b'import numpy\n', 'flax-0.8.5/flax/core.py': b'flax\n',
           'flax-0.8.5/examples/README.md': b'flax\n'}
  with tarfile.open(archive, 'w:gz') as tar:
    for name, data in files.items():
      member = tarfile.TarInfo(name)
      member.size = len(data)
      tar.addfile(member, io.BytesIO(data))
  assert corpus.cached_wheel(package, tmp_path) == archive
  tree = tmp_path / 'tree'
  assert corpus.extract(archive, package.root, tree, flax_only=True) == ['examples/__init__.py',
                                                                          'examples/mnist/train.py']
  assert (tree / 'examples/mnist/train.py').read_bytes() == b'from flax import linen\n'


def test_an_unreachable_registry_is_a_registry_error(tmp_path, monkeypatch):
  """What the slow test skips on: pip download with no registry it can reach, and no wheel in the cache."""
  monkeypatch.setenv('PIP_CONFIG_FILE', os.devnull)  # no configured indexes or wheel folders
  monkeypatch.setenv('PIP_INDEX_URL', 'http://127.0.0.1:9/simple')
  for name in ('PIP_EXTRA_INDEX_URL', 'PIP_FIND_LINKS'):
    monkeypatch.delenv(name, raising=False)
  with pytest.raises(corpus.RegistryError, match='pip download evojax==0.2.17 failed'):
    corpus.fetch_wheel(corpus.select('evojax')[0], tmp_path)
  (tmp_path / 'evojax-0.2.17-py3-none-any.whl').write_bytes(b'')
  assert corpus.fetch_wheel(corpus.select('evojax')[0], tmp_path).name == 'evojax-0.2.17-py3-none-any.whl'


@pytest.mark.slow
def test_registry_packages_migrate_without_failure_converge_and_verify(tmp_path):
  cache = corpus.DEFAULT_CACHE.expanduser()
  for package in corpus.select(','.join(SLOW_PACKAGES)):
    try:
      corpus.fetch_wheel(package, cache)
    except (corpus.RegistryError, OSError) as error:
      pytest.skip(f'the package registry cannot be reached: {error}')
  out = tmp_path / 'corpus.json'
  done = subprocess.run([sys.executable, str(ROOT / 'benchmarks' / 'corpus.py'), '--packages', ','.join(SLOW_PACKAGES),
                         '--cache', str(cache), '--json', str(out), '-j', '2'],
                        capture_output=True, text=True, timeout=900, cwd=tmp_path)
  assert done.returncode in (corpus.EXIT_OK, corpus.EXIT_PROBLEMS) and out.is_file(), done.stderr[-3000:]
  rows = {row['package']: row for row in json.loads(out.read_text())['packages']}
  for name in SLOW_PACKAGES:
    row = rows[name]
    assert row['error'] == '' and row['verified'], (name, row['error'])
    assert row['fates']['failed_files'] == [], name
    assert row['second_run_changes'] == [], name
    assert row['fates']['converted'] >= CONVERTED_FLOOR[name], (name, row['fates'])
    verified = {c['name']: c for c in row['classes'] if c['status'] == 'verified'}
    assert VERIFIED_FLOOR[name] <= set(verified), (name, sorted(verified))
    assert all(c['forward'] <= corpus.TOLERANCE and c['gradient'] <= corpus.TOLERANCE for c in verified.values())
    assert [(c['name'], c['reason']) for c in row['classes'] if c['status'] == 'failed'] == [], name
