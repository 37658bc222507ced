"""Decides the fate of every Linen class of a file at once: converted (with its plan) or left as Linen (with why).

A class is planned on its own (`planner.plan_class`), but its fate depends on the others: a class left
as Linen that builds or subclasses a converted class of the file would then build an NNX module the
Linen way, a program that no longer runs. So each such construction is wrapped with
`nnx_bridge.to_linen` where the Linen class then runs as before on the same variables
(`linen_parents.py`); otherwise the class it uses stays Linen with it, and the file is planned again,
until no class left as Linen uses a converted one unwrapped (the set of kept classes only grows, so
this ends). A converted class that builds a kept one wraps it with `nnx_bridge.from_linen`, as it
does for any class kept as Linen.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002.facts import FileFacts
from codemods.rules.l2n002.linen_parents import ToLinenBridge, linen_parent_bridges
from codemods.rules.l2n002.plan import FileRewrite, Unsupported
from codemods.rules.l2n002.planner import plan_class


@dataclasses.dataclass(frozen=True)
class LeftLinen:
  """A class that stays Linen: the node its TODO goes above, and the TODO's text."""

  node: cst.CSTNode
  message: str


@dataclasses.dataclass(frozen=True)
class ClassDecisions:
  """The file's converted classes (`file`), the classes left as Linen by name, the facts they were planned on, and
  the constructions of converted classes in Linen ones that go through nnx_bridge.to_linen."""

  file: FileRewrite
  left: dict[str, LeftLinen]
  facts: FileFacts
  bridges: list[ToLinenBridge]


def decide_classes(facts: FileFacts) -> ClassDecisions:
  """Plans the file's Linen classes until no class left as Linen uses a converted one other than through
  nnx_bridge.to_linen."""
  kept, first = dict(facts.kept_linen), dict[str, LeftLinen]()
  while True:
    facts = dataclasses.replace(facts, kept_linen=kept)
    file, left = _plan_all(facts)
    first = {**left, **first}  # a class keeps the reason it was first left for, not a consequence of it
    used, bridges = _used_by_linen(facts, file, left)
    if not used:
      return ClassDecisions(file, {name: first[name] for name in left}, facts, bridges)
    kept = {**kept, **used}


def _plan_all(facts: FileFacts) -> tuple[FileRewrite, dict[str, LeftLinen]]:
  """Each Linen class of the file planned in order, those before it known: its plan, or why it stays Linen."""
  file, left = FileRewrite(), {}
  for node in facts.module.body:
    if not isinstance(node, cst.ClassDef) or node.name.value not in facts.linen_classes:
      continue
    name = node.name.value
    if name in facts.kept_linen:
      left[name] = LeftLinen(node, f'class {name} kept as Linen: {facts.kept_linen[name]}; a converted class '
                                   'building it wraps it with nnx_bridge.from_linen')
      continue
    try:
      plan = plan_class(facts, file.plans, node, file.variable_classes)
    except Unsupported as error:
      left[name] = LeftLinen(error.node, f'class {name} left as Linen: {error.message}')
      continue
    except MemoryError:
      raise
    except Exception as error:  # a bug of the converter: this class stays Linen, the others go on
      left[name] = LeftLinen(node, f'class {name} left as Linen: the converter failed on it '
                                   f'({type(error).__name__}: {" ".join(str(error).split())}); please report it')
      continue
    file.add(node, plan)
  return file, left


def _used_by_linen(facts: FileFacts, file: FileRewrite,
                   left: dict[str, LeftLinen]) -> tuple[dict[str, str], list[ToLinenBridge]]:
  """The converted classes that a class left as Linen names (builds, subclasses, passes on) and does not wrap with
  nnx_bridge.to_linen, with why each must stay Linen too; and the to_linen bridges of the others.

  A class kept for a use outside its body (`facts.kept_linen`: a wrapper holds it, another class left as Linen
  uses it) wraps what it builds too, unless `transform_source` found that a second run would then change it
  (`facts.unbridged`).
  """
  used: dict[str, str] = {}
  bridges: list[ToLinenBridge] = []
  for user in left:
    named = dict.fromkeys(sub.value for sub in descendants(facts.class_defs[user])
                          if isinstance(sub, cst.Name) and sub.value in file.plans)
    for built in named:
      found = (f'with it a second run would find another reason to keep {user} Linen' if user in facts.unbridged
               else linen_parent_bridges(facts, file.plans, user, built,
                                         None if user in facts.kept_linen else left[user].node))
      if isinstance(found, list):
        bridges.extend(found)
      else:
        used.setdefault(built, f'the class {user}, left as Linen, uses it, and cannot wrap it with '
                               f'nnx_bridge.to_linen: {found}')
  return used, bridges
