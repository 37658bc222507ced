"""One abstract init of a Linen module, recorded: each submodule's class, its calls and their inputs.

`nn.intercept_methods` sees every method call of every submodule while `jax.eval_shape` runs the
init (no weights, no accelerator work). The leaf mapping (`derive`) pairs layers by the order of
their `__call__`s; the migrate report's ports and the example traces of `linen2nnx migrate
--examples` read the first call of each method: the module's fields and its input shapes.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing as tp

import jax
from flax import linen as nn

from nnx_bridge import modes

Path = tuple[str, ...]
Shape = tuple[int, ...]

RNG_STREAMS = ('params', 'dropout')
"""The rng streams the traced init is given (keys 0 and 1)."""


@dataclasses.dataclass(frozen=True)
class LinenCall:
  """The first call of one method of a Linen module in an abstract init: fields and input shapes.

  `named` are the shapes by the method's parameter names (None for what is not an array); `example` the
  positional arguments themselves, each array as a `jax.ShapeDtypeStruct` (example inputs that rebuild the call).
  """

  fields: dict[str, tp.Any]
  args: tuple[Shape | None, ...]
  kwargs: dict[str, Shape | None]
  named: dict[str, Shape | None]
  example: tuple[tp.Any, ...] = ()

  def shapes(self, call_args: tp.Sequence[str]) -> tuple[Shape | None, ...]:
    """The shapes of the inputs a layer-table row names, positional or by keyword."""
    return self.args + tuple(self.kwargs.get(name) for name in call_args[len(self.args):])


@dataclasses.dataclass(frozen=True)
class LinenTrace:
  """What one abstract init of a Linen module showed.

  `variables` are the abstract variables (`jax.ShapeDtypeStruct` leaves); `classes` each module
  path's class; `call_paths` the path of every `__call__`, in call order (a layer called twice is
  there twice); `first_calls` the first call of each method of each module, in call order.
  """

  variables: tp.Any
  classes: dict[Path, type]
  call_paths: list[Path]
  first_calls: dict[tuple[Path, str], LinenCall]


def _fields(module: nn.Module) -> dict[str, tp.Any]:
  """The module's dataclass fields that have a value: one declared `field(init=False)` has none until setup()
  sets it (and none at all if setup() leaves it unset)."""
  missing = object()
  values = {f.name: getattr(module, f.name, missing) for f in dataclasses.fields(module)}
  return {name: value for name, value in values.items() if value is not missing}


def _shape(value: tp.Any) -> Shape | None:
  return tuple(value.shape) if hasattr(value, 'shape') else None


def _abstract(value: tp.Any) -> tp.Any:
  """An array (a tracer of the abstract init) as its `jax.ShapeDtypeStruct`; any other value as it is."""
  return jax.ShapeDtypeStruct(value.shape, value.dtype) if isinstance(value, jax.Array) else value


def _example(module: nn.Module, method: str, args: tuple[tp.Any, ...], kwargs: dict[str, tp.Any]) -> tuple[tp.Any, ...]:
  """The call's inputs as positional example inputs (arrays as `jax.ShapeDtypeStruct`s): the arguments in the
  method's parameter order, keywords included and the defaults between them filled in, up to the last one given
  before a train/eval argument (which `nnx_bridge.from_linen` drives itself)."""
  function = getattr(type(module), method, None)
  try:
    parameters = list(inspect.signature(function).parameters.values())[1:]
    given = inspect.signature(function).bind(module, *args, **kwargs).arguments
  except (TypeError, ValueError):
    return jax.tree.map(_abstract, args)
  modes_taken = {m.name for m in modes.MODE_ARGUMENTS}
  values: list[tp.Any] = []
  for parameter in parameters:
    if parameter.name in modes_taken or parameter.kind not in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
      break
    values.append(given[parameter.name] if parameter.name in given else parameter.default)
  while values and len(values) > len(args) and parameters[len(values) - 1].name not in given:
    values.pop()  # a default after the last argument given
  return tuple(jax.tree.map(_abstract, values))


def _named_shapes(
    module: nn.Module, method: str, args: tuple[tp.Any, ...], kwargs: dict[str, tp.Any]
) -> dict[str, Shape | None]:
  """The shapes of a method call's arguments by parameter name."""
  function = getattr(type(module), method, None)  # None for what a lifted transform calls (`<lambda>`)
  try:
    bound = inspect.signature(function).bind(module, *args, **kwargs)
  except (TypeError, ValueError):  # a signature the arguments do not bind to, or none at all
    return {}
  return {name: _shape(value) for name, value in list(bound.arguments.items())[1:]}


def trace_linen(
    module: nn.Module,
    inputs: tuple[tp.Any, ...],
    call_kwargs: tp.Mapping[str, tp.Any],
    *,
    method: modes.Method = None,
    mode: tp.Mapping[str, bool] | None = None,
) -> LinenTrace:
  """Runs `module.init` abstractly on `inputs` (arrays or `jax.ShapeDtypeStruct`s) and records its calls.

  `call_kwargs` go to the Linen `method` (default `__call__`). With `mode` (`modes.EVAL` or
  `modes.TRAIN`), the module's own mode arguments (`train=`, a `deterministic` field, ...) are
  set for that mode first.
  """
  mode_kwargs: dict[str, bool] = {}
  if mode is not None:
    module, mode_kwargs = modes.for_mode(module, method, modes.mode_arguments_of(module, method), **mode)
  classes: dict[Path, type] = {}
  call_paths: list[Path] = []
  first_calls: dict[tuple[Path, str], LinenCall] = {}

  def record(module: nn.Module, path: Path, name: str, args: tuple, kwargs: dict) -> None:
    if (path, name) not in first_calls:
      first_calls[path, name] = LinenCall(
          _fields(module), tuple(map(_shape, args)), {k: _shape(v) for k, v in kwargs.items()},
          _named_shapes(module, name, args, kwargs), _example(module, name, args, kwargs),
      )

  def interceptor(next_fun, args, kwargs, context):
    module, name = context.module, context.method_name
    path = tuple(module.path)
    classes.setdefault(path, type(module))
    if name == '__call__':
      call_paths.append(path)
    if name != 'setup':  # flax runs setup() before any other method: the fields it sets are there
      record(module, path, name, args, kwargs)
      return next_fun(*args, **kwargs)
    result = next_fun(*args, **kwargs)
    record(module, path, name, args, kwargs)  # after setup(), which sets the fields declared `init=False`
    return result

  def init(*xs):
    rngs = {stream: jax.random.key(index) for index, stream in enumerate(RNG_STREAMS)}
    # jit off: a method under `nn.jit` traced before (same module hash) is a cache hit that runs none of its
    # calls, so the interceptor would miss the layers inside it
    with nn.intercept_methods(interceptor), jax.disable_jit():
      return module.init(rngs, *xs, method=method, **mode_kwargs, **call_kwargs)

  variables = jax.eval_shape(init, *inputs)
  return LinenTrace(variables, classes, call_paths, first_calls)
