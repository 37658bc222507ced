"""THE table of Linen -> NNX knowledge.

One frozen row per Linen layer, read by the runtime bridge, the codemod, the parity checker and
the checkpoint converter. It is plain data (stdlib only, classes named by dotted strings) so
the codemod can import it without importing jax.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModeArgument:
  """A Linen call or field argument whose value follows NNX's train/eval mode.

  `nnx_attribute` is the attribute that `nnx.Module.train()` / `.eval()` set on every
  submodule (`deterministic` or `use_running_average`, both True in eval mode); `inverted`
  is True for arguments that are True in *train* mode (`train=True`).
  """

  name: str
  nnx_attribute: str
  inverted: bool = False

  def value(self, nnx_attribute_value: bool) -> bool:
    """The argument's value given the NNX attribute's value."""
    return (not nnx_attribute_value) if self.inverted else nnx_attribute_value


MODE_ARGUMENTS: tuple[ModeArgument, ...] = (
    ModeArgument('deterministic', 'deterministic'),
    ModeArgument('use_running_average', 'use_running_average'),
    ModeArgument('train', 'deterministic', inverted=True),
    ModeArgument('training', 'deterministic', inverted=True),
    ModeArgument('is_training', 'deterministic', inverted=True),
)
"""Linen argument names that mean "train or eval"; `nnx.Module.train()` sets the attribute."""
