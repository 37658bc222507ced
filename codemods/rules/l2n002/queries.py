"""Shared reads over the class being planned, used by every planning pass: the code of a node moved to
__init__ and whether it may move (`check_hoistable`), NNX names for Linen names, locals bound to sizes or to
constructions, train/eval switches. Plain functions over a `context.ClassContext`; this module imports no pass.

`check_hoistable` records in the plan the aliases it resolves (`cfg` -> `self.config`); `local_uses` the statement
that goes; `switch` the train/eval reads it accepts.
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.nodes import children
from codemods.nodes import descendants
from codemods.rules.l2n002.call_values import call_value_param
from codemods.rules.l2n002.context import ClassContext
from codemods.rules.l2n002.nodes import (
  Replace,
  has_scope_call,
  init_draw,
  is_none_test,
  is_self_attr,
  last_axis_array,
  make_rng_stream,
  nnx_counterpart,
  paren,
  size_local_of,
)
from codemods.rules.l2n002.plan import Unsupported
from codemods.vocabulary import LINEN_ARRAY_FUNCTIONS, LINEN_KEPT_FUNCTIONS, NNX_CALL_TWINS
from nnx_bridge.layer_table import find_layer


def code(ctx: ClassContext, node: cst.CSTNode, replacements: dict[cst.CSTNode, str] | None = None) -> str:
  """The code of `node` moved to __init__, with Linen names (and `replacements`) rewritten."""
  return ctx.facts.code(node.visit(Replace({**ctx.plan.exprs, **ctx.plan.aliases, **(replacements or {})},
                                         ctx.plan.keywords)))


def negated_code(ctx: ClassContext, test: cst.BaseExpression) -> str:
  """The code of `not <test>` moved to __init__ (`x` for `not x`; parentheses where they are needed)."""
  if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
    return code(ctx, test.expression)
  return f'not {code(ctx, test)}' if isinstance(test, (cst.Name, cst.Attribute)) else f'not ({code(ctx, test)})'


def check_hoistable(ctx: ClassContext, value: cst.CSTNode, skip: tp.Collection[cst.CSTNode] = (), linen: bool = False) -> None:
  """Code moved into __init__ must mean the same there: no locals (but `skip`), Linen names NNX shares (any
  Linen name, with `linen`: code that stays Linen)."""
  if value in skip or value in ctx.plan.hoistable or value in ctx.loops.refs or kept_linen(ctx, value) \
      or (ctx.facts.is_linen_name(value) if linen else nnx_name_for(ctx, value) is not None):
    return
  if isinstance(value, cst.Name) and value.value != 'self' and value.value not in ctx.plan.switches:
    scope = ctx.facts.scope(value)
    outer = (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)
    assignments = list(scope[value.value]) if scope is not None else []
    if scope is not None and not isinstance(scope, outer) and any(not isinstance(a.scope, outer) for a in assignments) \
        and not _setup_local(ctx, assignments) and not _lambda_parameter(ctx, assignments):
      alias = _self_alias(ctx, assignments) or _value_alias(ctx, value, assignments, skip)
      ctx.plan.aliases[value] = alias
  for child in children(value):
    check_hoistable(ctx, child, skip, linen)


def _lambda_parameter(ctx: ClassContext, assignments: list[cst.metadata.BaseAssignment]) -> bool:
  """Whether a name is a parameter of a lambda (`lambda _, shape: jnp.ones(shape)`), which moves with its code."""
  return bool(assignments) and all(isinstance(a.scope, cst.metadata.FunctionScope) and isinstance(a.scope.node, cst.Lambda)
                                   for a in assignments)


def _setup_local(ctx: ClassContext, assignments: list[cst.metadata.BaseAssignment]) -> bool:
  """Whether a local is one of setup()'s: plain setup() code stays, in its place, in __init__ (`setup_code.py`),
  so code there sees it."""
  return bool(assignments) and all(isinstance(a.scope, cst.metadata.FunctionScope) and isinstance(a.scope.node, cst.FunctionDef)
                                   and a.scope.node.name.value == 'setup'
                                   and a.scope.node in ctx.facts.class_defs[ctx.plan.name].body.body
                                   for a in assignments)


def _self_alias(ctx: ClassContext, assignments: list[cst.metadata.BaseAssignment]) -> str | None:
  """`self.config` when the local is bound once, by `name = self.config` (or a longer chain, or an attribute
  chain of such a local: `p = cfg.patch_size`)."""
  if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
    return None
  target = ctx.facts.parent(assignments[0].node)
  assign = ctx.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
  if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and target.target is assignments[0].node):
    return None
  chain = assign.value
  while isinstance(chain, cst.Attribute):
    chain = chain.value
  if not isinstance(chain, cst.Name) or assign.value is chain:
    return None
  code = ctx.facts.code(assign.value)
  if chain.value == 'self':
    return code
  scope = ctx.facts.scope(chain)  # `p = cfg.patch_size` after `cfg = self.config`
  base = _self_alias(ctx, list(scope[chain.value])) if scope is not None and chain.value in scope else None
  return None if base is None else base + code[len(chain.value):]


def _value_alias(ctx: ClassContext, name: cst.Name, assignments: list[cst.metadata.BaseAssignment],
                 skip: tp.Collection[cst.CSTNode] = ()) -> cst.BaseExpression | str:
  """The value of a local bound once, by a statement of its method's own body, to code that may move to __init__
  (`initializer = nn.initializers.xavier_uniform()`, `features = self.width * 2`; `skip`: the input sizes in it,
  which become constructor arguments): __init__ evaluates it where the construction goes, and the statement stays
  where it is for the rest of the body. Raises Unsupported, naming the local and what it reads, for any other
  local."""
  if len(assignments) == 1 and isinstance(assignments[0].node, cst.FunctionDef):
    return _hoisted_function(ctx, name, assignments[0].node, skip)
  if any(isinstance(a.node, (cst.FunctionDef, cst.ClassDef)) for a in assignments):
    raise Unsupported(name, f'a constructor argument uses {name.value}, defined in the method: define it at module '
                            'level or as a method, reading only fields and constants, and pass it in')
  assign = _single_assign(ctx, assignments) or _arm_local(ctx, name, assignments)
  arms = _arm_values(ctx, name, assignments) if assign is None else None
  if arms is not None:  # `num_embeddings = 201` or `= 101` by a test on fields: the same choice in __init__
    branches, otherwise = arms
    try:
      for node in (*(n for branch in branches for n in branch), otherwise):
        check_hoistable(ctx, node)
    except Unsupported as e:
      what = _call_only(ctx, e)
      raise Unsupported(name, f'a constructor argument uses the local {name.value}, bound in the arms of an if by code '
                              f'that reads {what}, which only the call knows: make it a field, or a constructor '
                              'argument') from None
    return '(' + ''.join(f'{paren(code(ctx, v))} if {code(ctx, t)} else ' for t, v in branches) \
        + f'{paren(code(ctx, otherwise))})'
  rebound = _rebound_value(ctx, name, assignments) if assign is None and arms is None else None
  if rebound is not None:
    return rebound
  if assign is None:
    raise Unsupported(name, f'a constructor argument uses the local {name.value}, which is bound more than once or '
                            'inside a block: bind it once, at the top of the method, or once in each arm of an if on '
                            'fields, to code of fields and constants')
  if isinstance(assign.value, cst.Call) and isinstance(assign.value.func, cst.Call) \
      and _builds_module(ctx, assign.value.func):  # evojax's `init_decoder_state = Encoder(...)(encoder_inputs)`
    raise Unsupported(name, f'a constructor argument uses the local {name.value}, the output of a submodule\'s call, '
                            'which only the call knows: give it to the call of the submodule that takes it (a '
                            '__call__ argument) rather than to its constructor')
  if (stream := make_rng_stream(assign.value)) is not None:  # `key = self.make_rng('s')`: __init__ draws it
    draw = init_draw(stream)
    ctx.plan.pending.append((name, f'{name.value} = {ctx.facts.code(assign.value)}, read by code that moves to '
                                   f'__init__: {draw} there'))
    return draw
  if has_scope_call(assign.value) or _builds_module(ctx, assign.value):
    raise Unsupported(name, f'a constructor argument uses the local {name.value}, bound to a submodule or a variable: '
                            'pass the submodule or variable itself')
  try:
    check_hoistable(ctx, assign.value, skip)
  except Unsupported as e:
    what = _call_only(ctx, e)
    param = call_value_param(ctx, name, assign.value)  # `token_size = x.shape[0]`: a constructor argument
    if param is not None:
      return param
    raise Unsupported(name, f'a constructor argument uses the local {name.value}, whose value reads {what}, which '
                            'only the call knows: make it a field, or a constructor argument') from None
  return assign.value


def _call_only(ctx: ClassContext, error: Unsupported) -> str:
  """The local that `error` (of `check_hoistable` over a local's value) names as known to the call only; `error`
  itself, raised again, when it says something else (a Linen name or call with no conversion)."""
  if not isinstance(error.node, cst.Name) or ctx.facts.is_linen_name(error.node):
    raise error
  return error.node.value


def _hoisted_function(ctx: ClassContext, name: cst.Name, function: cst.FunctionDef,
                      skip: tp.Collection[cst.CSTNode] = ()) -> str:
  """A function the method defines once and a constructor argument names (jax-md's `def init_fn(key, shape)`
  handed to `self.param`): its definition is copied into __init__ before the hoisted layers, where the argument
  names it, and stays where it is for the rest of the body. It may read its own parameters and locals, globals,
  builtins, `self` (the fields are stored first) and input sizes (`skip`: dopamine's `mu_init` reading
  `x.shape[-1]`, which __init__ reads from the size argument, `size_refs`); raises Unsupported for one that reads
  another local of the method (only the call knows it), has decorators or uses a scope API."""
  outer = (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)
  if function.decorators or has_scope_call(function):
    raise Unsupported(name, f'a constructor argument uses {name.value}, a function defined in the method with '
                            'decorators or a scope API: define it at module level or as a method, and pass it in')
  sized = {node for ref in skip for node in descendants(ref)}
  for sub in descendants(function.body):
    parent = ctx.facts.parent(sub)
    if not isinstance(sub, cst.Name) or sub.value == 'self' or sub in sized \
        or isinstance(parent, cst.Attribute) and parent.attr is sub or isinstance(parent, cst.Arg) and parent.keyword is sub:
      continue
    scope = ctx.facts.scope(sub)
    found = list(scope[sub.value]) if scope is not None and sub.value in scope else []
    if any(not isinstance(a.scope, outer) and not ctx.facts.inside(a.scope.node, function) for a in found):
      raise Unsupported(name, f'a constructor argument uses {name.value}, defined in the method, which reads '
                              f'{sub.value}, a local of the method that only the call knows: make it a field, or a '
                              'constructor argument')
  if function not in ctx.plan.functions:
    ctx.plan.functions.append(function)
  return name.value


def function_lines(ctx: ClassContext, replacements: dict[cst.CSTNode, str]) -> list[str]:
  """The functions constructor arguments name (`_hoisted_function`), as __init__ lines, each input size they read
  replaced by its code there (`replacements`: the children's `size_codes`)."""
  return [code(ctx, f.with_changes(leading_lines=()), replacements).strip('\n').replace('\n', '\n  ')
          for f in ctx.plan.functions]


def _arm_values(ctx: ClassContext, name: cst.Name, assignments: list[cst.metadata.BaseAssignment]
                ) -> tuple[list[tuple[cst.BaseExpression, cst.BaseExpression]], cst.BaseExpression] | None:
  """A local bound once in every arm of one if chain that ends in `else`, and read after it (jax-md's `if
  self.embedding_target == 'charge': num_embeddings = 201`, `else: num_embeddings = 101`): each `if`'s (test,
  value), and the `else` value; None for other locals."""
  bindings = _arm_bindings_of(ctx, assignments)
  if bindings is None:
    return None
  values = {arm: assign.value for assign, arm, _ in bindings}
  top = bindings[0][2]
  branches, node = [], top
  while isinstance(node, cst.If) and node in values:
    branches.append((node.test, values[node]))
    node = node.orelse
  if not isinstance(node, cst.Else) or node not in values or len(branches) + 1 != len(values) \
      or name in set(descendants(top)):
    return None
  return branches, values[node]


def _arm_bindings_of(ctx: ClassContext, assignments: list[cst.metadata.BaseAssignment]
                     ) -> list[tuple[cst.Assign, cst.If | cst.Else, cst.If]] | None:
  """Each binding of a local as (statement, arm, the chain's first `if`) when every one is `name = value` alone on its
  line directly in an arm of one `if` chain, each in its own arm; else None."""
  bindings = [_arm_binding(ctx, a) for a in assignments]
  if None in bindings or len({arm for _, arm, _ in bindings}) != len(bindings) or len({top for *_, top in bindings}) != 1:
    return None
  return bindings


def _arm_binding(ctx: ClassContext, assignment: cst.metadata.BaseAssignment
                 ) -> tuple[cst.Assign, cst.If | cst.Else, cst.If] | None:
  """`name = value`, alone on its line directly in an arm of an `if` chain: the statement, the arm (an `if`, `elif`
  or `else`) and the chain's first `if`; None for other bindings."""
  target = ctx.facts.parent(assignment.node) if isinstance(assignment, cst.metadata.Assignment) else None
  assign = ctx.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
  line = ctx.facts.parent(assign) if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
  block = ctx.facts.parent(line) if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
  arm = ctx.facts.parent(block) if isinstance(block, cst.IndentedBlock) else None
  if not isinstance(arm, (cst.If, cst.Else)):
    return None
  top = arm
  while isinstance(ctx.facts.parent(top), (cst.If, cst.Else)):  # an `elif` or `else`: up to the first `if`
    top = ctx.facts.parent(top)
  return (assign, arm, top) if isinstance(top, cst.If) else None


def _rebound_value(ctx: ClassContext, name: cst.Name, assignments: list[cst.metadata.BaseAssignment]) -> str | None:
  """A local bound directly in its method's body, then rebound, before the read `name`, by code that may read it,
  directly or in the body of an `if` on fields without `else` (jax-md's `m0_output_channels = self.m_output_channels
  * (self.lmax + 1)`, then `if self.extra_m0_output_channels is not None: m0_output_channels = m0_output_channels +
  self.extra_m0_output_channels`): the value __init__ computes, each rebinding folded in as `(<new> if <test> else
  <before>)`; None for other locals. Raises Unsupported for a value or test reading what only the call knows."""
  steps = []
  for assignment in assignments:
    target = ctx.facts.parent(assignment.node) if isinstance(assignment, cst.metadata.Assignment) else None
    if isinstance(target, cst.AugAssign):  # `for m in ...: total += ...`, folded as a sum
      loop = _summed_in_loop(ctx, target, assignment.scope.node)
      if loop is None:
        return None
      steps.append((ctx.facts.position(target).line, loop, target.value))
      continue
    assign = ctx.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and target.target is assignment.node):
      return None
    line, function = ctx.facts.parent(assign), assignment.scope.node
    block = ctx.facts.parent(line)
    holder = ctx.facts.parent(block) if isinstance(block, cst.IndentedBlock) and len(line.body) == 1 else None
    if holder is function:
      test = None
    elif isinstance(holder, cst.If) and holder.orelse is None and holder in function.body.body:
      test = holder.test
    else:
      return None
    steps.append((ctx.facts.position(line).line, test, assign.value))
  steps.sort(key=lambda step: step[0])
  if len(steps) < 2 or steps[0][1] is not None or ctx.facts.position(name).line <= steps[-1][0]:
    return None
  value = None
  for _, test, new in steps:
    if isinstance(test, cst.For):
      value = f'({paren(value)} + {_loop_sum(ctx, name, test, new)})'
      continue
    reads = {n: paren(value) for n in descendants(new) if isinstance(n, cst.Name) and n.value == name.value
             and value is not None}
    try:
      for node in (new, test) if test is not None else (new,):
        check_hoistable(ctx, node, skip=set(reads))
    except Unsupported as e:
      what = _call_only(ctx, e)
      raise Unsupported(name, f'a constructor argument uses the local {name.value}, rebound by code that reads {what}, '
                              'which only the call knows: make it a field, or a constructor argument') from None
    rebound = code(ctx, new, reads)
    value = rebound if test is None else f'({paren(rebound)} if {code(ctx, test)} else {paren(value)})'
  return value


def _summed_in_loop(ctx: ClassContext, step: cst.AugAssign, function: cst.FunctionDef) -> cst.For | None:
  """The for loop directly in `function`'s body whose body adds to a local once, `total += <value>` (jax-md's
  `num_channels_rad += num_coeffs * self.sphere_channels` per order m), alone on its line; else None."""
  line = ctx.facts.parent(step)
  block = ctx.facts.parent(line) if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
  loop = ctx.facts.parent(block) if isinstance(block, cst.IndentedBlock) else None
  if isinstance(step.operator, cst.AddAssign) and isinstance(loop, cst.For) and loop.orelse is None \
      and loop in function.body.body and isinstance(loop.target, (cst.Name, cst.Tuple)) \
      and not any(isinstance(sub, (cst.Break, cst.Continue)) for sub in descendants(loop.body)):  # every pass adds
    return loop
  return None


def _loop_sum(ctx: ClassContext, name: cst.Name, loop: cst.For, added: cst.BaseExpression) -> str:
  """`sum(<added> for <target> in <iterator>)`, as __init__ code: the loop's locals bound once in its body before the
  addition (`num_coeffs = self.lmax - m + 1`) written in; raises Unsupported when it reads what only the call knows."""
  targets = {n for n in (loop.target, *descendants(loop.target)) if isinstance(n, cst.Name)}
  bound = _loop_body_locals(ctx, loop)
  replaced: dict[cst.CSTNode, str] = {}
  def expand(value: cst.BaseExpression) -> set[cst.CSTNode]:
    skip = set()
    for sub in descendants(value):
      if isinstance(sub, cst.Name) and any(sub.value == t.value for t in targets):
        skip.add(sub)
      elif isinstance(sub, cst.Name) and sub.value in bound and bound[sub.value] is not value:
        skip |= expand(bound[sub.value])
        replaced[sub] = paren(code(ctx, bound[sub.value], replaced))
        skip.add(sub)
    return skip
  try:
    check_hoistable(ctx, added, skip=expand(added))
    check_hoistable(ctx, loop.iter)
  except Unsupported as e:
    what = _call_only(ctx, e)
    raise Unsupported(name, f'a constructor argument uses the local {name.value}, summed in a loop over code that '
                            f'reads {what}, which only the call knows: make it a field, or a constructor argument') from None
  return f'sum({code(ctx, added, replaced)} for {ctx.facts.code(loop.target)} in {code(ctx, loop.iter)})'


def _loop_body_locals(ctx: ClassContext, loop: cst.For) -> dict[str, cst.BaseExpression]:
  """The locals `local = value` the loop's body binds on their own lines, each bound nowhere else."""
  found = {}
  for line in loop.body.body:
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Assign) \
        and len(line.body[0].targets) == 1 and isinstance(line.body[0].targets[0].target, cst.Name):
      local = line.body[0].targets[0].target
      scope = ctx.facts.scope(local)
      if scope is not None and len(list(scope.assignments[local.value])) == 1:
        found[local.value] = line.body[0].value
  return found


def _single_assign(ctx: ClassContext, assignments: list[cst.metadata.BaseAssignment]) -> cst.Assign | None:
  """The `local = value` statement that alone binds a local, directly in its function's body, else None."""
  if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
    return None
  target = ctx.facts.parent(assignments[0].node)
  assign = ctx.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
  if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and target.target is assignments[0].node):
    return None
  line = ctx.facts.parent(assign)
  body = ctx.facts.parent(line)
  function = ctx.facts.parent(body) if isinstance(body, cst.IndentedBlock) else None
  return assign if isinstance(function, cst.FunctionDef) and assignments[0].scope.node is function else None


def _arm_local(ctx: ClassContext, name: cst.Name, assignments: list[cst.metadata.BaseAssignment]) -> cst.Assign | None:
  """The `local = value` statement that alone binds a local inside an arm of an `if`, when the read `name` comes
  after it in the same arm (jax-md's `if not self.internal_weights: edge_channels = ...`, then `RadialMLP(
  channels_list=edge_channels)`): __init__ evaluates it where the construction goes, under the same test; else None."""
  if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
    return None
  target = ctx.facts.parent(assignments[0].node)
  assign = ctx.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
  line = ctx.facts.parent(assign) if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
  block = ctx.facts.parent(line) if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
  if not (isinstance(block, cst.IndentedBlock) and isinstance(ctx.facts.parent(block), (cst.If, cst.Else))
          and target.target is assignments[0].node and ctx.facts.inside(name, block)):
    return None
  after = ctx.facts.position(name).line > ctx.facts.position(line).line
  return assign if after and not any(ctx.facts.inside(name, s) for s in block.body[:block.body.index(line) + 1]) \
      else None


def _builds_module(ctx: ClassContext, value: cst.CSTNode) -> bool:
  """Whether `value` calls a Linen layer or a Linen class of the file."""
  for sub in (value, *descendants(value)):
    if isinstance(sub, cst.Call):
      if isinstance(sub.func, cst.Name) and sub.func.value in ctx.facts.linen_classes:
        return True
      if any(find_layer(q.name) is not None for q in ctx.facts.qualified_names(sub.func)):
        return True
  return False


def _kept(qualified: str) -> bool:
  """Whether the qualified name is of a flax.linen function a converted class calls as it is
  (`LINEN_KEPT_FUNCTIONS`, and the attention functions under flax.linen's own name: `nn.dot_product_attention`)."""
  return qualified in LINEN_KEPT_FUNCTIONS or f'flax.linen.attention.{qualified.rpartition(".")[2]}' \
      in LINEN_ARRAY_FUNCTIONS


def kept_linen(ctx: ClassContext, node: cst.CSTNode) -> bool:
  """Whether `node` names a flax.linen function a converted class calls as it is (`nn.merge_param`,
  `nn.module.merge_param`, `nn.dot_product_attention`), which no part of is rewritten."""
  names = {q.name for q in ctx.facts.qualified_names(node)} if isinstance(node, (cst.Name, cst.Attribute)) else set()
  return bool(names) and all(_kept(n) for n in names)


def nnx_name_for(ctx: ClassContext, node: cst.CSTNode) -> str | None:
  """The NNX name for a Linen name (`nn.relu` -> `nnx.relu`); None for other code.

  Raises Unsupported for a Linen name NNX has no counterpart of.
  """
  names = {q.name for q in ctx.facts.qualified_names(node)}
  linen = {n for n in names if (n == 'flax.linen' or n.startswith('flax.linen.')) and not _kept(n)}
  if not (isinstance(node, (cst.Name, cst.Attribute)) and linen) or _annotation(ctx, node):
    return None  # a type in an annotation (`precision: PrecisionLike = None`) is plain Python: it stays
  if linen == names and len(linen) == 1 and (twin := NNX_CALL_TWINS.get(next(iter(linen)).rpartition('.')[2])):
    return _call_twin(ctx, node, *twin)
  targets = {nnx_counterpart(n) for n in linen}
  if len(targets) != 1 or None in targets or linen != names:
    raise Unsupported(node, f'{ctx.facts.code(node)} has no automatic NNX conversion here')
  return targets.pop()


def _annotation(ctx: ClassContext, node: cst.CSTNode) -> bool:
  """Whether `node` is part of a type annotation."""
  while (node := ctx.facts.parent(node)) is not None and not isinstance(node, (cst.BaseStatement, cst.Param)):
    if isinstance(node, cst.Annotation):
      return True
  return False


def _call_twin(ctx: ClassContext, node: cst.CSTNode, name: str, positional: tuple[str, ...],
               keywords: dict[str, str]) -> str:
  """`nnx.<name>` for the Linen function `node` called with the parameters NNX takes under other keywords
  (`NNX_CALL_TWINS`); schedules the keyword renames (`rules=` -> `sharding_rules=`)."""
  call, what = ctx.facts.parent(node), ctx.facts.code(node)
  if not (isinstance(call, cst.Call) and call.func is node):
    raise Unsupported(node, f'{what} other than called: call it where it is used, nnx.{name} taking '
                            f'{", ".join(f"{k}= as {v}=" for k, v in keywords.items() if k != v)}')
  for index, arg in enumerate(call.args):
    if arg.star or (arg.keyword is None and index >= len(positional)) \
        or (arg.keyword is not None and arg.keyword.value not in keywords):
      raise Unsupported(arg, f'{what}({ctx.facts.code(arg)}): pass {", ".join(positional)} by position or keyword '
                             f'and any other argument by its keyword ({", ".join(keywords)}), which nnx.{name} '
                             f'takes as {", ".join(keywords.values())}')
    if arg.keyword is not None and keywords[arg.keyword.value] != arg.keyword.value:
      ctx.plan.exprs[arg.keyword] = keywords[arg.keyword.value]
  if call not in ctx.plan.keywords:
    ctx.plan.keywords[call] = 'eager_sharding=False'
    logical = ('; every logical name needs a rule (one to None replicates), as Linen replicates an axis whose name '
               'has none and NNX reads it as a mesh axis') if 'rules' in keywords else ''
    ctx.plan.pending.append((call, f'{what}(...) -> nnx.{name}(..., eager_sharding=False): the annotation alone, '
                                   'as in Linen, where the program shards the variables itself; without '
                                   'eager_sharding=False NNX shards each variable as it creates it and needs a mesh '
                                   f'(jax.set_mesh) to create the model{logical}'))
  return f'nnx.{name}'


def nnx_name_for_or_none(ctx: ClassContext, node: cst.CSTNode) -> str | None:
  try:
    return nnx_name_for(ctx, node)
  except Unsupported:
    return None


def kept_target(ctx: ClassContext, func: cst.CSTNode) -> str | None:
  """`Block` for `nn.map_variables(Block, ...)`: a Linen function over a class kept as Linen."""
  if isinstance(func, cst.Call) and isinstance(func.func, (cst.Name, cst.Attribute)) and ctx.facts.is_linen_name(func.func):
    return next((a.value.value for a in func.args if a.keyword is None and isinstance(a.value, cst.Name)
                 and a.value.value in ctx.facts.kept_linen), None)
  return None


def size_refs(ctx: ClassContext, values: tp.Iterable[cst.CSTNode]) -> dict[cst.CSTNode, str]:
  """Input sizes a constructor argument reads: `x.shape[-1]` (-> x), or a local bound once to one, as
  `d = x.shape[-1]` or `n, _, d = x.shape` (-> d), also inside the value of a local bound once that the argument
  reads (flax's wmt `actual_out_dim = inputs.shape[-1] if self.out_dim is None else self.out_dim`, jax-md's `bound =
  1.0 / math.sqrt(in_features)` after `in_features = x.shape[-1]`, which move to `__init__` with the size);
  `_derive` finds what the code says of each."""
  refs = {}
  for value in values:
    for sub in (value, *descendants(value)):
      if (array := last_axis_array(sub)) is not None:
        refs[sub] = array
      elif isinstance(sub, cst.Name) and size_local(ctx, sub) is not None:
        refs[sub] = sub.value
      elif isinstance(sub, cst.Name) and (bound := bound_once(ctx, sub)) is not None:
        refs.update((inner, array) for inner in descendants(bound) if (array := last_axis_array(inner)) is not None)
        refs.update((inner, inner.value) for inner in descendants(bound)  # jax-md's `bound = 1 / sqrt(in_features)`
                    if isinstance(inner, cst.Name) and size_local(ctx, inner) is not None)
      elif isinstance(sub, cst.Name) and (function := _local_function(ctx, sub)) is not None:
        refs.update((inner, array) for inner in descendants(function.body)  # dopamine's `def mu_init(key, shape)`
                    if (array := last_axis_array(inner)) is not None and not _own_name(ctx, inner, function))
  return refs


def _local_function(ctx: ClassContext, name: cst.Name) -> cst.FunctionDef | None:
  """The function the method defines once under `name` (`def mu_init(key, shape): ...`); None for other names."""
  scope = ctx.facts.scope(name)
  if scope is None or isinstance(scope, (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)) \
      or name.value not in scope:
    return None
  assignments = list(scope[name.value])
  return assignments[0].node if len(assignments) == 1 and isinstance(assignments[0], cst.metadata.Assignment) \
      and isinstance(assignments[0].node, cst.FunctionDef) else None


def _own_name(ctx: ClassContext, ref: cst.Subscript, function: cst.FunctionDef) -> bool:
  """Whether the array of `x.shape[-1]` in `function` is a parameter or local of the function itself."""
  array = ref.value.value
  while isinstance(array, cst.Subscript):
    array = array.value
  scope = ctx.facts.scope(array)
  found = list(scope[array.value]) if scope is not None and array.value in scope else []
  return any(ctx.facts.inside(a.scope.node, function) for a in found
             if not isinstance(a.scope, (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)))


def bound_once(ctx: ClassContext, name: cst.Name) -> cst.BaseExpression | None:
  """The value of the function local `name`, bound once by a statement of its method's own body; else None."""
  scope = ctx.facts.scope(name)
  if scope is None or isinstance(scope, (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)) \
      or name.value not in scope:
    return None
  assign = _single_assign(ctx, list(scope[name.value]))
  return assign.value if assign is not None else None


def size_local(ctx: ClassContext, name: cst.Name) -> str | None:
  """The array whose last axis the local `name` is bound to, once, in the method: None for other names."""
  scope = ctx.facts.scope(name)
  if scope is None or isinstance(scope, (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)) \
      or name.value not in scope:
    return None
  assignments = list(scope[name.value])
  if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
    return None
  assign = next((node for node in ctx.facts.ancestors(assignments[0].node) if isinstance(node, cst.Assign)), None)
  local = size_local_of(assign) if assign is not None else None
  return local[1] if local is not None and local[0] == name.value else None


def bound_local(ctx: ClassContext, method: cst.FunctionDef, ctor: cst.Call) -> cst.Name | None:
  """The local `name` of a statement `name = <ctor>` of the method's own body, of the arms of its `if`s (jax-md's
  `elif self.embedding_type == 'lin_emb': linear = nn.Dense(...)`, called further down) or of a loop's body building
  layers (`loops.py`), else None."""
  assign = ctx.facts.parent(ctor)
  line = ctx.facts.parent(assign) if isinstance(assign, cst.Assign) else None
  if not (isinstance(assign, cst.Assign) and assign.value is ctor and len(assign.targets) == 1
          and isinstance(assign.targets[0].target, cst.Name) and isinstance(line, cst.SimpleStatementLine)
          and len(line.body) == 1):
    return None
  block = ctx.facts.parent(line)
  while block is not method.body:  # an arm (`IndentedBlock`, `Else`) of an `if`, and so on up to the body; or
    arm = ctx.facts.parent(block)  # the body of a loop building it (jax-md's `so2_m_conv = SO2MConv(...)`)
    looped = isinstance(arm, cst.For) and arm in ctx.loops.loops and ctor in ctx.loops.sites
    if not (isinstance(block, cst.IndentedBlock) and (isinstance(arm, (cst.If, cst.Else)) or looped)):
      return None
    block = ctx.facts.parent(arm)
    while isinstance(block, (cst.If, cst.Else)):  # an `elif`, or the `else` of one, up to the first `if`
      block = ctx.facts.parent(block)
  return assign.targets[0].target


def local_uses(ctx: ClassContext, method: cst.FunctionDef, ctor: cst.Call, kind: str) -> tuple[list[cst.Call], list[cst.Name]]:
  """The uses of the local a `name = <ctor>` statement binds: its calls, in order, and the names read through an
  attribute (`rnn.initial_state`); any other use is refused. The statement goes (the child is built in __init__)."""
  target = bound_local(ctx, method, ctor)
  local = target.value
  assignments = list(ctx.facts.scope(target).assignments[local])
  if len(assignments) != 1 and not (kind == 'submodule' and _bound_once_per_arm(ctx, method, assignments)):
    raise Unsupported(ctor, f'the {kind} {local} is rebound in the method')
  calls, names = [], []
  for use in dict.fromkeys(r.node for a in assignments for r in a.references):
    parent = ctx.facts.parent(use)
    if isinstance(parent, cst.Call) and parent.func is use:
      calls.append(parent)
    elif isinstance(parent, cst.Attribute) and parent.value is use:
      names.append(use)
    elif len(assignments) != 1 and is_none_test(parent, use):  # `if rad_func is not None:`, the local stays
      continue
    else:
      raise Unsupported(use, f'the {kind} {local} used other than by calling it or one of its methods')
  if len(assignments) == 1:
    ctx.plan.removed.add(ctx.facts.parent(ctx.facts.parent(ctor)))
  else:  # `std_module = Param(...)` in one arm, `= LogParam(...)` in another: each binds its attribute instead
    ctx.plan.arm_bound[ctor] = local
  position = lambda call: ctx.facts.position(call)
  calls.sort(key=lambda call: (position(call).line, position(call).column))
  return calls, names


def arm_values(ctx: ClassContext, method: cst.FunctionDef, ctor: cst.Call) -> list[cst.BaseExpression]:
  """What the local a `name = <ctor>` statement binds is bound to in each arm of its `if` chain (`local_uses`
  accepted the bindings)."""
  target = bound_local(ctx, method, ctor)
  assignments = list(ctx.facts.scope(target).assignments[target.value])
  return [assign.value for assign, _, _ in _arm_bindings_of(ctx, [a for a in assignments if _none_binding(ctx, a) is None])]


def _bound_once_per_arm(ctx: ClassContext, method: cst.FunctionDef, assignments: list[tp.Any]) -> bool:
  """Whether every binding of a local is `name = <construction>` in its own arm of one `if` chain (brax's
  `if self.noise_std_type == 'scalar': std_module = Param(...)`, `else: std_module = LogParam(...)`), or `name =
  self.<attribute>` (flax's wmt example: `if self.shared_embedding is None: input_embed = nn.Embed(...)`, `else:
  input_embed = self.shared_embedding`), and the local is read only after the chain: one of them runs, its layer
  built in __init__ under the arm's condition, or the module the attribute holds. A `name = None` before the chain
  may stand for an arm that binds nothing (`_none_binding`)."""
  nones = [line for a in assignments if (line := _none_binding(ctx, a)) is not None]
  bindings = _arm_bindings_of(ctx, [a for a in assignments if _none_binding(ctx, a) is None])
  if bindings is None or len(nones) > 1 or nones and not _before_chain(ctx, nones[0], bindings[0][2]):
    return False
  chain = set(descendants(bindings[0][2]))
  built = lambda value: isinstance(value, cst.Call) and bound_local(ctx, method, value) is not None
  held = lambda value: isinstance(value, cst.Attribute) and is_self_attr(value)
  return all(built(assign.value) or held(assign.value) for assign, _, _ in bindings) \
      and not any(r.node in chain for a in assignments for r in a.references)


def _none_binding(ctx: ClassContext, assignment: tp.Any) -> cst.SimpleStatementLine | None:
  """The line of a binding `name = None` alone on it (jax-md's `rad_func = None`, before `if not
  self.internal_weights: rad_func = RadialMLP(...)`); None for other bindings."""
  target = ctx.facts.parent(assignment.node) if isinstance(assignment, cst.metadata.Assignment) else None
  assign = ctx.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
  line = ctx.facts.parent(assign) if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
  if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(assign.value, cst.Name) \
      and assign.value.value == 'None':
    return line
  return None


def _before_chain(ctx: ClassContext, line: cst.SimpleStatementLine, chain: cst.If) -> bool:
  """Whether `line` comes before the `if` chain `chain`, in the same block: the local is None unless an arm binds
  it, and __init__ builds the arm's layer under the same condition."""
  block = ctx.facts.parent(line)
  return block is ctx.facts.parent(chain) and isinstance(block, cst.IndentedBlock) \
      and block.body.index(line) < block.body.index(chain)


def shared_local(ctx: ClassContext, method: cst.FunctionDef, ctor: cst.Call) -> tuple[list[cst.Call], list[cst.Name]]:
  """`embed = nn.Embed(...)` in the @nn.compact method, then `embed(tokens)` and `embed.attend(h)`: one
  submodule used in several places (weight tying). Returns the calls, in order, and the names read through an
  attribute."""
  calls, names = local_uses(ctx, method, ctor, 'submodule')
  if not calls:
    raise Unsupported(ctor, f'the submodule {bound_local(ctx, method, ctor).value} is never called (its input '
                             'size comes from a call)')
  return calls, names


def switch(ctx: ClassContext, value: cst.BaseExpression, inverted: bool) -> bool | str | None:
  """Checks that `value` is a __call__ train/eval switch (or its negation) meaning the same as the target.

  Returns the target's value when the switch keeps its default (a literal bool), or as code (`self.deterministic`)
  when it is the field a `merge_param` statement merged it with (`modes.merged_switches`), else None.
  """
  negated = isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Not)
  name = value.expression if negated else value
  if isinstance(name, cst.Attribute) and is_self_attr(name) and name.attr.value in ctx.plan.mode_fields \
      and negated ^ inverted == ctx.plan.mode_fields[name.attr.value]:
    ctx.plan.mode_uses.add(name)  # `deterministic=not self.training`, a train/eval field
    return None
  if not (isinstance(name, cst.Name) and name.value in ctx.plan.switches and negated ^ inverted == ctx.plan.switches[name.value]):
    raise Unsupported(value, 'a train/eval argument that is not a matching __call__ switch or train/eval field')
  ctx.plan.mode_uses.add(name)
  if name.value in ctx.plan.merged_switches:
    return f'not self.{name.value}' if negated else f'self.{name.value}'
  default = ctx.plan.switch_defaults.get(name.value)
  return None if default is None else default ^ negated


def is_activation(ctx: ClassContext, expr: cst.CSTNode) -> bool:
  """`self.act(x)` for a Callable field of the class being planned, or an attribute its setup() binds to an
  activation table's entry (`factory_fields`): elementwise."""
  return (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and is_self_attr(expr.func)
          and expr.func.attr.value in ctx.facts.factories.activations.get(ctx.plan.name, ())
          and len(expr.args) == 1
          and expr.args[0].keyword is None and not expr.args[0].star)


def jnp_bound(ctx: ClassContext, node: cst.CSTNode) -> bool:
  """Whether `jnp` is `jax.numpy` here (False: unbound, the import is added); raises when it is something else."""
  names = ctx.facts.names_of(node, 'jnp')
  if names - {'jax.numpy'}:
    raise Unsupported(node, "decode caches, and the name jnp (init_cache's default dtype is jnp.float32) is "
                             'bound to something else here')
  return bool(names)
