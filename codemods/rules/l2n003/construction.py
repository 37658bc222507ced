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
from codemods.rules.l2n003.syntax import args_with_commas
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


def seed_rng_streams(walk: Walk, site: ModelSite) -> None:
  """`nnx.Rngs(params_rng)` -> `nnx.Rngs(params_rng, dropout=dropout_rng)` when the TrainState's one rng-key field
  was given `dropout_rng` and fed the `'dropout'` stream: the model draws its masks from the key the Linen code
  drew them from (the factory's `params_rng, dropout_rng = jax.random.split(rng)`).

  Only for a key named in the construction's scope and bound before it, and streams the Rngs does not seed yet.
  """
  group, tree = walk.group, walk.tree
  if len(group.rng_keys) != 1 or not group.rng_streams:
    return
  (key,) = group.rng_keys.values()
  init = site.init.statement
  bound = tree.assignments(group.scope, key.value) if isinstance(key, cst.Name) else []
  if len(bound) != 1 or tree.position(bound[0].node) >= tree.position(init) \
      or not all(stream.isidentifier() for stream in group.rng_streams):
    return
  (new, *rest) = group.statements[init]
  rngs = next(a.value for a in new.body[0].value.args if a.keyword is not None and a.keyword.value == 'rngs')
  streams = sorted(group.rng_streams - {a.keyword.value for a in rngs.args if a.keyword is not None})
  if not streams:
    return
  added = [cst.parse_expression(f'f({stream}={key.value})').args[0] for stream in streams]
  seeded = rngs.with_changes(args=args_with_commas([*rngs.args, *added]))
  group.statements[init] = [new.deep_replace(rngs, seeded), *rest]
  group.changes.append((key, f'the TrainState\'s {key.value} seeds the {", ".join(streams)} stream of '
                             f'{group.model}\'s nnx.Rngs'))
