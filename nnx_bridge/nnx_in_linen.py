"""Runs an NNX module inside a Linen model strictly: no re-init, no fixed rng keys, no lost writes.

`to_linen(nnx_class, *args, **kwargs)` returns a `ToLinen` Linen module (same names as flax's
`nnx.bridge.to_linen` / `ToLinen`, so it is a drop-in replacement) that behaves as follows:

* init constructs `nnx_class(*args, **kwargs, rngs=...)` exactly once and stores its state,
  as it is right after `__init__`, in the Linen collections given by `collectionlib`. Rng
  state is never stored. As with Linen layers that skip updates while `is_initializing()`,
  writes made by calls during init to that state are not stored; Variables the call creates
  (a decode cache made when `init_cache=True`, a sown value) are, in the collections init keeps.
* apply never runs the initializers: the graphdef and abstract state come from
  `nnx.eval_shape` (cached per `(nnx_class, args, kwargs)` when they are hashable), the Linen
  variables are checked against the abstract state (`state_check.check_state`) and merged in.
  A given variable at an attribute `__init__` left `nnx.data(None)` is one an earlier call
  created (a decode cache): it is put back there, as a Variable of its collection's type.
* arrays `__init__` keeps as plain attributes (HF's `self.causal_mask = make_causal_mask(...)`)
  are constants no Linen collection holds: they are computed once per structure, under jit so
  that XLA drops the initializers, as Linen's setup() recomputes them; one that depends on the
  rngs is a `BridgeError` naming it.
* every rng stream gets a fresh key from Linen's `make_rng(<stream name>)` per call; a stream
  whose name Linen was not given gets a placeholder key, and if the call consumes it (its
  key/count Variable holds a different object after the call) `MissingRngError` is raised.
* after apply, every state leaf the module changed or created is written with `put_variable`
  if its collection is mutable, otherwise `ImmutableCollectionError` is raised.
* `nnx_method='encode'` (a keyword of the wrapper's `__call__`, so also of `apply`) calls
  that method of the NNX module instead of `__call__`.
* `linen_names={'layer_norm': 'LayerNorm_0', 'mlp.dense': 'Dense_0', 'layers': '{}'}` stores the NNX
  submodule at each dotted attribute path under its Linen name (a list's elements under the name
  with `{}` replaced by their index i, or `{a + b * i}` by that number: `element_names`; a layer
  Linen numbers after a loop's, `'linear': 'Dense_{num_layers}'`, under the int attribute of the
  module holding it, plus a number; a key `'layers.{}.layer@BottleNeck'` applies only where the module
  holding `layer` is a `BottleNeck`, for classes a module may hold at one path that name their
  submodules apart), so a migrated class built by a Linen parent keeps the
  variable paths (and checkpoints) of the Linen class it replaces.
* `input_sizes={'dense_in_features': 'hidden_states'}` gives the NNX constructor sizes only the
  call knows, as Linen layers learn them: each keyword gets the last-axis size of the named
  argument of the called method, so a Linen parent can build a class whose NNX `__init__`
  takes input sizes (the migration's `*_in_features` arguments) without knowing them.
  `traced_sizes=('dense_in_features',)` does the same for sizes no argument shows (a layer fed a
  reshaped or computed value): one abstract run of the call finds them (`size_probe`).
  `traced_inputs={'attn_c_attn_kernel_features': 'inputs'}` does so for a size that shapes a variable
  of a module inside, by the argument of that module's call whose last-axis size it is (GPT-2's
  `FlaxConv1D`, whose kernel is `(features, inputs.shape[-1])`).
* train/eval: a mode argument of `MODE_ARGUMENTS` (`train`, `deterministic`,
  `use_running_average`, `training`, `is_training`) that the NNX method does not take, passed
  at call time as a Linen parent passes it to a Linen child, runs the module after `train()` or
  `eval()` (`modes.take_mode_arguments`); one that `to_linen` is given and the NNX constructor
  does not take does so for every call (`ToLinen.eval_mode`). Without either the module runs
  in the mode its constructor left it in. An argument the NNX code takes is passed to it.

Stream names: the NNX `__init__` is first traced with an `nnx.Rngs` that creates a stream for
every name it is asked for, and the real/abstract module is then built with exactly those
streams, so e.g. `nnx.Dropout`'s stream is tagged 'dropout' (plain `nnx.Rngs(0)` would tag it
'default'). A 'default' stream is always present; at init it is fed from Linen's 'params'.
Not supported: `ref=True` Variables (flax 0.12.8's own `nnx.eval_shape` rejects them, and
their in-place writes would be invisible to the identity check) and `hijax=True` Variables.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen
from flax import nnx
from flax import traverse_util
from flax.core import meta

from nnx_bridge import collectionlib
from nnx_bridge import element_names
from nnx_bridge import linen_state
from nnx_bridge import modes
from nnx_bridge import size_probe
from nnx_bridge.errors import BridgeError, ImmutableCollectionError, MissingRngError
from nnx_bridge.state_check import Path, check_state, path_str

LinenPath = tuple[str, ...]  # (collection, *keys), keys as strings like Linen's own trees


@dataclasses.dataclass(frozen=True)
class _Structure:
  """What apply needs from an NNX class without running its initializers."""

  stream_names: tuple[str, ...]
  graphdef: nnx.GraphDef
  abstract_state: nnx.State  # its Variables abstract; arrays kept as plain attributes concrete (constants)
  slots: tuple[Path, ...]  # attributes `nnx.data(None)` after __init__: a Variable a call may create there


def _build_structure(
    nnx_class: tp.Callable[..., nnx.Module], args: tuple, kwargs: tuple
) -> _Structure:
  """Traces the NNX `__init__` twice, abstractly: to learn its rng stream names (and the arrays it keeps as plain
  attributes), then with them; the plain arrays are computed for real (`_constants`)."""
  names = {'default'}
  plain: list[Path] = []  # arrays kept as plain attributes: nnx.eval_shape makes them static

  def record_names():
    rngs = size_probe.AnyRngs(default=0)
    module = nnx_class(*args, **dict(kwargs), rngs=rngs)
    names.update(name for name, _ in rngs.items())
    plain.extend(path for path, value in nnx.iter_graph(module) if isinstance(value, (jax.Array, np.ndarray)))

  jax.eval_shape(record_names)
  stream_names = tuple(sorted(names))
  build = lambda seed: nnx_class(*args, **dict(kwargs), rngs=nnx.Rngs(**dict.fromkeys(stream_names, seed)))

  def without_plain_arrays() -> nnx.Module:  # a static array in its output would fail nnx.eval_shape
    module = build(0)
    for path in plain:
      _set_attribute(module, path, nnx.data(None))
    return module

  module = nnx.eval_shape(without_plain_arrays)
  for path, value in _constants(nnx_class, build, plain).items():
    _set_attribute(module, path, nnx.data(value))
  slots = _none_slots(module)
  graphdef, abstract_state = nnx.split(module)
  return _Structure(stream_names, graphdef, abstract_state, slots)


def _constants(
    nnx_class: tp.Callable[..., nnx.Module], build: tp.Callable[[int], nnx.Module], paths: list[Path]
) -> dict[Path, jax.Array]:
  """The arrays `__init__` keeps as plain attributes (HF's `self.causal_mask = make_causal_mask(...)`), which no
  Linen collection holds: computed under jit, so that XLA drops the unused initializers, once per structure (as
  Linen's setup() computes them for each apply). Built with two rng seeds: arrays that differ depend on the rngs,
  which a Linen module could neither store nor recompute, and are an error naming them."""
  if not paths:
    return {}

  def values(seed: int) -> list[jax.Array]:
    found = dict(nnx.iter_graph(build(seed)))
    return [found[path] for path in paths]

  with jax.ensure_compile_time_eval():  # concrete even when the first call is traced
    first, second = (jax.jit(functools.partial(values, seed))() for seed in (0, 1))
  random = [path_str(path) for path, a, b in zip(paths, first, second)
            if not np.array_equal(np.asarray(a), np.asarray(b), equal_nan=jnp.issubdtype(a.dtype, jnp.inexact))]
  if random:
    name = getattr(nnx_class, '__name__', repr(nnx_class))
    raise BridgeError(
        f'to_linen({name}): its __init__ keeps arrays drawn from its rngs that are not nnx.Variables '
        f'({", ".join(random)}), which a Linen module cannot store or restore; make each an nnx.Variable.'
    )
  return dict(zip(paths, first))


def _none_slots(module: nnx.Module) -> tuple[Path, ...]:
  """The paths of the data attributes holding None (`nnx.data(None)`), each once: places a call may fill.
  (`nnx.iter_graph` visits the one None object once, so the module is flattened as a pytree.)"""
  leaves = jax.tree_util.tree_flatten_with_path(module, is_leaf=lambda x: x is None)[0]
  key = lambda k: k.name if isinstance(k, jax.tree_util.GetAttrKey) else k.idx if isinstance(
      k, jax.tree_util.SequenceKey) else k.key
  return tuple(dict.fromkeys(tuple(key(k) for k in path) for path, value in leaves if value is None))


def _set_attribute(module: nnx.Module, path: Path, value: tp.Any) -> None:
  """Sets the attribute (or nnx.List element) at `path` below `module`."""
  owner: tp.Any = module
  for key in path[:-1]:
    owner = owner[key] if isinstance(key, int) else getattr(owner, key)
  if isinstance(path[-1], int):
    owner[path[-1]] = value
  else:
    setattr(owner, path[-1], value)


_cached_structure = functools.lru_cache(maxsize=128)(_build_structure)


def _structure(nnx_class: tp.Callable[..., nnx.Module], args: tuple, kwargs: tuple) -> _Structure:
  """Returns the cached structure for hashable arguments, a freshly traced one otherwise."""
  try:
    hash((nnx_class, args, kwargs))
  except TypeError:
    return _build_structure(nnx_class, args, kwargs)
  return _cached_structure(nnx_class, args, kwargs)


def _linen_path(path: Path, variable: nnx.Variable, linen_names: tp.Mapping[str, str]) -> LinenPath:
  """Where an NNX state leaf lives in Linen variables: its collection, then `_linen_keys`."""
  return (collectionlib.collection_name(type(variable)), *_linen_keys(path, linen_names))


def _linen_keys(path: Path, linen_names: tp.Mapping[str, str]) -> tuple[str, ...]:
  """An NNX path as Linen keys: strings, each submodule under its Linen name where `linen_names` (dotted NNX
  path -> Linen name) gives one.

  A name holding a placeholder is a list's (`element_names`): `'layers': '{}'` stores element `('layers', 3)` as
  Linen's `'3'` (a setup() list named `name=str(i)`), `'blocks': 'Block_{}'` as `'Block_3'`, `'convs': 'Conv_{1 +
  2 * i}'` as `'Conv_7'`; its elements' own names are keyed with `{}` for the index (`'layers.{}.dense': 'Dense_0'`).
  """
  keys = [str(key) for key in path]
  named, dotted, j = [], [], 0
  while j < len(keys):
    name = linen_names.get('.'.join(keys[:j + 1]))  # an owner's name resolved at this very path first
    name = linen_names.get('.'.join([*dotted, keys[j]])) if name is None else name
    if name is not None and element_names.is_template(name) and j + 1 < len(keys):
      named.append(element_names.element_name(name, int(keys[j + 1])))
      dotted += [keys[j], '{}']
      j += 2
      continue
    named.append(keys[j] if name is None else name)
    dotted.append(keys[j])
    j += 1
  return tuple(named)


def _stored(leaf: tp.Any) -> bool:
  """Whether an NNX state leaf lives in a Linen collection: a Variable other than rng state (a plain array
  attribute is a constant of `__init__`, rng keys come from Linen's make_rng)."""
  return isinstance(leaf, nnx.Variable) and not isinstance(leaf, nnx.RngState)


def _variables(module: nnx.Module) -> list[tuple[Path, nnx.Variable]]:
  """The module's Variables by path (its plain arrays left out)."""
  return [(path, var) for path, var in nnx.to_flat_state(nnx.state(module)) if isinstance(var, nnx.Variable)]


def _unbox(leaf: tp.Any) -> tp.Any:
  """A Linen leaf's value, through its metadata box (with Linen's sharding constraint) if boxed."""
  return leaf.unbox() if isinstance(leaf, meta.AxisMetadata) else leaf


class ToLinen(linen.Module):
  """A Linen module running `nnx_class(*args, **dict(kwargs), rngs=...)`; build it with `to_linen`.

  Call it like the NNX module; `nnx_method='name'` calls another method of the NNX module, and
  `train=` / `deterministic=` / `use_running_average=` that the method does not take pick
  `train()` or `eval()` for the call. `eval_mode` does so for every call: True `eval()`, False
  `train()`, None (default) the mode the constructor left. Giving both is an error, as Linen's
  `merge_param` makes a field that is also a call argument.
  """

  nnx_class: tp.Callable[..., nnx.Module]
  args: tuple[tp.Any, ...] = ()
  kwargs: tuple[tuple[str, tp.Any], ...] = ()  # pairs, so values reach nnx_class unconverted
  eval_mode: bool | None = None
  input_sizes: tuple[tuple[str, str], ...] = ()  # constructor keyword -> call argument whose last-axis size it is
  traced_sizes: tuple[str, ...] = ()  # constructor keywords found by running the call (`size_probe`)
  traced_inputs: tuple[tuple[str, str], ...] = ()  # such keywords shaping a variable -> its module's call argument
  linen_names: tuple[tuple[str, str], ...] = ()  # dotted NNX submodule path -> its Linen name

  def __call__(self, *args: tp.Any, nnx_method: str = '__call__', **kwargs: tp.Any) -> tp.Any:
    given = traverse_util.flatten_dict(self.variables)
    constructor_kwargs = self.kwargs + self._sizes_of_call(nnx_method, args, kwargs)
    constructor_kwargs += self._traced_sizes(nnx_method, args, kwargs, constructor_kwargs)
    names = self._linen_names(constructor_kwargs)
    graphdef, flat_state, values, created = self._initial_state(given, constructor_kwargs, names)
    call_state = [
        (path, var.replace(self._rng_value(var) if isinstance(var, nnx.RngState) else values[path])
         if isinstance(var, nnx.Variable) else var)  # a plain array: a constant of __init__
        for path, var in flat_state
    ]
    module = nnx.merge(graphdef, nnx.from_flat_state(call_state))
    for path, variable in created.items():
      _set_attribute(module, path, variable)
    method = getattr(module, nnx_method)
    eval_mode, kwargs = self._call_mode(method, kwargs)
    if eval_mode:
      module.eval()
    elif eval_mode is not None:
      module.train()
    before = {path: var.get_raw_value() for path, var in _variables(module)}
    out = method(*args, **kwargs)
    after = _variables(module)
    self._check_rng_use(before, after)
    self._write_changes(before, after, given, names)
    return out

  def __getattr__(self, name: str) -> tp.Any:
    """Linen's attribute lookup, else an attribute of the NNX module, built abstractly: a plain value its
    `__init__` stores (transformers' BEiT reads `self.patch_embeddings.num_patches` in the Linen parent's
    setup()), before any call. The sizes the call would give are placeholders (1): what Linen's setup() stored
    cannot depend on them, as Linen learns them at the call."""
    try:
      return super().__getattr__(name)
    except AttributeError:
      if name.startswith('_') or name in {f.name for f in dataclasses.fields(self)}:
        raise
    placeholders = tuple((keyword, 1) for keyword in (*dict(self.input_sizes), *self.traced_sizes,
                                                       *dict(self.traced_inputs)))
    try:  # `hasattr` asks too, and expects AttributeError alone
      structure = _structure(self.nnx_class, self.args, self.kwargs + placeholders)
    except Exception as error:
      raise AttributeError(f'{self._label()}: {name} is no attribute of the Linen wrapper, and its NNX module could '
                           f'not be built to read it ({" ".join(str(error).split())[:200]})') from None
    return getattr(nnx.merge(structure.graphdef, structure.abstract_state), name)

  def _call_mode(
      self, method: tp.Callable[..., tp.Any], kwargs: dict[str, tp.Any]
  ) -> tuple[bool | None, dict[str, tp.Any]]:
    """The call's eval mode (from mode arguments `method` does not take, else `eval_mode`)."""
    call_mode, kwargs = modes.take_mode_arguments(kwargs, method, where=self._label())
    if call_mode is not None and self.eval_mode is not None:
      raise BridgeError(
          f'{self._label()} was given a train/eval mode both to to_linen and at call time; pass '
          'it once (Linen raises the same for a field that is also a call argument).'
      )
    return (self.eval_mode if call_mode is None else call_mode), kwargs

  def _sizes_of_call(
      self, nnx_method: str, args: tuple[tp.Any, ...], kwargs: dict[str, tp.Any]
  ) -> tuple[tuple[str, int], ...]:
    """The `input_sizes` constructor keywords with the last-axis sizes of this call's arguments."""
    if not self.input_sizes:
      return ()
    signature = inspect.signature(getattr(self.nnx_class, nnx_method))
    takes = {k: v for k, v in kwargs.items() if k in signature.parameters}  # less the train/eval arguments
    try:
      bound = signature.bind_partial(None, *args, **takes)  # None stands for self
    except TypeError as error:
      raise BridgeError(f'{self._label()}: the call does not fit {nnx_method}: {error}') from None
    sizes = []
    for keyword, argument in self.input_sizes:
      value = bound.arguments.get(argument)
      if value is None or not jnp.ndim(value):
        raise BridgeError(
            f'{self._label()}: the constructor argument {keyword} is the last-axis size of the call '
            f'argument {argument}, but this call passes no array for it; give {keyword}= to to_linen instead of '
            'in input_sizes.'
        )
      sizes.append((keyword, int(jnp.shape(value)[-1])))
    return tuple(sizes)

  def _traced_sizes(
      self, nnx_method: str, args: tuple[tp.Any, ...], kwargs: dict[str, tp.Any],
      constructor_kwargs: tuple[tuple[str, tp.Any], ...]
  ) -> tuple[tuple[str, int], ...]:
    """The `traced_sizes` and `traced_inputs` constructor keywords, found by running this call abstractly
    (`size_probe`)."""
    names = (*self.traced_sizes, *dict(self.traced_inputs))
    if not names:
      return ()
    _, takes = modes.take_mode_arguments(kwargs, getattr(self.nnx_class, nnx_method), where=self._label())
    found = size_probe.traced_sizes(self.nnx_class, self.args, constructor_kwargs, names, nnx_method,
                                    args, takes, where=self._label(), inputs=dict(self.traced_inputs))
    return tuple((name, found[name]) for name in names)

  def _initial_state(
      self, given: dict[LinenPath, tp.Any], constructor_kwargs: tuple[tuple[str, tp.Any], ...],
      names: dict[str, str]
  ) -> tuple[nnx.GraphDef, list[tuple[Path, tp.Any]], dict[Path, tp.Any], dict[Path, nnx.Variable]]:
    """The graphdef, state leaves and Variable values to call with: built at first init, else given; and the
    Variables an earlier call created in attributes `__init__` left None (decode caches), from the given ones."""
    structure = _structure(self.nnx_class, self.args, constructor_kwargs)
    if self.is_initializing() and not given:
      graphdef, state = self._construct(structure.stream_names, constructor_kwargs)
      flat_state = list(nnx.to_flat_state(state))
      constructed = {_linen_path(path, var, names): linen_state.to_linen_leaf(var)
                     for path, var in flat_state if _stored(var)}
      self._put(constructed, base={})
      values = {path: var.get_raw_value() for path, var in flat_state if _stored(var)}
      return graphdef, flat_state, values, {}
    flat_state = list(nnx.to_flat_state(structure.abstract_state))
    slots = {_linen_keys(path, names): path for path in structure.slots}
    created = {
        slots[linen_path[1:]]: collectionlib.variable_type(linen_path[0])(_unbox(leaf))
        for linen_path, leaf in given.items() if linen_path[1:] in slots
    }
    rest = {linen_path: leaf for linen_path, leaf in given.items() if linen_path[1:] not in slots}
    return structure.graphdef, flat_state, self._checked_values(flat_state, rest, names), created

  def _linen_names(self, constructor_kwargs: tuple[tuple[str, tp.Any], ...]) -> dict[str, str]:
    """`linen_names`, each attribute placeholder (`'linear': 'Dense_{num_layers}'`) replaced by that int
    attribute of the NNX module built with these arguments (`element_names.resolve_attributes`), each key of an
    owner class (`'layer@BottleNeckLayerCollection'`) by the paths where that class holds it (`resolve_owners`)."""
    names = dict(self.linen_names)
    owned = any('@' in key for key in names)
    if not owned and not any(element_names.attribute_placeholder(name) for name in names.values()):
      return names
    structure = _structure(self.nnx_class, self.args, constructor_kwargs)
    root = nnx.merge(structure.graphdef, structure.abstract_state)
    try:
      return element_names.resolve_attributes(element_names.resolve_owners(names, root) if owned else names, root)
    except ValueError as error:
      raise BridgeError(f'{self._label()}: {error}') from None

  def _label(self) -> str:
    """Names this wrapper in error messages: the NNX class and the Linen path."""
    name = getattr(self.nnx_class, '__name__', repr(self.nnx_class))
    if self.scope is None:  # not bound yet (an attribute read before any call)
      return f'to_linen({name})'
    return f"to_linen({name}) at '{'/'.join(self.scope.path) or '<root>'}'"

  def _construct(
      self, stream_names: tuple[str, ...], constructor_kwargs: tuple[tuple[str, tp.Any], ...]
  ) -> tuple[nnx.GraphDef, nnx.State]:
    """Runs the NNX `__init__` for real, keyed by Linen's rngs (a missing name uses 'params')."""
    rngs = nnx.Rngs(**{name: self.make_rng(name) for name in stream_names})
    return nnx.split(self.nnx_class(*self.args, **dict(constructor_kwargs), rngs=rngs))

  def _checked_values(
      self, flat_state: list[tuple[Path, tp.Any]], given: dict[LinenPath, tp.Any], names: dict[str, str]
  ) -> dict[Path, tp.Any]:
    """Maps the Linen variables onto the abstract state's paths after checking they match it."""
    expected = {_linen_path(path, var, names): (path, var) for path, var in flat_state if _stored(var)}
    unboxed = {linen_path: _unbox(leaf) for linen_path, leaf in given.items()}
    check_state(
        {linen_path: var.get_raw_value() for linen_path, (_, var) in expected.items()},
        unboxed,
        context=f'{self._label()}: the Linen variables do not match the NNX module',
    )
    return {path: unboxed[linen_path] for linen_path, (path, _) in expected.items()}

  def _rng_value(self, var: nnx.RngState) -> jax.Array:
    """A fresh key (or zero count) for an rng stream Variable, from Linen's rng of the same name."""
    shape = var.get_raw_value().shape
    if isinstance(var, nnx.RngCount):
      return jnp.zeros(shape, jnp.uint32)
    tag = var.get_metadata('tag')
    # An rng Linen was not given gets a placeholder; _check_rng_use fails the call if it is used.
    key = self.make_rng(tag) if self.scope.has_rng(tag) else jax.random.key(0)
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.wrap_key_data(key)
    return jax.random.split(key, shape) if shape else key

  def _check_rng_use(
      self, before: dict[Path, tp.Any], after: list[tuple[Path, nnx.Variable]]
  ) -> None:
    """Raises MissingRngError if the call drew from a stream whose rng Linen was not given."""
    missing = sorted({
        var.get_metadata('tag')
        for path, var in after
        if isinstance(var, nnx.RngState)
        and path in before
        and var.get_raw_value() is not before[path]
        and not self.scope.has_rng(var.get_metadata('tag'))
    })
    if missing:
      rngs = ', '.join(f"'{name}': key" for name in missing)
      raise MissingRngError(
          f'{self._label()} drew keys from rng stream(s) {missing}, but this Linen call was '
          f"not given an rng of that name (Linen's make_rng would fall back to 'params'). "
          f'Pass it: model.apply(variables, ..., rngs={{{rngs}}}), '
          f"or model.init({{'params': key, {rngs}}}, ...).",
          streams=tuple(missing),
      )

  def _write_changes(
      self,
      before: dict[Path, tp.Any],
      after: list[tuple[Path, nnx.Variable]],
      given: dict[LinenPath, tp.Any],
      names: dict[str, str],
  ) -> None:
    """Writes every non-rng leaf the call changed or created back to its Linen collection.

    During init only the leaves the call created (a decode cache, a sown value) are written, and only to the
    collections init keeps (Linen's init drops a sown value of any other); the constructed state is already
    stored, and changes to it are not (as Linen layers skip updates while `is_initializing()`)."""
    changes = {}
    initializing = self.is_initializing()
    for path, var in after:
      if isinstance(var, nnx.RngState) or var.get_raw_value() is before.get(path):
        continue
      linen_path = _linen_path(path, var, names)
      if path not in before:  # created by the call: a decode cache, `sow`
        if not initializing or self.is_mutable_collection(linen_path[0]):
          changes[linen_path] = linen_state.to_linen_leaf(var)
      elif initializing:
        continue
      elif isinstance(old := given[linen_path], meta.AxisMetadata):
        changes[linen_path] = old.replace_boxed(var.get_value())  # keep the caller's box
      else:
        changes[linen_path] = var.get_value()
    if changes:
      self._put(changes, base=traverse_util.flatten_dict(self.variables))

  def _put(self, leaves: dict[LinenPath, tp.Any], base: dict[LinenPath, tp.Any]) -> None:
    """Puts leaves into their Linen collections, or raises if any collection is immutable."""
    immutable = sorted(path for path in leaves if not self.is_mutable_collection(path[0]))
    if immutable:
      collections = sorted({path[0] for path in immutable})
      raise ImmutableCollectionError(
          f'{self._label()} wrote to {", ".join(map(path_str, immutable))}, but collection(s) '
          f'{collections} are immutable in this call, so the write would be lost. Pass '
          f'mutable={collections} to apply (or to init), and use the returned variables.'
      )
    merged = {**base, **leaves}
    for collection, name in sorted({path[:2] for path in leaves}):
      subtree = {path[2:]: leaf for path, leaf in merged.items() if path[:2] == (collection, name)}
      value = subtree[()] if () in subtree else traverse_util.unflatten_dict(subtree)
      self.put_variable(collection, name, value)


def is_instance(module: tp.Any, cls: type | tuple[type, ...]) -> bool:
  """`isinstance(module, cls)`, also True for a `to_linen` wrapper of `cls` (or of a subclass): a Linen parent that
  asked `isinstance(block, Block)` of what it built keeps its answer once `Block` is an NNX class it wraps."""
  if isinstance(module, cls):
    return True
  built = module.nnx_class if isinstance(module, ToLinen) else None
  return isinstance(built, type) and issubclass(built, cls)


def to_linen(
    nnx_class: tp.Callable[..., nnx.Module],
    *args: tp.Any,
    name: str | None = None,
    input_sizes: tp.Mapping[str, str] | None = None,
    traced_sizes: tp.Sequence[str] = (),
    traced_inputs: tp.Mapping[str, str] | None = None,
    linen_names: tp.Mapping[str, str] | None = None,
    **kwargs: tp.Any,
) -> ToLinen:
  """Wraps `nnx_class(*args, **kwargs, rngs=...)` as a Linen module that fails loudly on misuse.

  A mode argument in `kwargs` that `nnx_class` does not take (`train=False`,
  `deterministic=True`, ...: a switch the migration moved to `train()` / `eval()`) becomes
  `eval_mode`, so every call runs the module in that mode. `input_sizes` maps constructor
  keywords to the call argument whose last-axis size each one is, read at the first call;
  `traced_sizes` names constructor keywords that are the input sizes of layers inside the module, found by
  running the call abstractly (`size_probe`), as Linen layers learn theirs;
  `traced_inputs` maps constructor keywords that shape a variable of a module inside to the argument of that
  module's call whose last-axis size each one is, also found by that run;
  `linen_names` maps dotted NNX submodule paths to the Linen names their variables keep.
  """
  label = f'to_linen({getattr(nnx_class, "__name__", repr(nnx_class))})'
  eval_mode, kwargs = modes.take_mode_arguments(kwargs, nnx_class, where=label)
  return ToLinen(nnx_class, args=args, kwargs=tuple(kwargs.items()), eval_mode=eval_mode,
                 input_sizes=tuple((input_sizes or {}).items()), traced_sizes=tuple(traced_sizes),
                 traced_inputs=tuple((traced_inputs or {}).items()),
                 linen_names=tuple((linen_names or {}).items()), name=name)
