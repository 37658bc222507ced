"""Small helpers over libcst nodes that the analysis and the rules share."""

from __future__ import annotations

import typing as tp

import libcst as cst


def descendants(node: cst.CSTNode) -> tp.Iterator[cst.CSTNode]:
  """Every node below `node`, depth first: what the analysis and the rules search when planning a rewrite.

  A stack rather than recursion: each node costs the same at any depth (nested generators pass
  each node up through one frame per level) and deep nesting does not reach the recursion limit.
  """
  stack = list(reversed(node.children))
  while stack:
    child = stack.pop()
    yield child
    stack.extend(reversed(child.children))
