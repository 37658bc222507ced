"""The import changes a rule asks for, made on the statements they concern rather than over the whole tree.

libcst's `AddImportsVisitor` and `RemoveImportsVisitor` each visit the whole module, and the second computes
scopes over it first: on a big file the two cost as much as a rule (a third of migrate's time on a 40 KB
generated file, `benchmarks/big_files.py`), though what they change lies in the import statements. Both are
run here, unchanged, on a module of the statements their result depends on, and the rest is kept as it is:

- `added`: `AddImportsVisitor` reads and changes only the module's top block (a docstring, the imports after
  it, and the first statement after them, which may get an empty line before it): it runs on those;
- `removed`: `RemoveImportsVisitor` drops an import whose name nothing reads. A removal whose name the code
  still reads goes from the list first (most files keep `nn` for the classes that stay Linen). Where none of the
  names left appears as a word anywhere but in the import statements (no reference, no string annotation, no
  `__all__` entry: what its scope analysis would find), and every import binding one of them is a module-level
  statement, it runs on each of those statements alone. Else None: the caller runs it over the whole tree, with
  the list left.

The statements left out are the same objects, so the new wrapper shares them: it skips the copy a wrapper
makes (each node is still at one place in the new tree). `tests/codemods/test_engine.py` checks the results
against libcst's own way, rule after rule, on every fixture.
"""

from __future__ import annotations

import ast
import re
import typing as tp

import libcst as cst
from libcst import MetadataWrapper
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.codemod.visitors import RemoveImportsVisitor

_LINE = re.compile(r'[^\r\n]*(?:\r\n|\r|\n|$)')  # a line as Python counts them (not str.splitlines: \f, ...)
Removal = tuple[str, tp.Optional[str], tp.Optional[str]]  # RemoveImportsVisitor's (module, object, alias)


def added(context: CodemodContext, wrapper: MetadataWrapper) -> MetadataWrapper:
  """`wrapper` with the imports `context` asks `AddImportsVisitor` for, added as it adds them."""
  module = wrapper.module
  end = next((i for i, s in enumerate(module.body) if i > 0 and not _single_import(s)), len(module.body))
  top = module.with_changes(body=module.body[:end + 1])
  new = AddImportsVisitor(context).transform_module(top)
  if new.deep_equals(top):
    return wrapper
  return MetadataWrapper(module.with_changes(body=(*new.body, *module.body[end + 1:])), unsafe_skip_copy=True)


def removed(context: CodemodContext, wrapper: MetadataWrapper, code: str) -> MetadataWrapper | None:
  """`wrapper` without the imports `context` asks `RemoveImportsVisitor` to drop, dropped as it drops them, `code`
  its module's code; None where that needs the visitor's analysis of the whole module (its list in `context` left
  without the removals of names `code` reads)."""
  try:
    tree = ast.parse(code)
  except (SyntaxError, ValueError):  # the rule's code does not parse: the engine's parse check says where
    return None
  nodes = list(ast.walk(tree))
  read = {node.id for node in nodes if isinstance(node, ast.Name)}
  removals = [r for r in context.scratch.get(RemoveImportsVisitor.CONTEXT_KEY, []) if _bound(*r) not in read]
  context.scratch[RemoveImportsVisitor.CONTEXT_KEY] = removals
  if not removals:
    return wrapper
  names = {_bound(*removal) for removal in removals}
  top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
  at_top = set(map(id, top))
  if any(isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in at_top and names & _bindings(node)
         for node in nodes):
    return None
  import_lines = {line for node in top for line in range(node.lineno - 1, node.end_lineno or node.lineno)}
  if any(line in import_lines for node in tree.body if id(node) not in at_top
         for line in range(node.lineno - 1, node.end_lineno or node.lineno)):
    return None  # `import a; x = nn.f()`: the line holds more than imports
  rest = ''.join(line for number, line in enumerate(_LINE.findall(code)) if number not in import_lines)
  if any(re.search(rf'(?<![\w.]){re.escape(name)}\b', rest) for name in names):
    return None
  module = wrapper.module
  body: list[cst.BaseStatement] = []
  for statement in module.body:
    if isinstance(statement, cst.SimpleStatementLine) \
        and any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body):
      body.extend(RemoveImportsVisitor(context).transform_module(cst.Module(body=[statement])).body)
    else:
      body.append(statement)
  if len(body) == len(module.body) and all(a.deep_equals(b) for a, b in zip(body, module.body)):
    return wrapper
  return MetadataWrapper(module.with_changes(body=body), unsafe_skip_copy=True)


def _single_import(statement: cst.BaseStatement) -> bool:
  """A statement line holding one import: what `AddImportsVisitor` counts in the top block."""
  return isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 \
      and isinstance(statement.body[0], (cst.Import, cst.ImportFrom))


def _bound(module: str, obj: str | None, alias: str | None) -> str:
  """The name an import binds: its alias, its object, or its module's top package."""
  return alias or obj or module.partition('.')[0]


def _bindings(node: ast.Import | ast.ImportFrom) -> set[str]:
  """The names an import statement binds (`import a.b` binds `a`)."""
  return {alias.asname or alias.name.partition('.')[0] for alias in node.names}
