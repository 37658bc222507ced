"""`linen2nnx layers`: show the layer table; with --verify, check every row numerically."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
  parser = subparsers.add_parser(
      'layers',
      help='show the Linen -> NNX layer table',
      description='Show the Linen -> NNX layer table (markdown). With --verify, build each Linen '
      'layer and its NNX counterpart on the installed flax, copy the weights through the '
      "table's parameter transforms and compare outputs; exit 1 if a row does not hold.",
  )
  parser.add_argument('--verify', action='store_true', help='check every row numerically')
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  from nnx_bridge import layer_table

  if not args.verify:
    print(layer_table.render_markdown())
    return 0
  import flax

  from nnx_bridge import layer_check

  checks = layer_check.check_all()
  failed = 0
  for check in checks:
    status = 'ok' if check.passed else 'FAILED'
    kind = 'exact' if check.expected_exact else 'inexact (documented)'
    print(f'{status:6s} {check.linen:45s} -> {check.nnx or "-":32s} {kind:21s} max|diff|={check.max_abs_diff:.2e}')
    if not check.passed:
      failed += 1
      print(f'       {check.detail}')
  print(f'{len(checks) - failed} of {len(checks)} rows hold on flax {flax.__version__}')
  return 1 if failed else 0
