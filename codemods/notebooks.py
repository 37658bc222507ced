"""Migrate the code cells of a .ipynb notebook, leaving magics, other cells and outputs untouched.

The code cells are joined into one module, with a marker line before each, so that an import
in the first cell resolves a name used in a later one (they share one namespace when run), and
imports the rules add land in the first code cell. Line magics and shell escapes (`%`, `!`) are
masked by a placeholder expression of the same indentation and restored afterwards; cells
starting with a cell magic (`%%`) are not Python and are left out.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing as tp

from codemods.analysis.hierarchy import LinenHierarchy
from codemods.options import MigrationOptions
from codemods.report import ConvertedClass
from codemods.report import Entry
from codemods.report import Transformed
from codemods.rule import MigrationRule
from codemods.transform import MigrationError
from codemods.transform import transform_source

_MARKER = '__linen2nnx_cell_{}__'
_MAGIC = '__linen2nnx_magic_{}__'
_MAGIC_LINE = re.compile(r'^([ \t]*)[%!]')
_INDENT = re.compile(r'^\{\n( +)"', re.MULTILINE)


def transform_notebook(data: bytes, rules: tp.Sequence[type[MigrationRule]],
                       options: MigrationOptions = MigrationOptions(),
                       hierarchy: LinenHierarchy = LinenHierarchy(), filename: str | None = None) -> Transformed[bytes]:
  """The notebook with its code cells migrated; byte-identical when nothing changes.

  Raises MigrationError, in one line saying what is wrong, for data that is not a notebook this can read.
  """
  notebook = _load(data)
  cells = notebook['cells']
  indices = [i for i, cell in enumerate(cells) if _is_python(cell)]
  magics: list[str] = []
  parts = []
  for index in indices:
    parts.append(_MARKER.format(index) + '\n' + _mask(_source(cells[index]), magics))
  module = ''.join(parts)
  result = transform_source(module, rules, options, hierarchy, filename)
  if result.source == module:
    return Transformed(data, _in_cells(result.entries, module, indices), _in_cells(result.classes, module, indices))
  new_sources = _split(result.source, indices)
  for index, source in zip(indices, new_sources):
    new = _unmask(source, magics)
    if new != _source(cells[index]):
      cells[index]['source'] = _like(cells[index]['source'], new)
  text = data.decode('utf-8')
  indent = _INDENT.search(text)
  new_text = json.dumps(notebook, indent=len(indent.group(1)) if indent else 1, ensure_ascii=False)
  new_data = (new_text + ('\n' if text.endswith('\n') else '')).encode('utf-8')
  return Transformed(new_data, _in_cells(result.entries, module, indices), _in_cells(result.classes, module, indices))


def _load(data: bytes) -> dict[str, tp.Any]:
  """The notebook's JSON, checked as far as the migration reads it: a top-level object with a list of cells,
  each an object whose `source` (in a code cell) is a string or a list of strings, as nbformat requires."""
  try:
    notebook = json.loads(data.decode('utf-8-sig'))
  except UnicodeDecodeError as error:
    line = data.count(b'\n', 0, error.start) + 1
    raise MigrationError(f'not a notebook: line {line} is not UTF-8 (byte 0x{data[error.start]:02x}); save it as '
                         'UTF-8, as Jupyter does') from None
  except json.JSONDecodeError as error:
    raise MigrationError(f'not a notebook: not valid JSON at line {error.lineno} column {error.colno} ({error.msg}); '
                         'fix the file or --exclude it') from None
  if not isinstance(notebook, dict) or not isinstance(notebook.get('cells'), list):
    raise MigrationError('not a notebook: no "cells" list at the top of its JSON; give a Jupyter notebook or '
                         '--exclude the file')
  for index, cell in enumerate(notebook['cells']):
    if not isinstance(cell, dict):
      raise MigrationError(f'cell {index}: must be a JSON object, not {_json_type(cell)}; fix the notebook')
    source = cell.get('source', '')
    text = isinstance(source, str) or isinstance(source, list) and all(isinstance(line, str) for line in source)
    if cell.get('cell_type') == 'code' and not text:
      raise MigrationError(f'cell {index}: source must be a string or a list of strings, not {_json_type(source)}; '
                           'fix the notebook')
  return notebook


def _json_type(value: tp.Any) -> str:
  """How JSON calls the type of a value `json.loads` made: 'a number', 'a list with a number in it'."""
  if isinstance(value, list):
    odd = [item for item in value if not isinstance(item, str)]
    return f'a list with {_json_type(odd[0])} in it' if odd else 'a list'
  names = {bool: 'a boolean', int: 'a number', float: 'a number', str: 'a string', dict: 'an object'}
  return names.get(type(value), 'null')


def _is_python(cell: dict[str, tp.Any]) -> bool:
  return cell.get('cell_type') == 'code' and not _source(cell).lstrip().startswith('%%')


def _source(cell: dict[str, tp.Any]) -> str:
  source = cell.get('source', '')
  text = ''.join(source) if isinstance(source, list) else source
  return text if text.endswith('\n') or not text else text + '\n'


def _like(original: str | list[str], text: str) -> str | list[str]:
  """`text` stored as the original was: one string, or a list of lines; no final newline if it had none."""
  had_newline = (''.join(original) if isinstance(original, list) else original).endswith('\n')
  if not had_newline and text.endswith('\n'):
    text = text[:-1]
  return text.splitlines(keepends=True) if isinstance(original, list) else text


def _mask(source: str, magics: list[str]) -> str:
  lines = source.splitlines(keepends=True)
  for i, line in enumerate(lines):
    match = _MAGIC_LINE.match(line)
    if match:
      lines[i] = match.group(1) + _MAGIC.format(len(magics)) + '\n'
      magics.append(line)
  return ''.join(lines)


def _unmask(source: str, magics: list[str]) -> str:
  lines = source.splitlines(keepends=True)
  for i, line in enumerate(lines):
    found = re.fullmatch(r'[ \t]*__linen2nnx_magic_(\d+)__\n', line)
    if found:
      lines[i] = magics[int(found.group(1))]
  return ''.join(lines)


def _split(module: str, indices: list[int]) -> list[str]:
  """The cell sources back from the migrated module; text above the first marker joins the first cell."""
  lines = module.splitlines(keepends=True)
  starts = []
  for index in indices:
    marker = _MARKER.format(index) + '\n'
    position = next((i for i in range(starts[-1] + 1 if starts else 0, len(lines)) if lines[i] == marker), None)
    if position is None:
      raise MigrationError(f'a rule moved or removed the boundary of cell {index}, left untouched')
    starts.append(position)
  sources = [''.join(lines[start + 1:end]) for start, end in zip(starts, [*starts[1:], len(lines)])]
  sources[0] = ''.join(lines[:starts[0]]) + sources[0]
  return sources


Located = tp.TypeVar('Located', Entry, ConvertedClass)


def _in_cells(records: tp.Sequence[Located], module: str, indices: list[int]) -> tuple[Located, ...]:
  """Entries or classes of the joined module, re-addressed to (cell, line within the cell)."""
  starts = []  # 1-based line of each marker in the joined (original) module
  for number, line in enumerate(module.splitlines(), start=1):
    if re.fullmatch(r'__linen2nnx_cell_\d+__', line):
      starts.append(number)
  out = []
  for record in records:
    k = max((k for k, start in enumerate(starts) if start < record.line), default=0)
    out.append(dataclasses.replace(record, cell=indices[k], line=record.line - starts[k]))
  return tuple(out)
