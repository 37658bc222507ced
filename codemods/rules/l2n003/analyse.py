"""Analyse: the models a file builds and initialises (`ModelSite`s), and what their init calls give.

A site is `model = Model(...)` followed, in the same block, by `variables = model.init(key, x)`
(or `params = model.init(...)['params']`), for a class L2N002 converted (its record: of this
file, or of another file of the run that this one imports, `models.CNN(...)`) or a built-in
layer with an NNX counterpart (its layer-table row).
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods import shape_formulas
from codemods.report import EXAMPLE_INPUTS
from codemods.report import INPUT_DIMENSION
from codemods.report import UNDETERMINED
from codemods.report import ConstructorArgument
from codemods.report import ConvertedClass
from codemods.nodes import descendants
from codemods.rules.l2n003.facts import VARIABLES
from codemods.rules.l2n003.facts import InitStatement
from codemods.rules.l2n003.facts import LeftAsLinen
from codemods.rules.l2n003.facts import ModelClass
from codemods.rules.l2n003.facts import ModelSite
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.facts import collection
from codemods.rules.l2n003.syntax import assigned_name
from codemods.rules.l2n003.syntax import assigned_value
from codemods.rules.l2n003.syntax import literal_keys
from codemods.rules.l2n003.syntax import rngs_code
from codemods.rules.l2n003.syntax import unfrozen
from codemods.rules.l2n003.tree import Tree
from codemods.vocabulary import ARRAY_MAKERS
from nnx_bridge.layer_table import InputDim
from nnx_bridge.layer_table import find_layer
from nnx_bridge.layer_table import linen_fields
from nnx_bridge.layer_table import nnx_arguments


Imported = tp.Callable[[cst.BaseExpression], ConvertedClass | None]
"""The record of the class another file of the run converted that an expression (`models.CNN`) names, else None."""


def no_imported(func: cst.BaseExpression) -> None:
  """The `Imported` of a file migrated alone: no class of another file is known."""
  return None


def model_sites(module: cst.Module, tree: Tree, records: tp.Mapping[str, ConvertedClass],
                imported: Imported = no_imported) -> list[ModelSite]:
  """Every construction + init pair of the file, block by block (the module's first), in order."""
  blocks = [module.body, *(sub.body for sub in descendants(module) if isinstance(sub, cst.IndentedBlock))]
  return [site for block in blocks for site in _block_sites(tuple(block), tree, records, imported)]


def _block_sites(statements: tuple[cst.BaseStatement, ...], tree: Tree,
                 records: tp.Mapping[str, ConvertedClass], imported: Imported) -> list[ModelSite]:
  sites = []
  for index, statement in enumerate(statements):
    init = init_statement(statement)
    if init is None:
      continue
    construction = next((s for s in reversed(statements[:index]) if assigned_name(s) == init.model), None)
    given_by = None
    if construction is None:
      construction, given_by = given_module(tree, statements, init) or (None, None)
    value = assigned_value(construction) if construction is not None else None
    if not isinstance(value, cst.Call):
      continue
    try:
      built = model_class(tree, records, imported, value)
    except Skip as skip:
      built = LeftAsLinen(skip.node, skip.message)
    if built is not None:  # None: not a model of a class converted here (`opt_state = tx.init(params)`, ...)
      sites.append(ModelSite(statements, construction, init, built, given_by))
  return sites


def given_module(tree: Tree, statements: tuple[cst.BaseStatement, ...], init: InitStatement
                 ) -> tuple[cst.SimpleStatementLine, cst.Call] | None:
  """`cnn = CNN()` and the call `create_train_state(cnn, rng, ...)` when the init is `module.init(...)` at the top
  of a function called once, `module` one of its parameters, given a name built in the caller's block before the call
  (the layout of flax's Quick Start and imagenet example: the module is built by the caller, initialised by the
  factory)."""
  function = tree.enclosing_function(init.statement)
  if not (isinstance(function, cst.FunctionDef) and tuple(function.body.body) == statements):
    return None
  call = _one_call(tree, function)
  argument = parameter_argument(function, call, init.model) if call is not None else None
  if not isinstance(argument, cst.Name):
    return None
  line = tree.statement(call)
  block = tree.block(line)
  if line not in block or len(tree.assignments(tree.scope(line), argument.value)) != 1:
    return None
  construction = next((s for s in reversed(block[:block.index(line)]) if assigned_name(s) == argument.value), None)
  return (construction, call) if construction is not None else None


def _one_call(tree: Tree, function: cst.FunctionDef) -> cst.Call | None:
  """The call of `function` when its name is bound once and read once, to call it."""
  bound, uses = tree.function_uses(function)
  call = tree.parent(uses[0]) if bound == 1 and len(uses) == 1 else None
  return call if isinstance(call, cst.Call) and call.func is uses[0] else None


def parameter_argument(function: cst.FunctionDef, call: cst.Call, name: str) -> cst.BaseExpression | None:
  """What `call` gives the parameter `name` of `function` (by position or keyword), None when it gives it nothing
  plainly (`*args`, a default)."""
  params = function.params
  if any(a.star for a in call.args) or params.star_arg is not cst.MaybeSentinel.DEFAULT or params.star_kwarg:
    return None
  positional = [*params.posonly_params, *params.params]
  given = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
  for position, arg in enumerate(a for a in call.args if a.keyword is None):
    if position < len(positional):
      given[positional[position].name.value] = arg.value
  return given.get(name)


def init_statement(statement: cst.CSTNode) -> InitStatement | None:
  """`target = model.init(...)` or `target = model.init(...)['params']` (through `freeze` / `unfreeze` too)."""
  value = unfrozen(assigned_value(statement))
  kind = VARIABLES
  if isinstance(value, cst.Subscript) and len(value.slice) == 1 and isinstance(value.slice[0].slice, cst.Index) \
      and isinstance(value.slice[0].slice.value, cst.SimpleString):
    kind, value = collection(value.slice[0].slice.value.evaluated_value), unfrozen(value.value)
  if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and isinstance(value.func.value, cst.Name) \
      and value.func.attr.value == 'init':
    return InitStatement(statement, assigned_name(statement), value.func.value.value, value, kind)
  return None


def model_class(tree: Tree, records: tp.Mapping[str, ConvertedClass], imported: Imported,
                value: cst.Call) -> ModelClass | None:
  """The record, layer row, NNX class and constructor arguments for `Model(...)`, `models.Model(...)` or
  `nn.Dense(...)`."""
  record = records.get(value.func.value) if isinstance(value.func, cst.Name) else None
  record = record or imported(value.func)
  if record is not None:
    args = tuple(tree.code(a).rstrip(',') for a in value.args)
    return ModelClass(record, None, tree.code(value.func), args)
  spec = next((find_layer(q.name) for q in tree.qualified_names(value.func, set())
               if find_layer(q.name) is not None), None)
  if spec is None or spec.nnx is None:
    return None
  if not all(isinstance(source, InputDim) and source.axis == -1 and not source.optional for _, source in spec.derived):
    raise Skip(value, f'{spec.linen} built outside a module, with sizes NNX reads off more than the last axis')
  fields, accepted, renames = linen_fields(spec.linen), nnx_arguments(spec.nnx), dict(spec.arg_renames)
  only = {k.name for k in spec.linen_only}
  given = {}
  for position, arg in enumerate(value.args):
    if arg.star or (arg.keyword is None and position >= len(fields)):
      raise Skip(arg, f'{spec.linen} built with *args / **kwargs or too many arguments')
    given[arg.keyword.value if arg.keyword is not None else fields[position]] = tree.code(arg.value)
  args = []
  for name, code in given.items():
    if name in only or renames.get(name, name) not in accepted:
      raise Skip(value, f'{name}= of {spec.linen} has no NNX counterpart to pass it to')
    args.append(f'{renames.get(name, name)}={code}')
  args += [f'{k}={v!r}' for k, v in spec.linen_defaults if k not in given]
  sizes = tuple(ConstructorArgument(name, INPUT_DIMENSION, f'{source.describe(spec.call_args)}',
                                    input=spec.call_args[source.arg]) for name, source in spec.derived)
  record = ConvertedClass(0, spec.linen, spec.nnx, sizes, (), call_arguments=spec.call_args)
  return ModelClass(record, spec, f'nnx.{spec.nnx.rpartition(".")[2]}', tuple(args))


def init_arguments(tree: Tree, model: str, record: ConvertedClass,
                   call: cst.Call) -> tuple[str, dict[str, cst.BaseExpression]]:
  """The `nnx.Rngs(...)` code for init's key, and its inputs by `__call__` argument name."""
  positional = [a for a in call.args if a.keyword is None]
  if not positional or any(a.star for a in call.args):
    raise Skip(call, f'{model}.init without a positional key, or with *args / **kwargs')
  call_names = record.call_arguments
  inputs: dict[str, cst.BaseExpression] = {}
  for position, arg in enumerate(positional[1:]):
    if position >= len(call_names):
      raise Skip(arg, f'{model}.init: more inputs than {record.linen_name}.__call__ takes')
    inputs[call_names[position]] = arg.value
  for arg in call.args:
    if arg.keyword is None:
      continue
    name = arg.keyword.value
    if name not in call_names or name == 'method':
      raise Skip(arg, f'{model}.init with {name}=')
    inputs[name] = arg.value
  key = positional[0].value
  if isinstance(key, cst.Dict):
    if literal_keys(key) is None or not all(k.isidentifier() for k in literal_keys(key)):
      raise Skip(key, f'{model}.init with an rngs dict whose stream names are not literal identifiers')
    code = ', '.join(f'{e.key.evaluated_value}={tree.source(e.value)}' for e in key.elements)
    return f'nnx.Rngs({code})', inputs
  return rngs_code(tree.source(key)), inputs


def size_arguments(tree: Tree, model: str, record: ConvertedClass, call: cst.Call,
                   inputs: dict[str, cst.BaseExpression]) -> list[str]:
  """`name=<last axis of an example input>` for each size argument of the record, or the value of its shape
  formula on the example input's literal shape (`jnp.ones([1, 28, 28, 1])`)."""
  sizes = []
  for argument in record.arguments:
    if argument.origin == EXAMPLE_INPUTS:
      raise Skip(call, f'{model}.init: {argument.name} ({argument.detail}) is not derived from its inputs')
    if argument.origin not in (INPUT_DIMENSION, UNDETERMINED):
      continue
    example = inputs.get(argument.input) if argument.input else None
    value = _formula_value(argument, inputs.get(argument.example_input)) if argument.example_input else None
    if example is None and value is None:
      raise Skip(call, f'{model}.init: the inputs do not determine {argument.name} ({argument.detail})')
    sizes.append(f'{argument.name}={value if value is not None else _last_axis(tree, example)}')
  return sizes


def _formula_value(argument: ConstructorArgument, example: cst.BaseExpression | None) -> int | None:
  """The size the argument's shape formula gives for an example input of literal shape, else None."""
  elements = _shape_elements(example) if example is not None else None
  if elements is None or not all(isinstance(e, cst.Integer) for e in elements):
    return None
  shape = tuple(int(e.value) for e in elements)
  formula = dict(argument.shape_formulas).get(len(shape))
  return shape_formulas.evaluate(formula, shape) if formula is not None else None


def _shape_elements(example: cst.BaseExpression) -> list[cst.BaseExpression] | None:
  """The elements of the literal shape of `jnp.ones((1, 784))` / `jnp.zeros([1, 28, 28, 1], jnp.float32)`, else None."""
  if isinstance(example, cst.Call) and example.args and isinstance(example.args[0].value, (cst.Tuple, cst.List)) \
      and ARRAY_MAKERS.match(cst.helpers.get_full_name_for_node(example.func) or ''):
    return [e.value for e in example.args[0].value.elements]
  return None


def _last_axis(tree: Tree, example: cst.BaseExpression) -> str:
  """`784` for `jnp.ones((1, 784))` or `jnp.ones([1, 784])`, else `<example>.shape[-1]`."""
  elements = _shape_elements(example)
  if elements and isinstance(elements[-1], cst.Integer):
    return elements[-1].value
  code = tree.source(example)
  return f'{code}.shape[-1]' if isinstance(example, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) \
      else f'({code}).shape[-1]'


def example_shape(tree: Tree, example: cst.BaseExpression) -> str:
  """`(4, 12)` for `jnp.ones((4, 12), jnp.int32)` or `jnp.ones([4, 12])`, else `<example>.shape`."""
  elements = _shape_elements(example)
  if elements is not None and isinstance(example.args[0].value, cst.Tuple):
    return tree.code(example.args[0].value)
  if elements is not None:  # a list: as a tuple, which init_cache's shape arithmetic takes
    parts = [tree.code(e) for e in elements]
    return f'({", ".join(parts)}{"," if len(parts) == 1 else ""})'
  return f'{tree.code(example)}.shape'


def arguments_without(tree: Tree, call: cst.Call, drop: str) -> list[str]:
  """The code of each argument of `call` but the keyword `drop`."""
  return [tree.code(a).rstrip(',') for a in call.args if not (a.keyword is not None and a.keyword.value == drop)]
