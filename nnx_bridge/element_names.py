"""The Linen names of a list's elements, as `to_linen(..., linen_names=...)` writes them.

A setup() list names its elements `name=str(i)` or `f'block_{i}'`; a compact body building layers in a loop lets
Linen count them: the k-th of two convolutions per iteration i is `Conv_{k + 2 * i}` (dopamine's Impala `Stack`).
A template holds one placeholder for the element's index i: `{}` (i itself) or `{a + b * i}` with integers a and b.

A compact body building a loop's layers and then one more lets Linen number the last after the loop's: dopamine's
actor network names its output layer `Dense_{self.num_layers}`. Such a name holds a placeholder for an int attribute
of the NNX module the submodule belongs to, `{num_layers}` or `{num_layers + 1}` (`resolve_attributes`).

A submodule's Linen name is its owner class's to give: where the classes a module may hold at one path (ResNet's
stage builds a bottleneck or a basic layer, as its config says) name their submodules apart, a key says whose name it
is, `'layers.{}.layer@BottleNeckLayerCollection': '{}'` (the module holding `layer` must be of that class), and
`resolve_owners` keeps the keys the built module's classes meet, at each path they meet (indices written out).
"""

from __future__ import annotations

import re
import typing as tp

_PLACEHOLDER = re.compile(r'\{([^{}]*)\}')
_AFFINE = re.compile(r'(?:(\d+) \+ )?(?:(\d+) \* )?i')
_ATTRIBUTE = re.compile(r'\{([A-Za-z_]\w*)(?: \+ (\d+))?\}')


def is_template(name: str) -> bool:
  """Whether `name` names a list's elements (it holds a placeholder)."""
  return _PLACEHOLDER.search(name) is not None


def attribute_placeholder(name: str) -> tuple[str, int] | None:
  """The attribute and the number added to it of a name `Dense_{num_layers + 1}`, else None (`{i}` is an index)."""
  found = _ATTRIBUTE.search(name)
  return (found[1], int(found[2] or 0)) if found is not None and found[1] != 'i' else None


def resolve_attributes(names: tp.Mapping[str, str], root: tp.Any) -> dict[str, str]:
  """`names` (dotted path -> Linen name) with each attribute placeholder replaced by the int attribute of the
  module at the path's parent under `root`, plus its number; raises ValueError for an attribute that is not an int
  there, or a path through a list's elements."""
  resolved = dict(names)
  for path, name in names.items():
    if (found := attribute_placeholder(name)) is None:
      continue
    owner = root
    for key in path.split('.')[:-1]:
      if key == '{}':
        raise ValueError(f'linen_names: {path!r}: {name!r} names an attribute of a list element')
      owner = getattr(owner, key, None)
    value = getattr(owner, found[0], None)
    if type(value) is not int:
      raise ValueError(f'linen_names: {path!r}: {name!r} needs the int attribute {found[0]} of the module holding '
                       f'it, which is {value!r}')
    resolved[path] = _ATTRIBUTE.sub(str(value + found[1]), name, count=1)
  return resolved


def resolve_owners(names: tp.Mapping[str, str], root: tp.Any) -> dict[str, str]:
  """`names` with each key `path@Owner` replaced by the path at every place under `root` where the module holding
  the path's last attribute is of the class named Owner, its list indices written out (`'layers.0.layer'`); such a
  key nowhere met is dropped."""
  resolved = {}
  for key, name in names.items():
    path, _, owner = key.partition('@')
    if not owner:
      resolved[key] = name
      continue
    *above, last = path.split('.')
    for concrete, module in _places(root, above, []):
      if type(module).__name__ == owner:
        resolved['.'.join([*concrete, last])] = name
  return resolved


def _places(module: tp.Any, keys: list[str], done: list[str]) -> tp.Iterator[tuple[list[str], tp.Any]]:
  """Each (concrete path, module) under `module` that `keys` reach, `{}` standing for every index of a list."""
  if not keys:
    yield done, module
    return
  key, rest = keys[0], keys[1:]
  if key == '{}':
    for index, element in enumerate(module if hasattr(module, '__len__') else ()):
      yield from _places(element, rest, [*done, str(index)])
    return
  below = getattr(module, key, None)
  if below is not None:
    yield from _places(below, rest, [*done, key])


def element_name(template: str, index: int) -> str:
  """The Linen name of element `index` of a list named by `template`; raises ValueError for a placeholder other
  than `{}` or `{a + b * i}`."""
  def value(placeholder: re.Match) -> str:
    if not placeholder[1]:
      return str(index)
    affine = _AFFINE.fullmatch(placeholder[1])
    if affine is None:
      raise ValueError(f'linen_names: {template!r} has a placeholder other than {{}} or {{a + b * i}} (integers a, b)')
    return str(int(affine[1] or 0) + int(affine[2] or 1) * index)
  return _PLACEHOLDER.sub(value, template, count=1)


def template(prefix: str, offset: int, step: int, suffix: str) -> str:
  """The template of the names `prefix{offset + step * i}suffix`, in its shortest form."""
  if (offset, step) == (0, 1):
    return f'{prefix}{{}}{suffix}'
  terms = ([f'{offset} + '] if offset else []) + ([f'{step} * '] if step != 1 else [])
  return f'{prefix}{{{"".join(terms)}i}}{suffix}'
