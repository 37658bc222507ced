"""Rewrite decoding: a decode-mode twin of the model becomes a view of it, its cache init `init_cache`.

`decoder = Model(<same arguments>, decode=True)` with `cache = decoder.init(key, x)['cache']`
(the lm1b / wmt pattern) becomes `decoder = nnx.with_attributes(model, decode=True)` (the same
Variables, `decode` set on every submodule that has it) and `decoder.init_cache(<shape of x>)`
(L2N002's cache method); its `mutable=['cache']` applies become plain calls (`applies`).
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.rules.l2n003.analyse import arguments_without
from codemods.rules.l2n003.analyse import example_shape
from codemods.rules.l2n003.analyse import init_arguments
from codemods.rules.l2n003.analyse import init_statement
from codemods.rules.l2n003.common import Walk
from codemods.rules.l2n003.common import replace_statement
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.facts import collection
from codemods.rules.l2n003.syntax import assigned_name
from codemods.rules.l2n003.syntax import assigned_value


def decode_views(walk: Walk, statements: tp.Sequence[cst.BaseStatement], index: int, model_call: cst.Call) -> None:
  """Each decode-mode twin of the model built after its init (`statements[index]`), as a view of the model."""
  group, tree, run = walk.group, walk.tree, walk.run
  base = arguments_without(tree, model_call, drop='decode')
  for position in range(index + 1, len(statements)):
    statement, value = statements[position], assigned_value(statements[position])
    decode = [a for a in value.args if a.keyword is not None and a.keyword.value == 'decode'] \
        if isinstance(value, cst.Call) and tree.code(value.func) == tree.code(model_call.func) else []
    if not decode or arguments_without(tree, value, drop='decode') != base:
      continue
    name = assigned_name(statement)
    found = next((f for s in statements[position + 1:] if (f := init_statement(s)) and f.model == name), None)
    if found is None or found.kind != collection('cache') or not group.record.cache_input:
      raise Skip(value, f"{name}: a decode-mode {tree.code(value.func)} without `... = {name}.init(key, x)['cache']`")
    init, call, scope = found.statement, found.call, tree.scope(statement)
    if len(tree.assignments(scope, name)) != 1:
      raise Skip(value, f'{name} is assigned more than once')
    example = init_arguments(tree, group.model, group.record, call)[1].get(group.record.cache_input)
    if example is None:
      raise Skip(call, f'{name}.init without the {group.record.cache_input} whose shape init_cache takes')
    view = f'{name} = nnx.with_attributes({group.model}, decode={tree.code(decode[0].value)})'
    shape = example_shape(tree, example)
    replace_statement(walk, statement.body[0], view)
    group.statements[init] = [cst.parse_statement(f'{name}.init_cache({shape})\n').with_changes(
        leading_lines=init.leading_lines)]
    group.changes.append((value, f'{view}: a decode-mode view sharing the variables of {group.model}'))
    group.changes.append((call, f'{name}.init(...)[\'cache\'] -> {name}.init_cache({shape})'))
    group.twins[name], group.twin_views[name] = scope, statement
    group.model_uses.add(call.func.value)
    group.recognized.update((statement.body[0].targets[0].target, init.body[0].targets[0].target))
    run.claimed.add(init)
    walk.name(scope, found.target, collection('cache'))
