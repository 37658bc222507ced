"""The command-line options that name a Linen model and its NNX port, read by `model_refs.build_example` /
`build_nnx`. Kept apart from `model_refs` (which imports jax and flax) so that building the parser does not
import them.
"""

from __future__ import annotations

import argparse


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
  """The options that name and build a Linen model and its NNX port."""
  parser.add_argument('--linen-kwargs', metavar='JSON', help='Linen constructor keyword arguments')
  parser.add_argument('--nnx-kwargs', metavar='JSON', help='NNX constructor keyword arguments (added to the derived ones)')
  parser.add_argument(
      '--input', action='append', default=[], metavar='SPEC',
      help='an input as [name=]dtype[shape][:max], e.g. x=float32[2,784] or int32[2,16]:1000; repeat for more',
  )
  parser.add_argument('--examples', metavar='FILE.py', help='a Python file of example functions returning (linen_module, inputs)')
  parser.add_argument('--example', metavar='NAME', help='the function of --examples to call')
  parser.add_argument('--seed', type=int, default=0, help='seed of the random inputs (default 0)')
  parser.add_argument('--init-seed', type=int, default=0, help='seed of the Linen init and of nnx.Rngs (default 0)')
  parser.add_argument(
      '--migrate-report', metavar='FILE.json',
      help=(
          'the --report-json of the linen2nnx migrate run that wrote NNX: its record of the NNX class '
          'gives the constructor arguments (sizes measured on the Linen model) and the Linen child '
          'name of each NNX attribute, which pair the layers of a derived mapping and must agree with it'
      ),
  )
