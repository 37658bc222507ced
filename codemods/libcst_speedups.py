"""Spare libcst visitor classes without matcher decorators the work only those decorators need.

libcst's matcher-decoratable classes, the base of every codemod and visitor that migrate runs
(the rules, `AddImportsVisitor`, `RemoveImportsVisitor` and the visitors those two run), support
matcher decorators (`@m.visit`, `@m.call_if_inside`, ...) at a cost each class pays, decorated or
not (libcst issue #880):

- each new instance has all its attributes looked through for decorators: three `dir()` walks
  of ~1,000 names, ~6 ms, several instances per file;
- each node visited goes through matcher bookkeeping, about a third of a traversal's time.

Besides, `BatchableCSTVisitor.get_visitors`, run for each metadata provider whenever metadata
is computed, looks through all the attributes again for the `visit_*` / `leave_*` methods (~1 ms).
And `ParentNodeProvider`, which every rule declares, visits the tree and asks each node for its
`children`, a second visit of it: reading the children off the node's dataclass fields instead gives
the same parents in an eighth of the time (0.03 s against 0.26 s on transformers' BERT file).

Each answer depends on the class only. `install()` wraps these helpers so that a class found,
once, to have no matcher decorators is not looked through again and visits nodes as the plain
`CSTTransformer` / `CSTVisitor` it is then equivalent to, and so that `get_visitors` finds the
method names once per class. A class with decorators goes the original way every time.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst
from libcst.metadata import ParentNodeProvider
from libcst.matchers import MatcherDecoratableTransformer
from libcst.matchers import MatcherDecoratableVisitor

try:
  from libcst.matchers import _visitors as _matcher_visitors
except ImportError:  # a libcst without this private module: it is only slower
  _matcher_visitors = None

_MATCHER_SCANS = ('_gather_constructed_visit_funcs', '_gather_constructed_leave_funcs', '_gather_matchers')
_DISPATCH = ('on_visit', 'on_leave', 'on_visit_attribute', 'on_leave_attribute')
_INSTALLED = '_linen2nnx_per_class'
# Visitor classes (few, defined once) by what the scans found on their instances.
_EMPTY: dict[str, set[type]] = {name: set() for name in _MATCHER_SCANS}
_PLAIN: set[type] = set()  # the classes every scan found nothing on
_FIELDS: dict[type, tuple[str, ...]] = {}  # node class -> the names of its dataclass fields

Function = tp.Callable[..., tp.Any]


def install() -> None:
  """Wraps libcst's helpers, once; leaves all as they are if a libcst version lacks one."""
  scans = [getattr(_matcher_visitors, name, None) for name in _MATCHER_SCANS]
  if all(callable(scan) for scan in scans) and not hasattr(scans[0], _INSTALLED):
    for name, scan in zip(_MATCHER_SCANS, scans):
      setattr(_matcher_visitors, name, _recording_empty(name, scan))
    for decoratable, plain in ((MatcherDecoratableTransformer, cst.CSTTransformer),
                               (MatcherDecoratableVisitor, cst.CSTVisitor)):
      for name in _DISPATCH:
        setattr(decoratable, name, _plain_when_possible(getattr(decoratable, name), getattr(plain, name)))
  if not hasattr(cst.BatchableCSTVisitor.get_visitors, _INSTALLED):
    cst.BatchableCSTVisitor.get_visitors = _by_class(cst.BatchableCSTVisitor.get_visitors)
  if not hasattr(ParentNodeProvider.visit_Module, _INSTALLED):
    setattr(_set_parents, _INSTALLED, True)
    _set_parents.__name__ = 'visit_Module'  # the name `get_visitors` finds a batched provider's methods by
    ParentNodeProvider.visit_Module = _set_parents


def _set_parents(provider: ParentNodeProvider, module: cst.Module) -> None:
  """`ParentNodeProvider.visit_Module`: each node's parent, with its children read off its fields (`field_children`)."""
  stack: list[cst.CSTNode] = [module]
  while stack:
    node = stack.pop()
    for child in field_children(node):
      provider.set_metadata(child, node)
      stack.append(child)


def field_children(node: cst.CSTNode) -> list[cst.CSTNode]:
  """The nodes `node.children` holds, not in its order: those its dataclass fields hold, alone or in a sequence
  (libcst visits each of them, and nothing else)."""
  names = _FIELDS.get(type(node))
  if names is None:
    names = _FIELDS[type(node)] = tuple(field.name for field in dataclasses.fields(node))
  found = []
  for name in names:
    value = getattr(node, name)
    if isinstance(value, cst.CSTNode):
      found.append(value)
    elif isinstance(value, (list, tuple)):
      found.extend(item for item in value if isinstance(item, cst.CSTNode))
  return found


def _recording_empty(name: str, scan: Function) -> Function:
  """`scan`, not run again for a class it found nothing on; a class no scan finds anything on is plain."""
  empty = _EMPTY[name]

  def recording(obj: tp.Any) -> dict[tp.Any, tp.Any]:
    if type(obj) in empty:
      return {}
    found = scan(obj)
    if not found:
      empty.add(type(obj))
      if all(type(obj) in classes for classes in _EMPTY.values()):
        _PLAIN.add(type(obj))
    return found

  setattr(recording, _INSTALLED, True)
  return recording


def _plain_when_possible(decoratable: Function, plain: Function) -> Function:
  """The decoratable class's dispatch method, or the plain one for a class without decorators."""

  def dispatch(self: tp.Any, *args: tp.Any) -> tp.Any:
    return (plain if type(self) in _PLAIN else decoratable)(self, *args)

  return dispatch


def _by_class(get_visitors: Function) -> Function:
  """`get_visitors`, run once per class: later instances get the same names, bound to them."""
  names: dict[type, tuple[str, ...]] = {}

  def by_class(visitor: tp.Any) -> dict[str, tp.Any]:
    known = names.get(type(visitor))
    if known is None:
      found = get_visitors(visitor)
      names[type(visitor)] = tuple(found)
      return found
    return {name: getattr(visitor, name) for name in known}

  setattr(by_class, _INSTALLED, True)
  return by_class
