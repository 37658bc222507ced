"""Layers built in `for` loops, for rule L2N002.

An `@nn.compact` loop over `range(<fields, config, literals>)`, `enumerate(<field>)`, a field
(`for f in self.features[:-1]:`) or `zip(<fields>)` (`for a, b in zip(...)`, `for i, (a, b) in
enumerate(zip(...))`) whose body is simple statements and `if`s of them, constructing table layers or
classes of the file called where they are built (`x = nn.Dense(f)(x)`), becomes one `nnx.List`
attribute per construction site, built in `__init__` by a list comprehension over the same
iterator, and the same loop in `__call__` indexing it (`x = self.linears[i](x)`; the loop gets an
index through `enumerate` when it has none). A construction under an `if` is built where the tests of
its arms hold (`conditions.py`, evaluated in the comprehension) and is None in the other iterations;
the `if`s are walked arm by arm for sizes.

Sizes: the planner's size walk goes through the body twice, first with what the code says
before the loop (the first iteration), then with what the first pass left, shifted back one iteration (`f` -> `S[i - 1]`,
`i` -> `(i - 1)`): the later iterations. A size the two passes agree on is used for every
element; else `<first> if i == 0 else <later>`, a first size the code does not fix becoming a
constructor argument. A later size the code cannot express (an input that grows every iteration)
keeps the class Linen. After the loop a name has its last iteration's size (`S[-1]`), the loop
assumed to run at least once.

Linen names: auto-named layers count across iterations (`Dense_0`, `Dense_1`, ...: `Dense_{i}`, or
`Dense_{2 * i + 1}` for the second of two per iteration) and shift the ones after the loop;
`name=f'layer_{i}'` gives `layer_{i}` (the attribute: `layers`). Conditional ones count only the
iterations that built one: their names are left to the call order (`LayerNorm_{number built before}`).

setup() lists: `self.layers = [nn.Dense(f) for f in self.features]`, or `layers = []`, `for f in ...:
layers.append(nn.Dense(f))`, `self.layers = layers` (Linen's `layers_0`, `layers_1`, ...; the loop may bind locals
first, the layer among them, whose values are written into the comprehension: diffusers' blocks; one loop may fill
several lists, which `for a, b in zip(self.a, self.b):` walks together), become
`nnx.List([...])`, sized by walking the `for layer in self.layers:` loops of `__call__` as above (their
body may hold `if`s of simple statements not using the layer, as transformers' layer collections do), or
`for n in range(...): self.layers[n](...)` (Bloom: iteration k calls layer k); any other use of the list
(`self.layers[-1]`, a slice) keeps the class Linen. A list written out (`self.layer = [A(...), A(...)]`,
`element_lists.py`) is used the same way; its loops are walked once per element (`unrolled`). A list's `name=str(i)`
(transformers': Linen's `0`, `1`, ...) or `name=f'block_{i}'` goes; Linen's names are recorded.
"""

from __future__ import annotations

import re
import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.report import ChildName
from codemods.rules.l2n002 import constructions, queries, sizes
from codemods.rules.l2n002.conditions import construction_conditions
from codemods.rules.l2n002.dims import Dim, Known
from codemods.rules.l2n002.loop_headers import (
    Loop, Site, appended, carried, check_head_names, empty_list, enclosing, is_builtin, lists_before,
    loop_header, loop_locals_read_after, pair, paren, setup_name, unbalanced, wrapped, written_out, zipped_names,
)
from codemods.rules.l2n002.nodes import assigned_name, is_plain_if, is_written, may_hold_modules
from codemods.rules.l2n002.plan import Child, ClassRewrite, Unsupported

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.context import ClassContext
LOOP_STOPS = (cst.Break, cst.Continue, cst.Return, cst.Yield, cst.Await)


class Loops:
  """The loops of the class being converted; the planner's hooks call into it."""

  def __init__(self) -> None:
    self.loops: dict[cst.For, Loop] = {}
    self.sites: dict[cst.Call, Site] = {}
    self.refs: set[cst.Name] = set()  # loop names read in constructor arguments: valid in the comprehension
    self._empty: set[cst.BaseStatement] = set()  # `layers = []` of a setup() list built by appending
    self._heads: dict[cst.Call, list[cst.Call]] = {}  # a setup() list's appended layer -> the layers written out
    # before its loop
    self._appends: dict[cst.Name, tuple[cst.For, cst.Call]] = {}  # `layers` of `self.layers = layers` -> the loop
    # appending to it, and the layer it appends
    self._setup_loops: dict[cst.For | cst.CompFor, Loop] = {}  # a setup() list's loop: one for the lists it fills
    self.unrolled: dict[cst.For, Child] = {}  # a loop over a setup() list written out -> the list's first element
    self._walked_heads: dict[cst.For, list[cst.Call]] = {}  # a method loop over a setup() list -> the layers written
    # out before the list's loop that it walks first

  # --- planning --------------------------------------------------------------------------------

  def plan(self, ctx: ClassContext, statement: cst.For, built: set[cst.Call]) -> None:
    """Checks a for loop of the @nn.compact body and registers it; raises Unsupported with why not."""
    fail = lambda node, why: Unsupported(node, f'a for loop {why}')
    ctors = [c for c in descendants(statement.body) if c in built]
    if statement.orelse is not None or statement.asynchronous is not None:
      raise fail(statement, 'with an else or async for')
    if any(isinstance(s, cst.For) for s in statement.body.body):
      raise fail(statement, 'holding a nested for loop (layers built in nested loops, an nnx.List of nnx.Lists, are '
                            'not converted yet)')
    blocks = [s for s in statement.body.body if not isinstance(s, cst.SimpleStatementLine)]
    for block in blocks:  # `if self.max_pool: hidden = nn.max_pool(hidden, ...)`: plain code, walked arm by arm
      if not (isinstance(block, cst.If) and is_plain_if(block)):
        raise fail(block, 'whose body holds blocks other than conditionals (while, with, try): only simple statements '
                          'and ifs of them in a loop are converted')
    for sub in descendants(statement.body):
      if isinstance(sub, LOOP_STOPS):
        raise fail(sub, f'holding {type(sub).__name__.lower()}: the number of iterations must be its iterator\'s')
      if isinstance(sub, cst.Call) and isinstance(sub.func, cst.Attribute) and isinstance(sub.func.value, cst.Name) \
          and sub.func.value.value == 'self' and sub.func.attr.value in ('param', 'variable', 'sow', 'make_rng',
                                                                         'has_variable', 'is_initializing'):
        raise fail(sub, f'calling self.{sub.func.attr.value}: NNX creates variables and rng streams in __init__; '
                        'move it out of the loop or write the NNX code by hand')
    methods = _class_methods(ctx, statement)
    for sub in descendants(statement.body):
      if isinstance(sub, cst.Call) and isinstance(sub.func, cst.Attribute) and isinstance(sub.func.value, cst.Name) \
          and sub.func.value.value == 'self' and sub.func.attr.value in methods:
        raise fail(sub, f'calling self.{sub.func.attr.value}(), which may build layers in every iteration')
    loop = loop_header(ctx, statement, bool(ctors))
    assigned = {n.value for n in descendants(statement.body)  # bound, not read in a target (`modules[m] = ...`)
                if isinstance(n, cst.Name) and is_written(n, ctx.facts.parent)}
    if assigned & loop.names:
      raise fail(statement, f'assigning its loop variable {sorted(assigned & loop.names)[0]}')
    for ctor in ctors:
      parent = ctx.facts.parent(ctor)
      if not (isinstance(parent, cst.Call) and parent.func is ctor) and _bound_call(ctx, statement, ctor) is None:
        raise fail(ctor, 'building a submodule not called where it is built (bind it outside the loop, or call it '
                         'at once)')
      loop.sites.append(Site(loop, ctor))
      self.sites[ctor] = loop.sites[-1]
    ctx.plan.branches.update(b for block in blocks for b in (block, *descendants(block)) if isinstance(b, cst.If))
    if ctors:
      self.refs |= {n for n in descendants(statement.body) if isinstance(n, cst.Name) and n.value in loop.names}
      building = [block for block in blocks if any(sub in built for sub in descendants(block))]
      self._body_locals(ctx, statement, ctors, [b.test for block in building for b in (block, *descendants(block))
                                                if isinstance(b, cst.If)])
      for block in building:  # `if self.layer_norm: hidden = nn.LayerNorm()(hidden)`: an element where the test holds
        for ctor, condition in construction_conditions(ctx, block, built).items():
          self.sites[ctor].condition = condition
      try:
        queries.check_hoistable(ctx, loop.sequence if loop.sequence is not None else loop.count)
      except Unsupported:
        raise fail(statement.iter, f'over {ctx.facts.code(statement.iter)}, which __init__ cannot '
                                   'evaluate (it uses an input or a local): NNX builds the layers in __init__') from None
    self.loops[statement] = loop

  def _body_locals(self, ctx: ClassContext, statement: cst.For, ctors: list[cst.Call], tests: list[cst.CSTNode]) -> None:
    """`strides = (2, 2) if i > 0 else (1, 1)` in the loop body, read by a construction or by the test of a
    conditional around one (`tests`), directly or through other such locals (brax's `is_last = i == n - 1`, then
    `ki = ... if is_last else ...`): its value is written into the comprehension in __init__ (the statement goes
    when only constructions and statements that go read it)."""
    method = enclosing(ctx, statement, cst.FunctionDef)
    bound: dict[str, list[cst.CSTNode]] = {}
    for sub in descendants(method):
      for target in (getattr(sub, 'target', None),) if isinstance(sub, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign,
                                                                         cst.For, cst.CompFor, cst.NamedExpr)) else ():
        for name in (target, *descendants(target)):
          if isinstance(name, cst.Name):
            bound.setdefault(name.value, []).append(sub)
    lines = list(statement.body.body)
    local = {line: name for line in lines if (name := assigned_name(line)) is not None and len(bound[name]) == 1}
    reads = {line: [n for n in descendants(statement.body) if isinstance(n, cst.Name) and n.value == name
                    and n is not line.body[0].targets[0].target
                    and not (isinstance(ctx.facts.parent(n), cst.Attribute) and ctx.facts.parent(n).attr is n)]
             for line, name in local.items()}
    built = {n for ctor in ctors for n in descendants(ctor)}
    needed = built | {n for test in tests for n in (test, *descendants(test))}
    goes = set(built)  # read here, a local can go: these move to __init__
    for line in reversed(lines):  # the locals read where code moves to __init__, and through them, theirs
      if line in local and any(n in needed for n in reads[line]):
        value = {n for n in descendants(line.body[0].value)}
        needed |= value
        if all(n in goes for n in reads[line]):
          goes |= value
    for line in lines:
      if line not in local:
        continue
      used = [n for n in reads[line] if n in needed]
      later = {n for l in lines[lines.index(line) + 1:] for n in descendants(l)}
      if not used or any(n not in later for n in used):
        continue
      value = line.body[0].value
      try:
        queries.check_hoistable(ctx, value)
      except Unsupported:
        continue  # it reads an input or another local: the construction's own check refuses it
      code = queries.code(ctx, value)
      for node in used:
        self.refs.add(node)
        ctx.plan.aliases[node] = code if re.fullmatch(r'[\w.]+', code) or wrapped(code) else f'({code})'
      if all(n in goes and n in later for n in reads[line]):
        ctx.plan.removed.add(line)

  def setup_append(self, ctx: ClassContext, statement: cst.BaseStatement, setup: cst.FunctionDef) -> bool:
    """`layers = []`, `for f in <iterator>: layers.append(<layer>)`, `self.layers = layers` in setup(): the first two
    statements go (their list becomes the nnx.List of the third); True for them, False for any other statement.
    One loop may fill several lists, each started just before it, empty or written out (diffusers' `resnets = []`,
    `attentions = []`, then one append to each per iteration; its mid blocks' `resnets = [FlaxResnetBlock2D(...)]`)."""
    if statement in self._empty or any(statement is loop for loop, _ in self._appends.values()):
      return True
    name, heads = empty_list(statement), []
    if name is None and (written := written_out(ctx, statement)) is not None:  # `layers = [Layer(..., name="0")]`
      name, heads = written
    if name is None or not may_hold_modules(setup, name):  # jax-md's `expand_index = []` of ints: plain code
      return False
    body = list(setup.body.body)
    after = body[body.index(statement) + 1:]
    while after and (empty_list(after[0]) is not None or written_out(ctx, after[0]) is not None):
      after = after[1:]  # `attentions = []` between it and its loop
    loop = after[0] if after else None
    ctor = appended(loop, name, lists_before(ctx, body, loop))
    uses = [n for n in descendants(setup.body) if isinstance(n, cst.Name) and n.value == name
            and not (isinstance(ctx.facts.parent(n), cst.Attribute) and ctx.facts.parent(n).attr is n)]
    stores = [s for s in body if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
              and isinstance(s.body[0], cst.Assign) and isinstance(s.body[0].value, cst.Name)
              and s.body[0].value.value == name]
    if ctor is None or len(uses) != 3 or len(stores) != 1 or constructions.constructed(ctx, ctor) is None \
        or loop_locals_read_after(loop, setup) or carried(loop, setup, ctor):
      if heads:  # another shape (diffusers' mid blocks: the loop fills a second list): the statement's own blocker
        return False
      raise Unsupported(statement, f'a setup() list {name} other than `{name} = []`, then `for x in <iterator>: '
                                   f'{name}.append(<layer>(...))` (the layer may be bound to a local first, beside '
                                   f'locals of fields and the loop), then `self.<attr> = {name}`')
    self._empty.add(statement)
    self._appends[stores[0].body[0].value] = (loop, ctor)
    if heads:
      self._heads[ctor] = heads
    ctx.plan.removed.update((statement, loop))
    return True

  def list_heads(self, value: cst.BaseExpression | None) -> list[cst.Call]:
    """The layers written out before the loop appending to the list of `self.<attr> = <list>` (none for others)."""
    return self._heads.get(self._appends[value][1], []) if isinstance(value, cst.Name) and value in self._appends else []

  def appended(self, ctx: ClassContext, value: cst.BaseExpression, attr: str) -> cst.Call | None:
    """The layer a `self.<attr> = <list>` of `setup_append`'s pattern builds, registered as a setup() list."""
    if not isinstance(value, cst.Name) or value not in self._appends:
      return None
    loop_node, ctor = self._appends[value]
    self._setup_site(ctx, ctor, loop_node, value, attr, 'a loop', len(self._heads.get(ctor, ())))
    check_head_names(ctx, self._heads.get(ctor, []), self.sites[ctor], attr)
    loop = self.sites[ctor].loop  # `in_channels = self.in_channels if i == 0 else ...` read by the layer: inlined
    self.refs |= {n for n in descendants(loop_node.body) if isinstance(n, cst.Name) and n.value in loop.names}
    self._body_locals(ctx, loop_node, [ctor], [])
    return ctor

  def setup_list(self, ctx: ClassContext, value: cst.ListComp, attr: str) -> cst.Call:
    """`self.layers = [nn.Dense(f) for f in self.features]` in setup(): registers the construction; returns it."""
    comp = value.for_in
    if comp.inner_for_in is not None or comp.ifs or comp.asynchronous is not None:
      raise Unsupported(value, f'self.{attr}: a list comprehension with several for clauses or an if '
                                    '(converted: `[<layer>(...) for x in <iterator>]`)')
    ctor = value.elt
    if not isinstance(ctor, cst.Call) or constructions.constructed(ctx, ctor) is None:
      raise Unsupported(value, f'self.{attr}: a list of other than table layers or classes of this file')
    return self._setup_site(ctx, ctor, comp, value, attr, 'a list comprehension')

  def _setup_site(self, ctx: ClassContext, ctor: cst.Call, loop_node: cst.For | cst.CompFor, value: cst.BaseExpression, attr: str,
                  what: str, heads: int = 0) -> cst.Call:
    """Registers the construction of a setup() list built by `loop_node` (a for loop or a comprehension), after
    `heads` layers written out."""
    name = next((a.value for a in ctor.args if a.keyword is not None and a.keyword.value == 'name'), None)
    if loop_node not in self._setup_loops:
      self._setup_loops[loop_node] = loop_header(ctx, loop_node, False)
    loop = self._setup_loops[loop_node]
    loop.sites.append(Site(loop, ctor, setup_name(ctx, ctor, name, loop, attr, heads) if name is not None else None,
                           setup_attr=attr, comprehension=value))
    self.sites[ctor] = loop.sites[-1]
    self.refs |= {n for n in descendants(ctor) if isinstance(n, cst.Name) and n.value in loop.names}
    try:
      queries.check_hoistable(ctx, loop.sequence if loop.sequence is not None else loop.count)
    except Unsupported:
      raise Unsupported(loop_node.iter, f'self.{attr}: {what} over {ctx.facts.code(loop_node.iter)}, '
                                             'which __init__ cannot evaluate') from None
    return ctor

  def list_use(self, ctx: ClassContext, sub: cst.Attribute, child: Child, calls: dict[cst.Call, Child]) -> bool:
    """`self.layers` of a setup() list in a method: `for layer in self.layers:` (or `enumerate(...)`) calling
    `layer(...)`, whose calls join `calls` and whose loop is walked as a loop of the list, or `len(self.layers)`.
    False for other children."""
    site = self.sites.get(child.ctor)
    if site is None and child.element is None or child.hoisted:
      return False
    parent, element = ctx.facts.parent(sub), None
    if isinstance(parent, cst.Subscript) and ctx.facts.parent(parent) in calls:
      return True  # `self.layer[k](...)` of a list written out: its element's call (element_lists.indexed_calls)
    heads = self._heads.get(child.ctor, []) if site is not None else []
    if heads and _skips(parent, sub, len(heads)) and isinstance(ctx.facts.parent(parent), cst.Arg):
      sub, parent = parent, ctx.facts.parent(parent)  # `zip(self.attentions, self.resnets[1:])`: the appended ones
      heads = []
    if isinstance(parent, cst.Arg) and isinstance(ctx.facts.parent(parent), cst.Call) \
        and is_builtin(ctx, ctx.facts.parent(parent).func, 'len') and len(ctx.facts.parent(parent).args) == 1:
      return True  # `len(self.layers)`: an nnx.List has the length of the Linen list
    if isinstance(parent, cst.Arg) and isinstance(ctx.facts.parent(parent), cst.Call) \
        and is_builtin(ctx, ctx.facts.parent(parent).func, 'enumerate') and len(ctx.facts.parent(parent).args) == 1:
      parent = ctx.facts.parent(ctx.facts.parent(parent))
      names = pair(parent.target) if isinstance(parent, cst.For) else None
      element = names[1] if names is not None else None
    elif isinstance(parent, cst.For) and parent.iter is sub and isinstance(parent.target, cst.Name):
      element = parent.target.value
    elif site is not None and isinstance(parent, cst.Arg) and (zipped := _zipped_list(ctx, sub, parent)) is not None:
      parent, element = zipped  # `for resnet, attn in zip(self.resnets, self.attentions):` (diffusers)
      if heads:
        raise Unsupported(sub, f'self.{child.attr} (a list of layers, {len(heads)} written out before its loop) '
                               f'zipped whole: zip self.{child.attr}[{len(heads)}:], the layers its loop appends')
      if self.loops.get(parent, site.loop) is not site.loop:
        raise Unsupported(sub, f'self.{child.attr} (a list of layers) zipped with a list another loop builds')
    elif site is not None and (indexed := _indexed_call(ctx, sub)) is not None:  # `self.layers[n](...)` (Bloom)
      parent, call = indexed
      element = ''
      calls[call] = child
    used = f'self.{child.attr} (a list of layers)'
    if element is None or parent.orelse is not None:
      raise Unsupported(sub, f'{used} used other than by `for layer in self.{child.attr}:`')
    blocks = [s for s in parent.body.body if not isinstance(s, cst.SimpleStatementLine)]
    # plain ifs are walked arm by arm for sizes; the layer may be called in them (transformers' LayerDrop:
    # `if not deterministic and p < self.layerdrop: layer_outputs = (None, None)`, `else: ... = layer(...)`)
    if any(not (isinstance(s, cst.If) and is_plain_if(s)) for s in blocks) \
        or any(isinstance(n, LOOP_STOPS) for n in descendants(parent.body)):
      raise Unsupported(parent, f'a for loop over {used} with nested blocks other than ifs of simple statements, '
                                'or with break, continue or return')
    for block in blocks:  # `if output_attentions: all_attentions += (out[1],)` (transformers): walked arm by arm
      ctx.plan.branches.update([block, *(s for s in descendants(block) if isinstance(s, cst.If))])
    for name in descendants(parent.body):
      if isinstance(name, cst.Name) and name.value == element:
        call = ctx.facts.parent(name)
        if not (isinstance(call, cst.Call) and call.func is name):
          raise Unsupported(name, f'the layer {element} of {used} used other than by calling it')
        calls[call] = child
    if site is None:  # a list written out (`element_lists.py`): the loop is walked once per element
      self.unrolled[parent] = child
    else:
      self.loops[parent] = site.loop
      self._walked_heads.setdefault(parent, []).extend(h for h in heads if h not in self._walked_heads[parent])
    return True

  def walked_heads(self, statement: cst.For) -> list[cst.Call]:
    """The layers written out before a setup() list's loop that the method loop `statement` walks before the
    appended ones (`for stage in self.stages:`; none over `self.resnets[1:]`)."""
    return self._walked_heads.get(statement, [])

  def list_name(self, ctx: ClassContext, ctor: cst.Call, name: cst.BaseExpression | None) -> str | None:
    """The attribute of a loop construction's `name=f'layer_{i}'` (`layers`); None outside loops or without name=."""
    site = self.sites.get(ctor)
    if site is None or name is None:
      return None
    if site.setup_attr is not None:  # named by `self.<attr> = [...]`; its name= gave `site.pattern`
      return site.setup_attr
    if not isinstance(name, cst.FormattedString) or not name.parts \
        or not isinstance(name.parts[0], cst.FormattedStringText):
      raise Unsupported(ctor, 'a submodule built in a loop with a name= other than an f-string with a literal '
                                   "start (f'layer_{i}'): each iteration needs its own name")
    prefix = name.parts[0].value.rstrip('_')
    if not prefix.isidentifier() or len(name.parts) == 1:
      raise Unsupported(ctor, f"a submodule built in a loop named {ctx.facts.code(name)}: the "
                                   'converted name is its literal start, which is not an identifier')
    site.pattern = ctx.facts.code(name)[len(name.start):-len(name.end)]
    attr = plural(prefix)
    taken = set(_class_methods(ctx, ctor)) | _class_fields(ctx, ctor) | {'rngs'}
    while attr in taken:
      attr += '_'
    return attr

  def plural(self, child: Child, base: str) -> str:
    """The attribute base name of an auto-named child: a list's is plural (`linears`)."""
    return plural(base) if child.ctor in self.sites else base

  def after_calls(self, ctx: ClassContext, plan: ClassRewrite, calls: dict[cst.Call, Child]) -> None:
    """Once children are named: refuses kinds not converted in loops, indexes the calls, fixes Linen names."""
    listed = [c for c in plan.children if c.ctor in self.sites]
    for child in listed:
      kind = ('an nn.scan, nn.remat, nn.jit or nn.vmap' if child.scan or child.remat or child.stacked else
              f'a {child.wrapper.linen}' if child.wrapper is not None else
              'a Linen class wrapped with nnx_bridge.from_linen' if child.bridged else
              None)
      if kind is not None:
        raise Unsupported(child.ctor, f'{kind} built in a for loop is not converted')
    called = {child.ctor for child in calls.values()}
    for child in listed:
      if child.ctor not in called and not child.alternative:  # an alternative takes the sizes of its first
        raise Unsupported(child.ctor, f'self.{child.attr} (a list of layers) is never called as `for layer in '
                                           f'self.{child.attr}: ... layer(...)`, so its sizes cannot be derived')
    for call, child in calls.items():
      site = self.sites.get(child.ctor)
      if site is not None and child.hoisted:
        ctx.plan.calls[call] = (f'{child.attr}[{site.loop.index}]', ctx.plan.calls.get(call, (None, set()))[1])
    loops = list(dict.fromkeys(self.sites[c.ctor].loop for c in listed))
    for loop in loops:  # the iterator in __init__, without the rewrite of the loop's own header
      rewritten = ctx.plan.exprs.pop(loop.node.iter, None)
      loop.sequence_code = queries.code(ctx, loop.sequence if loop.sequence is not None else loop.count)
      loop.zipped_code = {name: queries.code(ctx, sequence) for name, sequence in loop.zipped}
      sequence = loop.sequence
      if isinstance(sequence, cst.Call) and is_builtin(ctx, sequence.func, 'range') and len(sequence.args) == 2 \
          and all(a.keyword is None and not a.star for a in sequence.args):
        loop.stop = queries.code(ctx, sequence.args[1].value)
      if rewritten is not None:
        ctx.plan.exprs[loop.node.iter] = rewritten
    if listed:
      self._linen_names(plan)
    for child in listed:
      if not child.hoisted:  # a setup() list: Linen names its layers after the attribute, or as their name= says
        site = self.sites[child.ctor]
        child.linen_name = site.pattern or f'{child.attr}_{{{site.loop.index}}}'
        for head in plan.children:  # the layers written out before the loop: elements of the same list
          if head.ctor in self._heads.get(child.ctor, ()):
            head.linen_name = child.linen_name
        if any(c.ctor is child.ctor for c in listed[:listed.index(child)]):  # another class it may build there
          continue
        first, second = (child.linen_name.replace(f'{{{site.loop.index}}}', str(k)) for k in (0, 1))
        ctx.plan.pending.append((child.ctor, f'self.{child.attr}: a list of layers -> nnx.List (Linen names them '
                                          f'{first}, {second}, ...)'))
    for loop in loops:
      if any(site.comprehension is not None for site in loop.sites):  # a setup() list: reported above
        continue
      attrs = ', '.join(f'self.{c.attr}' for c in listed if self.sites[c.ctor].loop is loop)
      ctx.plan.pending.append((loop.node, f'the layers built in this loop -> nnx.List attributes {attrs}, built in '
                                       f'__init__ over the same iterator; the loop indexes them with {loop.index}'))

  def _linen_names(self, plan: ClassRewrite) -> None:
    """Linen's names of the auto-named children, counted across the iterations of loops."""
    fixed: dict[str, int] = {}
    extra: dict[str, list[str]] = {}
    done: set[Loop] = set()
    for child in plan.children:
      if not child.hoisted or child.api is not None or any(
          a.keyword is not None and a.keyword.value == 'name' for a in child.ctor.args):
        if child.ctor in self.sites and self.sites[child.ctor].pattern is not None:
          child.linen_name = self.sites[child.ctor].pattern
        continue
      short = child.linen_name.rpartition('_')[0]
      site = self.sites.get(child.ctor)
      if site is None:
        if extra.get(short):
          child.linen_name = f'{short}_{{{_sum([*extra[short], str(fixed.get(short, 0))])}}}'
        fixed[short] = fixed.get(short, 0) + 1
        continue
      loop = site.loop
      if loop in done:
        continue
      done.add(loop)
      group: dict[str, list[Child]] = {}
      for other in plan.children:
        other_site = self.sites.get(other.ctor)
        if other_site is not None and other_site.loop is loop and other_site.pattern is None:
          group.setdefault(other.linen_name.rpartition('_')[0], []).append(other)
      for name, members in group.items():
        if any(self.sites[m.ctor].condition is not None for m in members):  # Linen counts only the ones built
          for member in members:
            member.linen_name = f'{name}_{{number built before}}'
          extra.setdefault(name, []).append('number built in the loop')
          continue
        base = [*extra.get(name, []), str(fixed.get(name, 0))]
        step = loop.index if len(members) == 1 else f'{len(members)} * {loop.index}'
        for j, member in enumerate(members):
          member.linen_name = f'{name}_{{{_sum([*base, step, str(j)])}}}'
        size = loop.length() if len(members) == 1 else f'{len(members)} * {paren(loop.length())}'
        extra.setdefault(name, []).append(size)

  def wrap(self, ctx: ClassContext, child: Child) -> str:
    """A loop child's constructor -> `nnx.List([<constructor> for <target> in <iterator>])`; others unchanged."""
    site = self.sites.get(child.ctor)
    if site is None:
      return child.text
    loop, text = site.loop, child.text
    if site.condition is not None:  # built in the iterations where the condition holds, None in the others
      text = f'{text} if {site.condition} else None'
    index, element = loop.uses(text, loop.index), loop.uses_element(text)
    if loop.sequence is None:
      header = f'{loop.index if index else "_"} in range({loop.sequence_code})'
    elif index and element:
      header = f'{loop.index}, {loop.element_target()} in enumerate({loop.sequence_code})'
    elif index:
      header = f'{loop.index} in range({loop.length()})'
    else:
      header = f'{loop.element_target() if element else "_"} in {loop.sequence_code}'
    if not child.hoisted:  # a setup() list: the comprehension becomes the nnx.List, after the layers written out
      heads = [c.text for ctor in self._heads.get(child.ctor, ()) for c in ctx.plan.children
               if c.ctor is ctor and not c.alternative]
      built = f'*[{text} for {header}]' if heads else f'{text} for {header}'
      ctx.plan.exprs[site.comprehension] = f'nnx.List([{", ".join([*heads, built])}])'
      return text
    return f'nnx.List([{text} for {header}])'

  def cache_line(self, child: Child, line: str) -> str:
    """init_cache's `self.blocks.init_cache(shape, dtype)` for a list: a loop calling each element's."""
    site = self.sites.get(child.ctor)
    if site is None:
      return line
    loop = site.loop
    if any(loop.uses(line, name) for name in (*loop.names, loop.index)):
      raise Unsupported(child.ctor, f'the {_class_name(None, child)} built in this loop holds a decode cache '
                                         'whose input shape changes with the iteration: init_cache cannot create it')
    element = child.attr[:-1] if child.attr.endswith('s') and child.attr[:-1].isidentifier() else 'layer'
    if element in (child.attr, 'self', 'input_shape', 'dtype'):
      element = 'layer'
    return f'for {element} in self.{child.attr}:\n    {element}.{line[len(f"self.{child.attr}."):]}'

  def shapes(self, statement: cst.For, env: dict[str, tp.Any], walk: tp.Callable[..., tp.Any]) -> None:
    """The loop in _plan_init_cache's walk of whole shapes: the first iteration, then the later ones (what the first
    left); a name keeps its shape after the loop when both agree and it uses no loop name."""
    loop = self.loops[statement]
    names = {n.value for n in (statement.target, *descendants(statement.target)) if isinstance(n, cst.Name)}
    start = {**env, **dict.fromkeys(names)}
    first = dict(start)
    walk(statement.body, first)
    second = {**first, **dict.fromkeys(names)}
    walk(statement.body, second)
    loop_names = (*names, *loop.names, loop.index)
    for name in {n for n in first if n not in names and first[n] != start.get(n)}:
      shape = first[name]
      same = second.get(name) == shape and shape is not None
      env[name] = shape if same and not any(loop.uses(part, n) for part in shape for n in loop_names) else None
    for name in names:
      env[name] = None

  # --- sizes -----------------------------------------------------------------------------------

  def seen(self, ctx: ClassContext, group: list[Child], node: cst.Call, arg_dims: list[Dim]) -> None:
    """A call of a loop child reached by _derive's walk (`group`: the child of each class its construction may
    build): recorded for `derive`, which sizes it."""
    site = self.sites[group[0].ctor]
    if site.loop.active:
      site.seen.append((node, arg_dims))
    else:
      for built in [c for c in group if not c.done]:
        built.done = True
        if any(not optional for _, _, optional in sizes.size_sources(ctx, built)):
          raise Unsupported(node, f'the sizes of the {_class_name(ctx, built)} built in a loop __call__ does not '
                                       'reach cannot be derived')

  def derive(self, ctx: ClassContext, plan: ClassRewrite, statement: cst.For, env: dict[str, Dim], derive: bool,
             walk: tp.Callable[[cst.BaseSuite, dict[str, Dim]], Dim], shared: dict[tp.Any, str]) -> None:
    """The loop in _derive's walk: two passes (the first iteration, the later ones), then each site's sizes."""
    loop = self.loops[statement]
    names = {n.value for n in (statement.target, *descendants(statement.target)) if isinstance(n, cst.Name)}
    start = {**env, **dict.fromkeys(names)}
    for site in loop.sites:
      site.seen = []
    loop.active = True
    try:
      first = dict(start)
      walk(statement.body, first)
      changed = {n for n in first if n not in names and first[n] != start.get(n)}
      later = {**start, **{n: loop.shift(first[n]) for n in changed}}
      second = dict(later)
      walk(statement.body, second)
    finally:
      loop.active = False
    unstable = {n for n in changed if not _same(second.get(n), first[n])}
    for site in loop.sites:
      self._size_site(ctx, plan, site, changed, unstable, derive, shared)
    for name in changed:
      env[name] = None if name in unstable or not derive else _known_after(loop, first[name])
    for name in names:
      env[name] = None

  def _size_site(self, ctx: ClassContext, plan: ClassRewrite, site: Site, changed: set[str], unstable: set[str], derive: bool,
                 shared: dict[tp.Any, str]) -> None:
    for child in [c for c in plan.children if c.ctor is site.ctor]:  # each class a local may name there
      self._size_child(ctx, plan, site, child, changed, unstable, derive, shared)

  def _size_child(self, ctx: ClassContext, plan: ClassRewrite, site: Site, child: Child, changed: set[str],
                  unstable: set[str], derive: bool, shared: dict[tp.Any, str]) -> None:
    if child.done:
      return
    if len(site.seen) != 2:
      raise Unsupported(site.ctor, f'the sizes of the {_class_name(ctx, child)} built in this for loop cannot be '
                                        'derived')
    child.done = True
    (node, first_dims), (_, later_dims) = site.seen
    varies = any(isinstance(n, cst.Name) and n.value in site.loop.names for a in site.ctor.args  # (name= aside)
                 if a.keyword is None or a.keyword.value != 'name' for n in (a.value, *descendants(a.value)))
    for nnx_arg, index, optional in sizes.size_sources(ctx, child):
      position = sizes.call_arg(ctx, node, child, index)
      if position is None and optional:
        continue
      first = first_dims[position] if position is not None else None
      later = later_dims[position] if position is not None else None
      reads = position is not None and any(isinstance(n, cst.Name) and n.value in changed
                                           for n in (node.args[position].value, *descendants(node.args[position].value)))
      why = (f'the input size {nnx_arg} of the {_class_name(ctx, child)} built in this for loop changes from one '
             'iteration to the next in a way the code does not express (write the NNX sizes by hand)')
      if _same(first, later) and (first is not None or not reads and not varies):  # (an unsaid size of layers
        #                                            built from the loop's names may differ from one to the next)
        child.sizes[nnx_arg] = self._first(ctx, plan, child, nnx_arg, first, node, position, shared, '')
      elif not derive:
        raise Unsupported(node, why)
      elif not isinstance(later, Known) or (unstable and reads):  # one size per element, the constructor's to give
        argument = ctx.facts.code(node.args[position].value) if position is not None else None
        where = None if argument is None else \
            f"the input dimension of self.{child.attr}'s call argument {argument}, which changes from one iteration " \
            'to the next in a way the code does not express'
        name = sizes.size_param(ctx, plan, child, nnx_arg, where, None, node, each=True,
                                offset=len(self._heads.get(site.ctor, ())))
        child.sizes[nnx_arg] = f'{name}[{site.loop.index}]'
      else:
        first_code = self._first(ctx, plan, child, nnx_arg, first, node, position, shared, ' in the first iteration')
        child.sizes[nnx_arg] = f'{first_code} if {site.loop.index} == 0 else {later.code}'

  def _first(self, ctx: ClassContext, plan: ClassRewrite, child: Child, nnx_arg: str, source: Dim, node: cst.Call,
             position: int | None, shared: dict[tp.Any, str], when: str) -> str:
    if isinstance(source, Known):
      return source.code
    key = source if source is not None else (child.attr, nnx_arg)
    if key not in shared:
      argument = ctx.facts.code(node.args[position].value) if position is not None else None
      where = None if argument is None else \
          f"the input dimension of self.{child.attr}'s call argument {argument}{when}"
      shared[key] = sizes.size_param(ctx, plan, child, nnx_arg, where, source, node)
    return shared[key]


def _zipped_list(ctx: ClassContext, sub: cst.Attribute, arg: cst.Arg) -> tuple[cst.For, str] | None:
  """`for a, b in zip(self.a, self.b):` (or `for i, (a, b) in enumerate(zip(...))`) over the list `sub`: the loop
  and the name its element takes, else None. Iteration k calls element k of each list, as Linen's loop did."""
  call = ctx.facts.parent(arg)
  outer = ctx.facts.parent(call)
  if isinstance(outer, cst.Arg):  # enumerate(zip(...))
    outer = ctx.facts.parent(ctx.facts.parent(outer))
  if not isinstance(outer, cst.For):
    return None
  zipped = zipped_names(ctx, outer.target, outer.iter)
  if zipped is None or zipped[2] is not call or not any(s is sub for s in zipped[3]):
    return None
  return outer, zipped[1][next(k for k, s in enumerate(zipped[3]) if s is sub)]


def _skips(subscript: cst.CSTNode, sub: cst.Attribute, count: int) -> bool:
  """Whether `subscript` is `<sub>[count:]`: the list without its `count` first layers."""
  if not (isinstance(subscript, cst.Subscript) and subscript.value is sub and len(subscript.slice) == 1
          and isinstance(subscript.slice[0].slice, cst.Slice)):
    return False
  part = subscript.slice[0].slice
  return isinstance(part.lower, cst.Integer) and int(part.lower.value) == count and part.upper is None \
      and part.step is None


def _indexed_call(ctx: ClassContext, sub: cst.Attribute) -> tuple[cst.For, cst.Call] | None:
  """`self.layers[n](...)` in the body of a `for n in range(...):` loop (transformers' Bloom): the loop and the call.
  Iteration k calls layer k, as `for layer in self.layers:` does; the loop's own range bounds it (an index past the
  list fails in NNX as in Linen). The index may also be a local the loop body binds once, at its top, to an index
  that is 0 in the first iteration (transformers' ALBERT shares layer groups: `group_idx = int(i / (layers /
  groups))`): the first iteration calls layer 0 and the others are first called later, so that each layer takes
  the size of the iteration that first calls it, as it does for Bloom."""
  subscript = ctx.facts.parent(sub)
  call = ctx.facts.parent(subscript) if isinstance(subscript, cst.Subscript) else None
  if not (isinstance(call, cst.Call) and call.func is subscript and subscript.value is sub
          and len(subscript.slice) == 1 and isinstance(subscript.slice[0].slice, cst.Index)
          and isinstance(subscript.slice[0].slice.value, cst.Name)):
    return None
  index = subscript.slice[0].slice.value.value
  loop = enclosing(ctx, call, cst.For)
  if not (isinstance(loop, cst.For) and isinstance(loop.target, cst.Name)
          and isinstance(loop.iter, cst.Call) and is_builtin(ctx, loop.iter.func, 'range')):
    return None
  assigned = [s for s in descendants(loop.body) if isinstance(s, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign))
              for n in (s.target, *descendants(s.target)) if isinstance(n, cst.Name) and n.value in (index, loop.target.value)]
  if index == loop.target.value:
    return None if assigned else (loop, call)
  top = [line for line in loop.body.body if assigned_name(line) == index]
  if len(assigned) != 1 or len(top) != 1 or not _zero_first(top[0].body[0].value, loop.target.value) \
      or loop.body.body.index(top[0]) > loop.body.body.index(_line_of(ctx, call, loop.body)):
    return None
  return loop, call


def _bound_call(ctx: ClassContext, loop: cst.For, ctor: cst.Call) -> cst.Call | None:
  """The one call of the local a statement of the loop's body binds to `ctor` (jax-md's `so2_m_conv =
  SO2MConv(...)`, then `x_m_r, x_m_i = so2_m_conv(x_m)`), when the local is bound nowhere else and read nowhere else,
  and no other layer is built between them (Linen numbers layers as they are built); else None."""
  line = ctx.facts.parent(ctx.facts.parent(ctor))
  if not (isinstance(line, cst.SimpleStatementLine) and line in loop.body.body and assigned_name(line) is not None
          and line.body[0].value is ctor):
    return None
  name = line.body[0].targets[0].target
  scope = ctx.facts.scope(name)
  assignments = list(scope.assignments[name.value]) if scope is not None and name.value in scope else []
  if len(assignments) != 1 or len(assignments[0].references) != 1:
    return None
  use = next(iter(assignments[0].references)).node
  call = ctx.facts.parent(use)
  if not (isinstance(call, cst.Call) and call.func is use):
    return None
  body = list(loop.body.body)
  later = next((s for s in body[body.index(line) + 1:] if ctx.facts.inside(call, s)), None)
  between = body[body.index(line) + 1:body.index(later) + 1] if later is not None else []
  built = [c for s in between for c in descendants(s) if isinstance(c, cst.Call) and c is not call
           and constructions.constructed(ctx, c) is not None]
  return call if later is not None and not built else None


def _line_of(ctx: ClassContext, node: cst.CSTNode, body: cst.BaseSuite) -> cst.CSTNode:
  """The statement of `body` that holds `node`."""
  while ctx.facts.parent(node) is not body:
    node = ctx.facts.parent(node)
  return node


def _zero_first(value: cst.BaseExpression, counter: str) -> bool:
  """Whether `value` is 0 when the loop counter `counter` is: `i * k`, `i // k`, `i % k`, `int(i / k)` (k any code
  that reads no `counter`)."""
  if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == 'int' \
      and len(value.args) == 1 and value.args[0].keyword is None and not value.args[0].star:
    value = value.args[0].value
    allowed = (cst.Divide, cst.FloorDivide, cst.Multiply, cst.Modulo)
  else:
    allowed = (cst.FloorDivide, cst.Multiply, cst.Modulo)
  return isinstance(value, cst.BinaryOperation) and isinstance(value.operator, allowed) \
      and isinstance(value.left, cst.Name) and value.left.value == counter \
      and not any(isinstance(n, cst.Name) and n.value == counter for n in (value.right, *descendants(value.right)))


def _class_name(ctx: ClassContext, child: Child) -> str:
  """`nn.Dense` / `Block`: what a loop child constructs, as the code spells it."""
  func = child.ctor.func
  return cst.Module([]).code_for_node(func) if isinstance(func, (cst.Name, cst.Attribute)) else 'submodule'


def _same(left: Dim, right: Dim) -> bool:
  """Equal sizes, parentheses around a whole code aside."""
  if not isinstance(left, Known) or not isinstance(right, Known):
    return left == right
  return _unwrap(left.code) == _unwrap(right.code)


def _unwrap(code: str) -> str:
  while code.startswith('(') and code.endswith(')') and not unbalanced(code[1:-1]):
    code = code[1:-1]
  return code.replace(' ', '')


def plural(name: str) -> str:
  return f'{name}es' if re.search(r'(s|x|sh|ch)$', name) else f'{name}s'


def _known_after(loop: Loop, dim: Dim) -> Dim:
  """What a name the loop assigns has after it; a size using the loop's names only when __init__ can evaluate it."""
  if isinstance(dim, Known) and not loop.sites and (loop.uses(dim.code, loop.index) or loop.uses_element(dim.code)):
    return None  # a loop building nothing: its iterator may not be valid in __init__
  return loop.last(dim)


def _sum(terms: list[str]) -> str:
  terms = [t for t in terms if t != '0'] or ['0']
  return ' + '.join(terms)


def _class_methods(ctx: ClassContext, node: cst.CSTNode) -> set[str]:
  cls = enclosing(ctx, node, cst.ClassDef)
  return {s.name.value for s in cls.body.body if isinstance(s, cst.FunctionDef)} if cls is not None else set()


def _class_fields(ctx: ClassContext, node: cst.CSTNode) -> set[str]:
  cls = enclosing(ctx, node, cst.ClassDef)
  return {s.body[0].target.value for s in (cls.body.body if cls is not None else ())
          if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 and isinstance(s.body[0], cst.AnnAssign)
          and isinstance(s.body[0].target, cst.Name)}


def loop_entry(children: tp.Sequence[ChildName], name: str) -> tuple[str, ...] | None:
  """The NNX path of Linen child `name` recorded as a loop's pattern (report.ChildName): `block_3` of `block_{i}`
  -> (`blocks`, `3`); auto names counting across iterations (`Dense_{1 + 2 * i}`) are solved for the index.

  () when a pattern of the same start cannot be solved (`Dense_{len(self.features)}`, after a loop): the name is
  not known from the records alone; None when no pattern starts like `name`.
  """
  found, unknown = None, False
  for child in children:
    head, brace, rest = child.linen_name.partition('{')
    number = name[len(head):]
    if not brace or not rest.endswith('}') or not name.startswith(head) or not number.isdigit():
      continue
    terms = [t.strip() for t in rest[:-1].split('+')]
    index_names = {f.strip() for t in terms for f in t.split('*') if not f.strip().isdigit()}
    if len(index_names) != 1 or not all(re.fullmatch(r'\d+|[A-Za-z_]\w*', f.strip()) for t in terms
                                        for f in t.split('*')):
      unknown = True
      continue
    (index,) = index_names

    def at(k: int) -> int:
      total = 0
      for term in terms:
        product = 1
        for factor in term.split('*'):
          product *= k if factor.strip() == index else int(factor)
        total += product
      return total

    start, step = at(0), at(1) - at(0)
    if step > 0 and int(number) >= start and (int(number) - start) % step == 0:
      found = (*child.nnx_attribute.split('.'), str((int(number) - start) // step))
  if unknown:
    return ()
  return found
