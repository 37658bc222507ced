"""Lifted transforms over classes of the file (nn.scan, nn.vmap, nn.remat, nn.jit) and control flow
(nn.cond, nn.switch, nn.while_loop).

A pass of `planner.ClassPlanner`, mixed into it: it reads the file's facts and fills the class's plan.
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002.nodes import draws_rngs
from codemods.rules.l2n002.plan import Child
from codemods.rules.l2n002.plan import ClassRewrite
from codemods.rules.l2n002.plan import Stacked
from codemods.rules.l2n002.plan import Unsupported
from codemods.rules.l2n002.state import PlannerState
from codemods.vocabulary import BROADCAST_NAMES
from codemods.vocabulary import CONTROL_FLOW
from codemods.vocabulary import SCAN_NAMES
from codemods.vocabulary import SCOPE_APIS
from codemods.vocabulary import STACK_OPTIONS
from codemods.vocabulary import VMAP_NAMES
from codemods.vocabulary import WHILE_OPTIONS
from codemods.vocabulary import WRAPPING

SCAN_PATTERN = ("nn.scan(<a cell class of this file>, variable_broadcast='params', split_rngs={'params': False}, "
                'in_axes=<int>, out_axes=<int>)')


class LiftedTransforms(PlannerState):
  """Lifted transforms over classes of the file (nn.scan, nn.vmap, nn.remat, nn.jit) and control flow."""

  def _lifted_class(self, call: cst.Call, names: tp.Collection[str]) -> list[cst.BaseExpression] | None:
    """The positional arguments of `nn.scan(Cell, ...)` / `nn.remat(Block, ...)` (one of `names`) when they are
    exactly one Linen class of this file; None for any other call."""
    if not self.facts.has_name(call.func, names):
      return None
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    if len(positional) != 1 or not isinstance(positional[0], cst.Name) \
        or positional[0].value not in self.facts.linen_classes:
      return None
    return positional

  def _lifted_alias(self, name: cst.Name) -> cst.Call | None:
    """The `nn.scan(...)` call bound to `name` by the one statement `ScanBlock = nn.scan(...)` of the method, which
    goes (its construction holds the conversion); None for other names."""
    bound = self.facts.local_call(name, SCAN_NAMES | VMAP_NAMES) if name.value not in self.facts.linen_classes else None
    if bound is None:
      return None
    line, assignment, value = bound
    if [r.node for r in assignment.references] != [name]:
      raise Unsupported(value, f'{name.value} = nn.scan(...) used other than to build one submodule')
    self.plan.removed.add(line)
    self.plan.lifted.add(value)
    return value

  def _scanned_class(self, scan: cst.Call, ctor: cst.Call) -> str | None:
    """`Cell` for `nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False}, in_axes=1, out_axes=1)`
    over a Linen class of this file, recording its axes; `Block` for a scan over layers (`variable_axes`) or an
    nn.vmap ensemble (see _stacked_class); None for any other call. Other options over such a class: a TODO."""
    kwargs = {a.keyword.value: a.value for a in scan.args if a.keyword is not None}
    if 'variable_axes' in kwargs and self.facts.has_name(scan.func, SCAN_NAMES):
      return self._stacked_class(scan, ctor, kwargs, 'scan')
    if self.facts.has_name(scan.func, VMAP_NAMES) and isinstance(scan.func, (cst.Name, cst.Attribute)):
      return self._stacked_class(scan, ctor, kwargs, 'vmap')
    positional = self._lifted_class(scan, SCAN_NAMES)
    if positional is None:
      return None
    code = lambda key: self.facts.code(kwargs[key]) if key in kwargs else None
    broadcast, split = kwargs.get('variable_broadcast'), kwargs.get('split_rngs')
    axes = [kwargs.get('in_axes'), kwargs.get('out_axes')]
    if any(a.star for a in scan.args) or set(kwargs) != {'variable_broadcast', 'split_rngs', 'in_axes', 'out_axes'} \
        or not (isinstance(broadcast, cst.SimpleString) and broadcast.evaluated_value == 'params') \
        or not (isinstance(split, cst.Dict) and len(split.elements) == 1
                and isinstance(split.elements[0], cst.DictElement)
                and isinstance(split.elements[0].key, cst.SimpleString)
                and split.elements[0].key.evaluated_value == 'params'
                and isinstance(split.elements[0].value, cst.Name) and split.elements[0].value.value == 'False') \
        or not all(isinstance(a, cst.Integer) for a in axes):
      given = ', '.join(f'{k}={code(k)}' for k in kwargs)
      raise Unsupported(scan, f'nn.scan({positional[0].value}, {given}) is converted only as {SCAN_PATTERN} '
                               '(parameters shared by every step: nnx.scan over the cell), or over layers')
    self.plan.scans[ctor] = (int(axes[0].value), int(axes[1].value))
    return positional[0].value

  def _stacked_class(self, lifted: cst.Call, ctor: cst.Call, kwargs: dict[str, cst.BaseExpression],
                     transform: str) -> str:
    """`Block` for `nn.scan(Block or nn.remat(Block, ...), variable_axes={'params': 0, ...}, split_rngs={'params':
    True, ...}, length=n, in_axes=..., out_axes=..., metadata_params=...)` (scan over layers) or the same nn.vmap
    with axis_size=n (an ensemble): copies created by nnx.vmap over split rngs in __init__ (the same stacked
    layout), run by nnx.scan / nnx.vmap; records the options."""
    given = ', '.join(f'{k}={self.facts.code(v)}' for k, v in kwargs.items())
    positional = [a.value for a in lifted.args if a.keyword is None]
    target = self.facts.unremat(positional[0]) if len(positional) == 1 else None
    if not (isinstance(target, cst.Name) and target.value in self.facts.linen_classes):
      raise Unsupported(lifted, f'nn.{transform} of something other than a Linen class of this file (or nn.remat of '
                                 'one)')
    sibling = self.converted.get(target.value)
    if sibling is None:
      raise Unsupported(ctor, f'{target.value} is a Linen module that was not converted')
    options = STACK_OPTIONS[transform]
    stop = f'nn.{transform}({target.value}, {given}) is converted only '
    if any(a.star for a in lifted.args) or set(kwargs) - set(options):
      raise Unsupported(lifted, stop + f'with the options {", ".join(options)}')
    axes = self.literal_dict(kwargs.get('variable_axes', cst.Dict([])))
    if axes is None or 'params' not in axes or not all(isinstance(v, cst.Integer) and v.value == '0' for v in axes.values()):
      raise Unsupported(lifted, stop + "with variable_axes of literal collections stacked on axis 0, 'params' among "
                                        'them')
    split = self.literal_dict(kwargs.get('split_rngs', cst.Dict([])))
    if split is None or not all(isinstance(v, cst.Name) and v.value in ('True', 'False') for v in split.values()) \
        or not (isinstance(split.get('params'), cst.Name) and split['params'].value == 'True'):
      raise Unsupported(lifted, stop + "with split_rngs={'params': True, ...} (each copy initialised from its own key)")
    if options[0] not in kwargs:
      raise Unsupported(lifted, stop + f'with {options[0]}= (nnx.vmap creates that many copies in __init__)')
    for key in (options[0], 'metadata_params', 'axis_name'):  # moved into __init__ / the NNX call
      if key in kwargs:
        self.check_hoistable(kwargs[key])
    scan = transform == 'scan'
    mode_positions = {i + 1 for i, _, _ in sibling.mode_params}  # Linen's numbering: self is 0
    count = len(sibling.call_params) - scan
    in_axes = kwargs.get('in_axes', cst.Integer('0'))
    entries = [e.value for e in in_axes.elements] if isinstance(in_axes, cst.Tuple) else [in_axes] * count
    if len(entries) != count or not all(
        isinstance(e, cst.Integer) and e.value == '0' or self.facts.has_name(e, BROADCAST_NAMES)
        or isinstance(e, cst.Name) and e.value == 'None' for e in entries):
      raise Unsupported(lifted, stop + f'with in_axes of 0 or {"nn.broadcast" if scan else "None"} for each of the '
                                        f'{count} inputs{" after the carry" if scan else ""}')
    out_axes = kwargs.get('out_axes', cst.Integer('0'))
    if not isinstance(out_axes, cst.Integer):
      raise Unsupported(lifted, stop + 'with an int out_axes')
    metadata = None
    if 'metadata_params' in kwargs:
      keys = [e.key for e in getattr(kwargs['metadata_params'], 'elements', ()) if isinstance(e, cst.DictElement)]
      metadata = self.code(kwargs['metadata_params'], {key: self._nnx_name_for(key) for key in keys
                                                        if self._nnx_name_for(key) is not None})
    remat = None if positional[0] is target else self._wrapping_options(positional[0], sibling, 'remat', under=transform)
    self.plan.stacks[ctor] = Stacked(
        transform, self.code(kwargs[options[0]]),
        tuple('0' if isinstance(e, cst.Integer) else 'None'
              for i, e in enumerate(entries, start=1 + scan) if i not in mode_positions),
        out_axes.value, remat[1] if remat else None, metadata,
        self.code(kwargs['axis_name']) if 'axis_name' in kwargs else None,
        tuple(sorted(s for s, v in split.items() if v.value == 'True')))
    return target.value

  def _plan_control_flow(self, node: cst.ClassDef) -> set[cst.CSTNode]:
    """`nn.cond(pred, f, g, self, *xs)` / `nn.switch(i, branches, self, *xs)` -> nnx.cond / nnx.switch with the
    same arguments (each branch gets the module, as in Linen); `nn.while_loop(cond_fn, body_fn, self, init)` ->
    nnx.while_loop over `(self, init)`. Returns the Linen names converted."""
    converted = set()
    for call in descendants(node):
      if not (isinstance(call, cst.Call) and isinstance(call.func, (cst.Name, cst.Attribute))):
        continue
      names = {q.name for q in self.facts.qualified_names(call.func)}
      kind = next((CONTROL_FLOW[n] for n in names if n in CONTROL_FLOW), None)
      if kind is None:
        continue
      target, at = kind
      func = self.facts.code(call.func)
      positional = [a.value for a in call.args if a.keyword is None and not a.star]
      options = {a.keyword.value for a in call.args if a.keyword is not None}
      loop = target == 'nnx.while_loop'
      if any(a.star for a in call.args) or options - set(WHILE_OPTIONS if loop else ()) \
          or len(positional) <= at or (loop and len(positional) != 4) \
          or not (isinstance(positional[at], cst.Name) and positional[at].value == 'self'):
        accepted = f' (and {", ".join(WHILE_OPTIONS)}, which NNX does not need)' if loop else ''
        raise Unsupported(call, f'{func}(...) is converted with its arguments by position, self as the module'
                                 f'{accepted}')
      for branch in positional[1:at]:
        self._check_branch(branch, func)
      if loop:
        self.plan.while_loops.add(call)
        dropped = f'; {", ".join(sorted(options))} dropped (NNX carries every Variable)' if options else ''
        self.plan.pending.append((call, f'{func}(cond_fn, body_fn, self, init) -> nnx.while_loop over (self, init), '
                                    f'the functions still given the module{dropped}'))
      else:
        self.plan.exprs[call.func] = target
        self.plan.pending.append((call, f'{func}(...) -> {target}(...): the same arguments, each branch given the module'))
      converted.add(call.func)
    return converted

  def _check_branch(self, branch: cst.BaseExpression, func: str) -> None:
    """A branch of lifted control flow: a lambda or function (or a list of them) that uses its module argument
    only through attributes other than Linen's scope APIs, and no Linen name outside this class."""
    if isinstance(branch, (cst.List, cst.Tuple)):
      for element in branch.elements:
        self._check_branch(element.value, func)
      return
    function = branch
    if isinstance(branch, cst.Name):
      scope = self.facts.scope(branch)
      assignments = list(scope[branch.value]) if scope is not None else []
      if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
        raise Unsupported(branch, f'a {func} branch bound more than once, or not in this file')
      function = assignments[0].node
      target = self.facts.parent(function)
      assign = self.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
      if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
        return self._check_branch(assign.value, func)
      if not isinstance(function, cst.FunctionDef):
        raise Unsupported(branch, f'a {func} branch that is not a function of this file')
      if isinstance(self.facts.parent(function), cst.Module) and any(
          self._nnx_name_for_or_none(sub) is None and self.facts.is_linen_name(sub) for sub in descendants(function)):
        raise Unsupported(branch, f'the {func} branch {branch.value} (outside the class) uses Linen names')
    if not isinstance(function, (cst.Lambda, cst.FunctionDef)) or not function.params.params:
      raise Unsupported(branch, f'a {func} branch other than a lambda or function taking the module first')
    module = function.params.params[0].name.value
    for sub in descendants(function.body):
      if isinstance(sub, cst.Attribute) and isinstance(sub.value, cst.Name) and sub.value.value == module \
          and sub.attr.value in SCOPE_APIS:
        raise Unsupported(sub, f'{module}.{sub.attr.value} in a {func} branch (variables created or read through '
                                'Linen scope APIs)')

  def _rematted_class(self, lifted: cst.Call) -> str | None:
    """`Block` for `nn.remat(Block, prevent_cse=..., policy=..., static_argnums=<int or tuple of ints>)` (or
    nn.checkpoint), or `nn.jit(Block, static_argnums=..., donate_argnums=...)`, over a Linen class of this file,
    recording the NNX transform and its options; None for any other call. Other options (`variables=`, `rngs=`,
    `concrete=`, `methods=`, ...): a TODO."""
    for kind, (names, transform, _, _) in WRAPPING.items():
      positional = self._lifted_class(lifted, names)
      if positional is None:
        continue
      sibling = self.converted.get(positional[0].value)
      options = self._wrapping_options(lifted, sibling, kind) if sibling is not None else None
      outer = self.facts.parent(lifted)
      if options is not None and isinstance(outer, cst.Call) and outer.func is lifted:
        self.plan.remats[outer] = options
      return positional[0].value
    return None

  def _wrapping_options(self, lifted: cst.Call, sibling: ClassRewrite, kind: str, under: str = '') -> tuple[str, str]:
    """The NNX transform (`nnx.remat`) and its options for `nn.remat(Block, ...)` / `nn.jit(Block, ...)`,
    static_argnums renumbered for the train/eval arguments the NNX call drops. Linen counts `self` as argument 0
    of __call__, as the NNX transform counts the module given first: otherwise the same numbers. `under` an
    nnx.scan / nnx.vmap, no static argument may remain (traced there)."""
    _, transform, accepted, _ = WRAPPING[kind]
    kwargs = {a.keyword.value: a.value for a in lifted.args if a.keyword is not None}
    func, name = self.facts.code(lifted.func), sibling.name
    given = ', '.join(f'{k}={self.facts.code(v)}' for k, v in kwargs.items())
    numbers = {k: self._literal_ints(v) for k, v in kwargs.items() if k.endswith('argnums')}
    if any(a.star for a in lifted.args) or set(kwargs) - set(accepted) or None in numbers.values():
      raise Unsupported(lifted, f'{func}({name}, {given}) is converted only with the options '
                                 f'{", ".join(accepted)} (argnums literal), which {transform} takes')
    for value in kwargs.values():
      self.check_hoistable(value)
    codes = {k: self.code(kwargs[k], {}) for k in accepted if k in kwargs}
    modes = {i + 1 for i, _, _ in sibling.mode_params}
    for key, given_numbers in numbers.items():
      kept = [n - sum(m < n for m in modes) for n in given_numbers if n not in modes]
      if under and kept and key == 'static_argnums':
        raise Unsupported(lifted, f'{func}({name}, {given}) under nn.{under}: static arguments other than '
                                   f'train/eval switches (traced inside nnx.{under})')
      del codes[key]
      if kept:
        codes[key] = f'({", ".join(map(str, kept))},)'
    return transform, ', '.join(f'{k}={v}' for k, v in codes.items())

  def _remat_call(self, call: cst.Call, child: Child) -> None:
    """A call of a rematted submodule: positional arguments only, nnx.remat runs it."""
    if any(a.keyword is not None or a.star for a in call.args):
      raise Unsupported(call, f'a {child.remat[0]}-wrapped submodule called with keyword or starred arguments '
                               '(converted: positional)')
    self.plan.remat_calls[call] = child
    transform, options = child.remat[0], f' ({child.remat[1]})' if child.remat[1] else ''
    effect = 'its activations recomputed in the backward pass' if transform == 'nnx.remat' else 'compiled on its own'
    self.plan.pending.append((call, f'the {transform.partition(".")[2]}-wrapped submodule self.{child.attr} called through '
                                f'{transform}{options}: {effect}, as in Linen'))

  def _scan_local(self, method: cst.FunctionDef, ctor: cst.Call) -> tuple[cst.Call, list[cst.Name]]:
    """`rnn = nn.scan(Cell, ...)(...)` in the @nn.compact method: the statement goes (the cell is built in
    __init__), `rnn.<method>` reads the attribute; returns the one call `rnn(carry, x)`."""
    if self._bound_local(method, ctor) is None:
      if ctor in self.plan.remats:
        raise Unsupported(ctor, 'an nn.remat submodule neither called where it is built nor bound by '
                                 '`name = nn.remat(...)(...)`')
      raise Unsupported(ctor, 'an nn.scan cell neither called where it is built nor bound by `name = nn.scan(...)(...)`')
    kind = 'rematted submodule' if ctor in self.plan.remats else 'scanned cell'
    calls, names = self._local_uses(method, ctor, kind)
    if len(calls) != 1:
      raise Unsupported(ctor, f'the {kind} {self._bound_local(method, ctor).value} is called {len(calls)} times '
                               '(converted: once)')
    return calls[0], names

  def _stack_call(self, call: cst.Call, child: Child) -> None:
    """A call of stacked copies: every argument by position (for scan, `(carry, *xs)`); nnx.scan runs the layers
    in turn, nnx.vmap the ensemble's members side by side."""
    stacked = child.stacked
    if any(a.keyword is not None or a.star for a in call.args) or len(call.args) != len(child.sibling.call_params):
      raise Unsupported(call, f'nn.{stacked.transform} copies called other than with all of {child.sibling.name}\'s '
                               'arguments by position')
    self.plan.stack_calls[call] = child
    remat = '' if stacked.remat is None else (
        f', each rematerialised (nnx.remat{f"({stacked.remat})" if stacked.remat else ""})')
    unsplit = '' if 'dropout' in stacked.split or not draws_rngs(child.sibling) else (
        f'; split_rngs names only {", ".join(stacked.split)}: no other rng stream reached the Linen copies (a dropout '
        'in train mode failed there), NNX splits every stream per copy')
    run = 'nnx.scan, one layer after the other' if stacked.transform == 'scan' else 'nnx.vmap, side by side'
    self.plan.pending.append((call, f'the nn.{stacked.transform} of {child.sibling.name} ({child.linen_name}) -> '
                                f'self.{child.attr}, {stacked.length} copies created by nnx.vmap over '
                                f'rngs.split({stacked.length}) (variables stacked on axis 0, as Linen\'s), run by '
                                f'{run}{remat}{unsplit}'))

  def _scan_call(self, call: cst.Call, child: Child) -> None:
    """A call of a scanned cell: `(carry, x)` by position, nnx.scan runs it."""
    if len(call.args) != 2 or any(a.keyword is not None or a.star for a in call.args):
      raise Unsupported(call, 'a scanned cell called other than as cell(carry, x)')
    self.plan.scan_calls[call] = child
    in_axis, out_axis = child.scan
    self.plan.pending.append((call, f'the nn.scan call {self.facts.code(call.func)}(...) -> nnx.scan over '
                                f'self.{child.attr}, the cell broadcast to every step (its params are shared): '
                                f'in_axes=(None, nnx.Carry, {in_axis}), out_axes=(nnx.Carry, {out_axis})'))
