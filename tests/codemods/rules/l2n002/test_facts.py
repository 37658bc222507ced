"""codemods/rules/l2n002/facts.py on its own: what L2N002 learns of a file before it plans any class."""

import textwrap
import typing as tp

import libcst as cst
from libcst.metadata import ParentNodeProvider
from libcst.metadata import PositionProvider
from libcst.metadata import QualifiedNameProvider
from libcst.metadata import ScopeProvider

from codemods.analysis.hierarchy import LinenHierarchy
from codemods.options import MigrationOptions
from codemods.rules.l2n002.factory_fields import Factory
from codemods.rules.l2n002.facts import FileFacts
from codemods.rules.l2n002.factory_scan import with_factories
from codemods.rules.l2n002.facts import analyse_file

SOURCE = """
import functools

import flax.linen as nn
import jax.numpy as jnp


class Cell(nn.Module):
  @nn.compact
  def __call__(self, carry, x):
    return carry, x


class Block(nn.Module):
  conv: nn.Module

  @nn.compact
  def __call__(self, x):
    return self.conv(4)(x)


class Inner(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x)


class Mapped(nn.Module):
  @nn.compact
  def __call__(self, x):
    return Inner()(x)


class Model(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.map_variables(Mapped, 'params')(name='mapped')(x)
    x = Block(functools.partial(nn.Conv, kernel_size=(3, 3)))(x)
    return nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False}, in_axes=1, out_axes=1)()(x, x)


class Plain:
  pass
"""


class _Analyse(cst.CSTVisitor):
  """Analyses a module with the metadata a rule has; `check` reads the facts while that metadata is there."""

  METADATA_DEPENDENCIES = (ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider)

  def __init__(self, check: tp.Callable[[FileFacts], object]) -> None:
    super().__init__()
    self.check, self.facts, self.checked = check, None, None

  def visit_Module(self, node: cst.Module) -> bool:
    self.facts = with_factories(analyse_file(node, self.get_metadata, 'model.py', MigrationOptions(), LinenHierarchy()))
    self.checked = self.check(self.facts)
    return False


def _facts(source: str, check: tp.Callable[[FileFacts], object] = lambda facts: None) -> _Analyse:
  visitor = _Analyse(check)
  cst.MetadataWrapper(cst.parse_module(textwrap.dedent(source))).visit(visitor)
  return visitor


def test_the_linen_classes_of_the_file():
  facts = _facts(SOURCE).facts
  assert facts.linen_classes == {'Cell', 'Block', 'Inner', 'Mapped', 'Model'}
  assert set(facts.class_defs) == {*facts.linen_classes, 'Plain'}
  assert {'functools', 'nn', 'jnp', 'Model'} <= facts.global_names


def test_classes_some_nn_scan_runs():
  assert _facts(SOURCE).facts.scanned_cells == {'Cell'}


def test_linen_only_code_keeps_a_class_and_what_it_builds_linen():
  kept = _facts(SOURCE).facts.kept_linen
  assert set(kept) == {'Mapped', 'Inner'}
  assert 'has no NNX counterpart' in kept['Mapped']
  assert kept['Inner'] == 'the Linen class Mapped, kept as Linen, uses it'


def test_factory_fields_and_what_they_make():
  fields = _facts(SOURCE).facts.factories
  assert fields.fields[('Block', 'conv')] == Factory('layer', 'flax.linen.Conv')
  assert fields.suppliers == {'Block': {'Model'}}


def test_metadata_accessors():
  def check(facts: FileFacts) -> tuple:
    model = facts.class_defs['Model']
    return (facts.parent(model) is facts.module, facts.position(model).line,
            facts.has_name(model.bases[0].value, {'flax.linen.Module'}), facts.nnx_is_free(model),
            facts.names_of(model, 'jnp'))

  line = SOURCE.splitlines().index('class Model(nn.Module):') + 1
  assert _facts(SOURCE, check).checked == (True, line, True, True, {'jax.numpy'})
