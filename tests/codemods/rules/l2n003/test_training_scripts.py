"""Whole Linen training scripts, migrated with `linen2nnx migrate`, train the same way in NNX.

Each script in `fixtures/training/` builds, initialises and trains a Linen model in its
`train()` and returns the per-step losses and the eval-mode output after training. Its
migrated version (all rules) must report no TODO, keep no Linen call, and, started from the
Linen run's initial variables (`tests/codemods/rules/training_parity.py`), give the same losses, the same eval
output and the same final parameters and batch statistics, within float32 tolerance.

`fixtures/training/cnn_project/` and `mnist_project/` are projects laid out as flax's examples are: the model in
`models.py`, the training in `train.py`, which imports it (`import models`) and builds a TrainState (a subclass
carrying the batch statistics, or flax's own) in `create_train_state`. `linen2nnx migrate` over the folder
converts the class in one file and the training code in the other.
"""

from __future__ import annotations

import ast
import pathlib
import runpy
import shutil
import subprocess
import sys
import typing as tp

import jax
import numpy as np
import pytest

from codemods import rules as registry
from codemods.engine import migrate
from codemods.options import STEP_STYLES
from codemods.options import MigrationOptions
from codemods.transform import transform_source
from tests.codemods.rules import training_parity as parity

ROOT = pathlib.Path(__file__).resolve().parents[4]
SCRIPTS = ROOT / 'fixtures' / 'training'
MODELS = {'mlp_classifier': 'MLPClassifier', 'cnn_batchnorm': 'SmallCNN', 'transformer_lm': 'TransformerLM'}

# float32 tolerance for losses, eval outputs and final leaves. A hand port (same ops as the Linen
# script) came out bit-identical on CPU; one computing the loss with another reduction order
# differed by up to 1e-7 in the losses and the parameters and 1e-6 in the eval logits after 20
# steps. A wrong port (an optimizer with weight decay, a BatchNorm momentum off) fails by far more.
TOL = dict(rtol=1e-5, atol=1e-6)

pytestmark = pytest.mark.slow  # about 40 s in all: XLA compiles on CPU and a subprocess run


def converter_result(name: str):
  return transform_source((SCRIPTS / f'{name}.py').read_text(), registry.ALL_RULES)


class Runs:
  """Each script's Linen run and its port's run, done once per argument set for the whole file."""

  def __init__(self, tmp: pathlib.Path) -> None:
    self.tmp = tmp
    self._globals: dict[tuple[str, str], dict] = {}
    self._runs: dict[tuple, tp.Any] = {}

  def _script(self, name: str, side: str) -> dict:
    if (name, side) not in self._globals:
      path = SCRIPTS / f'{name}.py'
      if side == 'nnx':
        path = self.tmp / f'{name}_nnx.py'
        path.write_text(converter_result(name).source)
      self._globals[name, side] = runpy.run_path(str(path), run_name=f'_l2n_{side}_{name}')
    return self._globals[name, side]

  def linen(self, name: str, **train_kwargs) -> tuple[parity.LinenRecord, list[float], jax.Array]:
    key = (name, 'linen', tuple(sorted(train_kwargs.items())))
    if key not in self._runs:
      with parity.recording_linen(MODELS[name]) as record:
        losses, output = self._script(name, 'linen')['train'](**train_kwargs)
        output = jax.block_until_ready(output)
      self._runs[key] = record, losses, output
    return self._runs[key]

  def nnx(self, name: str, **train_kwargs) -> tuple[parity.NNXRecord, list[float], jax.Array]:
    """The port's run, started from the Linen run's (same arguments) initial variables."""
    key = (name, 'nnx', tuple(sorted(train_kwargs.items())))
    if key not in self._runs:
      linen = self.linen(name, **train_kwargs)[0]
      with parity.transferring_into(MODELS[name], linen) as record:
        losses, output = self._script(name, 'nnx')['train'](**train_kwargs)
        output = jax.block_until_ready(output)
      self._runs[key] = record, losses, output
    return self._runs[key]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  return Runs(tmp_path_factory.mktemp('training'))


# --- What the converted source must not contain ------------------------------------------------


def linen_leftovers(source: str) -> list[str]:
  """Linen imports, `nn.Module`, `.apply` / `apply_fn` uses and `<model>.init(...)` calls left in `source`.

  A model is a name assigned a call of a class defined in the file; `tx.init(...)` of optax is fine.
  """
  tree = ast.parse(source)
  classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
  models = {
      target.id
      for node in ast.walk(tree)
      if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
      and isinstance(node.value.func, ast.Name) and node.value.func.id in classes
      for target in node.targets if isinstance(target, ast.Name)
  }
  found: list[tuple[int, str]] = []
  for node in ast.walk(tree):
    line = getattr(node, 'lineno', 0)
    if isinstance(node, ast.Import):
      found += [(line, f'import {a.name}') for a in node.names if a.name.startswith('flax.linen')]
    elif isinstance(node, ast.ImportFrom):
      if (node.module or '').startswith('flax.linen') or (
          node.module == 'flax' and any(a.name == 'linen' for a in node.names)):
        found.append((line, f'from {node.module} import ...'))
    elif isinstance(node, ast.Attribute):
      if node.attr in ('apply', 'apply_fn', 'init_with_output', 'lazy_init'):
        found.append((line, f'.{node.attr}'))
      elif node.attr == 'Module' and isinstance(node.value, ast.Name) and node.value.id == 'nn':
        found.append((line, 'nn.Module'))
      elif node.attr == 'init' and isinstance(node.value, ast.Name) and node.value.id in models:
        found.append((line, f'{node.value.id}.init'))
  return [f'line {line}: {text}' for line, text in sorted(found)]


# --- Tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize('name', MODELS)
def test_linen_script_trains(runs, name):
  kwargs = {'dropout_rate': 0.0} if name == 'mlp_classifier' else {}
  losses = runs.linen(name, **kwargs)[1]
  assert len(losses) >= 20 and all(np.isfinite(losses))
  assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.parametrize('name', MODELS)
def test_conversion_reports_no_todo_and_leaves_no_linen(name):
  result = converter_result(name)
  todos = [f'{e.line}:{e.column} {e.code}: {e.message}' for e in result.entries if e.kind == 'todo']
  assert not todos, '\n'.join(todos)
  leftovers = linen_leftovers(result.source)
  assert not leftovers, 'Linen code left in the converted script: ' + ', '.join(leftovers)


def test_leftover_check_finds_linen_code():
  source = (SCRIPTS / 'cnn_batchnorm.py').read_text()
  assert any('.apply' in f for f in linen_leftovers(source)) and any('nn.Module' in f for f in linen_leftovers(source))


@pytest.mark.parametrize('name', MODELS)
def test_converted_script_trains_to_the_same_losses_output_and_parameters(runs, name):
  # Dropout off here; test_mlp_dropout_... compares with dropout on.
  kwargs = {'dropout_rate': 0.0} if name == 'mlp_classifier' else {}
  (linen, linen_losses, linen_output), (ported, losses, output) = runs.linen(name, **kwargs), runs.nnx(name, **kwargs)
  parity.assert_close(linen_losses, losses, **TOL)
  parity.assert_close(linen_output, output, **TOL)
  parity.assert_same_state(linen.final, ported, **TOL)
  if name == 'cnn_batchnorm':  # the batch statistics are compared too
    assert any(path[-1] == 'mean' for path in parity.flat_state(ported.model))
  # The comparison means something: training moved every kernel and batch statistic. (Not
  # every leaf: a conv bias right before a BatchNorm has a zero gradient, up to rounding.)
  initial, final = parity.expected_state(linen.initial, ported), parity.expected_state(linen.final, ported)
  still = [p for p in final if p[-1] in ('kernel', 'mean', 'var') and np.array_equal(initial[p], final[p])]
  assert not still, f'training left these unchanged: {still}'


def test_mlp_dropout_trains_to_the_same_losses_with_the_same_masks(runs):
  # Linen derives each mask from the `rngs={'dropout': key}` passed to apply (folded in per module
  # path), NNX from the streams of the model's own nnx.Rngs: no choice of keys makes the random
  # masks agree, so the exact comparison gives both sides one deterministic mask (parity.same_masks).
  with parity.same_masks():
    linen, linen_losses, linen_output = runs.linen('mlp_classifier', dropout_rate=0.5)
    ported, losses, output = runs.nnx('mlp_classifier', dropout_rate=0.5)
  parity.assert_close(linen_losses, losses, **TOL)
  parity.assert_close(linen_output, output, **TOL)
  parity.assert_same_state(linen.final, ported, **TOL)


def test_mlp_dropout_with_random_masks_trains_both_ways_and_the_port_applies_masks(runs):
  linen_losses, ported_losses = runs.linen('mlp_classifier', dropout_rate=0.1)[1], runs.nnx('mlp_classifier', dropout_rate=0.1)[1]
  linen_off, ported_off = runs.linen('mlp_classifier', dropout_rate=0.0)[1], runs.nnx('mlp_classifier', dropout_rate=0.0)[1]
  for losses in (linen_losses, ported_losses):
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
  assert not np.allclose(linen_losses, linen_off)
  assert not np.allclose(ported_losses, ported_off), 'the NNX port trains as if dropout were off'


def test_converted_script_runs_as_main(tmp_path):
  # One script is enough to show a port stands alone (the CNN's port runs in-process above).
  path = tmp_path / 'mlp_classifier.py'
  path.write_text(converter_result('mlp_classifier').source)
  done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'loss' in done.stdout


# --- Projects of two files: models.py and train.py ----------------------------------------------------------

# Each project's model class, and lines its migrated train.py must hold: the factory builds the model where the
# Linen code built it, with the sizes the example input of `init` gives (through convolutions, pooling and a
# flatten for the MNIST layout), and its caller unpacks the model and its optimizer.
PROJECTS = {
    'cnn_project': ('CNN', '  model = models.CNN(num_classes=4, conv1_in_features=1, rngs=nnx.Rngs(rng))',
                    '  model, optimizer = create_train_state(jax.random.key(seed), 0.05, 0.9)'),
    'mnist_project': ('CNN', '  cnn = models.CNN(conv1_in_features=1, linear1_in_features=256, rngs=nnx.Rngs(rng))',
                      '  cnn, optimizer = create_train_state(jax.random.key(seed), 0.05, 0.9)'),
    # Dropout on in training, off in decoding: the decode-mode view is made after model.train(), so it gets its own
    # decoder.eval() (nnx.with_attributes copies the modules).
    'lm_project': ('TransformerLM', '  model = models.TransformerLM(VOCAB, rngs=nnx.Rngs(rng))',
                   '  decoder = nnx.with_attributes(model, decode=True)', '  decoder.eval()'),
}


def _run_project(folder: pathlib.Path) -> tuple[list[float], jax.Array]:
  """`train()` of `folder/train.py`, with `import models` finding `folder/models.py`."""
  sys.path.insert(0, str(folder))
  sys.modules.pop('models', None)
  try:
    losses, output = runpy.run_path(str(folder / 'train.py'), run_name=f'_l2n_{folder.name}')['train']()
    return losses, jax.block_until_ready(output)
  finally:
    sys.path.remove(str(folder))
    sys.modules.pop('models', None)


@pytest.fixture(scope='module')
def linen_project_runs() -> dict[str, tuple[parity.LinenRecord, list[float], jax.Array]]:
  runs = {}
  for name, (model_class, *_) in PROJECTS.items():
    with parity.same_masks(), parity.recording_linen(model_class) as linen:  # one dropout mask on both sides
      losses, output = _run_project(SCRIPTS / name)
    runs[name] = linen, losses, output
  return runs


@pytest.mark.parametrize('step_style', STEP_STYLES)
@pytest.mark.parametrize('project', PROJECTS)
def test_a_two_file_project_migrates_across_files_and_trains_the_same(tmp_path, linen_project_runs, project,
                                                                       step_style):
  folder = tmp_path / project
  shutil.copytree(SCRIPTS / project, folder)
  result = migrate([folder], rules=registry.ALL_RULES, write=True, jobs=1,
                   options=MigrationOptions(step_style=step_style))
  todos = [f'{o.path}:{e.line} {e.message}' for o in result.files for e in o.entries if e.kind == 'todo']
  assert not todos, '\n'.join(todos)
  assert [o.status for o in result.files] == ['changed', 'changed']
  lines = (folder / 'train.py').read_text().splitlines()
  model_class, *expected = PROJECTS[project]
  assert all(line in lines for line in expected), '\n'.join(lines)
  assert not any(line.startswith('class TrainState') or 'train_state' in line for line in lines if 'import' in line)
  for name in ('models.py', 'train.py'):
    leftovers = linen_leftovers((folder / name).read_text())
    assert not leftovers, f'Linen code left in {name}: ' + ', '.join(leftovers)
  linen, linen_losses, linen_output = linen_project_runs[project]
  with parity.same_masks(), parity.transferring_into(model_class, linen) as ported:
    losses, output = _run_project(folder)
  parity.assert_close(linen_losses, losses, **TOL)
  parity.assert_close(linen_output, output, **TOL)
  parity.assert_same_state(linen.final, ported, **TOL)
  if project == 'cnn_project':  # the batch statistics are compared too
    assert any(path[-1] == 'mean' for path in parity.flat_state(ported.model))
  assert linen_losses[-1] < 0.95 * linen_losses[0], linen_losses
  again = migrate([folder], rules=registry.ALL_RULES, jobs=2, options=MigrationOptions(step_style=step_style))
  assert [o.status for o in again.files] == ['unchanged', 'unchanged']  # a second run changes nothing
