"""L2N003: `model.init(...)` / `model.apply(variables, ...)` call sites of converted classes -> NNX.

## What it does
For a class L2N002 converted in the same file, a block of straight code that builds it
(`model = Model(256, 10)`), initialises it (`variables = model.init(key, x, training=False)`)
and then only applies it or reads its variables becomes NNX code:

- the `init` statement becomes the construction `model = Model(256, 10, <sizes>,
  rngs=nnx.Rngs(key))`, its sizes read off the example inputs given to `init` (`x.shape[-1]`,
  or the literal last axis of `jnp.ones((1, 784))`), and the Linen construction goes;
- `model.apply(variables, x, training=False)` becomes `model(x)` (`method='encode'` or
  `method=Model.encode`: `model.encode(x)`), with `model.eval()` / `model.train()` set once
  after the construction, or before each statement when the calls differ;
- `variables['params']['Block_0']['Dense_0']['kernel']`, also through `params =
  variables['params']`, becomes `model.block.linear.kernel[...]` (the child names L2N002
  recorded).

## Left as a TODO (the block is not changed)
A `variables` or `params` used any other way (passed to a training step, `jax.tree.map`,
saved), `apply` with `mutable=` or other keywords (`rngs=` keys are dropped: the NNX model
draws from its own streams, reported), `init` with `method=`, a size the
inputs of `init` do not determine, names assigned twice. A model built elsewhere than in the
same block (or of a class not converted in this file) is not touched.
Training steps are converted by later rules.
"""

from __future__ import annotations

import dataclasses
import re
import typing as tp

import libcst as cst
from libcst.metadata import ScopeProvider

from codemods.report import INPUT_DIMENSION
from codemods.report import UNDETERMINED
from codemods.report import ConvertedClass
from codemods.rule import KNOWN_CLASSES_KEY
from codemods.rule import MigrationRule
from codemods.rule import descendants
from nnx_bridge.layer_table import MODE_ARGUMENTS
from nnx_bridge.layer_table import find_layer

EVAL_VALUE = {m.name: not m.inverted for m in MODE_ARGUMENTS}
"""The value of each Linen train/eval argument that means eval mode (`training=False`, `deterministic=True`)."""
ARRAY_MAKERS = re.compile(r'^(jnp|jax\.numpy|np|numpy)\.(ones|zeros|empty)$')


class _Skip(Exception):
  """A use this rule does not convert: the whole group stays as it is, with a TODO."""

  def __init__(self, node: cst.CSTNode, message: str) -> None:
    super().__init__(message)
    self.node, self.message = node, message


@dataclasses.dataclass
class _Group:
  """One model: its construction, its init, and the uses of its variables."""

  model: str
  record: ConvertedClass
  construction: cst.SimpleStatementLine
  init: cst.SimpleStatementLine
  statements: dict[cst.BaseStatement, tp.Any] = dataclasses.field(default_factory=dict)
  exprs: dict[cst.CSTNode, str] = dataclasses.field(default_factory=dict)
  modes: dict[cst.BaseStatement, bool] = dataclasses.field(default_factory=dict)  # statement -> eval?
  changes: list[tuple[cst.CSTNode, str]] = dataclasses.field(default_factory=list)


class ConvertInitApplyRule(MigrationRule):
  """Rewrites init/apply call sites of the classes L2N002 converted in the same file."""

  CODE = 'L2N003'
  DESCRIPTION = 'model.init(key, x) -> Model(..., rngs=nnx.Rngs(key)); model.apply(variables, x) -> model(x).'
  AFTER = ('L2N002',)
  REQUIRES = ('init',)
  METADATA_DEPENDENCIES = (ScopeProvider,)

  def __init__(self, context: cst.codemod.CodemodContext) -> None:
    super().__init__(context)
    self._records = {r.nnx_name: r for r in context.scratch.get(KNOWN_CLASSES_KEY, ())}
    self._statements: dict[cst.CSTNode, tp.Any] = {}
    self._exprs: dict[cst.CSTNode, str] = {}

  def visit_Module(self, node: cst.Module) -> None:
    if not self._records:
      return
    self._block(node.body)
    for sub in descendants(node):
      if isinstance(sub, cst.IndentedBlock):
        self._block(sub.body)

  def on_leave(self, original_node: cst.CSTNode, updated_node: tp.Any) -> tp.Any:
    updated_node = super().on_leave(original_node, updated_node)
    if original_node in self._exprs:
      return cst.parse_expression(self._exprs[original_node])
    if original_node in self._statements:
      new = self._statements[original_node]
      if new is None:
        return cst.RemoveFromParent()
      return cst.FlattenSentinel([updated_node if s is original_node else s for s in new])
    return updated_node

  # --- finding groups --------------------------------------------------------------------------

  def _block(self, statements: tp.Sequence[cst.BaseStatement]) -> None:
    for index, statement in enumerate(statements):
      found = _assigned_call(statement, 'init')
      if found is None:
        continue
      construction = next((s for s in reversed(statements[:index]) if _assigned_name(s) == found[1]), None)
      value = _assigned_value(construction) if construction is not None else None
      if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in self._records):
        continue  # not a model of a class converted here (`opt_state = tx.init(params)`, ...)
      try:
        group = self._group(statements, index, construction, *found)
      except _Skip as skip:
        self.report_todo(skip.node, f'{skip.message}; left as Linen')
        continue
      self._statements.update(group.statements)
      self._exprs.update(group.exprs)
      self.add_needed_import('flax', 'nnx')
      for node, message in group.changes:
        self.report_change(node, message)

  def _group(self, statements: tp.Sequence[cst.BaseStatement], index: int, construction: cst.SimpleStatementLine,
             variables: str, model: str, call: cst.Call) -> _Group:
    init, value = statements[index], construction.body[0].value
    between = statements[statements.index(construction) + 1:index]
    if any(isinstance(n, cst.Name) and n.value == model for s in between for n in descendants(s)):
      raise _Skip(call, f'{model}.init: {model} is used between its construction and init')
    record = self._records[value.func.value]
    group = _Group(model, record, construction, init)
    for name in (model, variables):
      if len(self._assignments(init, name)) != 1:
        raise _Skip(call, f'{model}.init: {name} is assigned more than once')
    rngs, inputs = self._init_arguments(group, call)
    sizes = self._sizes(group, call, inputs)
    args = [*(self.module.code_for_node(a).strip().rstrip(',') for a in value.args), *sizes, f'rngs={rngs}']
    new = cst.parse_statement(f'{model} = {value.func.value}({", ".join(args)})\n')
    group.statements[construction] = None
    group.statements[init] = [new.with_changes(leading_lines=init.leading_lines)]
    group.changes.append((call, f'{model}.init(...) -> {value.func.value}(..., {", ".join([*sizes, f"rngs={rngs}"])})'))
    self._uses(group, init, variables)
    self._model_uses(group, construction, call)
    self._place_modes(group, statements)
    return group

  def _model_uses(self, group: _Group, construction: cst.SimpleStatementLine, init: cst.Call) -> None:
    """The model itself may only be initialised once and applied to its variables."""
    applies = {call.func.value for call in group.exprs if isinstance(call, cst.Call)}
    for access in self._references(construction, group.model):
      if access.node is not init.func.value and access.node not in applies:
        raise _Skip(access.node, f'{group.model} is used by code not converted yet (a training step, '
                                 'apply with other variables, ...)')

  def _assignments(self, statement: cst.CSTNode, name: str) -> list[tp.Any]:
    scope = self.get_metadata(ScopeProvider, statement, None)
    return list(scope[name]) if scope is not None else []

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

  # --- uses of the variables -------------------------------------------------------------------

  def _uses(self, group: _Group, init: cst.SimpleStatementLine, variables: str) -> None:
    for access in self._references(init, variables):
      node = access.node
      parent = self._parent(node)
      arg_call = self._parent(parent) if isinstance(parent, cst.Arg) else None
      if isinstance(arg_call, cst.Call) and _is_method(arg_call.func, group.model, 'apply') \
          and arg_call.args and arg_call.args[0] is parent:
        self._apply(group, arg_call)
      elif isinstance(parent, cst.Subscript) and parent.value is node:
        self._read(group, parent, variables)
      else:
        raise _Skip(node, f'{variables} is used by code not converted yet (a training step, a tree map, ...)')

  def _references(self, statement: cst.CSTNode, name: str) -> list[tp.Any]:
    (assignment,) = self._assignments(statement, name)
    return sorted(assignment.references, key=lambda a: self._position(a.node))

  def _apply(self, group: _Group, call: cst.Call) -> None:
    method, mode, args = None, None, []
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
        group.changes.append((arg, f'{group.model}.apply(..., rngs=...) keys for {", ".join(streams)} dropped: the '
                                   f'NNX model draws them from the streams of its own nnx.Rngs'))
      elif name is None or name in group.record.call_arguments:
        args.append(self.module.code_for_node(arg).strip().rstrip(','))
      else:
        raise _Skip(arg, f'{group.model}.apply with {name}=')
    target = f'{group.model}.{method}' if method else group.model
    group.exprs[call] = f'{target}({", ".join(args)})'
    group.changes.append((call, f'{group.model}.apply(variables, ...) -> {target}(...)'))
    statement = self._statement(call)
    if mode is not None:
      if group.modes.get(statement, mode) != mode:
        raise _Skip(call, f'{group.model}.apply in train and eval mode in one statement')
      group.modes[statement] = mode
    elif group.record.mode_arguments and method is None:
      group.modes.setdefault(statement, None)

  def _method_name(self, group: _Group, value: cst.BaseExpression) -> str:
    """`'encode'` or `Model.encode` -> 'encode'."""
    if isinstance(value, cst.SimpleString) and value.evaluated_value.isidentifier():
      return value.evaluated_value
    if isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) \
        and value.value.value == group.record.nnx_name:
      return value.attr.value
    raise _Skip(value, f'{group.model}.apply with a method= that is not a method name')

  def _read(self, group: _Group, subscript: cst.Subscript, variables: str) -> None:
    """`variables['params'][...]` chains, directly or through `params = variables['params']`."""
    keys, top = _keys(subscript, self._parent)
    parent = self._parent(top)
    if len(keys) == 1 and isinstance(parent, cst.Assign) and len(parent.targets) == 1 \
        and isinstance(parent.targets[0].target, cst.Name) and parent.value is top:
      alias = parent.targets[0].target.value
      statement = self._statement(parent)
      if len(self._assignments(statement, alias)) != 1:
        raise _Skip(parent, f'{alias} is assigned more than once')
      group.statements[statement] = None
      for access in self._references(statement, alias):
        inner = self._parent(access.node)
        if not (isinstance(inner, cst.Subscript) and inner.value is access.node):
          raise _Skip(access.node, f'{alias} is used by code not converted yet (a training step, a tree map, ...)')
        more, end = _keys(inner, self._parent)
        self._leaf(group, end, [*keys, *more])
      return
    self._leaf(group, top, keys)

  def _leaf(self, group: _Group, node: cst.CSTNode, keys: list[str]) -> None:
    """`model.block.linear.kernel[...]` for ['params', 'Block_0', 'Dense_0', 'kernel']."""
    if keys is None or any(k is None for k in keys):
      raise _Skip(node, 'a variables read with keys that are not literal strings')
    if isinstance(self._parent(node), (cst.AssignTarget, cst.AugAssign, cst.Del)):
      raise _Skip(node, 'a write into the variables')
    record, code, layer = group.record, group.model, None
    for key in keys[1:]:
      if layer is not None:
        if layer.params.key_renames or layer.params.fuse or layer.params.drop:
          raise _Skip(node, f'a read of {key} in a layer whose NNX parameters are laid out differently')
        group.exprs[node] = f'{code}.{key}[...]'
        return
      child = {c.linen_name: c for c in record.children}.get(key) if record else None
      if child is None:
        raise _Skip(node, f'a variables read of {key}, which the record of {group.record.nnx_name} does not name')
      code += f'.{child.nnx_attribute}'
      if child.linen_class in self._records:
        record = self._records[child.linen_class]
      elif child.linen_class is not None and find_layer(child.linen_class) is not None:
        record, layer = None, find_layer(child.linen_class)
      elif child.linen_class is not None:
        raise _Skip(node, f'a variables read below {key}, a {child.linen_class}')
      else:
        if key != keys[-1]:
          raise _Skip(node, f'a variables read below {key}')
        group.exprs[node] = f'{code}[...]'
        return
    path = ''.join(f'[{k!r}]' for k in keys)
    raise _Skip(node, f'a whole tree of variables ({path}) is used by code not converted yet '
                      '(a training step, a tree map, ...)')

  # --- train/eval modes --------------------------------------------------------------------------

  def _place_modes(self, group: _Group, statements: tp.Sequence[cst.BaseStatement]) -> None:
    """One `model.eval()` after the construction when every call agrees, else one before each."""
    modes = set(group.modes.values())
    if not modes or modes == {None}:
      return
    if None in modes:
      statement = next(s for s, m in group.modes.items() if m is None)
      raise _Skip(statement, f'{group.model}.apply without a train/eval argument next to calls with one')
    if len(modes) == 1:
      self._insert(group, group.init, after=f'{group.model}.{"eval" if modes.pop() else "train"}()')
      return
    for statement, mode in group.modes.items():
      if statement not in statements:
        raise _Skip(statement, f'{group.model}.apply in train and eval mode, one of them in a nested block')
      self._insert(group, statement, before=f'{group.model}.{"eval" if mode else "train"}()')

  def _insert(self, group: _Group, statement: cst.BaseStatement, *, before: str = '', after: str = '') -> None:
    current = group.statements.get(statement, [statement])
    extra = cst.parse_statement(f'{before or after}\n')
    group.statements[statement] = [extra, *current] if before else [*current, extra]
    group.changes.append((statement, f'{before or after} (train/eval mode, set on the model)'))

  # --- helpers ---------------------------------------------------------------------------------

  def _parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
    return self.get_metadata(cst.metadata.ParentNodeProvider, node, None)

  def _statement(self, node: cst.CSTNode) -> cst.BaseStatement:
    while not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
      node = self._parent(node)
    return node

  def _position(self, node: cst.CSTNode) -> tuple[int, int]:
    start = self.get_metadata(cst.metadata.PositionProvider, node).start
    return start.line, start.column


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


def _assigned_call(statement: cst.CSTNode, method: str) -> tuple[str, str, cst.Call] | None:
  """(target, model, call) for `target = model.<method>(...)`."""
  value = _assigned_value(statement)
  if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and isinstance(value.func.value, cst.Name) \
      and value.func.attr.value == method:
    return _assigned_name(statement), value.func.value.value, value
  return None


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


def _is_method(func: cst.BaseExpression, model: str, method: str) -> bool:
  return (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == model
          and func.attr.value == method)
