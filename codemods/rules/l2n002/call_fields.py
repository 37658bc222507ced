"""Fields that a class's builders fill with what their own call computes: evojax's and flax's seq2seq build
`Decoder(init_state=init_decoder_state, teacher_force=...)(inputs)` with the state an encoder has just returned.
Linen builds submodules during the call, so a field may hold such an array; NNX builds them in `__init__`, before
any call. Such a field becomes a keyword-only argument of the class's `__call__`, with the field's default, its
reads there (`self.init_state`) the argument; each builder passes it there instead of to the constructor
(`self.decoder(inputs, init_state=init_decoder_state)`, `children.inline_calls`).

A field qualifies when a construction of the class in its file gives it a local bound to the output of a
submodule's call, every reference to the class in the file is a construction called where it is built, in a
method of a Linen class (so every builder can pass it at the call), and only `__call__` reads it, which no Linen
transform decorates.
A Linen class cannot wrap such a class with nnx_bridge.to_linen (`linen_parents.py`), and code elsewhere that
still gives the field to the constructor gets a TODO (`analysis/seams.py`).

Plain functions over a `context.ClassContext`, run by `planner.plan_class`.
"""

from __future__ import annotations

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.loop_headers import enclosing
from codemods.rules.l2n002.nodes import is_self_attr, is_written
from codemods.rules.l2n002.plan import ClassRewrite
from codemods.vocabulary import COMPACT_NAMES


def call_fields(ctx: ClassContext, node: cst.ClassDef, fields: list[cst.SimpleStatementLine], names: list[str],
                call: cst.FunctionDef) -> dict[str, str | None]:
  """The fields of `node` that become keyword-only arguments of its `__call__`, with the code of their default
  (None: the field has none)."""
  sites = _constructions(ctx, node.name.value)
  taken = {p.name.value for p in (*call.params.params, *call.params.kwonly_params)}
  if not sites or any(not ctx.facts.has_name(d.decorator, COMPACT_NAMES) for d in call.decorators):
    return {}  # a lifted __call__ (`@nn.remat`): its arguments are the transform's
  found: dict[str, str | None] = {}
  for field, name in zip(fields, names):
    given = [_keyword(site, name) for site in sites]
    default = field.body[0].value
    if name in taken or not any(v is not None and _call_output(ctx, v) for v in given) \
        or isinstance(default, cst.Call):  # `field(default_factory=...)`: no default a call could take
      continue
    reads = [s for s in descendants(node) if isinstance(s, cst.Attribute) and is_self_attr(s) and s.attr.value == name]
    if any(not ctx.facts.inside(r, call) or is_written(r, ctx.facts.parent) for r in reads):
      continue
    found[name] = ctx.facts.code(default) if default is not None else None
  return found


def plan_call_fields(ctx: ClassContext, node: cst.ClassDef, plan: ClassRewrite, found: dict[str, str | None],
                     call: cst.FunctionDef) -> None:
  """Records the fields `call_fields` found as keyword-only arguments of `__call__` and reads them there."""
  plan.call_fields = dict(found)
  plan.call_params += list(found)
  ctx.plan.added_params[call] = [name if default is None else f'{name}={default}' for name, default in found.items()]
  for sub in descendants(call):
    if isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value in found:
      ctx.plan.exprs[sub] = sub.attr.value
  sites = _constructions(ctx, node.name.value)
  builders = sorted({c for c, d in ctx.facts.class_defs.items() if any(ctx.facts.inside(s, d) for s in sites)})
  for name in found:
    ctx.plan.pending.append((node, f'field {name} -> a keyword-only argument of __call__: {", ".join(builders)} '
                                   f'give{"s" if len(builders) == 1 else ""} it what their call computes, which NNX, '
                                   'building submodules in __init__, has only at the call'))


def _constructions(ctx: ClassContext, name: str) -> list[cst.Call]:
  """The constructions of the class `name` in its file, each called where it is built in a method of a Linen class
  of the file; none when the class is referenced any other way."""
  sites = []
  for sub in descendants(ctx.facts.module):
    if not (isinstance(sub, cst.Name) and sub.value == name):
      continue
    parent = ctx.facts.parent(sub)
    if isinstance(parent, cst.ClassDef) and parent.name is sub:
      continue
    outer = ctx.facts.parent(parent)
    method, owner = enclosing(ctx, sub, cst.FunctionDef), enclosing(ctx, sub, cst.ClassDef)
    if not (isinstance(parent, cst.Call) and parent.func is sub and isinstance(outer, cst.Call) and outer.func is parent
            and method is not None and owner is not None and owner.name.value in ctx.facts.linen_classes):
      return []
    sites.append(parent)
  return sites


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
  return next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def _call_output(ctx: ClassContext, value: cst.BaseExpression) -> bool:
  """Whether `value` is a local bound once, to the output of a submodule's call (`Encoder(...)(inputs)`,
  `self.encoder(inputs)`)."""
  scope = ctx.facts.scope(value) if isinstance(value, cst.Name) else None
  assignments = list(scope[value.value]) if scope is not None and value.value in scope else []
  if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
    return False
  target = ctx.facts.parent(assignments[0].node)
  assign = ctx.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
  output = assign.value if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
  if not isinstance(output, cst.Call):
    return False
  func = output.func
  return isinstance(func, cst.Call) and (isinstance(func.func, cst.Name) and func.func.value in ctx.facts.linen_classes
                                         or ctx.facts.is_linen_name(func.func)) \
      or isinstance(func, cst.Attribute) and is_self_attr(func)
