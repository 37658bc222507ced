"""Plans one Linen class's conversion: `plan_class` fills a fresh `ClassRewrite`, or raises `Unsupported`.

The planner reads the file's facts (`facts.FileFacts`) and the plans of the classes converted before
this one (`converted`); everything it decides goes into its own ClassRewrite, dropped whole when the
class stays Linen.
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.report import used_message
from codemods.rules.l2n002 import (
  call_fields,
  choices,
  children,
  constructions,
  decode_cache,
  derived_params,
  element_lists,
  factories,
  init_code,
  lifted,
  modes,
  queries,
  scope,
  sizes,
)
from codemods.rules.l2n002.call_values import drop_unread
from codemods.rules.l2n002.conditions import (
  Tests,
  arm_path,
  built_under,
  construction_conditions,
  exit_path,
  exits_early,
  may_meet,
  same_place,
  statement_conditions,
  test_key,
)
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.example_shapes import add_shape_formulas
from codemods.rules.l2n002.facts import FileFacts
from codemods.rules.l2n002.head import check_field, check_head
from codemods.rules.l2n002.loops import Loops
from codemods.rules.l2n002.nodes import (
  cache_read,
  DEFERRING,
  field_name,
  has_scope_call,
  if_arms,
  if_tests,
  is_plain_if,
  is_self_attr,
  is_straight_statement,
  scope_api,
  self_assignment,
  self_tuple_assignment,
  snake,
)
from codemods.rules.l2n002.plan import Child, ClassRewrite, Unsupported
from codemods.rules.l2n002.setup_code import (
  kept_class_of_another_file,
  none_placeholders,
  plain_attributes,
  plain_function,
  setup_code_blocker,
  value_placeholders,
)
from codemods.rules.l2n002.tied import tied_uses
from codemods.vocabulary import (
  COMPACT_NAMES,
  CONVERTED_APIS,
  MODE_PARAMS,
  MODULE_NAMES,
  SCOPE_APIS,
)
from nnx_bridge.layer_signatures import LINEN_CALL_PARAMS
from nnx_bridge.layer_table import WRAPPERS, find_layer, linen_fields

_DEFERRED = {**DEFERRING, cst.SetComp: 'a set comprehension', cst.FunctionDef: 'a function'}


def plan_class(facts: FileFacts, converted: tp.Mapping[str, ClassRewrite], node: cst.ClassDef,
               variable_classes: tp.Mapping[str, str]) -> ClassRewrite:
  """The plan of the class `node`; raises Unsupported (the class stays Linen) with the first thing that keeps it
  so. `converted`: the plans of the classes of the file converted before this one, by name."""
  ctx = ClassContext(facts, converted, ClassRewrite(node.name.value, variable_classes=dict(variable_classes)), Loops())
  return _run(ctx, node)


def _run(ctx: ClassContext, node: cst.ClassDef) -> ClassRewrite:
  """The class's plan; raises Unsupported (the class stays Linen) with the first thing that keeps it so."""
  ctx.plan.base_index = check_head(ctx.facts, node)
  base = ctx.facts.project_base(node)
  if base is not None and base not in ctx.facts.hierarchy.plain_bases:
    where = 'this file' if base.rpartition('.')[0] == ctx.facts.hierarchy.module else 'another file'
    raise Unsupported(node, f'it inherits fields or submodules from {base} ({where}), which is not converted with it')
  if not ctx.facts.nnx_is_free(node):
    raise Unsupported(node, 'the name nnx is bound to something else here')
  if f'{ctx.facts.hierarchy.module}.{node.name.value}' in ctx.facts.hierarchy.plain_bases:
    return _plain_base_plan(ctx, node)
  fields, methods = [], {}
  for statement in node.body.body:
    if field_name(statement) is not None:
      fields.append(statement)
    elif isinstance(statement, cst.FunctionDef):
      methods[statement.name.value] = statement
    # any other statement (a class attribute, a nested class, a docstring) is plain Python: the NNX class keeps it
  field_names = [field_name(f) for f in fields]
  for field, name in zip(fields, field_names):
    check_field(ctx.facts, field, name)
  mode_fields = {name: MODE_PARAMS[name] for field, name in zip(fields, field_names)
                 if name in MODE_PARAMS and field.body[0].value is None
                 and ctx.facts.code(field.body[0].annotation.annotation) == 'bool'}
  linen_field_names = field_names
  fields = [f for f, name in zip(fields, field_names) if name not in mode_fields]
  field_names = [name for name in field_names if name not in mode_fields]
  for sub in descendants(node):  # has_variable and `self.variables['cache'][...]`: decode caches (decode_cache.py)
    if isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value in SCOPE_APIS - CONVERTED_APIS - {'has_variable'} \
        and not _cache_read_base(ctx, sub):
      raise Unsupported(sub, f'self.{sub.attr.value} has no automatic NNX conversion')
  scope.check_mutable_collections(ctx, node)
  setup, call = methods.get('setup'), methods.get('__call__')
  compact = [m for m in methods.values() if any(ctx.facts.has_name(d.decorator, COMPACT_NAMES) for d in m.decorators)]
  if len(compact) > 1:
    raise Unsupported(compact[1], 'several @nn.compact methods')
  method = compact[0] if compact else None
  if call is None:
    raise Unsupported(node, 'no __call__ to convert')
  if setup is not None and (len(setup.params.params) != 1 or setup.decorators):
    raise Unsupported(setup, 'setup() with arguments or decorators')
  mode = _mode_params(ctx, call)
  if method is not None and method is not call and any(p.name.value in MODE_PARAMS for p in method.params.params):
    raise Unsupported(method, 'train/eval arguments of an @nn.compact method other than __call__')
  at_call = call_fields.call_fields(ctx, node, fields, field_names, call)  # `Decoder(init_state=<a call's output>)`
  fields = [f for f, name in zip(fields, field_names) if name not in at_call]
  field_names = [name for name in field_names if name not in at_call]
  params = [ctx.facts.code(f.body[0]).strip() for f in fields]
  call_params = [p.name.value for p in (*call.params.params[1:], *call.params.kwonly_params)]
  plan = ctx.plan
  plan.params, plan.field_names, plan.call_params, plan.compact = params, field_names, call_params, method is not None
  star = call.params.star_kwarg
  plan.call_kwargs = '' if star is None else 'read' if any(
      isinstance(n, cst.Name) and n.value == star.name.value for n in descendants(call.body)) else 'unread'
  plan.linen_fields, plan.mode_fields = linen_field_names, mode_fields
  if at_call:
    call_fields.plan_call_fields(ctx, node, plan, at_call, call)
  if base is not None:  # a subclass of a project base class keeps it (converted in its own file)
    plan.base = ctx.facts.code(ctx.facts.linen_base(node).value)
  ctx.plan.switches = {name: MODE_PARAMS[name] for name in mode.values()}
  ctx.plan.merged_switches = modes.merged_switches(ctx, call)
  ctx.plan.traced = ctx.facts.options.example_sizes.of_class(ctx.facts.filename, node.name.value)
  ctx.plan.traced_codes = set()
  ctx.plan.mode_uses = set()
  taken = set(field_names) | set(methods) | {'rngs'}
  _plan_members(ctx, node, methods, setup, method, call, taken)
  _finish(ctx, node, fields, method, call, mode)
  return plan


def _plan_members(ctx: ClassContext, node: cst.ClassDef, methods: dict[str, cst.FunctionDef], setup: cst.FunctionDef | None,
                  method: cst.FunctionDef | None, call: cst.FunctionDef, taken: set[str]) -> None:
  """The children, scope calls and submodule calls of the class, then its sizes and decode caches."""
  plan = ctx.plan
  counts: dict[str, int] = {}
  factories.prepare_factories(ctx, method)
  placeholders = none_placeholders(setup) if setup is not None else {}
  if setup is not None:
    _plan_setup(ctx, plan, setup, counts)
    _value_placeholders(ctx, plan, setup)
    built = {c.attr for c in plan.children}
    ctx.plan.exprs.update((none, 'nnx.data(None)') for none, attr in placeholders.items() if attr in built)
  inline = _plan_compact(ctx, plan, method, counts) if method is not None else {}
  taken |= ctx.plain_attributes
  _name_children(ctx, plan.children, taken, set(placeholders.values()))
  for child in plan.children:
    if child.condition is not None:
      named = not child.hoisted or child.api is not None \
          or any(a.keyword is not None and a.keyword.value == 'name' for a in child.ctor.args)  # a variable's name
      shift = '' if named else (f'; when it is not, the auto-named layers created after it shift down (the next '
                                f'of its class is then {child.linen_name}): name= fixes the names')
      ctx.plan.pending.append((child.ctor, f'self.{child.attr} is created only when {child.condition} (else None), '
                                        f'as Linen creates it only then{shift}'))
  plan.collections = [c.collection for c in plan.children if c.var_type == ctx.plan.variable_classes.get(c.collection)]
  scope.plan_scope_calls(ctx, node, plan, setup, taken | {c.attr for c in plan.children})
  calls = children.inline_calls(ctx, plan, inline)
  tied = tied_uses(ctx, plan, methods, setup)  # `.apply` with a shared kernel, `.variables[...]`
  element_lists.indexed_calls(ctx, plan, methods, calls)  # `self.layer[-1](...)` of a setup() list of layers
  children.setup_child_calls(ctx, plan, methods, setup, calls, tied)
  element_lists.check_calls(ctx, plan, calls)
  lifted.check_calls(ctx)
  if method is None:
    _plain_branches(ctx, plan, methods, setup)
  children.called_when(ctx, plan, calls)
  ctx.loops.after_calls(ctx, plan, calls)
  modes.check_calls(ctx, calls)
  marks = (len(plan.size_params), len(plan.size_arguments), len(ctx.plan.pending))
  scanned = plan.name in ctx.facts.scanned_cells  # first what the code says, then with the carry's size and traces
  traced, ctx.plan.traced = ctx.plan.traced, ({} if scanned else ctx.plan.traced)
  carry = sizes.derive(ctx, plan, methods, call, calls)
  ctx.plan.traced = traced
  if scanned and plan.size_params[marks[0]:]:  # a scanned cell: again, its carry's size known
    del plan.size_params[marks[0]:], plan.size_arguments[marks[1]:], ctx.plan.pending[marks[2]:]
    for child in plan.children:
      child.done, child.sizes, child.size_codes, child.ref_dims = False, {}, {}, {}
    sizes.derive(ctx, plan, methods, call, calls, carry)
  _check_alternatives(ctx, plan, calls)
  add_shape_formulas(ctx, plan, call, calls)
  decode_cache.plan_init_cache(ctx, node, plan, call, calls, taken)


def _check_alternatives(ctx: ClassContext, plan: ClassRewrite, calls: dict[cst.Call, Child]) -> None:
  """Children that several arms of a setup() `if` build into one attribute are called where the first is: each
  call must fit every arm it may run with (the same train/eval switches; `_fits_its_arms`); the size walk sizes each
  from the call. Layer lists (`if self.gradient_checkpointing:` a rematted one, else the plain one) build one
  class: the later ones take the first's sizes; the classes one construction in a loop may build (through a local
  naming one or another) are each sized by the loop (`loops.py`)."""
  for child in plan.children:
    if not child.alternative:
      continue
    first = next(c for c in plan.children if same_place(child, c) and not c.alternative)
    listed = first.ctor in ctx.loops.sites or child.ctor in ctx.loops.sites
    signature = lambda c: (c.sibling.call_params, [m[:2] for m in c.sibling.mode_params]) if c.sibling is not None \
        else _layer_signature(c) if c.spec is not None else c
    if child.bridged and first.bridged and not listed and not _kept_for(ctx, plan, (child, first)):
      continue  # Linen classes each arm wraps (jax-md's Edgewise act): one call passes through either
    if (child.bridged or first.bridged) and not listed and _one_arm_each(ctx, child, calls):
      continue  # dopamine's experts: `self.net(x, size)` under `if self.noisy:`, the wrapped noisy layer's arm
    if child.bridged or first.bridged or (child.sibling is None) != (first.sibling is None) \
        or signature(child) != signature(first) and not _fits_its_arms(ctx, plan, child, calls) \
        or listed and child.sibling is not first.sibling and child.ctor is not first.ctor:
      raise Unsupported(child.ctor, f'self.{child.attr} is built by two arms of an if, as modules that take other '
                                    'call arguments')
    if listed and child.ctor is not first.ctor:
      child.sizes, child.size_codes, child.done = dict(first.sizes), dict(first.size_codes), first.done


def _one_arm_each(ctx: ClassContext, child: Child, calls: dict[cst.Call, Child]) -> bool:
  """Whether every call of `child`'s attribute runs with one arm's module only (`conditions.may_meet`): each is
  called as its own code says, whatever the other arms build."""
  arms = [c for c in ctx.plan.children if same_place(child, c)]
  for call, called in calls.items():
    if same_place(child, called) and sum(may_meet(built_under(ctx, c), arm_path(ctx, call)) for c in arms) != 1:
      return False
  return True


def _kept_for(ctx: ClassContext, plan: ClassRewrite, arms: tp.Iterable[Child]) -> bool:
  """Whether one of the Linen classes `arms` build is kept Linen because `plan`'s class, left as Linen, uses it: it
  would convert with the class, and a class converted around it would leave that reason standing."""
  return any(used_message(plan.name, '') in c.bridged for c in arms)  # `bridged`: why the class stays Linen


def _fits_its_arms(ctx: ClassContext, plan: ClassRewrite, child: Child, calls: dict[cst.Call, Child]) -> bool:
  """Whether each call of `child`'s attribute fits every class the arms of setup()'s `if` build there that it may
  run with (`conditions.may_meet`: BigBird's `self.self`, full attention in one arm and block-sparse attention in
  the other, each called under the same test in `__call__` with its own arguments): its arguments bind to the
  class's call, and it drops the same train/eval switches whichever it runs."""
  arms = [c for c in plan.children if same_place(child, c)]
  if any(c.sibling is None for c in arms):
    return False
  for call, called in calls.items():
    if not same_place(child, called):
      continue
    path = arm_path(ctx, call)
    reached = [c for c in arms if may_meet(built_under(ctx, c), path)]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    positional = sum(1 for a in call.args if a.keyword is None)
    if any(a.star for a in call.args) or len(_dropped_switches(ctx, call, reached)) > 1 \
        or any(positional > len(c.sibling.call_params) or not c.sibling.call_kwargs and not keywords <= {
                   *c.sibling.call_params, *(m[1] for m in c.sibling.mode_params)} for c in reached):
      return False
  return True


def _dropped_switches(ctx: ClassContext, call: cst.Call, reached: list[Child]) -> set[frozenset[int]]:
  """The train/eval arguments `call` drops for each class it may run, by position; a class whose `__call__` takes
  them only into **kwargs it never reads (RegNet's `Identity()` beside a shortcut in batch-norm mode) fits any."""
  dropped = [(c, frozenset(modes.call_modes(ctx, call, c))) for c in reached]
  ignoring = lambda c, own: c.sibling.call_kwargs == 'unread' and not own and all(
      call.args[i].keyword is not None and call.args[i].keyword.value not in c.sibling.call_params
      for _, d in dropped for i in d)
  return {d for c, d in dropped if not ignoring(c, d)} or {d for _, d in dropped}


def _layer_signature(child: Child) -> tp.Any:
  """What a call of a table layer relies on: the Linen call's parameters and the train/eval fields it merges with
  them (the layer table's records). Layers alike in these fit the same calls (diffusers' `self.proj_in`, an
  `nn.Dense` or a 1x1 `nn.Conv` called on the hidden states; `nn.Dropout` at two rates); a wrapper or a cell fits
  only its own kind."""
  spec = child.spec
  if child.wrapper is not None or child.cell is not None:
    return spec
  return LINEN_CALL_PARAMS.get(spec.linen, spec.call_args), frozenset(linen_fields(spec.linen)) & MODE_PARAMS.keys()


def _detached_linen(ctx: ClassContext, node: cst.ClassDef) -> set[cst.CSTNode]:
  """flax.linen modules the class builds with `parent=None` outside its submodules (sst2's
  `nn.OptimizedLSTMCell(self.hidden_size, parent=None).initialize_carry(key, shape)`): objects of no module tree,
  whose methods run as plain Python in NNX code too, left as they are (flax.linen stays imported for them)."""
  built = {child.ctor for child in ctx.plan.children}
  detached = set()
  for sub in descendants(node):
    if isinstance(sub, cst.Call) and sub not in built and ctx.facts.is_linen_name(sub.func) and any(
        a.keyword is not None and a.keyword.value == 'parent' and isinstance(a.value, cst.Name)
        and a.value.value == 'None' for a in sub.args):
      top = sub  # with the methods read from it: `<module>.initialize_carry`
      while isinstance(parent := ctx.facts.parent(top), cst.Attribute) and parent.value is top:
        top = parent
      detached.add(top)
      ctx.plan.pending.append((sub, f'{ctx.facts.code(sub.func)}(..., parent=None) stays Linen: a module of no '
                                    'module tree, whose methods run as plain Python in NNX code'))
  return detached


def _finish(ctx: ClassContext, node: cst.ClassDef, fields: list[cst.SimpleStatementLine], method: cst.FunctionDef | None,
            call: cst.FunctionDef, mode: dict[int, str]) -> None:
  """Checks the train/eval switches' uses, schedules the Linen names' conversion, writes the children's code."""
  plan = ctx.plan
  modes.read_switches(ctx, call)
  for sub in descendants(node):
    if isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value in plan.mode_fields \
        and sub not in ctx.plan.mode_uses:
      raise Unsupported(sub, f'the train/eval field {sub.attr.value} is used other than to set train/eval arguments')
  allowed = {ctx.facts.linen_base(node).value} | lifted.plan_method_decorators(ctx, node, {call: set(mode.values())})
  allowed |= {child.ctor.func for child in plan.children if child.api is None and not child.bridged} | ctx.plan.lifted
  allowed |= {child.cell.ctor.func for child in plan.children if child.cell is not None}
  allowed |= lifted.plan_control_flow(ctx, node)
  allowed |= _detached_linen(ctx, node)
  allowed |= {statement.body[0].value.func for statement in plan.merged_switches.values()}  # the statements go
  for field in fields:  # `encoder: nn.Module`, `embed_tokens: nn.Embed` hold a submodule the caller builds: NNX now
    annotation = field.body[0].annotation.annotation
    layer = next((spec for q in ctx.facts.qualified_names(annotation)
                  if (spec := find_layer(q.name)) is not None and spec.nnx is not None), None)
    if ctx.facts.has_name(annotation, MODULE_NAMES) or layer is not None:
      ctx.plan.exprs[annotation] = f'nnx.{layer.nnx.rpartition(".")[2]}' if layer else 'nnx.Module'
      allowed.add(annotation)
  bridged = {child.ctor for child in plan.children if child.bridged}  # stays Linen code
  plan.linen_nodes = [*allowed, *children.convert_linen_refs(ctx, node, allowed | bridged)]
  plan.example_params = list(dict.fromkeys(f'{child.attr}_example_inputs' for child in plan.children if child.bridged))
  plan.example_params += [f'{child.attr}_{name}' for child in plan.children if child.sibling is not None
                          for name in child.sibling.example_params]  # a converted child's bridged children
  plan.params = [queries.code(ctx, f.body[0]).strip() for f in fields]
  chosen = choices.construction_texts(ctx, plan)  # `attention_layer(...)`: what all its classes take
  for child in plan.children:
    child.text = 'nnx.data(None)' if child.cache else init_code.variable_text(ctx, child) if child.api \
        else chosen.get(child.ctor) or init_code.ctor_text(ctx, child)
    if child.condition is not None and not _in_place_conditional(ctx, child.ctor):
      child.text = f'{child.text} if {child.condition} else None'
    first = next(c for c in plan.children if c.attr == child.attr) if child.hoisted and child.alternative else None
    if first is not None:  # another arm's layer of the same name: one attribute, the layer of the arm that holds
      first.text = f'{first.text.removesuffix(" else None")} else {child.text}'
    child.text = ctx.loops.wrap(ctx, child)  # built in a loop: nnx.List([<it> for <target> in <iterator>])
    if child.placeholder:
      child.text = f'nnx.data({child.text})'
    if not child.hoisted:
      ctx.plan.exprs[child.ctor] = child.text
  sized = {ref: text for child in plan.children for ref, text in child.size_codes.items()}
  plan.init_lines += [line for line in queries.function_lines(ctx, sized) if line not in plan.init_lines]
  drop_unread(plan, [*(c.text for c in plan.children), *plan.init_lines, *plan.cache_lines])
  plan.mode_params = [(i, name, MODE_PARAMS[name]) for i, name in mode.items()]
  if mode or method is call:
    ctx.plan.methods[call] = set(mode.values())
  if method is not None and method is not call:
    ctx.plan.methods[method] = set()


def _cache_read_base(ctx: ClassContext, attribute: cst.Attribute) -> bool:
  """Whether `attribute` is the `self.variables` of a `self.variables['cache']['<name>']`."""
  inner = ctx.facts.parent(attribute)
  outer = ctx.facts.parent(inner) if isinstance(inner, cst.Subscript) else None
  return isinstance(outer, cst.Subscript) and outer.value is inner and cache_read(outer) is not None


def _mode_params(ctx: ClassContext, call: cst.FunctionDef) -> dict[int, str]:
  """The train/eval switches among the call's parameters (positional, then keyword-only), by index."""
  params = call.params
  if isinstance(params.star_arg, cst.Param) or params.posonly_params:
    raise Unsupported(call, f'{call.name.value} takes *args or positional-only arguments')
  taken = [*params.params[1:], *params.kwonly_params]  # `**kwargs` stays as it is
  names = [p.name.value for p in taken]
  defaults = {p.name.value: p.default for p in taken if p.default is not None}
  ctx.plan.switch_defaults = {
      name: default.value == 'True' for name, default in defaults.items()
      if name in MODE_PARAMS and isinstance(default, cst.Name) and default.value in ('True', 'False')
  }
  return {i: name for i, name in enumerate(names) if name in MODE_PARAMS}


def _plan_setup(ctx: ClassContext, plan: ClassRewrite, setup: cst.FunctionDef, counts: dict[str, int]) -> None:
  """setup() statements: `self.<attr> = <table layer or same-file class>(...)`, self.param or self.variable, and
  plain code that stays as it is (`setup_code.py`); an attribute computed from a parameter becomes a property
  (`derived_params.py`)."""
  derived_statements: set[cst.BaseStatement] = set()
  for statement in setup.body.body:
    if statement in derived_statements:
      continue
    if (derived := derived_params.derived_param(ctx, setup, statement)) is not None:
      attr = derived_params.plan_derived(ctx, plan, derived)
      plan.children.append(scope.variable_child(ctx, derived.param, attr, hoisted=True))
      derived_statements.update(derived.statements)
    elif not ctx.loops.setup_append(ctx, statement, setup):  # `layers = []` + `for ...: layers.append(...)`: go
      _setup_statement(ctx, plan, statement, counts)
  element_lists.place(ctx, plan, setup)
  for value in plan.lists:
    elements = [c for c in plan.children if c.element is not None and c.ctor in descendants(value)]
    if elements:
      first, second = (elements[0].linen_name.replace('{i}', str(k)) for k in (0, 1))
      plan.pending.append((value, f'self.{elements[0].attr}: a {"tuple" if isinstance(value, cst.Tuple) else "list"} '
                                  f'of layers -> nnx.List (Linen names them {first}, {second}, ...)'))


def _value_placeholders(ctx: ClassContext, plan: ClassRewrite, setup: cst.FunctionDef) -> None:
  """Children of setup() whose attribute a plain statement before them set (`self.summary = identity`, then `if
  ...: self.summary = nn.Dense(...)`): NNX took that attribute for a static one, so the submodule is assigned as
  `nnx.data(...)`; the attribute is theirs, not plain code's."""
  body = list(setup.body.body)
  placeholders = value_placeholders(setup)
  for child in plan.children:
    statement = placeholders.get(child.attr)
    if child.hoisted or child.api is not None or child.element is not None or statement is None:
      continue  # (the head of a list of layers setup() extends is the list's own statement)
    top = next((s for s in body if s is child.ctor or any(n is child.ctor for n in descendants(s))), None)
    if top is None or body.index(top) <= body.index(statement) \
        or any(self_assignment(s) == child.attr for s in body[body.index(top) + 1:]):
      continue  # set after the submodule: not a placeholder
    child.placeholder = True
    ctx.plain_attributes.discard(child.attr)
    ctx.plan.pending.append((child.ctor, f'self.{child.attr}: first set to {ctx.facts.code(statement.body[0].value)}, '
                                         'a static attribute in NNX: the submodule replacing it is assigned as '
                                         'nnx.data(...)'))


def _build_child(ctx: ClassContext, ctor: cst.Call, counts: dict[str, int], attr: str | None,
                 built: tuple | None = None) -> Child:
  """The child `ctor` builds, its constructor's train/eval kwargs (and its cell's) dropped: NNX's train() / eval()
  set them (`modes.ctor_modes`)."""
  child = children.build_child(ctx, ctor, counts, attr, built)
  if child.cell is not None:
    modes.ctor_modes(ctx, child.cell)
  modes.ctor_modes(ctx, child)
  return child


def _setup_statement(ctx: ClassContext, plan: ClassRewrite, statement: cst.BaseStatement, counts: dict[str, int]) -> None:
  """One statement of setup(), or of an `if` block of it: a child, or plain code that stays as it is."""
  target = self_assignment(statement)
  value = statement.body[0].value if target is not None else None
  if isinstance(value, cst.Call) and scope_api(value) in ('param', 'variable'):
    child = scope.variable_child(ctx, value, target, hoisted=False)
  elif isinstance(value, cst.Call) and constructions.constructed(ctx, value) is not None:
    child = _build_child(ctx, value, counts, target)
  elif isinstance(value, cst.IfExp) and (arms := _constructions_in_arms(ctx, value)) is not None:
    if target in {c.attr for c in plan.children}:
      raise Unsupported(statement, f'self.{target} assigned twice')
    for ctor, holds in zip(arms, (True, False)):  # `ShortCut(...) if apply else Identity()`: each arm's, in place
      child = _build_child(ctx, ctor, counts, target)
      child.alternative, child.chosen = not holds, frozenset({(test_key(ctx, value.test), holds)})
      plan.children.append(child)
    ctx.plan.pending.append((value, f'self.{target}: one of two submodules by {ctx.facts.code(value.test)}, each '
                                    'converted in place (the arm whose test holds is built)'))
    return
  elif isinstance(value, cst.IfExp) and (built := _conditional_construction(ctx, value)) is not None:
    child = _build_child(ctx, built[0], counts, target)  # `self.shortcut = ShortCut(...) if apply else None`
    child.condition = built[1]  # the conditional stays, around the converted construction
  elif isinstance(value, (cst.List, cst.Tuple)) \
      and (ctors := element_lists.element_constructions(ctx, value, target)) is not None:
    _element_list(ctx, plan, value, target, ctors, counts)  # `self.layer = [A(...), A(...)]`: an nnx.List
    return
  elif (extended := element_lists.extension(ctx, statement, plan)) is not None:
    _element_list(ctx, plan, extended[1], extended[0], extended[2], counts)  # `self.layer += (B(...),)`
    return
  elif isinstance(value, cst.ListComp):  # `self.layers = [nn.Dense(f) for f in ...]`: an nnx.List (loops.py)
    child = _build_child(ctx, ctx.loops.setup_list(ctx, value, target), counts, target)
  elif (appended := ctx.loops.appended(ctx, value, target)) is not None:  # `self.layers = layers` (appended)
    if target in {c.attr for c in plan.children}:
      raise Unsupported(statement, f'self.{target} assigned twice')
    for head in ctx.loops.list_heads(value):
      plan.children.append(written := _build_child(ctx, head, counts, target))  # `layers = [Layer(...)]` first
      written.head = True
      plan.children += choices.alternatives(ctx, written, lambda built, head=head: _build_child(ctx, head, counts,
                                                                                                target, built))
    child = _build_child(ctx, appended, counts, target)
  elif (pairs := self_tuple_assignment(statement)) is not None \
      and any(isinstance(v, cst.Call) and constructions.constructed(ctx, v) is not None for _, v in pairs):
    for attr, value in pairs:  # `self.q_proj, self.k_proj = dense(), dense()`: each converted in place
      if not (isinstance(value, cst.Call) and constructions.constructed(ctx, value) is not None):
        raise Unsupported(value, f'self.{attr} is assigned beside submodules in one statement')
      if attr in {c.attr for c in plan.children}:
        raise Unsupported(statement, f'self.{attr} assigned twice')
      plan.children.append(_build_child(ctx, value, counts, attr))
    return
  elif isinstance(statement, cst.If) and all(isinstance(arm, (cst.IndentedBlock, type(None))) for arm in if_arms(statement)):
    for test in if_tests(statement):  # `if self.config.add_pooling_layer: self.pooler = ...`: the same `if` in __init__
      _plain_setup_code(ctx, plan, test)
    before, built = plan.children, []
    for arm in if_arms(statement):  # one arm or the other runs: each may build the same attributes
      plan.children = list(before)
      for inner in (arm.body if arm is not None else ()):
        _setup_statement(ctx, plan, inner, counts)
      for child in plan.children[len(before):]:
        child.alternative = child.attr is not None and child.attr in {c.attr for c in built}
        built.append(child)
    plan.children = [*before, *built]
    return
  elif constructions.wrapped_binding(ctx, statement):  # `CheckpointLayer = remat(Layer, ...)`: the NNX class, bound
    return                                              # where Linen bound it
  elif constructions.choice_binding(ctx, statement):  # `attention_layer = A` in an arm: naming the NNX class
    return
  else:  # plain code (`head_dim = ...`, `if ...: raise`): it stays, in its place in __init__
    _plain_setup_code(ctx, plan, statement)
    return
  if target in {c.attr for c in plan.children if c.ctor not in ctx.loops.list_heads(value)}:
    raise Unsupported(statement, f'self.{target} assigned twice')
  plan.children.append(child)
  plan.children += choices.alternatives(ctx, child, lambda built: _build_child(ctx, child.ctor, counts, target, built))


def _element_list(ctx: ClassContext, plan: ClassRewrite, value: cst.List, attr: str, ctors: list[cst.Call],
                  counts: dict[str, int]) -> None:
  """`self.<attr> = [A(...), A(...)]` in setup(): a child per element, each converted in place, in an nnx.List
  (`element_lists.py`)."""
  extended = any(c.attr == attr and c.element is not None for c in plan.children)  # `self.layer += (B(...),)`
  if attr in {c.attr for c in plan.children} and not extended:
    raise Unsupported(value, f'self.{attr} assigned twice')
  for ctor in ctors:
    child = _build_child(ctx, ctor, counts, attr)
    if child.bridged or child.sibling is not None and child.sibling.example_params:
      raise Unsupported(ctor, f'self.{attr}: a list of layers wrapped with nnx_bridge.from_linen, or holding such '
                              'layers: each would need its own example inputs')
    child.element = len({c.ctor for c in plan.children if c.attr == attr})  # its place: element_lists.place
    plan.children.append(child)
    plan.children += choices.alternatives(ctx, child,
                                          lambda built, ctor=ctor: _build_child(ctx, ctor, counts, attr, built))
  if not extended:
    plan.lists.add(value)


def _constructions_in_arms(ctx: ClassContext, value: cst.IfExp) -> tuple[cst.Call, cst.Call] | None:
  """`A(...) if <test> else B(...)` in setup(), both converted classes of the file (RegNet's `FlaxRegNetShortCut(...)
  if should_apply_shortcut else Identity()`): the two constructions, each an arm's class of the attribute (as the
  arms of a setup() `if` are); None for other conditionals."""
  arms = (value.body, value.orelse)
  if has_scope_call(value.test) or not all(isinstance(arm, cst.Call) and (built := constructions.constructed(ctx, arm))
                                           and built[2] is not None for arm in arms):
    return None
  _plain_setup_code(ctx, ctx.plan, value.test)
  return arms


def _conditional_construction(ctx: ClassContext, value: cst.IfExp) -> tuple[cst.Call, str | None] | None:
  """`X(...) if <test> else <other>` (either way round) in setup(), `<other>` plain code (`None`, `ACT2FN[name]`):
  the construction, and when `<other>` is None the condition it is built under, as code for __init__. The
  conditional stays in __init__ as setup()'s plain code does, its construction converted. None for other
  conditionals, and for a class of the file that stays Linen."""
  arms = [(value.body, value.orelse, False), (value.orelse, value.body, True)]
  found = [(ctor, other, negated, constructions.constructed(ctx, ctor)) for ctor, other, negated in arms
           if isinstance(ctor, cst.Call)]
  found = [arm for arm in found if arm[3] is not None]
  if len(found) != 1 or has_scope_call(value.test):
    return None
  ctor, other, negated, (linen, _, sibling) = found[0]
  if sibling is None and (linen in ctx.facts.linen_classes or linen == constructions.TO_LINEN):
    return None  # a class that stays Linen: a bridged child needs example inputs whether it is created or not
  for plain in (value.test, other):
    _plain_setup_code(ctx, ctx.plan, plain)
  if not (isinstance(other, cst.Name) and other.value == 'None'):
    return ctor, None
  return ctor, queries.negated_code(ctx, value.test) if negated else queries.code(ctx, value.test)


def _in_place_conditional(ctx: ClassContext, ctor: cst.Call) -> bool:
  """Whether `ctor` is the construction of a setup() `X(...) if <test> else None` (either way round), which stays
  in __init__ around the converted construction (`_conditional_construction`)."""
  parent = ctx.facts.parent(ctor)
  return isinstance(parent, cst.IfExp) and any(isinstance(arm, cst.Name) and arm.value == 'None'
                                               for arm in (parent.body, parent.orelse))


def _plain_setup_code(ctx: ClassContext, plan: ClassRewrite, node: cst.CSTNode) -> None:
  """Plain setup() code that stays as it is in __init__; raises Unsupported if it may build a module."""
  blocker = setup_code_blocker(ctx.facts, ctx.facts.class_defs[plan.name], node)
  if blocker is not None:
    raise Unsupported(*blocker)
  built = next((c for c in (node, *descendants(node)) if isinstance(c, cst.Call) and constructions.constructed(ctx, c)),
               None)
  if built is not None:  # `layers = {'q': dense()}`: a submodule only `self.<attr> = <construction>` converts
    raise Unsupported(built, f'{ctx.facts.code(built)} builds a submodule in setup() code other than '
                             '`self.<attr> = <construction>`')
  ctx.plain_attributes |= plain_attributes(node)


def _plan_compact(ctx: ClassContext, plan: ClassRewrite, method: cst.FunctionDef, counts: dict[str, int]) -> dict[cst.Call, cst.Call]:
  """Layers and variables built inline in the @nn.compact method; returns each layer's call."""
  ctors = [c for c in descendants(method) if isinstance(c, cst.Call) and constructions.constructed(ctx, c) is not None]
  cells = {constructions.cell_arg(ctx, c) for c in ctors}  # built in a wrapper's constructor call: part of that child
  ctors = [c for c in ctors if c not in cells]
  for call in descendants(method.body):
    if not isinstance(call, cst.Call) or call in ctors or call in cells:
      continue
    inner = call.func if isinstance(call.func, cst.Call) and call.func not in ctors else None
    kept = kept_class_of_another_file(ctx.facts, inner or call)  # no record: another file keeps it Linen
    if kept is not None:  # (jax-md's `act = GateActivation(...)`)
      raise Unsupported(call, kept)
    if inner is not None and not plain_function(ctx.facts, inner.func):  # `self.conv(...)(x)`: a ModuleDef's
      raise Unsupported(call, _unknown_builder(ctx, inner.func))
  variables = [c for c in descendants(method.body) if isinstance(c, cst.Call) and scope_api(c) in ('param', 'variable')]
  caches = decode_cache.decode_caches(ctx, plan, method)
  _straight_line(ctx, method.body, {*ctors, *variables} - caches)
  outer = {}
  for sub in descendants(method):
    if isinstance(sub, tuple(_DEFERRED)):
      created = next((c for c in descendants(sub) if c in ctors or c in variables), None)
      if created is not None:
        where = f'the nested function {sub.name.value}' if isinstance(sub, cst.FunctionDef) else _DEFERRED[type(sub)]
        raise Unsupported(created, f'{ctx.facts.code(created)} is created inside {where}, which NNX cannot build '
                                   'in __init__')
    if isinstance(sub, cst.Call) and sub.func in ctors:
      outer[sub.func] = sub
  scan_names: dict[cst.Call, list[cst.Name]] = {}
  for ctor in ctors:  # `rnn = nn.scan(Cell, ...)(...)`, then `rnn(carry, x)` once and `rnn.<method>(...)`
    if (ctor in ctx.plan.scans or ctor in ctx.plan.remats or ctor in ctx.plan.stacks) and ctor not in outer:
      outer[ctor], scan_names[ctor] = lifted.scan_local(ctx, method, ctor)
    elif ctor not in outer and queries.bound_local(ctx, method, ctor) is not None \
        and not any(constructions.constructed(ctx, ctor)[0] in w.cells for w in WRAPPERS):  # `embed = nn.Embed(...)`, shared
      calls, scan_names[ctor] = queries.shared_local(ctx, method, ctor)
      local = ctx.plan.arm_bound.get(ctor)
      if local is not None and any(value not in ctors for value in queries.arm_values(ctx, method, ctor)):
        ctx.plan.open_locals.add(local)  # `input_embed = self.shared_embedding`: what it returns is not said
      outer[ctor] = calls[0]
      ctx.plan.extra_calls.update((call, ctor) for call in calls[1:])
  holders = set()  # locals bound to a self.variable(...), whose `.value` becomes `[...]`
  for node in descendants(method.body):
    if node in variables:
      child = scope.variable_child(ctx, node, None, hoisted=True, cache=node in caches)
      child.condition = None if child.cache else ctx.plan.conditions.get(node)  # GPT-2's `if self.use_bias:` bias
      ctx.plan.exprs[node] = f'self.{child.attr}[...]' if child.api == 'param' else f'self.{child.attr}'
      plan.children.append(child)
      assign = ctx.facts.parent(node)
      if child.api == 'variable' and isinstance(assign, cst.Assign) and len(assign.targets) == 1 \
          and isinstance(assign.targets[0].target, cst.Name) and node not in plan.lazy_caches.values():
        holders.add(assign.targets[0].target.value)
    elif node in ctors:
      if node not in outer:
        wrappers = [w.linen.rpartition('.')[2] for w in WRAPPERS if constructions.constructed(ctx, node)[0] in w.cells]
        hint = f' (a cell: build it in the {wrappers[0]}(...) call to convert both)' if wrappers else ''
        raise Unsupported(node, f'a submodule that is not called where it is constructed{hint}')
      child = _build_child(ctx, node, counts, None)
      child.hoisted = True
      child.condition = ctx.plan.conditions.get(node)
      local = ctx.plan.arm_bound.get(node)  # each arm of an if binds the local to a layer of one name= (jax-md's
      child.alternative = local is not None and child.attr != '' and any(  # `atomwise = ...(name='atom_wise')`)
          c.attr == child.attr and ctx.plan.arm_bound.get(c.ctor) == local for c in plan.children)
      plan.children.append(child)
      if local is None:  # a local the arms bind stays: each arm binds it to its attribute (or its module)
        ctx.plan.scan_names.update((name, child) for name in scan_names.get(node, ()))
  for sub in descendants(method.body):
    if isinstance(sub, cst.Attribute) and isinstance(sub.value, cst.Name) and sub.value.value in holders \
        and sub.attr.value == 'value':
      ctx.plan.exprs[sub] = f'{sub.value.value}[...]'
  for partial in dict.fromkeys(ctx.plan.partials[c] for c in ctors if c in ctx.plan.partials):
    ctx.plan.pending.append((partial, f'{ctx.facts.code(partial)}: each call of it becomes a construction '
                                   'in __init__ with its arguments (the statement goes)'))
  return {c.ctor: outer[c.ctor] for c in plan.children if c.hoisted and c.api is None}


def _plain_branches(ctx: ClassContext, plan: ClassRewrite, methods: dict[str, cst.FunctionDef], setup: cst.FunctionDef | None
                    ) -> None:
  """The conditionals of plain code at the top of a setup() class's methods (`if output_hidden_states:
  all_hidden_states += (hidden_states,)`, as in transformers): walked arm by arm for sizes, as in @nn.compact
  bodies; a conditional holding another block, or testing a scope API, is not."""
  for method in methods.values():
    if method is setup:
      continue
    for statement in method.body.body:
      if isinstance(statement, cst.If) and is_plain_if(statement):
        plan.branches.update([statement, *(s for s in descendants(statement) if isinstance(s, cst.If))])


def _straight_line(ctx: ClassContext, body: cst.BaseSuite, built: set[cst.Call]) -> None:
  """Simple statements, and conditionals of plain code: no loops, and a construction (`built`) only in an
  `if <test>: ... else: ...` of simple statements whose test __init__ can evaluate (see _conditions)."""
  exits: Tests = ()  # after `if <test>: return ...`, what follows runs where the test fails (conditions.exit_path)
  for i, statement in enumerate(body.body):
    plain_if = isinstance(statement, cst.If) and is_plain_if(statement)  # walked arm by arm, building or not
    if is_straight_statement(statement) or not plain_if and _plain_block(ctx, statement, built):
      if exits:
        ctx.plan.conditions.update(statement_conditions(ctx, [statement], built, exits))
      continue
    if isinstance(statement, cst.For):  # layers built in a loop: nnx.List attributes (loops.py)
      if exits and any(s in built for s in descendants(statement)):
        raise Unsupported(statement, 'a loop building submodules after a return under a condition on fields: '
                                     'put the rest of the method in an else')
      ctx.loops.plan(ctx, statement, built)
      continue
    branches = [statement, *(s for s in descendants(statement) if isinstance(s, cst.If))]
    if not plain_if:
      raise Unsupported(statement, 'the @nn.compact body has loops, conditionals or nested blocks')
    if any(s in built for s in descendants(statement)):
      ctx.plan.conditions.update(construction_conditions(ctx, statement, built, exits))
    ctx.plan.branches.update(branches)
    if exits_early(statement):
      exits = exit_path(ctx, statement, body.body[i + 1:], built, exits)


def _plain_block(ctx: ClassContext, statement: cst.BaseStatement, built: set[cst.Call]) -> bool:
  """A block of plain Python (a loop, `with`, `try`, nested conditionals) that builds nothing, reaches no scope
  API and calls no method of the class (which may build layers): it stays in the body as it is, and the size walk
  forgets what it assigns."""
  methods = {s.name.value for s in ctx.facts.class_defs[ctx.plan.name].body.body if isinstance(s, cst.FunctionDef)}
  for sub in descendants(statement):
    if sub in built or (isinstance(sub, cst.Call) and scope_api(sub)):
      return False
    if isinstance(sub, cst.Call) and isinstance(sub.func, cst.Attribute) and is_self_attr(sub.func) \
        and sub.func.attr.value in methods:
      return False
  return True


def _name_children(ctx: ClassContext, planned: list[Child], taken: set[str], placeholders: set[str]) -> None:
  """Gives auto-named children a readable, deterministic, collision-free attribute name, none of the `taken` ones
  nor an attribute setup() sets to None (`placeholders`), which only a child of that name may replace."""
  explicit = [c.attr for c in planned if c.attr and not c.repeated]
  if len(set(explicit)) != len(explicit) or set(explicit) & taken:
    raise Unsupported(planned[0].ctor, 'duplicate names, or names shadowing a field or method')
  taken = taken | set(explicit) | placeholders
  auto = [c for c in planned if not c.attr]
  bases = ['cell' if c.scan else snake(c.linen_name.rpartition('_')[0]) if c.bridged
           else f'{snake(c.sibling.name)}s' if c.stacked
           else snake((c.spec or c.wrapper).nnx.rpartition('.')[2]) if c.spec or c.wrapper
           else snake(c.sibling.name) for c in auto]
  bases = [ctx.loops.plural(c, base) for c, base in zip(auto, bases)]  # a loop's nnx.List: `linears`
  for i, (child, base) in enumerate(zip(auto, bases)):
    attr = f'{base}{bases[:i].count(base) + 1}' if bases.count(base) > 1 else base
    while attr in taken:
      attr += '_'
    child.attr = attr
    taken.add(attr)

# --- sizes and train/eval switches -----------------------------------------------------------


def _unknown_builder(ctx: ClassContext, func: cst.BaseExpression) -> str:
  """Why `func(...)(...)` cannot be built in __init__: what `func` is."""
  if isinstance(func, cst.Call):  # `nn.scan(...)(3)(x)` with options no NNX counterpart takes
    name, what = ctx.facts.code(func), 'a lifted transform or factory call whose result L2N002 cannot build'
  elif isinstance(func, cst.Attribute) and is_self_attr(func):
    name, what = ctx.facts.code(func), f'the field {func.attr.value}, a ModuleDef or factory that is not converted'
  elif ctx.facts.is_linen_name(func):
    name = ctx.facts.code(func)
    what = f'{name}, a Linen layer the layer table has no NNX counterpart of'
  else:
    name = ctx.facts.code(func)
    what = f'{name}, which is neither a table layer nor a Linen class of this file'
  return f'{name}(...)(...) builds a submodule from {what}'


def _plain_base_plan(ctx: ClassContext, node: cst.ClassDef) -> ClassRewrite:
  """A base class of the run that only holds helpers (`LinenHierarchy.plain_bases`): an nnx.Module with its
  Linen names converted; its subclasses, converted in their own files, build the layers and variables."""
  for sub in descendants(node):
    if isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value in SCOPE_APIS:
      raise Unsupported(sub, f'self.{sub.attr.value} in a helper of a base class')
  plan = ctx.plan
  plan.helpers_only = True
  base = ctx.facts.linen_base(node).value
  plan.linen_nodes = [base, *children.convert_linen_refs(ctx, node, {base})]
  return plan
