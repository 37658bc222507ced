"""setup() attributes computed from a parameter, for rule L2N002: `self.lambda1 = scale * self.param('lambda1', ...)`
(transformers' Dinov2 LayerScale), maybe updated by the statements right after it (`self.lambda1 = self.lambda1 *
scale`).

Linen runs setup() at every apply, so such an attribute follows the parameter as it trains; NNX runs `__init__` once,
and an attribute computed there would keep the initial value. The parameter becomes a child of its own
(`self.lambda1_param = nnx.Param(...)`, Linen's `lambda1`) and the attribute a property that runs the same statements
on it at each read. Only code a method can run takes part: `self`, globals and builtins, no local of setup().
"""

from __future__ import annotations

import builtins
import dataclasses

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002 import queries
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.nodes import field_name, is_self_attr, read_names, scope_api, self_assignment
from codemods.rules.l2n002.plan import ClassRewrite


@dataclasses.dataclass(frozen=True)
class DerivedParam:
  """`self.<attr> = <code around self.param(...)>` and the statements right after it that update `self.<attr>`."""

  attr: str
  statements: tuple[cst.SimpleStatementLine, ...]
  param: cst.Call


def derived_param(ctx: ClassContext, setup: cst.FunctionDef, statement: cst.BaseStatement) -> DerivedParam | None:
  """The derived parameter `statement` starts, else None."""
  attr = self_assignment(statement)
  if attr is None:
    return None
  value = statement.body[0].value
  calls = [c for c in descendants(value) if isinstance(c, cst.Call) and scope_api(c) is not None]
  if len(calls) != 1 or scope_api(calls[0]) != 'param':
    return None
  body = list(setup.body.body)
  group = [statement]
  for later in body[body.index(statement) + 1:]:
    if self_assignment(later) != attr or not _reads(later.body[0].value, attr):
      break
    group.append(later)
  node = ctx.facts.class_defs[ctx.plan.name]
  assigned = [t for sub in descendants(node) if isinstance(sub, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign))
              for t in (sub.target, *descendants(sub.target)) if isinstance(t, cst.Attribute) and is_self_attr(t)
              and t.attr.value == attr]
  if len(assigned) != len(group) or any(_scope_calls(s.body[0].value) for s in group[1:]):
    return None
  if any(_reads(s, attr) for s in body if s not in group):  # `self.b = 2 * self.lambda1`: NNX would run it once
    return None
  param = calls[0]
  if not all(_method_code(ctx, s.body[0].value, param) for s in group):
    return None
  return DerivedParam(attr, tuple(group), param)


def plan_derived(ctx: ClassContext, plan: ClassRewrite, derived: DerivedParam) -> str:
  """The statements as a property of the class (`plan.properties`); returns the attribute the parameter takes, a
  child of its own that the planner adds."""
  node = ctx.facts.class_defs[plan.name]
  taken = {field_name(s) for s in node.body.body} | {s.name.value for s in node.body.body
                                                      if isinstance(s, cst.FunctionDef)} | ctx.plain_attributes
  name = f'{derived.attr}_param'
  while name in taken:
    name += '_'
  ctx.plain_attributes.add(derived.attr)
  ctx.plan.removed.update(derived.statements)
  replacements: dict[cst.CSTNode, str] = {derived.param: f'self.{name}[...]'}
  for statement in derived.statements:
    for sub in descendants(statement.body[0].value):
      if isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value == derived.attr:
        replacements[sub] = derived.attr  # the value so far, a local of the property
      elif not _inside(sub, derived.param) and not _dotted_part(ctx, sub) \
          and (nnx := queries.nnx_name_for(ctx, sub)) is not None:  # `nn.softplus` -> `nnx.softplus`
        replacements[sub] = nnx
  lines = [f'{derived.attr} = {queries.code(ctx, s.body[0].value, replacements)}' for s in derived.statements]
  linen = derived.param.args[0].value
  plan.properties.append(
      f'@property\ndef {derived.attr}(self):\n'
      f'  """Computed from the parameter self.{name} (Linen\'s {ctx.facts.code(linen)}) at each read, as Linen\'s '
      'setup() computed it at each apply."""\n'
      + ''.join(f'  {line}\n' for line in lines[:-1]) + f'  return {lines[-1].partition(" = ")[2]}\n')
  ctx.plan.pending.append((derived.statements[0].body[0], f'self.{derived.attr}: computed from a parameter in setup() '
                                                          f'-> a property over the parameter self.{name}'))
  return name


def _reads(value: cst.CSTNode, attr: str) -> bool:
  return any(isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value == attr
             for sub in (value, *descendants(value)))


def _scope_calls(value: cst.BaseExpression) -> bool:
  return any(isinstance(c, cst.Call) and scope_api(c) is not None for c in (value, *descendants(value)))


def _dotted_part(ctx: ClassContext, node: cst.CSTNode) -> bool:
  """Whether `node` is the `nn` of `nn.softplus`: part of a longer dotted name."""
  parent = ctx.facts.parent(node)
  return isinstance(parent, cst.Attribute) and parent.value is node


def _inside(node: cst.CSTNode, outer: cst.CSTNode) -> bool:
  return node is outer or any(node is sub for sub in descendants(outer))


def _method_code(ctx: ClassContext, value: cst.BaseExpression, param: cst.Call) -> bool:
  """Whether `value`, the parameter call aside, reads nothing but `self`, globals and builtins, and calls no method of
  the class (which may build layers): code a property can run."""
  methods = {s.name.value for s in ctx.facts.class_defs[ctx.plan.name].body.body if isinstance(s, cst.FunctionDef)}
  if any(not _inside(n, param) and n.value != 'self' and n.value not in ctx.facts.global_names
         and not hasattr(builtins, n.value) for n in read_names(value)):
    return False
  return not any(isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value in methods
                 and not _inside(sub, param) for sub in (value, *descendants(value)))
