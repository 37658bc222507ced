"""The run's decisions across files, taken once every file is migrated in memory (the engine's *decide* phase).

The rules decide one file at a time; `find_seams` (`analysis/seams.py`) then reads the migrated run
for uses of NNX classes that would break. `decide_run` turns them into decisions:

- a class this run converted that a Linen class of another file builds: that file is migrated again with the
  converted class's record (`imported_classes`), so that its class can build the NNX class in turn, or, staying
  Linen, wrap it with `nnx_bridge.to_linen`; only a class still building it the Linen way then keeps the converted
  class Linen, as below;
- a class this run converted that a Linen class builds or subclasses (in any file), or that a
  class attribute holds for code out of sight (`module_class = Block`, which transformers'
  PreTrainedModel builds with Linen's arguments and runs with `.init` / `.apply`), is kept as
  Linen: its file is migrated again with it in `kept_classes`, and the run is checked again, until
  no such use is left (the kept classes only grow, so this ends). Its reason names the class that builds it;
  where an earlier run named another that still builds it (its TODO is in the file), that one is named again
  (`_earlier_reason`): a run starting from the earlier run's output may keep the class in another round, for
  another of its builders, and a second run must change nothing;
- any other broken use (an NNX class built without the arguments its `__init__` requires, `.init`
  / `.apply` on one, a Linen class building an NNX class the run did not convert, or
  `getattr(models, name)` on a module where this run converted classes) gets a TODO
  right above its statement (`with_todos`), reported as an `L2N000` entry. A TODO already there is
  not added again, so that a second run changes nothing.
"""

from __future__ import annotations

import dataclasses
import re
import typing as tp

from codemods.analysis.seams import HELD_FOR_LINEN_CODE
from codemods.analysis.seams import LINEN_BUILDS_NNX
from codemods.analysis.seams import LINEN_SUBCLASSES_NNX
from codemods.analysis.seams import LOOKUP_BY_NAME
from codemods.analysis.seams import Seam
from codemods.analysis.seams import find_seams
from codemods.report import BUILT_BY_LINEN

SEAMS_CODE = 'L2N000'  # the code of the report entries for run-wide findings
_KEPT_FOR = re.compile(r'^[ \t]*# TODO\(linen2nnx\): class (?P<name>\w+) kept as Linen: (?P<reason>the class '
                       r'(?P<user>\w+) of (?P<file>\S+), which stays Linen, builds it); ', re.MULTILINE)
"""An earlier run's TODO keeping a class Linen because a Linen class of another file builds it."""
_KEPT_BY = {  # the uses of a class this run converted that keep it Linen -> how its user uses it
    LINEN_BUILDS_NNX: BUILT_BY_LINEN,
    LINEN_SUBCLASSES_NNX: 'which stays Linen, subclasses it',
    HELD_FOR_LINEN_CODE: 'which is no module, holds it in a class attribute for code that builds it with a Linen '
                         "module's arguments and runs it with .init / .apply",
}


@dataclasses.dataclass(frozen=True)
class RunDecision:
  """What to do next: files to migrate again with the records of other files' converted classes that their Linen
  classes build (by file: those files), else classes to keep Linen (by file, with why), else the TODOs to add and
  report (by file)."""

  keep: dict[str, dict[str, str]]
  todos: dict[str, list[Seam]]
  retry: dict[str, set[str]] = dataclasses.field(default_factory=dict)


def decide_run(sources: tp.Mapping[str, str], converted: tp.Mapping[str, tp.Collection[str]],
               roots: tp.Sequence[str] = (), given: tp.Mapping[str, tp.Collection[str]] = {}) -> RunDecision:
  """The decision for the migrated .py `sources` (path -> code); `converted`: the classes this run converted,
  by file; `given`: the files whose records each file was last migrated with."""
  keep: dict[str, dict[str, str]] = {}
  todos: dict[str, list[Seam]] = {}
  retry: dict[str, set[str]] = {}
  for seam in find_seams(sources, roots):
    name = seam.target.rpartition('.')[2]
    ours = name in converted.get(seam.target_path, ())
    if seam.kind == LINEN_BUILDS_NNX and ours and seam.path != seam.target_path \
        and seam.target_path not in given.get(seam.path, ()):  # its file has not seen the converted class yet
      retry.setdefault(seam.path, set()).add(seam.target_path)
    elif seam.kind in _KEPT_BY and ours:
      keep.setdefault(seam.target_path, {}).setdefault(
          name, _earlier_reason(sources, seam.target_path, name)
          or f'the class {seam.user} of {seam.path}, {_KEPT_BY[seam.kind]}')
    elif seam.kind == HELD_FOR_LINEN_CODE:  # an NNX class the user wrote, held on purpose
      continue
    elif seam.kind == LOOKUP_BY_NAME and not converted.get(seam.target_path):  # a module of NNX classes the user wrote
      continue
    else:
      todos.setdefault(seam.path, []).append(seam)
  if retry:
    return RunDecision({}, {}, retry)
  return RunDecision(keep, {} if keep else todos)


def _earlier_reason(sources: tp.Mapping[str, str], path: str, name: str) -> str | None:
  """The reason an earlier run's TODO in `path` gives for keeping the class `name` Linen because a class of another
  file of the run builds it, when that class still names it in its body; else None."""
  for found in _KEPT_FOR.finditer(sources.get(path, '')):
    user_source = sources.get(found['file'])
    if found['name'] != name or user_source is None:
      continue
    body = re.search(rf'^class {re.escape(found["user"])}\b.*?(?=^\S|\Z)', user_source, re.MULTILINE | re.DOTALL)
    if body is not None and re.search(rf'\b{re.escape(name)}\b', body[0]):
      return found['reason']
  return None


def with_todos(source: str, seams: tp.Sequence[Seam]) -> str:
  """`source` with each seam's TODO line right above its statement, at its indentation, unless already there."""
  lines = source.splitlines(keepends=True)
  for line, group in sorted(_by_line(seams).items(), reverse=True):
    text = lines[line - 1]
    indent = text[:len(text) - len(text.lstrip())]
    newline = '\r\n' if text.endswith('\r\n') else '\n'
    lines[line - 1:line - 1] = [f'{indent}{seam.todo}{newline}' for seam in group if not seam.flagged]
  return ''.join(lines)


def _by_line(seams: tp.Sequence[Seam]) -> dict[int, list[Seam]]:
  found: dict[int, list[Seam]] = {}
  for seam in seams:
    if all(s.todo != seam.todo for s in found.get(seam.line, ())):
      found.setdefault(seam.line, []).append(seam)
  return found
