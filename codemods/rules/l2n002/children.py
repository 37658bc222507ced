"""Submodules: what a construction builds, the child it becomes, its calls, and the code moved to __init__.

A pass of `planner.ClassPlanner`, mixed into it: it reads the file's facts and fills the class's plan.
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002.nodes import Replace
from codemods.rules.l2n002.nodes import has_scope_call
from codemods.rules.l2n002.nodes import is_self_attr
from codemods.rules.l2n002.nodes import last_axis_of_name
from codemods.rules.l2n002.nodes import literal_identifier
from codemods.rules.l2n002.nodes import nnx_counterpart
from codemods.rules.l2n002.nodes import size_local_of
from codemods.rules.l2n002.plan import Child
from codemods.rules.l2n002.plan import ClassRewrite
from codemods.rules.l2n002.plan import Unsupported
from codemods.rules.l2n002.state import PlannerState
from codemods.vocabulary import LINEN_ARRAY_FUNCTIONS
from codemods.vocabulary import PARTIAL_NAMES
from codemods.vocabulary import TO_LINEN_NAMES
from codemods.vocabulary import WRAPPING
from nnx_bridge.layer_table import LayerSpec
from nnx_bridge.layer_table import WrapperSpec
from nnx_bridge.layer_table import find_layer
from nnx_bridge.layer_table import find_wrapper
from nnx_bridge.layer_table import linen_fields
from nnx_bridge.layer_table import nnx_arguments


TO_LINEN = 'nnx_bridge.to_linen'  # what constructed() names a to_linen construction: a Linen module


class Children(PlannerState):
  """Submodules."""

  def _child(self, ctor: cst.Call, counts: dict[str, int], attr: str | None) -> Child:
    linen, spec, sibling = self.constructed(ctor)
    if spec is None and sibling is None and (linen in self.facts.linen_classes or linen == TO_LINEN):
      return self._bridged_child(ctor, linen, counts, attr)
    wrapper = find_wrapper(linen) if spec is None and sibling is None else None
    stacked, wrapped = self.plan.stacks.get(ctor), self.plan.remats.get(ctor)
    short = ('Scan' if ctor in self.plan.scans else stacked.transform.capitalize() if stacked else '') \
        + ('Checkpoint' if stacked and stacked.remat is not None else
           next(w[3] for w in WRAPPING.values() if w[1] == wrapped[0]) if wrapped else '') \
        + linen.rpartition('.')[2]  # Linen names it ScanCell_0, CheckpointBlock_0, ScanCheckpointBlock_0, VmapBlock_0
    args = [*self.plan.partials[ctor].args[1:], *ctor.args] if ctor in self.plan.partials else ctor.args
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
    listed = self.loops.list_name(self, ctor, name)  # built in a loop, name=f'layer_{i}': the nnx.List `layers`
    if name is not None and listed is None and not literal_identifier(name):
      raise Unsupported(ctor, 'name= is not a literal identifier')
    cell = self._cell(ctor, wrapper, kwargs.pop(wrapper.cell_kwarg, None), counts) if wrapper is not None else None
    refs = self._size_refs(kwargs.values())
    for value in kwargs.values():
      self.check_hoistable(value, skip=set(refs))
    explicit = listed or (name.evaluated_value if name is not None else attr)
    if not explicit:
      counts[short] = counts.get(short, -1) + 1  # Linen numbers auto-named children per class
    child = Child(explicit or '', explicit or f'{short}_{counts[short]}', ctor, spec, sibling, kwargs,
                   wrapper=wrapper, cell=cell, scan=self.plan.scans.get(ctor), remat=self.plan.remats.get(ctor), stacked=stacked,
                   shape_refs=refs)
    self._ctor_modes(child)
    return child

  def _size_refs(self, values: tp.Iterable[cst.CSTNode]) -> dict[cst.CSTNode, str]:
    """Input sizes a constructor argument reads: `x.shape[-1]` (-> x), or a local bound once to one, as
    `d = x.shape[-1]` or `n, _, d = x.shape` (-> d); `_derive` finds what the code says of each."""
    refs = {}
    for value in values:
      for sub in (value, *descendants(value)):
        if last_axis_of_name(sub):
          refs[sub] = sub.value.value.value
        elif isinstance(sub, cst.Name) and self.size_local(sub) is not None:
          refs[sub] = sub.value
    return refs

  def size_local(self, name: cst.Name) -> str | None:
    """The array whose last axis the local `name` is bound to, once, in the method: None for other names."""
    scope = self.facts.scope(name)
    if scope is None or isinstance(scope, (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)) \
        or name.value not in scope:
      return None
    assignments = list(scope[name.value])
    if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
      return None
    assign = next((node for node in self.facts.ancestors(assignments[0].node) if isinstance(node, cst.Assign)), None)
    local = size_local_of(assign) if assign is not None else None
    return local[1] if local is not None and local[0] == name.value else None

  def _bridged_child(self, ctor: cst.Call, linen: str, counts: dict[str, int], attr: str | None) -> Child:
    """A Linen class of the file that stays Linen, built by `ctor`: wrapped with nnx_bridge.from_linen, initialised
    from example inputs the converted class takes as a constructor argument."""
    self.check_hoistable(ctor, linen=True)
    name = next((a.value for a in ctor.args if a.keyword is not None and a.keyword.value == 'name'), None)
    if name is not None and not literal_identifier(name):
      raise Unsupported(ctor, 'name= is not a literal identifier')
    explicit = name.evaluated_value if name is not None else attr
    if isinstance(ctor.func, cst.Call):  # Linen names nn.map_variables(Block) Map_variablesBlock_0
      short = self.facts.code(ctor.func.func).rpartition('.')[2].capitalize() + linen
    else:
      short = linen
    if not explicit:
      counts[short] = counts.get(short, -1) + 1
    why = self.facts.kept_linen.get(linen, 'it was not converted (see its TODO)')
    return Child(explicit or '', explicit or f'{short}_{counts[short]}', ctor, None, None, {}, bridged=why)

  def _inline_calls(self, plan: ClassRewrite, inline: dict[cst.Call, cst.Call]) -> dict[cst.Call, Child]:
    """The calls of the submodules built in the @nn.compact method, and of locals bound to one."""
    by_ctor = {c.ctor: c for c in plan.children}
    calls = {call: by_ctor[ctor] for ctor, call in inline.items()}
    for call, ctor in self.plan.extra_calls.items():  # `embed(...)` again: the same submodule
      if ctor in by_ctor:
        calls[call] = by_ctor[ctor]
        self.plan.calls[call] = (by_ctor[ctor].attr, set())
    for child, call in zip([by_ctor[c] for c in inline], inline.values()):
      self.plan.calls[call] = (child.attr, set())
      if child.scan is not None:
        self._scan_call(call, child)
      if child.remat is not None:
        self._remat_call(call, child)
      if child.stacked is not None:
        self._stack_call(call, child)
    return calls

  def _setup_child_calls(self, plan: ClassRewrite, methods: dict[str, cst.FunctionDef], setup: cst.FunctionDef | None,
                         calls: dict[cst.Call, Child], tied: set[cst.Attribute]) -> None:
    """Adds to `calls` each call of a submodule built in setup() (but the `tied` uses); setup params read back
    become `[...]` reads."""
    from_setup = {c.attr: c for c in plan.children if not c.hoisted}
    for method in methods.values():
      if method is setup:
        continue
      for sub in descendants(method):
        if not (isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value in from_setup) or sub in tied:
          continue
        child, parent = from_setup[sub.attr.value], self.facts.parent(sub)
        if self.loops.list_use(self, sub, child, calls):  # `for layer in self.layers:` over a setup() list
          continue
        if child.api == 'param':
          if isinstance(parent, (cst.AssignTarget, cst.AugAssign)) or isinstance(parent, cst.Del):
            raise Unsupported(sub, f'self.{child.attr} (a param) assigned to')
          self.plan.exprs[sub] = f'self.{child.attr}[...]'
        elif child.api == 'variable':
          if isinstance(parent, cst.Attribute) and parent.value is sub and parent.attr.value == 'value':
            self.plan.exprs[parent] = f'self.{child.attr}[...]'  # `.value` is deprecated in NNX
        elif child.api is None:
          if (child.scan is not None or child.remat is not None or child.stacked is not None) \
              and isinstance(parent, cst.Attribute) and parent.value is sub \
              and isinstance(self.facts.parent(parent), cst.Call) and self.facts.parent(parent).func is parent:
            continue  # `self.rnn.initial_state(...)`: a method of the cell, called outside the scan
          if not (isinstance(parent, cst.Call) and parent.func is sub):
            raise Unsupported(sub, f'self.{sub.attr.value} used other than by calling it')
          calls[parent] = child
          if child.scan is not None:
            self._scan_call(parent, child)
          if child.remat is not None:
            self._remat_call(parent, child)
          if child.stacked is not None:
            self._stack_call(parent, child)

  def called_when(self, plan: ClassRewrite, calls: dict[cst.Call, Child]) -> None:
    """A setup() submodule that every call runs under one construction-time condition (`self.pooler(h) if
    self.add_pooling_layer else None`) is created only when it holds, else None: Linen creates the variables of a
    submodule only when it is called, so NNX then has the same variables."""
    conditions: dict[str, set[str | None]] = {}
    for call, child in calls.items():
      if not child.hoisted and child.api is None and child.condition is None:
        conditions.setdefault(child.attr, set()).add(self._call_condition(call))
    for child in plan.children:
      found = conditions.get(child.attr, {None})
      if len(found) == 1 and None not in found:
        child.condition = found.pop()
        self.plan.pending.append((child.ctor, f'self.{child.attr} is created only when {child.condition} (else None): '
                                              'it is called only then, and Linen creates its variables only then'))

  def _call_condition(self, call: cst.Call) -> str | None:
    """The construction-time condition a call runs under (the innermost `if` or `a if c else b` around it), as
    code valid in __init__; None when it runs always, or under a test on the call (a train/eval switch keeps the
    class Linen, see ClassPlanner._finish)."""
    node, parent = call, self.facts.parent(call)
    while parent is not None and not isinstance(parent, cst.FunctionDef):
      if isinstance(parent, (cst.IfExp, cst.If)) and node is not parent.test:
        if has_scope_call(parent.test) or any(isinstance(c, cst.Call) and isinstance(c.func, cst.Attribute)
                                              and is_self_attr(c.func) for c in descendants(parent.test)):
          return None  # `if self.is_initializing():`, a method's result: not known when __init__ runs
        try:
          self.check_hoistable(parent.test)
        except Unsupported:
          return None
        test = parent.test
        if node is parent.body:
          return self.code(test)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
          return self.code(test.expression)
        return f'not {self.code(test)}' if isinstance(test, (cst.Name, cst.Attribute)) else f'not ({self.code(test)})'
      node, parent = parent, self.facts.parent(parent)
    return None

  def check_hoistable(self, value: cst.CSTNode, skip: tp.Collection[cst.CSTNode] = (), linen: bool = False) -> None:
    """Code moved into __init__ must mean the same there: no locals (but `skip`), Linen names NNX shares (any
    Linen name, with `linen`: code that stays Linen)."""
    if value in skip or value in self.plan.hoistable or value in self.loops.refs \
        or (self.facts.is_linen_name(value) if linen else self._nnx_name_for(value) is not None):
      return
    if isinstance(value, cst.Name) and value.value != 'self' and value.value not in self.plan.switches:
      scope = self.facts.scope(value)
      outer = (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)
      assignments = list(scope[value.value]) if scope is not None else []
      if scope is not None and not isinstance(scope, outer) and any(not isinstance(a.scope, outer) for a in assignments) \
          and not self._setup_local(assignments) and not self._lambda_parameter(assignments):
        alias = self._self_alias(assignments)
        if alias is None:
          raise Unsupported(value, f'a constructor argument uses the local {value.value}')
        self.plan.aliases[value] = alias
    for child in value.children:
      self.check_hoistable(child, skip, linen)

  def _lambda_parameter(self, assignments: list[cst.metadata.BaseAssignment]) -> bool:
    """Whether a name is a parameter of a lambda (`lambda _, shape: jnp.ones(shape)`), which moves with its code."""
    return bool(assignments) and all(isinstance(a.scope, cst.metadata.FunctionScope) and isinstance(a.scope.node, cst.Lambda)
                                     for a in assignments)

  def _setup_local(self, assignments: list[cst.metadata.BaseAssignment]) -> bool:
    """Whether a local is one of setup()'s: plain setup() code stays, in its place, in __init__ (`setup_code.py`),
    so code there sees it."""
    return bool(assignments) and all(isinstance(a.scope, cst.metadata.FunctionScope) and isinstance(a.scope.node, cst.FunctionDef)
                                     and a.scope.node.name.value == 'setup'
                                     and a.scope.node in self.facts.class_defs[self.plan.name].body.body
                                     for a in assignments)

  def _self_alias(self, assignments: list[cst.metadata.BaseAssignment]) -> str | None:
    """`self.config` when the local is bound once, by `name = self.config` (or a longer chain, or an attribute
    chain of such a local: `p = cfg.patch_size`)."""
    if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
      return None
    target = self.facts.parent(assignments[0].node)
    assign = self.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and target.target is assignments[0].node):
      return None
    chain = assign.value
    while isinstance(chain, cst.Attribute):
      chain = chain.value
    if not isinstance(chain, cst.Name) or assign.value is chain:
      return None
    code = self.facts.code(assign.value)
    if chain.value == 'self':
      return code
    scope = self.facts.scope(chain)  # `p = cfg.patch_size` after `cfg = self.config`
    base = self._self_alias(list(scope[chain.value])) if scope is not None and chain.value in scope else None
    return None if base is None else base + code[len(chain.value):]

  def _ctor_text(self, child: Child) -> str:
    """The NNX constructor call of `child`, as code valid in __init__."""
    code = lambda node: self.code(node, child.size_codes)
    if child.bridged:
      mode = ', eval_mode=True' if child.mode_defaults.get('eval_mode') else ''
      return f'nnx_bridge.from_linen({code(child.ctor)}, *{child.attr}_example_inputs, rngs=rngs{mode})'
    if child.wrapper is not None:
      wrapper = child.wrapper
      child.cell.sizes = child.sizes
      accepted, only = nnx_arguments(wrapper.nnx), {k.name for k in wrapper.linen_only}
      args = [self._ctor_text(child.cell)]
      for name, value in child.kwargs.items():
        if name in only or name not in accepted:
          raise Unsupported(value, f'{name}= of {wrapper.linen} has no NNX counterpart to pass it to')
        args.append(f'{name}={code(value)}')
      args += ['rngs=rngs'] if wrapper.rngs else []
      return f'nnx.{wrapper.nnx.rpartition(".")[2]}({", ".join(args)})'
    if child.sibling is not None:
      fields, args, positional = child.sibling.field_names, [], True
      for i, (f, v) in enumerate(child.kwargs.items()):  # positional while in field order, keywords after
        positional = positional and i < len(fields) and f == fields[i]
        args.append(code(v) if positional else f'{f}={code(v)}')
      args += [f'{k}={v}' for k, v in child.sizes.items()]
      args += [f'{name}={child.attr}_{name}' for name in child.sibling.example_params]
      built = f'{self.plan.factory_callee.get(child.ctor, child.sibling.name)}({", ".join([*args, "rngs=rngs"])})'
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
      args.append(f'{new}={code(value)}')
    callee = self.plan.factory_callee.get(child.ctor)  # a factory: its partial holds the Linen defaults
    args += [f'{k}={v!r}' for k, v in spec.linen_defaults if k not in child.kwargs and callee is None]
    args += [f'{k}={v!r}' for k, v in child.mode_defaults.items() if k in accepted]
    return f'{callee or "nnx." + spec.nnx.rpartition(".")[2]}({", ".join([*args, "rngs=rngs"])})'

  def constructed(self, call: cst.Call) -> tuple[str, LayerSpec | None, ClassRewrite | None] | None:
    factory = self.factories.constructed(call)  # `self.conv(...)` of a ModuleDef field, `conv(...)` of a factory
    if factory is not None:
      return factory
    partial = self._partial_of(call.func) if isinstance(call.func, cst.Name) else None
    if partial is not None:  # `conv = partial(nn.Conv, use_bias=False)`, then `conv(features, ...)(x)`
      self.plan.partials[call] = partial
    func = partial.args[0].value if partial is not None else call.func
    lifted = self._lifted_alias(call.func) if isinstance(call.func, cst.Name) else call.func
    scanned = self._scanned_class(lifted, call) if isinstance(lifted, cst.Call) else None
    if scanned is not None:
      sibling = self.converted.get(scanned)
      if sibling is None:
        raise Unsupported(call, f'{scanned} is a Linen module that was not converted')
      return scanned, None, sibling
    rematted = self._rematted_class(call.func) if isinstance(call.func, cst.Call) else None
    if rematted is not None:
      sibling = self.converted.get(rematted)
      if sibling is None:
        raise Unsupported(call, f'{rematted} is a Linen module that was not converted')
      return rematted, None, sibling
    if isinstance(func, cst.Name) and func.value in self.facts.linen_classes:
      return func.value, None, self.converted.get(func.value)  # no plan: a Linen class, bridged
    if isinstance(func, (cst.Name, cst.Attribute)) and self.facts.has_name(func, TO_LINEN_NAMES):
      return TO_LINEN, None, None  # an NNX class an earlier run's Linen parent built: a Linen module
    kept = self._kept_target(func)
    if kept is not None:
      return kept, None, None
    if not isinstance(func, (cst.Name, cst.Attribute)):
      return None
    for qualified in self.facts.qualified_names(func):
      spec = find_layer(qualified.name)
      if spec is not None and spec.nnx is not None:
        return spec.linen, spec, None
      wrapper = find_wrapper(qualified.name)
      if wrapper is not None:
        return wrapper.linen, None, None
    return None

  def _partial_of(self, name: cst.Name) -> cst.Call | None:
    """The `functools.partial(<layer or class>, ...)` bound to `name` by the one statement `name = partial(...)`
    of the method, every use of `name` a call: the statement goes, each call is a construction with the partial's
    arguments first. None for other names."""
    bound = self.facts.local_call(name, PARTIAL_NAMES)
    if bound is None:
      return None
    line, assignment, value = bound
    if not value.args or value.args[0].keyword is not None or any(a.star for a in value.args):
      return None
    for reference in assignment.references:
      use = reference.node
      if not (isinstance(self.facts.parent(use), cst.Call) and self.facts.parent(use).func is use):
        raise Unsupported(use, f'the partial {name.value} used other than by calling it')
    self.plan.removed.add(line)
    self.plan.lifted.update((value.func, value.args[0].value))  # its arguments are converted with each construction
    return value

  def _kept_target(self, func: cst.CSTNode) -> str | None:
    """`Block` for `nn.map_variables(Block, ...)`: a Linen function over a class kept as Linen."""
    if isinstance(func, cst.Call) and isinstance(func.func, (cst.Name, cst.Attribute)) and self.facts.is_linen_name(func.func):
      return next((a.value.value for a in func.args if a.keyword is None and isinstance(a.value, cst.Name)
                   and a.value.value in self.facts.kept_linen), None)
    return None

  def _nnx_name_for_or_none(self, node: cst.CSTNode) -> str | None:
    try:
      return self._nnx_name_for(node)
    except Unsupported:
      return None

  def literal_dict(self, node: cst.BaseExpression) -> dict[str, cst.BaseExpression] | None:
    """`{'params': 0}` as a dict of its string keys; None for anything else."""
    if not isinstance(node, cst.Dict) or not all(
        isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString) for e in node.elements):
      return None
    return {e.key.evaluated_value: e.value for e in node.elements}

  def _literal_ints(self, node: cst.BaseExpression) -> list[int] | None:
    """`2` or `(1, 2)` as a list of ints; None for anything else."""
    if isinstance(node, cst.Integer):
      return [int(node.value)]
    if isinstance(node, cst.Tuple) and all(isinstance(e.value, cst.Integer) for e in node.elements):
      return [int(e.value.value) for e in node.elements]
    return None

  def _bound_local(self, method: cst.FunctionDef, ctor: cst.Call) -> cst.Name | None:
    """The local `name` of a statement `name = <ctor>` of the method's own body, else None."""
    assign = self.facts.parent(ctor)
    line = self.facts.parent(assign) if isinstance(assign, cst.Assign) else None
    if isinstance(assign, cst.Assign) and assign.value is ctor and len(assign.targets) == 1 \
        and isinstance(assign.targets[0].target, cst.Name) and isinstance(line, cst.SimpleStatementLine) \
        and len(line.body) == 1 and line in method.body.body:
      return assign.targets[0].target
    return None

  def _shared_local(self, method: cst.FunctionDef, ctor: cst.Call) -> tuple[list[cst.Call], list[cst.Name]]:
    """`embed = nn.Embed(...)` in the @nn.compact method, then `embed(tokens)` and `embed.attend(h)`: one
    submodule used in several places (weight tying). Returns the calls, in order, and the names read through an
    attribute."""
    calls, names = self._local_uses(method, ctor, 'submodule')
    if not calls:
      raise Unsupported(ctor, f'the submodule {self._bound_local(method, ctor).value} is never called (its input '
                               'size comes from a call)')
    return calls, names

  def _local_uses(self, method: cst.FunctionDef, ctor: cst.Call, kind: str) -> tuple[list[cst.Call], list[cst.Name]]:
    """The uses of the local a `name = <ctor>` statement binds: its calls, in order, and the names read through an
    attribute (`rnn.initial_state`); any other use is refused. The statement goes (the child is built in __init__)."""
    target = self._bound_local(method, ctor)
    local = target.value
    assignments = list(self.facts.scope(target).assignments[local])
    if len(assignments) != 1:
      raise Unsupported(ctor, f'the {kind} {local} is rebound in the method')
    calls, names = [], []
    for reference in assignments[0].references:
      use = reference.node
      parent = self.facts.parent(use)
      if isinstance(parent, cst.Call) and parent.func is use:
        calls.append(parent)
      elif isinstance(parent, cst.Attribute) and parent.value is use:
        names.append(use)
      else:
        raise Unsupported(use, f'the {kind} {local} used other than by calling it or one of its methods')
    self.plan.removed.add(self.facts.parent(self.facts.parent(ctor)))
    position = lambda call: self.facts.position(call)
    calls.sort(key=lambda call: (position(call).line, position(call).column))
    return calls, names

  def _cell_arg(self, ctor: cst.Call) -> cst.BaseExpression | None:
    """The cell argument of a wrapper's constructor call (`nn.RNN(<cell>)`), if `ctor` builds a wrapper."""
    built = self.constructed(ctor)
    wrapper = find_wrapper(built[0]) if built is not None else None
    if wrapper is None:
      return None
    position = linen_fields(wrapper.linen).index(wrapper.cell_kwarg)
    positional = [a.value for a in ctor.args if a.keyword is None]
    if position < len(positional):
      return positional[position]
    return next((a.value for a in ctor.args if a.keyword is not None and a.keyword.value == wrapper.cell_kwarg), None)

  def _cell(self, ctor: cst.Call, wrapper: WrapperSpec, value: cst.BaseExpression | None,
            counts: dict[str, int]) -> Child:
    """The table cell a wrapper is built around, built in the wrapper's constructor call."""
    built = self.constructed(value) if isinstance(value, cst.Call) else None
    if built is None or built[0] not in wrapper.cells:
      short = wrapper.linen.rpartition('.')[2]
      cells = ', '.join(c.rpartition('.')[2] for c in wrapper.cells)
      raise Unsupported(value or ctor, f'{short} over a cell other than a {cells} built in its constructor call '
                                        '(a cell class of your own, or a cell built elsewhere)')
    return self._child(value, counts, None)

  def _nnx_name_for(self, node: cst.CSTNode) -> str | None:
    """The NNX name for a Linen name (`nn.relu` -> `nnx.relu`); None for other code.

    Raises Unsupported for a Linen name NNX has no counterpart of.
    """
    names = {q.name for q in self.facts.qualified_names(node)}
    linen = {n for n in names if (n == 'flax.linen' or n.startswith('flax.linen.')) and n not in LINEN_ARRAY_FUNCTIONS
             and f'flax.linen.attention.{n.rpartition(".")[2]}' not in LINEN_ARRAY_FUNCTIONS}
    if not (isinstance(node, (cst.Name, cst.Attribute)) and linen):
      return None
    targets = {nnx_counterpart(n) for n in linen}
    if len(targets) != 1 or None in targets or linen != names:
      raise Unsupported(node, f'{self.facts.code(node)} has no automatic NNX conversion here')
    return targets.pop()

  def _convert_linen_refs(self, node: cst.CSTNode, allowed: set[cst.CSTNode]) -> list[cst.CSTNode]:
    """Schedules `nn.relu` -> `nnx.relu` for Linen names NNX shares; returns the nodes converted."""
    converted = []
    for child in node.children:
      if child in allowed:
        continue
      target = self._nnx_name_for(child)
      if target is not None:
        self.plan.exprs[child] = target
        converted.append(child)
        continue
      converted += self._convert_linen_refs(child, allowed)
    return converted

  def code(self, node: cst.CSTNode, replacements: dict[cst.CSTNode, str] | None = None) -> str:
    """The code of `node` moved to __init__, with Linen names (and `replacements`) rewritten."""
    return self.facts.code(node.visit(Replace({**self.plan.exprs, **self.plan.aliases, **(replacements or {})})))
