"""`from_linen`: run a Linen module inside an NNX model, as an NNX module.

The Linen module's variables become NNX Variables on the wrapper (typed by collection through
`collectionlib`, laid out per module as NNX lays out its own state), so the wrapper behaves
like a native NNX layer: `model.train()` / `model.eval()` switch its mode arguments, state
updates are written into the existing Variables in place (which is what makes them survive
`nnx.jit` in graph and tree mode, `nnx.grad`, `nnx.scan` and friends), `nnx.Rngs` streams feed
the Linen rng names the module asks for, and sown values are reported through `nnx.capture`.
"""

from __future__ import annotations

import dataclasses
import re
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from flax import errors as linen_errors
from flax.nnx import traversals

from nnx_bridge import collectionlib
from nnx_bridge import layer_table
from nnx_bridge import linen_state
from nnx_bridge import modes
from nnx_bridge.errors import BridgeError
from nnx_bridge.errors import MissingRngError

_MISSING_RNG = re.compile(r'needs PRNG for "([^"]+)"')
_PER_CALL_COLLECTIONS = ('intermediates',)
"""Collections holding values sown during a call: reported through `nnx.capture`, never state."""


def _as_dict(state: tp.Mapping[str, tp.Any]) -> dict[str, tp.Any]:
  """Nested plain dicts of Variables, the container NNX accepts as module data."""
  return {k: v if isinstance(v, nnx.Variable) else _as_dict(v) for k, v in state.items()}


def _is_array(x: tp.Any) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic))


@dataclasses.dataclass(frozen=True)
class _ExampleCall:
  """The example call's arguments, split into array leaves and the static rest."""

  leaves: list[tp.Any]
  treedef: tp.Any

  @classmethod
  def of(cls, args: tuple[tp.Any, ...], kwargs: dict[str, tp.Any]) -> '_ExampleCall':
    leaves, treedef = jax.tree.flatten(
        (args, kwargs), is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct)
    )
    return cls(leaves, treedef)

  @property
  def arrays(self) -> list[tp.Any]:
    return [x for x in self.leaves if _is_array(x)]

  @property
  def specs(self) -> list[jax.ShapeDtypeStruct]:
    """Every array-like leaf as a shape struct, for abstract tracing."""
    return [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in self.leaves if _is_array_like(x)]

  def build(self, arrays: tp.Sequence[tp.Any], *, zeros_for_specs: bool) -> tuple[tuple, dict]:
    """(args, kwargs) with `arrays` in place of the array leaves (and of the shape structs
    too, unless `zeros_for_specs`, which fills those with zeros instead)."""
    arrays = iter(arrays)
    values = [
        jnp.zeros(x.shape, x.dtype) if zeros_for_specs and isinstance(x, jax.ShapeDtypeStruct)
        else next(arrays) if _is_array_like(x) else x
        for x in self.leaves
    ]
    return jax.tree.unflatten(self.treedef, values)


def _is_array_like(x: tp.Any) -> bool:
  return isinstance(x, jax.ShapeDtypeStruct) or _is_array(x)


class LinenModule(nnx.Module):
  """An NNX module wrapping a Linen module; build it with `from_linen`.

  Linen variables are attributes named after the first component of their path (a bare
  `nn.Dense` gives `wrapper.kernel`; a model with a `Dense_0` child gives
  `wrapper.Dense_0['kernel']`). `deterministic` and `use_running_average` are the attributes
  `nnx.Module.train()` / `.eval()` set; they feed the Linen module's mode arguments.
  """

  def __init__(
      self,
      module: nn.Module,
      *example_inputs: tp.Any,
      rngs: nnx.Rngs | None,
      method: str | tp.Callable[..., tp.Any] | None = None,
      mode_arguments: tp.Sequence[str | layer_table.ModeArgument] | None = None,
      eval_mode: bool = False,
      **call_kwargs: tp.Any,
  ):
    self.linen_module = module
    self.rngs = rngs.fork() if rngs is not None else None
    self.deterministic = eval_mode
    self.use_running_average = eval_mode
    self.linen_mode_arguments = modes.mode_arguments_of(module, method, mode_arguments)
    self.linen_rng_names: tuple[str, ...] = ()
    example = _ExampleCall.of(example_inputs, call_kwargs)
    state = linen_state.linen_to_nnx_state(self._initial_variables(example, method))
    for name in state:
      if hasattr(self, name):
        raise BridgeError(
            f'The Linen variable path {name!r} clashes with the wrapper attribute of that name; '
            'rename the Linen submodule or variable.'
        )
    self.linen_variable_names = tuple(state)
    for name, value in state.items():
      setattr(self, name, value if isinstance(value, nnx.Variable) else nnx.data(_as_dict(value)))
    self._keep_rngs_only_if_drawn(example, method)

  # --- construction -------------------------------------------------------------------------

  def _initial_variables(self, example: _ExampleCall, method) -> dict[str, tp.Any]:
    """Runs Linen `init` once under `jax.jit` on the example arrays or shape structs."""
    module, mode_kwargs = modes.for_mode(self.linen_module, method, self.linen_mode_arguments, **modes.EVAL)

    def init(rngs, arrays):
      # Shape structs become zeros inside jit: they only feed computations that XLA prunes
      # when no variable depends on them, so no real data and no mesh are needed.
      args, kwargs = example.build(arrays, zeros_for_specs=True)
      return module.init(rngs, *args, method=method, **{**mode_kwargs, **kwargs})

    variables = self._with_rngs(
        lambda rngs: jax.jit(init)(rngs, example.arrays),
        base={'params'} if self._can_serve('params') else set(),
        what='init',
    )
    return {k: v for k, v in variables.items() if k not in _PER_CALL_COLLECTIONS}

  def _keep_rngs_only_if_drawn(self, example: _ExampleCall, method) -> None:
    """Traces one train-mode call abstractly; drops the rng streams if it draws none.

    An unused `nnx.Rngs` would add key state to every step that a native NNX port of the
    same module does not carry. A call that cannot be traced here keeps the streams.
    """
    if self.rngs is None:
      return
    variables = self.linen_variables(boxed=False)
    mutable = sorted(set(variables) - {'params'})
    module, mode_kwargs = modes.for_mode(self.linen_module, method, self.linen_mode_arguments, **modes.TRAIN)

    def call(rngs, arrays):
      args, kwargs = example.build(arrays, zeros_for_specs=False)
      return module.apply(
          variables, *args, rngs=rngs, mutable=mutable, method=method, **{**mode_kwargs, **kwargs}
      )

    try:
      self._with_rngs(
          lambda rngs: jax.eval_shape(call, rngs, example.specs), base=set(), what='a train-mode call'
      )
    except Exception:  # the module may not support train mode here; keep the streams
      return
    if not self.linen_rng_names:
      self.rngs = None

  # --- rngs --------------------------------------------------------------------------------------

  def _with_rngs(self, run: tp.Callable[[dict[str, jax.Array]], tp.Any], *, base: set[str], what: str):
    """Calls `run(rng_dict)`, adding each rng name the Linen module turns out to need."""
    names = set(base) | set(self.linen_rng_names)
    while True:
      try:
        return run({name: self._stream(name, what)() for name in sorted(names)})
      except (linen_errors.InvalidRngError, MissingRngError) as error:  # Linen's, or an NNX module's under to_linen
        match = _MISSING_RNG.search(str(error))
        asked = {match.group(1)} if match is not None else set(getattr(error, 'streams', ()))
        if not asked or asked <= names:
          raise
        for name in sorted(asked - names):
          self._stream(name, what)  # raises MissingRngError when no stream can serve it
          names.add(name)
          if name not in base:
            self.linen_rng_names = tuple(sorted(set(self.linen_rng_names) | {name}))

  def _can_serve(self, name: str) -> bool:
    return self.rngs is not None and (name in self.rngs or 'default' in self.rngs)

  def _stream(self, name: str, what: str) -> nnx.RngStream:
    available = sorted(self.rngs) if self.rngs is not None else []
    if not self._can_serve(name):
      raise MissingRngError(
          f'{type(self.linen_module).__name__} asks for the rng stream {name!r} during {what}, '
          f'but the nnx.Rngs given to from_linen has streams {available}. Pass '
          f'rngs=nnx.Rngs({name}=...) (or a default stream, nnx.Rngs(0)) to from_linen.'
      )
    return self.rngs[name]

  # --- calls -----------------------------------------------------------------------------------

  def _state(self) -> dict[str, tp.Any]:
    """The wrapper's Linen variables, as a nested mapping of Variables."""
    return {name: getattr(self, name) for name in self.linen_variable_names}

  def linen_variables(self, *, boxed: bool = True) -> dict[str, tp.Any]:
    """The wrapped module's current variables as a Linen tree, ready for `Module.apply`."""
    return linen_state.nnx_to_linen_variables(self._state(), boxed=boxed)

  def _captured_collections(self) -> dict[str, nnx.Variable]:
    """Collection name -> the `nnx.capture` slot of that type, when called under capture."""
    captures = getattr(self, '__captures__', ())
    return {collectionlib.collection_name(type(slot)): slot for slot in captures}

  def linen_call(self, method: str | tp.Callable[..., tp.Any] | None, *args, **kwargs) -> tp.Any:
    """Calls `method` of the Linen module (None: `__call__`) on the wrapper's state."""
    mode = {'deterministic': self.deterministic, 'use_running_average': self.use_running_average}
    module, mode_kwargs = modes.for_mode(self.linen_module, method, self.linen_mode_arguments, **mode)
    kwargs = {**mode_kwargs, **kwargs}
    captured = self._captured_collections()
    variables = self.linen_variables(boxed=False)
    mutable = sorted((set(variables) - {'params'}) | set(captured))

    def run(rngs):
      return module.apply(variables, *args, rngs=rngs, mutable=mutable, method=method, **kwargs)

    out, updates = self._with_rngs(run, base=set(), what='the call')
    self._write_back(updates, captured)
    return out

  def _write_back(self, updates: tp.Mapping[str, tp.Any], captured: dict[str, nnx.Variable]) -> None:
    """Writes updated collections into the existing Variables, in place."""
    for collection in captured.keys() & updates.keys():
      for name, value in updates[collection].items():
        captured[collection][name] = value
    current = {
        (collectionlib.collection_name(type(variable)), tuple(map(str, path))): variable
        for path, variable in traversals.flatten_mapping(
            self._state(), is_leaf=lambda _, x: isinstance(x, nnx.Variable)
        ).items()
    }
    by_linen_key = {
        (collection, linen_state.linen_path_of(collection, path)): variable
        for (collection, path), variable in current.items()
    }
    updated = {k: v for k, v in linen_state.flat_linen_variables(updates).items() if k[0] not in captured}
    for (collection, path), value in updated.items():
      variable = by_linen_key.get((collection, path))
      if variable is None:
        raise BridgeError(
            f'{type(self.linen_module).__name__} created the variable '
            f'{collection}/{"/".join(path)} after initialization. NNX state has a fixed '
            'structure: create it during init (call from_linen with the example arguments and '
            'mode that create it).'
        )
      variable.set_value(linen_state.raw_value(value))

  def __call__(self, *args, **kwargs) -> tp.Any:
    return self.linen_call(None, *args, **kwargs)

  def __getattr__(self, name: str) -> tp.Any:
    """Exposes the Linen module's other methods: `wrapper.encode(x)`."""
    if name.startswith('_') or name.startswith('linen_'):
      raise AttributeError(name)
    module = self.__dict__.get('linen_module')
    if module is not None and callable(getattr(type(module), name, None)):
      return lambda *args, **kwargs: self.linen_call(name, *args, **kwargs)
    raise AttributeError(f'{type(self).__name__} has no attribute {name!r}')


def from_linen(
    module: nn.Module,
    *example_inputs: tp.Any,
    rngs: nnx.Rngs | None,
    method: str | tp.Callable[..., tp.Any] | None = None,
    mode_arguments: tp.Sequence[str | layer_table.ModeArgument] | None = None,
    eval_mode: bool = False,
    **call_kwargs: tp.Any,
) -> LinenModule:
  """Wraps a Linen module as an NNX module, initialized now from example inputs.

  Args:
    module: the Linen module (unbound).
    *example_inputs: example call inputs, as arrays or `jax.ShapeDtypeStruct` (no data needed).
    rngs: `nnx.Rngs`; its streams serve the Linen rng names by name (`params` at init,
      `dropout` etc. at each call), falling back to a `default` stream as NNX layers do.
    method: the Linen method used for initialization (default `__call__`).
    mode_arguments: Linen arguments driven by `model.train()` / `model.eval()`; by default
      every argument of the layer table's `MODE_ARGUMENTS` the module takes (as a call
      argument, or as a field when it is not a call argument). Pass `()` to disable.
    eval_mode: start in eval mode (as after `.eval()`) instead of train mode, as NNX layers
      built with `deterministic=True` do.
    **call_kwargs: other keyword arguments of the example call.

  Returns:
    A `LinenModule` holding the Linen variables as NNX Variables.
  """
  return LinenModule(
      module, *example_inputs, rngs=rngs, method=method, mode_arguments=mode_arguments, eval_mode=eval_mode,
      **call_kwargs
  )
