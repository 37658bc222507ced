"""Code emission for L2N002: the NNX class body (`__init__`, `init_cache`), the rewritten submodule calls
of `__call__`, and the generated Variable types, from a class's plan."""

from __future__ import annotations

import keyword
import typing as tp

import libcst as cst

from codemods.rules.l2n002.nodes import (
  field_name,
  is_docstring,
  stream_access,
)
from codemods.rules.l2n002.plan import Call, Child, ClassRewrite, init_params
from codemods.vocabulary import EVAL_ATTRIBUTES


def class_body(plan: ClassRewrite, updated: cst.ClassDef) -> cst.ClassDef:
  """The converted class: its fields and setup() replaced by `__init__` (and `init_cache`), its NNX base."""
  body: list[cst.BaseStatement] = []
  init_index = None
  setup_body: list[cst.BaseStatement] = []
  leading: tp.Sequence[cst.EmptyLine] = ()
  for statement in updated.body.body:
    if field_name(statement) is not None:
      if init_index is None:  # __init__ takes the first field's place, and its blank lines
        init_index, leading = len(body), statement.leading_lines
    elif isinstance(statement, cst.FunctionDef) and statement.name.value == 'setup':
      setup_body = list(statement.body.body)
    else:
      body.append(statement)
  if plan.helpers_only:
    return updated.with_changes(bases=_bases(plan, updated, 'nnx.Module'))
  init = init_method(plan, setup_body).with_changes(leading_lines=leading)
  if init_index is None and body and is_docstring(body[0]):
    init_index, init = 1, init.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
  init_index = init_index or 0
  body.insert(init_index, init)
  if plan.cache_lines:
    init_index += 1
    body.insert(init_index, init_cache_method(plan).with_changes(leading_lines=[cst.EmptyLine(indent=False)]))
  for source in plan.properties:  # `derived_params.py`: after __init__, as setup() computed them first
    init_index += 1
    body.insert(init_index, cst.parse_statement(source).with_changes(leading_lines=[cst.EmptyLine(indent=False)]))
  if init_index + 1 < len(body) and not body[init_index + 1].leading_lines:  # a blank line after __init__
    body[init_index + 1] = body[init_index + 1].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
  return updated.with_changes(bases=_bases(plan, updated, plan.base), body=updated.body.with_changes(body=body))


def _bases(plan: ClassRewrite, updated: cst.ClassDef, base: str) -> list[cst.Arg]:
  """The class's bases with the Linen one replaced by `base`; the others (mixins, `abc.ABC`) kept as they are."""
  bases = list(updated.bases)
  bases[plan.base_index] = bases[plan.base_index].with_changes(value=cst.parse_expression(base))
  return bases


def init_method(plan: ClassRewrite, setup_body: list[cst.BaseStatement]) -> cst.FunctionDef:
  """`__init__`: the fields stored, the setup() body, then the hoisted children and the forked rng streams."""
  params = ', '.join(['self', *init_params(plan)])
  fields = [f'self.{name} = {name}' for name in plan.field_names]
  later = [*plan.init_lines, *(f'self.{c.attr} = {c.text}' for c in plan.children if c.hoisted and not c.alternative)]
  later += [f'self.{attr} = rngs{stream_access(stream)}.fork()' for stream, attr in plan.streams.items()]
  source = f'def __init__({params}):\n' + ''.join(f'  {line}\n' for line in [*fields, *later] or ['pass'])
  init = cst.parse_statement(source)
  lines = list(init.body.body)
  body = [*lines[:len(fields)], *setup_body, *lines[len(fields):]] if fields or later else setup_body or lines
  return init.with_changes(body=init.body.with_changes(body=body))


def init_cache_method(plan: ClassRewrite) -> cst.FunctionDef:
  """`init_cache(input_shape, dtype)`, creating the decode caches (and calling the children's)."""
  source = (
      'def init_cache(self, input_shape: tuple[int, ...], dtype=jnp.float32):\n'
      f'  """Creates the decode caches as Linen\'s init did for `{plan.cache_input}` of shape input_shape (full length)."""\n'
      + ''.join(f'  {line}\n' for line in plan.cache_lines)
  )
  return cst.parse_statement(source)


def variable_class(collection: str, name: str) -> cst.ClassDef:
  """The Variable type generated for a Linen collection flax has no type of, registered under its name."""
  return cst.parse_statement(
      f'@nnx.register_variable_name({collection!r}, overwrite=True)\n'
      f'class {name}(nnx.Variable):\n'
      f'  """Variables of the Linen collection {collection!r}."""\n'
  )


def scan_call(child: Child, updated: cst.Call) -> cst.BaseExpression:
  """`cell(carry, x)` -> nnx.scan over the cell, broadcast to every step."""
  in_axis, out_axis = child.scan
  args = ', '.join(cst.Module([]).code_for_node(a.value) for a in updated.args)
  return cst.parse_expression(
      f'nnx.scan(lambda cell, carry, x: cell(carry, x), in_axes=(None, nnx.Carry, {in_axis}), '
      f'out_axes=(nnx.Carry, {out_axis}))(self.{child.attr}, {args})')


def stack_call(child: Child, updated: cst.Call, dropped: set[int]) -> cst.BaseExpression:
  """`blocks(x, None)` -> nnx.scan / nnx.vmap over the stacked copies."""
  stacked = child.stacked
  values = [cst.Module([]).code_for_node(a.value) for i, a in enumerate(updated.args) if i not in dropped]
  scan = stacked.transform == 'scan'
  count = len(values) - scan
  xs = ['x'] if count == 1 else [f'x{i}' for i in range(1, count + 1)]
  params = ', '.join(['carry', *xs] if scan else xs)
  body = f'lambda layer, {params}: layer({params})'
  if stacked.remat is not None:
    body = f'nnx.remat({body}{", " if stacked.remat else ""}{stacked.remat})'
  options = [f'in_axes=({", ".join(["0", *(["nnx.Carry"] if scan else []), *stacked.in_axes])})',
             f'out_axes=(nnx.Carry, {stacked.out_axes})' if scan else f'out_axes={stacked.out_axes}',
             *([f'transform_metadata={stacked.metadata}'] if stacked.metadata else []),
             *([f'axis_name={stacked.axis_name}'] if stacked.axis_name else [])]
  return cst.parse_expression(
      f'nnx.{stacked.transform}({body}, {", ".join(options)})(self.{child.attr}, {", ".join(values)})')


def remat_call(child: Child, original: cst.Call, updated: cst.Call, dropped: set[int]) -> cst.BaseExpression:
  """`block(x)` -> nnx.remat (or nnx.jit) over a lambda calling the submodule."""
  kept = [a for i, a in enumerate(original.args) if i not in dropped]
  values = [cst.Module([]).code_for_node(a.value) for i, a in enumerate(updated.args) if i not in dropped]
  names = [a.value.value if isinstance(a.value, cst.Name) and not keyword.iskeyword(a.value.value) else ''
           for a in kept]
  if all(names) and len(set(names)) == len(names) and 'module' not in names:
    params = call = ', '.join(names)
  else:
    params = call = 'x' if len(values) == 1 else ', '.join(f'x{i}' for i in range(1, len(values) + 1))
  transform, options = child.remat[0], f', {child.remat[1]}' if child.remat[1] else ''
  return cst.parse_expression(
      f"{transform}(lambda module, {params}: module({call}){options})(self.{child.attr}, {', '.join(values)})")


def while_loop_call(updated: cst.Call) -> cst.BaseExpression:
  """`nn.while_loop(cond, body, self, init)` -> nnx.while_loop with the module in the loop state, beside the carry."""
  cond, body, _, init = (cst.Module([]).code_for_node(a.value) for a in updated.args if a.keyword is None)
  cond, body = (f if isinstance(a.value, cst.Name) else f'({f})' for f, a in zip((cond, body), updated.args))
  return cst.parse_expression(
      f'nnx.while_loop(lambda state: {cond}(*state), lambda state: (state[0], {body}(*state)), (self, {init}))[1]')


def eval_view_call(updated: cst.Call) -> cst.Call:
  """A call of a submodule that Linen ran in eval mode whatever the caller's mode (its train/eval arguments left to
  their defaults): through a copy of it in eval mode (`nnx.with_attributes`, the attributes `.eval()` sets, the
  same arrays), for this call only."""
  view = f'nnx.with_attributes({cst.Module([]).code_for_node(updated.func)}, {EVAL_ATTRIBUTES})'
  return updated.with_changes(func=cst.parse_expression(view))


def submodule_call(call: Call, updated: cst.Call) -> cst.Call:
  """A call of a submodule: `self.<attr>(...)`, its train/eval arguments dropped."""
  attr, dropped = call
  args = [a for i, a in enumerate(updated.args) if i not in dropped]
  if args:
    args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
  func = cst.parse_expression(f'self.{attr}') if attr else updated.func
  return updated.with_changes(func=func, args=args)
