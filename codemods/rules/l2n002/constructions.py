"""What a construction call builds, for every planning pass: a table layer or wrapper, a class of the file
(called, through a `partial` local, through a ModuleDef field or factory, or lifted by nn.scan / nn.vmap /
nn.remat), an NNX class built with to_linen, or a class kept as Linen. `constructed` answers with the Linen name
and the layer row or converted plan; on the way it records in the plan what the construction holds (the partial
statement that goes, the scan axes, the stacked or remat options), so the passes read them there.

Plain functions over a `context.ClassContext`; this module imports no pass.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst

from codemods.rules.l2n002 import queries
from codemods.rules.l2n002.conditions import ArmPath, arm_path, test_key
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.factory_fields import Factory
from codemods.rules.l2n002.nodes import (
  assigned_name,
  broadcast_scan_axes,
  int_tuple,
  is_self_attr,
  literal_dict,
  literal_ints,
  renumbered,
)
from codemods.rules.l2n002.plan import ClassRewrite, Stacked, Unsupported
from codemods.vocabulary import (
  BROADCAST_NAMES,
  PARTIAL_NAMES,
  SCAN_NAMES,
  STACK_OPTIONS,
  TO_LINEN_NAMES,
  VMAP_NAMES,
  WRAPPING,
)
from nnx_bridge.layer_table import LayerSpec, find_layer, find_wrapper, linen_fields

TO_LINEN = 'nnx_bridge.to_linen'  # what constructed() names a to_linen construction: a Linen module
SCAN_PATTERN = ("nn.scan(<a cell class of this file>, variable_broadcast='params', split_rngs={'params': False}, "
                'in_axes=<int>, out_axes=<int>)')


def constructed(ctx: ClassContext, call: cst.Call) -> tuple[str, LayerSpec | None, ClassRewrite | None] | None:
  """(Linen name, layer row, converted plan) of what `call` builds: a row for a table layer, a plan for a class
  of the file converted before, neither for a wrapper, a class kept Linen or a to_linen class (`TO_LINEN`); None
  when `call` builds no module. Raises Unsupported for a lifted class that was not converted."""
  factory = factory_construction(ctx, call)  # `self.conv(...)` of a ModuleDef field, `conv(...)` of a factory
  if factory is not None:
    return factory
  partial = _partial_of(ctx, call.func) if isinstance(call.func, cst.Name) else None
  if partial is not None:  # `conv = partial(nn.Conv, use_bias=False)`, then `conv(features, ...)(x)`
    ctx.plan.partials[call] = partial
  func = partial.args[0].value if partial is not None else call.func
  transform = lifted_alias(ctx, call.func) if isinstance(call.func, cst.Name) else call.func
  scanned = scanned_class(ctx, transform, call) if isinstance(transform, cst.Call) else None
  if scanned is not None:
    sibling = ctx.converted.get(scanned)
    if sibling is None:
      raise Unsupported(call, f'{scanned} is a Linen module that was not converted')
    return scanned, None, sibling
  rematted = rematted_class(ctx, call.func) if isinstance(call.func, cst.Call) else \
      wrapped_local(ctx, call.func) if isinstance(call.func, cst.Name) else None
  if rematted is not None and isinstance(call.func, cst.Name):
    ctx.plan.factory_callee[call] = call.func.value  # the local, now the NNX class
  if rematted is not None:
    sibling = ctx.converted.get(rematted)
    if sibling is None:
      raise Unsupported(call, f'{rematted} is a Linen module that was not converted')
    return rematted, None, sibling
  if isinstance(func, cst.Name) and func.value in ctx.facts.linen_classes:
    return func.value, None, ctx.converted.get(func.value)  # no plan: a Linen class, bridged
  choices = chosen_classes(ctx, func) if isinstance(func, cst.Name) else None
  kept = next((c.linen for c in choices or () if c.linen not in ctx.converted), None)
  if kept is not None:  # a Linen construction (a child of it is refused: `kept_choice`)
    return kept, None, None
  if choices is not None:  # `attention_layer(...)`, the local naming one class or another: each an alternative
    ctx.plan.choices[call] = choices
    ctx.plan.factory_callee[call] = func.value
    return choices[0].linen, None, ctx.converted[choices[0].linen]
  if isinstance(func, (cst.Name, cst.Attribute)) and ctx.facts.has_name(func, TO_LINEN_NAMES):
    return TO_LINEN, None, None  # an NNX class an earlier run's Linen parent built: a Linen module
  kept = queries.kept_target(ctx, func)
  if kept is not None:
    return kept, None, None
  if not isinstance(func, (cst.Name, cst.Attribute)):
    return None
  imported = ctx.facts.imported_class(func)
  if imported is not None:  # a class another file of the run converted: built as it is named here
    ctx.plan.factory_callee[call] = ctx.facts.code(func)
    return ctx.facts.imported[imported].name, None, ctx.facts.imported[imported]
  settled = ctx.facts.settled_class(func)
  if settled is not None:  # a class another file of the run keeps Linen: bridged, as a Linen class of this file
    return settled.rpartition('.')[2], None, None
  for qualified in ctx.facts.qualified_names(func):
    spec = find_layer(qualified.name)
    if spec is not None and spec.nnx is not None:
      return spec.linen, spec, None
    wrapper = find_wrapper(qualified.name)
    if wrapper is not None:
      return wrapper.linen, None, None
  return None


def _partial_of(ctx: ClassContext, name: cst.Name) -> cst.Call | None:
  """The `functools.partial(<layer or class>, ...)` bound to `name` by the one statement `name = partial(...)`
  of the method, every use of `name` a call: the statement goes, each call is a construction with the partial's
  arguments first. None for other names."""
  bound = ctx.facts.local_call(name, PARTIAL_NAMES)
  if bound is None:
    return None
  line, assignment, value = bound
  if not value.args or value.args[0].keyword is not None or any(a.star for a in value.args):
    return None
  for reference in assignment.references:
    use = reference.node
    if not (isinstance(ctx.facts.parent(use), cst.Call) and ctx.facts.parent(use).func is use):
      raise Unsupported(use, f'the partial {name.value} used other than by calling it')
  ctx.plan.removed.add(line)
  ctx.plan.lifted.update((value.func, value.args[0].value))  # its arguments are converted with each construction
  return value


def cell_arg(ctx: ClassContext, ctor: cst.Call) -> cst.BaseExpression | None:
  """The cell argument of a wrapper's constructor call (`nn.RNN(<cell>)`), if `ctor` builds a wrapper."""
  built = constructed(ctx, ctor)
  wrapper = find_wrapper(built[0]) if built is not None else None
  if wrapper is None:
    return None
  position = linen_fields(wrapper.linen).index(wrapper.cell_kwarg)
  positional = [a.value for a in ctor.args if a.keyword is None]
  if position < len(positional):
    return positional[position]
  return next((a.value for a in ctor.args if a.keyword is not None and a.keyword.value == wrapper.cell_kwarg), None)


def factory_construction(ctx: ClassContext, call: cst.Call) -> tuple[str, LayerSpec | None, ClassRewrite | None] | None:
  """(Linen name, layer spec, sibling plan) for a construction through a factory: `self.conv(...)` of a factory
  field, `conv(...)` of a factory local; None for other calls. Refuses a factory whose kind is unknown."""
  func, fields = call.func, ctx.facts.factories
  current = ctx.plan.name
  if isinstance(func, cst.Attribute) and is_self_attr(func):
    factory = fields.fields.get((current, func.attr.value))
    if factory is None:
      return None
    if isinstance(factory, str):
      raise Unsupported(call, f'self.{func.attr.value}(...)(...) builds a submodule from a ModuleDef or factory '
                                    f'field: {factory}')
    ctx.plan.factory_callee[call] = f'self.{func.attr.value}'
    if func.attr.value not in ctx.plan.reported_factories:
      ctx.plan.reported_factories.add(func.attr.value)
      supplier = ', '.join(sorted(o or 'module-level code' for o in fields.suppliers.get(current, {None})))
      made = f'an NNX {find_layer(factory.target).nnx.rpartition(".")[2]}' if factory.kind == 'layer' \
          else f'the converted class {factory.target}'
      where = f' (what {supplier} passes)' if factory.kind == 'layer' else ''
      ctx.plan.pending.append((call, f'self.{func.attr.value}(...): the field {func.attr.value} makes {made}'
                                  f'{where}; it is called in __init__ with the input size and rngs'))
    return _kind(ctx, call, factory)
  if isinstance(func, cst.Name):
    line = next((line for line, uses in ctx.plan.factory_locals.items() if func in uses), None)
    if line is None:
      return None
    ctx.plan.factory_callee[call] = func.value
    return _kind(ctx, call, Factory('layer', find_layer(_factory_of(ctx, line)).linen))
  return None


def _factory_of(ctx: ClassContext, line: cst.SimpleStatementLine) -> str:
  value = next(v for vs in ctx.facts.factories.values.values() for v in vs
               if v.local is not None and v.local[0] is line)
  return value.factory.target


def _kind(ctx: ClassContext, call: cst.Call, factory: Factory) -> tuple[str, LayerSpec | None, ClassRewrite | None]:
  if factory.kind == 'class':
    plan = ctx.converted.get(factory.target) or ctx.facts.imported.get(factory.target)
    if plan is None:
      raise Unsupported(call, f'{factory.target}, built through {ctx.facts.code(call.func)}, was '
                                    'not converted')
    return plan.name, None, plan
  spec = find_layer(factory.target)
  return spec.linen, spec, None


def _lifted_class(ctx: ClassContext, call: cst.Call, names: tp.Collection[str]) -> list[cst.BaseExpression] | None:
  """The positional arguments of `nn.scan(Cell, ...)` / `nn.remat(Block, ...)` (one of `names`) when they are
  exactly one Linen class of this file; None for any other call."""
  if not ctx.facts.has_name(call.func, names):
    return None
  positional = [a.value for a in call.args if a.keyword is None and not a.star]
  if len(positional) != 1 or not isinstance(positional[0], cst.Name) \
      or positional[0].value not in ctx.facts.linen_classes:
    return None
  return positional


def lifted_alias(ctx: ClassContext, name: cst.Name) -> cst.Call | None:
  """The `nn.scan(...)` call bound to `name` by the one statement `ScanBlock = nn.scan(...)` of the method, which
  goes (its construction holds the conversion); None for other names."""
  bound = ctx.facts.local_call(name, SCAN_NAMES | VMAP_NAMES) if name.value not in ctx.facts.linen_classes else None
  if bound is None:
    return None
  line, assignment, value = bound
  if [r.node for r in assignment.references] != [name]:
    raise Unsupported(value, f'{name.value} = nn.scan(...) used other than to build one submodule')
  ctx.plan.removed.add(line)
  ctx.plan.lifted.add(value)
  return value


def scanned_class(ctx: ClassContext, scan: cst.Call, ctor: cst.Call) -> str | None:
  """`Cell` for `nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False}, in_axes=1, out_axes=1)`
  over a Linen class of this file, recording its axes; `Block` for a scan over layers (`variable_axes`) or an
  nn.vmap ensemble (see _stacked_class); None for any other call. Other options over such a class: a TODO."""
  kwargs = {a.keyword.value: a.value for a in scan.args if a.keyword is not None}
  if 'variable_axes' in kwargs and ctx.facts.has_name(scan.func, SCAN_NAMES):
    return _stacked_class(ctx, scan, ctor, kwargs, 'scan')
  if ctx.facts.has_name(scan.func, VMAP_NAMES) and isinstance(scan.func, (cst.Name, cst.Attribute)):
    return _stacked_class(ctx, scan, ctor, kwargs, 'vmap')
  positional = _lifted_class(ctx, scan, SCAN_NAMES)
  if positional is None:
    return None
  axes = broadcast_scan_axes(kwargs)
  if any(a.star for a in scan.args) or axes is None:
    given = ', '.join(f'{k}={ctx.facts.code(v)}' for k, v in kwargs.items())
    raise Unsupported(scan, f'nn.scan({positional[0].value}, {given}) is converted only as {SCAN_PATTERN} '
                             '(parameters shared by every step: nnx.scan over the cell), or over layers')
  ctx.plan.scans[ctor] = axes
  return positional[0].value


def _stacked_class(ctx: ClassContext, lifted: cst.Call, ctor: cst.Call, kwargs: dict[str, cst.BaseExpression],
                   transform: str) -> str:
  """`Block` for `nn.scan(Block or nn.remat(Block, ...), variable_axes={'params': 0, ...}, split_rngs={'params':
  True, ...}, length=n, in_axes=..., out_axes=..., metadata_params=...)` (scan over layers) or the same nn.vmap
  with axis_size=n (an ensemble): copies created by nnx.vmap over split rngs in __init__ (the same stacked
  layout), run by nnx.scan / nnx.vmap; records the options."""
  given = ', '.join(f'{k}={ctx.facts.code(v)}' for k, v in kwargs.items())
  positional = [a.value for a in lifted.args if a.keyword is None]
  target = ctx.facts.unremat(positional[0]) if len(positional) == 1 else None
  if not (isinstance(target, cst.Name) and target.value in ctx.facts.linen_classes):
    raise Unsupported(lifted, f'nn.{transform} of something other than a Linen class of this file (or nn.remat of '
                               'one)')
  sibling = ctx.converted.get(target.value)
  if sibling is None:
    raise Unsupported(ctor, f'{target.value} is a Linen module that was not converted')
  options = STACK_OPTIONS[transform]
  stop = f'nn.{transform}({target.value}, {given}) is converted only '
  if any(a.star for a in lifted.args) or set(kwargs) - set(options):
    raise Unsupported(lifted, stop + f'with the options {", ".join(options)}')
  axes = literal_dict(kwargs.get('variable_axes', cst.Dict([])))
  if axes is None or 'params' not in axes or not all(isinstance(v, cst.Integer) and v.value == '0' for v in axes.values()):
    raise Unsupported(lifted, stop + "with variable_axes of literal collections stacked on axis 0, 'params' among "
                                      'them')
  split = literal_dict(kwargs.get('split_rngs', cst.Dict([])))
  if split is None or not all(isinstance(v, cst.Name) and v.value in ('True', 'False') for v in split.values()) \
      or not (isinstance(split.get('params'), cst.Name) and split['params'].value == 'True'):
    raise Unsupported(lifted, stop + "with split_rngs={'params': True, ...} (each copy initialised from its own key)")
  if options[0] not in kwargs:
    raise Unsupported(lifted, stop + f'with {options[0]}= (nnx.vmap creates that many copies in __init__)')
  for key in (options[0], 'metadata_params', 'axis_name'):  # moved into __init__ / the NNX call
    if key in kwargs:
      queries.check_hoistable(ctx, kwargs[key])
  scan = transform == 'scan'
  mode_positions = {i + 1 for i, _, _ in sibling.mode_params}  # Linen's numbering: self is 0
  count = len(sibling.call_params) - scan
  in_axes = kwargs.get('in_axes', cst.Integer('0'))
  entries = [e.value for e in in_axes.elements] if isinstance(in_axes, cst.Tuple) else [in_axes] * count
  if len(entries) != count or not all(
      isinstance(e, cst.Integer) and e.value == '0' or ctx.facts.has_name(e, BROADCAST_NAMES)
      or isinstance(e, cst.Name) and e.value == 'None' for e in entries):
    raise Unsupported(lifted, stop + f'with in_axes of 0 or {"nn.broadcast" if scan else "None"} for each of the '
                                      f'{count} inputs{" after the carry" if scan else ""}')
  out_axes = kwargs.get('out_axes', cst.Integer('0'))
  if not isinstance(out_axes, cst.Integer):
    raise Unsupported(lifted, stop + 'with an int out_axes')
  metadata = None
  if 'metadata_params' in kwargs:
    keys = [e.key for e in getattr(kwargs['metadata_params'], 'elements', ()) if isinstance(e, cst.DictElement)]
    metadata = queries.code(ctx, kwargs['metadata_params'], {key: queries.nnx_name_for(ctx, key) for key in keys
                                                      if queries.nnx_name_for(ctx, key) is not None})
  remat = None if positional[0] is target else _wrapping_options(ctx, positional[0], sibling, 'remat', under=transform)
  ctx.plan.stacks[ctor] = Stacked(
      transform, queries.code(ctx, kwargs[options[0]]),
      tuple('0' if isinstance(e, cst.Integer) else 'None'
            for i, e in enumerate(entries, start=1 + scan) if i not in mode_positions),
      out_axes.value, remat[1] if remat else None, metadata,
      queries.code(ctx, kwargs['axis_name']) if 'axis_name' in kwargs else None,
      tuple(sorted(s for s, v in split.items() if v.value == 'True')))
  return target.value


def rematted_class(ctx: ClassContext, lifted: cst.Call) -> str | None:
  """`Block` for `nn.remat(Block, prevent_cse=..., policy=..., static_argnums=<int or tuple of ints>)` (or
  nn.checkpoint), or `nn.jit(Block, static_argnums=..., donate_argnums=...)`, over a Linen class of this file,
  recording the NNX transform and its options; None for any other call. Other options (`variables=`, `rngs=`,
  `concrete=`, `methods=`, ...): a TODO."""
  for kind, (names, *_) in WRAPPING.items():
    positional = _lifted_class(ctx, lifted, names)
    if positional is None:
      continue
    sibling = ctx.converted.get(positional[0].value)
    options = _wrapping_options(ctx, lifted, sibling, kind) if sibling is not None else None
    outer = ctx.facts.parent(lifted)
    if options is not None and isinstance(outer, cst.Call) and outer.func is lifted:
      ctx.plan.remats[outer] = options
    return positional[0].value
  return None


def wrapped_local(ctx: ClassContext, name: cst.Name) -> str | None:
  """`Block` for `name` bound once in the method by `CheckpointBlock = remat(Block, static_argnums=...)` (nn.remat,
  nn.checkpoint, nn.jit or flax's partitioning.remat over a converted class of the file, as transformers' layer
  collections do under `if self.gradient_checkpointing:`), every use a construction. The binding stays, its
  value the NNX class whose `__call__` runs through the NNX transform (`type('CheckpointBlock', (Block,),
  {'__call__': nnx.remat(Block.__call__, ...)})`): the code around it, conditions included, is unchanged.
  None for other names."""
  if name.value in ctx.facts.linen_classes:
    return None
  bound = ctx.facts.local_call(name, frozenset().union(*(names for names, *_ in WRAPPING.values())))
  if bound is None:
    return None
  _, assignment, value = bound
  kind, positional = next(((k, p) for k, (names, *_) in WRAPPING.items()
                           if (p := _lifted_class(ctx, value, names)) is not None), (None, None))
  if positional is None:
    return None
  target = positional[0].value
  sibling = ctx.converted.get(target)
  if sibling is None:
    raise Unsupported(value, f'{target} is a Linen module that was not converted')
  for reference in assignment.references:
    parent = ctx.facts.parent(reference.node)
    if not (isinstance(parent, cst.Call) and parent.func is reference.node):
      raise Unsupported(reference.node, f'{name.value} = {ctx.facts.code(value.func)}({target}, ...) used other '
                                        'than to build submodules')
  if value not in ctx.plan.exprs:
    transform, options, _ = _wrapping_options(ctx, value, sibling, kind)
    ctx.plan.exprs[value] = (f"type({name.value!r}, ({target},), {{'__call__': {transform}({target}.__call__"
                             f"{', ' + options if options else ''})}})")
    ctx.plan.lifted.add(value)
    effect = 'its activations recomputed in the backward pass' if transform == 'nnx.remat' else 'compiled on its own'
    ctx.plan.pending.append((value, f'{name.value} = {ctx.facts.code(value.func)}({target}, ...) -> the subclass of '
                                    f'{target} whose __call__ runs through {transform}: {effect}, as in Linen'))
  return target


@dataclasses.dataclass(frozen=True)
class Choice:
  """One class a local of setup() may name (`attention_layer = FlaxLongT5LayerSelfAttention` in one arm of an if
  chain, `layer = A if <test> else B`): the class's name node in the binding, and the arms it is bound under."""

  node: cst.Name
  linen: str
  arms: ArmPath


def chosen_classes(ctx: ClassContext, name: cst.Name) -> list[Choice] | None:
  """The classes of the file a local of a method names where every binding of it is `name = <Class>` or `name = A
  if <test> else B` (transformers' LongT5 block picks its attention layer so, ResNet its layer kind), and every
  use builds a submodule (`name(...)`); None for other names."""
  scope = ctx.facts.scope(name)
  if scope is None or isinstance(scope, (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)) \
      or name.value in ctx.facts.linen_classes or name.value not in scope:
    return None
  found: list[Choice] = []
  for assignment in scope[name.value]:
    target = ctx.facts.parent(getattr(assignment, 'node', None)) if isinstance(assignment, cst.metadata.Assignment) \
        else None
    assign = ctx.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1) or not _in_setup(ctx, assign):
      return None
    path, value = arm_path(ctx, assign), assign.value
    test = test_key(ctx, value.test) if isinstance(value, cst.IfExp) else None
    arms = [(value.body, path | {(test, True)}), (value.orelse, path | {(test, False)})] if test is not None \
        else [(value, path)]
    for node, arms_of in arms:
      if not (isinstance(node, cst.Name) and node.value in ctx.facts.linen_classes):
        return None
      found.append(Choice(node, node.value, frozenset(arms_of)))
    for reference in assignment.references:
      parent = ctx.facts.parent(reference.node)
      if not (isinstance(parent, cst.Call) and parent.func is reference.node):
        return None
  return found or None


def _in_setup(ctx: ClassContext, node: cst.CSTNode) -> bool:
  """Whether `node` sits in a setup() method, directly (not in a nested function)."""
  while node is not None and not isinstance(node, cst.FunctionDef):
    node = ctx.facts.parent(node)
  return node is not None and node.name.value == 'setup'


def kept_choice(ctx: ClassContext, call: cst.Call) -> None:
  """Raises Unsupported for `layer(...)` of a local naming classes one of which stays Linen: an NNX class of
  another arm cannot be wrapped as a Linen one. The message (`choice_refused`) names none of them, so that a second
  run, which finds the classes that construction kept Linen, says the same."""
  if isinstance(call.func, cst.Name) and chosen_classes(ctx, call.func) is not None:
    raise Unsupported(call, choice_refused(call.func.value))


def choice_refused(local: str) -> str:
  """Why a construction through a local naming one class or another stays Linen."""
  return (f'{local}(...) builds one class or another, as the local {local} names them: it converts when every class '
          'it may build converts (see the TODOs of its classes)')


def choice_binding(ctx: ClassContext, statement: cst.BaseStatement) -> bool:
  """Whether `statement` binds a local of `chosen_classes` (it stays, naming the NNX classes)."""
  name = assigned_name(statement)
  return name is not None and chosen_classes(ctx, statement.body[0].targets[0].target) is not None


def wrapped_binding(ctx: ClassContext, statement: cst.BaseStatement) -> bool:
  """Whether `statement` is the binding of a `wrapped_local` (planned here, whether or not it is used)."""
  assign = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
  return isinstance(assign, cst.Assign) and len(assign.targets) == 1 \
      and isinstance(assign.targets[0].target, cst.Name) \
      and wrapped_local(ctx, assign.targets[0].target) is not None


def _wrapping_options(ctx: ClassContext, lifted: cst.Call, sibling: ClassRewrite, kind: str, under: str = ''
                      ) -> tuple[str, str, str]:
  """The NNX transform (`nnx.remat`), its options and Linen's child-name prefix for `nn.remat(Block, ...)` /
  `nn.jit(Block, ...)`, static_argnums renumbered for the train/eval arguments the NNX call drops. Linen counts
  `self` as argument 0 of __call__, as the NNX transform counts the module given first: otherwise the same
  numbers (flax's partitioning.remat counts from the first argument after the module: one more). `under` an
  nnx.scan / nnx.vmap, no static argument may remain (traced there)."""
  _, transform, accepted, prefix, offset = WRAPPING[kind]
  kwargs = {a.keyword.value: a.value for a in lifted.args if a.keyword is not None}
  func, name = ctx.facts.code(lifted.func), sibling.name
  given = ', '.join(f'{k}={ctx.facts.code(v)}' for k, v in kwargs.items())
  numbers = {k: literal_ints(v, offset) for k, v in kwargs.items() if k.endswith('argnums')}
  if any(a.star for a in lifted.args) or set(kwargs) - set(accepted) or None in numbers.values():
    raise Unsupported(lifted, f'{func}({name}, {given}) is converted only with the options '
                               f'{", ".join(accepted)} (argnums literal), which {transform} takes')
  for value in kwargs.values():
    queries.check_hoistable(ctx, value)
  codes = {k: queries.code(ctx, kwargs[k], {}) for k in accepted if k in kwargs}
  modes = {i + 1 for i, _, _ in sibling.mode_params}
  for key, given_numbers in numbers.items():
    kept = renumbered(given_numbers, modes)
    if under and kept and key == 'static_argnums':
      raise Unsupported(lifted, f'{func}({name}, {given}) under nn.{under}: static arguments other than '
                                 f'train/eval switches (traced inside nnx.{under})')
    del codes[key]
    if kept:
      codes[key] = int_tuple(kept)
  return transform, ', '.join(f'{k}={v}' for k, v in codes.items()), prefix
