"""parity.compare: a right port passes, and each kind of wrong port is caught, with its paths."""

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import nnx

from nnx_bridge import parity
from nnx_bridge.treemap import LeafRule
from nnx_bridge.treemap import TreeMapping
from tests.test_transfer import MAPPING
from tests.test_transfer import X
from tests.test_transfer import LinenMLP
from tests.test_transfer import NNXMLP


@pytest.fixture(scope='module')
def variables():
  return LinenMLP().init(jax.random.key(0), X)


def test_right_port_passes_every_check(variables):
  report = parity.compare(LinenMLP(), variables, NNXMLP(nnx.Rngs(0)), X, mapping=MAPPING)
  assert report.ok, report.to_text()
  checks = {d.check for d in report.differences}
  assert checks == {'output', 'gradient', 'train output', 'train state'}
  assert {d.path for d in report.differences if d.check == 'gradient'} == {
      'linear1/kernel', 'linear1/bias', 'bn/scale', 'bn/bias', 'linear2/kernel', 'linear2/bias'
  }
  assert {d.path for d in report.differences if d.check == 'train state'} == {'bn/mean', 'bn/var'}
  assert ('params/Dense_0/kernel', 'linear1/kernel') in {(r.linen, r.nnx) for r in report.params}
  assert 'RESULT: the NNX port matches' in report.to_text()


def test_callers_model_is_not_changed(variables):
  model = NNXMLP(nnx.Rngs(0))
  before = model.linear1.kernel[...]
  parity.compare(LinenMLP(), variables, model, X, mapping=MAPPING)
  assert (model.linear1.kernel[...] == before).all()


class TransposedMiddle(NNXMLP):
  def __init__(self, rngs):
    super().__init__(rngs)
    self.linear2 = nnx.Linear(4, 4, rngs=rngs)  # square, so a transposed read still runs

  def __call__(self, x):
    h = self.bn(self.linear1(x))
    h = nnx.relu(h) @ self.linear2.kernel[...].T + self.linear2.bias[...]
    return h


class SquareLinen(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(4)(x)
    x = nn.BatchNorm(use_running_average=not train)(x)
    return nn.Dense(4)(nn.relu(x))


def test_transposed_kernel_is_caught_on_its_gradient_and_output():
  variables = SquareLinen().init(jax.random.key(0), X)
  report = parity.compare(SquareLinen(), variables, TransposedMiddle(nnx.Rngs(0)), X, mapping=MAPPING)
  assert not report.ok
  failed = {(d.check, d.path) for d in report.failures}
  assert ('output', 'output') in failed
  assert ('gradient', 'linear2/kernel') in failed
  assert 'MISMATCH' in report.to_text() and 'linear2/kernel' in report.to_text()


class WrongMomentum(NNXMLP):
  def __init__(self, rngs):
    super().__init__(rngs)
    self.bn = nnx.BatchNorm(4, momentum=0.5, rngs=rngs)


def test_state_update_difference_is_caught(variables):
  report = parity.compare(LinenMLP(), variables, WrongMomentum(nnx.Rngs(0)), X, mapping=MAPPING)
  assert {d.path for d in report.failures} == {'bn/mean', 'bn/var'}
  assert all(d.check == 'train state' for d in report.failures)


def test_swapped_mapping_is_caught(variables):
  """Two same-shaped leaves exchanged by a wrong mapping (what a guess by shape could do)."""
  swapped = TreeMapping(tuple(
      LeafRule(r.nnx, (('params', 'BatchNorm_0', 'bias'),)) if r.nnx == ('bn', 'scale')
      else LeafRule(r.nnx, (('params', 'BatchNorm_0', 'scale'),)) if r.nnx == ('bn', 'bias')
      else r
      for r in MAPPING.rules
  ))
  report = parity.compare(LinenMLP(), variables, NNXMLP(nnx.Rngs(0)), X, mapping=swapped)
  assert not report.ok
  assert ('output', 'output') in {(d.check, d.path) for d in report.failures}


class Annotated(nn.Module):
  @nn.compact
  def __call__(self, x):
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp'))
    return nn.Dense(4, kernel_init=init)(x)


class AnnotatedPort(nnx.Module):
  def __init__(self, names, rngs):
    self.linear = nnx.Linear(3, 4, kernel_metadata={'out_sharding': names}, rngs=rngs)

  def __call__(self, x):
    return self.linear(x)


SPEC_MAPPING = TreeMapping((
    LeafRule(('linear', 'kernel'), (('params', 'Dense_0', 'kernel'),)),
    LeafRule(('linear', 'bias'), (('params', 'Dense_0', 'bias'),)),
))


@pytest.mark.parametrize('names, ok', [(('embed', 'mlp'), True), (('mlp', 'embed'), False)])
def test_partition_specs_are_compared(names, ok):
  with nnx.use_eager_sharding(False):
    variables = Annotated().init(jax.random.key(0), X)
    model = AnnotatedPort(names, nnx.Rngs(0))
    report = parity.compare(Annotated(), variables, model, X, mapping=SPEC_MAPPING, train=False)
  (row,) = report.sharding
  assert row.nnx == 'linear/kernel' and row.ok is ok
  assert report.ok is ok
  rules = [('embed', None), ('mlp', 'model')]
  with nnx.use_eager_sharding(False):
    report = parity.compare(Annotated(), variables, model, X, mapping=SPEC_MAPPING, train=False, logical_axis_rules=rules)
  assert report.sharding[0].linen_spec == str((None, 'model'))


def test_report_as_json(variables):
  import json

  report = parity.compare(LinenMLP(), variables, NNXMLP(nnx.Rngs(0)), X, mapping=MAPPING)
  data = json.loads(report.to_json())
  assert data['ok'] is True and len(data['params']) == 8
  assert jnp.isfinite(jnp.array([d['max_abs'] for d in data['differences']])).all()
