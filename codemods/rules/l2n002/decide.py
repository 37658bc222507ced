"""Decides the fate of every Linen class of a file at once: converted (with its plan) or left as Linen (with why).

A class is planned on its own (`planner.plan_class`), but its fate depends on the others: a class left
as Linen that builds or subclasses a converted class of the file would then build an NNX module the
Linen way, a program that no longer runs. So each such construction is wrapped with
`nnx_bridge.to_linen` where the Linen class then runs as before on the same variables
(`linen_parents.py`); otherwise the class it uses stays Linen with it, and the file is planned again,
until no class left as Linen uses a converted one unwrapped (the set of kept classes only grows, so
this ends). A converted class that builds a kept one wraps it with `nnx_bridge.from_linen`, as it
does for any class kept as Linen.

A kept class keeps the reason it was first left for, except one that builds converted classes
through to_linen: a second run starts from the final decisions (those classes are NNX code it builds
as Linen modules, the kept ones Linen code), so its reason is asked again that way
(`_settled_reason`), or that run would write another TODO; and a class the run keeps because a Linen class of
another file builds it is planned first, as that run plans it, and what keeps it Linen on its own is its reason
(`_own_reason`). What this does not settle,
`transform_source` does: it runs the rules once more, as a second run would.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.report import BUILT_BY_LINEN, kept_message, used_message
from codemods.rules.l2n002.facts import FileFacts
from codemods.rules.l2n002.linen_parents import ToLinenBridge, adopted_blocker, linen_parent_bridges
from codemods.rules.l2n002.plan import ClassRewrite, FileRewrite, Unsupported
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
  users: dict[str, str] = {}  # a class kept because a class left as Linen uses it -> that class
  order = _plan_order(facts)
  alone: dict[str, ClassRewrite] | None = None  # the plans of the first round, each class planned as it stands
  built_elsewhere = {name for name, why in kept.items() if BUILT_BY_LINEN in why}
  while True:
    facts = dataclasses.replace(facts, kept_linen=kept)
    file, left = _plan_all(facts, order, built_elsewhere)
    alone = dict(file.plans) if alone is None else alone
    first = {**left, **first}  # a class keeps the reason it was first left for, not a consequence of it
    used, bridges = _used_by_linen(facts, file, left)
    if not used:
      settled = {name: first[name] for name in left}
      below = {**{k: alone[k] for k in users if k in alone}, **file.plans}
      for name in {bridge.user for bridge in bridges} & set(users):
        built = {bridge.built for bridge in bridges if bridge.user == name}
        settled[name] = _settled_reason(facts, file, below, order, name, users[name], built, left) or settled[name]
      return ClassDecisions(file, settled, facts, bridges)
    kept = {**kept, **{name: message for name, (user, message) in used.items()}}
    users.update((name, user) for name, (user, _) in used.items())


def _plan_order(facts: FileFacts) -> list[cst.ClassDef]:
  """The file's Linen classes, each after the classes of the file it names where it can be (diffusers' feed-forward
  builds `FlaxGEGLU`, defined below it), else in file order: a class is planned knowing what those became."""
  nodes = [n for n in facts.module.body if isinstance(n, cst.ClassDef) and n.name.value in facts.linen_classes]
  named = {n.name.value: {sub.value for sub in descendants(n) if isinstance(sub, cst.Name)} & facts.linen_classes
           - {n.name.value} for n in nodes}
  order: list[cst.ClassDef] = []
  pending = list(nodes)
  while pending:
    placed = {n.name.value for n in order}
    ready = next((n for n in pending if named[n.name.value] <= placed), pending[0])  # a cycle: file order
    order.append(ready)
    pending.remove(ready)
  return order


def _plan_all(facts: FileFacts, order: list[cst.ClassDef], built_elsewhere: tp.Collection[str] = ()
              ) -> tuple[FileRewrite, dict[str, LeftLinen]]:
  """Each Linen class of the file planned in `order` (`_plan_order`), those before it known: its plan, or why it
  stays Linen. A class the run keeps because a Linen class of another file builds it (`built_elsewhere`) is planned
  all the same, as a second run plans it before it asks about that use: what keeps it Linen on its own comes first
  (jax-md's edge embedding, building a radial MLP another file keeps Linen), or that run writes another TODO."""
  file, left = FileRewrite(), {}
  for node in order:
    name = node.name.value
    if name in facts.kept_linen:
      own = _own_reason(facts, file, node) if name in built_elsewhere else None
      left[name] = own or LeftLinen(node, kept_message(name, facts.kept_linen[name]))
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


def _own_reason(facts: FileFacts, file: FileRewrite, node: cst.ClassDef) -> LeftLinen | None:
  """Why the class `node`, kept because a Linen class of another file builds it, stays Linen on its own, planned
  as a second run plans it; None when it would convert but for that use."""
  name = node.name.value
  trial = dataclasses.replace(facts, kept_linen={k: v for k, v in facts.kept_linen.items() if k != name})
  try:
    plan_class(trial, file.plans, node, dict(file.variable_classes))
  except Unsupported as error:
    return LeftLinen(error.node, f'class {name} left as Linen: {error.message}')
  return None


def _used_by_linen(facts: FileFacts, file: FileRewrite,
                   left: dict[str, LeftLinen]) -> tuple[dict[str, str], list[ToLinenBridge]]:
  """The converted classes that a class left as Linen names (builds, subclasses, passes on) and does not wrap with
  nnx_bridge.to_linen, with why each must stay Linen too; and the to_linen bridges of the others.

  A class kept for a use outside its body (`facts.kept_linen`: a wrapper holds it, another class left as Linen
  uses it) wraps what it builds too, unless `transform_source` found that a second run would then change it
  (`facts.unbridged`). Of several users, one whose reason holds whatever the class's plan is named
  (`adopted_blocker`): a second run plans the class from the Linen code this run leaves, and other users may
  then fail on it for another reason first. A class another file of the run converted (its record in
  `facts.imported`) is wrapped the same way where it can be; where not, the run keeps it Linen in its own file.
  """
  used: dict[str, tuple[str, str]] = {}
  bridges: list[ToLinenBridge] = []
  named = {user: dict.fromkeys(sub.value for sub in descendants(facts.class_defs[user])
                               if isinstance(sub, cst.Name) and sub.value in file.plans) for user in left}
  for user in left:
    for built in named[user]:
      if built not in used and (adopted := adopted_blocker(facts, user, built)) is not None:
        used[built] = (user, used_message(user, adopted))
  for user in left:
    for built in named[user]:
      found = _bridges(facts, file.plans, user, built, left)
      if isinstance(found, list):
        bridges.extend(found)
      else:
        used.setdefault(built, (user, used_message(user, found)))
    imported = dict.fromkeys(key for sub in descendants(facts.class_defs[user])
                             if (key := facts.imported_class(sub)) is not None)
    for built in imported:  # unwrapped, it stays a use the run decides on (`decisions.py`): kept Linen in its file
      found = _bridges(facts, file.plans, user, built, left)
      bridges.extend(found if isinstance(found, list) else ())
  return used, bridges


def _bridges(facts: FileFacts, plans: dict[str, ClassRewrite], user: str, built: str,
             left: dict[str, LeftLinen]) -> list[ToLinenBridge] | str:
  """The to_linen bridges of `built` in the Linen class `user`, or why there are none: a `user` that
  `transform_source` found a second run would change again makes none."""
  found = linen_parent_bridges(facts, plans, user, built, None if user in facts.kept_linen else left[user].node)
  if user in facts.unbridged and isinstance(found, list):
    return f'with it a second run would find another reason to keep {user} Linen'
  return found


def _settled_reason(facts: FileFacts, file: FileRewrite, plans: dict[str, ClassRewrite], order: list[cst.ClassDef],
                    name: str, user: str, built: set[str], left: dict[str, LeftLinen]) -> LeftLinen | None:
  """Why `name`, kept because the Linen class `user` cannot wrap it, stays Linen, as a second run finds it.

  That run plans the classes below `name` first as they stand: `plans`, the converted classes with the first
  round's plans of those kept for a Linen user (Linen code in that run, converted until their users are asked:
  diffusers' ResNet block, kept for a mid block, under an encoder block). Those `name` builds through
  nnx_bridge.to_linen (`built`) are NNX code it builds as Linen modules. Asked so, the answer is the one that run
  gives; None when the answer is not a reason."""
  trial = dataclasses.replace(facts, kept_linen={k: v for k, v in facts.kept_linen.items()
                                                 if k != name and k not in plans})
  node = facts.class_defs[name]
  position = {n.name.value: i for i, n in enumerate(order)}
  before = {k: plan for k, plan in plans.items() if position.get(k, -1) < position[name] and k not in built}
  try:
    plan = plan_class(trial, before, node, file.variable_classes)
  except Unsupported as error:
    return LeftLinen(error.node, f'class {name} left as Linen: {error.message}')
  found = linen_parent_bridges(trial, {**file.plans, name: plan}, user, name,  # that run has not found unbridged
                               None if user in facts.kept_linen else left[user].node)  # users yet
  if not isinstance(found, str):
    return None
  return LeftLinen(node, kept_message(name, used_message(user, found)))
