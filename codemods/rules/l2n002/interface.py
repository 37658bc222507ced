"""What a class of another file of the run needs to know of a converted class to build it as a submodule
(`ClassInterface`).

A converted class's record (`ConvertedClass.interface`) carries its interface from the file that converted it to
the files whose classes build it (`dopamine`'s `networks.ImpalaEncoder(...)` in another module's network); the run
migrates those files again with the records (`engine._settle`), and there the interface stands in for the plan of
a class of the same file (`sibling_plan`): the constructor's fields and sizes, the call's train/eval switches and
output size, the code its setup() binds once to attributes and locals (`setup_bindings`), which a size it returns
may name (diffusers' `out_channels = self.in_channels if self.out_channels is None else ...`), and what a Linen
class there wraps it with (`nnx_bridge.to_linen`: `LinenBridgeFacts`; diffusers' ControlNet, Linen for its base,
builds the time embedding of another file). Plain data, so that records travel between worker processes and
compare by value.
"""

from __future__ import annotations

import builtins
import dataclasses

import libcst as cst

from codemods.rules.l2n002.dims import Dim, Shape
from codemods.rules.l2n002.nodes import read_names
from codemods.rules.l2n002.plan import ClassRewrite, EachElement, LinenBridgeFacts, draws_rngs


@dataclasses.dataclass(frozen=True)
class ClassInterface:
  """The parts of a converted class's `ClassRewrite` that a construction of it in another file reads."""

  name: str
  field_names: tuple[str, ...]
  linen_fields: tuple[str, ...]
  call_params: tuple[str, ...]
  mode_params: tuple[tuple[int, str, bool], ...]
  mode_fields: tuple[tuple[str, bool], ...]
  switch_defaults: tuple[tuple[str, bool], ...]
  size_params: tuple[tuple[str, Dim | EachElement], ...]
  output: Dim
  carry_output: Dim
  first_output: Dim
  last_output: Dim
  output_shape: Shape
  example_params: tuple[str, ...]
  tie_flags: tuple[tuple[str, str], ...]
  cache_input: str | None
  draws_rngs: bool
  setup_attributes: tuple[tuple[str, str], ...] = ()  # `self.<attr> = <code>` set once by setup(), fields only
  setup_locals: tuple[tuple[str, str], ...] = ()  # `<local> = <code>` bound once by setup(), fields only
  bridge_facts: LinenBridgeFacts | None = None  # what a Linen class wraps it with (nnx_bridge.to_linen)
  merged_switches: tuple[str, ...] = ()  # switches its call merges with the field of their name
  call_fields: tuple[tuple[str, str | None], ...] = ()  # fields taken at its call (`call_fields.py`)


def interface_of(plan: ClassRewrite, bindings: tuple[dict[str, str], dict[str, str]],
                 bridge: LinenBridgeFacts) -> ClassInterface:
  """The interface of the converted class `plan`; `bindings`: its setup()'s attributes and locals set once
  (`sizes.setup_bindings`), of which those whose code reads nothing but `self` and builtins travel (a global of
  its file may mean something else where it is built); `bridge`: what a Linen class wraps it with."""
  attributes, bound = ({name: code for name, code in part.items() if _self_contained(code)} for part in bindings)
  return ClassInterface(
      plan.name, tuple(plan.field_names), tuple(plan.linen_fields), tuple(plan.call_params), tuple(plan.mode_params),
      tuple(plan.mode_fields.items()), tuple(plan.switch_defaults.items()), tuple(plan.size_params), plan.output,
      plan.carry_output, plan.first_output, plan.last_output, plan.output_shape, tuple(plan.example_params),
      tuple(plan.tie_flags.items()), plan.cache_input, draws_rngs(plan), tuple(attributes.items()), tuple(bound.items()),
      bridge, tuple(plan.merged_switches), tuple(plan.call_fields.items()))


def sibling_plan(interface: ClassInterface, origin: str) -> ClassRewrite:
  """A plan that stands in for the class of `interface`, converted in the file `origin`, where a class of this
  file builds it."""
  return ClassRewrite(
      interface.name, field_names=list(interface.field_names), linen_fields=list(interface.linen_fields),
      call_params=list(interface.call_params), mode_params=list(interface.mode_params),
      mode_fields=dict(interface.mode_fields), switch_defaults=dict(interface.switch_defaults),
      size_params=list(interface.size_params), output=interface.output,
      carry_output=interface.carry_output, first_output=interface.first_output, last_output=interface.last_output,
      output_shape=interface.output_shape,
      example_params=list(interface.example_params), tie_flags=dict(interface.tie_flags),
      cache_input=interface.cache_input, draws=interface.draws_rngs, origin=origin,
      setup_bindings=(dict(interface.setup_attributes), dict(interface.setup_locals)),
      bridge_facts=interface.bridge_facts, merged_switches=dict.fromkeys(interface.merged_switches),
      call_fields=dict(interface.call_fields))


def _self_contained(code: str) -> bool:
  """Whether `code` reads no name but `self` and builtins (`self.in_channels if self.out_channels is None else
  self.out_channels`)."""
  try:
    node = cst.parse_expression(code)
  except cst.ParserSyntaxError:
    return False
  return all(n.value == 'self' or hasattr(builtins, n.value) for n in read_names(node))
