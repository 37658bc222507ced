"""Unified diffs that `git apply` and `patch -p1` accept, CRLF lines and missing final newlines included."""

from __future__ import annotations

import difflib
import re

NO_NEWLINE = '\\ No newline at end of file\n'
_LINE = re.compile(r'[^\n]*\n|[^\n]+$')


def unified_diff(old: str, new: str, path: str) -> str:
  """The diff from `old` to `new` with `a/PATH` and `b/PATH` headers; '' when they are equal."""
  if old == new:
    return ''
  lines = difflib.unified_diff(
      _LINE.findall(old), _LINE.findall(new), f'a/{path}', f'b/{path}'
  )
  out = []  # only '\n' ends a line: '\r', form feeds and the like stay inside it, as for git
  for line in lines:
    if line.endswith('\n'):
      out.append(line)
    else:  # the last line of a side without a final newline
      out.append(line + '\n' + NO_NEWLINE)
  return ''.join(out)
