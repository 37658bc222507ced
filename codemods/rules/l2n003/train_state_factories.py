"""Rewrite the TrainState of flax's examples: a subclass with more fields, made and returned by a factory.

flax's examples build the training state in a function of its own and return it to the caller:

    class TrainState(train_state.TrainState):
      batch_stats: Any

    def create_train_state(rng, learning_rate):
      model = CNN()
      variables = model.init(rng, jnp.ones([1, 28, 28, 1]))
      return TrainState.create(apply_fn=model.apply, params=variables['params'],
                               batch_stats=variables['batch_stats'], tx=optax.sgd(learning_rate))

    state = create_train_state(init_rng, 0.1)

The factory (`return TrainState.create(...)`, or `state = TrainState.create(...)` then `return
state`) now returns `model, optimizer` (an `nnx.Optimizer` over the model), its one caller
unpacks them, and `state`'s uses are followed from there as a TrainState's. A field of the
subclass holding model state (`batch_stats`) is read as that state, which the NNX model holds; the
subclass goes once nothing else uses it. A field holding an rng key (`dropout_rng`, as in the
training scripts of transformers' Flax examples) goes too: the NNX model draws from its own
nnx.Rngs, so the key's splits (`rng, new_rng = jax.random.split(state.dropout_rng)`), its use
in an apply's `rngs=` and its return into the state (`state.replace(dropout_rng=new_rng)`,
`apply_gradients(..., dropout_rng=new_rng)`) go with it, and the key the factory gave the field
seeds the stream it fed (`nnx.Rngs(params_rng, dropout=dropout_rng)`, see
`construction.seed_rng_streams`). A field holding anything else (clu metrics, an EMA of the params)
keeps the TrainState, around `nnx.split` state (`train_state_keep`). A subclass with methods, or a
factory called more than once, stays as it is (a TODO says which).

The factory may also be given the module its caller built (flax's Quick Start: `cnn = CNN()`, then
`create_train_state(cnn, init_rng, ...)` calls `module.init(rng, ...)`): `analyse.given_module`
finds that site, and `construction` builds the NNX module where the Linen one was built.
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.nodes import descendants

from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.common import optimizer_name
from codemods.rules.l2n003.facts import RNG_KEY
from codemods.rules.l2n003.facts import TRAIN_STATE
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.facts import collection
from codemods.rules.l2n003.syntax import resolves_to
from codemods.rules.l2n003.syntax import single_name_target
from codemods.rules.l2n003.syntax import subscript_keys


def subclass_fields(walk: Walk, call: cst.Call) -> dict[str, cst.AnnAssign]:
  """The extra fields of the TrainState subclass `call` creates (`Sub.create(...)`), none for flax's own."""
  func = call.func
  if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
    return {}
  subclass = walk.tree.class_def(func.value)
  if subclass is None:
    return {}
  fields = {}
  for statement in subclass.body.body:
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is None:
      fields[small.target.value] = small
    elif not (isinstance(small, (cst.Pass, cst.Expr)) and not isinstance(getattr(small, 'value', None), cst.Call)):
      raise Skip(statement, f'the TrainState subclass {subclass.name.value} has more than fields (a method, a '
                            'default); it is not converted yet')
  return fields


def field_kinds(walk: Walk, call: cst.Call, arguments: dict[str, cst.BaseExpression],
                fields: dict[str, cst.AnnAssign]) -> dict[str, str | None]:
  """The kind of model state each extra field of `TrainState.create(...)` is given (`variables['batch_stats']`, a
  key named like one: `dropout_rng`; the params for an EMA of them), None for a field given anything else (clu
  metrics)."""
  group, tree = walk.group, walk.tree
  kinds: dict[str, str | None] = {}
  for name in fields:
    value = arguments.get(name)
    if value is None:
      raise Skip(call, f'the TrainState field {name} is not given to {tree.code(call.func)}(...)')
    kind = None
    if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Name):
      keys, top = subscript_keys(value, tree.parent)
      held = group.names.get((id(tree.scope(value)), value.value.value))
      if top is value and len(keys) == 1 and keys[0] is not None and held is not None:
        kind = collection(keys[0])
    elif isinstance(value, cst.Name):
      kind = group.names.get((id(tree.scope(value)), value.value))
    if kind is None and _names_a_key(name):
      kind = RNG_KEY  # the model's nnx.Rngs take its place; its uses are followed and must all go
    kinds[name] = kind
  return kinds


def model_fields(walk: Walk, arguments: dict[str, cst.BaseExpression], kinds: dict[str, str | None]) -> None:
  """The fields holding model state (every one), read as that state: the NNX model holds it."""
  group = walk.group
  group.fields = tp.cast(dict[str, str], kinds)
  for name, kind in kinds.items():
    group.visited.add(arguments[name])
    if kind == RNG_KEY:
      group.rng_keys[name] = arguments[name]


def _names_a_key(field: str) -> bool:
  """Whether a TrainState field's name says it holds an rng key: `dropout_rng`, `rng`, `noise_key`."""
  return 'rng' in field.lower() or field.lower().endswith('key')


def remove_subclass(walk: Walk, call: cst.Call) -> None:
  """The subclass goes when `call` is its only use; the imports of its base and field types go with it, unless
  something else uses them."""
  tree, group = walk.tree, walk.group
  name = call.func.value
  subclass = tree.class_def(name)
  scope = tree.scope(subclass)
  (assignment,) = tree.assignments(scope, name.value)
  if [a.node for a in assignment.references if resolves_to(a.scope, name.value, scope)] != [name]:
    return
  group.statements[subclass] = None
  for base in subclass.bases:
    walk.run.remove_import_of(base.value)
  for field in subclass_fields(walk, call).values():  # `Any`, when nothing else uses it
    for annotation in (n for n in descendants(field.annotation) if isinstance(n, (cst.Name, cst.Attribute))):
      walk.run.remove_import_of(annotation)
  group.changes.append((subclass, f'class {name.value} goes: its fields are state the NNX model holds'))


def factory_optimizer(walk: Walk, call: cst.Call, ret: cst.Return, arguments: dict[str, cst.BaseExpression]) -> None:
  """`return TrainState.create(...)` -> `return model, optimizer`; the caller unpacks both, its `state` followed."""
  group, tree = walk.group, walk.tree
  line = tree.statement(ret)
  function = _factory(walk, ret)
  if function is None:
    raise Skip(call, 'a TrainState returned other than by the function that initialises the model, at its top level')
  optimizer, tx = optimizer_name(walk, call), tree.code(arguments['tx'])
  made = cst.parse_statement(f'{optimizer} = nnx.Optimizer({group.model}, {tx}, wrt=nnx.Param)\n')
  group.changes.append((call, f'TrainState.create(...) -> {optimizer} = nnx.Optimizer({group.model}, {tx}, '
                              f'wrt=nnx.Param); {function.name.value} returns {group.model}, {optimizer}'))
  _return_to_caller(walk, function, line, [made])


def is_factory_return(walk: Walk, ret: cst.Return) -> bool:
  """Whether `return state` ends the function that initialises the model (`state = TrainState.create(...)`
  before it): a factory, converted as `return TrainState.create(...)` is."""
  return _factory(walk, ret) is not None


def returned_train_state(walk: Walk, ret: cst.Return) -> None:
  """`return state` of a factory -> `return model, optimizer`; the caller unpacks both, its `state` followed."""
  line = walk.tree.statement(ret)
  _return_to_caller(walk, _factory(walk, ret), line, [])


def kept_state_returned(walk: Walk, ret: cst.Return, kind: str) -> bool:
  """Whether `ret` ends the factory, returning a kept TrainState: its one caller's `state = create_train_state(...)`
  is then followed as that state (`--train-state keep`: the factory and its caller stay as they are)."""
  function = _factory(walk, ret)
  if function is None:
    return False
  walk.target(_caller(walk, function).targets[0].target, kind)
  return True


def _factory(walk: Walk, ret: cst.Return) -> cst.FunctionDef | None:
  """The function `ret` ends when it initialises the model and `ret` is one of its top-level statements."""
  tree, group = walk.tree, walk.group
  function = tree.enclosing_function(ret)
  line = tree.statement(ret)
  if isinstance(function, cst.FunctionDef) and line in function.body.body and group.init in function.body.body \
      and len(line.body) == 1:
    return function
  return None


def _return_to_caller(walk: Walk, function: cst.FunctionDef, line: cst.SimpleStatementLine,
                      before: list[cst.BaseStatement]) -> None:
  """The factory's `line` returns `model, optimizer` (after `before`); its one caller unpacks them."""
  group, tree = walk.group, walk.tree
  caller = _caller(walk, function)
  optimizer = optimizer_name(walk, line)
  scope = tree.scope(caller)
  for name in (group.model, optimizer):
    if scope.assignments[name] or scope.accesses[name]:
      raise Skip(caller, f'{name} is taken where {function.name.value} is called')
  returned = cst.parse_statement(f'return {group.model}, {optimizer}\n')
  made = [*before, returned]
  group.statements[line] = [made[0].with_changes(leading_lines=line.leading_lines), *made[1:]]
  unpacked = cst.parse_expression(f'{group.model}, {optimizer}')
  group.edits[caller] = lambda updated: updated.with_changes(targets=[cst.AssignTarget(unpacked)])
  walk.moved(tree.statement(caller))
  group.changes.append((caller, f'{tree.code(caller.targets[0].target)} = {function.name.value}(...) -> '
                                f'{group.model}, {optimizer} = {function.name.value}(...): the TrainState\'s uses '
                                f'go to {group.model} and {optimizer}'))
  walk.target(caller.targets[0].target, TRAIN_STATE)


def _caller(walk: Walk, function: cst.FunctionDef) -> cst.Assign:
  """`state = create_train_state(...)`, the one use of the factory."""
  tree = walk.tree
  name = function.name.value
  bound, uses = tree.function_uses(function)
  if bound != 1 or len(uses) != 1:
    raise Skip(function, f'{name} returns the TrainState and is used {len(uses)} times (once, `state = '
                         f'{name}(...)`, is converted)')
  call = tree.parent(uses[0])
  assign = tree.parent(call) if isinstance(call, cst.Call) and call.func is uses[0] else None
  if not (isinstance(assign, cst.Assign) and assign.value is call and single_name_target(assign)):
    raise Skip(uses[0], f'{name} returns the TrainState, and its result is not assigned to one name')
  return assign
