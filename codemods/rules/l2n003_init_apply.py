"""L2N003: a converted model's call sites and training code: init, apply, training steps, optimizers.

## What it does
For a class L2N002 converted in the same file (or a built-in layer such as `nn.Dense(10)` used as
the model), the code that builds it (`model = MLP(256, 10)`),
initialises it (`variables = model.init(key, x, train=False)`, or `params = model.init(...)['params']`)
and then uses the model and its state becomes NNX code:

- the `init` statement becomes the construction `model = MLP(256, 10, <sizes>, rngs=nnx.Rngs(key))`,
  its sizes read off the example inputs given to `init` (`x.shape[-1]`, or the literal last axis
  of `jnp.ones((1, 784))`), and the Linen construction goes;
- `model.apply(variables, x, train=False)` (or `{'params': params, 'batch_stats': stats}`) becomes
  `model(x)` (`method='encode'` or `method=MLP.encode`: `model.encode(x)`), with `model.eval()` /
  `model.train()` set once after the construction, or before each statement when the calls
  differ; `mutable=['batch_stats']` applies become plain calls that update the model in place,
  and the `(out, updates)` unpacking keeps only `out`;
- reads such as `variables['params']['Dense_0']['kernel']` (also through `params =
  variables['params']`) become `model.dense.kernel[...]` (the child names L2N002 recorded);
- training code: `opt_state = tx.init(params)` or `state = train_state.TrainState.create(
  apply_fn=model.apply, params=params, tx=tx)` becomes `optimizer = nnx.Optimizer(model, tx,
  wrt=nnx.Param)`; a step function given the params, batch stats, optimizer state or TrainState
  takes `model` / `optimizer` instead (`@jax.jit` becomes `@nnx.jit`); inside it,
  `jax.grad` / `jax.value_and_grad(loss_fn)(params)` become `nnx.grad` / `nnx.value_and_grad(loss_fn)(model)`,
  `tx.update` + `optax.apply_updates` and `state.apply_gradients(grads=grads)` become
  `optimizer.update(model, grads)`, `params = jax.tree.map(f, params, grads)` becomes
  `nnx.update(model, jax.tree.map(f, nnx.state(model, nnx.Param), grads))`; the state the step
  returned (and the batch-stats updates a `has_aux` loss returned) is dropped from its `return`
  and from the unpacking at each call site; `freeze` / `unfreeze` around the state go; with
  `--train-state keep` the TrainState stays instead, built around `nnx.split(model, nnx.Param,
  ...)` state (the migration guide's variant), and its steps stay `jax.jit` steps;
- step style (`--step-style`, docs/performance.md): with `functional` (the default) a jitted
  step that returns state and is called in a loop becomes `@jax.jit def train_step(graphdef,
  state, x, y)`, starting with `model, optimizer = nnx.merge(graphdef, state)` and returning
  `loss, nnx.to_pure_dict(nnx.state((model, optimizer)))`; `graphdef, state =
  nnx.split((model, optimizer))` and `state = nnx.to_pure_dict(state)` go before the loop,
  `loss, state = train_step(graphdef, state, x, y)` in it, `nnx.update((model, optimizer),
  state)` after it. With `cached` the `@nnx.jit` step (taking `model, optimizer` first) is called
  through `cached_train_step = nnx.cached_partial(train_step, model, optimizer)`, made before
  the loop. A step either style cannot be applied to safely (not called in a loop, nested loops,
  the loop also reading the model for `functional`, a train/eval switch inside the loop, a
  decode-mode view, ...) stays `@nnx.jit` (the `nnx-jit` style), with a report entry saying why;
- decoding: `decoder = Model(<same arguments>, decode=True)` with `cache = decoder.init(key,
  x)['cache']` becomes `decoder = nnx.with_attributes(model, decode=True)` and
  `decoder.init_cache(<shape of x>)`; its `mutable=['cache']` applies become plain calls;
- data parallelism: a step decorated `@partial(jax.pmap, axis_name=...)` and given replicated
  state becomes `@nnx.pmap(axis_name=..., in_axes=(None, None, 0, ...))` (model and optimizer
  broadcast, the body and its `pmean`s unchanged); `jax_utils.replicate` / `unreplicate` of
  the state go.

## Left as a TODO (the whole model's code is not changed)
Any other use of the model or its state (a `jax.tree.map` over the params, a checkpoint save, a
step with `static_argnums`, `jax.jit(step)` or `jax.pmap(step)` outside a decorator,
`mutable=['intermediates']`, a custom TrainState), `init` with `method=`, a size the inputs of
`init` do not determine, a state name also assigned other values. `rngs=` keys of `apply` are dropped (reported): the NNX model
draws from the streams of its own `nnx.Rngs`. A model built elsewhere than in the block of its
`init` (or of a class not converted in this file) is not touched.
"""

from __future__ import annotations

import dataclasses
import re
import typing as tp

import libcst as cst
from libcst.metadata import QualifiedNameProvider
from libcst.metadata import ScopeProvider

from codemods.report import EXAMPLE_INPUTS
from codemods.report import INPUT_DIMENSION
from codemods.report import UNDETERMINED
from codemods.report import ConstructorArgument
from codemods.report import ConvertedClass
from codemods.rule import KNOWN_CLASSES_KEY
from codemods.rule import MigrationRule
from codemods.rule import descendants
from codemods.variable_types import flax_variable_type
from codemods.vocabulary import ARRAY_MAKERS
from codemods.vocabulary import EVAL_VALUE
from codemods.vocabulary import FREEZERS
from codemods.vocabulary import GRADS
from codemods.vocabulary import IN_PLACE_COLLECTIONS_EXCLUDED
from codemods.vocabulary import JITS
from codemods.vocabulary import PMAPS
from codemods.vocabulary import PMAP_OPTIONS
from codemods.vocabulary import REPLICATES
from codemods.vocabulary import TREE_MAPS
from codemods.vocabulary import TREE_READERS
from nnx_bridge.layer_table import InputDim
from nnx_bridge.layer_table import LayerSpec
from nnx_bridge.layer_table import find_layer
from nnx_bridge.layer_table import linen_fields
from nnx_bridge.layer_table import nnx_arguments


VARIABLES, OPT_STATE, TRAIN_STATE, UPDATES, OPTAX_UPDATES = (
    'variables', 'opt_state', 'train_state', 'updates', 'optax_updates')
"""Kinds of Linen state a name can hold; a collection's kind is 'collection:<name>'."""
MODEL_STATE = (VARIABLES, OPT_STATE, TRAIN_STATE)
KEPT_STATE, KEPT_PARAMS = 'kept_train_state', 'kept_params'
"""With `--train-state keep`: a TrainState kept around `nnx.split` state, and its `params` (an nnx.State)."""
KEPT = (KEPT_STATE, KEPT_PARAMS)


def _collection(name: str) -> str:
  return f'collection:{name}'


def _collection_of(kind: str) -> str | None:
  return kind.split(':', 1)[1] if kind.startswith('collection:') else None


class _Skip(Exception):
  """A use this rule does not convert: the whole model's code stays as it is, with a TODO."""

  def __init__(self, node: cst.CSTNode, message: str) -> None:
    super().__init__(message)
    self.node, self.message = node, message


Edit = tp.Callable[[tp.Any], tp.Any]


@dataclasses.dataclass
class _Function:
  """A step or loss function the state is passed to: which parameters hold state, what it returns."""

  node: cst.FunctionDef | cst.Lambda
  loss_of: cst.Call | None = None  # the `jax.grad(fn)(params)` call, for a loss function
  kinds: dict[int, str] = dataclasses.field(default_factory=dict)  # parameter position -> kind
  drops: dict[tuple[int, ...], str] = dataclasses.field(default_factory=dict)  # returned state: path -> kind
  returns: dict[cst.Return, set[tuple[int, ...]]] = dataclasses.field(default_factory=dict)  # -> its drops
  calls: set[cst.Call] = dataclasses.field(default_factory=set)
  pmap: tuple[cst.Decorator, dict[str, cst.BaseExpression]] | None = None  # a jax.pmap decorator and its options


@dataclasses.dataclass
class _Group:
  """One model: its construction, its init, and everything done with it and its state."""

  model: str
  record: ConvertedClass
  init: cst.SimpleStatementLine
  scope: tp.Any  # the libcst scope of the init statement
  statements: dict[cst.BaseStatement, tp.Any] = dataclasses.field(default_factory=dict)
  edits: dict[cst.CSTNode, Edit] = dataclasses.field(default_factory=dict)
  modes: dict[cst.CSTNode, bool | None] = dataclasses.field(default_factory=dict)  # statement/function -> eval?
  changes: list[tuple[cst.CSTNode, str]] = dataclasses.field(default_factory=list)
  names: dict[tuple[int, str], str] = dataclasses.field(default_factory=dict)  # (scope id, name) -> kind
  name_scopes: dict[tuple[int, str], tp.Any] = dataclasses.field(default_factory=dict)
  recognized: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # assignments of state names we rewrote
  visited: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # state expressions we handled
  applies: dict[cst.Call, str | None] = dataclasses.field(default_factory=dict)  # apply call -> method
  model_uses: set[cst.CSTNode] = dataclasses.field(default_factory=set)
  functions: dict[cst.CSTNode, _Function] = dataclasses.field(default_factory=dict)
  done: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # calls / statements already rewritten
  tuple_aliases: set[cst.Assign] = dataclasses.field(default_factory=set)
  twins: set[str] = dataclasses.field(default_factory=set)  # decode-mode views of the model (`decoder`)
  state_reads: list[tuple[cst.CSTNode, str]] = dataclasses.field(default_factory=list)  # node, nnx filter
  kept_state: bool = False  # with --train-state keep, once the TrainState is kept
  kept_modes: set[bool] = dataclasses.field(default_factory=set)  # train/eval of the kept TrainState's applies
  applied: dict[cst.CSTNode, set[str]] = dataclasses.field(default_factory=dict)  # function -> modules it applies
  optimizer: str | None = None
  layer: LayerSpec | None = None  # for a built-in layer used as the model (`nn.Dense(10)`)
  mode_inserts: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # statements a mode call is placed at
  kept_steps: set[cst.FunctionDef] = dataclasses.field(default_factory=set)  # steps over a kept TrainState


class ConvertInitApplyRule(MigrationRule):
  """Rewrites the call sites and training code of the classes L2N002 converted in the same file."""

  CODE = 'L2N003'
  DESCRIPTION = ('model.init(key, x) -> Model(..., rngs=nnx.Rngs(key)); model.apply(variables, x) -> model(x); '
                 'training steps over params -> nnx.jit steps over the model with nnx.Optimizer.')
  AFTER = ('L2N002',)
  REQUIRES = ('init',)
  METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider)

  def __init__(self, context: cst.codemod.CodemodContext) -> None:
    super().__init__(context)
    self._records = {r.nnx_name: r for r in context.scratch.get(KNOWN_CLASSES_KEY, ())}
    self._statements: dict[cst.CSTNode, tp.Any] = {}
    self._edits: dict[cst.CSTNode, Edit] = {}
    self._claimed: set[cst.CSTNode] = set()  # init statements of decode-mode twins, part of their model's group
    self._introduced: dict[str, int] = {}  # names the step styles bind (graphdef, state, ...) -> id of their group

  def visit_Module(self, node: cst.Module) -> None:
    self._names_in_module = {n.value for n in descendants(node) if isinstance(n, cst.Name)}
    self._block(node.body)
    for sub in descendants(node):
      if isinstance(sub, cst.IndentedBlock):
        self._block(sub.body)

  def on_leave(self, original_node: cst.CSTNode, updated_node: tp.Any) -> tp.Any:
    updated_node = super().on_leave(original_node, updated_node)
    if original_node in self._edits:
      updated_node = self._edits[original_node](updated_node)
    if original_node in self._statements:
      new = self._statements[original_node]
      if not new:
        return cst.RemoveFromParent()
      return cst.FlattenSentinel([updated_node if s is original_node else s for s in new])
    return updated_node

  # --- finding models --------------------------------------------------------------------------

  def _block(self, statements: tp.Sequence[cst.BaseStatement]) -> None:
    for index, statement in enumerate(statements):
      found = _init_statement(statement)
      if found is None or statement in self._claimed:
        continue
      construction = next((s for s in reversed(statements[:index]) if _assigned_name(s) == found[1]), None)
      value = _assigned_value(construction) if construction is not None else None
      if not isinstance(value, cst.Call):
        continue
      try:
        built = self._model_class(value)
        if built is None:
          continue  # not a model of a class converted here (`opt_state = tx.init(params)`, ...)
        group = self._group(statements, index, construction, *built, *found)
      except _Skip as skip:
        self.report_todo(skip.node, f'{skip.message}; left as Linen')
        continue
      self._statements.update(group.statements)
      self._edits.update(group.edits)
      self.add_needed_import('flax', 'nnx')
      for node, message in group.changes:
        self.report_change(node, message)

  def _model_class(self, value: cst.Call) -> tuple[ConvertedClass, LayerSpec | None, str, list[str]] | None:
    """The record, layer row, NNX class and constructor arguments for `Model(...)` / `nn.Dense(...)`."""
    if isinstance(value.func, cst.Name) and value.func.value in self._records:
      args = [self._code(a).rstrip(',') for a in value.args]
      return self._records[value.func.value], None, value.func.value, args
    spec = next((find_layer(q.name) for q in self.get_metadata(QualifiedNameProvider, value.func, set())
                 if find_layer(q.name) is not None), None)
    if spec is None or spec.nnx is None:
      return None
    if not all(isinstance(source, InputDim) and source.axis == -1 and not source.optional for _, source in spec.derived):
      raise _Skip(value, f'{spec.linen} built outside a module, with sizes NNX reads off more than the last axis')
    fields, accepted, renames = linen_fields(spec.linen), nnx_arguments(spec.nnx), dict(spec.arg_renames)
    only = {k.name for k in spec.linen_only}
    given = {}
    for position, arg in enumerate(value.args):
      if arg.star or (arg.keyword is None and position >= len(fields)):
        raise _Skip(arg, f'{spec.linen} built with *args / **kwargs or too many arguments')
      given[arg.keyword.value if arg.keyword is not None else fields[position]] = self._code(arg.value)
    args = []
    for name, code in given.items():
      if name in only or renames.get(name, name) not in accepted:
        raise _Skip(value, f'{name}= of {spec.linen} has no NNX counterpart to pass it to')
      args.append(f'{renames.get(name, name)}={code}')
    args += [f'{k}={v!r}' for k, v in spec.linen_defaults if k not in given]
    sizes = tuple(ConstructorArgument(name, INPUT_DIMENSION, f'{source.describe(spec.call_args)}',
                                      input=spec.call_args[source.arg]) for name, source in spec.derived)
    record = ConvertedClass(0, spec.linen, spec.nnx, sizes, (), call_arguments=spec.call_args)
    self.remove_import_of(value.func)
    return record, spec, f'nnx.{spec.nnx.rpartition(".")[2]}', args

  def _group(self, statements: tp.Sequence[cst.BaseStatement], index: int, construction: cst.SimpleStatementLine,
             record: ConvertedClass, layer: LayerSpec | None, nnx_class: str, ctor_args: list[str],
             target: str, model: str, call: cst.Call, kind: str) -> _Group:
    init = statements[index]
    between = statements[statements.index(construction) + 1:index]
    if any(isinstance(n, cst.Name) and n.value == model for s in between for n in descendants(s)):
      raise _Skip(call, f'{model}.init: {model} is used between its construction and init')
    group = _Group(model, record, init, self.get_metadata(ScopeProvider, init), layer=layer)
    if len(self._assignments(group.scope, model)) != 1:
      raise _Skip(call, f'{model}.init: {model} is assigned more than once')
    rngs, inputs = self._init_arguments(group, call)
    sizes = self._sizes(group, call, inputs)
    args = [*sizes, *ctor_args, f'rngs={rngs}'] if layer is not None else [*ctor_args, *sizes, f'rngs={rngs}']
    new = cst.parse_statement(f'{model} = {nnx_class}({", ".join(args)})\n')
    group.statements[construction] = None
    following = statements[statements.index(construction) + 1]
    if following is init:
      group.statements[init] = [new.with_changes(leading_lines=construction.leading_lines)]
    else:
      group.statements[init] = [new.with_changes(leading_lines=init.leading_lines)]
      group.edits[following] = lambda updated: updated.with_changes(
          leading_lines=[*construction.leading_lines, *updated.leading_lines])
    group.changes.append((call, f'{model}.init(...) -> {nnx_class}(..., {", ".join([*sizes, f"rngs={rngs}"])})'))
    group.model_uses.add(call.func.value)
    group.recognized.add(init.body[0].targets[0].target)
    for wrapper in descendants(init.body[0].value):
      if isinstance(wrapper, cst.Call) and FREEZERS.match(cst.helpers.get_full_name_for_node(wrapper.func) or ''):
        self.remove_import_of(wrapper.func)
    self._twins(group, statements, index, construction.body[0].value)
    self._name(group, group.scope, target, kind)
    self._finish_functions(group)
    self._finish_state_reads(group)
    self._check_applies(group)
    self._check_tuple_aliases(group)
    self._check_assignments(group)
    self._check_model_uses(group)
    self._place_modes(group, statements)
    self._step_styles(group)
    return group

  def _twins(self, group: _Group, statements: tp.Sequence[cst.BaseStatement], index: int, model_call: cst.Call) -> None:
    """`decoder = Model(<same arguments>, decode=True)` and `cache = decoder.init(key, x)['cache']` later on.

    The lm1b / wmt pattern: a decode-mode instance sharing the trained params. It becomes
    `decoder = nnx.with_attributes(model, decode=True)` (the same Variables, `decode` set on every
    submodule that has it) and `decoder.init_cache(<shape of x>)` (L2N002's cache method).
    """
    base = self._arguments(model_call, drop='decode')
    for position in range(index + 1, len(statements)):
      statement, value = statements[position], _assigned_value(statements[position])
      decode = [a for a in value.args if a.keyword is not None and a.keyword.value == 'decode'] \
          if isinstance(value, cst.Call) and self._code(value.func) == self._code(model_call.func) else []
      if not decode or self._arguments(value, drop='decode') != base:
        continue
      name = _assigned_name(statement)
      found = next(((s, f) for s in statements[position + 1:] if (f := _init_statement(s)) and f[1] == name), None)
      if found is None or found[1][3] != _collection('cache') or not group.record.cache_input:
        raise _Skip(value, f"{name}: a decode-mode {self._code(value.func)} without `... = {name}.init(key, x)['cache']`")
      init, (target, _, call, _) = found
      if len(self._assignments(group.scope, name)) != 1:
        raise _Skip(value, f'{name} is assigned more than once')
      example = self._init_arguments(group, call)[1].get(group.record.cache_input)
      if example is None:
        raise _Skip(call, f'{name}.init without the {group.record.cache_input} whose shape init_cache takes')
      view = f'{name} = nnx.with_attributes({group.model}, decode={self._code(decode[0].value)})'
      self._replace_statement(group, statement.body[0], view)
      group.statements[init] = [cst.parse_statement(f'{name}.init_cache({self._shape(example)})\n').with_changes(
          leading_lines=init.leading_lines)]
      group.changes.append((value, f'{view}: a decode-mode view sharing the variables of {group.model}'))
      group.changes.append((call, f'{name}.init(...)[\'cache\'] -> {name}.init_cache({self._shape(example)})'))
      group.twins.add(name)
      group.model_uses.add(call.func.value)
      group.recognized.update((statement.body[0].targets[0].target, init.body[0].targets[0].target))
      self._claimed.add(init)
      self._name(group, group.scope, target, _collection('cache'))

  def _arguments(self, call: cst.Call, drop: str) -> list[str]:
    return [self._code(a).rstrip(',') for a in call.args if not (a.keyword is not None and a.keyword.value == drop)]

  def _shape(self, example: cst.BaseExpression) -> str:
    """`(4, 12)` for `jnp.ones((4, 12), jnp.int32)`, else `<example>.shape`."""
    if isinstance(example, cst.Call) and example.args and isinstance(example.args[0].value, cst.Tuple) \
        and ARRAY_MAKERS.match(cst.helpers.get_full_name_for_node(example.func) or ''):
      return self._code(example.args[0].value)
    return f'{self._code(example)}.shape'

  def _assignments(self, scope: tp.Any, name: str) -> list[tp.Any]:
    return [a for a in scope.assignments[name]] if scope is not None else []

  # --- init ------------------------------------------------------------------------------------

  def _init_arguments(self, group: _Group, call: cst.Call) -> tuple[str, dict[str, cst.BaseExpression]]:
    """The `nnx.Rngs(...)` code for init's key, and its inputs by `__call__` argument name."""
    positional = [a for a in call.args if a.keyword is None]
    if not positional or any(a.star for a in call.args):
      raise _Skip(call, f'{group.model}.init without a positional key, or with *args / **kwargs')
    call_names = group.record.call_arguments
    inputs: dict[str, cst.BaseExpression] = {}
    for position, arg in enumerate(positional[1:]):
      if position >= len(call_names):
        raise _Skip(arg, f'{group.model}.init: more inputs than {group.record.linen_name}.__call__ takes')
      inputs[call_names[position]] = arg.value
    for arg in call.args:
      if arg.keyword is None:
        continue
      name = arg.keyword.value
      if name not in call_names or name == 'method':
        raise _Skip(arg, f'{group.model}.init with {name}=')
      inputs[name] = arg.value
    key = positional[0].value
    if isinstance(key, cst.Dict):
      if _literal_keys(key) is None or not all(k.isidentifier() for k in _literal_keys(key)):
        raise _Skip(key, f'{group.model}.init with an rngs dict whose stream names are not literal identifiers')
      code = ', '.join(f'{e.key.evaluated_value}={self.module.code_for_node(e.value)}' for e in key.elements)
      return f'nnx.Rngs({code})', inputs
    return _rngs(self.module.code_for_node(key)), inputs

  def _sizes(self, group: _Group, call: cst.Call, inputs: dict[str, cst.BaseExpression]) -> list[str]:
    """`name=<last axis of an example input>` for each size argument of the record."""
    sizes = []
    for argument in group.record.arguments:
      if argument.origin == EXAMPLE_INPUTS:
        raise _Skip(call, f'{group.model}.init: {argument.name} ({argument.detail}) is not derived from its inputs')
      if argument.origin not in (INPUT_DIMENSION, UNDETERMINED):
        continue
      example = inputs.get(argument.input) if argument.input else None
      if example is None:
        raise _Skip(call, f'{group.model}.init: the inputs do not determine {argument.name} ({argument.detail})')
      sizes.append(f'{argument.name}={self._last_axis(example)}')
    return sizes

  def _last_axis(self, example: cst.BaseExpression) -> str:
    """`784` for `jnp.ones((1, 784))`, else `<example>.shape[-1]`."""
    if isinstance(example, cst.Call) and example.args and isinstance(example.args[0].value, cst.Tuple):
      func = cst.helpers.get_full_name_for_node(example.func) or ''
      elements = example.args[0].value.elements
      if ARRAY_MAKERS.match(func) and elements and isinstance(elements[-1].value, cst.Integer):
        return elements[-1].value.value
    code = self.module.code_for_node(example)
    return f'{code}.shape[-1]' if isinstance(example, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) \
        else f'({code}).shape[-1]'

  # --- following the state ---------------------------------------------------------------------

  def _name(self, group: _Group, scope: tp.Any, name: str, kind: str) -> None:
    """`name` holds state of `kind` in `scope`: every use of it must be one this rule converts."""
    key = (id(scope), name)
    if key in group.names:
      if group.names[key] != kind:
        raise _Skip(self._assignments(scope, name)[0].node, f'{name} holds two kinds of state ({group.names[key]}, {kind})')
      return
    group.names[key], group.name_scopes[key] = kind, scope
    accesses = {a.node: a for assignment in self._assignments(scope, name) for a in assignment.references
                if _resolves_to(a.scope, name, scope)}
    for node in sorted(accesses, key=self._position):
      self._use(group, node, kind)

  def _use(self, group: _Group, node: cst.BaseExpression, kind: str) -> None:
    """Dispatches one use of a state expression by where it sits."""
    group.visited.add(node)
    parent = self._parent(node)
    if isinstance(parent, cst.Attribute) and parent.value is node:
      return self._attribute(group, parent, kind)
    if isinstance(parent, cst.Subscript) and parent.value is node:
      return self._subscript(group, parent, kind)
    if isinstance(parent, cst.Arg) and parent.value is node:
      return self._argument(group, self._parent(parent), parent, node, kind)
    if isinstance(parent, cst.DictElement) and parent.value is node:
      arg = self._parent(self._parent(parent))
      call = self._parent(arg) if isinstance(arg, cst.Arg) else None
      if isinstance(call, cst.Call) and call.args and call.args[0] is arg and self._is_apply(group, call) \
          and kind not in (OPT_STATE, TRAIN_STATE, OPTAX_UPDATES, UPDATES, KEPT_STATE):
        return self._apply(group, call)
    if isinstance(parent, cst.Assign) and parent.value is node and kind not in (OPTAX_UPDATES,):
      return self._alias(group, parent, kind)
    if isinstance(parent, cst.Element) and isinstance(self._parent(parent), cst.Tuple):
      assign = self._parent(self._parent(parent))
      if isinstance(assign, cst.Assign) and assign.value is self._parent(parent):
        return self._tuple_alias(group, assign, list(assign.value.elements).index(parent), kind)
    if isinstance(parent, (cst.Element, cst.Return)) and kind in KEPT:
      return None  # a kept TrainState is returned and passed on as in Linen
    if isinstance(parent, (cst.Element, cst.Return)):
      return self._returned(group, node, kind)
    raise _Skip(node, f'{self._code(node)} ({_describe(kind)}) is used by code not converted yet '
                      '(a tree map, a checkpoint save, ...)')

  def _attribute(self, group: _Group, attribute: cst.Attribute, kind: str) -> None:
    name, parent = attribute.attr.value, self._parent(attribute)
    if kind == KEPT_STATE:
      return self._kept_attribute(group, attribute, name, parent)
    if kind == TRAIN_STATE and name == 'params':
      return self._use(group, attribute, _collection('params'))
    if kind == TRAIN_STATE and name == 'apply_fn' and isinstance(parent, cst.Call) and parent.func is attribute:
      return self._apply(group, parent)
    if kind == TRAIN_STATE and name == 'step':
      optimizer = self._optimizer(group, attribute)
      group.edits[attribute] = lambda _: cst.parse_expression(f'{optimizer}.step[...]')
      return None
    if kind == TRAIN_STATE and name == 'apply_gradients' and isinstance(parent, cst.Call):
      assign = self._parent(parent)
      grads = [a for a in parent.args if a.keyword is not None and a.keyword.value == 'grads']
      if len(parent.args) == 1 and grads and isinstance(assign, cst.Assign) and assign.value is parent \
          and _single_name_target(assign):
        optimizer = self._optimizer(group, parent)
        grads_code = self._code(grads[0].value)
        group.edits[assign] = lambda _: cst.Expr(cst.parse_expression(f'{optimizer}.update({group.model}, {grads_code})'))
        group.changes.append((parent, f'state.apply_gradients(grads=...) -> {optimizer}.update({group.model}, grads)'))
        return self._target(group, assign.targets[0].target, TRAIN_STATE)
    raise _Skip(attribute, f'{self._code(attribute)} ({_describe(kind)}) is used by code not converted yet')

  def _subscript(self, group: _Group, subscript: cst.Subscript, kind: str) -> None:
    keys, top = _keys(subscript, self._parent)
    if kind in (VARIABLES, UPDATES) and keys[0] is not None:
      group.visited.add(subscript)
      if len(keys) == 1:
        return self._use(group, subscript, _collection(keys[0]))
      return self._leaf(group, top, keys)
    collection = _collection_of(kind)
    if collection is not None:
      return self._leaf(group, top, [collection, *keys])
    if kind == KEPT_PARAMS:  # an nnx.State: the same leaves under the NNX attribute names
      return self._leaf(group, top, ['params', *keys], state=self._code(subscript.value))
    raise _Skip(subscript, f'{self._code(subscript)}: a read of {_describe(kind)} not converted yet')

  def _leaf(self, group: _Group, node: cst.CSTNode, keys: list[str | None], state: str | None = None) -> None:
    """`model.block.linear.kernel[...]` for ['params', 'Block_0', 'Dense_0', 'kernel'].

    With `state` (the code of an nnx.State of the model): `<state>['block']['linear']['kernel'][...]`.
    """
    if any(k is None for k in keys):
      raise _Skip(node, 'a variables read with keys that are not literal strings')
    if isinstance(self._parent(node), (cst.AssignTarget, cst.AugAssign, cst.Del)):
      raise _Skip(node, 'a write into the variables')
    record, code, layer = group.record, group.model if state is None else state, group.layer
    step = (lambda name: f'.{name}') if state is None else (lambda name: f'[{name!r}]')
    for key in keys[1:]:
      if layer is not None:
        if layer.params.key_renames or layer.params.fuse or layer.params.drop:
          raise _Skip(node, f'a read of {key} in a layer whose NNX parameters are laid out differently')
        group.edits[node] = _expression(f'{code}{step(key)}[...]')
        return
      child = {c.linen_name: c for c in record.children}.get(key) if record else None
      if child is None:
        raise _Skip(node, f'a variables read of {key}, which the record of {group.record.nnx_name} does not name')
      code += step(child.nnx_attribute)
      if child.linen_class in self._records:
        record = self._records[child.linen_class]
      elif child.linen_class is not None and find_layer(child.linen_class) is not None:
        record, layer = None, find_layer(child.linen_class)
      elif child.linen_class is not None:
        raise _Skip(node, f'a variables read below {key}, a {child.linen_class}')
      else:
        if key != keys[-1]:
          raise _Skip(node, f'a variables read below {key}')
        group.edits[node] = _expression(f'{code}[...]')
        return
    path = ''.join(f'[{k!r}]' for k in keys)
    raise _Skip(node, f'a whole tree of variables ({path}) is used by code not converted yet '
                      '(a tree map, a checkpoint save, ...)')

  def _alias(self, group: _Group, assign: cst.Assign, kind: str) -> None:
    """`params = variables['params']`: the statement goes, `params` is followed as state."""
    if not _single_name_target(assign):
      raise _Skip(assign, f'{self._code(assign.value)} assigned to something other than one name')
    group.statements[self._statement(assign)] = None
    self._target(group, assign.targets[0].target, kind)

  def _tuple_alias(self, group: _Group, assign: cst.Assign, index: int, kind: str) -> None:
    """`params, stats = variables['params'], variables['batch_stats']`: goes when every value is state."""
    target = assign.targets[0].target if len(assign.targets) == 1 else None
    if not (isinstance(target, cst.Tuple) and len(target.elements) == len(assign.value.elements)):
      raise _Skip(assign, f'{self._code(assign.value)} unpacked into something other than as many names')
    group.statements[self._statement(assign)] = None
    group.tuple_aliases.add(assign)
    self._target(group, target.elements[index].value, kind)

  def _target(self, group: _Group, target: cst.CSTNode, kind: str) -> None:
    """An assignment target that receives state: a name followed as state (or `_`)."""
    if not isinstance(target, cst.Name):
      raise _Skip(target, f'{_describe(kind)} assigned to {self._code(target)}')
    group.recognized.add(target)
    if target.value != '_':
      self._name(group, self.get_metadata(ScopeProvider, target), target.value, kind)

  def _argument(self, group: _Group, call: cst.Call, arg: cst.Arg, node: cst.BaseExpression, kind: str) -> None:
    func = cst.helpers.get_full_name_for_node(call.func) or ''
    first = call.args[0] is arg
    if first and self._is_apply(group, call) and kind not in (OPT_STATE, TRAIN_STATE, OPTAX_UPDATES, UPDATES):
      return self._apply(group, call)
    if (FREEZERS.match(func) or REPLICATES.match(func)) and len(call.args) == 1:
      group.edits[call] = lambda updated: updated.args[0].value
      self.remove_import_of(call.func)
      why = 'NNX state is a plain object' if FREEZERS.match(func) else 'nnx.pmap broadcasts the model to the devices'
      group.changes.append((call, f'{func}(...) dropped: {why}'))
      return self._use(group, call, kind)
    if isinstance(call.func, cst.Call) and first and kind in (_collection('params'), KEPT_PARAMS) \
        and (cst.helpers.get_full_name_for_node(call.func.func) or '') in GRADS:
      return self._grad(group, call, kept=kind == KEPT_PARAMS)
    if kind in KEPT and func in TREE_READERS:
      return None  # the same leaves as in Linen
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == 'init' and len(call.args) == 1 \
        and kind == _collection('params'):
      return self._optimizer_init(group, call)
    if func.endswith('TrainState.create') and arg.keyword is not None and arg.keyword.value == 'params' \
        and kind == _collection('params'):
      return self._train_state(group, call)
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == 'update' \
        and ((kind == OPT_STATE and call.args.index(arg) == 1) or (kind == _collection('params') and call.args.index(arg) == 2)):
      return self._optax_update(group, call)
    if func.endswith('apply_updates') and (kind == _collection('params') and first
                                           or kind == OPTAX_UPDATES and call.args.index(arg) == 1):
      return self._apply_updates(group, call)
    if func in TREE_MAPS and kind == _collection('params') and not first:
      return self._tree_map_update(group, call, node)
    if func in TREE_READERS and (kind == VARIABLES or flax_variable_type(_collection_of(kind) or '')):
      return self._state_read(group, call, node, kind)
    if isinstance(call.func, cst.Name) and arg.keyword is None and not arg.star and kind != OPTAX_UPDATES:
      function = self._function_def(call.func)
      if function is not None and kind in KEPT:
        return self._kept_step_argument(group, call, function, call.args.index(arg), kind)
      if function is not None:
        return self._step_argument(group, call, function, call.args.index(arg), kind)
    raise _Skip(node, f'{self._code(node)} ({_describe(kind)}) is passed to {func or "a call"}, which is not '
                      'converted yet')

  # --- apply -----------------------------------------------------------------------------------

  def _is_apply(self, group: _Group, call: cst.Call) -> bool:
    """`model.apply(...)`, or `state.apply_fn(...)` (checked to be the model's TrainState at the end)."""
    func = call.func
    return any(_is_method(func, module, 'apply') for module in (group.model, *group.twins)) or (
        isinstance(func, cst.Attribute) and func.attr.value == 'apply_fn' and isinstance(func.value, cst.Name))

  def _apply(self, group: _Group, call: cst.Call) -> None:
    if call in group.applies:
      return
    if group.kept_state:
      return self._kept_apply(group, call)
    method, mode, mutable, drop = None, None, None, [call.args[0]]
    for arg in call.args[1:]:
      name = arg.keyword.value if arg.keyword is not None else None
      if arg.star:
        raise _Skip(call, f'{group.model}.apply with *args / **kwargs')
      if name == 'method':
        method = self._method_name(group, arg.value)
      elif name in group.record.mode_arguments:
        if not (isinstance(arg.value, cst.Name) and arg.value.value in ('True', 'False')):
          raise _Skip(arg, f'{group.model}.apply with {name}= not a literal True / False')
        mode = (arg.value.value == 'True') == EVAL_VALUE[name]
      elif name == 'rngs':
        streams = _literal_keys(arg.value)
        if streams is None:
          raise _Skip(arg, f'{group.model}.apply with rngs= that is not a dict with literal stream names')
        group.changes.append((arg, f'{self._code(call.func)}(..., rngs=...) keys for {", ".join(streams)} dropped: the '
                                   f'NNX model draws them from the streams of its own nnx.Rngs'))
      elif name == 'mutable':
        mutable = _mutable_collections(arg.value)
        if mutable is None or any(c in IN_PLACE_COLLECTIONS_EXCLUDED for c in mutable):
          raise _Skip(arg, f'{group.model}.apply with mutable={self._code(arg.value)} (only collections NNX '
                           'updates in place, e.g. batch_stats or cache, are converted)')
      elif name is None or name in group.record.call_arguments:
        continue
      else:
        raise _Skip(arg, f'{group.model}.apply with {name}=')
      drop.append(arg)
    group.applies[call] = method
    module = group.model
    if any(_is_method(call.func, m, 'apply') for m in (group.model, *group.twins)):
      group.model_uses.add(call.func.value)
      module = call.func.value.value
    if module != group.model and mode is not None:
      raise _Skip(call, f'{module}.apply with a train/eval argument (set the mode on the view by hand)')
    target = f'{module}.{method}' if method else module
    kept = [a for a in call.args if a not in drop]
    group.edits[call] = lambda updated: updated.with_changes(
        func=cst.parse_expression(target), whitespace_before_args=cst.SimpleWhitespace(''),
        args=_args_with_commas([updated.args[call.args.index(a)].with_changes(
            comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=cst.SimpleWhitespace('')) for a in kept]))
    group.changes.append((call, f'{self._code(call.func)}(variables, ...) -> {target}(...)'))
    if mutable is not None:
      self._mutable_result(group, call)
    owner = self._mode_owner(group, call)
    group.applied.setdefault(owner, set()).add(module)
    if mode is not None:
      if group.modes.get(owner, mode) != mode:
        raise _Skip(call, f'{group.model}.apply in train and eval mode in one statement or step')
      group.modes[owner] = mode
    elif group.record.mode_arguments and method is None:
      group.modes.setdefault(owner, None)

  def _mutable_result(self, group: _Group, call: cst.Call) -> None:
    """`out, updates = model.apply(..., mutable=[...])` -> `out = model(...)`; `updates` followed."""
    assign = self._parent(call)
    if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Tuple) and len(assign.targets[0].target.elements) == 2):
      raise _Skip(call, f'{group.model}.apply(..., mutable=...) whose result is not unpacked as `out, updates = ...`')
    output, updates = (e.value for e in assign.targets[0].target.elements)
    group.edits[assign] = lambda updated: updated.with_changes(
        targets=[cst.AssignTarget(updated.targets[0].target.elements[0].value)])
    group.changes.append((call, f'{self._code(call.func)}(..., mutable=...): the NNX call updates the model in '
                                f'place; {self._code(updates)} goes'))
    del output
    self._target(group, updates, UPDATES)

  def _method_name(self, group: _Group, value: cst.BaseExpression) -> str:
    """`'encode'` or `Model.encode` -> 'encode'."""
    if isinstance(value, cst.SimpleString) and value.evaluated_value.isidentifier():
      return value.evaluated_value
    if isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) \
        and value.value.value == group.record.nnx_name:
      return value.attr.value
    raise _Skip(value, f'{group.model}.apply with a method= that is not a method name')

  # --- optimizers ------------------------------------------------------------------------------

  def _optimizer(self, group: _Group, node: cst.CSTNode) -> str:
    if group.optimizer is None:
      name = next((n for n in ('optimizer', 'nnx_optimizer') if n not in self._names_in_module), None)
      if name is None:
        raise _Skip(node, 'the names optimizer and nnx_optimizer are both taken')
      group.optimizer = name
    return group.optimizer

  def _optimizer_init(self, group: _Group, call: cst.Call) -> None:
    """`opt_state = tx.init(params)` -> `optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)`."""
    assign = self._parent(call)
    if not (isinstance(assign, cst.Assign) and assign.value is call and _single_name_target(assign)):
      raise _Skip(call, f'{self._code(call)} not assigned to one name')
    if group.optimizer is not None:
      raise _Skip(call, f'a second optimizer for {group.model}')
    optimizer, tx = self._optimizer(group, call), self._code(call.func.value)
    self._replace_statement(group, assign, f'{optimizer} = nnx.Optimizer({group.model}, {tx}, wrt=nnx.Param)')
    group.changes.append((call, f'{self._code(call)} -> {optimizer} = nnx.Optimizer({group.model}, {tx}, wrt=nnx.Param)'))
    self._target(group, assign.targets[0].target, OPT_STATE)

  def _train_state(self, group: _Group, call: cst.Call) -> None:
    """`state = TrainState.create(apply_fn=model.apply, params=params, tx=tx)` -> an nnx.Optimizer."""
    assign = self._parent(call)
    arguments = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if not (isinstance(assign, cst.Assign) and assign.value is call and _single_name_target(assign)) \
        or sorted(arguments) != ['apply_fn', 'params', 'tx'] or len(call.args) != 3 \
        or not _is_method(arguments['apply_fn'], group.model, 'apply'):
      raise _Skip(call, 'a TrainState other than TrainState.create(apply_fn=model.apply, params=params, tx=tx) '
                        'assigned to one name')
    if group.optimizer is not None or group.kept_state:
      raise _Skip(call, f'a second optimizer for {group.model}')
    group.model_uses.add(arguments['apply_fn'].value)
    if self.options.train_state == 'keep':
      return self._keep_train_state(group, call, assign, arguments)
    self.remove_import_of(call.func)
    optimizer, tx = self._optimizer(group, call), self._code(arguments['tx'])
    self._replace_statement(group, assign, f'{optimizer} = nnx.Optimizer({group.model}, {tx}, wrt=nnx.Param)')
    group.changes.append((call, f'TrainState.create(...) -> {optimizer} = nnx.Optimizer({group.model}, {tx}, '
                                f'wrt=nnx.Param); the TrainState\'s uses go to {group.model} and {optimizer}'))
    self._target(group, assign.targets[0].target, TRAIN_STATE)

  def _keep_train_state(self, group: _Group, call: cst.Call, assign: cst.Assign,
                        arguments: dict[str, cst.BaseExpression]) -> None:
    """`--train-state keep`: the TrainState stays, around `nnx.split` state (the migration guide's variant).

    `graphdef, params, other_variables = nnx.split(model, nnx.Param, ...)`, a TrainState subclass
    with an `other_variables` field, and `TrainState.create(apply_fn=graphdef.apply, ...)`.
    """
    names = ('graphdef', 'other_variables', 'NNXTrainState')
    taken = [n for n in names if n in self._names_in_module or n in self._introduced]
    if taken:
      raise _Skip(call, f'keeping the TrainState needs the names {", ".join(taken)}, which are taken')
    if group.record.mode_arguments:
      raise _Skip(call, f'a kept TrainState would drop the rng and batch-stat updates of {group.model} between '
                        'steps (nnx.split state in other_variables); use --train-state nnx')
    self._introduced.update({n: id(group) for n in names})
    params = self._code(arguments['params']) if isinstance(arguments['params'], cst.Name) else 'params'
    base, tx, state = self._code(call.func.value), self._code(arguments['tx']), assign.targets[0].target.value
    lines = [f'class NNXTrainState({base}):\n  other_variables: nnx.State\n',
             f'graphdef, {params}, other_variables = nnx.split({group.model}, nnx.Param, ...)\n',
             f'{state} = NNXTrainState.create(apply_fn=graphdef.apply, params={params}, '
             f'other_variables=other_variables, tx={tx})\n']
    line = self._statement(assign)
    blank = [cst.EmptyLine()] * (2 if isinstance(self._parent(line), cst.Module) else 1)
    split, create = (cst.parse_statement(code) for code in lines[1:])
    group.statements[line] = [cst.parse_statement(lines[0]).with_changes(leading_lines=line.leading_lines),
                              split.with_changes(leading_lines=blank), create]
    group.kept_state = True
    group.changes.append((call, f'TrainState.create(...) kept around nnx.split({group.model}, nnx.Param, ...) '
                                '(--train-state keep): NNXTrainState adds other_variables'))
    self._target(group, assign.targets[0].target, KEPT_STATE)

  def _kept_attribute(self, group: _Group, attribute: cst.Attribute, name: str, parent: cst.CSTNode | None) -> None:
    """A kept TrainState is used as in Linen; `apply_fn` calls change form, `params` is followed."""
    if name == 'apply_fn' and isinstance(parent, cst.Call) and parent.func is attribute:
      return self._apply(group, parent)
    if name == 'params':
      return self._use(group, attribute, KEPT_PARAMS)
    assign = self._parent(parent) if isinstance(parent, cst.Call) else None
    if name == 'apply_gradients' and isinstance(assign, cst.Assign) and assign.value is parent \
        and _single_name_target(assign):
      return self._target(group, assign.targets[0].target, KEPT_STATE)
    if name in ('apply_gradients', 'step', 'opt_state', 'tx', 'replace'):
      return None
    raise _Skip(attribute, f'{self._code(attribute)} of a kept TrainState is not converted yet')

  def _kept_step_argument(self, group: _Group, call: cst.Call, function: cst.FunctionDef, position: int,
                          kind: str) -> None:
    """A kept TrainState (or its params) passed to a step: the step stays a jax step; its parameter is followed."""
    params = function.params
    if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.posonly_params or position >= len(params.params):
      raise _Skip(call, f'{function.name.value}: state passed to a parameter that is not a plain positional one')
    name = call.args[position].value
    assign = self._parent(call)
    if isinstance(assign, cst.Assign) and assign.value is call and isinstance(name, cst.Name):
      targets = [assign.targets[0].target]
      while targets and isinstance(targets[0], cst.Tuple):
        targets = [e.value for e in targets.pop(0).elements] + targets
      group.recognized.update(t for t in targets if isinstance(t, cst.Name) and t.value == name.value)
    param = params.params[position]
    group.recognized.add(param)
    group.kept_steps.add(function)
    self._name(group, self.get_metadata(ScopeProvider, function.body), param.name.value, kind)

  def _kept_apply(self, group: _Group, call: cst.Call) -> None:
    """`state.apply_fn({'params': params}, x, ...)` -> `state.apply_fn(params, state.other_variables)(x)[0]`."""
    first = call.args[0].value
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == 'apply_fn'
            and isinstance(call.func.value, cst.Name) and isinstance(first, cst.Dict)
            and _literal_keys(first) == ['params']):
      raise _Skip(call, f'{self._code(call.func)} with a kept TrainState: only state.apply_fn({{"params": ...}}, ...) '
                        'is converted')
    kept, mode = [], None
    for arg in call.args[1:]:
      name = arg.keyword.value if arg.keyword is not None else None
      if name in group.record.mode_arguments and isinstance(arg.value, cst.Name) and arg.value.value in ('True', 'False'):
        mode = (arg.value.value == 'True') == EVAL_VALUE[name]
      elif name == 'rngs':
        group.changes.append((arg, f'{self._code(call.func)}(..., rngs=...) dropped: the model has no rng streams'))
      elif arg.star or (name is not None and name not in group.record.call_arguments):
        raise _Skip(arg, f'{self._code(call.func)} with {name or "*args"}= and a kept TrainState')
      else:
        kept.append(arg)
    if mode is not None:
      group.kept_modes.add(mode)
      if len(group.kept_modes) > 1:
        raise _Skip(call, 'a kept TrainState applied in train and eval mode (its graphdef holds one mode)')
    group.applies[call] = None
    state = call.func.value.value

    def edit(updated: cst.Call) -> cst.BaseExpression:
      inner = cst.Call(updated.func, _args_with_commas([cst.Arg(updated.args[0].value.elements[0].value),
                                                        cst.Arg(cst.parse_expression(f'{state}.other_variables'))]))
      args = [updated.args[call.args.index(a)].with_changes(
          comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=cst.SimpleWhitespace('')) for a in kept]
      return cst.Subscript(cst.Call(inner, _args_with_commas(args)), [cst.SubscriptElement(cst.Index(cst.Integer('0')))])
    group.edits[call] = edit
    group.changes.append((call, f'{self._code(call.func)}({{"params": params}}, ...) -> '
                                f'{state}.apply_fn(params, {state}.other_variables)(...)[0]'))

  def _optax_update(self, group: _Group, call: cst.Call) -> None:
    """`updates, opt_state = tx.update(grads, opt_state, params)`: removed; `updates` followed."""
    if call in group.done:
      return
    group.done.add(call)
    assign = self._parent(call)
    if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Tuple) and len(assign.targets[0].target.elements) == 2
            and len(call.args) in (2, 3) and all(a.keyword is None for a in call.args)):
      raise _Skip(call, f'{self._code(call)} not written as `updates, opt_state = tx.update(grads, opt_state, params)`')
    updates, opt_state = (e.value for e in assign.targets[0].target.elements)
    group.statements[self._statement(assign)] = None
    for value in call.args[1:]:
      group.visited.add(value.value)
    self._target(group, opt_state, OPT_STATE)
    self._target(group, updates, OPTAX_UPDATES)

  def _apply_updates(self, group: _Group, call: cst.Call) -> None:
    """`params = optax.apply_updates(params, updates)` -> `optimizer.update(model, grads)`."""
    if call in group.done:
      return
    group.done.add(call)
    assign = self._parent(call)
    updates = call.args[1].value if len(call.args) == 2 else None
    if not (isinstance(assign, cst.Assign) and assign.value is call and _single_name_target(assign)
            and isinstance(updates, cst.Name)):
      raise _Skip(call, f'{self._code(call)} not written as `params = optax.apply_updates(params, updates)`')
    made = [a.node for a in self._assignments(self.get_metadata(ScopeProvider, updates), updates.value)]
    assign_of = made[0] if len(made) == 1 else None
    while assign_of is not None and not isinstance(assign_of, (cst.Assign, cst.BaseStatement)):
      assign_of = self._parent(assign_of)
    if not (isinstance(assign_of, cst.Assign) and isinstance(assign_of.value, cst.Call)
            and isinstance(assign_of.value.func, cst.Attribute) and assign_of.value.func.attr.value == 'update'):
      raise _Skip(call, f'{self._code(updates)} does not come from one `tx.update(grads, opt_state, params)`')
    optimizer = self._optimizer(group, call)
    grads = self._code(assign_of.value.args[0].value)
    self._replace_statement(group, assign, f'{optimizer}.update({group.model}, {grads})')
    group.changes.append((call, f'tx.update + optax.apply_updates -> {optimizer}.update({group.model}, {grads})'))
    self._optax_update(group, assign_of.value)
    group.visited.update(a.value for a in call.args)
    self._target(group, assign.targets[0].target, _collection('params'))

  def _tree_map_update(self, group: _Group, call: cst.Call, node: cst.BaseExpression) -> None:
    """`params = jax.tree.map(f, params, grads)` -> `nnx.update(model, jax.tree.map(f, nnx.state(model, nnx.Param), grads))`."""
    assign = self._parent(call)
    if not (isinstance(assign, cst.Assign) and assign.value is call and _single_name_target(assign)):
      raise _Skip(call, f'{self._code(call)} over the params, not assigned back to the params')
    position = [a.value for a in call.args].index(node)

    def edit(updated: cst.Call) -> cst.Call:
      state = cst.parse_expression(f'nnx.state({group.model}, nnx.Param)')
      args = [a.with_changes(value=state) if i == position else a for i, a in enumerate(updated.args)]
      return cst.Call(cst.parse_expression('nnx.update'), _args_with_commas(
          [cst.Arg(cst.Name(group.model)), cst.Arg(updated.with_changes(args=args))]))
    group.edits[call] = edit
    group.edits[assign] = lambda updated: cst.Expr(updated.value)
    group.changes.append((call, f'params = {self._code(call.func)}(...) -> nnx.update({group.model}, ...)'))
    self._target(group, assign.targets[0].target, _collection('params'))

  def _state_read(self, group: _Group, call: cst.Call, node: cst.BaseExpression, kind: str) -> None:
    """`jax.tree.leaves(params)` -> `jax.tree.leaves(nnx.state(model, nnx.Param))`: the same leaves, other paths."""
    group.state_reads.append((node, flax_variable_type(_collection_of(kind) or '') or 'nnx.Not(nnx.RngState)'))
    group.changes.append((call, f'{self._code(node)} in {self._code(call.func)}(...) -> the NNX state of the model '
                                '(the same leaves; its paths are the NNX attribute paths)'))

  def _finish_state_reads(self, group: _Group) -> None:
    for node, kind_filter in group.state_reads:
      code = f'nnx.state({self._module_for(group, node)}, {kind_filter})'
      group.edits[node] = _expression(code)

  # --- steps and loss functions ----------------------------------------------------------------

  def _function_def(self, name: cst.Name) -> cst.FunctionDef | None:
    scope = self.get_metadata(ScopeProvider, name, None)
    assignments = list(scope[name.value]) if scope is not None else []
    if len(assignments) == 1 and isinstance(assignments[0].node, cst.FunctionDef):
      return assignments[0].node
    return None

  def _step_argument(self, group: _Group, call: cst.Call, function: cst.FunctionDef, position: int,
                     kind: str) -> None:
    """State passed to a step function defined in this file: the parameter is followed as state."""
    if kind not in (*MODEL_STATE, _collection('params')) and _collection_of(kind) is None:
      raise _Skip(call, f'{_describe(kind)} passed to {function.name.value}')
    params = function.params
    if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.posonly_params or position >= len(params.params):
      raise _Skip(call, f'{function.name.value}: state passed to a parameter that is not a plain positional one')
    record = group.functions.setdefault(function, _Function(function))
    record.calls.add(call)
    if record.kinds.get(position, kind) != kind:
      raise _Skip(call, f'{function.name.value} receives different state in parameter {position}')
    if position in record.kinds:
      return
    record.kinds[position] = kind
    self._decorators(group, record)
    param = params.params[position]
    group.recognized.add(param)
    self._name(group, self.get_metadata(ScopeProvider, function.body), param.name.value, kind)

  def _decorators(self, group: _Group, record: _Function) -> None:
    """`@jax.jit` / `@partial(jax.jit, donate_argnums=...)` -> `@nnx.jit`; `jax.pmap` -> `nnx.pmap` (at the end)."""
    function = record.node
    if function in group.done:
      return
    group.done.add(function)
    for decorator in function.decorators:
      expression = decorator.decorator
      transform, options = _transform_of(expression)
      allowed = PMAP_OPTIONS if transform == 'pmap' else ('donate_argnums',)
      if transform is None or any(k not in allowed for k in options):
        what = ', '.join(k for k in options if k not in allowed) or 'options this rule does not know'
        raise _Skip(decorator, f'{function.name.value}: a decorator other than jax.jit / jax.pmap, or one with '
                               f'{what} (positions change when the state becomes the model)')
      if isinstance(expression, cst.Call):
        self.remove_import_of(expression.func)  # functools, once no partial is left
      if 'donate_argnums' in options:
        group.changes.append((decorator, f'{function.name.value}: donate_argnums dropped (NNX updates the model '
                                         'in place)'))
      if transform == 'pmap':
        record.pmap = (decorator, options)
        continue
      group.edits[decorator] = lambda updated: updated.with_changes(decorator=cst.parse_expression('nnx.jit'))
      group.changes.append((decorator, f'@{self._code(expression)} -> @nnx.jit on {function.name.value}'))

  def _pmap_decorator(self, group: _Group, record: _Function, names: dict[int, list[str]]) -> None:
    """`@partial(jax.pmap, axis_name='batch')` -> `@nnx.pmap(axis_name='batch', in_axes=(None, None, 0, 0))`.

    The model and optimizer are broadcast (in_axes None) where Linen code mapped replicated
    state over the devices; the other arguments keep their in_axes.
    """
    decorator, options = record.pmap
    params = record.node.params.params
    given = options.get('in_axes')
    if given is None:
      axes = ['0'] * len(params)
    elif isinstance(given, cst.Tuple) and len(given.elements) == len(params):
      axes = [self._code(e.value) for e in given.elements]
    elif isinstance(given, (cst.Integer, cst.Name)):
      axes = [self._code(given)] * len(params)
    else:
      raise _Skip(given, f'{record.node.name.value}: jax.pmap in_axes that is not a literal int or tuple')
    new_axes = [a for position, axis in enumerate(axes) for a in (['None'] * len(names[position])
                                                                  if position in names else [axis])]
    args = [f'axis_name={self._code(options["axis_name"])}'] if 'axis_name' in options else []
    args.append(f'in_axes=({", ".join(new_axes)}{"," if len(new_axes) == 1 else ""})')
    code = f'nnx.pmap({", ".join(args)})'
    group.edits[decorator] = lambda updated: updated.with_changes(decorator=cst.parse_expression(code))
    group.changes.append((decorator, f'@{self._code(decorator.decorator)} -> @{code} on {record.node.name.value}: '
                                     'the model and optimizer are broadcast to the devices'))

  def _grad(self, group: _Group, call: cst.Call, kept: bool = False) -> None:
    """`jax.value_and_grad(loss_fn, has_aux=...)(params, ...)` -> `nnx.value_and_grad(loss_fn, ...)(model, ...)`."""
    if call in group.done:
      return
    group.done.add(call)
    inner = call.func
    func = cst.helpers.get_full_name_for_node(inner.func)
    options = {a.keyword.value: a.value for a in inner.args[1:] if a.keyword is not None}
    if len(inner.args) < 1 or inner.args[0].keyword is not None or any(k != 'has_aux' for k in options) \
        or len(options) != len(inner.args) - 1 or call.args[0].keyword is not None:
      raise _Skip(call, f'{func} with options other than has_aux (argnums changes what is differentiated)')
    has_aux = options.get('has_aux')
    if has_aux is not None and not (isinstance(has_aux, cst.Name) and has_aux.value in ('True', 'False')):
      raise _Skip(call, f'{func} with has_aux= not a literal True / False')
    loss = inner.args[0].value
    function = self._function_def(loss) if isinstance(loss, cst.Name) else loss if isinstance(loss, cst.Lambda) else None
    if function is None or function.params.star_arg is not cst.MaybeSentinel.DEFAULT or not function.params.params:
      raise _Skip(loss, f'{func} of something other than a function defined here with the params first')
    if kept:  # jax.grad stays: the loss takes the nnx.State of the params
      param = function.params.params[0]
      group.recognized.add(param)
      return self._name(group, self.get_metadata(ScopeProvider, function.body), param.name.value, KEPT_PARAMS)
    record = group.functions.setdefault(function, _Function(function, loss_of=call))
    if record.kinds:
      raise _Skip(loss, f'{self._code(loss)} is differentiated twice')
    record.kinds[0] = _collection('params')
    group.edits[inner.func] = _expression(GRADS[func])
    param = function.params.params[0]
    group.recognized.add(param)
    self._name(group, self.get_metadata(ScopeProvider, function.body), param.name.value, _collection('params'))

  def _returned(self, group: _Group, node: cst.BaseExpression, kind: str) -> None:
    """State returned by a step or loss function: dropped from its `return` (path recorded)."""
    path, current = [], node
    while True:
      parent = self._parent(current)
      if isinstance(parent, cst.Return):
        break
      tuple_ = self._parent(parent) if isinstance(parent, cst.Element) else None
      if not isinstance(tuple_, cst.Tuple):
        raise _Skip(node, f'{self._code(node)} ({_describe(kind)}) is used by code not converted yet')
      path.insert(0, list(tuple_.elements).index(parent))
      current = tuple_
    function = self._enclosing_function(parent)
    if function not in group.functions:
      raise _Skip(node, f'{_describe(kind)} returned from a function other than a training step')
    record = group.functions[function]
    record.drops[tuple(path)] = kind
    record.returns.setdefault(parent, set()).add(tuple(path))

  def _finish_functions(self, group: _Group) -> None:
    """Rewrites each step's parameters, returns and call sites once all its state is known."""
    finished: set[cst.CSTNode] = set()
    while len(finished) < len(group.functions):
      # Innermost first: a loss function's aux tells its step what the step returns.
      function = max((f for f in group.functions if f not in finished), key=self._depth)
      record = group.functions[function]
      finished.add(function)
      self._rewrite_parameters(group, record)
      drops = set(record.drops)
      returns = [n for n in descendants(function) if isinstance(n, cst.Return)
                 and self._enclosing_function(n) is function]
      if drops:
        if any(record.returns.get(r, set()) != drops for r in returns):
          raise _Skip(returns[0], f'{self._name_of(function)} returns its state in different places')
        for statement in returns:
          self._prune_return(group, statement, drops)
      if record.loss_of is not None:
        module, call = self._module_for(group, function), record.loss_of
        group.edits[call.args[0]] = lambda updated, module=module: updated.with_changes(value=cst.Name(module))
        func, loss = cst.helpers.get_full_name_for_node(call.func.func), self._code(call.func.args[0].value)
        group.changes.append((call, f'{func}({loss})(params) -> {GRADS[func]}({loss})({module})'))
        self._loss_result(group, record, drops)
      else:
        self._step_calls(group, record, drops)
      if record.pmap is not None:
        self._pmap_decorator(group, record, self._state_names(group, function, record.kinds))

  def _depth(self, node: cst.CSTNode) -> int:
    depth = 0
    while node is not None:
      node, depth = self._parent(node), depth + 1
    return depth

  def _rewrite_parameters(self, group: _Group, record: _Function, new_names: dict[int, list[str]] | None = None,
                          lead: bool = False) -> None:
    """State parameters -> `model` (first one) and `optimizer`; the other state parameters go.

    `new_names` replaces the names of each state position; with `lead`, they come first.
    """
    params = record.node.params.params
    if new_names is None:
      new_names = self._state_names(group, record.node, record.kinds)
    keep, leading = [], []
    for position, param in enumerate(params):
      names = new_names.get(position)
      if names is None:
        keep.append(param)
      else:
        (leading if lead else keep).extend(
            param.with_changes(name=cst.Name(n), annotation=None, default=None, comma=cst.MaybeSentinel.DEFAULT)
            for n in names)
    keep = [*leading, *keep]
    parameters = record.node.params
    group.edits[parameters] = lambda updated: updated.with_changes(params=_params_with_commas(
        [updated.params[params.index(p)] if p in params else p for p in keep]))

  def _state_names(self, group: _Group, node: cst.CSTNode, kinds: dict[int, str]) -> dict[int, list[str]]:
    """For each state position, the NNX names replacing it: the first gets `model`, opt state `optimizer`."""
    result, seen, module = {}, set(), self._module_for(group, node)
    for position in sorted(kinds):
      kind = kinds[position]
      wanted = [module] if kind != OPT_STATE else [self._optimizer(group, node)]
      if kind == TRAIN_STATE:
        wanted = [module, self._optimizer(group, node)]
      if module not in seen and kind == OPT_STATE:
        wanted = [module, *wanted]
      result[position] = [n for n in wanted if n not in seen]
      seen.update(wanted)
    return result

  def _module_for(self, group: _Group, function: cst.CSTNode) -> str:
    """The module a step (or a loss inside it) applies: the model, or one decode-mode view of it."""
    modules = group.applied.get(self._mode_owner(group, function), {group.model})
    if len(modules) != 1:
      raise _Skip(function, f'{self._name_of(function)} applies both {" and ".join(sorted(modules))}')
    return next(iter(modules))

  def _prune_return(self, group: _Group, statement: cst.Return, drops: set[tuple[int, ...]]) -> None:
    value = _pruned(statement.value, drops)
    if value is None:
      line = self._statement(statement)
      if len(line.body) != 1:
        raise _Skip(statement, 'a return of state sharing its line with other statements')
      group.statements[line] = None
    else:
      group.edits[statement] = lambda updated: updated.with_changes(value=_pruned(updated.value, drops))
    group.changes.append((statement, 'the state it returned goes: NNX updates the model in place'))

  def _loss_result(self, group: _Group, record: _Function, drops: set[tuple[int, ...]]) -> None:
    """A has_aux loss that returned batch-stats updates: the aux is pruned at both ends."""
    if not drops:
      return
    call = record.loss_of
    has_aux = any(a.keyword is not None and a.keyword.value == 'has_aux' and a.value.value == 'True'
                  for a in call.func.args)
    if not has_aux or any(p[:1] != (1,) for p in drops):
      raise _Skip(call, f'{self._code(call.func)}: the loss function returns state other than in its aux')
    value_and_grad = GRADS[cst.helpers.get_full_name_for_node(call.func.func)] == 'nnx.value_and_grad'
    consumer = {((0, *p) if value_and_grad else p): kind for p, kind in record.drops.items()}
    self._prune_consumer(group, call, consumer)
    if (1,) in drops:  # the whole aux went: no has_aux any more
      group.edits[call.func] = lambda updated: updated.with_changes(args=_without_trailing_comma(
          [a for a in updated.args if not (a.keyword is not None and a.keyword.value == 'has_aux')]))

  def _step_calls(self, group: _Group, record: _Function, drops: set[tuple[int, ...]]) -> None:
    """Every call of a step passes the state in the same places; its unpacking drops the returned state."""
    function = record.node
    scope = self.get_metadata(ScopeProvider, function.name)
    (assignment,) = self._assignments(scope, function.name.value)
    names = self._state_names(group, function, record.kinds)
    for access in assignment.references:
      if not _resolves_to(access.scope, function.name.value, scope):
        continue
      call = self._parent(access.node)
      if not (isinstance(call, cst.Call) and call.func is access.node and call in record.calls):
        raise _Skip(access.node, f'{function.name.value} is used other than called with the state of {group.model}')
      for position in record.kinds:
        if position >= len(call.args) or call.args[position].keyword is not None or call.args[position].star \
            or call.args[position].value not in group.visited:
          raise _Skip(call, f'{function.name.value} called without the state of {group.model} in position {position}')
      self._rewrite_call(group, call, names)
      mode_owner = self._mode_owner(group, call)
      if function in group.modes:
        mode = group.modes[function]
        if group.modes.get(mode_owner, mode) != mode:
          raise _Skip(call, f'{function.name.value} called in train and eval mode in one statement')
        group.modes[mode_owner] = mode
      if drops:
        self._prune_consumer(group, call, record.drops)

  def _rewrite_call(self, group: _Group, call: cst.Call, names: dict[int, list[str]], func: str | None = None) -> None:
    def edit(updated: cst.Call) -> cst.Call:
      args = []
      for position, arg in enumerate(updated.args):
        if position in names:
          args.extend(cst.Arg(cst.Name(n)) for n in names[position])
        else:
          args.append(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT))
      updated = updated.with_changes(args=_args_with_commas(args))
      return updated.with_changes(func=cst.Name(func)) if func is not None else updated
    group.edits[call] = edit

  def _prune_consumer(self, group: _Group, call: cst.Call, drops: dict[tuple[int, ...], str]) -> None:
    """`params, opt_state, loss = step(...)` -> `loss = step(...)`; the dropped names are followed as state."""
    assign = self._parent(call)
    if isinstance(assign, cst.Expr):
      return
    if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1):
      raise _Skip(call, f'the state returned by {self._code(call.func)} is used by code not converted yet')
    target = assign.targets[0].target
    for path, kind in drops.items():
      node = target
      for index in path:
        if not (isinstance(node, cst.Tuple) and index < len(node.elements)):
          raise _Skip(assign, f'the result of {self._code(call.func)} unpacked in a different shape than it is returned')
        node = node.elements[index].value
      self._target(group, node, kind)
    pruned = _pruned(target, set(drops))
    if pruned is None:
      group.edits[assign] = lambda updated: cst.Expr(updated.value)
    else:
      group.edits[assign] = lambda updated: updated.with_changes(
          targets=[cst.AssignTarget(_pruned(updated.targets[0].target, set(drops)))])

  # --- step styles (--step-style) --------------------------------------------------------------

  def _step_styles(self, group: _Group) -> None:
    """Rewrites each converted training step in the style `--step-style` chose (docs/performance.md).

    'functional': the step becomes `@jax.jit def step(graphdef, state, ...)`, which merges
    `(model, optimizer)` from them and returns their state last, as a dict of arrays;
    `graphdef, state = nnx.split((model, optimizer))` goes before the loop that calls it and
    `nnx.update((model, optimizer), state)` after it. 'cached': the `@nnx.jit` step is called
    through `nnx.cached_partial(step, model, optimizer)`, made before the loop. A step 'functional'
    cannot be applied to safely (the loop reads the model) gets 'cached' where that applies; one
    neither applies to stays `@nnx.jit`. Each such step gets a report entry saying why.
    """
    style = self.options.step_style
    if style == 'nnx-jit':
      return
    for function in sorted(group.kept_steps, key=self._position):
      group.changes.append((function, f'{function.name.value}: stays a jax.jit step over the kept TrainState '
                                      f'(--train-state keep); step style {style} not applied'))
    for function, record in sorted(group.functions.items(), key=lambda item: self._position(item[0])):
      if record.loss_of is not None or not isinstance(function, cst.FunctionDef) or not record.drops:
        continue  # a loss function, or a step that returns no state (an eval step): nothing carried between calls
      name = function.name.value
      if record.pmap is not None:
        group.changes.append((function, f'{name}: stays an nnx.pmap step over the model; step style {style} not '
                                        'applied (it applies to jitted steps)'))
        continue
      if not any(_transform_of(d.decorator)[0] == 'jit' for d in function.decorators):
        continue
      reason = self._style_blocker(group, record, style)
      if reason is None:
        (self._functional_step if style == 'functional' else self._cached_step)(group, record)
      elif style == 'functional' and self._style_blocker(group, record, 'cached') is None:
        group.changes.append((function, f'{name}: step style functional not applied: {reason}; cached instead (the '
                                        'next fastest)'))
        self._cached_step(group, record)
      else:
        group.changes.append((function, f'{name}: stays @nnx.jit over the model; step style {style} not applied: '
                                        f'{reason}'))

  def _style_loops(self, group: _Group, record: _Function) -> tuple[dict[cst.CSTNode, list[cst.Call]], str | None]:
    """The innermost loop around each call of a step, or why there is none to hoist the style's setup before.

    A mode call placed before the step's calls inside the loop (the loop shares a statement with
    code in the other mode, e.g. an eval after each epoch) is fine when it is the only one there:
    `_hoist_modes` moves it before the loop.
    """
    loops: dict[cst.CSTNode, list[cst.Call]] = {}
    for call in sorted(record.calls, key=self._position):
      child = self._statement(call)
      node = self._parent(child)
      while node is not None and not isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
        if isinstance(node, (cst.For, cst.While)) and child is node.body:
          break
        child, node = node, self._parent(node)
      if not isinstance(node, (cst.For, cst.While)):
        return {}, f'it is called outside a loop (line {self._position(call)[0]})'
      loops.setdefault(node, []).append(call)
    for loop in loops:
      if any(other is not loop and self._encloses(other, loop) for other in loops):
        return {}, 'it is called in nested loops'
      if loop in self._statements:
        return {}, 'its loop also runs the code of another model'
      if self._loop_modes(group, loop, loops[loop]) is None:
        return {}, f'{group.model}.train() / {group.model}.eval() is set inside the loop that calls it'
    return loops, None

  def _loop_modes(self, group: _Group, loop: cst.CSTNode, calls: list[cst.Call]) -> list[str] | None:
    """The mode call placed inside `loop` (`[]` or `['model.train()']`), if only before these step calls; else None."""
    inside = [s for s in group.mode_inserts if s is not loop and self._encloses(loop, s)]
    steps = {self._statement(call) for call in calls}
    codes = set()
    for statement in inside:
      extras = [s for s in group.statements.get(statement) or [] if s is not statement]
      if statement not in steps or len(extras) != 1:
        return None
      codes.add(cst.Module([]).code_for_node(extras[0]).strip())
    return sorted(codes) if len(codes) <= 1 else None

  def _hoist_modes(self, group: _Group, loop: cst.CSTNode, calls: list[cst.Call]) -> list[str]:
    """Moves the mode call placed before these step calls inside `loop` to before it (see `_loop_modes`)."""
    codes = self._loop_modes(group, loop, calls)
    for statement in {self._statement(call) for call in calls}:
      if statement in group.mode_inserts and statement is not loop and group.statements.get(statement):
        group.statements[statement] = [statement]
    return codes or []

  def _style_blocker(self, group: _Group, record: _Function, style: str) -> str | None:
    """Why `style` cannot be applied to this step safely, or None."""
    function = record.node
    if group.kept_state:
      return 'the TrainState of the model is kept (--train-state keep)'
    module = self._module_for(group, function)
    if module != group.model:
      return f'it applies {module}, a decode-mode view of {group.model}'
    if not isinstance(function.body, cst.IndentedBlock):
      return 'its body shares the line of its def'
    loops, reason = self._style_loops(group, record)
    if reason is not None:
      return reason
    for loop, calls in loops.items():
      views = [n for n in descendants(loop) if isinstance(n, cst.Name) and n.value in group.twins]
      if views:
        return f'the loop that calls it uses {views[0].value}, a decode-mode view of {group.model}'
      if style != 'functional':
        continue
      allowed: set[cst.CSTNode] = set()
      for call in calls:
        assign = self._parent(call)
        if not (isinstance(assign, cst.Assign) and assign.value is call):
          return f'the result of a call of it (line {self._position(call)[0]}) is not assigned'
        allowed.update(call.args[p].value for p in record.kinds)
        target = assign.targets[0].target
        for path in record.drops:
          node = target
          for index in path:
            node = node.elements[index].value
          allowed.add(node)
      for node in descendants(loop):
        if (node in group.visited or node in group.model_uses) and node not in allowed:
          return (f'the loop that calls it also uses {self._code(node)} (line {self._position(node)[0]}), the '
                  f'state of {group.model} (move that use after the loop for the functional style)')
        leaves = isinstance(node, (cst.Return, cst.Yield))
        if leaves and self._enclosing_function(node) is self._enclosing_function(loop):
          return f'the loop that calls it can leave by a {type(node).__name__.lower()} before nnx.update'
    if style == 'functional':
      scope = self.get_metadata(ScopeProvider, function.body, None)
      for node in descendants(function.body):
        if isinstance(node, cst.Name) and node in group.visited and not self._bound_inside(node, scope):
          return f'it reads {node.value}, state of {group.model} from an enclosing scope'
    return None

  def _binding_scope(self, node: cst.Name) -> tp.Any:
    scope = self.get_metadata(ScopeProvider, node, None)
    while scope is not None and not scope.assignments[node.value] and scope.parent is not scope:
      scope = scope.parent
    return scope

  def _bound_inside(self, node: cst.Name, outer: tp.Any) -> bool:
    scope = self._binding_scope(node)
    while scope is not None and scope is not outer and scope.parent is not scope:
      scope = scope.parent
    return scope is outer

  def _free_name(self, group: _Group, candidates: tp.Sequence[str]) -> str | None:
    """The first candidate not used in the file, or used only for the Linen state of this group (all rewritten)."""
    followed = {name for _, name in group.names}
    for name in candidates:
      if self._introduced.get(name, id(group)) != id(group):
        continue
      if name in self._introduced or name not in self._names_in_module:
        return name
      if name in followed and all(self._state_name_use(group, node) for node in descendants(self.module)
                                  if isinstance(node, cst.Name) and node.value == name):
        return name
    return None

  def _state_name_use(self, group: _Group, node: cst.Name) -> bool:
    parent = self._parent(node)
    if isinstance(parent, cst.Attribute) and parent.attr is node:
      return True
    if isinstance(parent, cst.Arg) and parent.keyword is node:
      return True
    scope = self._binding_scope(node)
    return scope is not None and (id(scope), node.value) in group.names

  def _style_nodes(self, group: _Group, record: _Function) -> tuple[dict[int, list[str]], str]:
    """The step's NNX names by state position and the code of the graph nodes (`(model, optimizer)`)."""
    names = self._state_names(group, record.node, record.kinds)
    order = [n for position in sorted(names) for n in names[position]]
    return names, f'({", ".join(order)})' if len(order) > 1 else order[0]

  def _around_loop(self, group: _Group, loop: cst.CSTNode, before: list[str], after: list[str]) -> None:
    """Statements right before `loop` (after a mode call placed there, taking the loop's leading lines) and after it."""
    current = group.statements.get(loop, [loop])
    index = current.index(loop)
    block = [*current[:index], *(cst.parse_statement(f'{code}\n') for code in before)]
    block[0] = block[0].with_changes(leading_lines=loop.leading_lines)
    group.statements[loop] = [*block, loop, *(cst.parse_statement(f'{code}\n') for code in after), *current[index + 1:]]
    previous = group.edits.get(loop)
    group.edits[loop] = lambda updated: (previous(updated) if previous else updated).with_changes(leading_lines=[])

  def _functional_step(self, group: _Group, record: _Function) -> None:
    function, drops = record.node, set(record.drops)
    name = function.name.value
    graphdef = self._free_name(group, ('graphdef', 'nnx_graphdef'))
    state = self._free_name(group, ('state', 'nnx_state'))
    if graphdef is None or state is None:
      group.changes.append((function, f'{name}: stays @nnx.jit over the model; step style functional not applied: '
                                      'the names graphdef / nnx_graphdef or state / nnx_state are taken'))
      return
    self._introduced.update({graphdef: id(group), state: id(group)})
    names, nodes = self._style_nodes(group, record)
    first = min(names)
    carried = {position: ([graphdef, state] if position == first else []) for position in names}
    self._rewrite_parameters(group, record, carried)
    merge = cst.parse_statement(f'{nodes.strip("()")} = nnx.merge({graphdef}, {state})\n')
    group.edits[function.body] = lambda updated: updated.with_changes(body=_after_docstring(updated.body, merge))
    returned = f'nnx.to_pure_dict(nnx.state({nodes}))'
    for statement in [n for n in descendants(function) if isinstance(n, cst.Return)
                      and self._enclosing_function(n) is function]:
      line = self._statement(statement)
      if line in group.statements and group.statements[line] is None:
        del group.statements[line]
      group.edits[statement] = lambda updated: updated.with_changes(
          value=cst.parse_expression(_with_state(_pruned(updated.value, drops), returned)))
      group.changes = [(n, m) for n, m in group.changes if n is not statement]
      group.changes.append((statement, f'the state it returned -> {returned}, returned last'))
    for decorator in function.decorators:
      expression = decorator.decorator
      if _transform_of(expression)[0] != 'jit':
        continue
      jit = self._code(expression.args[0].value if isinstance(expression, cst.Call) else expression)
      group.edits[decorator] = lambda updated, jit=jit: updated.with_changes(decorator=cst.parse_expression(jit))
      group.changes = [(n, m) for n, m in group.changes if not (n is decorator and '-> @nnx.jit' in m)]
      was = f'@{jit} stays' if self._code(expression) == jit else f'@{self._code(expression)} -> @{jit}'
      group.changes.append((decorator, f'{was} on {name}, over ({graphdef}, {state}): {nodes} merged inside '
                                       '(step style functional)'))
    for call in record.calls:
      self._rewrite_call(group, call, carried)
      assign = self._parent(call)
      group.edits[assign] = lambda updated: updated.with_changes(targets=[cst.AssignTarget(cst.parse_expression(
          _with_state(_pruned(updated.targets[0].target, drops), state)))])
    loops, _ = self._style_loops(group, record)
    for loop, calls in loops.items():
      modes = self._hoist_modes(group, loop, calls)
      split = [f'{graphdef}, {state} = nnx.split({nodes})', f'{state} = nnx.to_pure_dict({state})']
      self._around_loop(group, loop, [*modes, *split], [f'nnx.update({nodes}, {state})'])
      group.changes.append((loop, f'{graphdef}, {state} = nnx.split({nodes}) before the loop, nnx.update({nodes}, '
                                  f'{state}) after it: {name} carries their state as a dict of arrays (step style '
                                  'functional)'))

  def _cached_step(self, group: _Group, record: _Function) -> None:
    function = record.node
    name = function.name.value
    cached = self._free_name(group, (f'cached_{name}', f'{name}_cached'))
    if cached is None:
      group.changes.append((function, f'{name}: stays @nnx.jit over the model; step style cached not applied: the '
                                      f'names cached_{name} and {name}_cached are taken'))
      return
    self._introduced[cached] = id(group)
    names, nodes = self._style_nodes(group, record)
    if sorted(names) != list(range(len(names))):
      self._rewrite_parameters(group, record, names, lead=True)
      group.changes.append((function, f'{name}: takes {nodes.strip("()")} first (nnx.cached_partial binds the '
                                      'leading arguments)'))
    for call in record.calls:
      self._rewrite_call(group, call, {position: [] for position in names}, func=cached)
    loops, _ = self._style_loops(group, record)
    for loop, calls in loops.items():
      modes = self._hoist_modes(group, loop, calls)
      self._around_loop(group, loop, [*modes, f'{cached} = nnx.cached_partial({name}, {nodes.strip("()")})'], [])
      group.changes.append((loop, f'{cached} = nnx.cached_partial({name}, {nodes.strip("()")}) before the loop: its '
                                  f'calls skip the graph traversal of {nodes} (step style cached)'))

  # --- checks ----------------------------------------------------------------------------------

  def _check_applies(self, group: _Group) -> None:
    """Each collection an apply was given must be this model's state: the NNX call drops them."""
    for call in group.applies:
      if call.func.attr.value == 'apply_fn' and call.func.value not in group.visited:
        raise _Skip(call, f'{self._code(call.func)} of something other than the TrainState of {group.model}')
      first = call.args[0].value
      if isinstance(first, cst.Dict) and _literal_keys(first) is None:
        raise _Skip(first, f'{group.model}.apply with a variables dict that is not a literal dict of collections')
      for value in [e.value for e in first.elements] if isinstance(first, cst.Dict) else [first]:
        if value not in group.visited:
          raise _Skip(value, f'{group.model}.apply with variables ({self._code(value)}) that are not the state '
                             f'of {group.model} from its init')

  def _check_tuple_aliases(self, group: _Group) -> None:
    """A tuple assignment that went held only state (nothing else is lost with it)."""
    for assign in group.tuple_aliases:
      for element in assign.value.elements:
        if element.value not in group.visited:
          raise _Skip(element.value, f'{self._code(element.value)} is assigned together with the state of '
                                     f'{group.model}; split the assignment')

  def _check_assignments(self, group: _Group) -> None:
    """A state name must not also be assigned something else (`params = load(...)`)."""
    for key, scope in group.name_scopes.items():
      for assignment in self._assignments(scope, key[1]):
        node = assignment.node
        if node not in group.recognized:
          raise _Skip(node, f'{key[1]} holds the state of {group.model} but is also assigned other values')

  def _check_model_uses(self, group: _Group) -> None:
    """The Linen model (and its decode-mode twins) may only be initialised, applied, or given to TrainState.create."""
    for module in (group.model, *sorted(group.twins)):
      (assignment,) = self._assignments(group.scope, module)
      accesses = [a for a in assignment.references if _resolves_to(a.scope, module, group.scope)]
      for access in sorted(accesses, key=lambda a: self._position(a.node)):
        if access.node not in group.model_uses:
          raise _Skip(access.node, f'{module} is used by code not converted yet (jax.jit({module}.apply), '
                                   'apply with other variables, ...)')

  # --- train/eval modes ------------------------------------------------------------------------

  def _mode_owner(self, group: _Group, node: cst.CSTNode) -> cst.CSTNode:
    """The outermost function around `node` below the model's scope, else its statement."""
    owner, current = None, node
    while current is not None:
      if isinstance(current, cst.FunctionDef) and not self._encloses(current, group.init):
        owner = current
      current = self._parent(current)
    return owner if owner is not None else self._statement(node)

  def _encloses(self, outer: cst.CSTNode, node: cst.CSTNode) -> bool:
    while node is not None:
      if node is outer:
        return True
      node = self._parent(node)
    return False

  def _place_modes(self, group: _Group, statements: tp.Sequence[cst.BaseStatement]) -> None:
    """One `model.eval()` after the construction when every call agrees, else one before each statement."""
    if len(group.kept_modes) == 1:  # before nnx.split: the graphdef keeps the mode
      self._insert(group, group.init, after=f'{group.model}.{"eval" if group.kept_modes.pop() else "train"}()')
    modes = {owner: mode for owner, mode in group.modes.items() if not isinstance(owner, cst.FunctionDef)}
    values = set(modes.values())
    if not values or values == {None}:
      return
    if None in values:
      statement = next(s for s, m in modes.items() if m is None)
      raise _Skip(statement, f'{group.model}.apply without a train/eval argument next to calls with one')
    if len(values) == 1:
      self._insert(group, group.init, after=f'{group.model}.{"eval" if values.pop() else "train"}()')
      return
    by_top: dict[cst.BaseStatement, set[bool]] = {}
    for statement, mode in modes.items():
      by_top.setdefault(self._top_statement(statement, statements), set()).add(mode)
    for statement, mode in modes.items():
      top = self._top_statement(statement, statements)
      if len(by_top[top]) == 1:
        if top not in group.done:
          group.done.add(top)
          self._insert(group, top, before=f'{group.model}.{"eval" if mode else "train"}()')
      else:
        self._insert(group, statement, before=f'{group.model}.{"eval" if mode else "train"}()')

  def _top_statement(self, statement: cst.BaseStatement, statements: tp.Sequence[cst.BaseStatement]) -> cst.BaseStatement:
    current = statement
    while current is not None and current not in statements:
      current = self._parent(current)
    return current if current is not None else statement

  def _insert(self, group: _Group, statement: cst.BaseStatement, *, before: str = '', after: str = '') -> None:
    current = group.statements.get(statement, [statement]) or []
    extra = cst.parse_statement(f'{before or after}\n')
    group.statements[statement] = [extra, *current] if before else [*current, extra]
    group.mode_inserts.add(statement)
    group.changes.append((statement, f'{before or after} (train/eval mode, set on the model)'))

  # --- helpers ---------------------------------------------------------------------------------

  def _replace_statement(self, group: _Group, small: cst.BaseSmallStatement, code: str) -> None:
    group.edits[small] = lambda _: cst.parse_statement(f'{code}\n').body[0]

  def _parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
    return self.get_metadata(cst.metadata.ParentNodeProvider, node, None)

  def _statement(self, node: cst.CSTNode) -> cst.BaseStatement:
    while not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
      node = self._parent(node)
    return node

  def _enclosing_function(self, node: cst.CSTNode) -> cst.CSTNode | None:
    node = self._parent(node)
    while node is not None and not isinstance(node, (cst.FunctionDef, cst.Lambda)):
      node = self._parent(node)
    return node

  def _name_of(self, function: cst.CSTNode) -> str:
    return function.name.value if isinstance(function, cst.FunctionDef) else 'a lambda'

  def _position(self, node: cst.CSTNode) -> tuple[int, int]:
    start = self.get_metadata(cst.metadata.PositionProvider, node).start
    return start.line, start.column

  def _code(self, node: cst.CSTNode) -> str:
    return self.module.code_for_node(node).strip()


def _after_docstring(body: tp.Sequence[cst.BaseStatement], statement: cst.BaseStatement) -> list[cst.BaseStatement]:
  """`body` with `statement` first, after a docstring if there is one."""
  first = body[0] if body else None
  docstring = isinstance(first, cst.SimpleStatementLine) and isinstance(first.body[0], cst.Expr) \
      and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
  at = 1 if docstring else 0
  return [*body[:at], statement, *body[at:]]


def _with_state(value: cst.BaseExpression | None, state: str) -> str:
  """`loss, state` for a pruned `loss`; `(loss, acc), state` for a pruned tuple; `state` for nothing."""
  if value is None:
    return state
  code = cst.Module([]).code_for_node(value)
  if isinstance(value, cst.Tuple) and not value.lpar:
    code = f'({code})'
  return f'{code}, {state}'


def _resolves_to(scope: tp.Any, name: str, target: tp.Any) -> bool:
  """Whether `name` read in `scope` is the `name` of `target` (libcst also lists shadowed reads)."""
  while scope is not target:
    if scope.assignments[name] or scope.parent is scope:
      return False
    scope = scope.parent
  return True


def _describe(kind: str) -> str:
  collection = _collection_of(kind)
  if collection is not None:
    return f'the {collection!r} collection'
  return {VARIABLES: 'the variables', OPT_STATE: 'the optimizer state', TRAIN_STATE: 'the TrainState',
          KEPT_STATE: 'the kept TrainState', KEPT_PARAMS: 'the params of the kept TrainState',
          UPDATES: 'the mutated collections', OPTAX_UPDATES: 'the optax updates'}[kind]


def _expression(code: str) -> Edit:
  return lambda _: cst.parse_expression(code)


def _rngs(key: str) -> str:
  """`nnx.Rngs(0)` for `jax.random.key(0)` / `PRNGKey(0)`, else `nnx.Rngs(<key>)`."""
  match = re.fullmatch(r'(?:jax\.)?(?:random\.)?(?:key|PRNGKey)\((\d+)\)', key)
  return f'nnx.Rngs({match.group(1) if match else key})'


def _literal_keys(value: cst.BaseExpression) -> list[str] | None:
  """The keys of a dict display whose keys are all string literals, else None."""
  if not isinstance(value, cst.Dict) or not all(isinstance(e, cst.DictElement) for e in value.elements):
    return None
  keys = [e.key for e in value.elements]
  return [k.evaluated_value for k in keys] if all(isinstance(k, cst.SimpleString) for k in keys) else None


def _mutable_collections(value: cst.BaseExpression) -> list[str] | None:
  """`['batch_stats']` / `'cache'` / `('a', 'b')` -> names; anything else (True, a variable) -> None."""
  if isinstance(value, cst.SimpleString):
    return [value.evaluated_value]
  if isinstance(value, (cst.List, cst.Tuple)) and value.elements \
      and all(isinstance(e.value, cst.SimpleString) for e in value.elements):
    return [e.value.evaluated_value for e in value.elements]
  return None


def _keys(subscript: cst.Subscript, parent_of: tp.Callable) -> tuple[list[str | None], cst.CSTNode]:
  """The literal keys of a `x['a']['b']` chain starting at `subscript`, and its outermost node."""
  keys, node = [], subscript
  while True:
    element = node.slice[0].slice if len(node.slice) == 1 else None
    value = element.value if isinstance(element, cst.Index) else None
    keys.append(value.evaluated_value if isinstance(value, cst.SimpleString) else None)
    parent = parent_of(node)
    if not (isinstance(parent, cst.Subscript) and parent.value is node):
      return keys, node
    node = parent


def _pruned(value: cst.BaseExpression | None, drops: set[tuple[int, ...]]) -> cst.BaseExpression | None:
  """`value` without the tuple elements at `drops`; a tuple left with one element becomes it, with none: None."""
  if () in drops or value is None:
    return None
  if not isinstance(value, cst.Tuple):
    return value
  kept = []
  for index, element in enumerate(value.elements):
    inner = _pruned(element.value, {p[1:] for p in drops if p[:1] == (index,)})
    if inner is not None:
      kept.append(element.with_changes(value=inner))
  if not kept:
    return None
  if len(kept) == 1:
    return kept[0].value
  last = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
  return value.with_changes(elements=[*kept[:-1], last])


def _without_trailing_comma(args: list[cst.Arg]) -> list[cst.Arg]:
  return [*args[:-1], args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)] if args else args


def _args_with_commas(args: list[cst.Arg]) -> list[cst.Arg]:
  comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(' '))
  return [a.with_changes(comma=comma) for a in args[:-1]] + args[-1:]


def _params_with_commas(params: list[cst.Param]) -> list[cst.Param]:
  comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(' '))
  return [p.with_changes(comma=comma) for p in params[:-1]] + [p.with_changes(comma=cst.MaybeSentinel.DEFAULT)
                                                                for p in params[-1:]]


def _init_statement(statement: cst.CSTNode) -> tuple[str, str, cst.Call, str] | None:
  """(target, model, init call, kind) for `target = model.init(...)` or `target = model.init(...)['params']`."""
  value = _unfrozen(_assigned_value(statement))
  kind = VARIABLES
  if isinstance(value, cst.Subscript) and len(value.slice) == 1 and isinstance(value.slice[0].slice, cst.Index) \
      and isinstance(value.slice[0].slice.value, cst.SimpleString):
    kind, value = _collection(value.slice[0].slice.value.evaluated_value), _unfrozen(value.value)
  if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and isinstance(value.func.value, cst.Name) \
      and value.func.attr.value == 'init':
    return _assigned_name(statement), value.func.value.value, value, kind
  return None


def _transform_of(expression: cst.BaseExpression) -> tuple[str | None, dict[str, cst.BaseExpression]]:
  """('jit' | 'pmap', {option: value}) for `jax.jit`, `jax.pmap` or `partial(jax.pmap, axis_name=...)`."""
  name = cst.helpers.get_full_name_for_node(expression) or ''
  if name in JITS or name in PMAPS:
    return ('jit' if name in JITS else 'pmap'), {}
  if isinstance(expression, cst.Call) and (cst.helpers.get_full_name_for_node(expression.func) or '').endswith('partial') \
      and expression.args and all(a.keyword is not None for a in expression.args[1:]):
    inner = cst.helpers.get_full_name_for_node(expression.args[0].value) or ''
    if inner in JITS or inner in PMAPS:
      return ('jit' if inner in JITS else 'pmap'), {a.keyword.value: a.value for a in expression.args[1:]}
  return None, {}


def _unfrozen(value: cst.BaseExpression | None) -> cst.BaseExpression | None:
  """`model.init(...)` for `freeze(model.init(...))` / `unfreeze(...)`: NNX state is never frozen."""
  while isinstance(value, cst.Call) and len(value.args) == 1 \
      and FREEZERS.match(cst.helpers.get_full_name_for_node(value.func) or ''):
    value = value.args[0].value
  return value


def _assigned_name(statement: cst.CSTNode) -> str | None:
  if _assigned_value(statement) is None:
    return None
  target = statement.body[0].targets[0].target
  return target.value if isinstance(target, cst.Name) else None


def _assigned_value(statement: cst.CSTNode) -> cst.BaseExpression | None:
  if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
    assign = statement.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
      return assign.value
  return None


def _single_name_target(assign: cst.Assign) -> bool:
  return len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)


def _is_method(func: cst.BaseExpression, model: str, method: str) -> bool:
  return (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == model
          and func.attr.value == method)
