"""What every planning pass of a class reads and fills: the file's facts, the classes converted before this one,
and the plan of the class being planned (`ClassContext`)."""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst

from codemods.rules.l2n002.dims import Dim
from codemods.rules.l2n002.facts import FileFacts
from codemods.rules.l2n002.plan import Child, ClassRewrite


@dataclasses.dataclass
class ClassContext:
  """One class being planned: the passes are functions of it, and fill `plan`; dropped whole when the class
  stays Linen."""

  facts: FileFacts
  converted: tp.Mapping[str, ClassRewrite]  # the classes of the file converted before this one, by name
  plan: ClassRewrite  # what the class becomes
  loops: LoopPass  # layers built in for loops -> nnx.List attributes (`loops.Loops`)
  plain_attributes: set[str] = dataclasses.field(default_factory=set)  # set by plain setup() code: not for children


class LoopPass(tp.Protocol):
  """What the other passes ask of the for-loop pass (`loops.Loops`, which the planner puts in each `ClassContext`).

  The loop pass and the size walk call each other (a loop's iterations are sized by the walk, the walk meets the
  loop), so the passes reach it through its context, by this interface; of the passes, only the planner imports it.
  """

  @property
  def loops(self) -> tp.Mapping[cst.For, tp.Any]:
    """The for loops of the class that build layers, or walk a setup() list's (`loops.Loop`: `.node`, the loop that
    builds the list)."""

  @property
  def sites(self) -> tp.Collection[cst.Call]:
    """The constructions built in those loops (each an element of an nnx.List)."""

  def list_heads(self, value: cst.BaseExpression | None) -> list[cst.Call]:
    """The layers written out before the loop appending to the list of `self.<attr> = <list>`."""

  def walked_heads(self, statement: cst.For) -> list[cst.Call]:
    """The layers written out before a setup() list's loop that the method loop `statement` walks first."""

  @property
  def unrolled(self) -> tp.Mapping[cst.For, Child]:
    """The for loops over a setup() list written out (`self.layer = [A(...), A(...)]`) -> its first element."""

  @property
  def refs(self) -> tp.Collection[cst.Name]:
    """The loop names constructor arguments read: valid in the list's comprehension."""

  def plan(self, ctx: ClassContext, statement: cst.For, built: set[cst.Call]) -> None: ...

  def setup_append(self, ctx: ClassContext, statement: cst.BaseStatement, setup: cst.FunctionDef) -> bool: ...

  def appended(self, ctx: ClassContext, value: cst.BaseExpression, attr: str) -> cst.Call | None: ...

  def setup_list(self, ctx: ClassContext, value: cst.ListComp, attr: str) -> cst.Call: ...

  def list_use(self, ctx: ClassContext, sub: cst.Attribute, child: Child, calls: dict[cst.Call, Child]) -> bool: ...

  def list_name(self, ctx: ClassContext, ctor: cst.Call, name: cst.BaseExpression | None) -> str | None: ...

  def plural(self, child: Child, base: str) -> str: ...

  def after_calls(self, ctx: ClassContext, plan: ClassRewrite, calls: dict[cst.Call, Child]) -> None: ...

  def wrap(self, ctx: ClassContext, child: Child) -> str: ...

  def cache_line(self, child: Child, line: str) -> str: ...

  def shapes(self, statement: cst.For, env: dict[str, tp.Any], walk: tp.Callable[..., tp.Any]) -> None: ...

  def seen(self, ctx: ClassContext, child: Child, node: cst.Call, arg_dims: list[Dim]) -> None: ...

  def derive(self, ctx: ClassContext, plan: ClassRewrite, statement: cst.For, env: dict[str, Dim], derive: bool,
             walk: tp.Callable[[cst.BaseSuite, dict[str, Dim]], Dim], shared: dict[tp.Any, str]) -> None: ...
