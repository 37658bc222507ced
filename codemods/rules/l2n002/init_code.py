"""The `__init__` code of each child of a converted class: the NNX constructor call of a layer, wrapper, class
of the file or bridged Linen class (`ctor_text`), and the Variable of a scope variable (`variable_text`).

Plain functions over a `context.ClassContext`, run by `planner.plan_class` once the plan is complete (sizes and
train/eval defaults known); this module imports no pass.
"""

from __future__ import annotations

import libcst as cst

from codemods.rules.l2n002 import queries
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.nodes import scope_api, scope_arguments
from codemods.rules.l2n002.plan import Child, Unsupported
from nnx_bridge.layer_table import nnx_arguments

_CALLED_IN_PARENS = (cst.Lambda, cst.IfExp, cst.BinaryOperation, cst.BooleanOperation, cst.UnaryOperation)


def ctor_text(ctx: ClassContext, child: Child) -> str:
  """The NNX constructor call of `child`, as code valid in __init__."""
  text = lambda node: queries.code(ctx, node, child.size_codes)
  if child.bridged:
    eval_mode = child.mode_defaults.get('eval_mode')
    mode = f', eval_mode={eval_mode}' if isinstance(eval_mode, str) else ', eval_mode=True' if eval_mode else ''
    # a copy, which `exprs` does not replace: where `act = Gate(...)` was, the call now reads `self.act`
    linen = child.ctor.with_changes() if child.ctor in ctx.plan.exprs else child.ctor
    return f'nnx_bridge.from_linen({text(linen)}, *{child.attr}_example_inputs, rngs=rngs{mode})'
  if child.wrapper is not None:
    wrapper = child.wrapper
    child.cell.sizes = child.sizes
    accepted, only = nnx_arguments(wrapper.nnx), {k.name for k in wrapper.linen_only}
    args = [ctor_text(ctx, child.cell)]
    for name, value in child.kwargs.items():
      if name in only or name not in accepted:
        raise Unsupported(value, f'{name}= of {wrapper.linen} has no NNX counterpart to pass it to')
      args.append(f'{name}={text(value)}')
    args += ['rngs=rngs'] if wrapper.rngs else []
    return f'nnx.{wrapper.nnx.rpartition(".")[2]}({", ".join(args)})'
  if child.sibling is not None:
    fields, args, positional = child.sibling.field_names, [], True
    for i, (f, v) in enumerate(child.kwargs.items()):  # positional while in field order, keywords after
      positional = positional and i < len(fields) and f == fields[i]
      args.append(text(v) if positional else f'{f}={text(v)}')
    args += [f'{k}={v}' for k, v in sibling_needs(child).items()]
    built = f'{ctx.plan.factory_callee.get(child.ctor, child.sibling.name)}({", ".join([*args, "rngs=rngs"])})'
    if child.stacked is not None:  # one layer per split key, variables stacked on axis 0
      metadata = f', transform_metadata={child.stacked.metadata}' if child.stacked.metadata else ''
      return f'nnx.vmap(lambda rngs: {built}{metadata})(rngs.split({child.stacked.length}))'
    return built
  spec = child.spec
  renames, accepted = dict(spec.arg_renames), nnx_arguments(spec.nnx)
  only = {k.name for k in spec.linen_only}
  args = [f'{k}={v}' for k, v in child.sizes.items()]
  for name, value in child.kwargs.items():
    new = renames.get(name, name)
    if name in only or new not in accepted:
      raise Unsupported(value, f'{name}= of {spec.linen} has no NNX counterpart to pass it to')
    args.append(f'{new}={text(value)}')
  callee = ctx.plan.factory_callee.get(child.ctor)  # a factory: its partial holds the Linen defaults
  args += [f'{k}={v!r}' for k, v in spec.linen_defaults if k not in child.kwargs and callee is None]
  args += [f'{k}={v if isinstance(v, str) else repr(v)}' for k, v in child.mode_defaults.items() if k in accepted]
  return f'{callee or "nnx." + spec.nnx.rpartition(".")[2]}({", ".join([*args, "rngs=rngs"])})'


def sibling_needs(child: Child) -> dict[str, str]:
  """What a converted class of the file takes beside its fields, as code by keyword: its input sizes, fields merged
  with a train/eval switch (`modes._merged_field`), the example inputs of its Linen children."""
  return {**child.sizes, **child.mode_defaults,
          **{name: f'{child.attr}_{name}' for name in child.sibling.example_params}}


def variable_text(ctx: ClassContext, child: Child) -> str:
  """`nnx.Param(init(rngs.params(), *args))` / `<Type>(init(*args))`, as code valid in __init__."""
  return variable_code(ctx, child.ctor, child.var_type, child.size_codes)


def variable_code(ctx: ClassContext, call: cst.Call, var_type: str, size_codes: dict[cst.CSTNode, str]) -> str:
  """The NNX Variable a `self.param(name, init, *args)` / `self.variable(collection, name, init, *args)` call
  creates, of type `var_type` (a param: `nnx.Param`, its init given `rngs.params()`); `size_codes` replace parts of
  the arguments."""
  param = scope_api(call) == 'param'
  leading, rest = scope_arguments(call)
  init = leading[-1]
  code = lambda node: queries.code(ctx, node, size_codes)
  args = [f'{a.keyword.value}={code(a.value)}' if a.keyword else code(a.value) for a in rest]
  # an initializer that is not a name, attribute or call (HF's `lambda _, shape: jnp.ones(shape)`) is called in
  # parentheses
  init_code = f'({code(init)})' if isinstance(init, _CALLED_IN_PARENS) else code(init)
  if param:
    return f'nnx.Param({init_code}({", ".join(["rngs.params()", *args])}))'
  if isinstance(init, cst.Lambda) and not args and init.params.deep_equals(cst.Parameters()):
    return f'{var_type}({code(init.body)})'
  return f'{var_type}({init_code}({", ".join(args)}))'
