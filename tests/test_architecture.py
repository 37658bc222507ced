"""The shape docs/architecture.md promises, checked on the source: small modules and functions, no reaching into
another object's private members, no rule passed around untyped, library code never importing a subcommand.

Each checker is a plain function over source text, so that the tests below also show it rejects a bad input.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = sorted(p for package in ('codemods', 'nnx_bridge') for p in (ROOT / package).rglob('*.py'))
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100
# Private names of other libraries this project uses on purpose (stdlib typing of argparse's subparsers).
ALLOWED_PRIVATE = frozenset({'argparse._SubParsersAction'})


def long_module(source: str) -> int | None:
  """The module's line count when it is over the limit, else None."""
  lines = len(source.splitlines())
  return lines if lines > MAX_MODULE_LINES else None


def long_functions(source: str) -> list[str]:
  """`name (N lines)` for each function over the limit."""
  return [f'{node.name} ({node.end_lineno - node.lineno + 1} lines)' for node in ast.walk(ast.parse(source))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def private_accesses(source: str) -> list[str]:
  """`line: code` for each `other._name` where `other` is not `self` / `cls` (dunders are public protocol)."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if not (isinstance(node, ast.Attribute) and node.attr.startswith('_') and not node.attr.startswith('__')):
      continue
    if isinstance(node.value, ast.Name) and node.value.id in ('self', 'cls'):
      continue
    code = ast.unparse(node)
    if code not in ALLOWED_PRIVATE:
      found.append(f'{node.lineno}: {code}')
  return found


def untyped_rules(source: str) -> list[str]:
  """Parameters named like a rule (`rule`, `*_rule`) annotated `Any` or not at all."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
        if arg.arg == 'rule' or arg.arg.endswith('_rule'):
          annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ''
          if annotation in ('', 'Any', 'tp.Any', 'typing.Any'):
            found.append(f'{node.name}({arg.arg}: {annotation or "<none>"})')
  return found


def command_imports(source: str) -> list[str]:
  """The imports of `codemods.commands` (anywhere in the module, lazy ones included)."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ImportFrom) and node.module is not None:
      names = [node.module] if node.module.startswith('codemods.commands') else (
          [f'codemods.{a.name}' for a in node.names if node.module == 'codemods' and a.name == 'commands'])
      found.extend(f'{node.lineno}: {name}' for name in names)
    elif isinstance(node, ast.Import):
      found.extend(f'{node.lineno}: {a.name}' for a in node.names if a.name.startswith('codemods.commands'))
  return found


def _relative(path: pathlib.Path) -> str:
  return str(path.relative_to(ROOT))


@pytest.mark.parametrize('path', SOURCES, ids=_relative)
def test_module_and_functions_are_small(path):
  source = path.read_text()
  assert long_module(source) is None, f'{_relative(path)}: {long_module(source)} lines (at most {MAX_MODULE_LINES})'
  assert not long_functions(source), f'{_relative(path)}: {long_functions(source)} (at most {MAX_FUNCTION_LINES})'


@pytest.mark.parametrize('path', SOURCES, ids=_relative)
def test_no_private_access_and_typed_rules(path):
  source = path.read_text()
  assert not private_accesses(source), f'{_relative(path)} reaches into private members: {private_accesses(source)}'
  assert not untyped_rules(source), f'{_relative(path)}: {untyped_rules(source)}'


@pytest.mark.parametrize('path', [p for p in SOURCES if 'commands' not in p.parts and p.name != 'cli.py'],
                         ids=_relative)
def test_library_modules_do_not_import_commands(path):
  assert not command_imports(path.read_text()), f'{_relative(path)}: {command_imports(path.read_text())}'


def test_the_checkers_reject_what_they_look_for():
  assert long_module('x = 1\n' * (MAX_MODULE_LINES + 1)) == MAX_MODULE_LINES + 1
  assert long_module('x = 1\n' * MAX_MODULE_LINES) is None
  body = ''.join(f'  x{i} = {i}\n' for i in range(MAX_FUNCTION_LINES))
  assert long_functions(f'def f():\n{body}') == [f'f ({MAX_FUNCTION_LINES + 1} lines)']
  assert long_functions('def f():\n  return 1\n') == []
  assert private_accesses('def f(rule):\n  return rule._parent(node)\n') == ['2: rule._parent']
  assert private_accesses('def f(self):\n  return self._parent, argparse._SubParsersAction, x.__class__\n') == []
  assert untyped_rules('def f(rule: tp.Any, other_rule, ok_rule: Rule): pass\n') == [
      'f(rule: tp.Any)', 'f(other_rule: <none>)']
  assert command_imports('def f():\n  from codemods.commands import migrate_report\n') == [
      '2: codemods.commands']
  assert command_imports('from codemods import commands\nimport codemods.commands.verify\n') == [
      '1: codemods.commands', '2: codemods.commands.verify']
  assert command_imports('from codemods import report\n') == []
