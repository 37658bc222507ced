"""The rule registry: every `linen2nnx migrate` rule, in the order they run, and `--select`."""

from __future__ import annotations

import typing as tp

from codemods.rule import MigrationRule
from codemods.rules.l2n001_convert_initializers import ConvertInitializersRule
from codemods.rules.l2n002 import ConvertModuleDefinitionsRule
from codemods.rules.l2n003 import ConvertInitApplyRule

ALL_RULES: tuple[type[MigrationRule], ...] = (ConvertInitializersRule, ConvertModuleDefinitionsRule, ConvertInitApplyRule)


def select_rules(codes: tp.Iterable[str]) -> tuple[type[MigrationRule], ...]:
  """The rules whose code starts with one of `codes` ('L2N001', or 'L2N' for all), in registry order.

  A selected rule brings the rules it builds on (its `AFTER` codes): L2N003 rewrites call
  sites of the classes L2N002 converts.
  """
  codes = [code.strip().upper() for code in codes if code.strip()]
  unknown = [code for code in codes if not any(rule.CODE.startswith(code) for rule in ALL_RULES)]
  if unknown:
    known = ', '.join(rule.CODE for rule in ALL_RULES)
    raise ValueError(f'unknown rule code(s) {", ".join(unknown)}; known codes: {known}')
  selected = {rule.CODE for rule in ALL_RULES if any(rule.CODE.startswith(code) for code in codes)}
  for rule in reversed(ALL_RULES):
    if rule.CODE in selected:
      selected.update(rule.AFTER)
  return tuple(rule for rule in ALL_RULES if rule.CODE in selected)
