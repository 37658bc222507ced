"""L2N001: `flax.linen.initializers.X` -> `nnx.initializers.X`.

## What it does
Rewrites every reference to a Linen initializer (`nn.initializers.lecun_normal`, `I.ones` after
`from flax.linen import initializers as I`, `nn.zeros_init`, a name imported from `flax.linen.initializers`)
into `nnx.initializers.X`, adds `from flax import nnx` and removes the Linen import it went through once nothing
else uses it.

## Why
`flax.nnx.initializers` exports the same functions (the same objects, except `zeros_init` and `ones_init`,
which are identical copies), so the rewrite changes no value, and NNX code no longer needs `flax.linen`.

## Example
```python
layer = nn.Dense(4, kernel_init=nn.initializers.lecun_normal(), bias_init=nn.zeros_init())
```
becomes
```python
layer = nn.Dense(4, kernel_init=nnx.initializers.lecun_normal(), bias_init=nnx.initializers.zeros_init())
```

In a file where no class converts and the other rules leave TODOs (its Linen classes all stay Linen), nothing is
rewritten: the file changes only by its TODO lines.

## What stays a TODO
A name `flax.nnx.initializers` lacks, a reference that is assigned or deleted, and code where the name `nnx` is
already bound to something else than `flax.nnx`.
"""

from __future__ import annotations

import libcst as cst
import libcst.helpers
from libcst.metadata import ExpressionContext
from libcst.metadata import ExpressionContextProvider
from libcst.metadata import QualifiedNameProvider
from libcst.metadata import ScopeProvider

from codemods.rule import MigrationRule
from codemods.vocabulary import NNX_INITIALIZERS
from codemods.vocabulary import nnx_initializer_target


class ConvertInitializersRule(MigrationRule):
  """Rewrites Linen initializer references to the identical `nnx.initializers` ones."""

  CODE = 'L2N001'
  REQUIRES = ('initializers', 'zeros_init', 'ones_init')
  DESCRIPTION = 'flax.linen.initializers.X -> nnx.initializers.X (the same functions).'
  TIDYING = True  # the same functions: in a file whose classes all stay Linen, the rewrite is only churn
  METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider, ExpressionContextProvider)

  def __init__(self, context: cst.codemod.CodemodContext) -> None:
    super().__init__(context)
    self._replacements: dict[cst.CSTNode, cst.BaseExpression] = {}

  def visit_Import(self, node: cst.Import) -> bool:
    return False

  def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
    return False

  def visit_Attribute(self, node: cst.Attribute) -> bool:
    return self._visit_reference(node)

  def visit_Name(self, node: cst.Name) -> bool:
    return self._visit_reference(node)

  def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
    return self._replacements.pop(original_node, updated_node)

  def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
    return self._replacements.pop(original_node, updated_node)

  def _visit_reference(self, node: cst.Attribute | cst.Name) -> bool:
    """Handles the outermost expression naming a Linen initializer; returns False to stop there."""
    names = {qualified.name for qualified in self.get_metadata(QualifiedNameProvider, node, set())}
    targets = {nnx_initializer_target(name) for name in names}
    if not names or targets == {None}:
      return True
    code = self.module.code_for_node(node)
    if len(targets) > 1 or None in targets:
      self.report_todo(node, f'{code} may or may not be a Linen initializer here; convert it by hand')
      return False
    target = targets.pop()
    attr = target.rpartition('.')[2]
    if target != 'initializers' and attr not in NNX_INITIALIZERS:
      self.report_todo(node, f'{code}: flax.nnx.initializers has no {attr}; pick a replacement by hand')
    elif self.get_metadata(ExpressionContextProvider, node, None) in (ExpressionContext.STORE, ExpressionContext.DEL):
      self.report_todo(node, f'{code} is assigned or deleted here; convert it by hand')
    elif not self.nnx_is_free(node):
      self.report_todo(node, f'{code} -> nnx.{target} needs the name nnx, bound to something else here')
    else:
      self._replacements[node] = cst.parse_expression(f'nnx.{target}')
      self.add_needed_import('flax', 'nnx')
      self.remove_import_of(node)
      self.report_change(node, f'{code} -> nnx.{target}')
    return False
