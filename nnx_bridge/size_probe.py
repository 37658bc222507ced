"""Input sizes an NNX constructor needs that no call argument shows, learned from one abstract run of the call.

A Linen layer learns its input size from its first input, wherever that input comes from; its NNX port takes
the size up front (`dense_in_features`). When a Linen parent builds the port through `to_linen`, the size of
an input the code reshapes, concatenates or computes first (HF's attention output `dense`, after the heads are
merged) is in no argument of the call. `traced_sizes` finds it the way Linen does, by running the call: the
module is built with a distinct placeholder for each such size (inside `jax.eval_shape`, so no array is
allocated) and called on the real inputs; a layer holding a placeholder as its `in_features` / `num_features`
takes the size from the last axis of its first argument when it is called, the placeholder is replaced by it
in every attribute and variable shape of the module, and the run goes on to the next layer. A size that shapes a
variable of a module's own (a migrated `self.param('kernel', init, (features, inputs.shape[-1]))`, GPT-2's
`FlaxConv1D`) is taken, when that module is called, from the last axis of the call argument `inputs` names for it.

A size no attribute or shape of the built module holds is unused (a layer not built, HF's tied decoder) and
gets 0. A size held but never reached by the run, or a run that fails, is a `BridgeError` naming the size:
nothing is guessed.
The sizes found are cached per class, constructor arguments and the call's shapes and static values.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import typing as tp

import jax
import jax.numpy as jnp
from flax import linen, nnx

from nnx_bridge.errors import BridgeError
from nnx_bridge.layer_spec import LAST_AXIS_SIZES

_GRANULE = 1024  # placeholders are odd multiples of it: far above any real layer width, distinct, and divisible by
_FIRST_PLACEHOLDER = _GRANULE * 1025  # the group counts a constructor checks them against (GroupNorm's 32 groups)
_LOCK = threading.Lock()  # the probe patches layer classes' __call__ for the length of one run
_CACHE_SIZE = 256
_cache: dict[tp.Hashable, dict[str, int]] = {}


def traced_sizes(nnx_class: tp.Callable[..., nnx.Module], args: tuple, kwargs: tuple[tuple[str, tp.Any], ...],
                 names: tp.Sequence[str], method: str, call_args: tuple, call_kwargs: dict[str, tp.Any],
                 where: str, inputs: tp.Mapping[str, str] | None = None) -> dict[str, int]:
  """The constructor keywords `names` of `nnx_class(*args, **dict(kwargs), <names>=..., rngs=...)`, each the
  input size of the layer it reaches, as the call `method(*call_args, **call_kwargs)` feeds it; a name `inputs`
  maps shapes a variable of a module inside, and is the last-axis size of that call argument of the module."""
  inputs = dict(inputs or {})
  key = _cache_key(nnx_class, args, kwargs, (*names, *sorted(inputs.items())), method, call_args, call_kwargs)
  if key is not None and key in _cache:
    return dict(_cache[key])
  widths = _Widths((*call_args, *call_kwargs.values()))
  placeholders = {name: _Placeholder(widths.next(), name, widths) for name in names}
  found: dict[str | tuple[str, int], int] = {}

  def run() -> None:
    module = nnx_class(*args, **dict(kwargs), **placeholders, rngs=AnyRngs(default=0))
    _linen_eagerly(module)
    by_value = {**{int(value): name for name, value in placeholders.items()}, **widths.elements}
    unused = set(by_value) - _visible(module)
    found.update((by_value[value], 0) for value in unused)  # a layer not built (a tied decoder): any size serves
    with _probing(module, by_value, inputs, found):
      getattr(module, method)(*call_args, **call_kwargs)

  try:
    jax.eval_shape(run)
  except BridgeError:
    raise
  except Exception as error:  # the user's code failed with a placeholder width: say which sizes were asked
    raise BridgeError(f'{where}: finding {", ".join(names)} by running the call failed '
                      f'({" ".join(str(error).split())[:300]}); give them to to_linen as keywords') from None
  found = _per_element(found, widths)
  missing = [name for name in names if name not in found]
  if missing:
    raise BridgeError(f'{where}: the call never ran a layer whose input size is {", ".join(missing)}, so it cannot '
                      'be found from the call; give it to to_linen as a keyword')
  if key is not None:
    if len(_cache) >= _CACHE_SIZE:
      _cache.clear()
    _cache[key] = dict(found)
  return found


class AnyRngs(nnx.Rngs):
  """An `nnx.Rngs` that creates every stream it is asked for: to learn the names a module uses, or to build it
  abstractly."""

  def _get_stream(self, name: str, error_type: type[Exception]) -> nnx.RngStream:
    if name not in vars(self):
      setattr(self, name, nnx.RngStream(0, tag=name))
    return vars(self)[name]


class _Widths:
  """Distinct odd widths far above any real layer width, none of them an axis of the call's arrays; and the
  widths handed out for elements of per-element sizes (`_Placeholder`), by value."""

  def __init__(self, call: tuple):
    self.taken = {d for leaf in jax.tree.leaves(call) for d in jnp.shape(leaf)}
    self.candidate = _FIRST_PLACEHOLDER
    self.elements: dict[int, tuple[str, int]] = {}  # width -> (size argument, element)
    self._of_element: dict[tuple[str, int], int] = {}

  def next(self) -> int:
    while self.candidate in self.taken:
      self.candidate += 2 * _GRANULE
    self.candidate += 2 * _GRANULE
    return self.candidate - 2 * _GRANULE

  def element(self, name: str, index: int) -> int:
    """The width of element `index` of the per-element size `name`, handed out when first asked for."""
    if (name, index) not in self._of_element:
      self._of_element[(name, index)] = width = self.next()
      self.elements[width] = (name, index)
    return self._of_element[(name, index)]


class _Placeholder(int):
  """The placeholder width of one size, which a constructor may also index: a size argument holding one size per
  element of a layer list (`tuple[int, ...]`, the migration's sizes of a loop whose input size changes) gives
  element k a width of its own, found as that element's layer runs."""

  def __new__(cls, value: int, name: str, widths: _Widths) -> _Placeholder:
    placeholder = super().__new__(cls, value)
    placeholder.name, placeholder.widths = name, widths
    return placeholder

  def __getitem__(self, index: int) -> int:
    if type(index) is not int or index < 0:
      raise TypeError(f'the per-element size {self.name} is indexed by {index!r}, not an element number')
    return self.widths.element(self.name, index)


def _per_element(found: dict[tp.Any, int], widths: _Widths) -> dict[str, tp.Any]:
  """`found` with the sizes of a per-element argument's elements gathered into its tuple, in element order."""
  indexed: dict[str, dict[int, int]] = {}
  for value, (name, index) in widths.elements.items():
    if (name, index) in found:
      indexed.setdefault(name, {})[index] = found[(name, index)]
  gathered = {name: size for name, size in found.items() if isinstance(name, str)}
  for name, sizes in indexed.items():
    if sorted(sizes) == list(range(len(sizes))):
      gathered[name] = tuple(sizes[k] for k in range(len(sizes)))
    else:
      gathered.pop(name, None)  # an element the run never reached: reported missing
  return gathered


@contextlib.contextmanager
def _probing(root: nnx.Module, by_value: dict[int, str], inputs: dict[str, str],
             found: dict[str, int]) -> tp.Iterator[None]:
  """Patches `__call__` of the classes of `root`'s submodules that hold a placeholder size: called, such a
  module settles each placeholder (`_settle`) from the last axis of its first argument (a layer's input-size
  attribute) or of the argument `inputs` names (a variable of its own), before it runs."""
  classes = {type(node) for _, node in nnx.iter_graph(root)
             if isinstance(node, nnx.Module) and _held(node, by_value, inputs)}

  def patched(original: tp.Callable[..., tp.Any]) -> tp.Callable[..., tp.Any]:
    def call(self, *args: tp.Any, **kwargs: tp.Any) -> tp.Any:
      for value, argument in _held(self, by_value, inputs):
        given = args[0] if argument is None and args else _argument(original, self, args, kwargs, argument)
        if given is not None and jnp.ndim(given):
          actual = int(jnp.shape(given)[-1])
          found[by_value[value]] = actual
          _settle(root, value, actual)
      return original(self, *args, **kwargs)
    return call

  with _LOCK:
    saved = {cls: cls.__dict__.get('__call__') for cls in classes}
    try:
      for cls in classes:
        cls.__call__ = patched(cls.__call__)
      yield
    finally:
      for cls, original in saved.items():
        if original is None:
          del cls.__call__
        else:
          cls.__call__ = original


def _held(module: nnx.Module, by_value: dict[int, str], inputs: dict[str, str]) -> list[tuple[int, str | None]]:
  """The placeholders `module` holds, each with the call argument whose last axis settles it: an input-size
  attribute of a layer (None: the first argument), or a dimension of a variable of its own (named by `inputs`)."""
  held = [(value, None) for attr in LAST_AXIS_SIZES
          if isinstance(value := vars(module).get(attr), int) and value in by_value]
  if isinstance(module, nnx.GroupNorm):  # its feature count is in its variables' shapes only
    held += [(value, None) for value in _group_norm_features(module) if value in by_value]
  for variable in vars(module).values():
    if isinstance(variable, nnx.Variable):
      held += [(d, inputs[by_value[d]]) for d in jnp.shape(variable.get_value())
               if d in by_value and by_value[d] in inputs and (d, inputs[by_value[d]]) not in held]
  return held


def _group_norm_features(norm: nnx.GroupNorm) -> set[int]:
  """The feature count of a GroupNorm, read off its scale and bias (it keeps no attribute of it)."""
  return {jnp.shape(v.get_value())[-1] for v in (getattr(norm, 'scale', None), getattr(norm, 'bias', None))
          if isinstance(v, nnx.Variable)}


def _argument(method: tp.Callable[..., tp.Any], module: nnx.Module, args: tuple, kwargs: dict[str, tp.Any],
              name: str) -> tp.Any:
  """The value the call `method(module, *args, **kwargs)` binds to its parameter `name`, or None."""
  try:
    bound = inspect.signature(method).bind(module, *args, **kwargs)
  except TypeError:
    return None
  return bound.arguments.get(name)


def _visible(root: nnx.Module) -> set[int]:
  """The ints of `root`'s submodules' attributes and of its variables' and arrays' shapes."""
  seen = set()
  for _, node in nnx.iter_graph(root):
    if isinstance(node, nnx.Variable):
      seen.update(jnp.shape(node.get_value()))
    elif hasattr(node, 'shape'):
      seen.update(node.shape)
    elif isinstance(node, nnx.Module):
      seen.update(value for value in vars(node).values() if isinstance(value, int))
  return seen


class _EagerLinen:
  """A Linen module the probed module was given (transformers' shared `embed_tokens`), used so that the variables
  it creates when first used (its setup() or call, during Linen's init) are computed outside the probe's abstract
  trace: Linen keeps them, and the real call that follows reuses them."""

  def __init__(self, module: linen.Module):
    self.module = module

  def __call__(self, *args: tp.Any, **kwargs: tp.Any) -> tp.Any:
    with jax.ensure_compile_time_eval():
      return self.module(*args, **kwargs)

  def __getattr__(self, name: str) -> tp.Any:
    with jax.ensure_compile_time_eval():
      return getattr(self.module, name)


def _linen_eagerly(root: nnx.Module) -> None:
  """Wraps every Linen module an attribute under `root` holds with `_EagerLinen`."""
  for _, node in list(nnx.iter_graph(root)):
    if isinstance(node, nnx.Module):
      for attr, value in list(vars(node).items()):
        if isinstance(value, linen.Module):
          setattr(node, attr, _EagerLinen(value))


def _settle(root: nnx.Module, placeholder: int, actual: int) -> None:
  """Replaces `placeholder` by `actual` in every int attribute and every variable's shape under `root`; a GroupNorm
  of that many features, which keeps no feature count but its group size, gets the group size of `actual`."""
  for _, node in list(nnx.iter_graph(root)):
    if isinstance(node, nnx.GroupNorm) and placeholder in _group_norm_features(node):
      node.group_size = actual // node.num_groups
  for _, node in nnx.iter_graph(root):
    if isinstance(node, nnx.Variable):
      value = node.get_value()
      shape = jnp.shape(value)
      if placeholder in shape:
        node.set_value(jnp.zeros(tuple(actual if d == placeholder else d for d in shape), jnp.result_type(value)))
    elif isinstance(node, nnx.Module):
      for attr, value in list(vars(node).items()):
        if isinstance(value, int) and not isinstance(value, bool) and value == placeholder:
          setattr(node, attr, actual)


def _cache_key(nnx_class: tp.Any, args: tuple, kwargs: tuple, names: tp.Sequence[str], method: str,
               call_args: tuple, call_kwargs: dict[str, tp.Any]) -> tp.Hashable | None:
  """The call's structure, shapes, dtypes and static values with the construction, or None if unhashable."""
  leaves, treedef = jax.tree.flatten((call_args, call_kwargs))
  described = tuple((jnp.shape(leaf), str(jnp.result_type(leaf))) if hasattr(leaf, 'shape') else leaf
                    for leaf in leaves)
  key = (nnx_class, args, kwargs, tuple(names), method, treedef, described)
  try:
    hash(key)
  except TypeError:
    return None
  return key
