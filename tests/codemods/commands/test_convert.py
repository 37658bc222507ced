"""`linen2nnx convert` on the bundled MLP: both directions, and refusals that write nothing."""

import pathlib
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from codemods import cli

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / 'fixtures' / 'examples'
MODELS = [f'--linen={EXAMPLES}/mlp_linen.py:MLP', f'--nnx={EXAMPLES}/mlp_nnx.py:MLP', '--input', 'x=float32[3,8]']


@pytest.fixture(scope='module')
def example_classes():
  sys.path.insert(0, str(EXAMPLES))
  import mlp_linen
  import mlp_nnx

  return mlp_linen.MLP, mlp_nnx.MLP


@pytest.fixture()
def linen_checkpoint(tmp_path, example_classes):
  linen_class, _ = example_classes
  variables = linen_class().init(jax.random.key(7), np.ones((3, 8), np.float32))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / 'linen', variables)
  return tmp_path / 'linen', variables


def test_converts_both_ways(tmp_path, linen_checkpoint, example_classes, capsys):
  src, variables = linen_checkpoint
  linen_class, nnx_class = example_classes
  assert cli.main(['convert', str(src), str(tmp_path / 'nnx'), *MODELS]) == 0
  # Restored as the flax guide does, into the state of a model built with its own Rngs.
  model = nnx_class(8, rngs=nnx.Rngs(0))
  with ocp.StandardCheckpointer() as checkpointer:
    state = checkpointer.restore(tmp_path / 'nnx', nnx.state(model, nnx.Not(nnx.RngState)))
  nnx.update(model, state)
  x = jax.random.normal(jax.random.key(1), (3, 8))
  np.testing.assert_array_equal(model(x), linen_class().apply(variables, x))

  assert cli.main(['convert', str(tmp_path / 'nnx'), str(tmp_path / 'back'), '--to', 'linen', *MODELS]) == 0
  with ocp.StandardCheckpointer() as checkpointer:
    back = checkpointer.restore(tmp_path / 'back')
  jax.tree.map(np.testing.assert_array_equal, back, jax.device_get(variables))
  assert 'wrote' in capsys.readouterr().out


def test_existing_destination_is_a_usage_error(tmp_path, linen_checkpoint, capsys):
  src, _ = linen_checkpoint
  (tmp_path / 'taken').mkdir()
  assert cli.main(['convert', str(src), str(tmp_path / 'taken'), *MODELS]) == 2
  assert 'exists' in capsys.readouterr().err


def test_checkpoint_of_another_model_writes_nothing(tmp_path, linen_checkpoint, capsys):
  src, _ = linen_checkpoint
  argv = ['convert', str(src), str(tmp_path / 'nnx'), *MODELS, '--linen-kwargs', '{"hidden": 32}']
  assert cli.main(argv) == 1
  assert 'nothing written' in capsys.readouterr().err
  assert not (tmp_path / 'nnx').exists()
