"""The conditions constructions are built under, for rule L2N002.

A submodule built in an arm of a conditional on fields (`if self.config.use_norm: x = nn.LayerNorm()(x)`, also in
elif chains and nested conditionals) exists in NNX under the same condition: `__init__` builds it when the tests
of the arms it is in hold (None otherwise), and the call site keeps its conditional.
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002 import queries
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.plan import Child, Unsupported
from nnx_bridge.layer_signatures import STATELESS
from nnx_bridge.layer_table import find_layer


Tests = tuple[tuple[str, bool], ...]
"""The tests of the arms a construction is in, as (code for __init__, whether it needs no parentheses in `and`)."""


def construction_conditions(ctx: ClassContext, statement: cst.If, built: set[cst.Call],
                            path: Tests = ()) -> dict[cst.Call, str]:
  """`if self.config.use_norm: x = nn.LayerNorm()(x)`, also in elif chains and nested conditionals: each
  construction in it, with the condition (code for __init__) under which it exists, the tests of the arms it is
  in joined (`not (self.norm == 'batch') and self.norm == 'layer'`); a test that depends on the call (an input, a
  train/eval switch) is refused, but over layers that hold no variables, built whatever it says."""
  test = statement.test
  if all(_stateless(ctx, sub) for sub in descendants(statement) if sub in built):  # jax-md's `if not deterministic
    return {}  # and self.dropout_rate > 0: x = nn.Dropout(...)(x, deterministic=False)`: it exists in both modes
  reads = _call_read(ctx, test)
  if reads == 'switch':
    raise Unsupported(test, 'a submodule created under a train/eval switch (in NNX it exists in both modes)')
  if reads == 'call':
    raise Unsupported(test, 'a submodule created under a condition on the call (its inputs or locals): NNX '
                             'creates submodules in __init__')
  code = queries.code(ctx, test)
  atomic = isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))
  conditions = arm_conditions(ctx, statement.body, built, (*path, (code, atomic)))
  negated = (*path, (f'not {code}' if atomic else f'not ({code})', True))  # `not` binds tighter than `and`
  if isinstance(statement.orelse, cst.If):  # elif
    conditions.update(construction_conditions(ctx, statement.orelse, built, negated))
  elif statement.orelse is not None:
    conditions.update(arm_conditions(ctx, statement.orelse.body, built, negated))
  return conditions


def exits_early(statement: cst.CSTNode) -> bool:
  """`if <test>: ...; return ...` without an else: the code after it runs only where the test fails. (After an
  `if <test>: raise ...` guard it runs wherever the module runs at all: the layers it builds need no condition.)"""
  if not isinstance(statement, cst.If) or statement.orelse is not None or not statement.body.body:
    return False
  last = statement.body.body[-1]
  return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], cst.Return)


def exit_path(ctx: ClassContext, statement: cst.If, later: list[cst.CSTNode], built: set[cst.Call],
              path: Tests) -> Tests:
  """The tests that hold after `statement`, which `exits_early`: `path` and its test failing, when the test reads
  fields only and a statement `later` than it builds a layer with variables (flax-style heads: `if self.pooled:
  return nn.Dense(2)(x.mean(1))`, then the other layers, which Linen builds only where the test fails); else
  `path`: after a return on what the call gives (`if x.shape[0] == 0: return x`), the layers are built as Linen's
  init builds them, on inputs that go on."""
  if not any(sub in built and not _stateless(ctx, sub) for node in later for sub in descendants(node)):
    return path
  if _call_read(ctx, statement.test) is not None:
    return path
  return (*path, (queries.negated_code(ctx, statement.test), True))  # `not` binds tighter than `and`


def _call_read(ctx: ClassContext, test: cst.BaseExpression) -> str | None:
  """What of the call a test reads: 'switch' (a train/eval switch), 'call' (an input or a local), or None: only what
  __init__ knows (fields, config, constants)."""
  if any(isinstance(n, cst.Name) and n.value in ctx.plan.switches for n in (test, *descendants(test))):
    return 'switch'
  try:
    queries.check_hoistable(ctx, test)
  except Unsupported:
    return 'call'
  return None


def _stateless(ctx: ClassContext, ctor: cst.Call) -> bool:
  """Whether `ctor` builds a table layer that holds no variables (`layer_signatures.STATELESS`: a dropout), which
  changes no state where it exists while Linen would not build it: `__init__` builds it whatever the test."""
  return any((spec := find_layer(q.name)) is not None and spec.linen in STATELESS
             for q in ctx.facts.qualified_names(ctor.func))


def arm_conditions(ctx: ClassContext, arm: cst.BaseSuite, built: set[cst.Call], path: Tests) -> dict[cst.Call, str]:
  """The constructions of one arm of a conditional, each with the tests `path` leads to it through."""
  return statement_conditions(ctx, arm.body, built, path)


def statement_conditions(ctx: ClassContext, statements: tp.Sequence[cst.CSTNode], built: set[cst.Call],
                         path: Tests) -> dict[cst.Call, str]:
  """The constructions of `statements`, each with the tests `path` (not empty) leads to it through."""
  condition = path[0][0] if len(path) == 1 else ' and '.join(code if atomic else f'({code})' for code, atomic in path)
  conditions = {}
  for statement in statements:
    if isinstance(statement, cst.If):  # the arms of a plain if hold simple statements and ifs (`is_plain_if`)
      conditions.update(construction_conditions(ctx, statement, built, path))
    else:
      conditions.update((sub, condition) for sub in descendants(statement) if sub in built)
  return conditions


ArmPath = frozenset[tuple[str, bool]]
"""The tests of the if / elif / else arms a node sits in, within its method: (the test's code, whether it holds)."""


def arm_path(ctx: ClassContext, node: cst.CSTNode) -> ArmPath:
  """The arms `node` sits in: in an arm's body its test holds, and the tests of the arms before it in the chain
  do not (an `else` holds where no test of its chain does)."""
  found: set[tuple[str, bool]] = set()
  child, parent = node, ctx.facts.parent(node)
  while parent is not None and not isinstance(parent, cst.FunctionDef):
    if isinstance(parent, cst.If) and child is parent.body:
      found |= {*_holding(ctx, parent.test), *_earlier_tests(ctx, parent)}
    elif isinstance(parent, cst.Else) and isinstance(owner := ctx.facts.parent(parent), cst.If):
      found |= {*_holding(ctx, owner.test, holds=False), *_earlier_tests(ctx, owner)}
    child, parent = parent, ctx.facts.parent(parent)
  return frozenset(found)


def built_under(ctx: ClassContext, child: Child) -> ArmPath:
  """The arms `child` exists under: its construction's, and those a local naming one class or another names its class
  under (`constructions.chosen_classes`)."""
  return arm_path(ctx, child.ctor) | child.chosen


def same_place(child: Child, other: Child) -> bool:
  """Whether `other` stands where `child` does: the same construction (the classes a local may name there), or the
  same attribute where neither is one element of a list written out (before a loop's, or alone)."""
  element = lambda c: c.element is not None or c.head
  return other.ctor is child.ctor or other.attr == child.attr and not element(child) and not element(other)


def may_meet(left: ArmPath, right: ArmPath) -> bool:
  """Whether code on the arm path `left` and code on `right` may run in one module: no test holds on one and
  fails on the other (setup()'s `if self.config.attention_type == "original_full":` and the same test in
  `__call__`, both tests of fields, which do not change)."""
  return not any((test, not holds) in right for test, holds in left)


def _earlier_tests(ctx: ClassContext, statement: cst.If) -> set[tuple[str, bool]]:
  """The tests of the arms before the `elif` `statement` in its chain, none of which holds where it runs."""
  found, node = set(), statement
  while isinstance(parent := ctx.facts.parent(node), cst.If) and parent.orelse is node:
    found.add((test_key(ctx, parent.test), False))
    node = parent
  return found


def _holding(ctx: ClassContext, test: cst.BaseExpression, holds: bool = True) -> set[tuple[str, bool]]:
  """What an arm whose `test` holds (fails: `holds` False) knows: the test, and, where it holds, each term of an
  `and`, the operand of a `not` failing, and the same of a local bound once to tests of fields (T5's
  `do_cross_attention = self.causal and encoder_hidden_states is not None`, then `if do_cross_attention:`)."""
  found = {(test_key(ctx, test), holds)}
  if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
    found |= _holding(ctx, test.expression, not holds)
  elif holds and isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
    found |= _holding(ctx, test.left) | _holding(ctx, test.right)
  elif holds and isinstance(test, cst.Name) and (value := queries.bound_once(ctx, test)) is not None:
    found |= _field_terms(ctx, value)
  return found


def _field_terms(ctx: ClassContext, test: cst.BaseExpression) -> set[tuple[str, bool]]:
  """The terms of an `and` of `test` that read fields alone (`self.causal`), which hold wherever the test did."""
  if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
    return _field_terms(ctx, test.left) | _field_terms(ctx, test.right)
  names = [n for n in (test, *descendants(test)) if isinstance(n, cst.Name)
           and not (isinstance(ctx.facts.parent(n), cst.Attribute) and ctx.facts.parent(n).attr is n)]
  if names and all(n.value == 'self' for n in names):
    return {(test_key(ctx, test), True)}
  return set()


def test_key(ctx: ClassContext, test: cst.BaseExpression) -> str:
  return ' '.join(ctx.facts.code(test).split())
