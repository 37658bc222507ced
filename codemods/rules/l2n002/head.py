"""The class head of a Linen class: which base is Linen's, and whether its decorators, other bases and class
keywords can stay as they are on the NNX class.

Only the Linen base is rewritten (to `nnx.Module`, or the project base class converted with it); everything else
of the head is plain Python and is copied: `@gin.configurable`, a registry decorator, `metaclass=abc.ABCMeta`, a
mixin of the same file. What is refused names itself, with what to write instead: a Linen transform or a
dataclass decorator over the class (NNX classes write their own `__init__`), `kw_only=` (a Linen dataclass
option), two Linen bases, or a base out of sight (another file, a library), which may run the class the Linen way.
"""

from __future__ import annotations

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002.nodes import is_self_attr
from codemods.rules.l2n002.plan import Unsupported
from codemods.rules.l2n002.facts import FileFacts
from codemods.vocabulary import SCOPE_APIS

_DATACLASS_DECORATORS = ('dataclasses.dataclass', 'flax.struct.dataclass', 'chex.dataclass')
_PLAIN_BASE_MODULES = ('abc.', 'typing.', 'typing_extensions.', 'collections.abc.')


def check_head(facts: FileFacts, node: cst.ClassDef) -> int:
  """The position of the Linen base of `node`; raises Unsupported at the part of the head that cannot stay."""
  for decorator in node.decorators:
    names = {q.name for q in facts.qualified_names(decorator.decorator)}
    if isinstance(decorator.decorator, cst.Call):
      names |= {q.name for q in facts.qualified_names(decorator.decorator.func)}
    if any(n == 'flax.linen' or n.startswith('flax.linen.') for n in names):
      raise Unsupported(decorator, f'the class decorator @{facts.code(decorator.decorator)} is a Linen transform: '
                                   'apply it where the class is called instead (nnx.remat / nnx.jit over the call)')
    if any(n.startswith(_DATACLASS_DECORATORS) for n in names):
      raise Unsupported(decorator, f'the class decorator @{facts.code(decorator.decorator)} writes an __init__ over '
                                   'the NNX one: remove it (the Linen class is a dataclass already)')
  for keyword in node.keywords:
    if keyword.keyword is not None and keyword.keyword.value in ('kw_only', 'parent'):
      raise Unsupported(keyword, f'the Linen class keyword {keyword.keyword.value}= has no NNX counterpart: '
                                 'remove it (make the fields keyword-only by hand after the migration)')
  linen = facts.linen_bases(node)
  if len(linen) != 1:
    raise Unsupported(node, f'{len(linen)} Linen bases: keep one Linen base, and move the others\' fields and '
                            'submodules into it')
  for i, base in enumerate(node.bases):
    if i != linen[0] and not _plain_base(facts, base.value):
      local = isinstance(base.value, cst.Name) and base.value.value in facts.class_defs
      why = ('defines a hook Linen runs (setup, __post_init__, __init__) or calls Linen\'s API on self' if local else
             'is out of sight (another file or a library) and may run the class the Linen way (init, apply, variables)')
      raise Unsupported(base, f'the base {facts.code(base.value)} {why}: convert it with the class, or move what the '
                              'class needs from it into the class')
  return linen[0]


def _plain_base(facts: FileFacts, base: cst.BaseExpression) -> bool:
  """A base that cannot reach Linen's API: from `abc` / `typing`, or a class of this file that is no Linen class,
  defines no hook Linen's dataclass runs (`setup`, `__post_init__`, `__init__`) and calls no scope API on self."""
  if any(q.name.startswith(_PLAIN_BASE_MODULES) or q.name in ('object', 'builtins.object')
         for q in facts.qualified_names(base)):
    return True
  if not isinstance(base, cst.Name) or base.value not in facts.class_defs or base.value in facts.linen_classes:
    return False
  hooks = {'setup', '__post_init__', '__init__'}  # run by Linen's dataclass machinery, not by NNX
  if any(isinstance(s, cst.FunctionDef) and s.name.value in hooks for s in facts.class_defs[base.value].body.body):
    return False
  return not any(isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value in SCOPE_APIS
                 for sub in descendants(facts.class_defs[base.value]))


def check_field(facts: FileFacts, field: cst.SimpleStatementLine, name: str) -> None:
  """A dataclass field becomes an `__init__` parameter with the same default: a computed default
  (`kernel_init: Callable = nn.initializers.lecun_normal()`) is evaluated once, when the class is defined, in
  both; raises Unsupported for what a parameter cannot say (`dataclasses.field(...)`, a name NNX reserves)."""
  value = field.body[0].value
  if name in ('name', 'parent', 'rngs'):
    raise Unsupported(field, f'the field {name} has a name NNX\'s constructor reserves: rename it (and its uses)')
  if isinstance(value, cst.Call) and any(q.name.rpartition('.')[2] == 'field' for q in facts.qualified_names(value.func)):
    raise Unsupported(field, f'the field {name} is declared with {facts.code(value.func)}(...), which an __init__ '
                             'parameter cannot say: write a plain default (or None, set in the body)')
