"""Positions in a rewritten source traced back to the original: report entries point at the user's code.

The rules run one after the other, each on the tree the rule before it left, so a rule sees its nodes
where they are after the earlier rewrites (an import added above a class moves the class down a
line). `PositionMap(original, rewritten)` maps a 1-based line and 1-based column of `rewritten`
back to `original`: lines are matched (unchanged lines map exactly), and within a line an earlier
rule changed, the column is matched character by character with difflib.

Lines are matched in about linear time in the file size, patience-diff style, since difflib over all
the lines is quadratic (minutes for a 0.5 MB file): the lines that occur once in each text, kept in the
same order (the longest increasing subsequence of their positions), anchor the match; each anchor
grows over the equal lines around it; and difflib matches only the gaps left between the grown anchors,
which are small in code. A gap too big for difflib is matched the same way with the lines unique
within it, or else, with none, by walking both sides and skipping short differences. On
code, where the stretches between gaps hold a unique line (a `def`, a `class`, a name), the result is
difflib's over the whole texts.
"""

from __future__ import annotations

import bisect
import collections
import difflib
import functools
import heapq
import typing as tp

DIFFLIB_CELLS = 250_000
"""The largest gap difflib matches, as its lines in the original times its lines in the rewritten text: two
500-line gaps take a few milliseconds."""
RESYNC_WINDOW = 32
"""How far past a difference `_resynced_runs` looks for equal lines, on both sides together."""

Block = tuple[int, int, int]
"""A run of equal lines: its start in the original, its start in the rewritten text, its length; 0-based."""
_Gap = tuple[int, int, int, int]  # lines [start, end) of the original, then [start, end) of the rewritten text


class PositionMap:
  """Maps (line, column) of `rewritten` to (line, column) of `original`; both 1-based."""

  def __init__(self, original: str, rewritten: str) -> None:
    self._old = original.splitlines()
    self._new = rewritten.splitlines()
    self._identity = self._old == self._new
    blocks = [(0, 0, len(self._old))] if self._identity else matching_blocks(self._old, self._new)
    self._blocks = _opcodes(blocks, len(self._old), len(self._new))  # (tag, old start, old end, new start, new end)
    self._starts = [block[3] for block in self._blocks]

  @property
  def identity(self) -> bool:
    return self._identity

  def original(self, line: int, column: int) -> tuple[int, int]:
    """Where the character at (line, column) of the rewritten source was in the original."""
    if self._identity or not self._blocks:
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


def matching_blocks(old: tp.Sequence[str], new: tp.Sequence[str]) -> list[Block]:
  """The runs of equal lines of `old` and `new`, in order, adjacent ones merged: difflib's `get_matching_blocks`
  less its final empty block where the texts are code, in about linear time whatever they are."""
  merged: list[Block] = []
  for start, new_start, size in _runs(old, new):
    if merged and merged[-1][0] + merged[-1][2] == start and merged[-1][1] + merged[-1][2] == new_start:
      merged[-1] = (merged[-1][0], merged[-1][1], merged[-1][2] + size)
    elif size:
      merged.append((start, new_start, size))
  return merged


def _runs(old: tp.Sequence[str], new: tp.Sequence[str]) -> tp.Iterator[Block]:
  """The equal runs, in order: a stack of gaps still to match and runs found, so that thousands of gaps do not
  recurse."""
  stack: list[tuple[bool, tp.Any]] = [(False, (0, len(old), 0, len(new)))]
  while stack:
    is_run, item = stack.pop()
    if is_run:
      yield item
      continue
    old_lo, old_hi, new_lo, new_hi = item
    if old_lo == old_hi or new_lo == new_hi:
      continue
    if (old_hi - old_lo) * (new_hi - new_lo) <= DIFFLIB_CELLS:
      yield from _difflib_runs(old, new, item)
      continue
    runs = _anchored_runs(old, new, item) or _resynced_runs(old, new, item)
    if not runs:  # nothing to anchor on: a changed block
      continue
    gaps = [(i_end, i, j_end, j) for (i_end, j_end), (i, j) in zip(
        [(old_lo, new_lo), *((i + size, j + size) for i, j, size in runs)],
        [*((i, j) for i, j, _ in runs), (old_hi, new_hi)])]
    stack.append((False, gaps[-1]))
    for run, gap in reversed(list(zip(runs, gaps))):  # pushed last to first, so they pop first to last
      stack.extend([(True, run), (False, gap)])


def _difflib_runs(old: tp.Sequence[str], new: tp.Sequence[str], gap: _Gap) -> list[Block]:
  old_lo, old_hi, new_lo, new_hi = gap
  matcher = difflib.SequenceMatcher(None, old[old_lo:old_hi], new[new_lo:new_hi], autojunk=False)
  return [(old_lo + i, new_lo + j, size) for i, j, size in matcher.get_matching_blocks() if size]


def _anchored_runs(old: tp.Sequence[str], new: tp.Sequence[str], gap: _Gap) -> list[Block]:
  """The runs of equal lines through the anchors of `gap`, as difflib would take them: each grown as far as the
  lines stay equal both ways, then where two neighbours claim the same lines, the longer one keeps them."""
  return _longest_first(_grown(old, new, gap, _anchors(old, new, gap)))


def _grown(old: tp.Sequence[str], new: tp.Sequence[str], gap: _Gap, anchors: list[tuple[int, int]]) -> list[Block]:
  """The longest run of equal lines through each anchor, within `gap`, one per run. A run can only overlap its
  neighbours: past the line of another anchor, it would be on that anchor's run (the line is unique)."""
  old_lo, old_hi, new_lo, new_hi = gap
  runs: list[Block] = []
  for i, j in anchors:
    if runs and i < runs[-1][0] + runs[-1][2]:  # on the run of the anchor before
      continue
    start, end = i, i + 1
    while start > old_lo and j - (i - start) > new_lo and old[start - 1] == new[j - (i - start) - 1]:
      start -= 1
    while end < old_hi and j + (end - i) < new_hi and old[end] == new[j + (end - i)]:
      end += 1
    runs.append((start, j - (i - start), end - start))
  return runs


def _longest_first(runs: list[Block]) -> list[Block]:
  """`runs` (in order, overlapping only their neighbours) made disjoint the way difflib's recursion would: the
  longest run (the first of equal ones) keeps its lines, and its neighbours lose the lines they share with it."""
  runs = list(runs)
  fixed = [False] * len(runs)
  heap = [(-size, start, index) for index, (start, _, size) in enumerate(runs)]
  heapq.heapify(heap)
  while heap:
    size, start, index = heapq.heappop(heap)
    if fixed[index] or (-size, start) != (runs[index][2], runs[index][0]):  # taken, or shortened since pushed
      continue
    fixed[index] = True
    for other in (index - 1, index + 1):
      if 0 <= other < len(runs) and not fixed[other]:
        runs[other] = _without(runs[other], runs[index])
        heapq.heappush(heap, (-runs[other][2], runs[other][0], other))
  return [run for run in runs if run[2] > 0]


def _without(run: Block, kept: Block) -> Block:
  """`run` less its lines before the end of `kept` (a run after it) or after its start (a run before it)."""
  start, new_start, size = run
  if start < kept[0]:
    cut = max(start + size - kept[0], new_start + size - kept[1], 0)
    return start, new_start, max(size - cut, 0)
  cut = max(kept[0] + kept[2] - start, kept[1] + kept[2] - new_start, 0)
  return start + cut, new_start + cut, max(size - cut, 0)


def _anchors(old: tp.Sequence[str], new: tp.Sequence[str], gap: _Gap) -> list[tuple[int, int]]:
  """The (old, new) positions of the lines that occur once in each side of `gap`, the longest subset of them in
  the same order on both sides (patience sorting: n log n)."""
  old_lo, old_hi, new_lo, new_hi = gap
  old_counts = collections.Counter(old[old_lo:old_hi])
  new_counts = collections.Counter(new[new_lo:new_hi])
  where = {new[j]: j for j in range(new_lo, new_hi) if new_counts[new[j]] == 1 and old_counts[new[j]] == 1}
  pairs = [(i, where[old[i]]) for i in range(old_lo, old_hi) if old[i] in where]
  tails: list[int] = []  # tails[k]: the smallest new position ending an increasing run of k + 1 pairs
  ends: list[int] = []  # the index in `pairs` of that pair
  before = [-1] * len(pairs)
  for index, (_, j) in enumerate(pairs):
    k = bisect.bisect_left(tails, j)
    before[index] = ends[k - 1] if k else -1
    tails[k:k + 1], ends[k:k + 1] = [j], [index]
  chain = []
  index = ends[-1] if ends else -1
  while index >= 0:
    chain.append(pairs[index])
    index = before[index]
  return chain[::-1]


def _resynced_runs(old: tp.Sequence[str], new: tp.Sequence[str], gap: _Gap) -> list[Block]:
  """The equal runs of a gap without anchors (no line unique to it: generated code, one block repeated), found by
  walking both sides: equal lines extend a run, and past a difference the walk goes on at the nearest pair of
  equal lines at most `RESYNC_WINDOW` lines ahead, or one line further on both sides."""
  old_lo, old_hi, new_lo, new_hi = gap
  runs: list[Block] = []
  i, j = old_lo, new_lo
  while i < old_hi and j < new_hi:
    if old[i] == new[j]:
      size = 1
      while i + size < old_hi and j + size < new_hi and old[i + size] == new[j + size]:
        size += 1
      runs.append((i, j, size))
      i, j = i + size, j + size
      continue
    i, j = next(
        ((i + a, j + distance - a) for distance in range(1, RESYNC_WINDOW + 1) for a in range(distance + 1)
         if i + a < old_hi and j + distance - a < new_hi and old[i + a] == new[j + distance - a]),
        (i + 1, j + 1),
    )
  return runs


def _opcodes(blocks: list[Block], old_size: int, new_size: int) -> list[tuple[str, int, int, int, int]]:
  """difflib's `get_opcodes` from the matching blocks: (tag, old start, old end, new start, new end), in order."""
  opcodes = []
  i = j = 0
  for start, new_start, size in [*blocks, (old_size, new_size, 0)]:
    tag = 'replace' if i < start and j < new_start else 'delete' if i < start else 'insert' if j < new_start else ''
    if tag:
      opcodes.append((tag, i, start, j, new_start))
    i, j = start + size, new_start + size
    if size:
      opcodes.append(('equal', start, i, new_start, j))
  return opcodes


@functools.lru_cache(maxsize=1024)
def _column(old: str, new: str, column: int) -> int:
  matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
  for tag, old_start, old_end, new_start, new_end in matcher.get_opcodes():
    if new_start <= column - 1 < new_end:
      return old_start + min(column - 1 - new_start, max(old_end - old_start - 1, 0)) + 1
  return column
