"""Train/eval switches: `__call__` arguments and fields that only feed train/eval arguments go, as
NNX's `model.train()` / `model.eval()` set those.

Planning functions over a `context.ClassContext`, run by `planner.plan_class`: they read the file's facts and
fill the class's plan.
"""

from __future__ import annotations

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002 import queries
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.nodes import is_self_attr, is_written, read_names
from codemods.rules.l2n002.plan import Child, Unsupported
from codemods.vocabulary import EVAL_ATTRIBUTES, EVAL_VALUE, LAYER_MODE_KWARGS, MERGE_PARAM_NAMES, MODE_PARAMS
from nnx_bridge.layer_signatures import LINEN_CALL_PARAMS, NNX_CALL_MODES
from nnx_bridge.layer_table import MODE_ARGUMENTS

MODE_ARGUMENTS_BY_NAME = {m.name: m for m in MODE_ARGUMENTS}


def merged_switches(ctx: ClassContext, call: cst.FunctionDef) -> dict[str, cst.SimpleStatementLine]:
  """The statements `x = nn.merge_param('x', self.x, x)` at the top of `__call__`'s body that merge a train/eval
  switch with the field of its name (flax's sst2 `Embedder`: `deterministic: Optional[bool] = None` and
  `__call__(self, inputs, deterministic=None)`, the idiom of flax's own Linen Dropout), by switch. NNX's
  `model.train()` / `model.eval()` set that very field, as nnx.Dropout keeps `self.deterministic`: the statement
  goes, and the switch read after it is the field. Only a switch NNX holds under its own name (`deterministic`,
  `use_running_average`, not `train`)."""
  found = {}
  for statement in call.body.body:
    assign = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
            and isinstance(value := assign.value, cst.Call) and ctx.facts.has_name(value.func, MERGE_PARAM_NAMES)
            and len(value.args) == 3 and all(a.keyword is None and not a.star for a in value.args)):
      continue
    name = assign.targets[0].target.value
    label, field, argument = (a.value for a in value.args)
    if name in ctx.plan.switches and name in ctx.plan.field_names \
        and MODE_ARGUMENTS_BY_NAME[name].nnx_attribute == name and not MODE_ARGUMENTS_BY_NAME[name].inverted \
        and isinstance(label, cst.SimpleString) and label.evaluated_value == name \
        and isinstance(field, cst.Attribute) and is_self_attr(field) and field.attr.value == name \
        and isinstance(argument, cst.Name) and argument.value == name:
      found.setdefault(name, statement)
  return found


def read_switches(ctx: ClassContext, call: cst.FunctionDef) -> None:
  """A train/eval switch read other than to set a train/eval argument (`if not deterministic: rng = ...`, an
  attention function's `deterministic=`) becomes the attribute `model.train()` / `model.eval()` set, as flax's
  own nnx.Dropout and nnx.MultiHeadAttention keep it: `self.deterministic` (`not self.deterministic` for an
  inverted switch like `train`). The module starts in the mode of the switch's default (train mode without one,
  as NNX modules do), or of the field a `merge_param` statement merged it with (`merged_switches`; the statement
  goes)."""
  merged = ctx.plan.merged_switches
  inside_merge = {id(sub) for statement in merged.values() for sub in descendants(statement)}
  ctx.plan.removed.update(merged.values())
  keywords = {sub.keyword for sub in descendants(call.body) if isinstance(sub, cst.Arg)}
  reads = [sub for sub in descendants(call.body) if isinstance(sub, cst.Name) and sub.value in ctx.plan.switches
           and sub not in ctx.plan.mode_uses | keywords and not is_written(sub, ctx.facts.parent)
           and id(sub) not in inside_merge]
  taken = {*ctx.plan.field_names, *(c.attr for c in ctx.plan.children)} - set(merged)
  started: set[str] = set()
  for sub in reads:
    argument = MODE_ARGUMENTS_BY_NAME[sub.value]
    attribute = argument.nnx_attribute
    if attribute in taken:
      raise Unsupported(sub, f'the train/eval switch {sub.value} is read, and self.{attribute}, which would hold '
                             'it, is taken')
    parent = ctx.facts.parent(sub)
    if argument.inverted and isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
      ctx.plan.exprs[parent] = f'self.{attribute}'  # `not train`
    else:
      ctx.plan.exprs[sub] = f'(not self.{attribute})' if argument.inverted else f'self.{attribute}'
    if attribute not in started and attribute in merged:
      started.add(attribute)
      ctx.plan.pending.append((sub, f'the train/eval switch {sub.value} read here is the field self.{attribute} '
                                     'nn.merge_param merged it with, which model.train() / model.eval() set'))
    elif attribute not in started:
      started.add(attribute)
      default = ctx.plan.switch_defaults.get(sub.value)
      start = (default ^ argument.inverted) if default is not None else False
      ctx.plan.init_lines.append(f'self.{attribute} = {start}')
      negation = 'not ' if argument.inverted else ''
      ctx.plan.pending.append((sub, f'the train/eval switch {sub.value} read here is {negation}self.{attribute}, '
                                     f'which model.train() / model.eval() set (it starts {start})'))
  for sub in descendants(call.body):
    if isinstance(sub, cst.Name) and sub.value in ctx.plan.switches and is_written(sub, ctx.facts.parent) \
        and id(sub) not in inside_merge:
      raise Unsupported(sub, f'the train/eval switch {sub.value} is assigned to')


def _linen_call_params(ctx: ClassContext, name: str | None) -> list[cst.Param]:
  """The `__call__` parameters (after self) of the Linen class `name` of this file."""
  if name not in ctx.facts.class_defs:
    return []
  body = ctx.facts.class_defs[name].body.body
  call = next((s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == '__call__'), None)
  return list(call.params.params[1:]) if call is not None else []


def ctor_modes(ctx: ClassContext, child: Child) -> None:
  """Drops the constructor's train/eval kwargs (a layer's, a train/eval field of a class of the file), which
  NNX's train()/eval() set; one that reads no switch (flax's ogbg `nn.Dropout(rate, deterministic=self.deterministic)`
  with a field that has a default, a literal) stays, as the NNX layer's starting mode."""
  for key in [k for k in child.kwargs if child.spec is not None and k in LAYER_MODE_KWARGS]:
    if _fixed_mode(ctx, child.kwargs[key]):
      ctx.plan.pending.append((child.kwargs[key], f'{key}={ctx.facts.code(child.kwargs[key])} reads no train/eval '
                                                  'switch: the NNX layer starts in that mode (model.train() / '
                                                  'model.eval() would set it)'))
      continue
    _mode_default(ctx, child, key, queries.switch(ctx, child.kwargs.pop(key), False))
  if child.sibling is not None:
    for name, inverted in child.sibling.mode_fields.items():
      if name not in child.kwargs:
        raise Unsupported(child.ctor, f'the train/eval field {name} of {child.sibling.name} is not given')
      queries.switch(ctx, child.kwargs.pop(name), inverted)


def _mode_default(ctx: ClassContext, child: Child, attribute: str, value: bool | str | None) -> None:
  """A layer fed by a switch with a default starts in that mode, as the Linen call without it did; fed by a switch
  merged with a field, in the mode of that field (`self.deterministic`, code)."""
  if value is not None and child.spec is not None:
    child.mode_defaults[attribute] = value


def check_calls(ctx: ClassContext, calls: dict[cst.Call, Child]) -> None:
  """Checks the train/eval arguments of each child call; records in the plan the positions its NNX call drops."""
  for call, child in calls.items():
    dropped = call_modes(ctx, call, child)
    attr = ctx.plan.calls[call][0] if call in ctx.plan.calls else None
    if attr or dropped:
      ctx.plan.calls[call] = (attr, dropped)


def call_modes(ctx: ClassContext, call: cst.Call, child: Child) -> set[int]:
  """Checks a child call's train/eval arguments; returns the positions to drop."""
  if child.bridged:  # a switch given to a Linen train/eval argument: the wrapper's train()/eval() set it
    target = queries.kept_target(ctx, child.ctor.func) or _built_class(child.ctor)
    names = [p.name.value for p in _linen_call_params(ctx, target)]
    dropped = set()
    for position, arg in enumerate(call.args):
      name = arg.keyword.value if arg.keyword is not None else names[position] if position < len(names) else None
      if name not in MODE_PARAMS:
        continue
      try:
        default = queries.switch(ctx, arg.value, MODE_PARAMS[name])
      except Unsupported:  # a literal or other value: passed on to the Linen call as written
        continue
      dropped.add(position)
      if isinstance(default, str):  # the wrapper starts in the mode of the field the switch was merged with
        child.mode_defaults['eval_mode'] = f'not {default}' if MODE_PARAMS[name] else default
      elif default is not None:  # the wrapper starts in the mode the switch's default gave
        child.mode_defaults['eval_mode'] = default ^ MODE_PARAMS[name]
    return dropped
  if child.wrapper is not None:
    wrapper = child.wrapper
    if len([a for a in call.args if a.keyword is None]) > len(wrapper.call_args):
      raise Unsupported(call, 'positional arguments beyond the layer inputs')
    for arg in call.args:
      if arg.keyword is not None and arg.keyword.value in wrapper.linen_only_call:
        raise Unsupported(arg, f'{arg.keyword.value}= of a {wrapper.linen} call has no NNX counterpart')
    return set()
  if child.spec is not None:
    names = LINEN_CALL_PARAMS.get(child.spec.linen, child.spec.call_args)  # `self.dropout(h, deterministic)`
    positional = len([a for a in call.args if a.keyword is None])
    beyond = names[len(child.spec.call_args):positional]
    if positional > len(names) or any(n not in LAYER_MODE_KWARGS for n in beyond):
      raise Unsupported(call, 'positional arguments beyond the layer inputs')
    targets = {name: False for name in LAYER_MODE_KWARGS}
    targets.update({i: False for i, name in enumerate(names) if name in LAYER_MODE_KWARGS})
  else:
    targets = {}
    for index, name, inverted in child.sibling.mode_params:
      targets[index] = targets[name] = inverted
  dropped, seen = set(), set()
  for position, arg in enumerate(call.args):
    key = arg.keyword.value if arg.keyword is not None else position
    if key in targets and child.spec is not None and arg.keyword is not None \
        and key in NNX_CALL_MODES.get(child.spec.nnx, ()) and _fixed_mode(ctx, arg.value):
      ctx.plan.pending.append((arg, f'{key}={ctx.facts.code(arg.value)} reads no train/eval switch: it stays in the '
                                    'call, which runs in that mode whatever model.train() / model.eval() set, as '
                                    'Linen ran it'))
      continue
    if key in targets:
      default = queries.switch(ctx, arg.value, targets[key])
      if child.spec is not None:
        _mode_default(ctx, child, key if arg.keyword is not None else names[position], default)
      else:
        _merged_field(child, key if arg.keyword is not None else _param_name(child, key), default)
      dropped.add(position)
      seen.add(key)
  missing = [n for i, n, _ in child.sibling.mode_params if i not in seen and n not in seen] \
      if child.sibling is not None else []
  if missing:
    _eval_view(ctx, call, child, missing, bool(seen))
  return dropped


def _fixed_mode(ctx: ClassContext, value: cst.BaseExpression) -> bool:
  """Whether a train/eval argument's value reads neither a switch of the call nor a train/eval field (which go,
  `model.train()` / `model.eval()` setting them): a literal, a field with a default, the config
  (`deterministic=config.deterministic`, flax's wmt), code of those."""
  names = {n.value for n in read_names(value)}  # not the attribute of `config.deterministic`
  fields = {n.attr.value for n in (value, *descendants(value)) if isinstance(n, cst.Attribute) and is_self_attr(n)}
  return not names & set(ctx.plan.switches) and not fields & set(ctx.plan.mode_fields)


def _merged_field(child: Child, name: str | None, value: bool | str | None) -> None:
  """A class of the run whose switch `name` its call merges with the field of that name (`merged_switches`) is
  built with that field set to what the Linen call gave it: the caller's switch default or merged field (its own
  default would let it run in another mode than Linen ran it). A field the construction gives is left as it is."""
  if name in child.sibling.merged_switches and value is not None and name not in child.kwargs:
    child.mode_defaults[name] = value


def _param_name(child: Child, position: int) -> str | None:
  """The name of the `__call__` parameter at `position` of the class `child` builds."""
  return next((name for index, name, _ in child.sibling.mode_params if index == position), None)


def _eval_view(ctx: ClassContext, call: cst.Call, child: Child, missing: list[str], given: bool) -> None:
  """A class of the run called without its train/eval arguments (transformers' `self.layers(hidden_states, ...)`
  with no `deterministic=`): Linen runs it in the mode of their defaults whatever the caller's mode. When that is
  eval mode, NNX calls an eval-mode copy of it (`emit.eval_view_call`); any other default keeps the class Linen."""
  name = child.sibling.name
  defaults = {n: child.sibling.switch_defaults.get(n) for n in missing}
  if given or child.remat or child.stacked or child.scan \
      or any(value is None or value != EVAL_VALUE[n] for n, value in defaults.items()):
    raise Unsupported(call, f'a train/eval argument of {name} left to its default, which is not eval mode or '
                             f'goes with others given: pass {", ".join(missing)} in the call')
  ctx.plan.eval_views.add(call)
  given_as = ', '.join(f'{n}={v}' for n, v in defaults.items())
  ctx.plan.pending.append((call, f'{name} is called without {", ".join(missing)}: Linen runs it in eval mode '
                                 f'({given_as}) whatever the mode of the caller, so NNX calls an eval-mode copy, '
                                 f'nnx.with_attributes(..., {EVAL_ATTRIBUTES})'))


def _built_class(ctor: cst.Call) -> str | None:
  """The class a bridged child's construction builds: `Block` of `Block(...)` and of `nnx_bridge.to_linen(Block, ...)`
  (an NNX class an earlier run bridged, whose `__call__` the wrapper runs)."""
  if isinstance(ctor.func, cst.Name):
    return ctor.func.value
  first = ctor.args[0].value if ctor.args and ctor.args[0].keyword is None else None
  return first.value if isinstance(first, cst.Name) else None
