"""Choices a user makes about the code `linen2nnx migrate` writes (`--train-state`, `--step-style`, `[tool.linen2nnx]`).

Rules read them from `context.scratch[OPTIONS_KEY]` (`MigrationRule.options`).
"""

from __future__ import annotations

import dataclasses

from codemods.example_sizes import ExampleSizes

OPTIONS_KEY = 'linen2nnx.options'
TRAIN_STATE_STYLES = ('nnx', 'keep')
"""'nnx': a flax TrainState becomes `nnx.Optimizer` and steps over the model (the default);
'keep': the TrainState stays, built around `nnx.split` state (the migration guide's variant). A TrainState
subclass with a field that is neither the model's state nor the optimizer's (clu metrics) is kept either way."""
STEP_STYLES = ('functional', 'cached', 'nnx-jit')
"""How a converted training step is jitted and called (docs/performance.md):
'functional' (the default): `@jax.jit` over `(graphdef, state)`, `nnx.split` once before the loop
that calls it, `nnx.merge` inside, `nnx.update` after the loop (the state as a dict of arrays:
`nnx.to_pure_dict`);
'cached': `@nnx.jit` over the model, called through `nnx.cached_partial(step, model, optimizer)`
made before the loop; 'nnx-jit': `@nnx.jit` over the model and optimizer, called with them.
A step the chosen style cannot be applied to safely stays `@nnx.jit` (a report entry says why)."""


@dataclasses.dataclass(frozen=True)
class MigrationOptions:
  """The options of one migration run; the defaults are the idiomatic NNX code."""

  train_state: str = 'nnx'
  step_style: str = 'functional'
  example_sizes: ExampleSizes = ExampleSizes()  # from `--examples FILE.py` (codemods/examples.py)
  unsafe_fixes: bool = False  # `--unsafe-fixes`: a class refused at a statement converts, the statement under a TODO

  def __post_init__(self) -> None:
    if self.train_state not in TRAIN_STATE_STYLES:
      raise ValueError(f'train-state must be one of {", ".join(TRAIN_STATE_STYLES)}, got {self.train_state!r}')
    if self.step_style not in STEP_STYLES:
      raise ValueError(f'step-style must be one of {", ".join(STEP_STYLES)}, got {self.step_style!r}')
