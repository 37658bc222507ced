"""The shape docs/architecture.md promises, checked on the source: small modules, functions and classes, no reaching into
another object's private members, no rule passed around untyped, library code never importing a subcommand.

Each checker is a plain function over source text, so that the tests below also show it rejects a bad input.
"""

import ast
import pathlib
import typing as tp

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = sorted(p for package in ('codemods', 'nnx_bridge') for p in (ROOT / package).rglob('*.py'))
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100
MAX_CLASS_METHODS = 30  # a class is one concept: not a namespace that passes share through `self`
# Private names of other libraries this project uses on purpose (stdlib typing of argparse's subparsers).
ALLOWED_PRIVATE = frozenset({'argparse._SubParsersAction'})
L2N002 = ROOT / 'codemods' / 'rules' / 'l2n002'
# What L2N002's planning passes share: facts, the plan, and reads over the class (queries, the size interpreter,
# what a construction builds, a child's __init__ code). These modules import no pass.
L2N002_SHARED = frozenset({'context', 'plan', 'nodes', 'facts', 'factory_fields', 'queries', 'dims', 'sizes',
                           'constructions', 'init_code', 'conditions', 'loop_headers', 'bridge_names',
                           'call_values'})
L2N002_ORCHESTRATION = frozenset({'__init__', 'planner', 'decide', 'rule', 'emit', 'entries'})


def long_module(source: str) -> int | None:
  """The module's line count when it is over the limit, else None."""
  lines = len(source.splitlines())
  return lines if lines > MAX_MODULE_LINES else None


def long_functions(source: str) -> list[str]:
  """`name (N lines)` for each function over the limit."""
  return [f'{node.name} ({node.end_lineno - node.lineno + 1} lines)' for node in ast.walk(ast.parse(source))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def large_classes(source: str) -> list[str]:
  """`name (N methods)` for each class with more methods than the limit."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ClassDef):
      methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
      if len(methods) > MAX_CLASS_METHODS:
        found.append(f'{node.name} ({len(methods)} methods)')
  return found


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


def pass_imports(module: str, source: str) -> list[str]:
  """`module -> other` for each import of another L2N002 module by `module` that is neither a shared module nor
  a type-only import: passes share through the shared modules and the plan, never through each other. Imports under
  `if tp.TYPE_CHECKING:` are annotations, not dependencies, and are skipped."""
  tree = ast.parse(source)
  typing_only = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If) and 'TYPE_CHECKING' in ast.unparse(node.test)
                 for sub in ast.walk(node)}
  found = []
  for node in ast.walk(tree):
    if id(node) in typing_only:
      continue
    if isinstance(node, ast.ImportFrom) and node.module == 'codemods.rules.l2n002':
      others = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith('codemods.rules.l2n002.'):
      others = [node.module.rpartition('.')[2]]
    else:
      continue
    for other in others:
      if other not in L2N002_SHARED:
        found.append(f'{module} -> {other}')
  return found


def module_name(path: pathlib.Path) -> str:
  """'codemods.rules.l2n002.plan' for its file; a package is named by its `__init__.py`."""
  parts = path.relative_to(ROOT).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def module_imports(module: str, source: str, modules: tp.Collection[str], package: bool = False) -> set[str]:
  """The modules of `modules` that `module` imports: every import counts, type-only and lazy ones included (an
  annotation is a dependency too). `from pkg import name` imports the submodule `pkg.name` when there is one, else
  the package."""
  base = module if package else module.rpartition('.')[0]
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ImportFrom):
      parent = base
      for _ in range(node.level - 1):
        parent = parent.rpartition('.')[0]
      target = (f'{parent}.{node.module}' if node.module else parent) if node.level else node.module
      found.update(f'{target}.{a.name}' if f'{target}.{a.name}' in modules else target for a in node.names)
    elif isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
  return {m for m in found if m in modules and m != module}


def import_cycles(imports: tp.Mapping[str, tp.Collection[str]]) -> list[list[str]]:
  """The groups of modules that import each other, directly or through others (strongly connected components of
  the import graph with more than one module), each sorted."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  cycles = []

  def visit(module: str) -> None:
    index[module] = low[module] = len(index)
    stack.append(module)
    for other in imports.get(module, ()):
      if other not in index:
        visit(other)
        low[module] = min(low[module], low[other])
      elif other in stack:
        low[module] = min(low[module], index[other])
    if low[module] == index[module]:
      group = stack[stack.index(module):]
      del stack[stack.index(module):]
      if len(group) > 1:
        cycles.append(sorted(group))

  for module in sorted(imports):
    if module not in index:
      visit(module)
  return sorted(cycles)


def _relative(path: pathlib.Path) -> str:
  return str(path.relative_to(ROOT))


@pytest.mark.parametrize('path', SOURCES, ids=_relative)
def test_module_and_functions_are_small(path):
  source = path.read_text()
  assert long_module(source) is None, f'{_relative(path)}: {long_module(source)} lines (at most {MAX_MODULE_LINES})'
  assert not long_functions(source), f'{_relative(path)}: {long_functions(source)} (at most {MAX_FUNCTION_LINES})'
  assert not large_classes(source), f'{_relative(path)}: {large_classes(source)} (at most {MAX_CLASS_METHODS})'


@pytest.mark.parametrize('path', SOURCES, ids=_relative)
def test_no_private_access_and_typed_rules(path):
  source = path.read_text()
  assert not private_accesses(source), f'{_relative(path)} reaches into private members: {private_accesses(source)}'
  assert not untyped_rules(source), f'{_relative(path)}: {untyped_rules(source)}'


@pytest.mark.parametrize('path', [p for p in SOURCES if 'commands' not in p.parts and p.name != 'cli.py'],
                         ids=_relative)
def test_library_modules_do_not_import_commands(path):
  assert not command_imports(path.read_text()), f'{_relative(path)}: {command_imports(path.read_text())}'


@pytest.mark.parametrize('path', sorted(L2N002.glob('*.py')), ids=_relative)
def test_l2n002_passes_share_through_queries_not_each_other(path):
  module = path.stem
  if module in L2N002_ORCHESTRATION:
    return
  assert not pass_imports(module, path.read_text()), f'{_relative(path)}: {pass_imports(module, path.read_text())}'


def test_no_import_cycles():
  modules = {module_name(p): p for p in SOURCES}
  imports = {m: module_imports(m, p.read_text(), modules, p.name == '__init__.py') for m, p in modules.items()}
  assert not import_cycles(imports), f'modules that import each other: {import_cycles(imports)}'


def test_the_checkers_reject_what_they_look_for():
  assert long_module('x = 1\n' * (MAX_MODULE_LINES + 1)) == MAX_MODULE_LINES + 1
  assert long_module('x = 1\n' * MAX_MODULE_LINES) is None
  body = ''.join(f'  x{i} = {i}\n' for i in range(MAX_FUNCTION_LINES))
  assert long_functions(f'def f():\n{body}') == [f'f ({MAX_FUNCTION_LINES + 1} lines)']
  assert long_functions('def f():\n  return 1\n') == []
  methods = ''.join(f'  def m{i}(self): pass\n' for i in range(MAX_CLASS_METHODS + 1))
  assert large_classes(f'class Planner:\n{methods}') == [f'Planner ({MAX_CLASS_METHODS + 1} methods)']
  assert large_classes('class Small:\n  def m(self): pass\n') == []
  assert private_accesses('def f(rule):\n  return rule._parent(node)\n') == ['2: rule._parent']
  assert private_accesses('def f(self):\n  return self._parent, argparse._SubParsersAction, x.__class__\n') == []
  assert untyped_rules('def f(rule: tp.Any, other_rule, ok_rule: Rule): pass\n') == [
      'f(rule: tp.Any)', 'f(other_rule: <none>)']
  assert command_imports('def f():\n  from codemods.commands import migrate_report\n') == [
      '2: codemods.commands']
  assert command_imports('from codemods import commands\nimport codemods.commands.verify\n') == [
      '1: codemods.commands', '2: codemods.commands.verify']
  assert command_imports('from codemods import report\n') == []
  assert pass_imports('sizes', 'from codemods.rules.l2n002 import modes, queries\n') == ['sizes -> modes']
  assert pass_imports('queries', 'from codemods.rules.l2n002.children import build_child\n') == ['queries -> children']
  assert pass_imports('loops', 'from codemods.rules.l2n002 import children, sizes\n') == ['loops -> children']
  assert pass_imports('children', 'from codemods.rules.l2n002 import lifted, queries\n') == ['children -> lifted']
  assert pass_imports('context', 'if tp.TYPE_CHECKING:\n  from codemods.rules.l2n002.loops import Loops\n') == []
  modules = {'p', 'p.a', 'p.b', 'p.c'}
  assert module_imports('p.a', 'if tp.TYPE_CHECKING:\n  from p.b import B\ndef f():\n  from . import c\n',
                        modules) == {'p.b', 'p.c'}
  assert module_imports('p', 'from .a import f\nfrom p import g\nimport os\n', modules, package=True) == {'p.a'}
  assert import_cycles({'p.a': {'p.b'}, 'p.b': {'p.c'}, 'p.c': {'p.a'}, 'p': {'p.a'}}) == [['p.a', 'p.b', 'p.c']]
  assert import_cycles({'p.a': {'p.b'}, 'p.b': {'p.c'}, 'p.c': set()}) == []
