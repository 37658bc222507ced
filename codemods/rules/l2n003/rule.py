"""The libcst glue of L2N003: analyse the file, decide each model, apply the edits of the converted ones."""

from __future__ import annotations

import re
import typing as tp

import libcst as cst
from libcst.metadata import QualifiedNameProvider
from libcst.metadata import ScopeProvider

from codemods.rule import KNOWN_CLASSES_KEY
from codemods.report import ConvertedClass
from codemods.rule import MigrationRule
from codemods.nodes import descendants
from codemods.rules.l2n003.analyse import model_sites
from codemods.rules.l2n003.common import FileRun
from codemods.rules.l2n003.decide import decide
from codemods.rules.l2n003.facts import Edit
from codemods.rules.l2n003.facts import LeftAsLinen
from codemods.rules.l2n003.facts import Replacement
from codemods.rules.l2n003.tree import Tree


class ConvertInitApplyRule(MigrationRule):
  """Rewrites the call sites and training code of the classes L2N002 converted, in this file or another of the run."""

  CODE = 'L2N003'
  DESCRIPTION = ('model.init(key, x) -> Model(..., rngs=nnx.Rngs(key)); model.apply(variables, x) -> model(x); '
                 'training steps over params -> nnx.jit steps over the model with nnx.Optimizer.')
  AFTER = ('L2N002',)
  # every rewrite starts at `target = model.init(...)` (`analyse.init_statement`: a name's init, split over lines too)
  REQUIRES_PATTERN = re.compile(r'(?<![\w.])[A-Za-z_]\w*[\s\\)]*\.[\s\\]*init[\s\\]*\(')
  METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider)

  def __init__(self, context: cst.codemod.CodemodContext) -> None:
    super().__init__(context)
    local = {r.nnx_name: r for r in context.scratch.get(KNOWN_CLASSES_KEY, ())}
    # The classes of other files, by their own names too, for the children of their records (`state_reads`).
    self._records = {**{r.linen_name: r for r in self.imported_classes.values()}, **local}
    self._statements: dict[cst.CSTNode, Replacement] = {}
    self._edits: dict[cst.CSTNode, Edit] = {}

  def visit_Module(self, node: cst.Module) -> None:
    """Plans every model of the file before libcst rewrites it, node by node, in `on_leave`."""
    tree = Tree(self.module, self.get_metadata)
    names = frozenset(n.value for n in descendants(node) if isinstance(n, cst.Name))
    run = FileRun(self._records, self.options, names, self.remove_import_of, statements=self._statements)
    for site in model_sites(node, tree, self._records, lambda func: self._imported(tree, func)):
      if site.init.statement in run.claimed:
        continue  # the cache init of a decode-mode view, converted with its model
      decision = decide(site, tree, run)
      if isinstance(decision, LeftAsLinen):
        self.report_todo(decision.node, f'{decision.reason}; left as Linen')
        continue
      self._statements.update(decision.statements)
      self._edits.update(decision.edits)
      self.add_needed_import('flax', 'nnx')
      for changed, message in decision.changes:
        self.report_change(changed, message)

  def _imported(self, tree: Tree, func: cst.BaseExpression) -> ConvertedClass | None:
    """The record of the class of another file of the run that `func` names through this file's imports."""
    if not self.imported_classes:
      return None
    for name in tree.qualified_names(func, set()):
      resolved = self.hierarchy.resolve(name.name)
      if resolved is not None and resolved in self.imported_classes:
        return self.imported_classes[resolved]
    return None

  def on_leave(self, original_node: cst.CSTNode, updated_node: tp.Any) -> tp.Any:
    """Applies the edit and the statement replacements planned for `original_node`."""
    updated_node = super().on_leave(original_node, updated_node)
    if original_node in self._edits:
      updated_node = self._edits[original_node](updated_node)
    if original_node in self._statements:
      new = self._statements[original_node]
      if not new:
        return cst.RemoveFromParent()
      return cst.FlattenSentinel([updated_node if s is original_node else s for s in new])
    return updated_node
