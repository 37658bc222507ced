"""The `linen2nnx` command line: argument parsing only, the work lives in the libraries."""

from __future__ import annotations

import argparse
import sys
import typing as tp

import nnx_bridge


def _layers(args: argparse.Namespace) -> int:
  """Prints the layer table; with --verify, checks every row on the installed flax."""
  from nnx_bridge import layer_table

  if not args.verify:
    print(layer_table.render_markdown())
    return 0
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
  print(f'{len(checks) - failed} of {len(checks)} rows hold on flax {_flax_version()}')
  return 1 if failed else 0


def _flax_version() -> str:
  import flax

  return flax.__version__


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='linen2nnx',
      description='Linen-to-NNX migration and interop toolkit for Flax.',
  )
  parser.add_argument('--version', action='version', version=f'%(prog)s {nnx_bridge.__version__}')
  commands = parser.add_subparsers(dest='command', metavar='COMMAND')
  layers = commands.add_parser(
      'layers',
      help='show the Linen -> NNX layer table',
      description='Show the Linen -> NNX layer table (markdown). With --verify, build each Linen '
      'layer and its NNX counterpart on the installed flax, copy the weights through the '
      "table's parameter transforms and compare outputs; exit 1 if a row does not hold.",
  )
  layers.add_argument('--verify', action='store_true', help='check every row numerically')
  layers.set_defaults(run=_layers)
  return parser


def main(argv: tp.Sequence[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command is None:
    parser.print_help()
    return 0
  return args.run(args)


if __name__ == '__main__':
  sys.exit(main())
