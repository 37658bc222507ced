"""The import steps give what libcst's AddImportsVisitor and RemoveImportsVisitor give over the whole module, and
fall back to them where their analysis of the whole module could decide otherwise."""

import libcst as cst
import pytest
from libcst import MetadataWrapper
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.codemod.visitors import RemoveImportsVisitor

from codemods import import_steps

ADDS = [[('flax', 'nnx', None)], [('flax', 'nnx', None), ('jax', None, None)], [('functools', 'partial', None)],
        [('__future__', 'annotations', None)], [('flax', 'linen', 'nn')]]
SOURCES = {
    'plain': 'import jax\nimport flax.linen as nn\n\nclass A(nn.Module):\n  pass\n',
    'docstring': '"""Doc."""\n# a comment\nimport jax\nfrom flax import linen as nn\nx = 1\n',
    'from_merged': 'from flax import linen as nn\nfrom functools import reduce\n\n\ndef f():\n  from flax import core\n',
    'no_imports': '"""Only a docstring."""\n',
    'comment_first': '# header\n\n# about x\nx = 1\nimport jax\n',
    'empty': '',
    'future': 'from __future__ import annotations\nimport flax.linen as nn\n',
}


def _libcst(visitor: type, context: CodemodContext, source: str) -> str:
  return visitor(context).transform_module(cst.parse_module(source)).code


def _context(key: str, items: list) -> CodemodContext:
  context = CodemodContext()
  ask = AddImportsVisitor.add_needed_import if key == AddImportsVisitor.CONTEXT_KEY else \
      RemoveImportsVisitor.remove_unused_import
  for module, obj, alias in items:
    ask(context, module, obj, alias)
  return context


@pytest.mark.parametrize('name', SOURCES)
@pytest.mark.parametrize('adds', ADDS, ids=str)
def test_added_imports_are_libcsts(name, adds):
  source = SOURCES[name]
  expected = _libcst(AddImportsVisitor, _context(AddImportsVisitor.CONTEXT_KEY, adds), source)
  wrapper = MetadataWrapper(cst.parse_module(source))
  assert import_steps.added(_context(AddImportsVisitor.CONTEXT_KEY, adds), wrapper).module.code == expected


def test_added_keeps_the_wrapper_when_nothing_is_added():
  wrapper = MetadataWrapper(cst.parse_module(SOURCES['docstring']))
  assert import_steps.added(_context(AddImportsVisitor.CONTEXT_KEY, [('jax', None, None)]), wrapper) is wrapper


REMOVALS = {  # source, removals: RemoveImportsVisitor decides from the import statements alone
    'alias': ('import jax\nimport flax.linen as nn\nfrom flax import nnx\n\nx = nnx.Linear\n',
              [('flax.linen', None, 'nn')]),
    'one_of_two': ('from flax import linen as nn, nnx  # both\nx = nnx.Linear\n', [('flax', 'linen', 'nn')]),
    'trailing_comma': ('from flax import (\n  nnx,\n  linen as nn,\n)\nx = nnx\n', [('flax', 'linen', 'nn')]),
    'first_with_comment': ('# lead\nimport flax.linen as nn\nimport jax\n\ny = jax\n', [('flax.linen', None, 'nn')]),
    'not_imported': ('import jax\n', [('flax.linen', None, 'nn')]),
}
FALLBACKS = {  # source, removals: only the analysis of the whole module can tell
    'string_annotation': ('import flax.linen as nn\n\ndef f(m: "nn.Module"):\n  pass\n', [('flax.linen', None, 'nn')]),
    'exported': ("import flax.linen as nn\n__all__ = ['nn']\n", [('flax.linen', None, 'nn')]),
    'nested_import': ('import flax.linen as nn\n\ndef f():\n  import flax.linen as nn\n', [('flax.linen', None, 'nn')]),
    'shared_line': ('import flax.linen as nn; y = 1\n', [('flax.linen', None, 'nn')]),
}


@pytest.mark.parametrize('name', REMOVALS)
def test_removed_imports_are_libcsts(name):
  source, removals = REMOVALS[name]
  expected = _libcst(RemoveImportsVisitor, _context(RemoveImportsVisitor.CONTEXT_KEY, removals), source)
  wrapper = MetadataWrapper(cst.parse_module(source))
  result = import_steps.removed(_context(RemoveImportsVisitor.CONTEXT_KEY, removals), wrapper, source)
  assert result is not None and result.module.code == expected


@pytest.mark.parametrize('name', FALLBACKS)
def test_removal_falls_back_where_the_whole_module_decides(name):
  source, removals = FALLBACKS[name]
  wrapper = MetadataWrapper(cst.parse_module(source))
  assert import_steps.removed(_context(RemoveImportsVisitor.CONTEXT_KEY, removals), wrapper, source) is None


def test_removals_of_names_the_code_reads_go_first():
  """A removal whose name the code still reads goes from the list (the visitor's analysis of the whole module, where
  it runs, then sees only the others); none left: the module as it was."""
  source = 'from flax import nnx\nimport flax.linen as nn\nimport jax.numpy\n\nx = nnx.Linear, jax.numpy\n'
  context = _context(RemoveImportsVisitor.CONTEXT_KEY, [('flax', 'nnx', None), ('jax.numpy', None, None)])
  wrapper = MetadataWrapper(cst.parse_module(source))
  assert import_steps.removed(context, wrapper, source) is wrapper
  assert context.scratch[RemoveImportsVisitor.CONTEXT_KEY] == []
  annotated = source.replace('x = nnx.Linear', 'def f(m: "nn.Module"):\n  pass\n\n\nx = nnx.Linear')
  context = _context(RemoveImportsVisitor.CONTEXT_KEY, [('flax.linen', None, 'nn'), ('flax', 'nnx', None)])
  assert import_steps.removed(context, MetadataWrapper(cst.parse_module(annotated)), annotated) is None
  assert context.scratch[RemoveImportsVisitor.CONTEXT_KEY] == [('flax.linen', None, 'nn')]
