"""`migrate --unsafe-fixes`: a class refused at one line of a method converts anyway, that line kept as written.

In the default (safe) mode a construct L2N002 has no automatic conversion for keeps its whole class Linen, and
the TODO names it at its line. With unsafe fixes, as with ruff's `--unsafe-fixes`, such a statement inside a
method is set aside: it is masked (a `pass` marker in its place, over as many lines), the file migrated again,
and so on while classes are refused at statements of their methods (at most `MAX_ROUNDS` times). Once a class
converts, each statement masked in it goes back where its marker ended up (setup() code moves into `__init__`),
as written, under `# TODO(linen2nnx): unsafe fix: ...` saying why L2N002 could not convert it, and the rules run
over the result once more, as a second run would (L2N001 rewrites the initializers of what came back). The class
is NNX then, but it may not run until each such line is rewritten by hand; the report counts them (`UNSAFE_FIX`). A
class that stays Linen anyway, or whose marker the conversion did not keep, gets its statements back unmasked and
stays Linen as in safe mode. A refusal at a class's head, a field, a decorator or a signature is no statement
of a method: its class stays Linen.
"""

from __future__ import annotations

import dataclasses
import re
import typing as tp

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, ImportItem
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, PositionProvider

from codemods.nodes import descendants
from codemods.positions import PositionMap
from codemods.report import UNSAFE_FIX, Entry, Transformed
from codemods.rule import TODO_PREFIX

MAX_ROUNDS = 8
"""How many times a file is migrated again with more statements masked, at most."""
_REFUSED = re.compile(r'class (\w+) left as Linen: (.*)', re.S)
_MARKER = re.compile(r'^([ \t]*)pass  # linen2nnx-masked-(\d+)[ \t]*(\r\n|\r|\n|$)', re.M)
_FILLER = re.compile(r'^[ \t]*# linen2nnx-masked-\d+[ \t]*(?:\r\n|\r|\n)', re.M)
_COMPOUND = (cst.If, cst.For, cst.While, cst.With, cst.Try, cst.TryStar, cst.Match)
_WHOLE = (cst.Try, cst.TryStar, cst.Match)  # masked whole wherever the line is in them


@dataclasses.dataclass(frozen=True)
class _Mask:
  """A statement set aside: its class, its lines (1-based, inclusive) and text as written, and why."""

  key: int
  owner: str
  start: int
  end: int
  text: str
  indent: str
  why: str
  reads: frozenset[str]  # the names it reads


def with_unsafe_fixes(text: str, run: tp.Callable[[str], Transformed[str]]) -> Transformed[str]:
  """`run(text)` (a migration of the whole file), with the statements L2N002 refuses in methods masked until
  their classes convert, then put back under their TODO."""
  masks: dict[int, _Mask] = {}
  current = text  # what `result` migrated: `text` with the masks so far
  result = run(current)
  for _ in range(MAX_ROUNDS):
    found = _refused_statements(current, result, len(masks))
    if not found:
      break
    masks.update((mask.key, mask) for mask in found)
    current = _masked(text, masks)
    result = run(current)
  for _ in range(3):  # again without the masks of classes that stayed Linen or lost a marker
    converted = {record.linen_name for record in result.classes}
    kept = _markers(result.source)
    stuck = {m.owner for m in masks.values() if m.owner not in converted or m.key not in kept}
    if not stuck:
      break
    masks = {key: mask for key, mask in masks.items() if mask.owner not in stuck}
    result = run(_masked(text, masks))
  else:  # unmasking some classes kept others from converting, round after round: the safe migration
    return run(text)
  if not masks:
    return result
  try:
    source = _with_imports(_restored(result.source, masks), text, set().union(*(m.reads for m in masks.values())))
  except cst.ParserSyntaxError:  # a statement that does not fit where its marker went: the safe migration
    return run(text)
  entries = [*result.entries, *(Entry(m.start, len(m.indent) + 1, 'L2N002', 'todo', _message(m))
                                 for m in masks.values())]
  again = run(source)  # as a second run would: the rules over the statements put back (L2N001's initializers)
  if again.source != source:
    positions = PositionMap(text, source)
    mapped = [dataclasses.replace(e, **dict(zip(('line', 'column'), positions.original(e.line, e.column))))
              for e in again.entries]
    known = {(e.line, e.code, e.kind, e.message) for e in entries}
    entries += [e for e in mapped if (e.line, e.code, e.kind, e.message) not in known]
    source = again.source
  return dataclasses.replace(result, source=source, entries=tuple(sorted(entries, key=Entry.sort_key)))


def _message(mask: _Mask) -> str:
  return f'{UNSAFE_FIX}this statement is kept as written and may not run in NNX: {mask.why}'


def _masked(text: str, masks: tp.Mapping[int, _Mask]) -> str:
  """`text` with each masked statement's lines replaced by its marker: `pass` then comment lines, as many."""
  lines = text.splitlines(keepends=True)
  for mask in sorted(masks.values(), key=lambda m: m.start, reverse=True):
    ending = re.search(r'(\r\n|\r|\n)$', lines[mask.end - 1])
    newline = ending.group(1) if ending else ''
    marker = [f'{mask.indent}pass  # linen2nnx-masked-{mask.key}{newline or chr(10)}']
    marker += [f'{mask.indent}# linen2nnx-masked-{mask.key}{newline or chr(10)}'] * (mask.end - mask.start)
    marker[-1] = marker[-1].rstrip('\r\n') + newline
    lines[mask.start - 1:mask.end] = marker
  return ''.join(lines)


def _refused_statements(text: str, result: Transformed[str], first_key: int) -> list[_Mask]:
  """The statements of methods at which `result` says classes were refused, one per class, as masks."""
  refusals = {}
  for entry in result.entries:
    match = _REFUSED.match(entry.message) if entry.kind == 'todo' and entry.code == 'L2N002' else None
    if match and match.group(1) not in refusals:
      refusals[match.group(1)] = (entry.line, match.group(2))
  if not refusals:
    return []
  wrapper = MetadataWrapper(cst.parse_module(text))
  positions = wrapper.resolve(PositionProvider)
  lines = text.splitlines(keepends=True)
  masks = []
  for statement in wrapper.module.body:
    if not isinstance(statement, cst.ClassDef) or statement.name.value not in refusals:
      continue
    line, why = refusals[statement.name.value]
    for method in statement.body.body:
      target = _statement_at(method, line, positions) if isinstance(method, cst.FunctionDef) else None
      if target is None:
        continue
      start, end = positions[target].start.line, positions[target].end.line
      if re.search(r'# linen2nnx-masked-\d+', ''.join(lines[start - 1:end])):
        break  # the refusal is at a marker: masking more would not help
      indent = re.match(r'[ \t]*', lines[start - 1]).group(0)
      reads = frozenset(n.value for n in descendants(target) if isinstance(n, cst.Name))
      masks.append(_Mask(first_key + len(masks), statement.name.value, start, end, ''.join(lines[start - 1:end]),
                         indent, why, reads))
      break
  return masks


def _imports(module: cst.Module) -> dict[str, ImportItem]:
  """The names the module's top-level absolute imports bind, each with its import."""
  found = {}
  for line in module.body:
    for small in line.body if isinstance(line, cst.SimpleStatementLine) else ():
      if isinstance(small, cst.Import):
        for alias in small.names:
          dotted = get_full_name_for_node(alias.name)
          asname = alias.asname.name.value if alias.asname else None
          found[asname or dotted.split('.')[0]] = ImportItem(dotted if asname else dotted.split('.')[0], None, asname)
      elif isinstance(small, cst.ImportFrom) and not small.relative and not isinstance(small.names, cst.ImportStar):
        for alias in small.names:
          asname = alias.asname.name.value if alias.asname else None
          found[asname or alias.name.value] = ImportItem(get_full_name_for_node(small.module), alias.name.value, asname)
  return found


def _with_imports(source: str, original: str, reads: set[str]) -> str:
  """`source` with the imports of `original` that bind names in `reads` and that `source` lost put back."""
  imports = _imports(cst.parse_module(original))
  module = cst.parse_module(source)
  lost = [imports[name] for name in sorted(reads) if name in imports and name not in _imports(module)]
  if not lost:
    return source
  context = CodemodContext()
  for item in lost:
    AddImportsVisitor.add_needed_import(context, item.module, item.obj_name, item.alias)
  return AddImportsVisitor(context).transform_module(module).code


def _statement_at(method: cst.FunctionDef, line: int, positions: tp.Mapping[cst.CSTNode, tp.Any]) -> cst.CSTNode | None:
  """The innermost statement of `method`'s body holding `line`: a simple statement line, or a compound statement
  whose header (or an else / elif line) holds it; None when the line is not in the body (the signature, a
  decorator)."""
  blocks = [method.body]
  while blocks and isinstance(blocks[0], cst.IndentedBlock):
    statement = next((s for s in blocks[0].body if positions[s].start.line <= line <= positions[s].end.line), None)
    if statement is None or not isinstance(statement, _COMPOUND) or isinstance(statement, _WHOLE):
      return statement
    blocks = [b for b in _blocks(statement) if isinstance(b, cst.IndentedBlock) and b.body
              and positions[b.body[0]].start.line <= line <= positions[b.body[-1]].end.line]
    if not blocks:
      return statement  # its header, an else / elif line, or a one-line body
  return None


def _blocks(statement: cst.CSTNode) -> list[cst.BaseSuite]:
  """The blocks of a compound statement: its body, then its else / elif arms'."""
  blocks, orelse = [statement.body], getattr(statement, 'orelse', None)
  while orelse is not None:
    blocks.append(orelse.body)
    orelse = orelse.orelse if isinstance(orelse, cst.If) else None
  return blocks


def _markers(source: str) -> set[int]:
  return {int(m.group(2)) for m in _MARKER.finditer(source)}


def _restored(source: str, masks: tp.Mapping[int, _Mask]) -> str:
  """`source` with each marker replaced by its statement, re-indented to the marker's place, under its TODO."""
  source = _FILLER.sub('', source)

  def statement(match: re.Match[str]) -> str:
    indent, mask, newline = match.group(1), masks[int(match.group(2))], match.group(3) or '\n'
    lines = [indent + line[len(mask.indent):] if line.startswith(mask.indent) else line
             for line in mask.text.splitlines(keepends=True)]
    text = ''.join(lines)
    ending = '' if text.endswith(('\n', '\r')) else newline
    return f'{indent}{TODO_PREFIX}{" ".join(_message(mask).split())}{newline}{text}{ending}'

  return _MARKER.sub(statement, source)
