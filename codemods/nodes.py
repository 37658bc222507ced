"""Small helpers over libcst nodes that the analysis and the rules share."""

from __future__ import annotations

import contextlib
import typing as tp

import libcst as cst


_children_cache: dict[cst.CSTNode, tuple[cst.CSTNode, ...]] | None = None
"""Each node's children while `children_cached()` is active (libcst nodes are immutable): libcst computes
`node.children` with a visit of the node, and the planning passes walk the same subtrees many times."""


@contextlib.contextmanager
def children_cached() -> tp.Iterator[None]:
  """Within it, each node's children are computed once (`descendants`, `children`); the cache, holding the nodes,
  goes when the outermost one ends."""
  global _children_cache
  outer = _children_cache is not None
  if not outer:
    _children_cache = {}
  try:
    yield
  finally:
    if not outer:
      _children_cache = None


def children(node: cst.CSTNode) -> tp.Sequence[cst.CSTNode]:
  """`node.children`, computed once per node inside `children_cached()`."""
  cache = _children_cache
  if cache is None:
    return node.children
  found = cache.get(node)
  if found is None:
    found = cache[node] = tuple(node.children)
  return found


def descendants(node: cst.CSTNode) -> tp.Iterator[cst.CSTNode]:
  """Every node below `node`, depth first: what the analysis and the rules search when planning a rewrite.

  A stack rather than recursion: each node costs the same at any depth (nested generators pass
  each node up through one frame per level) and deep nesting does not reach the recursion limit.
  """
  stack = list(reversed(children(node)))
  while stack:
    child = stack.pop()
    yield child
    stack.extend(reversed(children(child)))
