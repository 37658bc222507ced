"""The `linen2nnx` command line: argument parsing only; each subcommand lives in `commands/`."""

from __future__ import annotations

import argparse
import os
import sys
import typing as tp

from codemods.commands import convert
from codemods.commands import demo
from codemods.commands import layers
from codemods.commands import migrate
from codemods.commands import verify
from nnx_bridge.distribution import package_version

COMMANDS = (migrate, verify, convert, layers, demo)
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141  # as a shell reports SIGINT and SIGPIPE


class CommandParser(argparse.ArgumentParser):
  """A subcommand's parser: an argument it does not know is its own usage error (exit 2).

  argparse hands a subcommand's unknown arguments up to the top-level parser, whose error shows the
  top-level usage (`linen2nnx [-h] [--version] COMMAND ...`) for `linen2nnx migrate --wirte`; the
  subcommand's usage is the one that says what it takes.
  """

  def parse_known_args(self, args: tp.Sequence[str] | None = None,
                       namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
    namespace, unknown = super().parse_known_args(args, namespace)
    if unknown:
      self.error(f'unrecognized arguments: {" ".join(unknown)}')
    return namespace, unknown


class _Version(argparse.Action):
  """`--version`: the version read only when asked for (importlib.metadata takes a while to import)."""

  def __init__(self, option_strings: tp.Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
    super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

  def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: tp.Any,
               option_string: str | None = None) -> None:
    print(f'{parser.prog} {package_version()}')
    parser.exit()


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='linen2nnx',
      description='Linen-to-NNX migration and interop toolkit for Flax.',
  )
  parser.add_argument('--version', action=_Version, help="show program's version number and exit")
  subparsers = parser.add_subparsers(dest='command', metavar='COMMAND', parser_class=CommandParser)
  for command in COMMANDS:
    command.add_parser(subparsers)
  return parser


def main(argv: tp.Sequence[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command is None:
    parser.print_help()
    return 0
  try:
    return args.run(args)
  except KeyboardInterrupt:
    print(f'linen2nnx {args.command}: interrupted', file=sys.stderr)
    return EXIT_INTERRUPTED
  except BrokenPipeError:  # `linen2nnx migrate src | head`: the reader has gone, as a SIGPIPE would end us
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when stdout is flushed at exit
    return EXIT_BROKEN_PIPE


if __name__ == '__main__':
  sys.exit(main())
