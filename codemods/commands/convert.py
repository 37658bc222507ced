"""`linen2nnx convert SRC DST`: an orbax checkpoint from the Linen layout to the NNX one, or back."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing as tp

from codemods.ports import model_arguments

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
  parser = subparsers.add_parser(
      'convert',
      help='convert an orbax checkpoint between the Linen and NNX layouts',
      description=(
          'Read the orbax checkpoint SRC written for the Linen model and write DST for its NNX '
          'port (restorable with nnx.eval_shape + orbax restore, as the flax guide does, on any backend '
          'and topology: no device is recorded in it), or the reverse with --to linen; with --train-state, a whole flax TrainState checkpoint and '
          'nnx.state((model, optimizer)). Both models are built abstractly (no weights) to derive the '
          'leaf mapping and check every leaf before anything is written. Arrays are converted a '
          'few at a time; DST appears only when complete, and staging folders that killed runs '
          'left beside it are removed. Exit 0 on success, 1 when the checkpoint does not fit the '
          'models, 2 on usage errors (including inputs the Linen model fails on, a SRC that '
          'is not a readable orbax checkpoint, and a DST that exists or is inside SRC, checked first).'
      ),
      epilog=(
          'With --migrate-report, the NNX class is constructed from its record (sizes measured on '
          'the Linen model) and its child names pair the layers; a mapping that disagrees with the '
          'record, or a call order that would pair the layers otherwise, writes nothing.'
      ),
  )
  parser.add_argument('src', metavar='SRC', help='the checkpoint to read')
  parser.add_argument('dst', metavar='DST', help='the checkpoint to write (must not exist, nor be inside SRC)')
  parser.add_argument('--linen', metavar='REF', help='the Linen class, path/to/file.py:Class (or use --examples)')
  parser.add_argument('--nnx', metavar='REF', help='the NNX class, path/to/file.py:Class (required)')
  parser.add_argument('--to', choices=('nnx', 'linen'), default='nnx', help='the layout to write (default nnx)')
  parser.add_argument(
      '--linen-collection', metavar='NAME',
      help="the Linen side holds one collection's tree without its name (e.g. params of a TrainState)",
  )
  parser.add_argument(
      '--train-state', action='store_true',
      help=(
          'the Linen side is a whole flax TrainState (step, params, opt_state, and one field per other '
          'collection of the Linen model, e.g. batch_stats); the NNX side is nnx.state((model, optimizer)) '
          'of an nnx.Optimizer(model, tx, wrt=nnx.Param)'
      ),
  )
  parser.add_argument(
      '--optimizer', metavar='REF',
      help=(
          "the TrainState's optax transform, path/to/file.py:NAME: a GradientTransformation or a function "
          'of no arguments returning one. With --train-state, the optimizer state is checked against it; '
          '--to linen needs it to lay the optax state out as TrainState.create does'
      ),
  )
  parser.add_argument('--mapping', metavar='FILE.json', help='use this leaf mapping instead of deriving one')
  parser.add_argument('--write-mapping', metavar='FILE.json', help='write the mapping used, for review')
  parser.add_argument('--allow-lossy', action='store_true', help='convert even if a non-zero leaf has no NNX place')
  model_arguments.add_model_arguments(parser)
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  try:
    _check_paths(args)
  except ValueError as error:
    print(f'linen2nnx convert: {error}', file=sys.stderr)
    return EXIT_USAGE
  from flax import nnx

  from codemods.commands import verify
  from codemods.ports import migrate_report
  from codemods.ports import model_refs
  from nnx_bridge import checkpoint
  from nnx_bridge import derive
  from nnx_bridge.errors import BridgeError
  from nnx_bridge.errors import UnreadableCheckpointError
  from nnx_bridge.treemap import TreeMapping

  if not isinstance(sys.unraisablehook, _DropAbandonedReadReports):
    sys.unraisablehook = _DropAbandonedReadReports(sys.unraisablehook)
  try:
    if not args.nnx:
      raise model_refs.UsageError('name the NNX class: --nnx path/to/file.py:Class')
    if args.train_state and args.linen_collection:
      raise model_refs.UsageError('--train-state and --linen-collection describe different checkpoints; give one')
    if args.optimizer and not args.train_state:
      raise model_refs.UsageError('--optimizer is the optax transform of a TrainState: add --train-state')
    if args.train_state and args.to == 'linen' and not args.optimizer:
      raise model_refs.UsageError(
          '--train-state --to linen needs --optimizer path/to/file.py:NAME, the optax transform the '
          'TrainState was created with, to lay out its opt_state'
      )
    tx = _load_optimizer(args.optimizer) if args.optimizer else None
    leftovers = checkpoint.clear_staging(args.dst)
    example = model_refs.build_example(args, args.linen)
    eval_module, eval_kwargs, linen_abstract = verify.abstract_linen(example, args.examples)
    nnx_model, _, port = model_refs.build_nnx(args, args.nnx, example, abstract=True)
    mapping = TreeMapping.load(args.mapping) if args.mapping else None
  except (model_refs.UsageError, OSError, ValueError) as error:  # ConversionInProgressError is an OSError
    print(f'linen2nnx convert: {error}', file=sys.stderr)
    return EXIT_USAGE
  for path in leftovers.removed:
    print(f'linen2nnx convert: removed {path}, left by a conversion that was killed', file=sys.stderr)
  for path in leftovers.kept:
    print(f'linen2nnx convert: note: {path} ({_megabytes(path)}) was left by an earlier conversion into '
          f'{args.dst} that cannot be checked from here; delete it unless that conversion is still running',
          file=sys.stderr)
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
    if args.train_state:
      written = _convert_train_state(args, mapping, nnx_model, linen_abstract, tx)
    elif args.to == 'nnx':
      checkpoint.linen_to_nnx_checkpoint(
          # Rng state has no Linen source and is never invented: restore the checkpoint into
          # nnx.state(model, nnx.Not(nnx.RngState)) of a model built with your own nnx.Rngs.
          args.src, args.dst, mapping, nnx_abstract_state=nnx.state(nnx_model, nnx.Not(nnx.RngState)),
          linen_collection=args.linen_collection, allow_lossy=args.allow_lossy,
      )
    else:
      checkpoint.nnx_to_linen_checkpoint(
          args.src, args.dst, mapping, linen_abstract_variables=linen_abstract,
          linen_collection=args.linen_collection,
      )
  except (FileExistsError, FileNotFoundError, UnreadableCheckpointError) as error:
    print(f'linen2nnx convert: {error}', file=sys.stderr)
    return EXIT_USAGE
  except BridgeError as error:
    print(f'linen2nnx convert: nothing written: {error}', file=sys.stderr)
    return EXIT_MISMATCH
  except OSError as error:  # a read or write that failed although the paths were checked: a full disk, a folder gone
    print(f'linen2nnx convert: {error.filename or args.dst}: {error.strerror or error}; check the path and run again',
          file=sys.stderr)
    return EXIT_USAGE
  if args.train_state:
    print(f'wrote {args.dst} ({written} leaves: the model, the optimizer state and the step)')
  else:
    print(f'wrote {args.dst} ({len(mapping.rules)} {args.to.upper() if args.to == "nnx" else "Linen"} leaves)')
  return EXIT_OK


def _check_paths(args: argparse.Namespace) -> None:
  """Raises ValueError, saying what is wrong and how to fix it, when SRC, DST or --write-mapping cannot be used.

  Checked before anything else (the models are built from the user's code, which takes a while) and before
  anything is written: SRC exists, DST is neither SRC nor inside it (a conversion would write into the checkpoint
  it reads) nor holds it, and each output can be written where it is asked for.
  """
  from codemods import files

  if not os.path.exists(args.src):
    raise ValueError(f'SRC {args.src}: no such folder; give the folder an orbax checkpointer saved')
  src, dst = os.path.realpath(args.src), os.path.realpath(args.dst)
  if dst == src:
    raise ValueError(f'DST {args.dst} is SRC; convert into a new path')
  if os.path.commonpath([src, dst]) == src:
    raise ValueError(f'DST {args.dst} is inside SRC {args.src}; convert into a new path outside SRC')
  if os.path.commonpath([src, dst]) == dst:
    raise ValueError(f'SRC {args.src} is inside DST {args.dst}; convert into a new path outside SRC')
  files.check_output('DST', args.dst, new_folder=True)
  files.check_output('--write-mapping', args.write_mapping)


def _load_optimizer(ref: str) -> tp.Any:
  """The optax GradientTransformation `--optimizer` names, calling a function of no arguments to get it."""
  import optax

  from codemods.ports import model_refs

  tx = model_refs.load_object(ref)
  if not isinstance(tx, optax.GradientTransformation) and callable(tx):
    try:
      tx = tx()
    except Exception as error:  # the user's function: any failure is theirs to fix, in one line
      raise model_refs.UsageError(
          f'{ref}: calling it with no arguments failed ({type(error).__name__}: {error})') from None
  if not isinstance(tx, optax.GradientTransformation):
    raise model_refs.UsageError(f'{ref} is a {type(tx).__name__}, not an optax GradientTransformation')
  return tx


def _convert_train_state(args: argparse.Namespace, mapping: tp.Any, nnx_model: tp.Any, linen_abstract: tp.Any,
                         tx: tp.Any) -> int:
  """`--train-state`: a TrainState checkpoint to nnx.state((model, optimizer)), or back; the leaves written."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from flax.core import meta

  from nnx_bridge import train_state_checkpoint

  if args.to == 'nnx':
    optimizer = None if tx is None else nnx.state(
        nnx.eval_shape(lambda model: nnx.Optimizer(model, tx, wrt=nnx.Param), nnx_model))
    return train_state_checkpoint.train_state_to_nnx_checkpoint(
        args.src, args.dst, mapping, model_abstract_state=nnx.state(nnx_model, nnx.Not(nnx.RngState)),
        optimizer_abstract_state=optimizer, allow_lossy=args.allow_lossy,
    )
  variables = dict(meta.unbox(linen_abstract))
  train_state_like = {  # what TrainState.create(params=..., tx=tx, <collection>=...) saves
      **variables,
      'step': jax.ShapeDtypeStruct((), jnp.int32),
      'opt_state': jax.eval_shape(tx.init, variables['params']),
  }
  return train_state_checkpoint.nnx_to_train_state_checkpoint(
      args.src, args.dst, mapping, train_state_like=train_state_like,
  )


def _megabytes(path: str) -> str:
  """The size of the files under `path`, as '215 MB'."""
  total = sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)
  return f'{total / 1e6:.0f} MB'


@dataclasses.dataclass(frozen=True)
class _DropAbandonedReadReports:
  """An unraisable-exception hook that keeps a damaged checkpoint's error to its one line.

  When one read of a batch fails, orbax closes its event loop at once, abandoning the other
  reads of the batch: each is reported later, with its traceback, as an unraisable exception,
  `RuntimeError: Event loop is closed` from a tensorstore thread or the failure of an orbax
  coroutine that was never finished. Those reports are dropped; every other one goes to the
  hook that was installed before.
  """

  previous: tp.Callable[[tp.Any], object]

  def __call__(self, unraisable: tp.Any) -> None:
    value, code = unraisable.exc_value, getattr(unraisable.object, 'cr_code', None)
    closed_loop = type(value) is RuntimeError and str(value) == 'Event loop is closed'
    orbax_coroutine = code is not None and f'{os.sep}orbax{os.sep}' in code.co_filename
    if not (closed_loop or orbax_coroutine):
      self.previous(unraisable)
