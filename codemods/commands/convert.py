"""`linen2nnx convert SRC DST`: an orbax checkpoint from the Linen layout to the NNX one, or back."""

from __future__ import annotations

import argparse
import sys

from codemods.ports import model_arguments

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
  parser = subparsers.add_parser(
      'convert',
      help='convert an orbax checkpoint between the Linen and NNX layouts',
      description=(
          'Read the orbax checkpoint SRC written for the Linen model and write DST for its NNX '
          'port (restorable with nnx.eval_shape + orbax restore, as the flax guide does), or the '
          'reverse with --to linen. Both models are built abstractly (no weights) to derive the '
          'leaf mapping and check every leaf before anything is written. Arrays are converted a '
          'few at a time; DST appears only when complete. Exit 0 on success, 1 when the '
          'checkpoint does not fit, 2 on usage errors.'
      ),
      epilog=(
          'With --migrate-report, the NNX class is constructed from its record (sizes measured on '
          'the Linen model) and its child names pair the layers; a mapping that disagrees with the '
          'record, or a call order that would pair the layers otherwise, writes nothing.'
      ),
  )
  parser.add_argument('src', metavar='SRC', help='the checkpoint to read')
  parser.add_argument('dst', metavar='DST', help='the checkpoint to write (must not exist)')
  parser.add_argument('--linen', metavar='REF', help='the Linen class, path/to/file.py:Class (or use --examples)')
  parser.add_argument('--nnx', metavar='REF', required=True, help='the NNX class, path/to/file.py:Class')
  parser.add_argument('--to', choices=('nnx', 'linen'), default='nnx', help='the layout to write (default nnx)')
  parser.add_argument(
      '--linen-collection', metavar='NAME',
      help="the Linen side holds one collection's tree without its name (e.g. params of a TrainState)",
  )
  parser.add_argument('--mapping', metavar='FILE.json', help='use this leaf mapping instead of deriving one')
  parser.add_argument('--write-mapping', metavar='FILE.json', help='write the mapping used, for review')
  parser.add_argument('--allow-lossy', action='store_true', help='convert even if a non-zero leaf has no NNX place')
  model_arguments.add_model_arguments(parser)
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  import jax
  from flax import nnx

  from codemods.ports import migrate_report
  from codemods.ports import model_refs
  from nnx_bridge import checkpoint
  from nnx_bridge import derive
  from nnx_bridge import modes
  from nnx_bridge.errors import BridgeError
  from nnx_bridge.treemap import TreeMapping

  try:
    example = model_refs.build_example(args, args.linen)
    nnx_model, _, port = model_refs.build_nnx(args, args.nnx, example, abstract=True)
    mapping = TreeMapping.load(args.mapping) if args.mapping else None
  except (model_refs.UsageError, OSError, ValueError) as error:
    print(f'linen2nnx convert: {error}', file=sys.stderr)
    return EXIT_USAGE
  eval_module, eval_kwargs = modes.for_mode(
      example.linen, None, modes.mode_arguments_of(example.linen), **modes.EVAL
  )
  try:
    if mapping is None and port is not None:
      mapping, by_order = port.mapping(eval_module, nnx_model, *example.args, **eval_kwargs, **example.kwargs)
      if by_order:  # no outputs are compared here to say which pairing is right
        print(
            f'linen2nnx convert: nothing written: {migrate_report.call_order_note(by_order)}\n'
            'Run linen2nnx verify with --migrate-report and --write-mapping FILE.json: if the outputs '
            'match, pass that mapping here with --mapping FILE.json.',
            file=sys.stderr,
        )
        return EXIT_MISMATCH
    elif mapping is None:
      mapping = derive.derive_mapping(eval_module, nnx_model, *example.args, **eval_kwargs, **example.kwargs)
    if args.write_mapping:
      mapping.save(args.write_mapping)
    if args.to == 'nnx':
      checkpoint.linen_to_nnx_checkpoint(
          # Rng state has no Linen source and is never invented: restore the checkpoint into
          # nnx.state(model, nnx.Not(nnx.RngState)) of a model built with your own nnx.Rngs.
          args.src, args.dst, mapping, nnx_abstract_state=nnx.state(nnx_model, nnx.Not(nnx.RngState)),
          linen_collection=args.linen_collection, allow_lossy=args.allow_lossy,
      )
    else:
      linen_abstract = jax.eval_shape(
          lambda: eval_module.init(jax.random.key(0), *example.args, **eval_kwargs, **example.kwargs)
      )
      checkpoint.nnx_to_linen_checkpoint(
          args.src, args.dst, mapping, linen_abstract_variables=linen_abstract,
          linen_collection=args.linen_collection,
      )
  except (FileExistsError, FileNotFoundError) as error:
    print(f'linen2nnx convert: {error}', file=sys.stderr)
    return EXIT_USAGE
  except BridgeError as error:
    print(f'linen2nnx convert: nothing written: {error}', file=sys.stderr)
    return EXIT_MISMATCH
  print(f'wrote {args.dst} ({len(mapping.rules)} {args.to.upper() if args.to == "nnx" else "Linen"} leaves)')
  return EXIT_OK
