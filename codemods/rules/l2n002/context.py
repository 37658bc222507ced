"""What every planning pass of a class reads and fills: the file's facts, the classes converted before this one,
and the plan of the class being planned (`ClassContext`)."""

from __future__ import annotations

import dataclasses
import typing as tp

from codemods.rules.l2n002.facts import FileFacts
from codemods.rules.l2n002.plan import ClassRewrite

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.loops import Loops


@dataclasses.dataclass
class ClassContext:
  """One class being planned: the passes are functions of it, and fill `plan`; dropped whole when the class
  stays Linen."""

  facts: FileFacts
  converted: tp.Mapping[str, ClassRewrite]  # the classes of the file converted before this one, by name
  plan: ClassRewrite  # what the class becomes
  loops: Loops  # layers built in for loops -> nnx.List attributes
  plain_attributes: set[str] = dataclasses.field(default_factory=set)  # set by plain setup() code: not for children
