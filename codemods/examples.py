"""Example traces (`linen2nnx migrate --examples FILE.py`): layer input sizes read off real Linen calls.

The static rules derive most NNX input sizes from the code; the rest become constructor arguments.
An examples file gives, for any Linen model, a way to build it and example inputs: every public
top-level function of the file, called without arguments, returns `(module, inputs)` or `(module,
inputs, call_kwargs)`. Each model is initialised abstractly (`jax.eval_shape`, no weights, no
accelerator) while `nn.intercept_methods` records every submodule's class, fields and input shapes,
then again for variants of the root: each integer field (or dataclass config attribute) doubled and
each sequence field one longer, which the fit sees, and each integer plus one and each sequence two
longer, held out. For each layer inside a class of the user's code, the input size NNX needs (the
layer table says how it is read off the call) is matched against simple expressions of that class's
constructor fields and config attributes (`self.features`, `2 * self.dim`, `self.config.hidden`,
`self.num_filters * 2 ** (len(self.stage_sizes) - 1)`): the one expression every traced instance
agrees with, and that the held-out variants confirm, is what L2N002 writes; none, several, or one a
variant refutes leave the constructor argument, and the report says why. An example that cannot be
traced is reported (`ExampleSizes.failures`) and the others are used without it.

This is the only place where `linen2nnx migrate` imports and runs the user's code.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import reprlib
import runpy
import sys
import sysconfig
import traceback
import typing as tp

from flax import linen as nn

from codemods.example_sizes import Atoms
from codemods.example_sizes import ClassSizes
from codemods.example_sizes import ExampleFailure
from codemods.example_sizes import ExampleSizes
from codemods.example_sizes import resolve
from nnx_bridge import modes
from nnx_bridge.layer_table import find_layer_of_class
from nnx_bridge.linen_trace import trace_linen


class ExamplesError(ValueError):
  """An examples file that cannot be used at all (it does not import, or has no examples): the message names it."""


Example = tuple[str, nn.Module, tuple[tp.Any, ...], dict[str, tp.Any]]
"""(function name, Linen module, inputs, call keyword arguments)."""


@dataclasses.dataclass(frozen=True)
class _Instance:
  """One traced call of a class: its integer atoms and each layer child's NNX input sizes."""

  atoms: Atoms
  sizes: dict[tuple[str, str], int]


@dataclasses.dataclass(frozen=True)
class _Variant:
  """The root module with one field changed. The fit sees the variants that double an integer or lengthen a
  sequence by one; the held-out ones (an integer plus one, a sequence two longer) check what the fit found."""

  label: str  # `num_filters=9`, `stage_sizes=(1, 2, 2, 2)`
  build: tp.Callable[[], nn.Module]
  held_out: bool


_Traced = dict[tuple[str, str], list[_Instance]]
"""(source file, class qualname) -> the instances of the class in one or more traces."""


def load_examples(path: str) -> list[Example]:
  """Runs the examples file and calls its public functions; the first example that fails is an ExamplesError.

  The file's folder and the working directory are importable meanwhile (`from models import MLP`).
  """
  examples, failures = _load(path)
  if failures:
    raise ExamplesError(failures[0].describe())
  return examples


def _load(path: str) -> tuple[list[Example], list[ExampleFailure]]:
  roots = [os.path.dirname(os.path.abspath(path)), os.getcwd()]
  added = [root for root in dict.fromkeys(roots) if root not in sys.path]
  sys.path[:0] = added
  try:
    return _call_examples(path, _run_file(path))
  finally:
    for root in added:
      sys.path.remove(root)


def _run_file(path: str) -> dict[str, tp.Any]:
  """The examples file's namespace; a file that does not parse or import is an ExamplesError naming the line."""
  try:
    return runpy.run_path(path)
  except SyntaxError as error:  # in the file itself or in a module it imports
    where = f'{_shown(error.filename or path)}:{error.lineno}' if error.lineno else _shown(error.filename or path)
    raise ExamplesError(f'{path}: it cannot be imported: {type(error).__name__} at {where}: {error.msg}') from None
  except Exception as error:
    hint = ('; the folder of the examples file and the working directory are importable: run linen2nnx from the '
            'folder your models import from' if isinstance(error, ImportError) else '')
    at = where_raised(error)
    raise ExamplesError(f'{path}: it cannot be imported: {type(error).__name__}: {error}'
                        f'{f" (at {at})" if at else ""}{hint}') from None


def _call_examples(path: str, namespace: dict[str, tp.Any]) -> tuple[list[Example], list[ExampleFailure]]:
  examples, failures = [], []
  functions = [(name, function) for name, function in namespace.items()
               if not name.startswith('_') and inspect.isfunction(function) and function.__module__ == '<run_path>']
  if not functions:
    raise ExamplesError(f'{path}: no example: each public top-level function of the file is called without '
                        f'arguments and returns (module, inputs) or (module, inputs, call_kwargs)')
  for name, function in functions:
    try:
      made = function()
    except Exception as error:
      failures.append(ExampleFailure(path, name, f'{type(error).__name__}: {error}', where_raised(error)))
      continue
    if not (isinstance(made, tuple) and len(made) in (2, 3) and isinstance(made[0], nn.Module)
            and isinstance(made[1], (tuple, list)) and (len(made) == 2 or isinstance(made[2], tp.Mapping))):
      failures.append(ExampleFailure(path, name, f'it returned {_returned(made)}; an example returns (module, '
                                                 f'inputs) or (module, inputs, call_kwargs), inputs a tuple'))
      continue
    examples.append((name, made[0], tuple(made[1]), dict(made[2]) if len(made) == 3 else {}))
  return examples, failures


def _returned(made: tp.Any) -> str:
  if isinstance(made, tuple):
    return f'a tuple of {len(made)} ({", ".join(type(item).__name__ for item in made)})'
  return type(made).__name__


def trace_examples(path: str) -> ExampleSizes:
  """Traces every example of the file and its variants, and resolves each size the traces agree on.

  An example that cannot be traced (its function raises, returns something else, its Linen init fails) is in
  `failures` and the others are traced without it; a variant that cannot be built or traced is skipped.
  """
  examples, failures = _load(path)
  fits: _Traced = {}
  checks: dict[tuple[str, str], list[tuple[str, _Instance]]] = {}
  for name, module, inputs, kwargs in examples:
    try:
      traced = _collect(module, inputs, kwargs)
    except Exception as error:
      failures.append(ExampleFailure(path, name, f'the Linen init failed: {type(error).__name__}: {error}',
                                     where_raised(error)))
      continue
    for variant in _variants(module):
      try:
        seen = _collect(variant.build(), inputs, kwargs)
      except Exception:  # a field the code constrains (heads dividing a width): that variant says nothing
        continue
      for key, instances in seen.items():
        if variant.held_out:
          checks.setdefault(key, []).extend((f'{name}() with {variant.label}', i) for i in instances)
        else:
          traced.setdefault(key, []).extend(instances)
    for key, instances in traced.items():
      fits.setdefault(key, []).extend(instances)
  by_file: dict[str, dict[str, ClassSizes]] = {}
  for (file, name), seen in fits.items():
    keys = sorted(set().union(*(instance.sizes for instance in seen)))
    held_out = checks.get((file, name), [])
    by_file.setdefault(file, {})[name] = {
        key: resolve([(i.atoms, i.sizes[key]) for i in seen if key in i.sizes],
                     [(label, i.atoms, i.sizes[key]) for label, i in held_out if key in i.sizes])
        for key in keys
    }
  return ExampleSizes(by_file, tuple(failures))


def _collect(module: nn.Module, inputs: tuple[tp.Any, ...], kwargs: dict[str, tp.Any]) -> _Traced:
  """Traces one model: an instance for every module of a user class that holds table layers."""
  trace = trace_linen(module, inputs, kwargs, mode=modes.EVAL)
  classes, calls = trace.classes, trace.first_calls
  instances: _Traced = {}
  for path, cls in classes.items():
    source = _source_file(cls)
    call = calls.get((path, '__call__')) or next((c for (p, _), c in calls.items() if p == path), None)
    if source is None or call is None or find_layer_of_class(cls) is not None:
      continue
    sizes = {}
    for child_path, child_class in classes.items():
      row = find_layer_of_class(child_class)
      child_call = calls.get((child_path, '__call__'))
      if child_call is None or not child_path or child_path[:-1] != path:
        continue
      if row is None:  # a class of the user's: the last axis of each array it is called with (`input:0`)
        sizes.update(((child_path[-1], f'input:{i}'), shape[-1])
                     for i, shape in enumerate(child_call.args) if shape)
        continue
      shapes = child_call.shapes(row.call_args)
      for nnx_arg, size in row.derived:
        value = size.evaluate(child_call.fields, shapes)
        if isinstance(value, int):
          sizes[child_path[-1], nnx_arg] = value
    if sizes:
      constructor = {f.name for f in dataclasses.fields(cls) if f.init}
      atoms = _atoms({k: v for k, v in call.fields.items() if k in constructor})
      instances.setdefault((source, cls.__qualname__), []).append(_Instance(atoms, sizes))
  return instances


def _atoms(fields: dict[str, tp.Any]) -> Atoms:
  """`self.<field>` for the integer constructor fields, `len(self.<field>)` for the sequence ones,
  `self.<field>.<attr>` (and `len(...)`) for the attributes of config fields and of module fields
  (`self.embed.features` of a shared `nn.Embed`) whose NNX counterpart has the same attribute.

  Only constructor fields: one declared `field(init=False)` is set in `setup()`, which the converted
  `__init__` may not have run yet where a layer is built.
  """
  atoms = {}
  for name, value in fields.items():
    if name in ('parent', 'name'):
      continue
    if _is_int(value):
      atoms[f'self.{name}'] = value
      continue
    if _is_sequence(value):
      atoms[f'len(self.{name})'] = len(value)
      continue
    items = _module_items(value) if isinstance(value, nn.Module) else _config_items(value)
    for attr, inner in items:
      if attr.isidentifier() and _is_int(inner):
        atoms[f'self.{name}.{attr}'] = inner
      elif attr.isidentifier() and _is_sequence(inner):
        atoms[f'len(self.{name}.{attr})'] = len(inner)
  return atoms


def _config_items(value: tp.Any) -> list[tuple[str, tp.Any]]:
  """The attributes of a config object (a dataclass, a mapping such as ConfigDict, a namespace)."""
  if isinstance(value, nn.Module) or value is None or isinstance(value, (str, bytes, tuple, list)):
    return []
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value) if hasattr(value, f.name)]
  if isinstance(value, tp.Mapping) or hasattr(value, 'items') and callable(value.items):
    try:
      return [(str(k), v) for k, v in value.items()]
    except Exception:
      return []
  return list(vars(value).items()) if hasattr(value, '__dict__') and not callable(value) else []


def _module_items(module: nn.Module) -> list[tuple[str, tp.Any]]:
  """A module field's own constructor fields, less those its NNX layer names differently (`nn.Dense.features`)."""
  row = find_layer_of_class(type(module))
  renamed = {old for old, _ in row.arg_renames} if row is not None else set()
  return [(f.name, getattr(module, f.name)) for f in dataclasses.fields(module)
          if f.init and f.name not in ('parent', 'name') and f.name not in renamed]


def _is_int(value: tp.Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_sequence(value: tp.Any) -> bool:
  """A tuple or list field (`stage_sizes`), not a named tuple: its length can be a size's factor."""
  return isinstance(value, (tuple, list)) and not hasattr(value, '_fields')


def _variants(module: nn.Module) -> list[_Variant]:
  """The root module with one constructor field changed, or one attribute of a dataclass config field: each
  integer doubled (fit) and plus one (held out), each sequence one and two longer, repeating its last element."""
  variants = []
  for field in dataclasses.fields(module):
    if not field.init or field.name in ('parent', 'name'):
      continue
    value = getattr(module, field.name)
    for label, changed, held_out in _changes(field.name, value):
      variants.append(_Variant(label, functools.partial(module.clone, **{field.name: changed}), held_out))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
      for inner in dataclasses.fields(value):
        if not inner.init:
          continue
        for label, changed, held_out in _changes(inner.name, getattr(value, inner.name)):
          build = functools.partial(_clone_config, module, field.name, value, inner.name, changed)
          variants.append(_Variant(f'{field.name}.{label}', build, held_out))
  return variants


def _changes(name: str, value: tp.Any) -> list[tuple[str, tp.Any, bool]]:
  """(label, changed value, held out) for a field's value: integers and sequences only."""
  if _is_int(value):
    changed = [(2 * value, False)] if value else []
    return [(f'{name}={new}', new, held_out) for new, held_out in [*changed, (value + 1, True)]]
  if _is_sequence(value) and value:
    longer = [(type(value)([*value, *[value[-1]] * k]), k == 2) for k in (1, 2)]
    return [(f'{name}={reprlib.repr(new)}', new, held_out) for new, held_out in longer]
  return []


def _clone_config(module: nn.Module, field: str, config: tp.Any, attr: str, changed: tp.Any) -> nn.Module:
  return module.clone(**{field: dataclasses.replace(config, **{attr: changed})})


def where_raised(error: BaseException) -> str | None:
  """`file:line` of the innermost frame of the user's code (not Python's, an installed package's or this tool's)."""
  frames = [frame for frame in traceback.extract_tb(error.__traceback__) if _is_user_file(frame.filename)]
  return f'{_shown(frames[-1].filename)}:{frames[-1].lineno}' if frames else None


def _is_user_file(filename: str) -> bool:
  if filename.startswith('<'):
    return False
  real = os.path.realpath(filename)
  return not any(real == root or real.startswith(root + os.sep) for root in _LIBRARY_ROOTS)


_LIBRARY_ROOTS = tuple(dict.fromkeys(os.path.realpath(root) for root in (
    *(sysconfig.get_paths()[key] for key in ('stdlib', 'platstdlib', 'purelib', 'platlib')),
    os.path.dirname(os.path.abspath(__file__)),
    os.path.dirname(os.path.abspath(modes.__file__)),
)))
"""Python's library, installed packages, and this tool's two packages (codemods, nnx_bridge)."""


def _shown(filename: str) -> str:
  """A path relative to the working directory when it is under it, as the report prints paths."""
  relative = os.path.relpath(filename)
  return filename if relative.startswith(os.pardir) else relative


def _source_file(cls: type) -> str | None:
  """The real path of the file defining a class of the user's code; None for flax's own and built-ins."""
  if cls.__module__.startswith('flax.'):
    return None
  try:
    source = inspect.getsourcefile(cls)
  except TypeError:
    return None
  return os.path.realpath(source) if source else None
