"""Rewrite train/eval modes: `model.eval()` / `model.train()` where the applies' `train=` / `deterministic=` said so.

One call after the construction when every apply agrees, else one before each top-level
statement (or each statement) that applies the model in a mode.
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.tree import Tree


def place_modes(walk: Walk, statements: tp.Sequence[cst.BaseStatement]) -> None:
  """One `model.eval()` after the construction when every call agrees, else one before each statement."""
  group, tree = walk.group, walk.tree
  if len(group.kept_modes) == 1:  # before nnx.split: the graphdef keeps the mode
    _insert(walk, group.anchor or group.init, after=f'{group.model}.{"eval" if group.kept_modes.pop() else "train"}()')
  modes = {owner: mode for owner, mode in group.modes.items() if not isinstance(owner, cst.FunctionDef)}
  values = set(modes.values())
  if not values or values == {None}:
    return
  if None in values:
    statement = next(s for s, m in modes.items() if m is None)
    raise Skip(statement, f'{group.model}.apply without a train/eval argument next to calls with one')
  if len(values) == 1:
    _insert(walk, group.anchor or group.init, after=f'{group.model}.{"eval" if values.pop() else "train"}()')
    return
  by_top: dict[cst.BaseStatement, set[bool]] = {}
  for statement, mode in modes.items():
    by_top.setdefault(_top_statement(tree, statement, statements), set()).add(mode)
  for statement, mode in modes.items():
    top = _top_statement(tree, statement, statements)
    if len(by_top[top]) == 1:
      if top not in group.done:
        group.done.add(top)
        _insert(walk, top, before=f'{group.model}.{"eval" if mode else "train"}()')
    else:
      _insert(walk, statement, before=f'{group.model}.{"eval" if mode else "train"}()')


def _top_statement(tree: Tree, statement: cst.BaseStatement,
                   statements: tp.Sequence[cst.BaseStatement]) -> cst.BaseStatement:
  current = statement
  while current is not None and current not in statements:
    current = tree.parent(current)
  return current if current is not None else statement


def _insert(walk: Walk, statement: cst.BaseStatement, *, before: str = '', after: str = '') -> None:
  """`model.train()` / `model.eval()` before or after `statement`; and the same call on each decode-mode view made
  before it in the same block (`nnx.with_attributes` copies the modules: a mode set on the model later does not
  reach a view made earlier)."""
  group = walk.group
  current = group.statements.get(statement, [statement]) or []
  code = before or after
  body = walk.tree.block(statement)
  views = [name for name, view in sorted(group.twin_views.items())
           if view in body and statement in body and body.index(view) < body.index(statement)]
  calls = [code, *(f'{name}.{code.split(".", 1)[1]}' for name in views)]
  extra = [cst.parse_statement(f'{line}\n') for line in calls]
  group.statements[statement] = [*extra, *current] if before else [*current, *extra]
  group.mode_inserts.add(statement)
  for line in calls:
    group.changes.append((statement, f'{line} (train/eval mode, set on the {"view" if line != code else "model"})'))
