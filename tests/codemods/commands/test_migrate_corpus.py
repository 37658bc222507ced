"""`linen2nnx migrate` over real Linen code: Hugging Face transformers 4.46.3's Flax model files (installed from the
package registry, `.ci/run` does it). The promise under test: no file fails, a second run changes nothing, and no
use of an NNX class in the migrated tree can break without a TODO right above it; with `--unsafe-fixes` too."""

import importlib.util
import pathlib
import shutil

import pytest

from codemods import rules as registry
from codemods.analysis.seams import find_seams
from codemods.engine import migrate
from codemods.options import MigrationOptions

# Files that together hold what the corpus is known for: keyword arguments out of field order (bert, roberta, a
# copy of bert's classes), a Linen model file importing another's classes (mt5 from t5), BatchNorm and Conv
# stages (resnet), a decoder with a cache (gpt2), a statement only an unsafe fix converts (opt builds a subclass of a
# Linen layer in its decoder's setup()).
MODELS = ('bert', 'roberta', 'gpt2', 't5', 'mt5', 'resnet', 'opt')


@pytest.fixture(scope='module')
def corpus(tmp_path_factory) -> pathlib.Path:
  spec = importlib.util.find_spec('transformers')
  assert spec is not None and spec.origin, 'transformers==4.46.3 must be installed (pip install transformers==4.46.3)'
  package = pathlib.Path(spec.origin).parent
  root = tmp_path_factory.mktemp('hf')
  for model in MODELS:
    source = package / 'models' / model / f'modeling_flax_{model}.py'
    target = root / 'transformers' / 'models' / model / source.name
    target.parent.mkdir(parents=True)
    shutil.copy(source, target)
    (target.parent / '__init__.py').write_text('')
  for folder in (root / 'transformers', root / 'transformers' / 'models'):
    (folder / '__init__.py').write_text('')
  return root


@pytest.mark.slow
@pytest.mark.parametrize('unsafe', [False, True], ids=['safe', 'unsafe-fixes'])
def test_hf_flax_models_migrate_with_no_failure_converge_and_leave_no_silent_seam(corpus, monkeypatch, tmp_path,
                                                                                  unsafe):
  tree = tmp_path / 'tree'
  shutil.copytree(corpus, tree)
  monkeypatch.chdir(tree)
  options = MigrationOptions(unsafe_fixes=unsafe)
  first = migrate(['transformers'], rules=registry.ALL_RULES, write=True, jobs=2, options=options)
  assert [(o.path, o.error) for o in first.failed] == []
  assert first.changed and first.fates()['converted'] > 0
  assert (first.fates()['unsafe_fixes'] > 0) == unsafe
  second = migrate(['transformers'], rules=registry.ALL_RULES, write=False, jobs=2, options=options)
  assert [o.path for o in second.changed] == [] and second.failed == []
  assert second.fates()['todos'] == first.fates()['todos']
  sources = {str(p): p.read_text() for p in pathlib.Path('transformers').rglob('*.py')}
  silent = [s for s in find_seams(sources, [str(tree)]) if not s.flagged]
  assert silent == []
