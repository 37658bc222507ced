"""`linen2nnx verify LINEN NNX`: is the NNX port the same model as the Linen one?"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import typing as tp

from codemods.ports import model_arguments
from nnx_bridge.precision import NOISE_FACTOR
from nnx_bridge.precision import PRECISIONS

if tp.TYPE_CHECKING:
  from codemods.ports import migrate_report
  from codemods.ports import model_refs

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
  parser = subparsers.add_parser(
      'verify',
      help='check that an NNX port computes what its Linen original computes',
      description=(
          'Initialize the Linen model, copy its variables into the NNX port through a derived '
          '(or given) leaf mapping, and compare, leaf by leaf: the eval-mode outputs, the '
          'gradient of a scalar loss for every parameter, the outputs and updated state after '
          'one train-mode call (dropout off on both sides), and the partition specs, at one matmul precision '
          '(--precision). Exit 0 when everything is within tolerance, 1 when not, 2 on usage errors (including '
          'inputs the Linen model itself fails on).'
      ),
      epilog=(
          'LINEN and NNX are path/to/file.py:ClassName or package.module:ClassName. The NNX '
          'constructor gets --nnx-kwargs, then Linen fields of the same name, rngs, and input '
          'sizes (in_features, din, ...) from the first input; the report says which it used. '
          'With --migrate-report, the NNX class\'s record says which arguments are Linen fields '
          'and which are sizes, and the sizes are measured on the inputs of the Linen submodules '
          'they are for; its child names pair the layers, and the mapping must agree with them. '
          'Models built from Python objects (configs, ModuleDefs) come from --examples FILE.py '
          '--example NAME, a function returning (linen_module, inputs); LINEN may then be "-".'
      ),
  )
  parser.add_argument('linen', metavar='LINEN', help='the Linen class, or - with --examples')
  parser.add_argument('nnx', metavar='NNX', help='the NNX class')
  model_arguments.add_model_arguments(parser)
  parser.add_argument('--atol', type=float, default=1e-5, help='absolute tolerance (default 1e-5)')
  parser.add_argument('--rtol', type=float, default=1e-5, help='relative tolerance (default 1e-5)')
  parser.add_argument('--no-train-step', action='store_true', help='skip the train-mode call')
  parser.add_argument(
      '--precision', choices=PRECISIONS, default=PRECISIONS[0],
      help='the matmul precision both models run at (default highest: float32 products in full float32 on every '
           "backend, so the tolerances mean the same on all). default: the backend's own (bfloat16 passes on a TPU); "
           f'the Linen model also runs at highest, and each leaf may differ by {NOISE_FACTOR:g}x its own difference '
           'between the two on top of --atol and --rtol. The report names the backend and the precision',
  )
  parser.add_argument(
      '--rng-streams', metavar='NAME,...', default='',
      help="rng streams the Linen model draws from besides dropout (self.make_rng('noise')): each gets "
           'a key on the Linen side; the NNX port draws from its own Rngs, so outputs agree only where '
           'those draws do not change them',
  )
  parser.add_argument('--mapping', metavar='FILE.json', help='use this leaf mapping instead of deriving one')
  parser.add_argument('--write-mapping', metavar='FILE.json', help='write the mapping used, for review')
  parser.add_argument(
      '--logical-axis-rules', metavar='JSON',
      help='logical axis rules, e.g. [["embed", null], ["mlp", "model"]]: compare specs as mesh axes',
  )
  parser.add_argument('--json', action='store_true', help='print the report as JSON')
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  import flax.errors

  from codemods import files
  from codemods.ports import model_refs
  from nnx_bridge.errors import BridgeError
  from nnx_bridge.treemap import TreeMapping

  try:
    files.check_output('--write-mapping', args.write_mapping)  # before the models are built and compared
    example = model_refs.build_example(args, None if args.linen == '-' else args.linen)
    abstract_linen(example, args.examples)
    nnx_model, origins, port = model_refs.build_nnx(args, args.nnx, example)
    mapping = TreeMapping.load(args.mapping) if args.mapping else None
    rules = None
    if args.logical_axis_rules:
      rules = [tuple(rule) for rule in json.loads(args.logical_axis_rules)]
  except (model_refs.UsageError, OSError, ValueError) as error:
    print(f'linen2nnx verify: {error}', file=sys.stderr)
    return EXIT_USAGE

  try:
    report, mapping = check_port(
        example, nnx_model, port, mapping=mapping, init_seed=args.init_seed, atol=args.atol, rtol=args.rtol,
        train=not args.no_train_step, logical_axis_rules=rules,
        rng_streams=[s for s in args.rng_streams.split(',') if s], precision=args.precision,
    )
  except BridgeError as error:  # the port's variables do not even line up with the Linen ones
    print(f'linen2nnx verify: the NNX port does not match: {error}', file=sys.stderr)
    return EXIT_MISMATCH
  except flax.errors.InvalidRngError as error:
    print(f'linen2nnx verify: {_rng_stream_message(error)}', file=sys.stderr)
    return EXIT_USAGE
  if args.write_mapping:
    try:
      mapping.save(args.write_mapping)
    except OSError as error:  # the path was checked before the run: the folder went away or filled up since
      print(f'linen2nnx verify: --write-mapping {args.write_mapping}: the mapping could not be written '
            f'({error.strerror or error}); give a path in a folder you can write to', file=sys.stderr)
      return EXIT_USAGE
  if args.json:
    print(json.dumps({**report.to_dict(), 'nnx_constructor': origins}, indent=2))
  else:
    print('NNX constructor arguments:')
    print('\n'.join(f'  {line}' for line in origins))
    print(report.to_text())
  return EXIT_OK if report.ok else EXIT_MISMATCH


def check_port(example: model_refs.Example, nnx_model: tp.Any, port: migrate_report.Port | None, *,
               mapping: tp.Any = None, init_seed: int = 0, **compare_options: tp.Any) -> tuple[tp.Any, tp.Any]:
  """Initialises the Linen model in eval mode and compares the port with it: (ParityReport, mapping used).

  The mapping is `mapping`, else the one the migrate record pairs (`port`), else a derived one.
  """
  import jax

  from codemods.ports import migrate_report
  from nnx_bridge import derive
  from nnx_bridge import modes
  from nnx_bridge import parity

  # Initialized in eval mode, as Linen code usually is (`init(key, x, train=False)`).
  eval_module, eval_kwargs = modes.for_mode(
      example.linen, None, modes.mode_arguments_of(example.linen), **modes.EVAL
  )
  variables = eval_module.init(jax.random.key(init_seed), *example.args, **eval_kwargs, **example.kwargs)
  if mapping is None and port is not None:
    mapping, by_order = port.mapping(eval_module, nnx_model, *example.args, **eval_kwargs, **example.kwargs)
    if by_order:  # the outputs decide which pairing is right
      print(f'linen2nnx verify: note: {migrate_report.call_order_note(by_order)}', file=sys.stderr)
  elif mapping is None:
    mapping = derive.derive_mapping(eval_module, nnx_model, *example.args, **eval_kwargs, **example.kwargs)
  report = parity.compare(example.linen, variables, nnx_model, *example.args, mapping=mapping,
                          **compare_options, **example.kwargs)
  return report, mapping


def abstract_linen(
    example: model_refs.Example, examples_file: str | None
) -> tuple[tp.Any, dict[str, tp.Any], tp.Any]:
  """The Linen model in eval mode, its mode keyword arguments, and its variables as shapes (no arrays).

  Run before anything is built from the inputs: the Linen model is the reference, so when it
  fails on them (an unknown input name, a wrong rank or size) the command line is wrong, not the
  port, and that is a one-line model_refs.UsageError (exit 2), never a traceback or exit 1.
  `examples_file` is where the inputs came from, if not from --input.
  """
  import flax.errors
  import jax

  from codemods.ports import model_refs
  from nnx_bridge import modes

  eval_module, eval_kwargs = modes.for_mode(
      example.linen, None, modes.mode_arguments_of(example.linen), **modes.EVAL
  )
  try:
    variables = jax.eval_shape(
        lambda: eval_module.init(jax.random.key(0), *example.args, **eval_kwargs, **example.kwargs)
    )
  except flax.errors.InvalidRngError as error:
    raise model_refs.UsageError(_rng_stream_message(error)) from None
  except Exception as error:  # whatever the user's model raises on inputs it does not take
    raise model_refs.UsageError(_linen_failure(example, error, examples_file, eval_kwargs)) from None
  return eval_module, eval_kwargs, variables


def _rng_stream_message(error: Exception) -> str:
  return (f'the Linen model draws from an rng stream it was not given ({str(error).splitlines()[0]}); '
          'name the stream with --rng-streams')


def _linen_failure(
    example: model_refs.Example, error: Exception, examples_file: str | None, mode_kwargs: dict[str, tp.Any]
) -> str:
  """One line: the Linen class, the inputs it failed on, the error, the line of the user's code that
  raised it, and what `__call__` takes besides the mode arguments (`train=False`) the commands pass."""
  from codemods.examples import where_raised
  from nnx_bridge.state_check import describe

  name = type(example.linen).__name__
  shown = lambda value: describe(value) if hasattr(value, 'shape') else type(value).__name__
  inputs = [shown(value) for value in example.args]
  inputs += [f'{key}={shown(value)}' for key, value in example.kwargs.items()]
  reason = (str(error).strip().splitlines() or [''])[0]
  try:
    signature = inspect.signature(type(example.linen).__call__)
    takes = ', '.join(param for param in list(signature.parameters)[1:] if param not in mode_kwargs)
  except (TypeError, ValueError):
    takes = '...'
  fix = (f'fix the inputs {examples_file} returns' if examples_file
         else f'give --input the names, ranks and sizes {name}.__call__({takes}) takes')
  at = where_raised(error)
  return (f'the Linen model {name} fails on the inputs {", ".join(inputs)}: {type(error).__name__}: '
          f'{reason}{f" (at {at})" if at else ""}; {fix}')
