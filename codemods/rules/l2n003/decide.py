"""Decide each model's fate: converted (a `ConvertedModel`: its edits) or left as Linen with the reason.

The passes run in a fixed order over one group: the construction, the decode-mode views, the
state followed from the init (`follow.StateWalk`), the step functions innermost first, the
state reads, the checks that nothing else touches the state, the train/eval modes, and last
the step styles. Any pass may raise `Skip`; the group is then dropped whole.
"""

from __future__ import annotations

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n003 import applies
from codemods.rules.l2n003 import data_parallel
from codemods.rules.l2n003 import decoding
from codemods.rules.l2n003 import modes
from codemods.rules.l2n003 import state_reads
from codemods.rules.l2n003 import step_styles
from codemods.rules.l2n003 import training_steps
from codemods.rules.l2n003.common import FileRun
from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.common import state_names
from codemods.rules.l2n003.construction import rewrite_construction
from codemods.rules.l2n003.construction import seed_rng_streams
from codemods.rules.l2n003.facts import ConvertedModel
from codemods.rules.l2n003.facts import LeftAsLinen
from codemods.rules.l2n003.facts import ModelGroup
from codemods.rules.l2n003.facts import ModelSite
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.follow import StateWalk
from codemods.rules.l2n003.syntax import resolves_to
from codemods.rules.l2n003.tree import Tree


def decide(site: ModelSite, tree: Tree, run: FileRun) -> ConvertedModel | LeftAsLinen:
  """The edits that convert the model of `site`, or why its code stays Linen."""
  if isinstance(site.built, LeftAsLinen):
    return site.built
  if site.built.layer is not None:
    run.remove_import_of(site.construction.body[0].value.func)
  try:
    group = _plan(site, tree, run)
  except Skip as skip:
    return LeftAsLinen(skip.node, skip.message)
  return ConvertedModel(dict(group.statements), dict(group.edits), tuple(group.changes))


def _plan(site: ModelSite, tree: Tree, run: FileRun) -> ModelGroup:
  statements, construction, init = site.statements, site.construction, site.init
  model, call = init.model, init.call
  index = statements.index(init.statement)
  between = statements[statements.index(construction) + 1:index] if site.given_by is None else ()
  if any(isinstance(n, cst.Name) and n.value == model for s in between for n in descendants(s)):
    raise Skip(call, f'{model}.init: {model} is used between its construction and init')
  group = ModelGroup(model, site.built.record, init.statement, tree.scope(init.statement), layer=site.built.layer,
                     construction=construction.body[0].value)
  if len(tree.assignments(group.scope, model)) != 1:
    raise Skip(call, f'{model}.init: {model} is assigned more than once')
  walk = StateWalk(group, tree, run)
  rewrite_construction(walk, site)
  decoding.decode_views(walk, statements, index, construction.body[0].value)
  walk.name(group.scope, init.target, init.kind)
  _finish_functions(walk)
  state_reads.finish_state_reads(walk)
  applies.check_applies(walk)
  _check_tuple_aliases(walk)
  _check_assignments(walk)
  _check_model_uses(walk)
  _check_field_updates(walk)
  modes.place_modes(walk, statements if group.anchor is None else tree.block(group.anchor))
  step_styles.apply_step_styles(walk)
  seed_rng_streams(walk, site)
  return group


def _finish_functions(walk: Walk) -> None:
  """Rewrites each step once all its state is known, innermost first: a loss's aux tells its step what it returns."""
  group = walk.group
  for node, kind in group.pending_returns:
    training_steps.returned(walk, node, kind, final=True)
  finished: set[cst.CSTNode] = set()
  while len(finished) < len(group.functions):
    function = max((f for f in group.functions if f not in finished), key=walk.tree.depth)
    record = group.functions[function]
    finished.add(function)
    training_steps.finish_function(walk, record)
    if record.pmap is not None:
      data_parallel.pmap_decorator(walk, record, state_names(walk, function, record.kinds))


def _check_tuple_aliases(walk: Walk) -> None:
  """A tuple assignment that went held only state (nothing else is lost with it)."""
  group, tree = walk.group, walk.tree
  for assign in group.tuple_aliases:
    for element in assign.value.elements:
      if element.value not in group.visited:
        raise Skip(element.value, f'{tree.code(element.value)} is assigned together with the state of '
                                  f'{group.model}; split the assignment')


def _check_assignments(walk: Walk) -> None:
  """A state name must not also be assigned something else (`params = load(...)`)."""
  group, tree = walk.group, walk.tree
  for key, scope in group.name_scopes.items():
    for assignment in tree.assignments(scope, key[1]):
      node = assignment.node
      if node not in group.recognized:
        raise Skip(node, f'{key[1]} holds the state of {group.model} but is also assigned other values')


def _check_field_updates(walk: Walk) -> None:
  """A TrainState field given to `state.apply_gradients(..., batch_stats=...)` went with the call."""
  for call in sorted(walk.group.field_updates - walk.group.done, key=walk.tree.position):
    raise Skip(call, f'{walk.tree.code(call.func)}(...) with TrainState fields, not converted yet')


def _check_model_uses(walk: Walk) -> None:
  """The Linen model (and its decode-mode twins) may only be initialised, applied, or given to TrainState.create."""
  group, tree = walk.group, walk.tree
  for module in (group.model, *sorted(group.twins)):
    scope = group.twins.get(module, group.scope)
    (assignment,) = tree.assignments(scope, module)
    accesses = [a for a in assignment.references if resolves_to(a.scope, module, scope)]
    for access in sorted(accesses, key=lambda a: tree.position(a.node)):
      if access.node not in group.model_uses:
        raise Skip(access.node, f'{module} is used by code not converted yet (jax.jit({module}.apply), '
                                'apply with other variables, ...)')
