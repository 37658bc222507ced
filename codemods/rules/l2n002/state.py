"""What every planning pass of a class reads and fills: the attributes `planner.ClassPlanner` holds."""

from __future__ import annotations

import typing as tp

from codemods.rules.l2n002.facts import FileFacts
from codemods.rules.l2n002.plan import ClassRewrite

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.factories import ClassFactories
  from codemods.rules.l2n002.loops import Loops


class PlannerState:
  """The file's facts, the classes converted before this one, and the plan of the class being planned."""

  facts: FileFacts
  converted: tp.Mapping[str, ClassRewrite]  # the classes of the file converted before this one, by name
  plan: ClassRewrite  # what the class becomes: dropped whole when it stays Linen
  loops: Loops  # layers built in for loops -> nnx.List attributes
  factories: ClassFactories  # ModuleDef / partial factory fields
