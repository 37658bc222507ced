"""Rewrite the construction: `model = MLP(256, 10)` + `variables = model.init(key, x)` -> one NNX construction.

The init statement becomes `model = MLP(256, 10, <sizes>, rngs=nnx.Rngs(key))`, its sizes read
off the example inputs given to `init`; the Linen construction goes (its leading lines stay).
"""

from __future__ import annotations

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n003.analyse import init_arguments
from codemods.rules.l2n003.analyse import size_arguments
from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.facts import ModelSite
from codemods.vocabulary import FREEZERS


def rewrite_construction(walk: Walk, site: ModelSite) -> None:
  """The NNX construction in place of the init statement, the Linen construction removed."""
  group, tree = walk.group, walk.tree
  statements, construction, init, built = site.statements, site.construction, site.init.statement, site.built
  model, call = site.init.model, site.init.call
  rngs, inputs = init_arguments(tree, model, group.record, call)
  sizes = size_arguments(tree, model, group.record, call, inputs)
  if built.layer is not None:
    args = [*sizes, *built.arguments, f'rngs={rngs}']
  else:
    args = [*built.arguments, *sizes, f'rngs={rngs}']
  new = cst.parse_statement(f'{model} = {built.nnx_class}({", ".join(args)})\n')
  group.statements[construction] = None
  following = statements[statements.index(construction) + 1]
  if following is init:
    group.statements[init] = [new.with_changes(leading_lines=construction.leading_lines)]
  else:
    group.statements[init] = [new.with_changes(leading_lines=init.leading_lines)]
    group.edits[following] = lambda updated: updated.with_changes(
        leading_lines=[*construction.leading_lines, *updated.leading_lines])
  group.changes.append((call, f'{model}.init(...) -> {built.nnx_class}(..., {", ".join([*sizes, f"rngs={rngs}"])})'))
  group.model_uses.add(call.func.value)
  group.recognized.add(init.body[0].targets[0].target)
  for wrapper in descendants(init.body[0].value):
    if isinstance(wrapper, cst.Call) and FREEZERS.match(cst.helpers.get_full_name_for_node(wrapper.func) or ''):
      walk.run.remove_import_of(wrapper.func)
