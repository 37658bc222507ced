"""Locals of setup() naming one class or another, for rule L2N002: `attention_layer = A` or `= B` in the arms of an
if chain on fields (transformers' LongT5 block picks its attention layer so), or `layer = A if <test> else B`
(ResNet's layer kind), then `attention_layer(...)` building the submodule.

The bindings and the construction stay where they are, naming the NNX classes. The construction is planned once
per class it may build (`Child.alternative`, each under the arms its class is named in, `Child.chosen`), and sized
at the calls as the arms of a setup() `if` are. What one class's `__init__` needs beside the construction's own
arguments (its input sizes) is given where the local names that class:
`attention_layer = functools.partial(A, SelfAttention_q_in_features=layer_SelfAttention_q_in_features)`, so that the
one construction passes what every class takes: its arguments and `rngs`.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst

from codemods.rules.l2n002 import init_code
from codemods.rules.l2n002.plan import Child, ClassRewrite, Unsupported

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.context import ClassContext


def alternatives(ctx: ClassContext, child: Child, build: tp.Callable[[tuple], Child]) -> list[Child]:
  """The children of the classes other than `child`'s that its construction may build (none for a construction
  that is no local's); `build` plans the construction as one of them (Linen name, layer row, plan)."""
  choices = ctx.plan.choices.get(child.ctor)
  if choices is None:
    return []
  if child.ctor in ctx.loops.sites:
    raise Unsupported(child.ctor, f'{ctx.facts.code(child.ctor.func)}(...) in a loop, a local naming one class or '
                                  'another (converted: built outside loops)')
  arms: dict[str, frozenset[tuple[str, bool]]] = {}
  for choice in choices:  # a class named in several arms: under any of them (no arm known)
    arms[choice.linen] = choice.arms if choice.linen not in arms else frozenset()
  first, *others = arms
  child.chosen = arms[first]
  found = []
  for linen in others:
    other = build((linen, None, ctx.converted[linen]))
    other.alternative, other.chosen, other.element = True, arms[linen], child.element
    found.append(other)
  return found


def bind_sizes(ctx: ClassContext, plan: ClassRewrite) -> None:
  """The construction of each local naming one class or another, with the arguments every class takes; what one
  class needs besides (input sizes, fields merged with a train/eval switch) given where the local names it."""
  for ctor, choices in ctx.plan.choices.items():
    group = [c for c in plan.children if c.ctor is ctor]
    bare = {init_code.ctor_text(ctx, dataclasses.replace(c, sizes={}, mode_defaults={})) for c in group}
    if len(bare) != 1:
      raise Unsupported(ctor, f'{ctx.facts.code(ctor.func)}(...) builds classes whose NNX constructors take its '
                              'arguments in other places: pass them by keyword')
    ctx.plan.exprs[ctor] = bare.pop()
    local, named = ctx.facts.code(ctor.func), ' or '.join(dict.fromkeys(c.linen for c in choices))
    bound = [(choice, extra) for child in group
             if (extra := [f'{k}={v}' for k, v in (*child.sizes.items(), *child.mode_defaults.items())])
             for choice in choices if choice.linen == child.sibling.name]
    for choice, extra in bound:
      ctx.plan.exprs[choice.node] = f'functools.partial({choice.linen}, {", ".join(extra)})'
    if bound:
      plan.imports.append(('functools', None, None))
      ctx.plan.pending.append((ctor, f'{local}(...) builds {named}, each converted: what one of them needs beside the '
                                     f'arguments here (its input sizes) is given where {local} names it, with '
                                     'functools.partial'))
