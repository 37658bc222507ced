"""Cross-file class hierarchies: a Linen class whose base is a Linen class of another file of the run."""

import importlib
import pathlib
import pickle
import sys

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.engine import migrate
from codemods.analysis.hierarchy import build_hierarchy

RULES = registry.select_rules(['L2N002'])
BASE = '''\
import flax.linen as nn


class Base(nn.Module):
  """Helpers shared by the models of the project."""

  def activation(self, x):
    return nn.relu(x)
'''
MODEL = '''\
import flax.linen as nn

from proj.base import Base


class MLP(Base):
  features: int = 8

  @nn.compact
  def __call__(self, x):
    x = self.activation(nn.Dense(self.features)(x))
    return nn.Dense(1)(x)
'''
OTHER = '''\
from proj.model import MLP


class LeakyMLP(MLP):

  def activation(self, x):
    return x * 2
'''
TODO = ('# TODO(linen2nnx): class LeakyMLP left as Linen: it inherits fields or submodules from proj.model.MLP '
        '(another file), which is not converted with it')


def _project(root: pathlib.Path, files: dict[str, str]) -> list[pathlib.Path]:
  paths = []
  for name, content in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    paths.append(path)
  return paths


@pytest.fixture()
def imports(tmp_path, monkeypatch):
  """Imports modules from a directory on sys.path, then forgets them (and the package)."""
  before = set(sys.modules)

  def load(root: pathlib.Path, name: str):
    monkeypatch.syspath_prepend(str(root))
    for module in [m for m in sys.modules if m == 'proj' or m.startswith('proj.')]:
      del sys.modules[module]
    importlib.invalidate_caches()
    return importlib.import_module(name)

  yield load
  for name in set(sys.modules) - before:  # the project's modules only: flax, jax and the stdlib stay loaded
    if str(getattr(sys.modules[name], '__file__', None) or '').startswith(str(tmp_path)):
      del sys.modules[name]


def _migrated(root: pathlib.Path, order: list[pathlib.Path], jobs: int) -> dict[str, tuple]:
  """Each file's status, report entries and migrated text, by its path in the project."""
  result = migrate(order, rules=RULES, write=True, jobs=jobs)
  return {pathlib.Path(o.path).relative_to(root).as_posix(): (o.status, o.entries, pathlib.Path(o.path).read_text())
          for o in result.files}


def test_a_subclass_of_a_plain_base_of_another_file_is_converted_whatever_the_order_and_jobs(tmp_path, imports):
  linen_root, runs = tmp_path / 'linen', []
  files = {'proj/__init__.py': '', 'proj/base.py': BASE, 'proj/model.py': MODEL, 'proj/other.py': OTHER}
  _project(linen_root, files)
  for i, (reverse, jobs) in enumerate([(False, 1), (True, 2)]):
    root = tmp_path / f'run{i}'
    paths = _project(root, files)
    runs.append(_migrated(root, list(reversed(paths)) if reverse else paths, jobs))
  assert runs[0] == runs[1]
  status, text = {name: run[0] for name, run in runs[0].items()}, {name: run[2] for name, run in runs[0].items()}
  assert status == {'proj/__init__.py': 'skipped', 'proj/base.py': 'changed', 'proj/model.py': 'changed',
                    'proj/other.py': 'changed'}
  assert 'class Base(nnx.Module):' in text['proj/base.py'] and 'return nnx.relu(x)' in text['proj/base.py']
  assert 'class MLP(Base):' in text['proj/model.py'] and 'import flax.linen' not in text['proj/model.py']
  assert TODO in text['proj/other.py']

  nnx_model = imports(tmp_path / 'run0', 'proj.model').MLP(
      8, linear1_in_features=4, linear2_in_features=8, rngs=nnx.Rngs(0))
  assert isinstance(nnx_model, nnx.Module)
  importlib.import_module('proj.other')  # the subclass left as Linen with a TODO still imports
  linen_model = imports(linen_root, 'proj.model').MLP(8)
  x = jax.random.normal(jax.random.key(1), (3, 4))
  variables = linen_model.init(jax.random.key(2), x)
  report = nnx_bridge.compare(linen_model, variables, nnx_model, x)
  assert report.ok, report
  nnx_bridge.linen_to_nnx(variables, nnx_model, nnx_bridge.derive_mapping(linen_model, nnx_model, x))
  assert jnp.allclose(nnx_model(x), linen_model.apply(variables, x), atol=1e-6)
  linen_grads = jax.grad(lambda v: linen_model.apply(v, x).sum())(variables)['params']
  nnx_grads = nnx.grad(lambda m: m(x).sum())(nnx_model)
  assert jnp.allclose(nnx_grads['linear1']['kernel'][...], linen_grads['Dense_0']['kernel'], atol=1e-6)
  assert jnp.allclose(nnx_grads['linear2']['bias'][...], linen_grads['Dense_1']['bias'], atol=1e-6)


@pytest.mark.parametrize('base', [
    BASE.replace('  def activation', '  scale: float = 2.0\n\n  def activation'),
    BASE.replace('nn.relu(x)', 'nn.relu(nn.Dense(4)(x))'),
    BASE.replace('nn.relu(x)', "x + self.param('shift', nn.initializers.zeros, (4,))"),
], ids=['field', 'layer_in_a_helper', 'param_in_a_helper'])
def test_a_base_with_state_leaves_its_subclass_linen_with_a_todo(tmp_path, base):
  paths = _project(tmp_path, {'proj/__init__.py': '', 'proj/base.py': base, 'proj/model.py': MODEL})
  result = migrate(paths, rules=RULES, write=True, jobs=1)
  model = (tmp_path / 'proj/model.py').read_text()
  assert model.startswith(MODEL.split('class')[0])
  assert ('# TODO(linen2nnx): class MLP left as Linen: it inherits fields or submodules from proj.base.Base '
          '(another file), which is not converted with it\nclass MLP(Base):') in model
  assert {pathlib.Path(o.path).name: o.status for o in result.files}['model.py'] == 'changed'


def test_relative_imports_and_a_file_that_does_not_parse(tmp_path):
  model = MODEL.replace('from proj.base import Base', 'from .base import Base')
  paths = _project(tmp_path, {'proj/__init__.py': '', 'proj/base.py': BASE, 'proj/model.py': model,
                              'proj/broken.py': 'import flax.linen as nn\nclass Broken(nn.Module:\n'})
  hierarchy = build_hierarchy({str(p): p.read_bytes() for p in paths})
  assert hierarchy.classes == {'proj.base.Base', 'proj.model.MLP'} and hierarchy.plain_bases == {'proj.base.Base'}
  assert pickle.loads(pickle.dumps(hierarchy)) == hierarchy
  result = migrate([tmp_path], rules=RULES, write=True, jobs=1)
  status = {pathlib.Path(o.path).name: (o.status, o.error) for o in result.files}
  assert status['broken.py'][0] == 'failed' and 'does not parse' in status['broken.py'][1]
  assert status['model.py'][0] == 'changed'
  assert 'class MLP(Base):' in (tmp_path / 'proj/model.py').read_text()


def test_without_the_run_a_subclass_of_another_file_is_unchanged(tmp_path):
  path, = _project(tmp_path, {'proj/model.py': MODEL})
  assert [o.status for o in migrate([path], rules=RULES, jobs=1).files] == ['unchanged']
