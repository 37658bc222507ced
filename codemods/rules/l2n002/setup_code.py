"""Plain code in setup(): statements that are not a submodule or variable, kept as they are in `__init__`.

Real setup() methods hold more than `self.x = Layer(...)`: `embed_dim = self.config.hidden_size`,
`self.head_dim = self.embed_dim // self.num_heads`, `if ...: raise ValueError(...)`,
`self.activation = ACT2FN[self.config.hidden_act]`. NNX runs `__init__` where Linen ran setup(), with the
fields already stored, so such a statement means the same there and stays, in its place among the
submodules. `setup_code_blocker` finds what would not: a statement that builds or names a Linen module
other than as `self.<attr> = Layer(...)`, uses a scope API (`self.param` inside an expression), or
calls code L2N002 does not follow and that could build a module (a method of the class, a function of
the project that builds Linen modules; a function of a file of the run that mentions neither flax nor a Linen
class of the run is plain code: `LinenHierarchy.plain_modules`).
"""

from __future__ import annotations

import importlib.util
import os

import libcst as cst
from libcst.metadata import QualifiedNameSource

from codemods.nodes import descendants
from codemods.rules.l2n002.facts import FileFacts
from codemods.rules.l2n002.nodes import DEFERRING, field_name, is_self_attr, scope_api, self_assignment
from codemods.vocabulary import TO_LINEN_NAMES

_INSIDE = {**DEFERRING, cst.List: 'a list', cst.Tuple: 'a tuple', cst.Dict: 'a dict',  # where it sits in a statement
           cst.If: 'an if block', cst.For: 'a for loop', cst.While: 'a while loop'}


def plain_attributes(statement: cst.CSTNode) -> set[str]:
  """The attributes a plain setup() statement assigns (`self.head_dim = ...`), which children must not take; but
  `self.conv_shortcut = None`, which a submodule built under a condition may then replace (diffusers' resnets)."""
  found = set()
  for sub in (statement, *descendants(statement)):
    if isinstance(sub, cst.Assign) and isinstance(sub.value, cst.Name) and sub.value.value == 'None':
      continue
    targets = [t.target for t in sub.targets] if isinstance(sub, cst.Assign) else \
        [sub.target] if isinstance(sub, (cst.AugAssign, cst.AnnAssign)) else []
    for target in targets:
      for node in (target, *descendants(target)):
        if isinstance(node, cst.Attribute) and is_self_attr(node):
          found.add(node.attr.value)
  return found


def value_placeholders(setup: cst.FunctionDef) -> dict[str, cst.BaseStatement]:
  """The top-level setup() statements `self.<attr> = <plain value>` (transformers' Electra: `self.summary = identity`,
  which an `if` may then replace with `nn.Dense(...)`), by attribute; a `None` is `none_placeholders`'."""
  found = {}
  for statement in setup.body.body:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 \
        and isinstance(assign := statement.body[0], cst.Assign) and len(assign.targets) == 1 \
        and isinstance(target := assign.targets[0].target, cst.Attribute) and is_self_attr(target) \
        and not (isinstance(assign.value, cst.Name) and assign.value.value == 'None'):
      found.setdefault(target.attr.value, statement)
  return found


def none_placeholders(setup: cst.FunctionDef) -> dict[cst.Name, str]:
  """The `None` of each `self.<attr> = None` in setup(), with its attribute. Where a submodule then takes the
  attribute, the `None` becomes `nnx.data(None)`: NNX takes an attribute first set to None for a static one, which a
  submodule then cannot replace."""
  return {sub.value: sub.targets[0].target.attr.value for sub in descendants(setup)
          if isinstance(sub, cst.Assign) and len(sub.targets) == 1
          and isinstance(sub.targets[0].target, cst.Attribute) and is_self_attr(sub.targets[0].target)
          and isinstance(sub.value, cst.Name) and sub.value.value == 'None'}


def setup_code_blocker(facts: FileFacts, node: cst.ClassDef, statement: cst.CSTNode
                       ) -> tuple[cst.CSTNode, str] | None:
  """Why the setup() `statement` of the class `node` cannot stay as it is in `__init__` (the node at fault and
  the message), or None when it can."""
  for sub in (statement, *descendants(statement)):
    if isinstance(sub, cst.Call) and scope_api(sub) is not None:
      return sub, (f'self.{scope_api(sub)}(...) inside a setup() statement: only `self.<attr> = '
                   f'self.{scope_api(sub)}(...)` is converted')
    if isinstance(sub, (cst.Name, cst.Attribute)) and _names_linen_class(facts, sub):
      if _of_another_file(facts, sub) and self_assignment(statement) is not None \
          and (call := facts.parent(sub)) is statement.body[0].value and call.func is sub:
        return sub, kept_class_of_another_file(facts, call)
      return sub, f'{facts.code(sub)}, a Linen module class, {_where(facts, sub, statement)}'
    if isinstance(sub, cst.Call) and _bridged_class(facts, sub) is not None:  # what a first run made of `X()`
      return sub, f'{_bridged_class(facts, sub)}, a Linen module class, {_where(facts, sub, statement, built=True)}'
    if isinstance(sub, cst.Call) and not (isinstance(sub.func, (cst.Name, cst.Attribute)) and _names_linen_class(facts, sub.func)):
      blocker = _call_blocker(facts, sub, node)
      if blocker is not None:
        return sub, blocker
  return None


def _names_linen_class(facts: FileFacts, node: cst.Name | cst.Attribute) -> bool:
  """Whether `node` names a Linen class of the file or, imported, of the run."""
  return any(q.source is QualifiedNameSource.LOCAL and q.name in facts.linen_classes
             or q.source is QualifiedNameSource.IMPORT and facts.hierarchy.resolve(q.name) is not None
             for q in facts.qualified_names(node))


def kept_class_of_another_file(facts: FileFacts, call: cst.Call) -> str | None:
  """Why `call`, which builds no module the planner knows (`constructions.constructed` is None), keeps its class
  Linen: it builds a Linen class of another file of the run whose fate the file was not told (jax-md's `act =
  GateActivation(...)` in a compact body): the class is `FileFacts.awaited`, and the engine migrates the file again
  with its record, or telling it the class stays Linen (then wrapped with nnx_bridge.from_linen); None for other
  calls."""
  func = call.func
  if not (isinstance(func, (cst.Name, cst.Attribute)) and _names_linen_class(facts, func) and _of_another_file(facts, func)):
    return None
  facts.awaited.update(found for q in facts.qualified_names(func) if (found := facts.hierarchy.resolve(q.name)))
  return f'{facts.code(func)}, a Linen module class of another file, stays Linen there (see its TODO)'


def _of_another_file(facts: FileFacts, node: cst.Name | cst.Attribute) -> bool:
  """Whether `node` names a Linen class another file of the run defines (and none of this file)."""
  return not any(q.source is QualifiedNameSource.LOCAL and q.name in facts.linen_classes
                 for q in facts.qualified_names(node))


def _bridged_class(facts: FileFacts, call: cst.Call) -> str | None:
  """The class `nnx_bridge.to_linen(X, ...)` builds as a Linen module (the code of X), else None: a second run
  finds there the `X(...)` the first run bridged, and says of it what the first run said of `X(...)`."""
  if facts.has_name(call.func, TO_LINEN_NAMES) and call.args and call.args[0].keyword is None \
      and isinstance(call.args[0].value, (cst.Name, cst.Attribute)):
    return facts.code(call.args[0].value)
  return None


def _where(facts: FileFacts, node: cst.CSTNode, statement: cst.CSTNode, built: bool = False) -> str:
  """How a Linen class is used in a plain statement, for the TODO: built inside some construct, or named;
  `built`: `node` is the construction itself."""
  parent = facts.parent(node)
  built = built or isinstance(parent, cst.Call) and parent.func is node
  inside = None
  while parent is not None and inside is None and node is not statement:
    inside, node, parent = _INSIDE.get(type(parent)), parent, facts.parent(parent)
  if built and inside is not None:
    return f'is built inside {inside}; NNX builds submodules in __init__: give it a statement self.<attr> = ...(...)'
  if built:
    return 'is built other than as self.<attr> = ...(...) in setup()'
  return 'is named other than to build it (a ModuleDef local or attribute): build it as self.<attr> = ...(...)'


def _call_blocker(facts: FileFacts, call: cst.Call, node: cst.ClassDef) -> str | None:
  """Why a call in plain setup() code may build a Linen module that NNX would then hold, else None."""
  func = call.func
  if isinstance(func, cst.Attribute) and is_self_attr(func):
    if any(isinstance(s, cst.FunctionDef) and s.name.value == func.attr.value for s in node.body.body):
      return f'self.{func.attr.value}(...) calls a method of the class from setup(), which L2N002 does not follow'
    if func.attr.value in {field_name(s) for s in node.body.body}:
      return f'self.{func.attr.value}(...) calls the field {func.attr.value} (a ModuleDef or function) from setup()'
  for qualified in facts.qualified_names(func):
    name = qualified.name
    if qualified.source is QualifiedNameSource.IMPORT and _is_project(facts, name) \
        and not facts.hierarchy.in_plain_module(name):  # a file of the run that knows nothing of flax: plain code
      return f'{facts.code(func)}(...) calls {name}, code of this project L2N002 does not follow'
    if qualified.source is QualifiedNameSource.LOCAL and name in facts.global_names and _builds_modules(facts, name):
      if name in facts.class_defs:  # transformers' `FlaxOPTLearnedPositionalEmbedding(nn.Embed)`
        return f'{facts.code(func)}(...) builds {name}, a subclass of a Linen layer, which L2N002 does not convert'
      return f'{facts.code(func)}(...) calls {name} of this file, which may build Linen modules'
  return None


def plain_function(facts: FileFacts, func: cst.BaseExpression) -> bool:
  """Whether `func` names a module-level function of this file that names no Linen class or layer, so that what it
  returns is plain code too (flax's lm1b `sinusoidal_init(max_len=...)` returns an initializer, which the compact
  body then calls: `sinusoidal_init(max_len=config.max_len)(None, pos_emb_shape, None)`)."""
  return isinstance(func, cst.Name) and any(
      q.source is QualifiedNameSource.LOCAL and q.name == func.value for q in facts.qualified_names(func)) \
      and any(isinstance(s, cst.FunctionDef) and s.name.value == func.value for s in facts.module.body) \
      and not _builds_modules(facts, func.value)


def _is_project(facts: FileFacts, qualified: str) -> bool:
  """Whether an imported name comes from this project: a relative import, the file's own top package, or a module
  that holds Linen classes of the run."""
  top = qualified.partition('.')[0]
  return (qualified.startswith('.') or '.' in facts.hierarchy.module and top == facts.hierarchy.module.partition('.')[0]
          or any(c.startswith(f'{top}.') for c in facts.hierarchy.classes) and not _library(facts, top))


def _library(facts: FileFacts, top: str) -> bool:
  """Whether Python imports the top-level module `top` from outside the run's files (`jax`, while a run over
  dopamine's folders without their `__init__.py` also names its `dopamine/jax/` folder `jax`)."""
  try:
    spec = importlib.util.find_spec(top)
  except (ImportError, ValueError):
    return False
  places = [] if spec is None else list(spec.submodule_search_locations or ()) or [os.path.dirname(spec.origin or '')]
  return bool(places) and not any(os.path.commonpath([os.path.abspath(f), os.path.abspath(p)]) == os.path.abspath(p)
                                  for f in facts.hierarchy.files for p in places if p)


def _builds_modules(facts: FileFacts, name: str) -> bool:
  """Whether the module-level function `name` of the file names a Linen class or layer (and may build one), or the
  class `name` is one: a Linen class, or a subclass of a Linen layer (`class Embedding(nn.Embed)`)."""
  function = next((s for s in facts.module.body if isinstance(s, cst.FunctionDef) and s.name.value == name), None)
  if function is None:
    node = facts.class_defs.get(name)
    return node is None or name in facts.linen_classes or any(facts.is_linen_name(b.value) for b in node.bases)
  return any(isinstance(sub, (cst.Name, cst.Attribute)) and (
      _names_linen_class(facts, sub) or facts.is_linen_name(sub) and facts.code(sub).rpartition('.')[2][:1].isupper())
      for sub in descendants(function))
