"""decide_run: which broken uses keep a converted class Linen and which get a TODO; a held NNX class the user wrote
stays as it is."""

from codemods.decisions import decide_run
from tests.codemods.analysis.test_seams import HOLDERS
from tests.codemods.analysis.test_seams import LAYERS


def _decide(tmp_path, converted: set[str]):
  sources = {'pkg/__init__.py': '', 'pkg/layers.py': LAYERS, 'pkg/wrappers.py': HOLDERS}
  paths = {name: str(tmp_path / name) for name in sources}
  return decide_run({paths[name]: text for name, text in sources.items()},
                    {paths['pkg/layers.py']: converted}, [str(tmp_path)]), paths


def test_a_class_this_run_converted_and_a_wrapper_holds_is_kept_linen(tmp_path):
  decision, paths = _decide(tmp_path, {'Block'})
  assert decision.keep == {paths['pkg/layers.py']: {'Block': (
      f'the class BlockModel of {paths["pkg/wrappers.py"]}, which is no module, holds it in a class attribute for code '
      "that builds it with a Linen module's arguments and runs it with .init / .apply")}}
  assert decision.todos == {}


def test_a_held_nnx_class_the_user_wrote_is_neither_kept_nor_flagged(tmp_path):
  decision, _ = _decide(tmp_path, set())
  assert decision.keep == {} and decision.todos == {}
