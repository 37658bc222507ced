"""What a `for` loop that builds layers iterates, for rule L2N002 (`loops.py`): its index, its element (or the
elements a zip gives) and its iterator, and a size of one iteration as code of another (`Loop.shift`, `Loop.last`).

`loop_header` reads `for i in range(n)`, `for i, f in enumerate(S)`, `for f in S`, `for a, b in zip(A, B)` and
`for i, (a, b) in enumerate(zip(A, B))`; a loop without an index gets one (through `enumerate`) when `rewrite`.
"""

from __future__ import annotations

import dataclasses
import re
import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002.dims import Dim, Known
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
    return f'({", ".join(name for name, _ in self.zipped)})' if self.zipped else self.element


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
    index_name, elements, sequence = zipped
    index = index_name if index_name not in (None, '_') else fresh()
    loop = Loop(statement, index, None, sequence, None, frozenset({*elements, *filter(None, [index_name])}),
                zipped=tuple(zip(elements, (a.value for a in sequence.args))))
    if rewrite and index_name is None:
      ctx.plan.exprs[target] = f'{index}, ({", ".join(elements)})'
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


def _names_of(target: cst.BaseExpression) -> list[str] | None:
  """`a, b, c` (or `(a, b, c)`) as its names; None for any other target."""
  if isinstance(target, (cst.Tuple, cst.List)) and all(isinstance(e, cst.Element) and isinstance(e.value, cst.Name)
                                                       for e in target.elements):
    return [e.value.value for e in target.elements]
  return None


def zipped_names(ctx: ClassContext, target: cst.BaseExpression, it: cst.BaseExpression
            ) -> tuple[str | None, list[str], cst.Call] | None:
  """`for a, b in zip(A, B)` -> (None, [a, b], the zip call); `for i, (a, b) in enumerate(zip(A, B))` -> (i, [a, b],
  the zip call); None for other loops. The zip's arguments are positional sequences, one per name."""
  index = None
  if isinstance(it, cst.Call) and is_builtin(ctx, it.func, 'enumerate') and len(it.args) == 1 \
      and it.args[0].keyword is None and not it.args[0].star \
      and isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2 \
      and isinstance(target.elements[0].value, cst.Name):
    index, target, it = target.elements[0].value.value, target.elements[1].value, it.args[0].value
  names = _names_of(target)
  if names is None or not (isinstance(it, cst.Call) and is_builtin(ctx, it.func, 'zip')) \
      or len(it.args) != len(names) or any(a.keyword is not None or a.star for a in it.args):
    return None
  return index, names, it


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
