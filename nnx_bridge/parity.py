"""Side-by-side parity of a Linen model and its NNX port on transferred parameters.

`compare` copies the Linen variables into (a clone of) the NNX model through a TreeMapping, then
compares, leaf by leaf: the eval-mode forward outputs, the gradient of a scalar loss for every
parameter, the outputs and updated state (BatchNorm stats, caches) after one train-mode call,
and the sharding annotations. Both sides run at one matmul precision (`nnx_bridge.precision`), which
the report names with the backend. It works on objects, never on source text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from flax import traverse_util

from nnx_bridge import modes
from nnx_bridge import precision as precision_lib
from nnx_bridge import transfer
from nnx_bridge.treemap import TreeMapping
from nnx_bridge.treemap import normalize_path
from nnx_bridge.treemap import path_str


CHECKS = ('output', 'gradient', 'train output', 'train state')
"""What `compare` compares, in the order it reports them."""


@dataclasses.dataclass(frozen=True)
class Difference:
  """How far one NNX leaf is from its Linen counterpart."""

  check: str  # 'output', 'gradient', 'train output' or 'train state'
  path: str  # NNX path (or output path)
  source: str  # the Linen path(s) it is compared with
  shape: tuple[int, ...]
  max_abs: float
  max_rel: float
  ok: bool
  noise: float = 0.0  # at the backend's default precision: the Linen model's own difference from `highest`


@dataclasses.dataclass(frozen=True)
class ParamRow:
  """One row of the parameter-tree table."""

  linen: str
  nnx: str
  shape: tuple[int, ...]
  dtype: str


@dataclasses.dataclass(frozen=True)
class ShardingRow:
  """The partition spec of one NNX leaf and of its Linen source."""

  nnx: str
  linen: str
  nnx_spec: str
  linen_spec: str
  ok: bool


@dataclasses.dataclass(frozen=True)
class ParityReport:
  """The result of `compare`; `ok` when every difference is within tolerance and specs agree.

  `backend` and `precision` are where and at which matmul precision both sides ran (`nnx_bridge.precision`).
  """

  differences: tuple[Difference, ...]
  params: tuple[ParamRow, ...]
  sharding: tuple[ShardingRow, ...]
  atol: float
  rtol: float
  notes: tuple[str, ...] = ()
  backend: str = ''
  precision: str = precision_lib.HIGHEST

  @property
  def failures(self) -> tuple[Difference | ShardingRow, ...]:
    return tuple(d for d in (*self.differences, *self.sharding) if not d.ok)

  @property
  def ok(self) -> bool:
    return not self.failures

  @property
  def calibrated(self) -> bool:
    """Whether the tolerances include each leaf's noise (the backend's default precision)."""
    return self.precision == precision_lib.DEFAULT

  def to_dict(self) -> dict[str, tp.Any]:
    return {
        'ok': self.ok,
        'backend': self.backend,
        'precision': self.precision,
        'atol': self.atol,
        'rtol': self.rtol,
        'noise_factor': precision_lib.NOISE_FACTOR if self.calibrated else 0.0,
        'notes': list(self.notes),
        'params': [dataclasses.asdict(r) for r in self.params],
        'differences': [dataclasses.asdict(d) for d in self.differences],
        'sharding': [dataclasses.asdict(s) for s in self.sharding],
    }

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2)

  def to_text(self) -> str:
    lines = [precision_lib.describe(self.backend, self.precision), f'Parameter tree ({len(self.params)} leaves):']
    width = max([len(r.linen) for r in self.params] + [10])
    nnx_width = max([len(r.nnx) for r in self.params] + [8])
    lines.append(f'  {"Linen path":{width}}  {"NNX path":{nnx_width}}  shape / dtype')
    lines += [
        f'  {r.linen:{width}}  {r.nnx:{nnx_width}}  {r.dtype}{list(r.shape)}' for r in self.params
    ]
    for check in CHECKS:
      rows = [d for d in self.differences if d.check == check]
      if not rows:
        continue
      noise = f', + {precision_lib.NOISE_FACTOR:g} x noise' if self.calibrated else ''
      lines.append(f'{check} differences (atol={self.atol:g}, rtol={self.rtol:g}{noise}):')
      lines += [
          f'  {"ok  " if d.ok else "FAIL"} {d.path:{nnx_width}}  max|diff|={d.max_abs:.3e}  '
          f'max rel={d.max_rel:.3e}{f"  noise={d.noise:.1e}" if self.calibrated else ""}  ({d.source})'
          for d in rows
      ]
    if self.sharding:
      lines.append('partition specs:')
      lines += [
          f'  {"ok  " if s.ok else "FAIL"} {s.nnx:{nnx_width}}  nnx {s.nnx_spec}  linen {s.linen_spec} ({s.linen})'
          for s in self.sharding
      ]
    lines += [f'note: {note}' for note in self.notes]
    failures = self.failures
    lines.append(
        'RESULT: the NNX port matches the Linen model' if not failures
        else f'RESULT: MISMATCH in {len(failures)} leaves: '
        + ', '.join(sorted({getattr(f, "path", getattr(f, "nnx", "")) for f in failures}))
    )
    return '\n'.join(lines)


def _difference(check: str, path: str, source: str, got: tp.Any, want: tp.Any, atol: float, rtol: float,
                noise: float = 0.0) -> Difference:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  if got.shape != want.shape:
    return Difference(check, path, source, tuple(want.shape), float('inf'), float('inf'), False, noise)
  error = np.abs(got - want)
  max_abs = float(error.max(initial=0.0))
  max_rel = float((error / np.maximum(np.abs(want), np.finfo(np.float32).tiny)).max(initial=0.0))
  ok = precision_lib.within(got, want, atol=atol, rtol=rtol, noise=noise)
  return Difference(check, path, source, tuple(want.shape), max_abs, max_rel, ok, noise)


def _flat_outputs(tree: tp.Any) -> dict[str, tp.Any]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {path_str(normalize_path(p)) or 'output': leaf for p, leaf in leaves}


def _loss(outputs: tp.Any) -> jax.Array:
  """A scalar that depends on every floating output leaf."""
  leaves = [x for x in jax.tree.leaves(outputs) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
  return sum(jnp.mean(jnp.square(x)) for x in leaves)


def _identity_dropout(next_fun, args, kwargs, context):
  """Linen interceptor: Dropout returns its input (NNX and Linen draw different masks)."""
  if isinstance(context.module, nn.Dropout) and context.method_name == '__call__':
    return args[0]
  return next_fun(*args, **kwargs)


@contextlib.contextmanager
def _nnx_dropout_off() -> tp.Iterator[None]:
  """nnx.Dropout returns its input wherever it runs, also inside the nnx_bridge.to_linen wrappers of a Linen
  child, which build their NNX module at each call, out of `set_attributes`' reach (NNX and Linen draw
  different masks)."""
  call = nnx.Dropout.__call__
  nnx.Dropout.__call__ = lambda self, inputs, *args, **kwargs: inputs
  try:
    yield
  finally:
    nnx.Dropout.__call__ = call


def _spec_str(spec: tp.Any) -> str:
  return 'None' if spec is None else str(tuple(spec))


def _sharding_rows(linen_abstract, nnx_model, mapping: TreeMapping, rules) -> tuple[ShardingRow, ...]:
  linen_specs = {
      normalize_path(k): v
      for k, v in traverse_util.flatten_dict(nn.get_partition_spec(linen_abstract)).items()
  }
  # The declared names (logical or mesh axes), as Linen's get_partition_spec gives them;
  # nnx.get_partition_spec would already apply the logical rules of the current context.
  nnx_specs = {
      path: jax.sharding.PartitionSpec(*names)
      for path, var in transfer.flat_nnx_variables(nnx_model).items()
      if (names := var.get_metadata().get('out_sharding')) is not None
  }

  def mesh_axes(spec):
    if spec is None or not rules:
      return spec
    return nn.logical_to_mesh_axes(tuple(spec), rules)

  rows = []
  for rule in mapping.rules:
    nnx_spec = nnx_specs.get(rule.nnx)
    linen_spec = linen_specs.get(rule.linen[0])
    if not isinstance(nnx_spec, jax.sharding.PartitionSpec) or not nnx_spec:
      nnx_spec = None
    if not isinstance(linen_spec, jax.sharding.PartitionSpec) or not linen_spec:
      linen_spec = None
    if nnx_spec is None and linen_spec is None:
      continue
    nnx_mesh, linen_mesh = mesh_axes(nnx_spec), mesh_axes(linen_spec)
    rows.append(ShardingRow(
        path_str(rule.nnx),
        ', '.join(map(path_str, rule.linen)),
        _spec_str(nnx_mesh),
        _spec_str(linen_mesh),
        nnx_mesh is not None and linen_mesh is not None and tuple(nnx_mesh) == tuple(linen_mesh),
    ))
  return tuple(rows)


@dataclasses.dataclass(frozen=True)
class _Call:
  """What both models are called with in every check.

  `mutable` are the Linen collections other than params (a counter may be written even in eval
  mode); `streams` the keys of the Linen model's other rng streams.
  """

  inputs: tuple[tp.Any, ...]
  kwargs: dict[str, tp.Any]
  mutable: list[str]
  streams: dict[str, jax.Array]
  dropout_seed: int


Results = dict[str, dict[str, tp.Any]]
"""One side's results: check (one of CHECKS) -> {name: array}."""


def _linen_results(
    linen_module: nn.Module, arguments: modes.ModeArguments, variables: tp.Mapping[str, tp.Any], mapping: TreeMapping,
    call: _Call, *, gradients: bool, train: bool,
) -> Results:
  """The Linen side of every check, at the current matmul precision; NNX paths name gradients and state."""
  eval_module, eval_kwargs = modes.for_mode(linen_module, None, arguments, **modes.EVAL)
  apply = lambda v: eval_module.apply(v, *call.inputs, **eval_kwargs, **call.kwargs, mutable=call.mutable,
                                      rngs=call.streams)[0]
  results = {'output': _flat_outputs(apply(variables))}
  if gradients:
    params = variables['params']
    rest = {k: v for k, v in variables.items() if k != 'params'}
    grads = jax.grad(lambda p: _loss(apply({'params': p, **rest})))(params)
    mapped = mapping.only('params').linen_to_nnx(transfer.flat_linen({'params': grads}), allow_lossy=True)
    results['gradient'] = {path_str(path): value for path, value in mapped.items()}
  if train:
    train_module, train_kwargs = modes.for_mode(linen_module, None, arguments, **modes.TRAIN)
    with nn.intercept_methods(_identity_dropout):
      outputs, updates = train_module.apply(
          variables, *call.inputs, **train_kwargs, **call.kwargs, mutable=call.mutable,
          rngs={**call.streams, 'dropout': jax.random.key(call.dropout_seed)},
      )
    updated = transfer.flat_linen({**variables, **updates})
    state_mapping = TreeMapping(tuple(r for r in mapping.rules if any(key[0] != 'params' for key in r.linen)))
    state = state_mapping.linen_to_nnx({k: v for k, v in updated.items() if k in state_mapping.linen_keys})
    results['train output'] = _flat_outputs(outputs)
    results['train state'] = {path_str(path): value for path, value in state.items()}
  return results


def _random_train_results(linen_module: nn.Module, arguments: modes.ModeArguments, variables: tp.Mapping[str, tp.Any],
                          mapping: TreeMapping, call: _Call, want: Results) -> list[tuple[str, str]]:
  """The train-mode results of the Linen side that change with the keys of its other rng streams (wav2vec2's
  Gumbel sampling on 'gumbel'): run again with other keys, as (check, name). NNX draws those from its own
  nnx.Rngs, so they cannot be compared; the eval-mode output and the gradients still are."""
  if not call.streams:
    return []
  other = dataclasses.replace(call, streams={k: jax.random.fold_in(v, 1) for k, v in call.streams.items()})
  again = _linen_results(linen_module, arguments, variables, mapping, other, gradients=False, train=True)
  return [(check, name) for check in ('train output', 'train state') for name, value in want[check].items()
          if not np.array_equal(np.asarray(value), np.asarray(again[check][name]), equal_nan=True)]


def _nnx_results(model: nnx.Module, call: _Call, *, gradients: bool, train: bool) -> Results:
  """The NNX side of every check, at the current matmul precision: the eval-mode checks on fresh copies of
  `model`, then one train-mode call of `model` itself (dropout off), which leaves it in train mode."""
  eval_model = nnx.clone(model)
  eval_model.eval()
  results = {'output': _flat_outputs(eval_model(*call.inputs, **call.kwargs))}
  if gradients:
    grad_model = nnx.clone(model)
    grad_model.eval()
    grads = nnx.grad(lambda m: _loss(m(*call.inputs, **call.kwargs)))(grad_model)
    results['gradient'] = {path_str(normalize_path(p)): v.get_value() for p, v in nnx.to_flat_state(grads)}
  if train:
    model.train()
    # Linen Dropouts inside nnx_bridge.from_linen wrappers too, and NNX ones under their to_linen children
    with nn.intercept_methods(_identity_dropout), _nnx_dropout_off():
      results['train output'] = _flat_outputs(model(*call.inputs, **call.kwargs))
    results['train state'] = {path_str(p): v.get_value() for p, v in transfer.flat_nnx_variables(model).items()}
  return results


def _compared_names(check: str, want: dict[str, tp.Any], got: dict[str, tp.Any]) -> list[str]:
  """The names a check compares: every output of either side; the train-mode outputs both sides give (a
  train-mode call may return more, e.g. updated state); the Linen side's gradients and state otherwise."""
  if check == 'output':
    return sorted(want.keys() | got.keys())
  if check == 'train output':
    return sorted(want.keys() & got.keys())
  return sorted(want)


def _differences(want: Results, got: Results, reference: Results | None, sources: dict[str, str], atol: float,
                 rtol: float) -> list[Difference]:
  """Every compared leaf; with a `reference` (the Linen side at `highest`), each leaf's noise calibrates its tolerance."""
  differences = []
  for check in (c for c in CHECKS if c in want):
    for name in _compared_names(check, want[check], got[check]):
      source = 'output' if check.endswith('output') else sources[name]
      if name not in want[check] or name not in got[check]:
        differences.append(Difference(check, name, source, (), float('inf'), float('inf'), False))
        continue
      noise = 0.0
      if reference is not None and name in reference[check]:
        noise = precision_lib.noise(want[check][name], reference[check][name])
      differences.append(_difference(check, name, source, got[check][name], want[check][name], atol, rtol, noise))
  return differences


def _params_table(model: nnx.Module, by_nnx: dict[tuple[str, ...], str]) -> tuple[ParamRow, ...]:
  """The NNX parameters the mapping fills, with their Linen sources, shapes and dtypes."""
  return tuple(
      ParamRow(by_nnx[path], path_str(path), tuple(var.shape), str(var.dtype))
      for path, var in sorted(
          (p, v.get_value()) for p, v in transfer.flat_nnx_variables(model).items() if p in by_nnx
      )
  )


def compare(
    linen_module: nn.Module,
    variables: tp.Mapping[str, tp.Any],
    nnx_model: nnx.Module,
    *inputs: tp.Any,
    mapping: TreeMapping | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    train: bool = True,
    dropout_seed: int = 0,
    rng_streams: tp.Sequence[str] = (),
    logical_axis_rules: tp.Sequence[tuple[str, str | None]] | None = None,
    precision: str = precision_lib.HIGHEST,
    **call_kwargs: tp.Any,
) -> ParityReport:
  """Compares `linen_module` with `variables` against `nnx_model` given the same parameters.

  The NNX model is cloned, so the caller's model is not changed. The Linen side gets its
  train/eval arguments (the layer table's `MODE_ARGUMENTS`) set for each check; the NNX side
  gets `.eval()` / `.train()`. With `train`, one train-mode call is also compared, with
  dropout off on both sides (the two libraries derive different masks from the same seed).
  `call_kwargs` go to both calls. Without `mapping`, one is derived by tracing both models.
  `rng_streams` are the other rng streams the Linen model draws from (`self.make_rng('noise')`):
  each gets a key on the Linen side, while the NNX model draws from its own `nnx.Rngs`, so
  the outputs agree only where those draws do not change them: the train-mode results that
  change with those keys (the Linen model run again with others) are left out, and a note
  names them.

  `precision` is the matmul precision both sides run at (`nnx_bridge.precision`): `'highest'`, the
  same tolerances on every backend, or the backend's `'default'`, where the Linen model also runs
  at `'highest'` and each leaf may differ by `NOISE_FACTOR` times the difference between its two
  Linen results on top of `atol` and `rtol`. The report names the backend and the precision.
  """
  at_precision = precision_lib.matmul_precision(precision)  # an unknown precision is refused before any work
  model = nnx.clone(nnx_model)
  if mapping is None:
    from nnx_bridge import derive  # imported here: derive pulls in the tracing machinery

    eval_module, eval_kwargs = modes.for_mode(linen_module, None, modes.mode_arguments_of(linen_module), **modes.EVAL)
    mapping = derive.derive_mapping(eval_module, model, *inputs, **eval_kwargs, **call_kwargs)
  transfer.linen_to_nnx(variables, model, mapping)
  arguments = modes.mode_arguments_of(linen_module)
  eval_module, eval_kwargs = modes.for_mode(linen_module, None, arguments, **modes.EVAL)
  call = _Call(
      inputs, call_kwargs, [c for c in variables if c != 'params'],
      {name: jax.random.key(dropout_seed + 1 + i) for i, name in enumerate(rng_streams)}, dropout_seed,
  )
  checks = {'gradients': 'params' in variables, 'train': bool(train and arguments)}
  with at_precision:
    want = _linen_results(linen_module, arguments, variables, mapping, call, **checks)
    got = _nnx_results(model, call, **checks)
    # Shapes and metadata boxes only: the sharding annotations the Linen model declares.
    linen_abstract = jax.eval_shape(
        lambda: eval_module.init(jax.random.key(0), *inputs, **eval_kwargs, **call_kwargs)
    )
  random = _random_train_results(linen_module, arguments, variables, mapping, call, want) if checks['train'] else []
  for check, name in random:
    del want[check][name]
    got[check].pop(name, None)
  reference = None
  if precision == precision_lib.DEFAULT:
    with precision_lib.matmul_precision(precision_lib.HIGHEST):
      reference = _linen_results(linen_module, arguments, variables, mapping, call, **checks)
  by_nnx = {rule.nnx: ', '.join(map(path_str, rule.linen)) for rule in mapping.rules}
  sources = {path_str(path): source for path, source in by_nnx.items()}
  differences = _differences(want, got, reference, sources, atol, rtol)
  notes: list[str] = []
  if not checks['gradients']:
    notes.append('the Linen model has no parameters: no gradients to compare')
  if checks['train']:
    notes.append('the train-mode call runs with dropout off on both sides')
  elif train:
    notes.append('no train/eval argument found on the Linen module: train-mode call skipped')
  if random:
    notes.append(f'train-mode results not compared, as they change with the keys of the rng streams '
                 f'{", ".join(sorted(call.streams))} (which NNX draws from its own nnx.Rngs): '
                 f'{", ".join(f"{check} {name}" for check, name in random)}')
  return ParityReport(
      tuple(differences),
      _params_table(model, by_nnx),
      _sharding_rows(linen_abstract, model, mapping, logical_axis_rules),
      atol,
      rtol,
      tuple(notes),
      precision_lib.backend(),
      precision,
  )
