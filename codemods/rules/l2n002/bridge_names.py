"""The Linen names a converted class's NNX submodules keep under `nnx_bridge.to_linen` (`linen_names`), down the
tree, or why its NNX state does not map onto Linen's variable paths: what a Linen class wrapping the class (
`linen_parents.py`) passes as `to_linen(linen_names=...)`, so that its variables keep their Linen paths."""

from __future__ import annotations

import ast
import re

from codemods.rules.l2n002.facts import FileFacts
from codemods.rules.l2n002.plan import Child, ClassRewrite
from nnx_bridge import element_names

_ELEMENT_NAME = re.compile(r'(\w*)\{([^{}]+)\}(\w*)')  # a list's Linen name pattern, by the loop's index
_AFTER_LOOP_NAME = re.compile(r'(\w*)\{self\.(\w+)( \+ \d+)?\}(\w*)')  # a layer numbered after a loop's


def _plan_blocker(facts: FileFacts, plan: ClassRewrite) -> str | None:
  """Why `plan`'s NNX `__init__` takes more than a Linen construction gives, or None."""
  if plan.example_params:
    return f'{plan.name} wraps Linen children with nnx_bridge.from_linen, which need example inputs'
  if plan.cache_input is not None:
    return f'{plan.name} has a decode cache (init_cache)'
  if set(plan.flags) - set(plan.tie_flags.values()):
    return f'{plan.name} takes flags other than tied-layer flags'
  if plan.collections:
    return f'{plan.name} keeps variables in a generated Variable type ({", ".join(plan.collections)})'
  if plan.helpers_only or plan.base != 'nnx.Module':
    return f'{plan.name} has a project base class'
  return None


def _named_apart(facts: FileFacts, elements: list[Child]) -> bool:
  """Whether two classes of a list written out hold a submodule at one NNX path that Linen names differently:
  the list's names, keyed by path below any element, would then name one of them wrongly."""
  seen: dict[str, str] = {}
  siblings = {id(c.sibling): c.sibling for c in elements if c.sibling is not None}.values()
  if len(siblings) > 1 and any(plan.origin for plan in siblings):  # its submodules are not known here
    return True
  for plan in siblings:
    names = linen_names(facts, plan, '')
    for path in _paths(plan, ''):
      name = names.get(path, path.rpartition('.')[2]) if isinstance(names, dict) else None
      if seen.setdefault(path, name) != name:
        return True
  return False


def _after_loop_template(plan: ClassRewrite, linen_name: str, prefix: str) -> str | None:
  """The `to_linen` name (`element_names.resolve_attributes`) of a layer Linen numbers by a field, after a loop's
  layers (`Dense_{self.num_layers}`, `Dense_{self.num_layers + 1}`): `Dense_{num_layers}`, read from the NNX
  module's attribute of that field; None for another name, or below a list's elements."""
  found = _AFTER_LOOP_NAME.fullmatch(linen_name)
  if found is None or found[2] not in plan.field_names or found[2] == 'i' or '{}' in prefix:
    return None
  return f'{found[1]}{{{found[2]}{found[3] or ""}}}{found[4]}'


def _element_template(linen_name: str) -> str | None:
  """The `to_linen` template (`element_names`) of a list's Linen names `prefix{<index>}suffix`, the index an integer
  combination `a + b * i` of the loop's index i (Linen counting layers built across iterations); else None."""
  element = _ELEMENT_NAME.fullmatch(linen_name)
  if element is None:
    return None
  try:
    terms = _terms(ast.parse(element[2], mode='eval').body)
  except SyntaxError:
    return None
  if terms is None or len({name for name, _ in terms if name is not None}) != 1:
    return None
  offset = sum(k for name, k in terms if name is None)
  step = sum(k for name, k in terms if name is not None)
  return element_names.template(element[1], offset, step, element[3]) if step > 0 and offset >= 0 else None


def _terms(node: ast.expr) -> list[tuple[str | None, int]] | None:
  """`node`, a sum of integers, names and integer multiples of names, as (name or None, factor) terms; else None."""
  if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
    left, right = _terms(node.left), _terms(node.right)
    return None if left is None or right is None else left + right
  if isinstance(node, ast.Constant) and type(node.value) is int:
    return [(None, node.value)]
  if isinstance(node, ast.Name):
    return [(node.id, 1)]
  if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
    factor, name = (node.left, node.right) if isinstance(node.left, ast.Constant) else (node.right, node.left)
    if isinstance(factor, ast.Constant) and type(factor.value) is int and isinstance(name, ast.Name):
      return [(name.id, factor.value)]
  return None


def _paths(plan: ClassRewrite, prefix: str) -> list[str]:
  """The dotted NNX path of each submodule below a converted class."""
  return [path for child in plan.children for path in (
      prefix + child.attr, *(_paths(child.sibling, f'{prefix}{child.attr}.') if child.sibling is not None else ()))]


def linen_names(facts: FileFacts, plan: ClassRewrite, prefix: str = '') -> dict[str, str] | str:
  """The dotted NNX path -> Linen name of each child of `plan` named otherwise in Linen, down the tree; or why
  its NNX state does not map onto Linen's variable paths. Where the classes a local may name at one place name
  their submodules apart (ResNet's bottleneck and basic layers), a key says which class's name it is
  (`'layers.{}.layer@FlaxResNetBottleNeckLayerCollection'`, `element_names.resolve_owners`)."""
  entries = _owned_names(facts, plan, prefix)
  if isinstance(entries, str):
    return entries
  by_key: dict[str, set[tuple[str | None, str]]] = {}
  for key, owner, name in entries:
    by_key.setdefault(key, set()).add((owner, name))
  names = {}
  for key, found in by_key.items():
    if len({name for _, name in found}) == 1:
      name = next(iter(found))[1]
      if name != key.rpartition('.')[2]:
        names[key] = name
    elif None in {owner for owner, _ in found} or len({owner for owner, _ in found}) != len(found):
      return f'{plan.name}.{key} is named apart by one class, or by a class of another file, in Linen'
    else:
      names.update((f'{key}@{owner}', name) for owner, name in sorted(found, key=lambda pair: pair[0]))
  return names


def _owned_names(facts: FileFacts, plan: ClassRewrite, prefix: str) -> list[tuple[str, str | None, str]] | str:
  """(dotted NNX path, the class holding it, its Linen name) for each child of `plan` down the tree (a class of
  another file: the names its record carries, held by no known class); or why its NNX state does not map onto
  Linen's variable paths."""
  if plan.origin:  # a class of another file: the names its record carries
    record = plan.bridge_facts
    if record is None or record.blocker is not None:
      return record.blocker if record is not None else f'{plan.name} is a class of {plan.origin}'
    return [(prefix + path, None, name) for path, name in record.linen_names]
  reason = _plan_blocker(facts, plan)
  if reason is not None:
    return reason
  entries = []
  for child in plan.children:
    where = f'{plan.name}.{child.attr}'
    linen_name, below_prefix = child.linen_name, f'{prefix}{child.attr}.'
    if child.element is None and (after := _after_loop_template(plan, linen_name, prefix)) is not None:
      linen_name = after  # a layer Linen numbers after a loop's: `Dense_{self.num_layers}`
    elif '{' in linen_name:  # an nnx.List: Linen names element i `{i}` (name=str(i)), `block_{i}`, `Conv_{1 + 2 * i}`
      element = _element_template(linen_name)
      if element is None:
        return f'{where} is a list of layers named {linen_name} in Linen, not by their index alone'
      linen_name, below_prefix = element, f'{below_prefix}{{}}.'
    if child.element == 0 and _named_apart(facts, [c for c in plan.children if c.attr == child.attr]):
      return f'{where} is a list of layers of several classes that Linen names apart'
    if child.alternative and child.sibling is not None and child.sibling.origin:
      return f'{where} is built by a local naming one class or another, one of another file'
    if child.bridged or child.cache and child.ctor not in plan.lazy_caches.values():
      return f'{where} is a bridged child or a decode cache init_cache creates'
    if child.stacked or child.scan or child.remat or child.wrapper:
      return f'{where} is run by a lifted transform'
    params = child.spec.params if child.spec is not None else None
    if params is not None and (params.key_renames or params.fuse or params.drop):
      return f'{where} ({child.spec.linen}) keeps its variables under other names in NNX'
    entries.append((prefix + child.attr, plan.name, linen_name))
    if child.sibling is not None:
      below = _owned_names(facts, child.sibling, below_prefix)
      if isinstance(below, str):
        return below
      entries += below
  return entries
