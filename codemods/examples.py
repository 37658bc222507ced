"""Example traces (`linen2nnx migrate --examples FILE.py`): layer input sizes read off real Linen calls.

The static rules derive most NNX input sizes from the code; the rest become constructor arguments.
An examples file gives, for any Linen model, a way to build it and example inputs: every public
top-level function of the file, called without arguments, returns `(module, inputs)` or `(module,
inputs, call_kwargs)`. Each model is initialised abstractly (`jax.eval_shape`, no weights, no
accelerator) while `nn.intercept_methods` records every submodule's class, fields and input shapes,
then again with each integer field of the root doubled. For each layer inside a class of the user's
code, the input size NNX needs (the layer table says how it is read off the call) is matched against
simple expressions of that class's integer fields and config attributes (`self.features`,
`2 * self.dim`, `self.config.hidden`): the one expression every traced instance agrees with is
what L2N002 writes; none or several leave the constructor argument, and the report says so.

This is the only place where `linen2nnx migrate` imports and runs the user's code.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import runpy
import sys
import typing as tp

from flax import linen as nn

from codemods.example_sizes import Atoms
from codemods.example_sizes import ClassSizes
from codemods.example_sizes import ExampleSizes
from codemods.example_sizes import resolve
from nnx_bridge import modes
from nnx_bridge.layer_table import find_layer_of_class
from nnx_bridge.linen_trace import trace_linen


class ExamplesError(ValueError):
  """An examples file that cannot be used: the message names the file and the function."""


@dataclasses.dataclass(frozen=True)
class _Instance:
  """One traced call of a class: its integer atoms and each layer child's NNX input sizes."""

  atoms: Atoms
  sizes: dict[tuple[str, str], int]


def load_examples(path: str) -> list[tuple[str, nn.Module, tuple[tp.Any, ...], dict[str, tp.Any]]]:
  """Runs the examples file and calls its public functions: (name, module, inputs, call kwargs) each.

  The file's folder and the working directory are importable meanwhile (`from models import MLP`).
  """
  roots = [os.path.dirname(os.path.abspath(path)), os.getcwd()]
  added = [root for root in dict.fromkeys(roots) if root not in sys.path]
  sys.path[:0] = added
  try:
    return _call_examples(path, runpy.run_path(path))
  finally:
    for root in added:
      sys.path.remove(root)


def _call_examples(path: str, namespace: dict[str, tp.Any]) -> list[tuple[str, nn.Module, tuple, dict]]:
  examples = []
  for name, function in namespace.items():
    if name.startswith('_') or not inspect.isfunction(function) or function.__module__ != '<run_path>':
      continue
    try:
      made = function()
    except Exception as error:
      raise ExamplesError(f'{path}: {name}() raised {type(error).__name__}: {error}') from error
    if not (isinstance(made, tuple) and len(made) in (2, 3) and isinstance(made[0], nn.Module)
            and isinstance(made[1], (tuple, list))):
      raise ExamplesError(f'{path}: {name}() must return (module, inputs) or (module, inputs, call_kwargs), '
                          f'inputs a tuple; it returned {type(made).__name__}')
    examples.append((name, made[0], tuple(made[1]), dict(made[2]) if len(made) == 3 else {}))
  if not examples:
    raise ExamplesError(f'{path}: no public function returning (module, inputs)')
  return examples


def trace_examples(path: str) -> ExampleSizes:
  """Traces every example of the file (and its variants with an integer field doubled) and resolves sizes."""
  instances: dict[tuple[str, str], list[_Instance]] = {}
  for name, module, inputs, kwargs in load_examples(path):
    try:
      _collect(module, inputs, kwargs, instances)
    except Exception as error:
      raise ExamplesError(f'{path}: {name}(): the Linen init failed: {type(error).__name__}: {error}') from error
    for variant in _variants(module):
      try:
        _collect(variant, inputs, kwargs, instances)
      except Exception:  # a field the code constrains (heads dividing a width): that variant says nothing
        continue
  by_file: dict[str, dict[str, ClassSizes]] = {}
  for (file, name), seen in instances.items():
    keys = set().union(*(instance.sizes for instance in seen))
    by_file.setdefault(file, {})[name] = {
        key: resolve([(i.atoms, i.sizes[key]) for i in seen if key in i.sizes]) for key in sorted(keys)
    }
  return ExampleSizes(by_file)


def _collect(module: nn.Module, inputs: tuple[tp.Any, ...], kwargs: dict[str, tp.Any],
             instances: dict[tuple[str, str], list[_Instance]]) -> None:
  """Traces one model and adds an instance for every module of a user class that holds table layers."""
  trace = trace_linen(module, inputs, kwargs, mode=modes.EVAL)
  classes, calls = trace.classes, trace.first_calls
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
      instances.setdefault((source, cls.__qualname__), []).append(_Instance(_atoms(call.fields), sizes))


def _atoms(fields: dict[str, tp.Any]) -> Atoms:
  """`self.<field>` for integer fields, `self.<field>.<attr>` for the integer attributes of config fields and of
  module fields (`self.embed.features` of a shared `nn.Embed`) whose NNX counterpart has the same attribute."""
  atoms = {}
  for name, value in fields.items():
    if name in ('parent', 'name'):
      continue
    if _is_int(value):
      atoms[f'self.{name}'] = value
      continue
    items = _module_items(value) if isinstance(value, nn.Module) else _config_items(value)
    for attr, inner in items:
      if _is_int(inner) and attr.isidentifier():
        atoms[f'self.{name}.{attr}'] = inner
  return atoms


def _config_items(value: tp.Any) -> list[tuple[str, tp.Any]]:
  """The attributes of a config object (a dataclass, a mapping such as ConfigDict, a namespace)."""
  if isinstance(value, nn.Module) or value is None or isinstance(value, (str, bytes, tuple, list)):
    return []
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
  if isinstance(value, tp.Mapping) or hasattr(value, 'items') and callable(value.items):
    try:
      return [(str(k), v) for k, v in value.items()]
    except Exception:
      return []
  return list(vars(value).items()) if hasattr(value, '__dict__') and not callable(value) else []


def _module_items(module: nn.Module) -> list[tuple[str, tp.Any]]:
  """A module field's own fields, less those its NNX layer names differently (`nn.Dense.features`)."""
  row = find_layer_of_class(type(module))
  renamed = {old for old, _ in row.arg_renames} if row is not None else set()
  return [(f.name, getattr(module, f.name)) for f in dataclasses.fields(module)
          if f.name not in ('parent', 'name') and f.name not in renamed]


def _is_int(value: tp.Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _variants(module: nn.Module) -> tp.Iterator[nn.Module]:
  """The root module with one integer field (or a dataclass config's integer attribute) doubled."""
  fields = {f.name: getattr(module, f.name) for f in dataclasses.fields(module) if f.name not in ('parent', 'name')}
  for name, value in fields.items():
    if _is_int(value) and value:
      yield module.clone(**{name: 2 * value})
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
      for field in dataclasses.fields(value):
        inner = getattr(value, field.name)
        if _is_int(inner) and inner:
          yield module.clone(**{name: dataclasses.replace(value, **{field.name: 2 * inner})})


def _source_file(cls: type) -> str | None:
  """The real path of the file defining a class of the user's code; None for flax's own and built-ins."""
  if cls.__module__.startswith('flax.'):
    return None
  try:
    source = inspect.getsourcefile(cls)
  except TypeError:
    return None
  return os.path.realpath(source) if source else None
