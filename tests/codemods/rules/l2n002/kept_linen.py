"""What the lifted-transform tests check of a class M left as Linen that lifts a class of its file: that class stays
Linen with it (M would otherwise run an NNX module through a Linen transform)."""

from codemods.report import Entry
from codemods.report import Transformed


def kept_with(result: Transformed, child: str) -> Entry:
  """The TODO of the class M left as Linen, after checking that `child`, which M uses, was kept Linen with it."""
  todos = {e.message.split(' ')[1]: e for e in result.entries if e.kind == 'todo'}
  assert set(todos) == {'M', child}, todos
  assert f'class {child}(nn.Module)' in result.source
  assert todos[child].message.startswith(f'class {child} kept as Linen: the class M, left as Linen, uses it')
  return todos['M']
