"""Choices a user makes about the code `linen2nnx migrate` writes (`--train-state`, `[tool.linen2nnx]`).

Rules read them from `context.scratch[OPTIONS_KEY]` (`MigrationRule.options`).
"""

from __future__ import annotations

import dataclasses

from codemods.example_sizes import ExampleSizes

OPTIONS_KEY = 'linen2nnx.options'
TRAIN_STATE_STYLES = ('nnx', 'keep')
"""'nnx': a flax TrainState becomes `nnx.Optimizer` and steps over the model (the default);
'keep': the TrainState stays, built around `nnx.split` state (the migration guide's variant)."""


@dataclasses.dataclass(frozen=True)
class MigrationOptions:
  """The options of one migration run; the defaults are the idiomatic NNX code."""

  train_state: str = 'nnx'
  example_sizes: ExampleSizes = ExampleSizes()  # from `--examples FILE.py` (codemods/examples.py)

  def __post_init__(self) -> None:
    if self.train_state not in TRAIN_STATE_STYLES:
      raise ValueError(f'train-state must be one of {", ".join(TRAIN_STATE_STYLES)}, got {self.train_state!r}')
