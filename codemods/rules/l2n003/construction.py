"""Rewrite the construction: `model = MLP(256, 10)` + `variables = model.init(key, x)` -> one NNX construction.

The init statement becomes `model = MLP(256, 10, <sizes>, rngs=nnx.Rngs(key))`, its sizes read
off the example inputs given to `init`; the Linen construction goes (its leading lines stay).
"""

from __future__ import annotations

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n003.analyse import init_arguments
from codemods.rules.l2n003.analyse import parameter_argument
from codemods.rules.l2n003.analyse import size_arguments
from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.facts import ModelSite
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.syntax import assigned_value
from codemods.rules.l2n003.syntax import rngs_code
from codemods.rules.l2n003.syntax import args_with_commas
from codemods.vocabulary import FREEZERS


def rewrite_construction(walk: Walk, site: ModelSite) -> None:
  """The NNX construction in place of the init statement, the Linen construction removed."""
  group, tree = walk.group, walk.tree
  statements, construction, init, built = site.statements, site.construction, site.init.statement, site.built
  model, call = site.init.model, site.init.call
  rngs, inputs = init_arguments(tree, model, group.record, call)
  sizes = size_arguments(tree, model, group.record, call, inputs)
  if site.given_by is not None:
    rngs = _given_key(walk, site)
  if built.layer is not None:
    args = [*sizes, *built.arguments, f'rngs={rngs}']
  else:
    args = [*built.arguments, *sizes, f'rngs={rngs}']
  if site.given_by is not None:
    return _construct_where_built(walk, site, args, [*sizes, f'rngs={rngs}'])
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


def _construct_where_built(walk: Walk, site: ModelSite, args: list[str], added: list[str]) -> None:
  """A module given to the function that initialises it: built as an NNX module where it was built (`cnn = CNN()`
  -> `cnn = CNN(<sizes>, rngs=nnx.Rngs(0))`); the init statement goes, its leading lines to the statement after it."""
  group, tree = walk.group, walk.tree
  construction, init, call = site.construction, site.init.statement, site.init.call
  name = construction.body[0].targets[0].target.value
  group.statements[construction] = [cst.parse_statement(f'{name} = {site.built.nnx_class}({", ".join(args)})\n')
                                    .with_changes(leading_lines=construction.leading_lines)]
  group.statements[init] = None
  following = site.statements[site.statements.index(init) + 1:]
  if not following:
    raise Skip(init, f'{tree.code(call)} ends its function; nothing would be left of it')
  group.edits[following[0]] = lambda updated: updated.with_changes(
      leading_lines=[*init.leading_lines, *updated.leading_lines])
  group.changes.append((call, f'{tree.code(call.func)}(...) goes: {name} (given to {tree.code(site.given_by.func)}) '
                              f'is built as {site.built.nnx_class}(..., {", ".join(added)})'))
  group.model_uses.add(call.func.value)
  group.recognized.add(init.body[0].targets[0].target)
  (bound,) = tree.assignments(tree.scope(construction), name)
  if [a.node for a in bound.references] != [parameter_argument(tree.enclosing_function(init), site.given_by,
                                                                site.init.model)]:
    raise Skip(construction, f'{name} is used other than given to {tree.code(site.given_by.func)}(...) once')


def _given_key(walk: Walk, site: ModelSite) -> str:
  """The `nnx.Rngs(...)` of a module built before the function that initialises it is called: from the key that
  call gives the function, a name bound before the construction or a key of literal seed (`jax.random.key(0)`)."""
  tree, call = walk.tree, site.init.call
  key = next(a.value for a in call.args if a.keyword is None)
  function = tree.enclosing_function(site.init.statement)
  given = parameter_argument(function, site.given_by, key.value) if isinstance(key, cst.Name) else None
  if given is None or len(tree.assignments(tree.scope(site.init.statement), key.value)) != 1:
    raise Skip(key, f'{tree.code(key)}, the key of {tree.code(call)}, is not a parameter of '
                    f'{function.name.value} bound only there, given by {tree.code(site.given_by.func)}(...)')
  literal = rngs_code(tree.code(given))
  if literal != f'nnx.Rngs({tree.code(given)})':
    return literal
  bound = tree.assignments(tree.scope(site.given_by), given.value) if isinstance(given, cst.Name) else []
  if len(bound) == 1 and tree.position(bound[0].node) < tree.position(site.construction):
    return literal
  value = assigned_value(tree.statement(bound[0].node)) if len(bound) == 1 else None
  seeded = rngs_code(tree.code(value)) if value is not None else ''
  if value is not None and seeded != f'nnx.Rngs({tree.code(value)})':
    return seeded
  raise Skip(site.construction, f'{tree.code(given)}, the key {tree.code(site.given_by.func)} initialises '
                                f'{tree.code(site.construction.body[0].targets[0].target)} with, is bound after it '
                                'is built; bind the key first')


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
