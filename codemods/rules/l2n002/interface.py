"""What a class of another file of the run needs to know of a converted class to build it as a submodule
(`ClassInterface`).

A converted class's record (`ConvertedClass.interface`) carries its interface from the file that converted it to
the files whose classes build it (`dopamine`'s `networks.ImpalaEncoder(...)` in another module's network); the run
migrates those files again with the records (`engine._settle`), and there the interface stands in for the plan of
a class of the same file (`sibling_plan`): the constructor's fields and sizes, the call's train/eval switches and
output size. Plain data, so that records travel between worker processes and compare by value.
"""

from __future__ import annotations

import dataclasses

from codemods.rules.l2n002.dims import Dim, Shape
from codemods.rules.l2n002.plan import ClassRewrite, draws_rngs


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
  size_params: tuple[tuple[str, Dim], ...]
  output: Dim
  carry_output: Dim
  first_output: Dim
  last_output: Dim
  output_shape: Shape
  example_params: tuple[str, ...]
  tie_flags: tuple[tuple[str, str], ...]
  cache_input: str | None
  draws_rngs: bool


def interface_of(plan: ClassRewrite) -> ClassInterface:
  """The interface of the converted class `plan`."""
  return ClassInterface(
      plan.name, tuple(plan.field_names), tuple(plan.linen_fields), tuple(plan.call_params), tuple(plan.mode_params),
      tuple(plan.mode_fields.items()), tuple(plan.switch_defaults.items()), tuple(plan.size_params), plan.output,
      plan.carry_output, plan.first_output, plan.last_output, plan.output_shape, tuple(plan.example_params),
      tuple(plan.tie_flags.items()), plan.cache_input, draws_rngs(plan))


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
      cache_input=interface.cache_input, draws=interface.draws_rngs, origin=origin)
