"""Module factories for L2N002, for the class being planned: the layer factories its code passes to another class
become NNX factories, and what a call through a factory field builds.

flax's ResNet passes its blocks `conv = partial(nn.Conv, use_bias=False)` and `norm = partial(nn.BatchNorm, ...)`
as fields typed `ModuleDef`, and the block builds its layers by calling them: `self.conv(self.filters, (3, 3))(x)`;
the ResNet itself holds `block_cls: ModuleDef`, a class of the file. In NNX a factory is called in `__init__` with
the input size and `rngs`: `self.conv1 = self.conv(in_features=..., out_features=self.filters, ..., rngs=rngs)`,
and the parent passes `partial(nnx.Conv, use_bias=False)`. What each factory field makes is found once per file
(`factory_scan.with_factories`).

Planning functions over a `context.ClassContext`, run by `planner.plan_class`: they read the file's facts and
fill the class's plan.
"""

from __future__ import annotations

import importlib
import inspect
import typing as tp

import libcst as cst

from codemods.rules.l2n002 import queries
from codemods.rules.l2n002.factory_fields import Factory, factory_calls
from codemods.rules.l2n002.nodes import is_self_attr
from codemods.rules.l2n002.plan import Unsupported
from codemods.vocabulary import LAYER_MODE_KWARGS
from nnx_bridge.layer_table import find_layer, nnx_arguments

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.context import ClassContext


def prepare_factories(ctx: ClassContext, method: cst.FunctionDef | None) -> None:
  """Before a class is planned (its train/eval switches known): converts the layer factories its code passes,
  moving each `conv = partial(nn.Conv, ...)` local of the @nn.compact method into __init__."""
  fields = ctx.facts.factories
  name = ctx.plan.name
  for built in factory_calls(ctx.facts.class_defs[name]):  # a factory of unknown kind: say so before anything else
    func = built.func
    factory = fields.fields.get((name, func.attr.value)) if isinstance(func, cst.Attribute) and is_self_attr(func) \
        else None
    if isinstance(factory, str):
      raise Unsupported(built, f'self.{func.attr.value}(...)(...) builds a submodule from a ModuleDef or '
                                     f'factory field: {factory}')
  done: dict[cst.SimpleStatementLine, str] = {}
  order = list(method.body.body) if method is not None else []
  lines: list[tuple[int, str]] = []
  for value in fields.values.get(name, ()):
    if value.target not in ctx.converted:  # a class left Linen (built through nnx_bridge.from_linen): Linen layers
      continue
    if value.local is None:
      ctx.plan.hoistable.add(value.node)
      ctx.plan.exprs[value.node] = _nnx_factory(ctx, value.node, value.factory)
      ctx.plan.lifted.add(value.node)
      ctx.plan.pending.append((value.node, f'{ctx.facts.code(value.node)} -> {ctx.plan.exprs[value.node]}, '
                                        'an NNX factory'))
      continue
    line, call = value.local
    local = line.body[0].targets[0].target.value
    if method is None or line not in method.body.body:
      raise Unsupported(value.node, f'the factory {local} is not bound in the @nn.compact method\'s own body')
    ctx.plan.hoistable.add(value.node)
    if line in done:
      continue
    done[line] = text = _nnx_factory(ctx, call, value.factory)
    lines.append((order.index(line), f'{local} = {text}'))
    ctx.plan.removed.add(line)
    ctx.plan.lifted.add(call)
    uses = []
    scope = ctx.facts.scope(value.node)
    for assignment in scope[local] if scope is not None else ():
      for reference in assignment.references:
        parent = ctx.facts.parent(reference.node)
        if isinstance(parent, cst.Call) and parent.func is reference.node:
          uses.append(reference.node)
        elif reference.node not in {v.node for v in fields.values.get(name, ())}:
          raise Unsupported(reference.node, f'the factory {local} used other than by calling it or passing '
                                                  'it to a factory field')
    ctx.plan.factory_locals[line] = uses
    ctx.plan.pending.append((call, f'{ctx.facts.code(call)} -> {local} = {text} in __init__: an NNX '
                                f'factory; each {local}(...) builds a layer there'))
  ctx.plan.init_lines = [text for _, text in sorted(lines)]


def _nnx_factory(ctx: ClassContext, node: cst.BaseExpression, factory: Factory) -> str:
  """`partial(nnx.Conv, use_bias=False)` for `partial(nn.Conv, use_bias=False, use_running_average=not train)`:
  renamed kwargs, train/eval kwargs dropped (model.train() / model.eval() set them), Linen defaults explicit."""
  spec = find_layer(factory.target)
  short = f'nnx.{spec.nnx.rpartition(".")[2]}'
  renames, accepted, only = dict(spec.arg_renames), nnx_arguments(spec.nnx), {k.name for k in spec.linen_only}
  if isinstance(node, cst.Call):
    func, args = queries.code(ctx, node.func), node.args[1:]
  else:
    func, args = None, ()
  if any(a.star or a.keyword is None for a in args):
    raise Unsupported(node, 'a factory partial with positional or starred arguments after the layer')
  parts = []
  given = set()
  for arg in args:
    key = arg.keyword.value
    given.add(key)
    if key == 'name':
      raise Unsupported(node, 'a factory partial with name=')
    if key in LAYER_MODE_KWARGS:
      default = queries.switch(ctx, arg.value, False)
      if default is not None and default != _nnx_default(spec.nnx, key):  # else NNX's own default
        parts.append(f'{key}={default!r}')
      continue
    new = renames.get(key, key)
    if key in only or new not in accepted:
      raise Unsupported(arg.value, f'{key}= of {spec.linen} has no NNX counterpart to pass it to')
    queries.check_hoistable(ctx, arg.value)
    parts.append(f'{new}={queries.code(ctx, arg.value)}')
  parts += [f'{k}={v!r}' for k, v in spec.linen_defaults if k not in given]
  if not parts:
    return short
  if func is None:
    ctx.plan.imports.append(('functools', None, None))
    func = 'functools.partial'
  return f'{func}({", ".join([short, *parts])})'


def _nnx_default(nnx_name: str, key: str) -> tp.Any:
  module, _, name = nnx_name.rpartition('.')
  parameter = inspect.signature(getattr(importlib.import_module(module), name).__init__).parameters.get(key)
  return parameter.default if parameter is not None else inspect.Parameter.empty
