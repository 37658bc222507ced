"""Scope APIs: `self.param` / `self.variable` children, `self.make_rng`, `self.sow`, `self.is_initializing`,
`self.is_mutable_collection('params')`.

NNX creates a module's variables in `__init__` and never during a call, so what Linen's init alone sees is never
true in a call: `if self.is_initializing():` blocks go (their `else:` arm, or their `not` form's body, stays
unconditionally), and any other
`self.is_initializing()`, or `self.is_mutable_collection('params')` (true only in Linen's init, or an apply asked to
create params), is `False` (dopamine's batch norm skipping its `pmean` while initializing).

Planning functions over a `context.ClassContext`, run by `planner.plan_class`: they read the file's facts and
fill the class's plan.
"""

from __future__ import annotations

import keyword
import re

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002 import queries
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.nodes import (
  HAS_VARIABLE_HINT,
  SCOPE_LEADS,
  init_draw,
  init_only,
  is_self_attr,
  literal_identifier,
  make_rng_stream,
  scope_api,
  scope_arguments,
)
from codemods.rules.l2n002.plan import Child, ClassRewrite, Unsupported
from codemods.variable_types import flax_variable_type
from codemods.vocabulary import CONVERTED_APIS, SCOPE_APIS


def variable_child(ctx: ClassContext, call: cst.Call, attr: str | None, hoisted: bool, cache: bool = False) -> Child:
  """A `self.param(name, init, *args)` / `self.variable(collection, name, init, *args)` call.

  A decode cache (`cache`) is made by init_cache, from shapes `_plan_init_cache` derives.
  """
  api = scope_api(call)
  if any(a.keyword is not None and a.keyword.value == 'unbox' for a in call.args):
    raise Unsupported(call, f'self.{api} with unbox=')
  arguments = scope_arguments(call)
  if arguments is None:
    raise Unsupported(call, f'self.{api} with *args or **kwargs, or without an init function: give its '
                             f'{", ".join(SCOPE_LEADS[api])} by position or by name')
  leading, rest = arguments
  if api == 'variable':
    if not isinstance(leading[0], cst.SimpleString):
      raise Unsupported(call, 'self.variable with a collection that is not a literal string')
    collection = leading[0].evaluated_value
    name = leading[1]
  else:
    collection, name = 'params', leading[0]
  if not literal_identifier(name):
    raise Unsupported(call, f'self.{api} with a name that is not a literal identifier')
  values = [leading[-1], *(arg.value for arg in rest)]  # the init function and its arguments
  refs = {} if not hoisted or cache else queries.size_refs(ctx, values)
  for value in values if not cache else ():
    queries.check_hoistable(ctx, value, skip=set(refs))
  if api == 'param':
    var_type = 'nnx.Param'
  else:
    var_type = flax_variable_type(collection) or _variable_class_name(ctx, collection)
  return Child(attr or name.evaluated_value, name.evaluated_value, call, None, None, {}, hoisted=hoisted,
                api=api, collection=collection, var_type=var_type, shape_refs=refs, cache=cache)


def _variable_class_name(ctx: ClassContext, collection: str) -> str:
  if collection not in ctx.plan.variable_classes:
    base = ''.join(part[:1].upper() + part[1:] for part in re.split(r'\W|_', collection) if part)
    base = base if base.isidentifier() and not keyword.iskeyword(base) else 'Collection'
    name = base
    while name in ctx.facts.global_names or name in ctx.plan.variable_classes.values():
      name = f'{base}Variable' if name == base else name + '_'
    ctx.plan.variable_classes[collection] = name
  return ctx.plan.variable_classes[collection]


def plan_scope_calls(ctx: ClassContext, node: cst.ClassDef, plan: ClassRewrite, setup: cst.FunctionDef | None, taken: set[str]) -> None:
  """self.make_rng / self.sow / self.is_initializing / self.is_mutable_collection; any other scope API keeps the
  class Linen."""
  handled = {c.ctor for c in plan.children if c.api is not None} | ctx.plan.cache_uses
  variable_args = {n for c in plan.children if c.api in ('param', 'variable') for n in descendants(c.ctor)}
  in_setup = set(descendants(setup)) if setup is not None else set()
  for sub in descendants(node):
    if not (isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value in SCOPE_APIS):
      continue
    api, call = sub.attr.value, ctx.facts.parent(sub)
    if call in handled:
      continue
    if api == 'make_rng' and call in variable_args:  # `self.variable('s', 'u', init, self.make_rng('s'), shape)`
      stream = _stream(call)
      ctx.plan.exprs[call] = init_draw(stream)
      ctx.plan.pending.append((call, f'self.make_rng({stream!r}) -> {init_draw(stream)}: the key the variable\'s '
                                     'init draws, in __init__'))
      continue
    if sub in in_setup or api not in CONVERTED_APIS - {'param', 'variable'}:
      raise Unsupported(sub, f'self.{api} has no automatic NNX conversion{" in setup()" if sub in in_setup else ""}'
                              + (HAS_VARIABLE_HINT if api in ('has_variable', 'variables') else ''))
    if not (isinstance(call, cst.Call) and call.func is sub):
      raise Unsupported(sub, f'self.{api} used other than by calling it')
    if api == 'make_rng':
      _make_rng(ctx, plan, call, taken)
    elif api == 'sow':
      _sow(ctx, plan, call, taken)
    elif api == 'is_mutable_collection':
      _is_mutable_collection(ctx, call)
    else:
      _is_initializing(ctx, call)


def _stream(call: cst.Call) -> str:
  """The stream `self.make_rng(<literal>)` draws from."""
  stream = make_rng_stream(call)
  if stream is None:
    raise Unsupported(call, 'self.make_rng with a stream name that is not a literal string')
  return stream


def _make_rng(ctx: ClassContext, plan: ClassRewrite, call: cst.Call, taken: set[str]) -> None:
  stream = _stream(call)
  if stream not in plan.streams:
    base = f'{stream}_rngs' if stream.isidentifier() else 'rngs_stream'
    attr = base
    while attr in taken or attr in plan.streams.values():
      attr += '_'
    plan.streams[stream] = attr
    ctx.plan.pending.append((call, f"self.make_rng({stream!r}) -> self.{attr}(), a stream forked from rngs in __init__"))
  ctx.plan.exprs[call] = f'self.{plan.streams[stream]}()'


def _sow(ctx: ClassContext, plan: ClassRewrite, call: cst.Call, taken: set[str]) -> None:
  first = call.args[0].value if call.args and call.args[0].keyword is None else None
  if not isinstance(first, cst.SimpleString):
    raise Unsupported(call, 'self.sow with a collection that is not a literal string')
  name = call.args[1].value if len(call.args) > 1 else None
  if not isinstance(name, cst.SimpleString) or name.evaluated_value in taken | set(plan.streams.values()):
    # NNX's sow outside nnx.capture stores the value as an attribute of that name.
    raise Unsupported(call, 'self.sow with a name that is not a literal string or that names an attribute')
  collection = first.evaluated_value
  var_type = flax_variable_type(collection)
  if var_type is None:
    var_type = _variable_class_name(ctx, collection)
    plan.collections += [collection] if collection not in plan.collections else []
  ctx.plan.exprs[first] = var_type
  ctx.plan.pending.append((call, f'self.sow({collection!r}, ...) -> self.sow({var_type}, ...); '
                              f'collect the values with nnx.capture(model, {var_type})'))


def _is_initializing(ctx: ClassContext, call: cst.Call) -> None:
  parent = ctx.facts.parent(call)
  negated = isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not)
  statement = ctx.facts.parent(parent) if negated else parent
  if not init_only(call):
    raise Unsupported(call, 'self.is_initializing() with arguments')
  if not (isinstance(statement, cst.If) and statement.test is (parent if negated else call)
          and not isinstance(statement.orelse, cst.If)):
    _never_in_a_call(ctx, call, 'Linen initializes')  # `initializing = self.is_initializing()`
    return
  ctx.plan.ifs[statement] = negated
  what = 'kept unconditionally' if negated else 'removed'
  if statement.orelse is not None:
    what = f'{"kept" if negated else "removed"}, its else arm {"removed" if negated else "kept"}'
  ctx.plan.pending.append((call, f'`if {"not " if negated else ""}self.is_initializing():` block {what}: '
                              f'NNX creates variables in __init__, never during a call'))


def check_mutable_collections(ctx: ClassContext, node: cst.ClassDef) -> None:
  """Raises Unsupported at the first `self.is_mutable_collection` of the class `node` that tests another collection
  than 'params' (checked before the planning passes, so that the TODO names it): NNX variables are always mutable,
  and what such a test tells apart (training, decoding) is the module's mode or its own state."""
  for sub in descendants(node):
    if isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value == 'is_mutable_collection':
      call = ctx.facts.parent(sub)
      if not (isinstance(call, cst.Call) and call.func is sub and init_only(call)):
        raise Unsupported(call if isinstance(call, cst.Call) else sub,
                          f'{ctx.facts.code(call)}: NNX variables are always mutable; only '
                          "self.is_mutable_collection('params') (Linen's init) is converted: test the module's mode "
                          '(self.deterministic, set by model.train() / model.eval()) or its own state instead')


def _is_mutable_collection(ctx: ClassContext, call: cst.Call) -> None:
  """`self.is_mutable_collection('params')` (the only one `check_mutable_collections` lets through) -> `False`."""
  _never_in_a_call(ctx, call, 'Linen creates params (its init)')


def _never_in_a_call(ctx: ClassContext, call: cst.Call, when: str) -> None:
  """`call`, true only while `when`, is `False` in NNX, where no call creates variables."""
  ctx.plan.exprs[call] = 'False'
  ctx.plan.pending.append((call, f'{ctx.facts.code(call)} -> False: true only while {when}, and NNX creates '
                                 'variables in __init__, never during a call'))


# --- helpers ---------------------------------------------------------------------------------
