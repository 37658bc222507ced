"""Report entries point at the line and column of the user's source, whatever imports earlier rules add."""

import json

from codemods import rules as registry
from codemods.notebooks import transform_notebook
from codemods.positions import PositionMap
from codemods.transform import transform_source

# L2N001 adds `from flax import nnx` above the class before L2N002 sees the file.
SOURCE = '''import flax.linen as nn


class Head(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3, kernel_init=nn.initializers.zeros)(x)
'''


def _at(source: str, line: int, column: int) -> str:
  return source.splitlines()[line - 1][column - 1:]


def test_entries_point_at_the_original_source_after_an_import_is_added_above():
  result = transform_source(SOURCE, registry.ALL_RULES)
  assert 'from flax import nnx' in result.source
  texts = {(e.code, e.message.split(':')[0]): _at(SOURCE, e.line, e.column) for e in result.entries}
  assert texts[('L2N002', 'class Head(nn.Module) -> nnx.Module with __init__(*, linear_in_features')].startswith(
      'class Head(nn.Module)')
  assert texts[('L2N002', 'new constructor argument linear_in_features')].startswith('nn.Dense(3')
  assert texts[('L2N001', 'nn.initializers.zeros -> nnx.initializers.zeros')].startswith('nn.initializers.zeros)')
  assert [c.line for c in result.classes] == [4]


def test_notebook_entries_land_in_their_cell_at_their_line():
  cells = [
      {'cell_type': 'markdown', 'metadata': {}, 'source': ['# A model\n']},
      {'cell_type': 'code', 'metadata': {}, 'outputs': [], 'execution_count': None,
       'source': ['import flax.linen as nn\n']},
      {'cell_type': 'code', 'metadata': {}, 'outputs': [], 'execution_count': None, 'source': SOURCE.splitlines(True)[3:]},
  ]
  data = json.dumps({'cells': cells, 'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}).encode()
  result = transform_notebook(data, registry.ALL_RULES)
  cell = ''.join(cells[2]['source'])
  found = {e.message.split(':')[0]: (e.cell, _at(cell, e.line, e.column)) for e in result.entries}
  assert found['nn.initializers.zeros -> nnx.initializers.zeros'] == (2, 'nn.initializers.zeros)(x)')
  assert found['new constructor argument linear_in_features'][0] == 2
  assert found['new constructor argument linear_in_features'][1].startswith('nn.Dense(3')
  assert [(c.cell, c.line) for c in result.classes] == [(2, 1)]


def test_position_map_follows_inserted_removed_and_changed_lines():
  old = 'a = 1\nb = nn.x(2)\nc = 3\n'
  new = 'import y\na = 1\nb = nnx.x(2)\nc = 3\n'
  positions = PositionMap(old, new)
  assert positions.original(2, 1) == (1, 1)  # `a = 1` moved down one line
  assert positions.original(4, 5) == (3, 5)
  assert positions.original(3, 10) == (2, 9)  # `(2)` of the changed line: one character to the left
  assert positions.original(1, 1) == (1, 1)  # the inserted import: the line after it
  assert PositionMap(old, old).original(2, 7) == (2, 7)
  assert PositionMap(new, old).original(1, 1) == (2, 1)  # a removed line: what follows moves up
