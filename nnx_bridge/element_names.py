"""The Linen names of a list's elements, as `to_linen(..., linen_names=...)` writes them.

A setup() list names its elements `name=str(i)` or `f'block_{i}'`; a compact body building layers in a loop lets
Linen count them: the k-th of two convolutions per iteration i is `Conv_{k + 2 * i}` (dopamine's Impala `Stack`).
A template holds one placeholder for the element's index i: `{}` (i itself) or `{a + b * i}` with integers a and b.
"""

from __future__ import annotations

import re

_PLACEHOLDER = re.compile(r'\{([^{}]*)\}')
_AFFINE = re.compile(r'(?:(\d+) \+ )?(?:(\d+) \* )?i')


def is_template(name: str) -> bool:
  """Whether `name` names a list's elements (it holds a placeholder)."""
  return _PLACEHOLDER.search(name) is not None


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
