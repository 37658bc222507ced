"""Locals of setup() naming one class or another, for rule L2N002: `attention_layer = A` or `= B` in the arms of an
if chain on fields (transformers' LongT5 block picks its attention layer so), or `layer = A if <test> else B`
(ResNet's layer kind), then `attention_layer(...)` building the submodule.

The bindings and the construction stay where they are, naming the NNX classes. The construction is planned once
per class it may build (`Child.alternative`, each under the arms its class is named in, `Child.chosen`), and sized
at the calls as the arms of a setup() `if` are. What one class's `__init__` needs beside the construction's own
arguments (its input sizes) is passed by the construction where every class takes it by the same name, else given
where the local names that class:
`attention_layer = functools.partial(A, SelfAttention_q_in_features=layer_SelfAttention_q_in_features)`, so that the
one construction passes what every class takes: its arguments and `rngs`. A local that builds several submodules
(ResNet's `layers = [layer(..., name="0")]`, then `layers.append(layer(...))` in a loop) has other sizes at each
construction: there each class is built by name where its sizes differ, `A(..., a_in_features=v, rngs=rngs) if
layer is A else B(..., b_in_features=v, rngs=rngs)`.
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002 import init_code, queries
from codemods.rules.l2n002.plan import Child, ClassRewrite, Unsupported

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.context import ClassContext


def alternatives(ctx: ClassContext, child: Child, build: tp.Callable[[tuple], Child]) -> list[Child]:
  """The children of the classes other than `child`'s that its construction may build (none for a construction
  that is no local's); `build` plans the construction as one of them (Linen name, layer row, plan)."""
  choices = ctx.plan.choices.get(child.ctor)
  if choices is None:
    return []
  arms: dict[str, frozenset[tuple[str, bool]]] = {}
  for choice in choices:  # a class named in several arms: under any of them (no arm known)
    arms[choice.linen] = choice.arms if choice.linen not in arms else frozenset()
  first, *others = arms
  child.chosen = arms[first]
  found = []
  for linen in others:
    other = build((linen, None, ctx.converted[linen]))
    other.alternative, other.chosen, other.element, other.head = True, arms[linen], child.element, child.head
    found.append(other)
  return found


def construction_texts(ctx: ClassContext, plan: ClassRewrite) -> dict[cst.Call, str]:
  """The NNX code of each construction through a local naming one class or another. Where every class takes the
  same input sizes by the same names, the construction passes them; else, where the local builds one submodule
  outside loops, what each class needs besides is given where the local names it (a functools.partial); else each
  class is built by name with its own sizes, under `<local> is <class>`."""
  texts: dict[cst.Call, str] = {}
  for ctor, choices in ctx.plan.choices.items():
    group = [c for c in plan.children if c.ctor is ctor]
    if not group:
      continue
    local = ctx.facts.code(ctor.func)
    full = {_as_written(ctx, c, sizes=True) for c in group}
    bare = {_as_written(ctx, c, sizes=False) for c in group}
    if len(full) == 1:
      texts[ctor] = full.pop()
      continue
    if len(bare) != 1:
      raise Unsupported(ctor, f'{local}(...) builds classes that take other arguments from it (a train/eval '
                              'argument one of them drops, NNX setting it by train() / eval())')
    if ctor in ctx.loops.sites or _constructions(ctx, local) > 1:  # other sizes at each: each class by name
      *firsts, last = [_as_written(ctx, c, sizes=True, name=c.sibling.name) for c in group]
      texts[ctor] = ' else '.join([*(f'{text} if {local} is {c.sibling.name}' for c, text in zip(group, firsts)),
                                   last])
      continue
    bound = [(choice, [f'{k}={v}' for k, v in needs.items()]) for child in group
             if (needs := init_code.sibling_needs(child)) for choice in choices if choice.linen == child.sibling.name]
    for choice, extra in bound:
      ctx.plan.exprs[choice.node] = f'functools.partial({choice.linen}, {", ".join(extra)})'
    if bound:
      plan.imports.append(('functools', None, None))
      named = ' or '.join(dict.fromkeys(c.linen for c in choices))
      ctx.plan.pending.append((ctor, f'{local}(...) builds {named}, each converted: what one of them needs beside the '
                                     f'arguments here (its input sizes) is given where {local} names it, with '
                                     'functools.partial'))
    texts[ctor] = bare.pop()
  return texts


def _as_written(ctx: ClassContext, child: Child, sizes: bool, name: str | None = None) -> str:
  """The construction as the code writes it, its arguments where they stand (what is positional stays so: every
  class the local may name takes its fields in that order, in NNX as in Linen), without name= and the train/eval
  arguments NNX dropped; with the child's input sizes (`sizes`) and `rngs`; calling the class `name` where given,
  else the local. None of its arguments may be starred."""
  text = lambda node: queries.code(ctx, node, child.size_codes)
  kept = {id(value) for value in child.kwargs.values()}
  args = [text(a.value) if a.keyword is None else f'{a.keyword.value}={text(a.value)}' for a in child.ctor.args
          if id(a.value) in kept]
  args += [f'{k}={v}' for k, v in (init_code.sibling_needs(child) if sizes else {}).items()]
  return f'{name or ctx.facts.code(child.ctor.func)}({", ".join([*args, "rngs=rngs"])})'


def _constructions(ctx: ClassContext, local: str) -> int:
  """How many constructions of the class being planned call the local `local`."""
  return sum(1 for node in descendants(ctx.facts.class_defs[ctx.plan.name])
             if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == local)
