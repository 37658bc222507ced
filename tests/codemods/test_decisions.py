"""decide_run: which broken uses keep a converted class Linen and which get a TODO; a held NNX class, or a module of
NNX classes looked up by name, that the user wrote stays as it is."""

from codemods.decisions import decide_run
from tests.codemods.analysis.test_seams import HOLDERS
from tests.codemods.analysis.test_seams import LAYERS
from tests.codemods.analysis.test_seams import LOOKUP_TRAIN


def _decide(tmp_path, converted: set[str]):
  sources = {'pkg/__init__.py': '', 'pkg/layers.py': LAYERS, 'pkg/wrappers.py': HOLDERS, 'pkg/train.py': LOOKUP_TRAIN}
  paths = {name: str(tmp_path / name) for name in sources}
  return decide_run({paths[name]: text for name, text in sources.items()},
                    {paths['pkg/layers.py']: converted}, [str(tmp_path)]), paths


def test_a_class_this_run_converted_and_a_wrapper_holds_is_kept_linen(tmp_path):
  decision, paths = _decide(tmp_path, {'Block'})
  assert decision.keep == {paths['pkg/layers.py']: {'Block': (
      f'the class BlockModel of {paths["pkg/wrappers.py"]}, which is no module, holds it in a class attribute for code '
      "that builds it with a Linen module's arguments and runs it with .init / .apply")}}
  assert decision.todos == {}  # the class is kept Linen first; the run is checked again


def test_a_lookup_by_name_in_a_module_where_this_run_converted_classes_gets_a_todo(tmp_path):
  sources = {'pkg/__init__.py': '', 'pkg/layers.py': LAYERS, 'pkg/train.py': LOOKUP_TRAIN}
  paths = {name: str(tmp_path / name) for name in sources}
  decision = decide_run({paths[name]: text for name, text in sources.items()}, {paths['pkg/layers.py']: {'Block'}},
                        [str(tmp_path)])
  assert decision.keep == {}
  assert [(s.line, s.kind) for s in decision.todos[paths['pkg/train.py']]] == [(5, 'lookup-by-name')]


def test_a_held_nnx_class_the_user_wrote_is_neither_kept_nor_flagged(tmp_path):
  decision, _ = _decide(tmp_path, set())
  assert decision.keep == {} and decision.todos == {}


BLOCKS = '''from flax import nnx


class Block(nnx.Module):
  def __init__(self, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(2, 2, rngs=rngs)
'''
TOWERS = '''import flax.linen as nn

from pkg.blocks import Block


class Tower(nn.Module):
  def setup(self):
    self.block = Block()


class Mid(nn.Module):
  def setup(self):
    self.block = Block()
'''


def _kept_reason(tmp_path, earlier: str | None, towers: str = TOWERS) -> str:
  paths = {name: str(tmp_path / name) for name in ('pkg/__init__.py', 'pkg/blocks.py', 'pkg/towers.py')}
  todo = f'# TODO(linen2nnx): class Block kept as Linen: {earlier}; a converted class building it wraps it ' \
         'with nnx_bridge.from_linen\n' if earlier else ''
  sources = {paths['pkg/__init__.py']: '', paths['pkg/blocks.py']: BLOCKS.replace('class Block', todo + 'class Block'),
             paths['pkg/towers.py']: towers}
  decision = decide_run(sources, {paths['pkg/blocks.py']: {'Block'}}, [str(tmp_path)],
                        {paths['pkg/towers.py']: {paths['pkg/blocks.py']}})
  return decision.keep[paths['pkg/blocks.py']]['Block'].replace(str(tmp_path) + '/', '')


def test_a_class_kept_for_a_builder_an_earlier_run_named_keeps_that_reason(tmp_path):
  """diffusers: the first run keeps FlaxTransformer2DModel for the down block that builds it, a run from its output
  for the mid block: the reason an earlier run's TODO gives stays while that class still builds it."""
  assert _kept_reason(tmp_path, None) == 'the class Tower of pkg/towers.py, which stays Linen, builds it'
  earlier = f'the class Mid of {tmp_path}/pkg/towers.py, which stays Linen, builds it'
  assert _kept_reason(tmp_path, earlier) == 'the class Mid of pkg/towers.py, which stays Linen, builds it'
  gone = TOWERS.replace('class Mid(nn.Module):\n  def setup(self):\n    self.block = Block()',
                        'class Mid(nn.Module):\n  def setup(self):\n    self.block = None')
  assert gone != TOWERS  # Mid no longer builds it: the earlier reason is not true any more
  assert _kept_reason(tmp_path, earlier, gone) == 'the class Tower of pkg/towers.py, which stays Linen, builds it'
