"""Decide, one model at a time: follow its state from the init to every use, each use to the pass that converts it.

`StateWalk` visits every read of every name that holds the model's state (the variables, a
collection, the optimizer state, a TrainState, ...) and dispatches the read by where it sits:
an apply, a leaf read, an optimizer call, a step function's argument, a return. A read no pass
converts raises `Skip`, which leaves the whole model as Linen.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import Scope

from codemods.rules.l2n003 import applies
from codemods.rules.l2n003 import decoding
from codemods.rules.l2n003 import optimizers
from codemods.rules.l2n003 import state_reads
from codemods.rules.l2n003 import train_state_factories
from codemods.rules.l2n003 import train_state_keep
from codemods.rules.l2n003 import training_steps
from codemods.rules.l2n003.common import FileRun
from codemods.rules.l2n003.common import train_state_arguments
from codemods.rules.l2n003.facts import KEPT
from codemods.rules.l2n003.facts import KEPT_PARAMS
from codemods.rules.l2n003.facts import KEPT_STATE
from codemods.rules.l2n003.facts import OPT_STATE
from codemods.rules.l2n003.facts import OPTAX_UPDATES
from codemods.rules.l2n003.facts import RNG_KEY
from codemods.rules.l2n003.facts import TRAIN_STATE
from codemods.rules.l2n003.facts import UPDATES
from codemods.rules.l2n003.facts import VARIABLES
from codemods.rules.l2n003.facts import ModelGroup
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.facts import collection
from codemods.rules.l2n003.facts import collection_of
from codemods.rules.l2n003.facts import describe
from codemods.rules.l2n003.syntax import resolves_to
from codemods.rules.l2n003.syntax import single_name_target
from codemods.rules.l2n003.syntax import subscript_keys
from codemods.rules.l2n003.tree import Tree
from codemods.variable_types import flax_variable_type
from codemods.vocabulary import FREEZERS
from codemods.vocabulary import REPLICATES
from codemods.vocabulary import TREE_MAPS
from codemods.vocabulary import TREE_READERS


class StateWalk:
  """The `Walk` of one model group: dispatches each use of its state to the pass that converts it."""

  def __init__(self, group: ModelGroup, tree: Tree, run: FileRun) -> None:
    self.group, self.tree, self.run = group, tree, run

  def name(self, scope: Scope, name: str, kind: str) -> None:
    """`name` holds state of `kind` in `scope`: every use of it must be one this rule converts."""
    group = self.group
    key = (id(scope), name)
    if key in group.names:
      if group.names[key] != kind:
        raise Skip(self.tree.assignments(scope, name)[0].node,
                   f'{name} holds two kinds of state ({group.names[key]}, {kind})')
      return
    group.names[key], group.name_scopes[key] = kind, scope
    accesses = {a.node: a for assignment in self.tree.assignments(scope, name) for a in assignment.references
                if resolves_to(a.scope, name, scope)}
    for node in sorted(accesses, key=self.tree.position):
      self.use(node, kind)

  def use(self, node: cst.BaseExpression, kind: str) -> None:
    """Dispatches one use of a state expression by where it sits."""
    parent_of = self.tree.parent
    self.group.visited.add(node)
    parent = parent_of(node)
    if isinstance(parent, cst.Attribute) and parent.value is node:
      return self._attribute(parent, kind)
    if isinstance(parent, cst.Subscript) and parent.value is node:
      return self._subscript(parent, kind)
    if isinstance(parent, cst.Arg) and parent.value is node:
      return self._argument(parent_of(parent), parent, node, kind)
    if isinstance(parent, cst.DictElement) and parent.value is node:
      arg = parent_of(parent_of(parent))
      call = parent_of(arg) if isinstance(arg, cst.Arg) else None
      if isinstance(call, cst.Call) and call.args and call.args[0] is arg and applies.is_apply(self, call) \
          and kind not in (OPT_STATE, TRAIN_STATE, OPTAX_UPDATES, UPDATES, KEPT_STATE, RNG_KEY):
        return self.apply(call)
      if kind == RNG_KEY and isinstance(call, cst.Call) and arg.keyword is not None and arg.keyword.value == 'rngs' \
          and applies.is_apply(self, call):
        if isinstance(parent.key, cst.SimpleString):
          self.group.rng_streams.add(parent.key.evaluated_value)
        return self.apply(call)  # its rngs= goes; the key seeds that stream of the model (`construction`)
    if isinstance(parent, cst.Assign) and parent.value is node and kind in KEPT and single_name_target(parent):
      return self.target(parent.targets[0].target, kind)  # `test_state = state`: a kept TrainState is a value
    if isinstance(parent, cst.Assign) and parent.value is node and kind not in (OPTAX_UPDATES,):
      return self._alias(parent, kind)
    if isinstance(parent, cst.Element) and isinstance(parent_of(parent), cst.Tuple):
      assign = parent_of(parent_of(parent))
      if isinstance(assign, cst.Assign) and assign.value is parent_of(parent):
        return self._tuple_alias(assign, list(assign.value.elements).index(parent), kind)
    if isinstance(parent, cst.Return) and kind == TRAIN_STATE and train_state_factories.is_factory_return(self, parent):
      return train_state_factories.returned_train_state(self, parent)
    if isinstance(parent, cst.Return) and kind == KEPT_STATE \
        and train_state_factories.kept_state_returned(self, parent, kind):
      return None
    if isinstance(parent, (cst.Element, cst.Return)) and kind in KEPT:
      return None  # a kept TrainState is returned and passed on as in Linen
    if isinstance(parent, (cst.Element, cst.Return)):
      return training_steps.returned(self, node, kind)
    raise Skip(node, f'{self.tree.code(node)} ({describe(kind)}) is used by code not converted yet '
                     '(a tree map, a checkpoint save, ...)')

  def target(self, target: cst.CSTNode, kind: str) -> None:
    """An assignment target that receives state: a name followed as state (or `_`)."""
    if not isinstance(target, cst.Name):
      raise Skip(target, f'{describe(kind)} assigned to {self.tree.code(target)}')
    self.group.recognized.add(target)
    if target.value != '_':
      self.name(self.tree.scope(target), target.value, kind)

  def moved(self, statement: cst.BaseStatement) -> None:
    """The model is used from `statement` on: its decode-mode twins built after it there are views of it."""
    self.group.anchor = statement
    block = self.tree.block(statement)
    decoding.decode_views(self, block, block.index(statement), self.group.construction)

  def apply(self, call: cst.Call) -> None:
    """`model.apply(...)`: a call of the NNX model, or of a kept TrainState's `apply_fn`."""
    if call in self.group.applies:
      return
    if self.group.kept_state:
      return train_state_keep.kept_apply(self, call)
    applies.convert_apply(self, call)

  def _attribute(self, attribute: cst.Attribute, kind: str) -> None:
    name, parent = attribute.attr.value, self.tree.parent(attribute)
    if kind == KEPT_STATE:
      return train_state_keep.kept_attribute(self, attribute, name, parent)
    if kind == TRAIN_STATE and name == 'params':
      return self.use(attribute, collection('params'))
    if kind == TRAIN_STATE and name in self.group.fields:
      return self.use(attribute, self.group.fields[name])
    if kind == TRAIN_STATE and name == 'apply_fn' and isinstance(parent, cst.Call) and parent.func is attribute:
      return self.apply(parent)
    if kind == TRAIN_STATE and optimizers.train_state_attribute(self, attribute, name, parent):
      return None
    raise Skip(attribute, f'{self.tree.code(attribute)} ({describe(kind)}) is used by code not converted yet')

  def _subscript(self, subscript: cst.Subscript, kind: str) -> None:
    keys, top = subscript_keys(subscript, self.tree.parent)
    if kind in (VARIABLES, UPDATES) and keys[0] is not None:
      self.group.visited.add(subscript)
      if len(keys) == 1:
        return self.use(subscript, collection(keys[0]))
      return state_reads.leaf(self, top, keys)
    held = collection_of(kind)
    if held is not None:
      return state_reads.leaf(self, top, [held, *keys])
    if kind == KEPT_PARAMS:  # an nnx.State: the same leaves under the NNX attribute names
      return state_reads.leaf(self, top, ['params', *keys], state=self.tree.code(subscript.value))
    raise Skip(subscript, f'{self.tree.code(subscript)}: a read of {describe(kind)} not converted yet')

  def _alias(self, assign: cst.Assign, kind: str) -> None:
    """`params = variables['params']`: the statement goes, `params` is followed as state."""
    if not single_name_target(assign):
      raise Skip(assign, f'{self.tree.code(assign.value)} assigned to something other than one name')
    self.group.statements[self.tree.statement(assign)] = None
    self.target(assign.targets[0].target, kind)

  def _tuple_alias(self, assign: cst.Assign, index: int, kind: str) -> None:
    """`params, stats = variables['params'], variables['batch_stats']`: goes when every value is state."""
    target = assign.targets[0].target if len(assign.targets) == 1 else None
    if not (isinstance(target, cst.Tuple) and len(target.elements) == len(assign.value.elements)):
      raise Skip(assign, f'{self.tree.code(assign.value)} unpacked into something other than as many names')
    self.group.statements[self.tree.statement(assign)] = None
    self.group.tuple_aliases.add(assign)
    self.target(target.elements[index].value, kind)

  def _argument(self, call: cst.Call, arg: cst.Arg, node: cst.BaseExpression, kind: str) -> None:
    func = cst.helpers.get_full_name_for_node(call.func) or ''
    if kind == RNG_KEY:
      return self._rng_key_argument(call, arg, func)
    first = call.args[0] is arg
    params = collection('params')
    if first and applies.is_apply(self, call) and kind not in (OPT_STATE, TRAIN_STATE, OPTAX_UPDATES, UPDATES):
      return self.apply(call)
    if (FREEZERS.match(func) or REPLICATES.match(func)) and len(call.args) == 1:
      return self._unwrap(call, func, kind)
    if first and kind in (params, KEPT_PARAMS) and training_steps.grad_transform(self, call) is not None:
      return training_steps.grad(self, call, kept=kind == KEPT_PARAMS)
    if kind in KEPT and func in TREE_READERS:
      return None  # the same leaves as in Linen
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == 'init' and len(call.args) == 1 \
        and kind == params:
      return optimizers.optimizer_init(self, call)
    if func.endswith('.create') and arg.keyword is not None and (arg.keyword.value == 'params' and kind == params
                                                                 or collection_of(kind) is not None):
      return self._train_state(call)
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in ('apply_gradients', 'replace') \
        and arg.keyword is not None and arg.keyword.value != 'grads' and collection_of(kind) is not None:
      self.group.field_updates.add(call)  # the call goes whole (`optimizers.train_state_attribute`)
      return None
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == 'update' \
        and ((kind == OPT_STATE and call.args.index(arg) == 1) or (kind == params and call.args.index(arg) == 2)):
      return optimizers.optax_update(self, call)
    if func.endswith('apply_updates') and (kind == params and first
                                           or kind == OPTAX_UPDATES and call.args.index(arg) == 1):
      return optimizers.apply_updates(self, call)
    if func in TREE_MAPS and kind == params and not first:
      return optimizers.tree_map_update(self, call, node)
    if func in TREE_READERS and (kind == VARIABLES or flax_variable_type(collection_of(kind) or '')):
      return state_reads.state_read(self, call, node, kind)
    if isinstance(call.func, cst.Name) and kind in KEPT and not arg.star \
        and self.tree.function_def(call.func) is not None:
      return train_state_keep.kept_step_argument(self, call, self.tree.function_def(call.func), arg, kind)
    if isinstance(call.func, cst.Name) and arg.keyword is None and not arg.star and kind != OPTAX_UPDATES:
      function, wrapper = self.tree.function_def(call.func), None
      if function is None and kind not in KEPT:
        wrapper, function = training_steps.wrapped_step(self, call.func) or (None, None)
      if function is not None:
        return training_steps.step_argument(self, call, function, call.args.index(arg), kind, wrapper)
    raise Skip(node, f'{self.tree.code(node)} ({describe(kind)}) is passed to {func or "a call"}, which is not '
                     'converted yet')

  def _rng_key_argument(self, call: cst.Call, arg: cst.Arg, func: str) -> None:
    """The TrainState's rng key split (`rng, new_rng = jax.random.split(state.dropout_rng)`: the statement goes, both
    keys followed), or given back to the state (`state.replace(dropout_rng=new_rng)`, converted from the state)."""
    group, tree = self.group, self.tree
    if arg.keyword is not None and arg.keyword.value in group.fields and isinstance(call.func, cst.Attribute) \
        and call.func.attr.value in ('replace', 'apply_gradients'):
      return None
    assign = tree.parent(call)
    target = assign.targets[0].target if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
    if func.endswith('random.split') and call.args[0] is arg and isinstance(target, (cst.Tuple, cst.List)) \
        and assign.value is call:
      group.statements[tree.statement(assign)] = None
      group.changes.append((call, f'{tree.code(assign)} goes: the NNX model draws its random numbers from its '
                                  'own nnx.Rngs'))
      for element in target.elements:
        self.target(element.value, RNG_KEY)
      return None
    raise Skip(call, f'{tree.code(arg.value)} ({describe(RNG_KEY)}) is passed to {func or "a call"}, which is not '
                     'converted yet (its splits, an apply\'s rngs= and its return into the state are)')

  def _unwrap(self, call: cst.Call, func: str, kind: str) -> None:
    """`freeze(params)` / `jax_utils.replicate(state)` -> `params` / `state`: the wrapper goes."""
    self.group.edits[call] = lambda updated: updated.args[0].value
    self.run.remove_import_of(call.func)
    why = 'NNX state is a plain object' if FREEZERS.match(func) else 'nnx.pmap broadcasts the model to the devices'
    self.group.changes.append((call, f'{func}(...) dropped: {why}'))
    self.use(call, kind)

  def _train_state(self, call: cst.Call) -> None:
    """`TrainState.create(...)`: an nnx.Optimizer, or with `--train-state keep` a TrainState around nnx.split state.

    Assigned (`state = TrainState.create(...)`), or returned by a factory (`train_state_factories`); of flax's
    TrainState or of a subclass whose extra fields hold collections of the variables (`batch_stats`)."""
    group = self.group
    if call in group.done:
      return
    group.done.add(call)
    fields = train_state_factories.subclass_fields(self, call)
    if not fields and not (cst.helpers.get_full_name_for_node(call.func) or '').endswith('TrainState.create'):
      raise Skip(call, f'{self.tree.code(call.func)}(params=...) is not converted yet')
    statement, arguments = train_state_arguments(self, call, fields)
    kinds = train_state_factories.field_kinds(self, call, arguments, fields)
    others = [name for name, kind in kinds.items() if kind in (None, collection('params'))]
    if self.run.options.train_state == 'keep' or others:
      why = None if self.run.options.train_state == 'keep' else (
          f'its field {others[0]} holds state that is neither the model\'s nor the optimizer\'s')
      return train_state_keep.keep_train_state(self, call, statement, arguments, kinds, why)
    train_state_factories.model_fields(self, arguments, kinds)
    if fields:
      train_state_factories.remove_subclass(self, call)
    else:
      self.run.remove_import_of(call.func)
    if isinstance(statement, cst.Return):
      return train_state_factories.factory_optimizer(self, call, statement, arguments)
    optimizers.train_state_optimizer(self, call, statement, arguments)
