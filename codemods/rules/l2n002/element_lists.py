"""setup() lists written out, for rule L2N002: `self.layer = [ConvLayer(c, stride=s), ConvLayer(c, activation=None)]`
(transformers' ResNet and RegNet layer collections).

Each element is a child of its own (`Child.element`: its index), converted in place, and the list becomes
`nnx.List([...])` with its formatting and comments kept. The list is used as a setup() list built by a loop is
(`loops.Loops.list_use`: `for layer in self.layer:` calling `layer(...)`, or `len(self.layer)`); such a loop is
walked once per element for sizes (`sizes.SizeWalk.loop`), the k-th walk calling element k, so that each
element's input size is what the element before it returned. Elements of several classes (RegNet's convolutions
and squeeze-excitation layer) are called with their input alone (`layer(hidden_state)`, `check_calls`), which each
takes. Linen names them `layer_0`, `layer_1`, ..., or by their name= when it is their index (`'0'`, `'1'`) or a
common start and their index (`'block_0'`, `'block_1'`).
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.rules.l2n002 import constructions
from codemods.rules.l2n002.plan import Child, ClassRewrite, Unsupported

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.context import ClassContext


def element_constructions(ctx: ClassContext, value: cst.List, attr: str) -> list[cst.Call] | None:
  """The constructions of `self.<attr> = [<construction>, ...]`; None when no element builds a module (plain
  code). Raises Unsupported for a list that mixes them with other values, or is built inside a block."""
  built = [e.value for e in value.elements if isinstance(e.value, cst.Call) and constructions.constructed(ctx, e.value)]
  if not built:
    return None
  if len(built) != len(value.elements) or any(isinstance(e, cst.StarredElement) for e in value.elements):
    raise Unsupported(value, f'self.{attr}: a list of layers beside other values (converted: a list whose every '
                             'element builds a layer)')
  line = ctx.facts.parent(ctx.facts.parent(value))  # the Assign's statement line, in setup()'s body or a block
  if not isinstance(ctx.facts.parent(ctx.facts.parent(line)), cst.FunctionDef):
    raise Unsupported(value, f'self.{attr}: a list of layers built inside a block of setup() (converted: at its '
                             'top level)')
  return built


def linen_pattern(ctx: ClassContext, ctors: list[cst.Call], attr: str) -> str:
  """Linen's name of element `{i}`: `<attr>_{i}`, or what the elements' name= says when it is their index
  after a common start (`'0'`, `'1'`: `{i}`); raises Unsupported for other names, which no pattern gives."""
  names = [next((a.value for a in ctor.args if a.keyword is not None and a.keyword.value == 'name'), None)
           for ctor in ctors]
  if all(name is None for name in names):
    return f'{attr}_{{i}}'
  texts = [name.evaluated_value if isinstance(name, cst.SimpleString) else None for name in names]
  start = texts[0][:-1] if texts[0] is not None and texts[0].endswith('0') else None
  if start is None or texts != [f'{start}{k}' for k in range(len(texts))]:
    raise Unsupported(ctors[0], f'self.{attr}: a list of layers named {", ".join(ctx.facts.code(n) for n in names if n)}'
                                ' (converted: no name=, or names that end in their index)')
  return f'{start}{{i}}'


def check_calls(ctx: ClassContext, plan: ClassRewrite, calls: dict[cst.Call, Child]) -> None:
  """Raises Unsupported for a call of a list of several classes that passes more than the element's input: what
  one class takes beside it (a train/eval switch), another may not."""
  for call, child in calls.items():
    if child.element is None or len(call.args) == 1 and call.args[0].keyword is None and not call.args[0].star:
      continue
    elements = [c for c in plan.children if c.attr == child.attr and c.element is not None]
    classes = sorted({constructions.constructed(ctx, c.ctor)[0] for c in elements})
    if len(classes) > 1:
      raise Unsupported(call, f'self.{child.attr}: a list of layers of several classes ({", ".join(classes)}) '
                              'called with more than its input (converted: `layer(x)`, which each takes)')
