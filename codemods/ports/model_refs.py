"""Building the Linen and NNX models a command line names: class references, kwargs, inputs.

Shared by `verify`, `convert` and `demo`; the options it reads are `model_arguments.py`'s.
Importing user code happens here and only when a command names a class or an examples file.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import reprlib
import sys
import typing as tp

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from codemods.examples import where_raised
from codemods.ports import migrate_report


class UsageError(Exception):
  """A command-line argument that cannot be used; commands exit 2 on it."""


_INPUT = re.compile(r'^(?:(?P<name>[A-Za-z_]\w*)=)?(?P<dtype>\w+)\[(?P<shape>[\d,\s]*)\](?::(?P<max>\d+))?$')
_SIZE_NAMES = {
    'in_features', 'in_feature', 'din', 'd_in', 'in_dim', 'input_dim', 'input_size',
    'num_features', 'in_channels', 'features_in', 'in_size',
}
"""NNX constructor arguments that mean "the size of the input's last axis"."""


def load_object(ref: str) -> tp.Any:
  """`path/to/file.py:Name` or `package.module:Name` -> the object."""
  module_ref, sep, name = ref.rpartition(':')
  if not sep or not module_ref or not name:
    raise UsageError(f'{ref!r}: expected path/to/file.py:ClassName or package.module:ClassName')
  if module_ref.endswith('.py') or os.sep in module_ref:
    path = os.path.abspath(module_ref)
    if not os.path.isfile(path):
      raise UsageError(f'{module_ref}: no such file')
    module = _load_file(path)
  else:
    try:
      module = importlib.import_module(module_ref)
    except ImportError as error:
      raise UsageError(f'cannot import {module_ref}: {error}') from error
  try:
    return getattr(module, name)
  except AttributeError:
    raise UsageError(f'{module_ref} has no {name!r}') from None


USER_MODULE_PREFIX = '_linen2nnx_user_'
"""Files named by path are imported under this prefix, so a migrated copy never shadows the original."""


def _load_file(path: str) -> tp.Any:
  """Imports a file by path. A file of a package (its folder has `__init__.py`) is imported within its
  package, loaded under an alias, so its relative imports work and a Linen copy of the same package
  can be imported beside it; a plain file gets its folder on sys.path, for its sibling modules."""
  parts, folder = [os.path.splitext(os.path.basename(path))[0]], os.path.dirname(path)
  while os.path.isfile(os.path.join(folder, '__init__.py')):
    parts.insert(0, os.path.basename(folder))
    folder = os.path.dirname(folder)
  digest = hashlib.sha1(os.path.join(folder, parts[0]).encode()).hexdigest()[:12]
  if len(parts) == 1:
    sys.path.insert(0, folder)
    name = f'{USER_MODULE_PREFIX}{digest}'
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    _run_module(spec, module, path)
    return module
  alias = f'{USER_MODULE_PREFIX}{parts[0]}_{digest}'
  if alias not in sys.modules:
    root = os.path.join(folder, parts[0])
    spec = importlib.util.spec_from_file_location(alias, os.path.join(root, '__init__.py'),
                                                  submodule_search_locations=[root])
    package = importlib.util.module_from_spec(spec)
    sys.modules[alias] = package
    _run_module(spec, package, path)
  inner = [p for p in parts[1:] if p != '__init__']
  try:
    return importlib.import_module('.'.join([alias, *inner]))
  except Exception as error:
    raise UsageError(_import_failure(path, error)) from None


def _run_module(spec: importlib.machinery.ModuleSpec, module: tp.Any, path: str) -> None:
  """Runs a user file; one that does not parse or import is a UsageError naming the file and the line."""
  try:
    spec.loader.exec_module(module)
  except Exception as error:
    raise UsageError(_import_failure(path, error)) from None


def _import_failure(path: str, error: Exception) -> str:
  if isinstance(error, SyntaxError):
    return f'{path}: it cannot be imported: {type(error).__name__} at {error.filename}:{error.lineno}: {error.msg}'
  at = where_raised(error)
  return f'{path}: it cannot be imported: {type(error).__name__}: {error}' + (f' (at {at})' if at else '')


def parse_json_kwargs(text: str | None, what: str) -> dict[str, tp.Any]:
  if not text:
    return {}
  try:
    value = json.loads(text)
  except json.JSONDecodeError as error:
    raise UsageError(f'{what}: not JSON ({error})') from None
  if not isinstance(value, dict):
    raise UsageError(f'{what}: expected a JSON object of keyword arguments')
  return value


def parse_inputs(specs: tp.Sequence[str], seed: int) -> tuple[tuple[tp.Any, ...], dict[str, tp.Any]]:
  """`['x=float32[2,784]', 'int32[2,16]:100']` -> random positional and keyword inputs.

  Floats are standard normal; integers uniform in [0, max) (`:max`, default 2).
  """
  key = jax.random.key(seed)
  args, kwargs = [], {}
  for index, spec in enumerate(specs):
    match = _INPUT.match(spec.replace(' ', ''))
    if match is None:
      raise UsageError(f'--input {spec!r}: expected [name=]dtype[d0,d1,...][:max], e.g. x=float32[2,784]')
    try:
      dtype = jnp.dtype(match['dtype'])
    except TypeError:
      raise UsageError(f'--input {spec!r}: unknown dtype {match["dtype"]!r}; use a numpy dtype name such as float32, '
                       'bfloat16 or int32') from None
    shape = tuple(int(d) for d in match['shape'].split(',') if d)
    sub = jax.random.fold_in(key, index)
    if jnp.issubdtype(dtype, jnp.integer):
      value = jax.random.randint(sub, shape, 0, int(match['max'] or 2), dtype=dtype)
    elif jnp.issubdtype(dtype, jnp.floating):
      value = jax.random.normal(sub, shape, dtype)
    else:
      raise UsageError(f'--input {spec!r}: dtype {dtype} is neither integer nor floating')
    if match['name']:
      kwargs[match['name']] = value
    else:
      args.append(value)
  return tuple(args), kwargs


@dataclasses.dataclass(frozen=True)
class Example:
  """A Linen model and its inputs, from an examples file or from the command line."""

  linen: nn.Module
  args: tuple[tp.Any, ...]
  kwargs: dict[str, tp.Any]


def example_from_file(path: str, name: str | None) -> Example:
  """Calls one function of an examples file; it returns `(linen_module, inputs)`.

  `inputs` is a tuple of positional inputs or a dict of keyword inputs.
  """
  namespace_ref = f'{path}:{name}' if name else None
  if namespace_ref is None:
    raise UsageError('--examples needs --example NAME (the function to call)')
  function = load_object(namespace_ref)
  try:
    result = function()
  except Exception as error:
    at = where_raised(error)
    raise UsageError(f'{namespace_ref}() raised {type(error).__name__}: {error}' + (f' (at {at})' if at else '')) \
        from None
  if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)):
    raise UsageError(f'{namespace_ref} must return (linen_module, inputs)')
  module, inputs = result
  if isinstance(inputs, dict):
    return Example(module, (), dict(inputs))
  return Example(module, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,), {})


def nnx_constructor_kwargs(
    nnx_class: type,
    linen: nn.Module,
    inputs: tuple[tp.Any, ...],
    explicit: dict[str, tp.Any],
    seed: int,
    measured: tp.Mapping[str, tp.Callable[[], tuple[tp.Any, str]]] | None = None,
) -> tuple[dict[str, tp.Any], list[str]]:
  """Keyword arguments for the NNX class, and a line saying which value each got and where from.

  In order: `--nnx-kwargs`; a Linen field of the same name (the user gives the Linen
  constructor's arguments once); `rngs=nnx.Rngs(seed)`; a size `measured` on the Linen model
  (from a migrate report's record: value and how it was read), or without one an input size
  (`in_features`, `din`, ...) read off the first input's last axis. Anything else is a usage error.
  """
  parameters = inspect.signature(nnx_class.__init__).parameters
  fields = {f.name for f in dataclasses.fields(linen) if f.init} - {'parent', 'name'}
  kwargs, origins = {}, []
  for name, parameter in list(parameters.items())[1:]:
    if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
      continue
    if name in explicit:
      kwargs[name] = explicit[name]
      origins.append(f'{name}={reprlib.repr(kwargs[name])}: from --nnx-kwargs')
    elif name in fields:
      kwargs[name] = getattr(linen, name)
      origins.append(f'{name}={reprlib.repr(kwargs[name])}: the Linen field of the same name')
    elif name == 'rngs':
      kwargs[name] = nnx.Rngs(seed)
      origins.append(f'rngs: nnx.Rngs({seed})')
    elif measured is not None and name in measured:
      kwargs[name], how = measured[name]()
      shown = isinstance(kwargs[name], int) or isinstance(kwargs[name], tuple) and all(
          isinstance(size, int) for size in kwargs[name])  # a size, or one per element of a list
      origins.append(f'{name}={kwargs[name]}: {how}' if shown else f'{name}: {how}')
    elif measured is None and name in _SIZE_NAMES and inputs and hasattr(inputs[0], 'shape'):
      kwargs[name] = int(inputs[0].shape[-1])
      origins.append(f'{name}={kwargs[name]}: the first input\'s last axis (traced from the inputs)')
    elif parameter.default is parameter.empty:
      raise UsageError(
          f'{nnx_class.__name__}.__init__ needs {name!r}, which is not a Linen field, not an input '
          f'size, and not in --nnx-kwargs; pass it: --nnx-kwargs \'{{"{name}": ...}}\''
      )
  unknown = sorted(set(explicit) - set(parameters))
  if unknown:
    raise UsageError(f'--nnx-kwargs: {nnx_class.__name__}.__init__ takes no {unknown}')
  return kwargs, origins


def build_example(args: argparse.Namespace, linen_ref: str | None) -> Example:
  if args.examples:
    return example_from_file(args.examples, args.example)
  if not linen_ref:
    raise UsageError('name the Linen model (path/to/file.py:Class) or give --examples FILE --example NAME')
  linen_class = load_object(linen_ref)
  if not (isinstance(linen_class, type) and issubclass(linen_class, nn.Module)):
    raise UsageError(f'{linen_ref} is not a Linen Module class')
  try:
    module = linen_class(**parse_json_kwargs(args.linen_kwargs, '--linen-kwargs'))
  except TypeError as error:
    raise UsageError(f'{linen_ref}: {error}') from None
  inputs, kwargs = parse_inputs(args.input, args.seed)
  if not inputs and not kwargs:
    raise UsageError('give the model inputs: --input x=float32[2,784] (repeat for more)')
  return Example(module, inputs, kwargs)


def build_nnx(
    args: argparse.Namespace, nnx_ref: str, example: Example, *, abstract: bool = False
) -> tuple[nnx.Module, list[str], migrate_report.Port | None]:
  """The NNX port, built for real or (`abstract`) with `nnx.eval_shape`: no arrays allocated.

  Also where each constructor argument came from, and the `--migrate-report` record it was
  built from (None without the option).
  """
  nnx_class = load_object(nnx_ref)
  if not (isinstance(nnx_class, type) and issubclass(nnx_class, nnx.Module)):
    raise UsageError(f'{nnx_ref} is not an NNX Module class')
  port = None
  if args.migrate_report:
    port = migrate_report.load_port(args.migrate_report, nnx_class, example.linen, example.args, example.kwargs)
  kwargs, origins = nnx_constructor_kwargs(
      nnx_class, example.linen, (*example.args, *example.kwargs.values()),
      parse_json_kwargs(args.nnx_kwargs, '--nnx-kwargs'), args.init_seed,
      measured=None if port is None else port.measured_sizes(),
  )
  if not abstract:
    return nnx_class(**kwargs), origins, port
  rng_arguments = [k for k, v in kwargs.items() if isinstance(v, nnx.Rngs)]

  def build():
    # Fresh Rngs inside the trace, so no key is carried out of it.
    return nnx_class(**kwargs, **{k: nnx.Rngs(args.init_seed) for k in rng_arguments})

  for k in rng_arguments:
    del kwargs[k]
  return nnx.eval_shape(build), origins, port
