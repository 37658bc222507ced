"""Linen train/eval arguments and NNX's `deterministic` / `use_running_average` attributes.

The argument names come from the layer table's `MODE_ARGUMENTS`. For `from_linen` this module
finds the ones a given Linen module takes (as a call argument of a method, or as a field) and
produces the module and call keyword arguments for a mode; for `to_linen` it takes the ones an
NNX constructor or method does not take out of a call's keyword arguments, as an eval mode.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing as tp

import numpy as np
from flax import linen as nn

from nnx_bridge.errors import BridgeError
from nnx_bridge.layer_table import MODE_ARGUMENTS
from nnx_bridge.layer_table import ModeArgument

Method = str | tp.Callable[..., tp.Any] | None
ModeArguments = tuple[tuple[ModeArgument, bool], ...]
"""(argument, is_field) pairs: a field is set by cloning the module, else passed to the call."""

EVAL = {'deterministic': True, 'use_running_average': True}
TRAIN = {'deterministic': False, 'use_running_average': False}


def resolve_method(module: nn.Module, method: Method) -> tp.Callable[..., tp.Any]:
  """The Linen method a `method=` argument names (None: `__call__`)."""
  if method is None:
    return type(module).__call__
  if isinstance(method, str):
    return getattr(type(module), method)
  return method


def mode_arguments_of(
    module: nn.Module, method: Method = None, requested: tp.Sequence[str | ModeArgument] | None = None
) -> ModeArguments:
  """Every mode argument `module` takes: all known ones it has, or exactly those `requested`."""
  known = {m.name: m for m in MODE_ARGUMENTS}
  if requested is None:
    candidates = list(known.values())
  else:
    candidates = []
    for entry in requested:
      if isinstance(entry, ModeArgument):
        candidates.append(entry)
      elif entry in known:
        candidates.append(known[entry])
      else:
        raise ValueError(
            f'Unknown mode argument {entry!r}; the known ones are {sorted(known)}. For another '
            f'name pass nnx_bridge.ModeArgument({entry!r}, "deterministic", inverted=...).'
        )
  parameters = inspect.signature(resolve_method(module, method)).parameters
  fields = {f.name for f in dataclasses.fields(module)}
  found = []
  for argument in candidates:
    if argument.name in parameters:
      # A Linen field that is set (not None) wins over the call argument (merge_param semantics).
      if argument.name in fields and getattr(module, argument.name) is not None:
        continue
      found.append((argument, False))
    elif argument.name in fields:
      found.append((argument, True))
    elif requested is not None:
      raise ValueError(
          f'{type(module).__name__} has no call argument or field named {argument.name!r}.'
      )
  return tuple(found)


def for_mode(
    module: nn.Module, method: Method, arguments: ModeArguments, **attributes: bool
) -> tuple[nn.Module, dict[str, bool]]:
  """The module (cloned when a field sets the mode) and the mode call kwargs `method` takes.

  `attributes` are NNX's `deterministic` and `use_running_average` (see `EVAL` / `TRAIN`).
  """
  parameters = inspect.signature(resolve_method(module, method)).parameters
  fields, kwargs = {}, {}
  for argument, is_field in arguments:
    value = argument.value(attributes[argument.nnx_attribute])
    if is_field:
      fields[argument.name] = value
    elif argument.name in parameters:
      kwargs[argument.name] = value
  return (module.clone(**fields) if fields else module), kwargs


def accepts_keyword(target: tp.Callable[..., tp.Any], name: str) -> bool:
  """Whether `target(name=...)` binds the keyword (a class: its `__init__`); True when unknown."""
  try:
    signature = inspect.signature(target.__init__ if isinstance(target, type) else target)
  except (TypeError, ValueError):
    return True
  return any(
      p.kind is p.VAR_KEYWORD or (p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
      for p in signature.parameters.values()
  )


def take_mode_arguments(
    kwargs: tp.Mapping[str, tp.Any], target: tp.Callable[..., tp.Any], where: str
) -> tuple[bool | None, dict[str, tp.Any]]:
  """Splits off the mode arguments `target` does not take: (eval mode or None, the other kwargs).

  A migrated NNX module lost its `train` / `deterministic` switch to `train()` / `eval()`, so a
  Linen caller still passing it means that mode: `train=True`, `deterministic=False`,
  `use_running_average=False` (and `training`, `is_training`) mean train, the opposite values
  eval. An argument `target` takes is left for it, as a native NNX caller would pass it.
  """
  known = {m.name: m for m in MODE_ARGUMENTS}
  taken = {k: v for k, v in kwargs.items() if k in known and not accepts_keyword(target, k)}
  for name, value in taken.items():
    if not isinstance(value, (bool, np.bool_)):
      raise BridgeError(
          f'{where}: {name}={value!r} must be a Python bool, as it picks train() or eval(); '
          f'under jax.jit pass it as a static argument (static_argnames=[{name!r}]).'
      )
  modes = {bool(value) != known[name].inverted for name, value in taken.items()}
  if len(modes) > 1:
    given = ', '.join(f'{name}={value}' for name, value in taken.items())
    raise BridgeError(f'{where}: {given} contradict each other (one means train, one eval); pass one.')
  rest = {k: v for k, v in kwargs.items() if k not in taken}
  return (modes.pop() if modes else None), rest
