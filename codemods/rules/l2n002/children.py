"""Submodules: the child a construction becomes, its calls, and the conditions it is created under.
What a construction builds is read by `constructions.py`, its `__init__` code written by `init_code.py`.

Planning functions over a `context.ClassContext`, run by `planner.plan_class`: they read the file's facts and
fill the class's plan.
"""

from __future__ import annotations

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002 import constructions, queries
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.nodes import (
  has_scope_call,
  is_self_attr,
  literal_identifier,
)
from codemods.rules.l2n002.plan import Child, ClassRewrite, Unsupported
from codemods.rules.l2n002.sizes import setup_bindings
from nnx_bridge.layer_table import (
  SHARED_LAYER_ATTRIBUTES,
  LayerSpec,
  WrapperSpec,
  find_wrapper,
  linen_fields,
)


def build_child(ctx: ClassContext, ctor: cst.Call, counts: dict[str, int], attr: str | None,
                built: tuple[str, LayerSpec | None, ClassRewrite | None] | None = None) -> Child:
  """The child the construction `ctor` builds (`attr`: its setup() attribute, None inline): what it is, its
  arguments, the cell of a wrapper, its lifted options; `counts` numbers Linen's auto-named children. `built`: what
  it builds, where not the first class `constructions.constructed` names (another class a local may name)."""
  linen, spec, sibling = built or constructions.constructed(ctx, ctor)
  if spec is None and sibling is None and (linen in ctx.facts.linen_classes or linen == constructions.TO_LINEN
                                           or ctx.facts.settled_class(ctor.func) is not None):
    constructions.kept_choice(ctx, ctor)
    return _bridged_child(ctx, ctor, linen, counts, attr)
  wrapper = find_wrapper(linen) if spec is None and sibling is None else None
  stacked, wrapped = ctx.plan.stacks.get(ctor), ctx.plan.remats.get(ctor)
  short = ('Scan' if ctor in ctx.plan.scans else stacked.transform.capitalize() if stacked else '') \
      + ('Checkpoint' if stacked and stacked.remat is not None else
         wrapped[2] if wrapped else '') \
      + linen.rpartition('.')[2]  # Linen names it ScanCell_0, CheckpointBlock_0, ScanCheckpointBlock_0, VmapBlock_0
  args = [*ctx.plan.partials[ctor].args[1:], *ctor.args] if ctor in ctx.plan.partials else ctor.args
  if any(a.star for a in args):
    raise Unsupported(ctor, 'a constructor call with *args or **kwargs')
  positional = [a.value for a in args if a.keyword is None]
  names = linen_fields(linen) if sibling is None else tuple(sibling.linen_fields)
  if len(positional) > len(names):
    raise Unsupported(ctor, f'too many positional arguments for {short}')
  kwargs = dict(zip(names, positional))
  kwargs.update((a.keyword.value, a.value) for a in args if a.keyword is not None)
  if 'parent' in kwargs:
    raise Unsupported(ctor, 'parent= is not converted')
  name = kwargs.pop('name', None)
  listed = ctx.loops.list_name(ctx, ctor, name)  # built in a loop, name=f'layer_{i}': the nnx.List `layers`
  if name is not None and listed is None and not _element(ctx, ctor, attr) and not _named_right(name, attr):
    raise Unsupported(ctor, 'name= is not a literal identifier')
  cell = _cell(ctx, ctor, wrapper, kwargs.pop(wrapper.cell_kwarg, None), counts) if wrapper is not None else None
  at_call = {f: kwargs.pop(f) for f in (sibling.call_fields if sibling is not None else ()) if f in kwargs}
  outer = ctx.facts.parent(ctor)
  if at_call and (attr is not None or not (isinstance(outer, cst.Call) and outer.func is ctor)
                  or not all(isinstance(v, cst.Name) for v in at_call.values())):
    raise Unsupported(ctor, f'{short} takes {", ".join(at_call)} at its call in NNX: build it where it is called, '
                            f'giving {"it" if len(at_call) == 1 else "them"} a local (`{short}(...)(x)`)')
  refs = queries.size_refs(ctx, kwargs.values())
  for value in kwargs.values():
    queries.check_hoistable(ctx, value, skip=set(refs))
  explicit = listed or (name.evaluated_value if isinstance(name, cst.SimpleString) else attr)
  if not explicit:
    counts[short] = counts.get(short, -1) + 1  # Linen numbers auto-named children per class
  child = Child(listed or attr or explicit or '', explicit or f'{short}_{counts[short]}', ctor, spec, sibling, kwargs,
                 wrapper=wrapper, cell=cell, scan=ctx.plan.scans.get(ctor), remat=ctx.plan.remats.get(ctor), stacked=stacked,
                 shape_refs=refs, call_values=at_call)
  return child


def _bridged_child(ctx: ClassContext, ctor: cst.Call, linen: str, counts: dict[str, int], attr: str | None) -> Child:
  """A Linen class of the file that stays Linen, built by `ctor`: wrapped with nnx_bridge.from_linen, initialised
  from example inputs the converted class takes as a constructor argument."""
  queries.check_hoistable(ctx, ctor, linen=True)
  name = next((a.value for a in ctor.args if a.keyword is not None and a.keyword.value == 'name'), None)
  if name is not None and not _element(ctx, ctor, attr) and not _named_right(name, attr):
    raise Unsupported(ctor, 'name= is not a literal identifier')
  explicit = name.evaluated_value if isinstance(name, cst.SimpleString) else attr
  if isinstance(ctor.func, cst.Call):  # Linen names nn.map_variables(Block) Map_variablesBlock_0
    short = ctx.facts.code(ctor.func.func).rpartition('.')[2].capitalize() + linen
  else:
    short = linen
  if not explicit:
    counts[short] = counts.get(short, -1) + 1
  elsewhere = ctx.facts.settled_class(ctor.func) is not None
  why = 'it stays Linen in its own file (see its TODO there)' if elsewhere else \
      ctx.facts.kept_linen.get(linen, 'it was not converted (see its TODO)')
  return Child(attr or explicit or '', explicit or f'{short}_{counts[short]}', ctor, None, None, {}, bridged=why)


def _element(ctx: ClassContext, ctor: cst.Call, attr: str | None) -> bool:
  """Whether `ctor` is an element of a setup() list or tuple, whose name= `element_lists.place` checks (one that
  stays Linen is refused as such by the planner)."""
  return attr is not None and isinstance(ctx.facts.parent(ctor), cst.Element)


def _named_right(name: cst.BaseExpression, attr: str | None) -> bool:
  """Whether L2N002 keeps `name=`: any string literal when a setup() attribute holds the child (the attribute is
  the NNX name, `name=` only where Linen keeps the variables), else an identifier (the NNX attribute is named
  after it)."""
  return literal_identifier(name) or attr is not None and isinstance(name, cst.SimpleString)


def inline_calls(ctx: ClassContext, plan: ClassRewrite, inline: dict[cst.Call, cst.Call]) -> dict[cst.Call, Child]:
  """The calls of the submodules built in the @nn.compact method, and of locals bound to one."""
  by_ctor = {c.ctor: c for c in plan.children}
  calls: dict[cst.Call, Child] = {}
  for ctor, call in inline.items():  # a call of a local several arms bind: the first arm's child sizes them all
    calls.setdefault(call, by_ctor[ctor])
  for call, ctor in ctx.plan.extra_calls.items():  # `embed(...)` again: the same submodule
    if ctor in by_ctor:
      calls.setdefault(call, by_ctor[ctor])
      ctx.plan.calls[call] = (None if ctor in ctx.plan.arm_bound else by_ctor[ctor].attr, set())
  for child, call in zip([by_ctor[c] for c in inline], inline.values()):
    if child.ctor in ctx.plan.arm_bound:  # `std_module = self.std_param` where Linen built it; the calls stay
      ctx.plan.exprs[child.ctor] = f'self.{child.attr}'
    ctx.plan.calls[call] = (None if child.ctor in ctx.plan.arm_bound else child.attr, set())
    _lifted_call(ctx, call, child)
    if child.call_values:  # `Decoder(init_state=state)(x)` -> `self.decoder(x, init_state=state)` (`call_fields.py`)
      ctx.plan.keywords[call] = ', '.join(f'{k}={v.value}' for k, v in child.call_values.items())
      ctx.plan.pending.append((call, f'{", ".join(child.call_values)} given to the call of self.{child.attr}, which '
                                     f'takes {"it" if len(child.call_values) == 1 else "them"} there in NNX'))
  return calls


def _same_attribute_read(ctx: ClassContext, child: Child, sub: cst.Attribute) -> bool:
  """Whether `sub` (`self.<child>`) is read for an attribute the converted child holds under the same name and with
  the same value: a field of a class of the run or an attribute its setup() sets once from plain code (NNX's
  `__init__` stores both), or the dtype of a table layer it builds in setup() (Dinov2's
  `self.patch_embeddings.projection.dtype`)."""
  parent = ctx.facts.parent(sub)
  sibling = child.sibling
  if sibling is None or not (isinstance(parent, cst.Attribute) and parent.value is sub) \
      or isinstance(ctx.facts.parent(parent), (cst.AssignTarget, cst.AugAssign, cst.Del)):
    return False
  attributes = (sibling.setup_bindings or ({}, {}))[0] if sibling.origin else setup_bindings(ctx.facts, sibling.name)[0]
  if parent.attr.value in sibling.field_names \
      or parent.attr.value in attributes and parent.attr.value not in {c.attr for c in sibling.children}:
    return True
  grandchild = next((c for c in sibling.children if c.attr == parent.attr.value and not c.hoisted), None)
  outer = ctx.facts.parent(parent)
  return grandchild is not None and grandchild.spec is not None and grandchild.wrapper is None \
      and isinstance(outer, cst.Attribute) and outer.value is parent and outer.attr.value in SHARED_LAYER_ATTRIBUTES \
      and not isinstance(ctx.facts.parent(outer), (cst.AssignTarget, cst.AugAssign, cst.Del))


def setup_child_calls(ctx: ClassContext, plan: ClassRewrite, methods: dict[str, cst.FunctionDef], setup: cst.FunctionDef | None,
                       calls: dict[cst.Call, Child], tied: set[cst.Attribute]) -> None:
  """Adds to `calls` each call of a submodule built in setup() (but the `tied` uses); setup params read back
  become `[...]` reads."""
  from_setup = {c.attr: c for c in plan.children if not c.hoisted and not c.repeated}
  for method in methods.values():
    if method is setup:
      continue
    for sub in descendants(method):
      if not (isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value in from_setup) or sub in tied:
        continue
      child, parent = from_setup[sub.attr.value], ctx.facts.parent(sub)
      if ctx.loops.list_use(ctx, sub, child, calls):  # `for layer in self.layers:` over a setup() list
        continue
      if child.api == 'param':
        if isinstance(parent, (cst.AssignTarget, cst.Del)) or isinstance(parent, cst.AugAssign) and parent.target is sub:
          raise Unsupported(sub, f'self.{child.attr} (a param) assigned to')
        if not _none_test(parent, sub):  # `if self.lambda_1 is not None:`: the Param, or None where it is not made
          ctx.plan.exprs[sub] = f'self.{child.attr}[...]'
      elif child.api == 'variable':
        if isinstance(parent, cst.Attribute) and parent.value is sub and parent.attr.value == 'value':
          ctx.plan.exprs[parent] = f'self.{child.attr}[...]'  # `.value` is deprecated in NNX
      elif child.api is None:
        if (child.scan is not None or child.remat is not None or child.stacked is not None or child.sibling is not None) \
            and isinstance(parent, cst.Attribute) and parent.value is sub \
            and isinstance(ctx.facts.parent(parent), cst.Call) and ctx.facts.parent(parent).func is parent:
          continue  # `self.rnn.initial_state(...)`: a method of the cell (outside the scan), or of a converted class
        if _none_test(parent, sub):
          continue  # `if self.shortcut is not None:`: None when it is not created, in NNX as in Linen
        if _same_attribute_read(ctx, child, sub):
          continue  # `self.patch_embeddings.projection.dtype`: the NNX module has it too
        if not (isinstance(parent, cst.Call) and parent.func is sub):
          raise Unsupported(sub, f'self.{sub.attr.value} used other than by calling it')
        calls[parent] = child
        _lifted_call(ctx, parent, child)


def _lifted_call(ctx: ClassContext, call: cst.Call, child: Child) -> None:
  """Records a call of a scanned, rematted or stacked child in the plan, for `lifted.check_calls`."""
  if child.scan is not None:
    ctx.plan.scan_calls[call] = child
  if child.remat is not None:
    ctx.plan.remat_calls[call] = child
  if child.stacked is not None:
    ctx.plan.stack_calls[call] = child


def _none_test(parent: cst.CSTNode, use: cst.Attribute) -> bool:
  """Whether `parent` is `<use> is None` or `<use> is not None`."""
  return isinstance(parent, cst.Comparison) and parent.left is use and len(parent.comparisons) == 1 \
      and isinstance(parent.comparisons[0].operator, (cst.Is, cst.IsNot)) \
      and isinstance(parent.comparisons[0].comparator, cst.Name) and parent.comparisons[0].comparator.value == 'None'


def called_when(ctx: ClassContext, plan: ClassRewrite, calls: dict[cst.Call, Child]) -> None:
  """A setup() submodule that every call runs under one construction-time condition (`self.pooler(h) if
  self.add_pooling_layer else None`) is created only when it holds, else None: Linen creates the variables of a
  submodule only when it is called, so NNX then has the same variables."""
  conditions: dict[str, set[str | None]] = {}
  for call, child in calls.items():
    if not child.hoisted and child.api is None and child.condition is None:
      conditions.setdefault(child.attr, set()).add(_call_condition(ctx, call))
  for child in plan.children:
    found = conditions.get(child.attr, {None})
    if len(found) == 1 and None not in found:
      child.condition = found.pop()
      ctx.plan.pending.append((child.ctor, f'self.{child.attr} is created only when {child.condition} (else None): '
                                            'it is called only then, and Linen creates its variables only then'))


def _call_condition(ctx: ClassContext, call: cst.Call) -> str | None:
  """The construction-time condition a call runs under (the innermost `if` or `a if c else b` around it), as
  code valid in __init__; None when it runs always, or under a test on the call (a train/eval switch keeps the
  class Linen, see planner._finish)."""
  node, parent = call, ctx.facts.parent(call)
  while parent is not None and not isinstance(parent, cst.FunctionDef):
    if isinstance(parent, (cst.IfExp, cst.If)) and node is not parent.test:
      if has_scope_call(parent.test) or any(isinstance(c, cst.Call) and isinstance(c.func, cst.Attribute)
                                            and is_self_attr(c.func) for c in descendants(parent.test)):
        return None  # `if self.is_initializing():`, a method's result: not known when __init__ runs
      children = {c.attr for c in ctx.plan.children}
      if any(isinstance(a, cst.Attribute) and is_self_attr(a) and a.attr.value in children
             for a in (parent.test, *descendants(parent.test))):
        return None  # `if self.conv_shortcut is not None:`: whether __init__ built it, which it decides itself
      try:
        queries.check_hoistable(ctx, parent.test)
      except Unsupported:
        return None
      test = parent.test
      if node is parent.body:
        return queries.code(ctx, test)
      return queries.negated_code(ctx, test)
    node, parent = parent, ctx.facts.parent(parent)
  return None


def _cell(ctx: ClassContext, ctor: cst.Call, wrapper: WrapperSpec, value: cst.BaseExpression | None,
          counts: dict[str, int]) -> Child:
  """The table cell a wrapper is built around, built in the wrapper's constructor call."""
  built = constructions.constructed(ctx, value) if isinstance(value, cst.Call) else None
  if built is None or built[0] not in wrapper.cells:
    short = wrapper.linen.rpartition('.')[2]
    cells = ', '.join(c.rpartition('.')[2] for c in wrapper.cells)
    raise Unsupported(value or ctor, f'{short} over a cell other than a {cells} built in its constructor call '
                                      '(a cell class of your own, or a cell built elsewhere)')
  return build_child(ctx, value, counts, None)


def convert_linen_refs(ctx: ClassContext, node: cst.CSTNode, allowed: set[cst.CSTNode]) -> list[cst.CSTNode]:
  """Schedules `nn.relu` -> `nnx.relu` for Linen names NNX shares; returns the nodes converted."""
  converted = []
  for child in node.children:
    if child in allowed or queries.kept_linen(ctx, child):
      continue
    target = queries.nnx_name_for(ctx, child)
    if target is not None:
      ctx.plan.exprs[child] = target
      converted.append(child)
      continue
    converted += convert_linen_refs(ctx, child, allowed)
  return converted


