"""Derives the leaf-by-leaf `TreeMapping` between a Linen model and its NNX port.

Both models are traced abstractly (no real arrays). The order in which each layer that owns
variables is first called pairs Linen layers with NNX layers (Linen auto-names such as
`Block_0/Dense_1` carry no meaning an NNX attribute name could match); the layer table's row of
a Linen layer class says how its leaves become the NNX layer's (renamed, fused, dropped, or
taken from another collection), and every leaf's collection, shape and dtype must then agree.
Layers the call order does not pair are paired by equal paths, then by a unique signature.
Whatever the evidence does not settle is refused with a MappingError instead of guessed.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import importlib
import inspect
import typing as tp

import jax
from flax import linen as nn
from flax import nnx

from nnx_bridge import collectionlib
from nnx_bridge import linen_state
from nnx_bridge import linen_trace
from nnx_bridge.errors import BridgeError
from nnx_bridge.layer_params import row_mapping
from nnx_bridge.layer_table import LAYERS, MODE_ARGUMENTS, LayerSpec, find_layer_of_class
from nnx_bridge.state_check import describe
from nnx_bridge.treemap import LeafRule, LinenKey, NNXPath, TreeMapping, normalize_path, path_str

Path = tuple[str, ...]
Method = str | tp.Callable[..., tp.Any] | None


class MappingError(BridgeError, ValueError):
  """The Linen variables and the NNX state cannot be paired leaf by leaf without guessing."""


_EXPLICIT = (
    'Write the mapping explicitly instead: a JSON file of "collection/linen/path": "nnx/path" '
    "entries in TreeMapping.to_json's format, read with TreeMapping.load (TreeMapping.save "
    'writes one to start from).'
)


# --- Leaves and layers -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, order=True)
class _Leaf:
  """What must agree between an NNX leaf and the Linen leaves it is made of."""

  collection: str
  shape: tuple[int, ...]
  dtype: str

  def __str__(self) -> str:
    text = describe(self)
    return text if self.collection == 'params' else f'{text} in {self.collection}'


@dataclasses.dataclass(frozen=True)
class _Source:
  """The Linen leaves one NNX leaf is made of (several: concatenated along `axis`)."""

  linen: tuple[LinenKey, ...]
  leaf: _Leaf
  axis: int | None = None

  def __str__(self) -> str:
    return f'{" + ".join(map(path_str, self.linen))} {self.leaf}'


@dataclasses.dataclass(frozen=True)
class _Layer:
  """A module that owns variables: a table row's layer with its whole subtree, else its own leaves.

  `kind` is the NNX class of the layer's row (None for other modules); `leaves` are relative NNX
  paths, for a Linen layer after the row's transforms; `sources` (Linen only) say where each
  comes from; `problems` are Linen leaves that do not fit the layer's row.
  """

  side: str
  path: Path
  cls: type | None
  kind: type | None
  leaves: tp.Mapping[Path, _Leaf]
  sources: tp.Mapping[Path, _Source] = dataclasses.field(default_factory=dict)
  dropped: tuple[LinenKey, ...] = ()
  problems: tuple[str, ...] = ()

  def __str__(self) -> str:
    name = self.cls.__name__ if self.cls else 'module'
    return f'{self.side} {path_str(self.path) or "<root>"} ({name})'

  def listing(self) -> str:
    """The layer's leaves with full paths, for error messages."""
    if self.sources:
      return ', '.join(map(str, self.sources.values()))
    return ', '.join(f'{path_str(self.path + rel)} {leaf}' for rel, leaf in self.leaves.items())

  def contents(self) -> str:
    """The layer's leaves relative to it, for error messages."""
    return ', '.join(f'{path_str(rel)} {leaf}' for rel, leaf in sorted(self.leaves.items()))

  def signature(self) -> tp.Hashable:
    """What two layers must share to be paired without names or call order: row and leaves."""
    if self.kind is None:
      return (None, tuple(sorted(self.leaves.values())))
    return (self.kind, tuple(sorted(self.leaves.items())))


def _leaf(collection: str, value: tp.Any) -> _Leaf:
  value = linen_state.raw_value(value)
  return _Leaf(collection, tuple(value.shape), str(value.dtype))


def _linen_leaves(variables: tp.Mapping[str, tp.Any]) -> dict[tuple[str, Path], _Leaf]:
  return {
      (collection, path): _leaf(collection, value)
      for (collection, path), value in linen_state.flat_linen_variables(variables).items()
  }


def _nnx_leaves(state: nnx.State) -> dict[NNXPath, _Leaf]:
  """Every non-rng leaf of an NNX state, by normalized path."""
  out = {}
  for path, variable in nnx.to_flat_state(state):
    if not isinstance(variable, nnx.Variable):
      raise MappingError(f'{path_str(normalize_path(path))} is not an nnx.Variable; pass nnx.state(model)')
    if not isinstance(variable, nnx.RngState):
      collection = collectionlib.collection_name(type(variable))
      out[normalize_path(path)] = _leaf(collection, variable.get_value())
  return out


@functools.cache
def _nnx_class(dotted: str) -> type:
  module, _, name = dotted.rpartition('.')
  return getattr(importlib.import_module(module), name)


def _nnx_kind(cls: type) -> type | None:
  """The NNX class of a layer row that `cls` is or derives from."""
  kinds = {_nnx_class(spec.nnx) for spec in LAYERS if spec.nnx is not None}
  return next((base for base in cls.__mro__ if base in kinds), None)


def _row_of(path: Path, row_paths: tp.Iterable[Path]) -> Path | None:
  """The row layer a leaf at `path` lies in, if any."""
  return next((row for row in row_paths if path[: len(row)] == row), None)


def _outermost(paths: tp.Iterable[Path]) -> list[Path]:
  paths = list(paths)
  return [p for p in paths if not any(q != p and p[: len(q)] == q for q in paths)]


def _linen_layers(variables: tp.Mapping[str, tp.Any], classes: tp.Mapping[Path, type]) -> dict[Path, _Layer]:
  rows = {path: spec for path, cls in classes.items() if (spec := find_layer_of_class(cls))}
  row_paths = _outermost(rows)
  owned: dict[Path, dict[tuple[str, Path], _Leaf]] = collections.defaultdict(dict)
  for (collection, path), leaf in _linen_leaves(variables).items():
    owner = _row_of(path, row_paths)
    owner = path[:-1] if owner is None else owner
    owned[owner][(collection, path[len(owner):])] = leaf
  return {
      path: (
          _row_layer(path, classes[path], rows[path], leaves)
          if path in row_paths
          else _custom_linen_layer(path, classes.get(path), leaves)
      )
      for path, leaves in owned.items()
  }


def _custom_linen_layer(path: Path, cls: type | None, leaves: dict[tuple[str, Path], _Leaf]) -> _Layer:
  names = linen_state.nnx_paths(leaves)
  sources = {names[key]: _Source(((key[0], *path, *key[1]),), leaf) for key, leaf in leaves.items()}
  return _Layer('Linen', path, cls, None, {rel: s.leaf for rel, s in sources.items()}, sources)


def _row_layer(path: Path, cls: type, spec: LayerSpec, leaves: dict[tuple[str, Path], _Leaf]) -> _Layer:
  """A Linen row layer, its leaves put through the row's renames, fuses, drops and collections."""

  def full(key: tuple[str, ...]) -> LinenKey:
    return (key[0], *path, *key[1:])

  by_key = {(collection, *rel): leaf for (collection, rel), leaf in leaves.items()}
  mapping, row_problems = row_mapping(spec, by_key)
  problems = [f'Linen {path_str(path)} ({spec.linen} row): {problem}' for problem in row_problems]
  sources: dict[Path, _Source] = {}
  for rule in mapping.rules:
    parts = [by_key[key] for key in rule.linen]
    if len(parts) == 1:
      sources[rule.nnx] = _Source((full(rule.linen[0]),), parts[0])
    elif len(set(parts)) != 1 or not parts[0].shape:
      problems.append(
          f'Linen {", ".join(f"{path_str(full(k))} {p}" for k, p in zip(rule.linen, parts))}: cannot '
          'fuse leaves of different shapes or dtypes into one NNX leaf'
      )
    else:
      shape = list(parts[0].shape)
      shape[rule.concat_axis] *= len(parts)
      leaf = dataclasses.replace(parts[0], shape=tuple(shape))
      sources[rule.nnx] = _Source(tuple(map(full, rule.linen)), leaf, rule.concat_axis)
  kind = _nnx_class(tp.cast(str, spec.nnx))
  leaf_map = {rel: s.leaf for rel, s in sources.items()}
  dropped = tuple(map(full, mapping.dropped))
  return _Layer('Linen', path, cls, kind, leaf_map, sources, dropped, tuple(problems))


def _nnx_layers(model: nnx.Module) -> dict[Path, _Layer]:
  modules = {normalize_path(path): type(module) for path, module in nnx.iter_modules(model)}
  kinds = {path: kind for path, cls in modules.items() if (kind := _nnx_kind(cls))}
  row_paths = _outermost(kinds)
  owned: dict[Path, dict[Path, _Leaf]] = collections.defaultdict(dict)
  for path, leaf in _nnx_leaves(nnx.state(model, nnx.Variable)).items():
    owner = _row_of(path, row_paths)
    if owner is None:  # the innermost module holding the leaf
      owner = next(path[:end] for end in range(len(path) - 1, -1, -1) if path[:end] in modules)
    owned[owner][path[len(owner):]] = leaf
  return {
      path: _Layer('NNX', path, modules[path], kinds[path] if path in row_paths else None, leaves)
      for path, leaves in owned.items()
  }


# --- Tracing the NNX call order (the Linen one: linen_trace.trace_linen) ---------------------


_UNSET = object()
_TRACE_PATH = '_derive_trace_path'
"""An attribute naming a module's path on the traced copy: static, so the copies NNX transforms (`nnx.scan`,
`nnx.vmap`, `nnx.remat`) merge inside their bodies carry it, where the module's identity is new."""


def _recorder(
    call: tp.Callable[..., tp.Any], paths: dict[int, Path], calls: list[Path]
) -> tp.Callable[..., tp.Any]:
  @functools.wraps(call)
  def recorded(self, *args, **kwargs):
    path = paths.get(id(self), getattr(self, _TRACE_PATH, None))
    if path is not None:
      calls.append(path)
    return call(self, *args, **kwargs)

  return recorded


@contextlib.contextmanager
def _recording_calls(
    classes: tp.Iterable[type], paths: dict[int, Path], calls: list[Path]
) -> tp.Iterator[None]:
  """Temporarily wraps each class's `__call__` to append the called module's path to `calls`."""
  found = {
      cls: next((base.__dict__['__call__'] for base in cls.__mro__ if '__call__' in base.__dict__), None)
      for cls in classes
  }
  saved = {cls: cls.__dict__.get('__call__', _UNSET) for cls, call in found.items() if call is not None}
  try:
    for cls in saved:
      setattr(cls, '__call__', _recorder(found[cls], paths, calls))
    yield
  finally:
    for cls, original in saved.items():
      if original is _UNSET:
        delattr(cls, '__call__')
      else:
        setattr(cls, '__call__', original)


def _nnx_call_kwargs(method: tp.Callable[..., tp.Any], call_kwargs: dict[str, tp.Any]) -> dict[str, tp.Any]:
  """The Linen call kwargs less the mode arguments the NNX method does not take (eval mode instead)."""
  parameters = inspect.signature(method).parameters
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
    return dict(call_kwargs)
  modes = {mode.name for mode in MODE_ARGUMENTS}
  return {k: v for k, v in call_kwargs.items() if k in parameters or k not in modes}


def _trace_nnx(
    model: nnx.Module, inputs: tuple[tp.Any, ...], method: Method, call_kwargs: dict[str, tp.Any]
) -> tuple[list[Path], Exception | None]:
  """The paths of the NNX modules' `__call__`s in order, on an abstract copy in eval mode.

  A failing forward pass returns the calls made before it failed, and the error.
  """
  name = '__call__' if method is None else method if isinstance(method, str) else method.__name__
  graphdef, state = nnx.split(model)
  paths: dict[int, Path] = {}
  calls: list[Path] = []

  def forward(state, *xs):
    copy = nnx.merge(graphdef, state)
    for path, module in nnx.iter_modules(copy):
      paths[id(module)] = normalize_path(path)
      object.__setattr__(module, _TRACE_PATH, paths[id(module)])
    copy.eval()
    bound = getattr(copy, name)
    bound(*xs, **_nnx_call_kwargs(bound, call_kwargs))

  with _recording_calls({type(m) for _, m in nnx.iter_modules(model)}, paths, calls):
    try:
      jax.eval_shape(forward, state, *inputs)
    except Exception as error:  # reported in the MappingError, never swallowed
      return calls, error
  return calls, None


# --- Matching ----------------------------------------------------------------------------------


def _first_calls(calls: list[Path], layers: tp.Mapping[Path, _Layer]) -> list[Path]:
  """Layer paths in the order of their first call (a shared layer counts once)."""
  return list(dict.fromkeys(path for path in calls if path in layers))


def _pair_leaves(linen: _Layer, nnx_layer: _Layer) -> tuple[list[LeafRule], list[str]]:
  """Rules for two paired layers' leaves: by name, then (custom modules) by a unique signature."""
  problems = list(linen.problems)
  if linen.kind is not None and nnx_layer.kind is not None and linen.kind is not nnx_layer.kind:
    kind = linen.kind
    return [], problems + [f'{linen} pairs with {nnx_layer}, not a {kind.__module__}.{kind.__qualname__}']
  expected, actual = dict(linen.sources), dict(nnx_layer.leaves)
  pairs = [(rel, rel) for rel in sorted(expected.keys() & actual.keys())]
  if linen.kind is None and nnx_layer.kind is None:
    by_leaf: dict[_Leaf, tuple[list[Path], list[Path]]] = collections.defaultdict(lambda: ([], []))
    for rel, source in expected.items():
      if rel not in actual:
        by_leaf[source.leaf][0].append(rel)
    for rel, leaf in actual.items():
      if rel not in expected:
        by_leaf[leaf][1].append(rel)
    for leaf, (linen_rels, nnx_rels) in by_leaf.items():
      if len(linen_rels) == len(nnx_rels) == 1:
        pairs.append((linen_rels[0], nnx_rels[0]))
      elif linen_rels and nnx_rels:
        problems.append(
            f'ambiguous: Linen {", ".join(path_str(expected[r].linen[0]) for r in linen_rels)} and '
            f'NNX {", ".join(path_str(nnx_layer.path + r) for r in nnx_rels)} are all {leaf} and '
            'their names differ'
        )
        for rel in linen_rels:
          del expected[rel]
        for rel in nnx_rels:
          del actual[rel]
  rules = []
  for linen_rel, nnx_rel in pairs:
    source, leaf = expected.pop(linen_rel), actual.pop(nnx_rel)
    nnx_path = nnx_layer.path + nnx_rel
    if source.leaf != leaf:
      problems.append(f'Linen {source} does not fit NNX {path_str(nnx_path)} {leaf}')
    else:
      rules.append(LeafRule(nnx_path, source.linen, source.axis))
  problems += [f'Linen {source} has no place in {nnx_layer}' for source in expected.values()]
  problems += [
      f'NNX {path_str(nnx_layer.path + rel)} {leaf} has no source in {linen}' for rel, leaf in actual.items()
  ]
  return rules, problems


def _name_conflicts(
    pairs: list[tuple[Path, Path]], linen: tp.Mapping[Path, _Layer], nnx_layers: tp.Mapping[Path, _Layer]
) -> list[str]:
  """Call-order pairs that equal paths on both sides contradict."""
  return [
      f'the call order pairs {linen[linen_path]} with {nnx_layers[nnx_path]}, but a layer of the '
      'same path exists on the other side: the names and the call order disagree'
      for linen_path, nnx_path in pairs
      if linen_path != nnx_path and (linen_path in nnx_layers or nnx_path in linen)
  ]


def _match(
    linen: dict[Path, _Layer],
    nnx_layers: dict[Path, _Layer],
    linen_calls: list[Path],
    nnx_calls: list[Path],
    layer_pairs: tp.Mapping[Path, Path],
) -> tuple[TreeMapping | None, list[str]]:
  """The mapping, or the problems that stop it (the first line says how layers were paired)."""
  pairs = [(a, b) for a, b in layer_pairs.items() if a in linen and b in nnx_layers]
  how = [f'{len(pairs)} layers paired by the given names'] if pairs else []
  linen_order = [p for p in _first_calls(linen_calls, linen) if p not in dict(pairs)]
  nnx_order = [p for p in _first_calls(nnx_calls, nnx_layers) if p not in {b for _, b in pairs}]
  problems: list[str] = []
  if linen_order and len(linen_order) == len(nnx_order):
    by_order = list(zip(linen_order, nnx_order))
    problems += _name_conflicts(by_order, linen, nnx_layers)
    pairs += by_order
    how.append(f'paired by call order ({len(by_order)} layers with variables called on each side)')
  elif linen_order or nnx_order or not pairs:
    how.append(
        f'no call order pairs the {"other " if pairs else ""}layers: Linen calls {len(linen_order)} layers with '
        f'variables, NNX {len(nnx_order)}; paired by equal paths, then by unique signatures'
    )
  rest_linen = [p for p in linen if p not in {lp for lp, _ in pairs}]
  rest_nnx = [p for p in nnx_layers if p not in {nnx_path for _, nnx_path in pairs}]
  for path in [p for p in rest_linen if p in rest_nnx]:
    pairs.append((path, path))
    rest_linen.remove(path)
    rest_nnx.remove(path)
  groups: dict[tp.Hashable, tuple[list[Path], list[Path]]] = collections.defaultdict(lambda: ([], []))
  for path in rest_linen:  # a layer that does not fit its own row is left unpaired
    groups[('unfit', path) if linen[path].problems else linen[path].signature()][0].append(path)
  for path in rest_nnx:
    groups[nnx_layers[path].signature()][1].append(path)
  for linen_paths, nnx_paths in groups.values():
    if len(linen_paths) == len(nnx_paths) == 1:
      pairs.append((linen_paths[0], nnx_paths[0]))
    elif linen_paths and nnx_paths:
      problems.append(
          f'ambiguous: {", ".join(str(linen[p]) for p in linen_paths)} and '
          f'{", ".join(str(nnx_layers[p]) for p in nnx_paths)} all hold {linen[linen_paths[0]].contents()}; '
          'neither the call order nor the names pair them'
      )
    else:
      for path in linen_paths:
        problems += [f'{linen[path]} has no NNX counterpart: {linen[path].listing()}', *linen[path].problems]
      problems += [f'{nnx_layers[p]} has no Linen counterpart: {nnx_layers[p].listing()}' for p in nnx_paths]
  rules: list[LeafRule] = []
  for linen_path, nnx_path in pairs:
    layer_rules, layer_problems = _pair_leaves(linen[linen_path], nnx_layers[nnx_path])
    rules += layer_rules
    problems += layer_problems
  if problems:
    return None, ['; '.join(how)] + problems
  dropped = sorted(key for linen_path, _ in pairs for key in linen[linen_path].dropped)
  return TreeMapping(tuple(sorted(rules, key=lambda rule: rule.nnx)), tuple(dropped)), []


def _wrapped_linen(
    variables: tp.Mapping[str, tp.Any], classes: tp.Mapping[Path, type], model: nnx.Module,
    linen_calls: list[Path], nnx_calls: list[Path],
) -> tuple[list[LeafRule], set[Path], set[Path]]:
  """Rules for the NNX model's `nnx_bridge.from_linen` wrappers: each holds a Linen module's variables under its
  own Linen paths, so it pairs with the Linen module whose subtree has exactly those leaves: the one at its own path
  if it fits (a migrated port keeps the Linen names of what it wraps), else the first in call order (several alike,
  e.g. same-shaped norms inside another wrapped module). Returns the rules and the Linen and NNX module paths they
  cover."""
  from nnx_bridge.linen_in_nnx import LinenModule  # the bridge builds on this module's tracing, not the reverse

  wrappers = [normalize_path(path) for path, module in nnx.iter_modules(model) if isinstance(module, LinenModule)]
  if not wrappers:
    return [], set(), set()
  linen = _linen_leaves(variables)
  nnx_leaves = _nnx_leaves(nnx.state(model, nnx.Variable))

  def subtree(prefix: Path) -> dict[tuple[str, Path], _Leaf]:
    return {(c, path[len(prefix):]): leaf for (c, path), leaf in linen.items() if path[:len(prefix)] == prefix}

  def fits(wrapper: Path, prefix: Path) -> bool:
    inner = subtree(prefix)
    held = {path[len(wrapper):]: leaf for path, leaf in nnx_leaves.items() if path[:len(wrapper)] == wrapper}
    targets = linen_state.nnx_paths(inner)
    return bool(inner) and {targets[key]: leaf for key, leaf in inner.items()} == held

  order = lambda calls, path: calls.index(path) if path in calls else len(calls)
  rules: list[LeafRule] = []
  covered_linen: set[Path] = set()
  for wrapper in sorted(wrappers, key=lambda path: order(nnx_calls, path)):
    candidates = sorted((p for p in classes if p not in covered_linen and fits(wrapper, p)),
                        key=lambda path: (path != wrapper, order(linen_calls, path)))  # its own name first
    if not candidates:
      continue
    prefix = candidates[0]
    covered_linen.add(prefix)
    targets = linen_state.nnx_paths(subtree(prefix))
    rules += [LeafRule((*wrapper, *target), ((c, *prefix, *rel),)) for (c, rel), target in targets.items()]
  return rules, covered_linen, set(wrappers)


def _refusal(reason: str, problems: list[str]) -> MappingError:
  lines = ''.join(f'\n  {problem}' for problem in problems)
  return MappingError(f'Cannot map the Linen variables onto the NNX state: {reason}{lines}\n{_EXPLICIT}')


# --- Public API --------------------------------------------------------------------------------


def mapping_by_path(
    linen_abstract_variables: tp.Mapping[str, tp.Any], nnx_abstract_state: nnx.State
) -> TreeMapping:
  """The identity mapping, for an NNX state laid out exactly like the Linen variables per module.

  Collections are regrouped as `linen_state` does (a name several collections use becomes
  `"<collection>:<name>"` outside `params`); every leaf must exist on both sides with the same
  collection, shape and dtype, else MappingError lists the ones that do not. RNG state is skipped.
  """
  linen = _linen_leaves(linen_abstract_variables)
  nnx_leaves = _nnx_leaves(nnx_abstract_state)
  targets = linen_state.nnx_paths(linen)
  rules, problems = [], []
  for (collection, path), leaf in sorted(linen.items()):
    key, target = (collection, *path), targets[(collection, path)]
    found = nnx_leaves.pop(target, None)
    if found is None:
      problems.append(f'Linen {path_str(key)} {leaf}: no NNX leaf at {path_str(target)}')
    elif found != leaf:
      problems.append(f'Linen {path_str(key)} {leaf} does not fit NNX {path_str(target)} {found}')
    else:
      rules.append(LeafRule(target, (key,)))
  problems += [
      f'NNX {path_str(p)} {leaf}: no Linen leaf at this path '
      f'({path_str((leaf.collection, *linen_state.linen_path_of(leaf.collection, p)))})'
      for p, leaf in sorted(nnx_leaves.items())
  ]
  if problems:
    raise _refusal('the paths do not agree', problems)
  return TreeMapping(tuple(sorted(rules, key=lambda rule: rule.nnx)))


def derive_mapping(
    linen_module: nn.Module,
    nnx_model: nnx.Module,
    *inputs: tp.Any,
    method: Method = None,
    layer_pairs: tp.Mapping[Path, Path] | None = None,
    **call_kwargs: tp.Any,
) -> TreeMapping:
  """The mapping from `linen_module`'s variables to `nnx_model`'s state, derived from abstract traces.

  `inputs` (arrays or `jax.ShapeDtypeStruct`s) and `call_kwargs` are what the Linen `method`
  (default `__call__`) takes; NNX's method of the same name gets the same inputs on an eval-mode
  copy, less the mode arguments (`train=`, ...) it does not take. `nnx_model` may be abstract
  (`nnx.eval_shape`). Tries `mapping_by_path` first, then pairs layers by call order; raises
  MappingError when the pairing is ambiguous or a leaf has no counterpart.

  `layer_pairs` (Linen module path -> NNX module path, e.g. from a `linen2nnx migrate` report's
  child names) is evidence that beats both: each pair naming a layer with variables on both
  sides is paired first, and only the other layers by call order (the `mapping_by_path`
  shortcut is skipped, since equal names would overrule the given ones).

  While it runs, the `__call__` of the NNX model's module classes is wrapped to record calls,
  so it must not run concurrently with other code calling those classes.
  """
  trace = linen_trace.trace_linen(linen_module, inputs, call_kwargs, method=method)
  variables, linen_calls, classes = trace.variables, trace.call_paths, trace.classes
  if not layer_pairs:
    try:
      return mapping_by_path(variables, nnx.state(nnx_model, nnx.Variable))
    except MappingError:
      pass  # the layouts differ: derive the pairing below
  nnx_calls, failure = _trace_nnx(nnx_model, inputs, method, call_kwargs)
  wrapped, linen_done, nnx_done = _wrapped_linen(variables, classes, nnx_model, linen_calls, nnx_calls)
  inside = lambda path, done: any(path[:len(prefix)] == prefix for prefix in done)
  mapping, problems = _match(
      {p: layer for p, layer in _linen_layers(variables, classes).items() if not inside(p, linen_done)},
      {p: layer for p, layer in _nnx_layers(nnx_model).items() if not inside(p, nnx_done)},
      [p for p in linen_calls if not inside(p, linen_done)], [p for p in nnx_calls if not inside(p, nnx_done)],
      layer_pairs or {},
  )
  if mapping is not None and wrapped:
    mapping = TreeMapping(tuple(sorted([*mapping.rules, *wrapped], key=lambda rule: rule.nnx)), mapping.dropped)
  if failure is not None:
    first_line = next(iter(str(failure).strip().splitlines()), '')
    raise _refusal(
        f'the NNX forward pass failed ({type(failure).__name__}: {first_line}); make the NNX model '
        'run on the same inputs.' + (' What the calls before the failure show:' if problems else ''),
        problems,
    ) from failure
  if mapping is None:
    raise _refusal(problems[0] + '.', problems[1:])
  return mapping
