"""Side-by-side parity of a Linen model and its NNX port on transferred parameters.

`compare` copies the Linen variables into (a clone of) the NNX model through a TreeMapping, then
compares, leaf by leaf: the eval-mode forward outputs, the gradient of a scalar loss for every
parameter, the outputs and updated state (BatchNorm stats, caches) after one train-mode call,
and the sharding annotations. It works on objects, never on source text.
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
from nnx_bridge import transfer
from nnx_bridge.treemap import TreeMapping
from nnx_bridge.treemap import normalize_path
from nnx_bridge.treemap import path_str


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
  """The result of `compare`; `ok` when every difference is within tolerance and specs agree."""

  differences: tuple[Difference, ...]
  params: tuple[ParamRow, ...]
  sharding: tuple[ShardingRow, ...]
  atol: float
  rtol: float
  notes: tuple[str, ...] = ()

  @property
  def failures(self) -> tuple[Difference | ShardingRow, ...]:
    return tuple(d for d in (*self.differences, *self.sharding) if not d.ok)

  @property
  def ok(self) -> bool:
    return not self.failures

  def to_dict(self) -> dict[str, tp.Any]:
    return {
        'ok': self.ok,
        'atol': self.atol,
        'rtol': self.rtol,
        'notes': list(self.notes),
        'params': [dataclasses.asdict(r) for r in self.params],
        'differences': [dataclasses.asdict(d) for d in self.differences],
        'sharding': [dataclasses.asdict(s) for s in self.sharding],
    }

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2)

  def to_text(self) -> str:
    lines = [f'Parameter tree ({len(self.params)} leaves):']
    width = max([len(r.linen) for r in self.params] + [10])
    nnx_width = max([len(r.nnx) for r in self.params] + [8])
    lines.append(f'  {"Linen path":{width}}  {"NNX path":{nnx_width}}  shape / dtype')
    lines += [
        f'  {r.linen:{width}}  {r.nnx:{nnx_width}}  {r.dtype}{list(r.shape)}' for r in self.params
    ]
    for check in ('output', 'gradient', 'train output', 'train state'):
      rows = [d for d in self.differences if d.check == check]
      if not rows:
        continue
      lines.append(f'{check} differences (atol={self.atol:g}, rtol={self.rtol:g}):')
      lines += [
          f'  {"ok  " if d.ok else "FAIL"} {d.path:{nnx_width}}  max|diff|={d.max_abs:.3e}  '
          f'max rel={d.max_rel:.3e}  ({d.source})'
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


def _difference(check: str, path: str, source: str, got: tp.Any, want: tp.Any, atol: float, rtol: float) -> Difference:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  if got.shape != want.shape:
    return Difference(check, path, source, tuple(want.shape), float('inf'), float('inf'), False)
  error = np.abs(got - want)
  max_abs = float(error.max(initial=0.0))
  max_rel = float((error / np.maximum(np.abs(want), np.finfo(np.float32).tiny)).max(initial=0.0))
  ok = bool(np.all(error <= atol + rtol * np.abs(want)))
  return Difference(check, path, source, tuple(want.shape), max_abs, max_rel, ok)


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
  """What both models are called with in every check, and the tolerances their results must meet.

  `mutable` are the Linen collections other than params (a counter may be written even in eval
  mode); `streams` the keys of the Linen model's other rng streams.
  """

  inputs: tuple[tp.Any, ...]
  kwargs: dict[str, tp.Any]
  mutable: list[str]
  streams: dict[str, jax.Array]
  atol: float
  rtol: float


def _compare_eval_outputs(
    eval_module: nn.Module, eval_kwargs: dict[str, bool], variables: tp.Mapping[str, tp.Any], model: nnx.Module,
    call: _Call,
) -> list[Difference]:
  """The eval-mode forward outputs, on a fresh copy of the transferred model."""
  linen_out, _ = eval_module.apply(variables, *call.inputs, **eval_kwargs, **call.kwargs, mutable=call.mutable,
                                   rngs=call.streams)
  eval_model = nnx.clone(model)
  eval_model.eval()
  nnx_out = eval_model(*call.inputs, **call.kwargs)
  want, got = _flat_outputs(linen_out), _flat_outputs(nnx_out)
  differences = []
  for name in sorted(want.keys() | got.keys()):
    if name not in want or name not in got:
      differences.append(Difference('output', name, 'output', (), float('inf'), float('inf'), False))
    else:
      differences.append(_difference('output', name, 'output', got[name], want[name], call.atol, call.rtol))
  return differences


def _compare_gradients(
    eval_module: nn.Module, eval_kwargs: dict[str, bool], variables: tp.Mapping[str, tp.Any], model: nnx.Module,
    mapping: TreeMapping, by_nnx: dict[tuple[str, ...], str], call: _Call,
) -> list[Difference]:
  """The gradients of one scalar loss for every parameter, in eval mode, on a fresh copy of the model."""
  params = variables['params']
  rest = {k: v for k, v in variables.items() if k != 'params'}
  linen_grads = jax.grad(
      lambda p: _loss(eval_module.apply({'params': p, **rest}, *call.inputs, **eval_kwargs, **call.kwargs,
                                      mutable=call.mutable, rngs=call.streams)[0])
  )(params)
  want_grads = mapping.only('params').linen_to_nnx(
      transfer.flat_linen({'params': linen_grads}), allow_lossy=True
  )
  grad_model = nnx.clone(model)
  grad_model.eval()
  nnx_grads = nnx.grad(lambda m: _loss(m(*call.inputs, **call.kwargs)))(grad_model)
  got_grads = {normalize_path(p): v.get_value() for p, v in nnx.to_flat_state(nnx_grads)}
  return [
      _difference(
          'gradient', path_str(path), by_nnx[path], got_grads.get(path, np.full(np.shape(want_grads[path]), np.nan)),
          want_grads[path], call.atol, call.rtol,
      )
      for path in sorted(want_grads)
  ]


def _compare_train_call(
    linen_module: nn.Module, arguments: modes.ModeArguments, variables: tp.Mapping[str, tp.Any], model: nnx.Module,
    mapping: TreeMapping, by_nnx: dict[tuple[str, ...], str], dropout_seed: int, call: _Call,
) -> list[Difference]:
  """One train-mode call with dropout off on both sides: outputs and updated state. Leaves `model` in train mode."""
  train_module, train_kwargs = modes.for_mode(linen_module, None, arguments, **modes.TRAIN)
  with nn.intercept_methods(_identity_dropout):
    linen_train_out, updates = train_module.apply(
        variables, *call.inputs, **train_kwargs, **call.kwargs, mutable=call.mutable,
        rngs={**call.streams, 'dropout': jax.random.key(dropout_seed)},
    )
  model.train()
  # Linen Dropouts inside nnx_bridge.from_linen wrappers too, and NNX ones under their to_linen children
  with nn.intercept_methods(_identity_dropout), _nnx_dropout_off():
    nnx_train_out = model(*call.inputs, **call.kwargs)
  want, got = _flat_outputs(linen_train_out), _flat_outputs(nnx_train_out)
  differences = [
      _difference('train output', name, 'output', got[name], want[name], call.atol, call.rtol)
      for name in sorted(want.keys() & got.keys())
  ]
  updated = transfer.flat_linen({**variables, **updates})
  state_mapping = TreeMapping(
      tuple(r for r in mapping.rules if any(key[0] != 'params' for key in r.linen))
  )
  want_state = state_mapping.linen_to_nnx({k: v for k, v in updated.items() if k in state_mapping.linen_keys})
  got_state = {p: v.get_value() for p, v in transfer.flat_nnx_variables(model).items()}
  differences += [
      _difference('train state', path_str(path), by_nnx[path], got_state[path], want_state[path], call.atol, call.rtol)
      for path in sorted(want_state)
  ]
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
  the outputs agree only where those draws do not change them.
  """
  model = nnx.clone(nnx_model)
  if mapping is None:
    from nnx_bridge import derive  # imported here: derive pulls in the tracing machinery

    eval_module, eval_kwargs = modes.for_mode(linen_module, None, modes.mode_arguments_of(linen_module), **modes.EVAL)
    mapping = derive.derive_mapping(eval_module, model, *inputs, **eval_kwargs, **call_kwargs)
  transfer.linen_to_nnx(variables, model, mapping)
  arguments = modes.mode_arguments_of(linen_module)
  by_nnx = {rule.nnx: ', '.join(map(path_str, rule.linen)) for rule in mapping.rules}
  call = _Call(
      inputs, call_kwargs, [c for c in variables if c != 'params'],
      {name: jax.random.key(dropout_seed + 1 + i) for i, name in enumerate(rng_streams)}, atol, rtol,
  )
  eval_module, eval_kwargs = modes.for_mode(linen_module, None, arguments, **modes.EVAL)
  differences = _compare_eval_outputs(eval_module, eval_kwargs, variables, model, call)
  notes: list[str] = []
  if 'params' in variables:
    differences += _compare_gradients(eval_module, eval_kwargs, variables, model, mapping, by_nnx, call)
  else:
    notes.append('the Linen model has no parameters: no gradients to compare')
  if train and arguments:
    differences += _compare_train_call(linen_module, arguments, variables, model, mapping, by_nnx, dropout_seed, call)
    notes.append('the train-mode call runs with dropout off on both sides')
  elif train:
    notes.append('no train/eval argument found on the Linen module: train-mode call skipped')

  # Shapes and metadata boxes only: the sharding annotations the Linen model declares.
  linen_abstract = jax.eval_shape(
      lambda: eval_module.init(jax.random.key(0), *inputs, **eval_kwargs, **call_kwargs)
  )
  return ParityReport(
      tuple(differences),
      _params_table(model, by_nnx),
      _sharding_rows(linen_abstract, model, mapping, logical_axis_rules),
      atol,
      rtol,
      tuple(notes),
  )
