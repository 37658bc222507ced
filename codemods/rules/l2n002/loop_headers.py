"""What a `for` loop that builds layers iterates, for rule L2N002 (`loops.py`): its index, its element (or the
elements a zip gives) and its iterator, and a size of one iteration as code of another (`Loop.shift`, `Loop.last`).

`loop_header` reads `for i in range(n)`, `for i, f in enumerate(S)`, `for f in S`, `for a, b in zip(A, B)` and
`for i, (a, b) in enumerate(zip(A, B))`; a loop without an index gets one (through `enumerate`) when `rewrite`.
The shapes of a setup() list built by a loop (`empty_list` or `written_out` first, the loop `appended` to it) and
the Linen names of its elements (`setup_name`, `check_head_names`) are read here too.
"""

from __future__ import annotations

import dataclasses
import re
import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002 import constructions, queries
from codemods.rules.l2n002.dims import Dim, Known
from codemods.rules.l2n002.nodes import read_names
from codemods.rules.l2n002.plan import Unsupported

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.context import ClassContext


@dataclasses.dataclass(eq=False)
class Loop:
  """One `for` loop of an @nn.compact method that builds layers (or only runs plain code)."""

  node: cst.For | cst.CompFor  # the loop that builds the layers
  index: str  # the loop's index in __call__ (after the rewrite)
  element: str | None  # the element name of a loop over a sequence; None for range(n), whose element is the index
  sequence: cst.BaseExpression | None  # S of `for f in S` / `enumerate(S)`; None for range(n)
  count: cst.BaseExpression | None  # n of range(n)
  names: frozenset[str]  # the names the original target binds
  sites: list[Site] = dataclasses.field(default_factory=list)
  active: bool = False
  sequence_code: str = ''  # S / n as code valid in __init__
  stop: str | None = None  # b of a sequence range(a, b), as code valid in __init__: its element shifts by 1
  zipped: tuple[tuple[str, cst.BaseExpression], ...] = ()  # `for a, b in zip(A, B)`: (a, A), (b, B); element None
  zipped_code: dict[str, str] = dataclasses.field(default_factory=dict)  # a -> A as code valid in __init__
  zipped_target: str = ''  # `(a, b)` of a zip, `((a, b), c)` with a zip of a zip local

  def uses(self, code: str, name: str | None) -> bool:
    return name is not None and re.search(word(name), code) is not None

  def uses_element(self, code: str) -> bool:
    """Whether `code` reads the loop's element, or one of the elements a zip gives."""
    return any(self.uses(code, name) for name in (self.element, *(name for name, _ in self.zipped)))

  def _elements_at(self, code: str, index: str) -> str:
    """`code` with each zipped element read from its sequence at `index` (`a` -> `A[i - 1]`)."""
    for name, _ in self.zipped:
      code = re.sub(word(name), lambda _: item(self.zipped_code[name], index), code)
    return code

  def shift(self, dim: Dim) -> Dim:
    """What the previous iteration's `dim` is, in terms of this iteration's index."""
    if not isinstance(dim, Known):
      return dim
    code = dim.code
    if self.element is not None and self.uses(code, self.element) and self.stop is not None:  # range(a, b)
      code = re.sub(word(self.element), f'({self.element} - 1)', code)
    elif self.element is not None and self.uses(code, self.element):
      code = re.sub(word(self.element), lambda _: item(self.sequence_code, f'{self.index} - 1'), code)
    code = self._elements_at(code, f'{self.index} - 1')
    if self.uses(dim.code, self.index):
      code = re.sub(word(self.index), f'({self.index} - 1)', code)
    return Known(code)

  def last(self, dim: Dim) -> Dim:
    """`dim` at the last iteration, for the code after the loop."""
    if not isinstance(dim, Known):
      return dim
    code = dim.code
    length = self.length()
    if self.element is not None and self.uses(code, self.element) and self.stop is not None:  # range(a, b)
      code = re.sub(word(self.element), f'({self.stop} - 1)', code)
    elif self.element is not None and self.uses(code, self.element):
      code = re.sub(word(self.element), lambda _: item(self.sequence_code, '-1'), code)
    code = self._elements_at(code, '-1')
    if self.uses(dim.code, self.index):
      code = re.sub(word(self.index), f'({length} - 1)', code)
    return Known(code)

  def length(self) -> str:
    if self.zipped:
      return f'min({", ".join(f"len({code})" for code in self.zipped_code.values())})'
    return self.sequence_code if self.sequence is None else f'len({self.sequence_code})'

  def element_target(self) -> str:
    """The loop's element as a target: `f`, or `(a, b)` of a zip."""
    return self.zipped_target if self.zipped else self.element


@dataclasses.dataclass(eq=False)
class Site:
  """A construction in a loop: one nnx.List attribute."""

  loop: Loop
  ctor: cst.Call
  pattern: str | None = None  # the Linen name an f-string name= gives, `layer_{i}` (`{i}` for `name=str(i)`)
  setup_attr: str | None = None  # the attribute of a setup() list (`self.layers = [...]`)
  condition: str | None = None  # built only where this holds (code for __init__), None elsewhere in the list
  comprehension: cst.BaseExpression | None = None  # a setup() list's `[<layer> for ...]`, or the `layers` stored
  seen: list[tuple[cst.Call, list[Dim]]] = dataclasses.field(default_factory=list)


def loop_header(ctx: ClassContext, statement: cst.For | cst.CompFor, rewrite: bool) -> Loop:
  """The loop's index, element and iterator: `for i in range(n)`, `for i, f in enumerate(S)`, `for f in S`."""
  code = ctx.facts.code
  target, it = statement.target, statement.iter
  what = 'a for loop' if isinstance(statement, cst.For) else 'a list comprehension'
  fail = lambda why: Unsupported(statement, f'{what} {why}')
  fresh = lambda: fresh_index(ctx, statement)
  if isinstance(it, cst.Call) and is_builtin(ctx, it.func, 'range') and len(it.args) == 1 \
      and it.args[0].keyword is None and not it.args[0].star and isinstance(target, cst.Name):
    index = target.value if target.value != '_' else fresh()
    loop = Loop(statement, index, None, None, it.args[0].value, frozenset({target.value}))
    if rewrite and target.value == '_':
      ctx.plan.exprs[target] = index
  elif (zipped := zipped_names(ctx, target, it)) is not None:  # `for a, b in zip(A, B)`, `for i, (a, b) in enumerate(...)`
    index_name, elements, sequence, sequences = zipped
    index = index_name if index_name not in (None, '_') else fresh()
    elements_target = target if index_name is None else target.elements[1].value
    loop = Loop(statement, index, None, sequence, None, frozenset({*elements, *filter(None, [index_name])}),
                zipped=tuple(zip(elements, sequences)), zipped_target=_tuple_code(ctx, elements_target))
    if rewrite and index_name is None:
      ctx.plan.exprs[target] = f'{index}, {loop.zipped_target}'
      ctx.plan.exprs[it] = f'enumerate({code(it)})'
    elif rewrite and index_name == '_':
      ctx.plan.exprs[target.elements[0].value] = index
  elif isinstance(it, cst.Call) and is_builtin(ctx, it.func, 'enumerate'):
    names = pair(target)
    if names is None or len(it.args) != 1 or it.args[0].keyword is not None or it.args[0].star:
      raise fail('over enumerate(...) with other than `for i, x in enumerate(<sequence>)`')
    index = names[0] if names[0] != '_' else fresh()
    loop = Loop(statement, index, names[1], it.args[0].value, None, frozenset(names))
    if rewrite and names[0] == '_':
      ctx.plan.exprs[target.elements[0].value] = index
  elif isinstance(target, cst.Name):
    index = fresh()
    loop = Loop(statement, index, target.value, it, None, frozenset({target.value}))
    if rewrite:
      ctx.plan.exprs[target] = f'{index}, {target.value}'
      ctx.plan.exprs[it] = f'enumerate({code(it)})'
  else:
    raise fail(f'with the target {code(target)} (converted: a name, `i, x` over enumerate(...), `a, b` over '
               'zip(...) or `i, (a, b)` over enumerate(zip(...)))')
  return loop


def word(name: str) -> str:
  return rf'(?<![\w.\'"]){re.escape(name)}(?![\w\'"])'


def item(sequence: str, index: str) -> str:
  """`S[index]`, `X[:-1][i - 1]` written `X[i - 1]` (and `X[:-1][-1]` as `X[-2]`)."""
  head = re.fullmatch(r'(.+)\[:(-?\d+)\]', sequence)
  if head is not None and not unbalanced(head.group(1)):
    if index == '-1' and int(head.group(2)) < 0:
      return f'{head.group(1)}[{int(head.group(2)) - 1}]'
    if index != '-1':
      return f'{head.group(1)}[{index}]'
  return f'{paren(sequence)}[{index}]'


def unbalanced(code: str) -> bool:
  depth = 0
  for char in code:
    depth += char in '([{'
    depth -= char in ')]}'
    if depth < 0:
      return True
  return depth != 0


def wrapped(code: str) -> bool:
  """Whether `code` is one parenthesized expression: `(a if b else c)`."""
  return code.startswith('(') and code.endswith(')') and not unbalanced(code[1:-1])  # not `(a) + (b)`


def paren(code: str) -> str:
  return code if re.fullmatch(r'[\w.]+(\([^()]*\)|\[[^\[\]]*\])*', code) else f'({code})'


def _tuple_code(ctx: ClassContext, target: cst.BaseExpression) -> str:
  """A tuple target as code, parenthesized at every level: `a, b` -> `(a, b)`, `(a, b), c` -> `((a, b), c)`."""
  if isinstance(target, (cst.Tuple, cst.List)):
    parts = [_tuple_code(ctx, e.value) for e in target.elements]
    return f'({parts[0]},)' if len(parts) == 1 else f'({", ".join(parts)})'
  return ctx.facts.code(target)


def _names_of(target: cst.BaseExpression) -> list[str] | None:
  """`a, b, c` (or `(a, b, c)`) as its names; None for any other target."""
  if isinstance(target, (cst.Tuple, cst.List)) and all(isinstance(e, cst.Element) and isinstance(e.value, cst.Name)
                                                       for e in target.elements):
    return [e.value.value for e in target.elements]
  return None


def zipped_names(ctx: ClassContext, target: cst.BaseExpression, it: cst.BaseExpression
                 ) -> tuple[str | None, list[str], cst.Call, list[cst.BaseExpression]] | None:
  """`for a, b in zip(A, B)` -> (None, [a, b], the zip call, [A, B]); `for i, (a, b) in enumerate(zip(A, B))` -> (i,
  [a, b], the zip call, [A, B]); None for other loops. The zip's arguments are positional sequences, one per name,
  or a local bound once to a zip of such, one per name of a tuple (ResNet's stages: `in_out_channels =
  zip(sizes, sizes[1:])`, then `for i, ((in_channels, out_channels), depth) in enumerate(zip(in_out_channels,
  depths[1:]))`: in_channels is read from `sizes`, out_channels from `sizes[1:]`)."""
  index = None
  if isinstance(it, cst.Call) and is_builtin(ctx, it.func, 'enumerate') and len(it.args) == 1 \
      and it.args[0].keyword is None and not it.args[0].star \
      and isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2 \
      and isinstance(target.elements[0].value, cst.Name):
    index, target, it = target.elements[0].value.value, target.elements[1].value, it.args[0].value
  if not (isinstance(target, (cst.Tuple, cst.List)) and _zip(ctx, it, len(target.elements))):
    return None
  names, sequences = [], []
  for element, arg in zip(target.elements, it.args):
    if isinstance(element, cst.Element) and isinstance(element.value, cst.Name):
      names.append(element.value.value)
      sequences.append(arg.value)
      continue
    inner = _names_of(element.value) if isinstance(element, cst.Element) else None
    local = queries.bound_once(ctx, arg.value) if isinstance(arg.value, cst.Name) else None
    if inner is None or not _zip(ctx, local, len(inner)):
      return None
    names += inner
    sequences += [a.value for a in local.args]
  return index, names, it, sequences


def _zip(ctx: ClassContext, node: cst.CSTNode | None, count: int) -> bool:
  """Whether `node` is `zip(...)` of `count` positional arguments."""
  return isinstance(node, cst.Call) and is_builtin(ctx, node.func, 'zip') and len(node.args) == count \
      and all(a.keyword is None and not a.star for a in node.args)


def pair(target: cst.BaseExpression) -> tuple[str, str] | None:
  if isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2 \
      and all(isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements):
    return target.elements[0].value.value, target.elements[1].value.value
  return None


def is_builtin(ctx: ClassContext, func: cst.BaseExpression, name: str) -> bool:
  return isinstance(func, cst.Name) and func.value == name and name not in ctx.facts.global_names


def fresh_index(ctx: ClassContext, statement: cst.For) -> str:
  """An index name the method does not use: `i`, else `j`, `k`, `index`, `index_`..."""
  method = enclosing(ctx, statement, cst.FunctionDef)
  used = {n.value for n in descendants(method) if isinstance(n, cst.Name)} | ctx.facts.global_names
  for name in ('i', 'j', 'k', 'index'):
    if name not in used:
      return name
  name = 'index_'
  while name in used:
    name += '_'
  return name


def enclosing(ctx: ClassContext, node: cst.CSTNode, kind: type[cst.CSTNode]) -> tp.Any:
  while node is not None and not isinstance(node, kind):
    node = ctx.facts.parent(node)
  return node


def empty_list(statement: cst.BaseStatement) -> str | None:
  """`name` of a `name = []` statement."""
  if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
    assign = statement.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name) \
        and isinstance(assign.value, cst.List) and not assign.value.elements:
      return assign.targets[0].target.value
  return None


def written_out(ctx: ClassContext, statement: cst.BaseStatement) -> tuple[str, list[cst.Call]] | None:
  """`name` and the constructions of `name = [Layer(...), ...]`, every element a construction (transformers' ResNet
  stages: the first layer written out, the others appended in a loop); None for other statements."""
  if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
    assign = statement.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name) \
        and isinstance(assign.value, cst.List) and assign.value.elements \
        and all(isinstance(e, cst.Element) and isinstance(e.value, cst.Call)
                and constructions.constructed(ctx, e.value) is not None for e in assign.value.elements):
      return assign.targets[0].target.value, [e.value for e in assign.value.elements]
  return None


def appended(loop: cst.CSTNode | None, name: str, lists: frozenset[str]) -> cst.Call | None:
  """The construction of `for x in <iterator>: name.append(<construction>)`, else None. The body may also bind locals
  (diffusers' `in_channels = self.in_channels if i == 0 else self.out_channels`) and the construction itself
  (`res_block = FlaxResnetBlock2D(...)`, then `resnets.append(res_block)`): simple assignments to names; its other
  statements are one append to each of `lists` (the empty lists before the loop, which go with it)."""
  if not isinstance(loop, cst.For) or loop.orelse is not None \
      or not all(isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 for s in loop.body.body):
    return None
  statements = [s.body[0] for s in loop.body.body]
  appends = {}
  for position, statement in enumerate(statements):
    call = statement.value if isinstance(statement, cst.Expr) else None
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name) \
        and call.func.value.value in lists and call.func.attr.value == 'append' and len(call.args) == 1 \
        and call.args[0].keyword is None and not call.args[0].star and call.func.value.value not in appends:
      appends[call.func.value.value] = (position, call.args[0].value)
    elif not (isinstance(statement, cst.Assign) and len(statement.targets) == 1
              and isinstance(statement.targets[0].target, cst.Name)):
      return None
  if set(appends) != lists:
    return None
  position, value = appends[name]
  if isinstance(value, cst.Name):  # `resnets.append(res_block)`: the one construction bound to that local before
    bound = [s.value for s in statements[:position]
             if isinstance(s, cst.Assign) and s.targets[0].target.value == value.value]
    local = value.value
    value = bound[0] if len(bound) == 1 else None
    if sum(isinstance(n, cst.Name) and n.value == local for n in descendants(loop.body)) != 2:
      return None  # the local is bound and appended, nothing else
  return value if isinstance(value, cst.Call) else None


def lists_before(ctx: ClassContext, body: list[cst.BaseStatement], loop: cst.BaseStatement | None) -> frozenset[str]:
  """The lists that `loop` (a statement of `body`) fills, started just before it: every `name = []` and each list
  written out (`name = [Layer(...)]`) that it appends to (diffusers' mid blocks: `resnets = [FlaxResnetBlock2D(...)]`,
  `attentions = []`, then one append to each per iteration)."""
  found = set()
  appends = {n.value for n in descendants(loop) if isinstance(n, cst.Name)} if loop is not None else set()
  for statement in reversed(body[:body.index(loop)] if loop is not None else ()):
    if (name := empty_list(statement)) is not None:
      found.add(name)
    elif (written := written_out(ctx, statement)) is not None:
      if written[0] in appends:
        found.add(written[0])
    else:
      break
  return frozenset(found)


def carried(loop: cst.For, setup: cst.FunctionDef, ctor: cst.Call) -> bool:
  """Whether the layer appended in `loop` reads a local of the loop other than one bound once in setup() from
  fields and the loop's names (FlaxDecoder's `prev_output_channel = output_channel`, carried from the last
  iteration): the comprehension that replaces the loop could not give it that value."""
  reads = lambda node: [n.value for n in read_names(node)]
  def bound(target: cst.BaseExpression) -> list[str]:  # `a`, `a, (b, c)`; not the `self` of `self.x = ...`
    if isinstance(target, cst.Name):
      return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
      return [name for element in target.elements for name in bound(element.value)]
    return []
  targets = [name for sub in descendants(setup) if isinstance(sub, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign))
             for name in bound(sub.target)]
  values = {s.body[0].targets[0].target.value: s.body[0].value for s in loop.body.body if isinstance(s.body[0], cst.Assign)}
  loop_names = set(reads(loop.target))
  return any(name in values and (targets.count(name) != 1 or any(
      other in targets and other not in loop_names for other in reads(values[name]))) for name in reads(ctor))


def loop_locals_read_after(loop: cst.For, setup: cst.FunctionDef) -> bool:
  """Whether setup() reads, after the appending loop (which goes), a local the loop binds."""
  bound = {s.body[0].targets[0].target.value for s in loop.body.body if isinstance(s.body[0], cst.Assign)}
  after = list(setup.body.body)[list(setup.body.body).index(loop) + 1:]
  return any(n.value in bound for s in after for n in read_names(s))  # `in_channels=`, `.dtype`: not reads


def check_head_names(ctx: ClassContext, heads: list[cst.Call], site: Site, attr: str) -> None:
  """Raises Unsupported unless the layers written out before a setup() list's loop are named as Linen names the
  element at their place: `name="0"` (or `str(0)`) before `name=str(i + 1)`, none before a loop's auto names."""
  for k, head in enumerate(heads):
    name = next((a.value for a in head.args if a.keyword is not None and a.keyword.value == 'name'), None)
    value = name.evaluated_value if isinstance(name, cst.SimpleString) else \
        name.args[0].value.value if isinstance(name, cst.Call) and len(name.args) == 1 \
        and isinstance(name.args[0].value, cst.Integer) else None
    expected = site.pattern.replace(f'{{{site.loop.index}}}', str(k)) if site.pattern is not None else None
    if (name is None) != (expected is None) or name is not None and value != expected:
      raise Unsupported(head, f'self.{attr}: a layer written out before the loop named {ctx.facts.code(name) if name else "by Linen"}, '
                              f'where Linen names the element at its place {expected or f"{attr}_{k}"} (converted: '
                              'names by place, or none)')


def setup_name(ctx: ClassContext, ctor: cst.Call, name: cst.BaseExpression, loop: Loop, attr: str,
                heads: int = 0) -> str:
  """The Linen name pattern of a setup() list's `name=str(i)` (`{i}`, transformers' layer lists) or
  `name=f'layer_{i}'` (`layer_{i}`), `i` the index of the comprehension; NNX names the elements by position. After
  `heads` layers written out, `name=str(i + <heads>)` (ResNet's stages: `name="0"`, then `str(i + 1)`), the
  pattern of the element's place in the list."""
  code = ctx.facts.code
  if heads and isinstance(name, cst.Call) and is_builtin(ctx, name.func, 'str') and len(name.args) == 1 \
      and re.fullmatch(rf'{loop.index} \+ {heads}|{heads} \+ {loop.index}', code(name.args[0].value)):
    return f'{{{loop.index}}}'
  if not heads and isinstance(name, cst.Call) and is_builtin(ctx, name.func, 'str') and len(name.args) == 1 \
      and isinstance(name.args[0].value, cst.Name) and name.args[0].value.value == loop.index:
    return f'{{{loop.index}}}'
  if not heads and isinstance(name, cst.FormattedString) and len(name.parts) in (1, 2) \
      and isinstance(name.parts[-1], cst.FormattedStringExpression) \
      and isinstance(name.parts[-1].expression, cst.Name) and name.parts[-1].expression.value == loop.index \
      and all(isinstance(p, cst.FormattedStringText) for p in name.parts[:-1]):
    return code(name)[len(name.start):-len(name.end)]
  raise Unsupported(ctor, f'self.{attr}: name={code(name)} in a setup() list (converted: str({loop.index}) or '
                          f"f'<prefix>{{{loop.index}}}', {loop.index} the index of the list)")
