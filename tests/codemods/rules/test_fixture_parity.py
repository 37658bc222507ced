"""Every `fixtures/L2N*/<case>.parity.json`: the Linen classes of `<case>.in.py` against their NNX ports in `<case>.out.py`.

A sidecar is a JSON list of models. For each, the Linen class is built from `.in.py` and initialised on the
inputs, the NNX class is built from `.out.py` with the same fields plus the size arguments the report asks
for, and `nnx_bridge.compare` moves the Linen variables into the NNX model and compares the outputs, every
parameter's gradient and the updated state, in eval and in train mode. Keys of an entry:

- `class`: the class name, the same in both files.
- `fields`: a list (positional) or an object (keywords); a value `{"class": "Config", "fields": ...}` is that
  class of the same file built with those fields, a list is a tuple.
- `sizes`: the NNX constructor's extra keyword arguments; `{"inputs": [0]}` is the tuple of those inputs (the
  example inputs of a Linen child the port wraps).
- `inputs`: `"float32[2,5]"` normal draws, `"int32[3,6]:10"` integers below 10 (as `linen2nnx verify --input`
  writes them); any other JSON value is that array.
- `mode`: the train/eval keyword arguments Linen's init needs; with them, no check may be skipped.
- `rng_streams`: the other rng streams the Linen model draws from in a call (`self.make_rng('sing_vec')`), given
  to `compare`, which gives each a key.
- `nnx_args`: `"linen fields"` builds the NNX class with every field of the Linen module, defaults included,
  positionally: the port keeps Linen's field order.
- `atol` (compare's tolerance), `perturb` (Linen variables shifted by random amounts first, standing in for
  trained weights, so that zero biases cannot hide a wrong mapping), `gradients` (how many parameter
  gradients are compared, or `"all"`: one for every NNX parameter), `same_param_count` (default true: as many
  NNX parameters as Linen leaves), `linen_children` (Linen's top-level params, all of them mapped),
  `same_shapes` (every mapped leaf keeps its Linen shape), `layer_pairs` (Linen/NNX child paths given to
  `derive_mapping`, as `linen2nnx verify --migrate-report` gives them).
- `id` (tells entries of one class apart), `note` (why, for the reader), `decode_caches` (the Linen and NNX
  paths of each attention holding a decode cache, read by tests/codemods/rules/l2n002/test_decode_cache.py).
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
import runpy
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import nnx_bridge

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / 'fixtures'
_KEYS = {'class', 'fields', 'sizes', 'inputs', 'mode', 'rng_streams', 'nnx_args', 'atol', 'perturb', 'gradients', 'same_param_count',
         'linen_children', 'same_shapes', 'layer_pairs', 'id', 'note', 'decode_caches'}
_DRAWN = re.compile(r'^(?P<dtype>\w+)\[(?P<shape>[\d,]*)\](?::(?P<max>\d+))?$')


def _sidecars() -> list[pathlib.Path]:
  return sorted(FIXTURES.glob('L2N*/*.parity.json'))


def spec(case: str, name: str | None = None, entry_id: str | None = None) -> dict[str, tp.Any]:
  """The one entry of class `name` (and id `entry_id`) in `fixtures/<case>.parity.json`; `case` as 'L2N002/rnn_gru'."""
  entries = json.loads((FIXTURES / f'{case}.parity.json').read_text())
  (entry,) = [e for e in entries if name in (None, e['class']) and entry_id in (None, e.get('id'))]
  return entry


def wrong_port(case: str, old: str, new: str, folder: pathlib.Path) -> dict[str, tp.Any]:
  """The globals of `case`'s `.out.py` with `old` replaced by `new` (a port wrong on purpose), written to and run
  from `folder`; fails when `old` is not in it."""
  text = (FIXTURES / f'{case}.out.py').read_text()
  assert old in text, old
  (folder / 'port.py').write_text(text.replace(old, new))
  return runpy.run_path(str(folder / 'port.py'))


@functools.cache
def _namespace(path: pathlib.Path) -> dict[str, tp.Any]:
  """The globals of a fixture file, run once per test process."""
  return runpy.run_path(str(path))


def _inputs(entry: dict[str, tp.Any]) -> tuple[jax.Array, ...]:
  """The entry's inputs: input i drawn from key i."""
  arrays = []
  for i, value in enumerate(entry['inputs']):
    drawn = _DRAWN.match(value) if isinstance(value, str) else None
    if drawn is None:
      arrays.append(jnp.asarray(value))
      continue
    shape, dtype = tuple(int(d) for d in drawn['shape'].split(',') if d), jnp.dtype(drawn['dtype'])
    key = jax.random.key(i)
    if drawn['max']:
      arrays.append(jax.random.randint(key, shape, 0, int(drawn['max']), dtype))
    else:
      arrays.append(jax.random.normal(key, shape, dtype))
  return tuple(arrays)


def _value(value: tp.Any, scope: dict[str, tp.Any], xs: tuple[jax.Array, ...]) -> tp.Any:
  if isinstance(value, dict) and set(value) == {'class', 'fields'}:
    return _construct(scope[value['class']], value['fields'], scope, xs)
  if isinstance(value, dict) and set(value) == {'inputs'}:
    return tuple(xs[i] for i in value['inputs'])
  if isinstance(value, list):
    return tuple(_value(v, scope, xs) for v in value)
  return value


def _construct(cls: tp.Any, fields: tp.Any, scope: dict[str, tp.Any], xs: tuple[jax.Array, ...], **extra: tp.Any):
  if isinstance(fields, dict):
    return cls(**{k: _value(v, scope, xs) for k, v in fields.items()}, **extra)
  return cls(*(_value(v, scope, xs) for v in fields), **extra)


def _perturbed(variables: tp.Any, seed: int = 0) -> tp.Any:
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: x + jnp.asarray(rng.uniform(0.1, 0.5, x.shape), x.dtype), variables)


def models(case: str, entry: dict[str, tp.Any],
           perturb: bool | None = None) -> tuple[nn.Module, tp.Any, nnx.Module, tuple[jax.Array, ...]]:
  """(Linen module, its variables, the NNX model, the inputs) for one entry of `case`'s sidecar; `perturb`
  overrides the entry's."""
  assert set(entry) <= _KEYS, set(entry) - _KEYS
  xs = _inputs(entry)
  linen_ns, nnx_ns = _namespace(FIXTURES / f'{case}.in.py'), _namespace(FIXTURES / f'{case}.out.py')
  name = entry['class']
  linen_module = _construct(linen_ns[name], entry.get('fields', []), linen_ns, xs)
  variables = linen_module.init(jax.random.key(0), *xs, **entry.get('mode', {}))
  if entry.get('perturb', False) if perturb is None else perturb:
    variables = _perturbed(variables)
  sizes = {k: _value(v, nnx_ns, xs) for k, v in entry.get('sizes', {}).items()}
  rngs = nnx.Rngs(0, dropout=1)
  if entry.get('nnx_args') == 'linen fields':
    fields = [getattr(linen_module, f) for f in linen_ns[name].__dataclass_fields__ if f not in ('parent', 'name')]
    nnx_model = nnx_ns[name](*fields, **sizes, rngs=rngs)
  else:
    nnx_model = _construct(nnx_ns[name], entry.get('fields', []), nnx_ns, xs, **sizes, rngs=rngs)
  return linen_module, variables, nnx_model, xs


def _mapping(linen_module, nnx_model, xs, entry: dict[str, tp.Any]):
  """The mapping `compare` would derive, or one from the entry's layer pairs; None when no check needs it."""
  if 'layer_pairs' in entry:
    pairs = {tuple(linen): tuple(port) for linen, port in entry['layer_pairs']}
    return nnx_bridge.derive_mapping(linen_module, nnx_model, *xs, layer_pairs=pairs)
  if entry.get('linen_children') or entry.get('same_shapes'):
    return nnx_bridge.derive_mapping(linen_module, nnx_model, *xs)
  return None


def _params(model: nnx.Module) -> list[tuple[tp.Any, ...]]:
  return [path for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))]


def _cases() -> list[tp.Any]:
  params = []
  for sidecar in _sidecars():
    case = str(sidecar.relative_to(FIXTURES))[:-len('.parity.json')]
    for entry in json.loads(sidecar.read_text()):
      label = '-'.join(filter(None, (entry['class'], entry.get('id'))))
      params.append(pytest.param(case, entry, id=f'{case}:{label}'))
  return params


@pytest.mark.parametrize('case, entry', _cases())
def test_port_matches_linen(case, entry):
  linen_module, variables, nnx_model, xs = models(case, entry)
  mapping = _mapping(linen_module, nnx_model, xs, entry)
  if entry.get('linen_children'):
    children = set(entry['linen_children'])
    assert set(variables['params']) == children
    assert {rule.linen[0][1] for rule in mapping.rules} == children
  if entry.get('same_shapes'):
    flat = dict(nnx.to_flat_state(nnx.state(nnx_model, nnx.Param)))
    for rule in mapping.rules:  # the layout transfers as it is (stacked ensembles and scans included)
      linen_leaf = variables['params']
      for key in rule.linen[0][1:]:
        linen_leaf = linen_leaf[key]
      assert flat[rule.nnx][...].shape == linen_leaf.shape, rule
  report = nnx_bridge.compare(linen_module, variables, nnx_model, *xs, mapping=mapping,
                              rng_streams=entry.get('rng_streams', ()),
                              **({'atol': entry['atol']} if 'atol' in entry else {}))
  assert report.ok, report.to_text()
  assert {'output', 'gradient'} <= {d.check for d in report.differences}
  assert not any('skipped' in note for note in report.notes) or not entry.get('mode')
  gradients = [d for d in report.differences if d.check == 'gradient']
  if entry.get('gradients') == 'all':
    assert {d.path for d in gradients} == {'/'.join(map(str, p)) for p in _params(nnx_model)}
  elif 'gradients' in entry:
    assert len(gradients) == entry['gradients']
  if entry.get('same_param_count', True):
    assert len(_params(nnx_model)) == len(jax.tree.leaves(variables['params']))


def test_every_sidecar_belongs_to_a_case_and_names_its_classes():
  for sidecar in _sidecars():
    case = sidecar.with_name(sidecar.name.replace('.parity.json', '.in.py'))
    assert case.exists(), sidecar
    entries = json.loads(sidecar.read_text())
    assert entries and all(set(e) <= _KEYS for e in entries), sidecar
    labels = [(e['class'], e.get('id')) for e in entries]
    assert len(set(labels)) == len(labels), f'{sidecar}: give entries of one class an id'
