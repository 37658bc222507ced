"""Loading the user's files for `verify` / `convert`: an examples file that does not import or whose function
raises is one line naming the file (exit 2), never a traceback; a field set in setup() is no constructor value."""

import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest
from flax import linen as nn
from flax import nnx

from codemods.ports import model_refs

NNX_MODEL = 'from flax import nnx\n\n\nclass Net(nnx.Module):\n  pass\n'


@pytest.mark.parametrize('body, message', [
    ('import no_such_models\n', "examples.py: it cannot be imported: ModuleNotFoundError: No module named "
                                "'no_such_models' (at examples.py:1)"),
    ('def net(:\n  pass\n', 'examples.py: it cannot be imported: SyntaxError at '),
    ('def net():\n  raise RuntimeError("no data")\n',
     'examples.py:net() raised RuntimeError: no data (at examples.py:2)'),
])
def test_verify_with_an_examples_file_that_fails_is_one_line_and_exit_2(tmp_path, body, message):
  (tmp_path / 'examples.py').write_text(body)
  (tmp_path / 'nnx_model.py').write_text(NNX_MODEL)
  run = subprocess.run([sys.executable, '-c', 'import sys; from codemods import cli; sys.exit(cli.main())',
                        'verify', '-', 'nnx_model.py:Net', '--examples', 'examples.py', '--example', 'net'],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, 'PYTHONPATH': str(pathlib.Path(__file__).parents[3])})
  assert run.returncode == 2, run.stderr
  assert message in run.stderr and run.stderr.count('\n') == 1 and 'Traceback' not in run.stderr


class _Scaled(nn.Module):
  width: int
  hidden: int = dataclasses.field(init=False)

  def setup(self):
    self.hidden = 2 * self.width


class _ScaledNNX(nnx.Module):
  def __init__(self, width: int, hidden: int = 0, *, rngs: nnx.Rngs):
    self.width, self.hidden = width, hidden


def test_a_field_set_in_setup_is_not_read_off_the_unbound_linen_model():
  """`hidden` has no value before setup() ran: the NNX constructor keeps its own default."""
  kwargs, origins = model_refs.nnx_constructor_kwargs(_ScaledNNX, _Scaled(4), (), {}, seed=0)
  assert set(kwargs) == {'width', 'rngs'} and kwargs['width'] == 4
  assert origins[0] == 'width=4: the Linen field of the same name'
