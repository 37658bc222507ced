"""Positions in a rewritten source traced back to the original: report entries point at the user's code.

The rules run one after the other, each on the tree the rule before it left, so a rule sees its nodes
where they are after the earlier rewrites (an import added above a class moves the class down a
line). `PositionMap(original, rewritten)` maps a 1-based line and 1-based column of `rewritten`
back to `original`: lines are matched with difflib (unchanged lines map exactly), and within a
line an earlier rule changed, the column is matched character by character.
"""

from __future__ import annotations

import bisect
import difflib
import functools


class PositionMap:
  """Maps (line, column) of `rewritten` to (line, column) of `original`; both 1-based."""

  def __init__(self, original: str, rewritten: str) -> None:
    self._old = original.splitlines()
    self._new = rewritten.splitlines()
    matcher = difflib.SequenceMatcher(None, self._old, self._new, autojunk=False)
    self._blocks = matcher.get_opcodes()  # (tag, old start, old end, new start, new end), 0-based, in order
    self._starts = [block[3] for block in self._blocks]

  @property
  def identity(self) -> bool:
    return self._old == self._new

  def original(self, line: int, column: int) -> tuple[int, int]:
    """Where the character at (line, column) of the rewritten source was in the original."""
    if self.identity or not self._blocks:
      return line, column
    index = line - 1
    tag, old_start, old_end, new_start, new_end = self._blocks[max(bisect.bisect_right(self._starts, index) - 1, 0)]
    offset = index - new_start
    if tag == 'equal':
      return old_start + offset + 1, column
    if old_end == old_start:  # an inserted line: the original line after the insertion
      return min(old_start, len(self._old) - 1) + 1 if self._old else 1, 1
    old_index = min(old_start + offset, old_end - 1)  # a changed line: the matching characters tell the column
    new_text = self._new[index] if index < len(self._new) else ''
    return old_index + 1, _column(self._old[old_index], new_text, column)


@functools.lru_cache(maxsize=1024)
def _column(old: str, new: str, column: int) -> int:
  matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
  for tag, old_start, old_end, new_start, new_end in matcher.get_opcodes():
    if new_start <= column - 1 < new_end:
      return old_start + min(column - 1 - new_start, max(old_end - old_start - 1, 0)) + 1
  return column
