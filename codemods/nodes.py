"""Small helpers over libcst nodes that the analysis and the rules share."""

from __future__ import annotations

import typing as tp

import libcst as cst


def descendants(node: cst.CSTNode) -> tp.Iterator[cst.CSTNode]:
  """Every node below `node`, depth first: what the analysis and the rules search when planning a rewrite."""
  for child in node.children:
    yield child
    yield from descendants(child)
