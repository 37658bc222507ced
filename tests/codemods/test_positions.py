"""Report entries point at the line and column of the user's source, whatever imports earlier rules add."""

import difflib
import json
import pathlib
import random

from codemods import positions
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


def _edited(lines: list[str], seed: int) -> list[str]:
  """`lines` with random lines inserted, deleted, changed and duplicated, as rules and people edit code."""
  rng = random.Random(seed)
  edited = list(lines)
  for _ in range(rng.randint(1, 40)):
    at = rng.randrange(len(edited) + 1)
    kind = rng.choice(['insert', 'delete', 'change', 'repeat'])
    if kind == 'insert':
      edited.insert(at, f'  x_{rng.randrange(5)} = nnx.y(x)')
    elif kind == 'delete' and at < len(edited):
      del edited[at]
    elif kind == 'change' and at < len(edited):
      edited[at] = edited[at].replace('nn.', 'nnx.') + '  # changed'
    elif kind == 'repeat' and at < len(edited):
      edited[at:at] = edited[at:at + rng.randint(1, 6)]
  return edited


def test_matching_blocks_are_difflibs_on_code():
  """On code (this package's own files, edited at random) the linear-time match is difflib's over the whole texts."""
  files = sorted(pathlib.Path(positions.__file__).parent.rglob('*.py'))[:25]
  for seed, path in enumerate(files):
    old = path.read_text().splitlines()
    new = _edited(old, seed)
    want = [tuple(b) for b in difflib.SequenceMatcher(None, old, new, autojunk=False).get_matching_blocks() if b.size]
    assert positions.matching_blocks(old, new) == want, path


def test_matching_blocks_of_a_big_repetitive_file_are_equal_runs_in_order():
  """A gap too big for difflib and without unique lines (generated code: one block repeated) still maps: every
  block is equal lines, in order, and the unchanged head and tail of the file are matched."""
  block = ['class Layer(nn.Module):', '  @nn.compact', '  def __call__(self, x):', '    return nn.Dense(4)(x)', '']
  old = block * 2000
  new = ['from flax import nnx', *block[:3], '    return nnx.Linear(4, 4, rngs=rngs)(x)', *(block * 1999), '# end']
  blocks = positions.matching_blocks(old, new)
  for start, new_start, size in blocks:
    assert old[start:start + size] == new[new_start:new_start + size]
  assert all(a[0] + a[2] <= b[0] and a[1] + a[2] <= b[1] for a, b in zip(blocks, blocks[1:]))
  assert sum(size for *_, size in blocks) >= len(old) - len(block)
  mapped = PositionMap('\n'.join(old), '\n'.join(new))
  assert mapped.original(len(new) - 2, 5) == (len(old) - 1, 5)  # the last `return`: the text drops the last empty line
