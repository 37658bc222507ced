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
