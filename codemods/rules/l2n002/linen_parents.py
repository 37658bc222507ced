"""Converted classes that a class left as Linen builds: `nnx_bridge.to_linen` at the seam, or Linen with it.

A class left as Linen that builds a class the file converts would build an NNX module the Linen way and
fail at `init`. Rather than keep the built class Linen too (and, through it, everything it builds), each
construction in the Linen parent becomes `nnx_bridge.to_linen(Block, <the same arguments>)` when the
parent then runs as before on the same variables, so that its checkpoints still load:
* the NNX state maps onto Linen's paths: each child's Linen name is known (to_linen's `linen_names=`
  stores the NNX attribute under it; a layer list's elements under a name made of their index), down
  the tree, and every table layer keeps its Linen param names; no lifted, bridged or decode-cache children
  (a child created under a condition is None in NNX where Linen has no variables for it);
* the NNX `__init__` needs only what the Linen construction gives (the fields), input sizes the call
  shows (to_linen's `input_sizes=`, read from a required argument at each call), input sizes of table layers
  inside that a run of the call shows (`traced_sizes=`: a layer fed a reshaped or computed value) and tied-layer flags
  the parent's code decides when it builds the class (`tied_decoder=self.config.tie_word_embeddings` for
  calls passing `shared_embedding` bound by `if self.config.tie_word_embeddings: ... else: None`);
* every use of the class in the parent builds it where Linen names it as before (a setup() attribute, or
  with `name=`): called at once, bound to a local that is only called, kept in a setup() attribute, a tuple
  extended by `self.layer += (Block(...),)` (transformers' T5 blocks) or a setup() list (diffusers' blocks:
  `self.resnets = resnets` after `resnets = [Block(...)]` or `resnets.append(block)` of a local
  `block = Block(...)`); and every call of what it builds passes the train/eval switches NNX dropped by keyword
  (to_linen turns them into `train()` / `eval()`): calls of the attribute or the local, of `self.layer[k]`, and of
  the layer of `for layer in` the list, `enumerate` of it or `zip` of it (or of a slice of it) with others;
* a parent kept Linen for a use elsewhere (another file's Linen class builds it) builds it outside loops: a second
  run plans that parent itself, and a to_linen construction in a loop would give it another reason.
Otherwise the class stays Linen with its parent, and the reason says which of these failed.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.report import INPUT_DIMENSION
from codemods.rules.l2n002.bridge_names import linen_names
from codemods.rules.l2n002.facts import FileFacts
from codemods.rules.l2n002.nodes import assigned_name, is_none_test, is_self_attr, self_assignment, value_else_none
from codemods.rules.l2n002.plan import Child, ClassRewrite, LinenBridgeFacts
from codemods.vocabulary import COMPACT_NAMES, TO_LINEN_NAMES
from nnx_bridge.layer_spec import LAST_AXIS_SIZES


@dataclasses.dataclass(frozen=True)
class ToLinenBridge:
  """A construction of converted class `built` inside Linen class `user`, and the to_linen code replacing it; or,
  `test`, an `isinstance(x, <built>)` there and the `nnx_bridge.is_instance(...)` replacing it (diffusers' ControlNet
  asks which block class each of its down blocks is)."""

  call: cst.Call
  code: str
  built: str
  user: str
  test: bool = False


def linen_parent_bridges(facts: FileFacts, plans: dict[str, ClassRewrite], user: str, built: str,
                         blocker: cst.CSTNode | None) -> list[ToLinenBridge] | str:
  """The to_linen bridges for every construction of `built` in the Linen class `user`, or why there are none.

  `blocker` is the node that keeps `user` Linen: a construction inside it (or holding it) stays, since the
  TODO there speaks of it and a second run must find the same blocker; but for a construction in setup() code
  (`_setup_code_blocker`), which a second run reads in its bridge. None: `user` is kept for a use
  outside its body (`FileFacts.kept_linen`), which its constructions do not change.
  """
  adopted = adopted_blocker(facts, user, built)
  if adopted is not None:
    return adopted
  node = facts.class_defs[user]
  plan = plans[built] if built in plans else facts.imported[built]
  record = plan.bridge_facts if plan.origin else bridge_facts(facts, plan)
  if record is None or record.blocker is not None:
    return record.blocker if record is not None else f'{plan.name} is a class of {plan.origin}'
  names, sizes, traced = dict(record.linen_names), dict(record.input_sizes), dict(record.traced_sizes)
  if blocker is node:  # a decorator, a base or a converter failure: nothing of its body is the blocker
    return f'{user} is kept Linen whole'
  setup = _method(node, 'setup')
  bridges = []
  references = _references(facts, node, built)
  for name in references:
    call = facts.parent(name)
    if (test := _isinstance_test(facts, name)) is not None:
      bridges.append(ToLinenBridge(test, f'nnx_bridge.is_instance({", ".join(facts.code(a.value) for a in test.args)})',
                                   built, user, test=True))
      continue
    if _bridged_already(facts, name):  # an earlier round's `nnx_bridge.to_linen(X, ...)`: the bridge stays
      continue
    if not (isinstance(call, cst.Call) and call.func is name):
      return f'it uses {plan.name} other than by building it'
    if blocker is not None and (facts.inside(call, blocker) or facts.inside(blocker, call)) \
        and not _setup_code_blocker(facts, blocker, call, setup):
      return f'a construction of {plan.name} is what keeps {user} Linen'
    if blocker is None and _in_loop(facts, call, node):  # kept for a use elsewhere, `user` is planned by a second run
      return f'{user} builds {plan.name} in a loop, where a second run could not convert {user} with the wrapper'
    auto = _auto_name(facts, node, call, references, plan.name)
    reason = _construction_blocker(facts, plan, call, setup, auto) or _calls_blocker(facts, node, plan, call)
    if reason is not None:
      return reason
    flags = _tie_flags(facts, node, plan, call)
    if isinstance(flags, str):
      return flags
    bridges.append(ToLinenBridge(call, _bridge_code(facts, call, flags, sizes, traced, names, auto), built, user))
  return bridges


def bridge_facts(facts: FileFacts, plan: ClassRewrite) -> LinenBridgeFacts:
  """What a Linen class wraps the converted class `plan` of this file with (`LinenBridgeFacts`): a class of this
  file reads it here, one of another file from the class's record."""
  names = linen_names(facts, plan)
  if isinstance(names, str):
    return LinenBridgeFacts(names)
  if _method(facts.class_defs[plan.name], '__call__') is None:
    return LinenBridgeFacts(f'{plan.name} has no __call__ for the wrapper to run')
  if plan.call_fields:
    return LinenBridgeFacts(f'{plan.name} takes {", ".join(plan.call_fields)} at its call in NNX (what its builders\' '
                            'calls compute), where nnx_bridge.to_linen would give it to its constructor')
  sizes, traced, reason = _input_sizes(facts, plan)
  run = tuple((a.name, found) for a in plan.size_arguments if (found := _run_size(plan, a.name)) is not None)
  return LinenBridgeFacts(reason, tuple(names.items()), tuple(sizes.items()), tuple(traced.items()),
                          tuple(sorted(_plain_attributes(facts, plan))), _shifted_switch(facts, plan), run)


def _references(facts: FileFacts, node: cst.ClassDef, built: str) -> list[cst.CSTNode]:
  """The names in `node` of the class `built`: a class of this file by its name, a class another file converted
  (`built` its qualified name) by what denotes it here (`FlaxTimesteps`, `base_networks.ImpalaEncoder`)."""
  if built not in facts.imported:
    return [n for n in descendants(node) if isinstance(n, cst.Name) and n.value == built]
  return [n for n in descendants(node) if isinstance(n, (cst.Name, cst.Attribute))
          and not (isinstance(parent := facts.parent(n), cst.Attribute) and parent.attr is n)
          and facts.imported_class(n) == built]


def adopted_blocker(facts: FileFacts, user: str, built: str) -> str | None:
  """Why the Linen class `user` cannot wrap `built` whatever `built`'s plan: a construction of it given a Linen
  module built for it (`_builds_linen`), which Linen keeps below it and a to_linen wrapper would not; else None.
  Checked before what depends on the plan, which a second run, planning `built` from the code this run leaves,
  may find otherwise."""
  references = _references(facts, facts.class_defs[user], built)
  adopted = next((arg.value for call in descendants(facts.class_defs[user]) if isinstance(call, cst.Call)
                  and any(call.func is n for n in references)
                  for arg in call.args if _builds_linen(facts, arg.value)), None)
  if adopted is None:
    return None
  return f'a construction of {built} is given {facts.code(adopted)}, a Linen module built for it, which Linen keeps ' \
         'below it; the wrapper would keep its variables elsewhere'


def _input_sizes(facts: FileFacts, plan: ClassRewrite) -> tuple[dict[str, str], dict[str, str | None], str | None]:
  """`plan`'s size arguments: those a required `__call__` argument shows (-> the argument whose last-axis size
  each one is), those to_linen finds by running the call (`_traced_input`), and why there are none when a size is
  neither."""
  call = _method(facts.class_defs[plan.name], '__call__')
  optional = {p.name.value for p in (*call.params.params, *call.params.kwonly_params) if p.default is not None}
  shown, traced = {}, {}
  for argument in plan.size_arguments:
    if argument.origin == INPUT_DIMENSION and argument.input is not None and argument.input not in optional:
      shown[argument.name] = argument.input
    elif (found := _traced_input(plan, argument.child, argument.child_argument)) is not None:
      traced[argument.name] = found or None
    else:
      return {}, {}, f'its NNX __init__ needs {argument.name}, which no argument of its call shows'
  return shown, traced, None


def _traced_input(plan: ClassRewrite, attr: str | None, keyword: str | None) -> str | None:
  """How a run of the call shows the constructor keyword `keyword` of the child `attr`: '' when it is, down the
  tree, a table layer's last-axis input size (`LAST_AXIS_SIZES`, `to_linen(traced_sizes=)`); the name of a call
  argument when it shapes a variable of a converted class down the tree, the last-axis size of that argument of
  its call (GPT-2's `FlaxConv1D`: `to_linen(traced_inputs=)`); None when neither (or, for the elements of a list
  that reach it, both)."""
  found = {_child_input(c, keyword) for c in plan.children if c.attr == attr} - {None}
  return found.pop() if len(found) == 1 else None


def _child_input(child: Child, keyword: str | None) -> str | None:
  if keyword is None or child.api is not None:
    return None
  if child.sibling is not None:
    return _run_size(child.sibling, keyword)
  return '' if child.spec is not None and keyword in LAST_AXIS_SIZES else None


def _run_size(plan: ClassRewrite, keyword: str) -> str | None:
  """How a run of the converted class `plan`'s call shows its size argument `keyword`, as `_traced_input`; a
  class of another file from its record (`LinenBridgeFacts.run_sizes`: diffusers' transformer model, whose
  blocks' norm sizes a down block of another file asks for)."""
  if plan.origin:
    return dict(plan.bridge_facts.run_sizes).get(keyword) if plan.bridge_facts is not None else None
  below = next((a for a in plan.size_arguments if a.name == keyword), None)
  if below is None:
    return None
  own = below.origin == INPUT_DIMENSION and below.input is not None and below.child_argument is None \
      and any(c.attr == below.child and c.api is not None for c in plan.children)
  return below.input if own else _traced_input(plan, below.child, below.child_argument)


def _construction_blocker(facts: FileFacts, plan: ClassRewrite, call: cst.Call,
                          setup: cst.FunctionDef | None, auto: str | None) -> str | None:
  """Why `call` cannot become a to_linen construction that Linen names as before, or None; `auto`: the name Linen
  gives it in a compact body (`_auto_name`), else None."""
  if any(arg.star for arg in call.args):
    return f'a construction of {plan.name} with *args or **kwargs'
  keywords = {arg.keyword.value for arg in call.args if arg.keyword is not None}
  if 'parent' in keywords:
    return f'a construction of {plan.name} with parent='
  positional = sum(1 for arg in call.args if arg.keyword is None)
  modes = [i for i, name in enumerate(plan.linen_fields) if name in plan.mode_fields]
  if modes and positional > modes[0]:
    return f'a construction of {plan.name} gives its train/eval field {plan.linen_fields[modes[0]]} by position'
  if 'name' not in keywords and auto is None and (setup is None or not facts.inside(call, setup)):
    return f'{plan.name} is built outside setup() without name=, where Linen numbers it by code the run does not ' \
           'follow (a loop, a condition before it, a nested function): give it name='
  return None


def _auto_name(facts: FileFacts, node: cst.ClassDef, call: cst.Call, references: list[cst.CSTNode],
               class_name: str) -> str | None:
  """The name Linen gives the construction `call` without `name=` in the @nn.compact method of `node`
  (`<class name>_<k>`, k counting the constructions of that name before it, as brax's `CNN(...)(x)` is `CNN_0`;
  the class's own name, whatever the file imports it as), when the code fixes k: every construction named like it
  (or like the class) in the method builds the same class (`references`), no earlier one is in a loop, a condition
  or a nested function, and this one is in no loop; else None."""
  if any(arg.keyword is not None and arg.keyword.value == 'name' for arg in call.args):
    return None
  method = next((m for m in _above(facts, call, node) if isinstance(m, cst.FunctionDef)), None)
  if method is None or method not in node.body.body \
      or not any(facts.has_name(d.decorator, COMPACT_NAMES) for d in method.decorators):
    return None
  short = {facts.code(call.func).rpartition('.')[2], class_name}
  same = [c for c in descendants(method) if isinstance(c, cst.Call) and isinstance(c.func, (cst.Name, cst.Attribute))
          and facts.code(c.func).rpartition('.')[2] in short]
  if any(not any(c.func is r for r in references) for c in same) or call not in same:
    return None
  earlier = same[:same.index(call)]
  if any(arg.keyword is not None and arg.keyword.value == 'name' for c in earlier for arg in c.args) \
      or any(_in_block(facts, c, method) for c in earlier) or _in_loop(facts, call, method):
    return None
  return f'{class_name}_{len(earlier)}'


def _in_block(facts: FileFacts, node: cst.CSTNode, method: cst.FunctionDef) -> bool:
  """Whether `node` is under a compound statement, comprehension, lambda or nested function of `method`."""
  return any(isinstance(above, (cst.BaseCompoundStatement, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp,
                                cst.Lambda, cst.IfExp)) for above in _above(facts, node, method))


def _above(facts: FileFacts, node: cst.CSTNode, ancestor: cst.CSTNode) -> tp.Iterator[cst.CSTNode]:
  """The nodes between `node` and its `ancestor`, nearest first."""
  node = facts.parent(node)
  while node is not None and node is not ancestor:
    yield node
    node = facts.parent(node)


def _builds_linen(facts: FileFacts, value: cst.BaseExpression) -> bool:
  """Whether `value` is a Linen module built where it is given, or a local bound once to one (transformers'
  `embed_tokens = nn.Embed(...)`, then `Decoder(..., embed_tokens=embed_tokens)`): Linen names such a module below
  the class it is given to, while a setup() attribute (`embed_tokens=self.shared`) stays where it is."""
  if isinstance(value, cst.Name) and (bound := _bound_value(facts, value)) is not None:
    value = bound
  return isinstance(value, cst.Call) and (facts.is_linen_name(value.func) or isinstance(value.func, cst.Name)
                                         and value.func.value in facts.linen_classes)


def _bound_value(facts: FileFacts, name: cst.Name) -> cst.BaseExpression | None:
  """The value of `name = <value>`, the one binding of the function local `name`, else None."""
  assignment = _one_assignment(facts, name)
  target = facts.parent(assignment.node) if assignment is not None else None
  assign = facts.parent(target) if isinstance(target, cst.AssignTarget) else None
  return assign.value if isinstance(assign, cst.Assign) else None


def _calls_blocker(facts: FileFacts, node: cst.ClassDef, plan: ClassRewrite, call: cst.Call) -> str | None:
  """Why the calls of what `call` builds do not fit the NNX `__call__`, or None: each is followed from where the
  construction is called or kept (`Block(...)(x)`, `self.block = Block(...)`, a list of them in setup())."""
  parent = facts.parent(call)
  if isinstance(parent, cst.Call) and parent.func is call:
    return _call_blocker(facts, plan, parent)
  statement = _statement_of(facts, call)
  called = _local_calls(facts, statement, call)
  if called is not None:  # `edgewise = Edgewise(..., name='edge_wise')`, then `x = edgewise(x, ...)` (jax-md)
    return next((reason for use in called if (reason := _call_blocker(facts, plan, use)) is not None), None)
  attr = self_assignment(statement) or _self_extended(statement) if statement is not None else None
  setup = _method(node, 'setup')
  listed = attr is None and setup is not None and (attr := _listed_as(facts, setup, call)) is not None
  if attr is None:
    return f'a construction of {plan.name} that is neither called at once nor kept as a setup() attribute'
  for sub in descendants(node):
    if not (isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value == attr):
      continue
    use = facts.parent(sub)
    if isinstance(use, cst.AssignTarget) or isinstance(use, cst.AugAssign) and use.target is sub:
      continue  # the construction's statement, another arm of a setup() if assigning the attribute, or `+=`
    if isinstance(use, cst.Call) and use.func is sub and not listed:
      reason = _call_blocker(facts, plan, use)
    elif (indexed := _indexed_call(facts, sub)) is not None:
      reason = _call_blocker(facts, plan, indexed)
    elif (loop := _loop_over(facts, sub)) is not None:
      reason = _loop_blocker(facts, plan, *loop)
    elif isinstance(use, cst.Attribute) and use.value is sub and not listed:
      reason = _read_blocker(facts, plan, attr, use)
    elif is_none_test(use, sub) or _isinstance_subject(facts, sub):  # `if self.mid_block is not None:` (diffusers'
      reason = None  # UNet): the wrapper is no None; `isinstance(self.block, Block)` becomes `nnx_bridge.is_instance`
    elif isinstance(use, cst.Return) and not listed:  # `return self.encoder` (transformers' `_get_encoder_module`)
      shifted = _shifted_switch(facts, plan)
      reason = None if shifted is None else f'self.{attr} ({plan.name}) is returned to callers out of sight, and ' \
                                            f'its train/eval argument {shifted} is followed by other positional ones'
    else:
      reason = f'self.{attr} ({plan.name}) is used other than by calling it'
    if reason is not None:
      return reason
  return None


def _bridged_already(facts: FileFacts, name: cst.CSTNode) -> bool:
  """Whether `name` is the class of an `nnx_bridge.to_linen(<name>, ...)` that an earlier round of the run wrote
  (the run plans a file again from its migrated code when another file's decisions change)."""
  arg = facts.parent(name)
  call = facts.parent(arg) if isinstance(arg, cst.Arg) else None
  return isinstance(call, cst.Call) and call.args[0] is arg and arg.keyword is None \
      and facts.has_name(call.func, TO_LINEN_NAMES)


def _isinstance_test(facts: FileFacts, name: cst.CSTNode) -> cst.Call | None:
  """The builtin `isinstance(x, C)` call whose class argument `C` (or an element of its tuple) is `name`, else
  None."""
  holder = facts.parent(name)
  if isinstance(holder, cst.Element) and isinstance(facts.parent(holder), cst.Tuple):
    holder = facts.parent(facts.parent(holder))
  call = facts.parent(holder) if isinstance(holder, cst.Arg) else None
  return call if _builtin_isinstance(facts, call) and call.args[1] is holder else None


def _isinstance_subject(facts: FileFacts, node: cst.CSTNode) -> bool:
  """Whether `node` is `x` of a builtin `isinstance(x, C)`."""
  arg = facts.parent(node)
  return isinstance(arg, cst.Arg) and _builtin_isinstance(facts, call := facts.parent(arg)) and call.args[0] is arg


def _builtin_isinstance(facts: FileFacts, call: cst.CSTNode | None) -> bool:
  return isinstance(call, cst.Call) and len(call.args) == 2 and not any(a.keyword or a.star for a in call.args) \
      and facts.has_name(call.func, {'builtins.isinstance'})


def _read_blocker(facts: FileFacts, plan: ClassRewrite, attr: str, read: cst.Attribute) -> str | None:
  """Why `self.<attr>.<name>` (or `.<child>.<name>` down the converted children) cannot be read through the
  bridge, or None. The bridge reads a plain attribute the NNX `__init__` sets (a field, or what setup() code
  stored: transformers' BEiT reads `self.patch_embeddings.num_patches` in setup()) from the module built
  abstractly (`ToLinen.__getattr__`); a read that is called or assigned to is refused."""
  names, outer = [read.attr.value], read
  while isinstance(parent := facts.parent(outer), cst.Attribute) and parent.value is outer:
    names.append(parent.attr.value)
    outer = parent
  holder = facts.parent(outer)
  what = f'self.{attr}.{".".join(names)}'
  if isinstance(holder, cst.Call) and holder.func is outer or isinstance(holder, (cst.AssignTarget, cst.AugAssign)):
    return f'{what} ({plan.name}) is called or assigned to through the bridge'
  below = plan
  for name in names[:-1]:
    child = next((c for c in below.children if c.attr == name and c.api is None), None)
    if child is None or child.sibling is None or child.sibling.origin or '{' in child.linen_name:
      return f'{what} reads {name}, which is not a converted submodule of {below.name} of this file'
    below = child.sibling
  plain = set(below.bridge_facts.plain_attributes) if below.origin and below.bridge_facts is not None \
      else set() if below.origin else _plain_attributes(facts, below)
  if names[-1] not in plain:
    return f'{what} is not a plain attribute of {below.name} (a field or what its setup() stores)'
  return None


def _plain_attributes(facts: FileFacts, plan: ClassRewrite) -> set[str]:
  """The fields of `plan`'s class and the attributes its setup() code stores (`self.num_patches = num_patches`),
  less its submodules and variables."""
  setup = _method(facts.class_defs[plan.name], 'setup')
  stored = {target for statement in (setup.body.body if setup is not None else ())
            if isinstance(statement, cst.SimpleStatementLine) and (target := self_assignment(statement)) is not None}
  return (stored | set(plan.linen_fields)) - {c.attr for c in plan.children} - set(plan.mode_fields)


def _self_extended(statement: cst.SimpleStatementLine) -> str | None:
  """The attribute of a `self.<attr> += (<layer>, ...)` statement (transformers' T5 blocks add their cross-attention
  and feed-forward layers to the tuple `self.layer` so), else None."""
  augment = statement.body[0] if len(statement.body) == 1 else None
  if isinstance(augment, cst.AugAssign) and isinstance(augment.operator, cst.AddAssign) \
      and isinstance(augment.value, (cst.Tuple, cst.List)) and isinstance(augment.target, cst.Attribute) \
      and is_self_attr(augment.target):
    return augment.target.attr.value
  return None


def _local_calls(facts: FileFacts, statement: cst.SimpleStatementLine | None, call: cst.Call) -> list[cst.Call] | None:
  """The calls of a local bound to the construction `call` (`local = Block(...)`), when they are all its reads; else
  None. The local may also be bound to None, then tested for it (jax-md's `rad_func = None`, `if ...: rad_func =
  RadialMLP(...)`, `if rad_func is not None: ... rad_func(x_edge)`): the bridge is no None either."""
  if statement is None or assigned_name(statement) is None or statement.body[0].value is not call:
    return None
  local = statement.body[0].targets[0].target
  reads = _reads(facts, local)
  if reads is None and _otherwise_none(facts, local):
    reads = [n for n in _arm_reads(facts, local) if not is_none_test(facts.parent(n), n)]
  if not reads or not all(isinstance(facts.parent(n), cst.Call) and facts.parent(n).func is n for n in reads):
    return None
  return [facts.parent(n) for n in reads]


def _otherwise_none(facts: FileFacts, local: cst.Name) -> bool:
  """Whether every other binding of the function local `local` is a plain `local = None`."""
  scope = facts.scope(local)
  others = [a.node for a in scope.assignments[local.value] if a.node is not local] \
      if isinstance(scope, cst.metadata.FunctionScope) else []
  return bool(others) and all(isinstance(assign := facts.parent(facts.parent(n)), cst.Assign)
                              and len(assign.targets) == 1 and assign.targets[0].target is n
                              and isinstance(assign.value, cst.Name) and assign.value.value == 'None' for n in others)


def _listed_as(facts: FileFacts, setup: cst.FunctionDef, call: cst.Call) -> str | None:
  """The setup() attribute that holds the construction `call` through a list local of setup() (diffusers' blocks:
  `res_block = Block(...)`, `resnets.append(res_block)`, then `self.resnets = resnets`; or `resnets = [Block(...)]`),
  else None. The list is bound once and read only so: appended to, stored once."""
  if not facts.inside(call, setup):
    return None
  parent = facts.parent(call)
  statement = _statement_of(facts, call)
  bound = statement.body[0] if statement is not None and assigned_name(statement) is not None else None
  if isinstance(parent, cst.Element) and isinstance(facts.parent(parent), cst.List):
    listed = bound.targets[0].target if bound is not None and bound.value is facts.parent(parent) else None
  elif (appended := _appended_to(facts, call)) is not None:
    listed = appended
  elif bound is not None and bound.value is call:  # bound to a local, maybe in each arm of an if (diffusers'
    appends = [_appended_to(facts, n) for n in _arm_reads(facts, bound.targets[0].target)]  # `down_block = ...`)
    lists = {n.value: n for n in appends if n is not None}
    listed = next(iter(lists.values())) if appends and None not in appends and len(lists) == 1 else None
  else:
    listed = None
  reads = _reads(facts, listed) if listed is not None else None
  if reads is None:
    return None
  stored = []
  for use in reads:
    holder = facts.parent(use)
    if isinstance(holder, cst.Attribute) and holder.value is use and holder.attr.value == 'append' \
        and isinstance(facts.parent(holder), cst.Call):
      continue
    line = _statement_of(facts, use)
    target = self_assignment(line) if line is not None and line.body[0].value is use else None
    if target is None:
      return None
    stored.append(target)
  return stored[0] if len(stored) == 1 else None


def _reads(facts: FileFacts, name: cst.Name) -> list[cst.Name] | None:
  """The reads of the function local `name` names, when one statement binds it; else None."""
  assignment = _one_assignment(facts, name)
  return [r.node for r in assignment.references] if assignment is not None else None


def _arm_reads(facts: FileFacts, name: cst.Name) -> list[cst.Name]:
  """The reads of the function local `name` over all its bindings (diffusers' `down_block = CrossAttnBlock(...)`
  in one arm of an if, `down_block = DownBlock(...)` in the other), each once."""
  scope = facts.scope(name)
  assignments = list(scope.assignments[name.value]) if isinstance(scope, cst.metadata.FunctionScope) else []
  return list({id(r.node): r.node for a in assignments for r in a.references}.values())


def _one_assignment(facts: FileFacts, name: cst.Name) -> cst.metadata.BaseAssignment | None:
  """The binding of the function local `name` (libcst's scope analysis), when there is one only; else None."""
  scope = facts.scope(name)
  assignments = list(scope.assignments[name.value]) if isinstance(scope, cst.metadata.FunctionScope) else []
  return assignments[0] if len(assignments) == 1 else None


def _appended_to(facts: FileFacts, node: cst.CSTNode) -> cst.Name | None:
  """`lst` of `lst.append(<node>)`, else None."""
  arg = facts.parent(node)
  call = facts.parent(arg) if isinstance(arg, cst.Arg) else None
  if isinstance(call, cst.Call) and len(call.args) == 1 and call.args[0] is arg and arg.keyword is None \
      and not arg.star and isinstance(call.func, cst.Attribute) and call.func.attr.value == 'append' \
      and isinstance(call.func.value, cst.Name):
    return call.func.value
  return None


def _indexed_call(facts: FileFacts, attr: cst.Attribute) -> cst.Call | None:
  """The call `self.layers[k](...)` of `attr`'s subscript, else None."""
  subscript = facts.parent(attr)
  call = facts.parent(subscript) if isinstance(subscript, cst.Subscript) else None
  if isinstance(call, cst.Call) and call.func is subscript and subscript.value is attr and len(subscript.slice) == 1 \
      and isinstance(subscript.slice[0].slice, cst.Index):
    return call
  return None


def _tie_flags(facts: FileFacts, node: cst.ClassDef, plan: ClassRewrite, call: cst.Call) -> dict[str, str] | str:
  """The value of each tied-layer flag of `plan` (`tied_decoder`) for the construction `call` in the Linen class
  `node`, as code its setup() can evaluate: whether the calls of what it builds pass the tying argument
  (`self.cls(h, shared_embedding=shared)`, `shared` bound by `if self.config.tie_word_embeddings: shared = ...
  else: shared = None`); or why that is not known."""
  if not plan.tie_flags:
    return {}
  uses = _uses(facts, node, call)
  if not uses:
    return f'{plan.name} ties layers on its call arguments and is not called here'
  flags = {}
  for param, flag in plan.tie_flags.items():
    values = {_passed(facts, use, plan, param) for use in uses}
    if len(values) != 1 or None in values:
      return (f'the calls of {plan.name} pass {param} under conditions a construction cannot evaluate (converted: '
              f'`if <fields or config>: x = <array> else: x = None`, or always, or never)')
    flags[flag] = values.pop()
  return flags


def _uses(facts: FileFacts, node: cst.ClassDef, call: cst.Call) -> list[cst.Call]:
  """The calls of what the construction `call` builds: `Block(...)(x)`, or each `self.<attr>(...)` of the setup()
  attribute it is kept in."""
  parent = facts.parent(call)
  if isinstance(parent, cst.Call) and parent.func is call:
    return [parent]
  statement = _statement_of(facts, call)
  attr = self_assignment(statement) if statement is not None else None
  return [facts.parent(sub) for sub in descendants(node)
          if isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value == attr
          and isinstance(facts.parent(sub), cst.Call) and facts.parent(sub).func is sub]


def _passed(facts: FileFacts, use: cst.Call, plan: ClassRewrite, param: str) -> str | None:
  """Code saying whether the call `use` passes the argument `param` (not None), valid where the construction is:
  'True', 'False' or the construction-time test it is passed under; None when that is not known."""
  names = plan.call_params
  value = next((a.value for i, a in enumerate(use.args)
                if (a.keyword.value if a.keyword is not None else names[i] if i < len(names) else None) == param), None)
  if value is None or isinstance(value, cst.Name) and value.value == 'None':
    return 'False'
  if not isinstance(value, cst.Name):
    return 'True'
  scope = facts.scope(value)
  assignments = list(scope[value.value]) if scope is not None and value.value in scope else []
  bound = [facts.parent(facts.parent(a.node)) for a in assignments if isinstance(a, cst.metadata.Assignment)
           and isinstance(facts.parent(a.node), cst.AssignTarget)]
  if len(bound) != len(assignments) or not bound:
    return None
  if not any(isinstance(b.value, cst.Name) and b.value.value == 'None' for b in bound):
    return 'True'
  statement = value_else_none(facts.parent, bound)
  if statement is None:
    return None
  names_read = [n for n in (statement.test, *descendants(statement.test)) if isinstance(n, cst.Name)]
  if any(n.value not in ('self', 'True', 'False', 'None') and not _attribute_name(facts, n) for n in names_read):
    return None  # a local or a call argument: not known when the construction runs
  return facts.code(statement.test)


def _attribute_name(facts: FileFacts, name: cst.Name) -> bool:
  """Whether `name` is the attribute part of an attribute chain (`tie_word_embeddings` of `self.config.x`)."""
  parent = facts.parent(name)
  return isinstance(parent, cst.Attribute) and parent.attr is name


def _call_blocker(facts: FileFacts, plan: ClassRewrite, use: cst.Call) -> str | None:
  """Why the call `use` of the built module does not fit its NNX `__call__` (a dropped switch by position)."""
  if any(arg.star == '*' for arg in use.args):  # `self.decoder(*args, **kwargs)`: callers out of sight
    shifted = _shifted_switch(facts, plan)
    return None if shifted is None else f'a call of {plan.name} forwards *args, which may hold its train/eval ' \
                                        f'argument {shifted}, followed by other positional ones'
  dropped = [i for i, _, _ in plan.mode_params if i < len(plan.call_params)]
  positional = sum(1 for arg in use.args if arg.keyword is None and not arg.star)
  if dropped and positional > min(dropped):
    return f'a call of {plan.name} passes its train/eval argument by position'
  return None


def _shifted_switch(facts: FileFacts, plan: ClassRewrite) -> str | None:
  """The first train/eval argument of `plan`'s Linen `__call__` that other positional parameters follow, else None.
  Callers out of sight (transformers' wrappers call `module._get_encoder_module()`, which returns `self.encoder`, or
  forward `*args`) call with the Linen arguments: a switch the NNX `__call__` drops must be one no positional call
  can shift others into, so that by position it fails loudly, and by keyword the wrapper takes it."""
  if plan.origin:
    return plan.bridge_facts.shifted_switch if plan.bridge_facts is not None else None
  params = _method(facts.class_defs[plan.name], '__call__').params
  positional = [p.name.value for p in (*params.posonly_params, *params.params)][1:]
  modes = {name for _, name, _ in plan.mode_params}
  first = next((i for i, name in enumerate(positional) if name in modes), None)
  if first is not None and any(name not in modes for name in positional[first:]):
    return positional[first]
  return '*args' if modes and isinstance(params.star_arg, cst.Param) else None


def _loop_blocker(facts: FileFacts, plan: ClassRewrite, loop: cst.For, position: int) -> str | None:
  """Why the layers a `for layer in self.layers:` loop runs do not fit their NNX `__call__`, or None; `position`:
  where the layer is in the loop's target (-1: the target, or the last of `i, layer`)."""
  target = loop.target
  if isinstance(target, cst.Tuple) and len(target.elements) > max(position, -position - 1):
    target = target.elements[position].value  # `for i, layer in enumerate(...)`, `for a, b in zip(...)`
  if not isinstance(target, cst.Name):
    return f'a loop over {plan.name} layers with an unpacked target'
  calls = {id(c.func): c for c in descendants(loop.body) if isinstance(c, cst.Call)}
  for sub in descendants(loop.body):
    if isinstance(sub, cst.Name) and sub.value == target.value and not _other_class_arm(facts, plan, sub, loop):
      use = calls.get(id(sub))
      reason = None if use is None and _isinstance_subject(facts, sub) \
          else f'a layer of {plan.name} is used other than by calling it in its loop' if use is None \
          else _call_blocker(facts, plan, use)
      if reason is not None:
        return reason
  return None


def _other_class_arm(facts: FileFacts, plan: ClassRewrite, use: cst.Name, loop: cst.For) -> bool:
  """Whether `use` of a loop's layer is in an arm that runs for a layer of another class than `plan`'s only: the
  body of `if isinstance(layer, Other):`, or the `else:` of `if isinstance(layer, <plan's class>):` (diffusers'
  ControlNet calls its cross-attention down blocks with the text states, the others without)."""
  node = use
  for above in _above(facts, use, loop):
    if isinstance(above, cst.If) and isinstance(above.test, cst.Call) and _builtin_isinstance(facts, above.test) \
        and isinstance(subject := above.test.args[0].value, cst.Name) and subject.value == use.value:
      tested = above.test.args[1].value
      ours = _denotes(facts, tested, plan)
      other = not ours and _unrelated_class(facts, tested)
      if node is above.body and other or node is above.orelse and ours:
        return True
    node = above
  return False


def _unrelated_class(facts: FileFacts, node: cst.CSTNode) -> bool:
  """Whether `node` names a Linen class of the run (converted or not) that no class of the run subclasses: a layer
  it tests for is of that class, never of another."""
  found = {key for q in facts.qualified_names(node) if (key := facts.hierarchy.resolve(q.name)) is not None}
  return bool(found) and not found & facts.hierarchy.bases


def _denotes(facts: FileFacts, node: cst.CSTNode, plan: ClassRewrite) -> bool:
  """Whether `node` names the class of `plan` (of this file, or of another by its record)."""
  if plan.origin:
    return facts.imported_class(node) == f'{plan.origin}.{plan.name}'
  return isinstance(node, cst.Name) and node.value == plan.name


def _loop_over(facts: FileFacts, attr: cst.Attribute) -> tuple[cst.For, int] | None:
  """The for loop whose iterable is `attr` (or `enumerate(attr)`, `zip(..., attr, ...)`, a slice `attr[1:]` in
  either), with where its layer is in the loop's target; else None."""
  node, parent, position = attr, facts.parent(attr), -1
  if isinstance(parent, cst.Subscript) and parent.value is attr and len(parent.slice) == 1 \
      and isinstance(parent.slice[0].slice, cst.Slice):  # `self.resnets[1:]`
    node, parent = parent, facts.parent(parent)
  if isinstance(parent, cst.Arg) and not parent.star and parent.keyword is None:
    call = facts.parent(parent)
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in ('enumerate', 'zip') \
        and (call.func.value == 'zip' or len(call.args) == 1):
      position = call.args.index(parent) if call.func.value == 'zip' else -1
      node, parent = call, facts.parent(call)
  return (parent, position) if isinstance(parent, cst.For) and parent.iter is node else None


def _bridge_code(facts: FileFacts, call: cst.Call, flags: dict[str, str], sizes: dict[str, str],
                 traced: dict[str, str | None], names: dict[str, str], auto: str | None) -> str:
  """`nnx_bridge.to_linen(<the class built>, <the construction's arguments>, <the name Linen gave it>, <tie flags>,
  input_sizes={...}, traced_sizes=(...), traced_inputs={...}, linen_names={...})`."""
  arguments = [facts.code(call.func), *(facts.code(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT)).strip() for arg in call.args)]
  arguments += [f'name={auto!r}'] if auto is not None else []
  arguments += [f'{flag}={value}' for flag, value in flags.items() if value != 'False']
  if sizes:
    arguments.append('input_sizes={' + ', '.join(f'{k!r}: {v!r}' for k, v in sizes.items()) + '}')
  if layers := [name for name, argument in traced.items() if argument is None]:
    arguments.append(f'traced_sizes=({", ".join(map(repr, layers))},)')
  if inputs := {name: argument for name, argument in traced.items() if argument is not None}:
    arguments.append('traced_inputs={' + ', '.join(f'{k!r}: {v!r}' for k, v in inputs.items()) + '}')
  if names:
    arguments.append('linen_names={' + ', '.join(f'{k!r}: {v!r}' for k, v in names.items()) + '}')
  return f'nnx_bridge.to_linen({", ".join(arguments)})'


def _method(node: cst.ClassDef, name: str) -> cst.FunctionDef | None:
  return next((s for s in node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == name), None)


def _setup_code_blocker(facts: FileFacts, blocker: cst.CSTNode, call: cst.Call, setup: cst.FunctionDef | None) -> bool:
  """Whether `user` is kept for this very construction in setup() code (`X(...)` inside a list, a conditional
  expression: `setup_code.setup_code_blocker`), which a second run finds again in `nnx_bridge.to_linen(X, ...)`
  and says the same of: the construction is bridged where it is."""
  return blocker is call.func and setup is not None and facts.inside(call, setup)


def _in_loop(facts: FileFacts, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
  """Whether `node` is in a loop or comprehension below `ancestor`: a to_linen construction there is refused when a
  second run plans the class (loops.py converts no Linen module built in a loop)."""
  return any(isinstance(above, (cst.For, cst.While, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp))
             for above in _above(facts, node, ancestor))


def _statement_of(facts: FileFacts, node: cst.CSTNode) -> cst.SimpleStatementLine | None:
  while node is not None and not isinstance(node, cst.SimpleStatementLine):
    if isinstance(node, cst.BaseCompoundStatement):
      return None
    node = facts.parent(node)
  return node


