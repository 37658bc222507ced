"""parity.compare: a right port passes, and each kind of wrong port is caught, with its paths."""

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import nnx

from nnx_bridge import parity
from nnx_bridge.treemap import LeafRule
from nnx_bridge.treemap import TreeMapping
from tests.nnx_bridge.test_transfer import MAPPING
from tests.nnx_bridge.test_transfer import X
from tests.nnx_bridge.test_transfer import LinenMLP
from tests.nnx_bridge.test_transfer import NNXMLP


@pytest.fixture(scope='module')
def variables():
  return LinenMLP().init(jax.random.key(0), X)


def test_right_port_passes_every_check(variables):
  report = parity.compare(LinenMLP(), variables, NNXMLP(nnx.Rngs(0)), X, mapping=MAPPING)
  assert report.ok, report.to_text()
  assert report.notes == ('the train-mode call runs with dropout off on both sides',)
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


_MESH_SCRIPT = '''
import jax, jax.numpy as jnp
from flax import linen as nn, nnx
from nnx_bridge import parity, derive

RULES = [('embed', None), ('mlp', 'model'), ('batch', 'data')]
assert len(jax.devices()) == 8
mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(jax.sharding.AxisType.Auto,) * 2)


class Linen(nn.Module):
  @nn.compact
  def __call__(self, x):
    up = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp'))
    down = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('mlp', 'embed'))
    h = nn.relu(nn.Dense(16, kernel_init=up)(x))
    return nn.Dense(8, kernel_init=down)(h)


class Port(nnx.Module):
  def __init__(self, down_names, rngs):
    self.up = nnx.Linear(8, 16, kernel_metadata={'out_sharding': ('embed', 'mlp')}, rngs=rngs)
    self.down = nnx.Linear(16, 8, kernel_metadata={'out_sharding': down_names}, rngs=rngs)

  def __call__(self, x):
    return self.down(nnx.relu(self.up(x)))


x = jnp.ones((4, 8))
with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
  abstract = jax.eval_shape(lambda: Linen().init(jax.random.key(0), x))
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, RULES)
  variables = jax.jit(lambda: Linen().init(jax.random.key(0), x), out_shardings=shardings)()
  linen_specs = {k: v.value.sharding.spec for k, v in variables['params'].items() for k, v in
                 [(f'{k}/kernel', v['kernel'])]}
  for names, expect_ok in ((('mlp', 'embed'), True), (('embed', 'mlp'), False)):
    model = Port(names, nnx.Rngs(0))
    nnx_specs = {'Dense_0/kernel': model.up.kernel[...].sharding.spec,
                 'Dense_1/kernel': model.down.kernel[...].sharding.spec}
    assert (nnx_specs == linen_specs) is expect_ok, (nnx_specs, linen_specs)
    report = parity.compare(Linen(), variables, model, x, logical_axis_rules=RULES, train=False)
    bad = [row.nnx for row in report.sharding if not row.ok]
    assert bad == ([] if expect_ok else ['down/kernel']), report.to_text()
    assert report.ok is expect_ok
print('ok')
'''


@pytest.mark.slow
def test_partition_specs_on_a_simulated_8_device_mesh():
  import os
  import subprocess
  import sys

  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu')
  result = subprocess.run([sys.executable, '-c', _MESH_SCRIPT], env=env, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith('ok')


class LinenScaledSiLU(nn.Module):
  """jax-md's ScaledSiLU: a module without parameters."""

  @nn.compact
  def __call__(self, x):
    return nn.silu(x) * 1.6791767923989418


class NNXScaledSiLU(nnx.Module):
  def __init__(self, scale: float = 1.6791767923989418):
    self.scale = scale

  def __call__(self, x):
    return nnx.silu(x) * self.scale


def test_a_module_without_parameters_compares_its_outputs():
  variables = LinenScaledSiLU().init(jax.random.key(0), X)
  report = parity.compare(LinenScaledSiLU(), variables, NNXScaledSiLU(), X)
  assert report.ok, report.to_text()
  assert {d.check for d in report.differences} == {'output'}
  assert 'the Linen model has no parameters: no gradients to compare' in report.notes
  wrong = parity.compare(LinenScaledSiLU(), variables, NNXScaledSiLU(scale=1.5), X)
  assert {(d.check, d.path) for d in wrong.failures} == {('output', 'output')}


@pytest.mark.parametrize('precision', ['highest', 'default'])
def test_the_report_says_the_backend_and_precision_and_the_verdicts_hold_at_both(variables, precision):
  right = parity.compare(LinenMLP(), variables, NNXMLP(nnx.Rngs(0)), X, mapping=MAPPING, precision=precision)
  assert right.ok, right.to_text()
  assert (right.backend, right.precision) == (jax.default_backend(), precision)
  assert right.to_text().startswith(f'backend {jax.default_backend()}, matmul precision {precision}')
  assert {'backend': jax.default_backend(), 'precision': precision}.items() <= right.to_dict().items()
  square = SquareLinen().init(jax.random.key(0), X)
  wrong = parity.compare(SquareLinen(), square, TransposedMiddle(nnx.Rngs(0)), X, mapping=MAPPING, precision=precision)
  assert ('output', 'output') in {(d.check, d.path) for d in wrong.failures}


_TRACED_AT = []  # the matmul precision in effect each time `_product` is traced


@jax.jit
def _product(x, kernel):
  _TRACED_AT.append(jax.config.jax_default_matmul_precision)
  return x @ kernel


class LinenProduct(nn.Module):
  @nn.compact
  def __call__(self, x):
    return _product(x, self.param('kernel', nn.initializers.lecun_normal(), (3, 4)))


class NNXProduct(nnx.Module):
  def __init__(self, rngs):
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), (3, 4)))

  def __call__(self, x):
    return _product(x, self.kernel[...])


def test_both_sides_run_at_the_precision_asked_for_also_in_functions_jitted_before():
  mapping = TreeMapping((LeafRule(('kernel',), (('params', 'kernel'),)),))
  with jax.default_matmul_precision('float32'):  # compiled at a precision neither mode uses (whatever
    variables = LinenProduct().init(jax.random.key(0), X)  # JAX_DEFAULT_MATMUL_PRECISION says)
  _TRACED_AT.clear()
  parity.compare(LinenProduct(), variables, NNXProduct(nnx.Rngs(0)), X, mapping=mapping)
  assert _TRACED_AT and set(_TRACED_AT) == {'highest'}  # traced again inside the context
  jax.clear_caches()
  _TRACED_AT.clear()
  parity.compare(LinenProduct(), variables, NNXProduct(nnx.Rngs(0)), X, mapping=mapping, precision='default')
  assert set(_TRACED_AT) == {'default', 'highest'}  # both sides at default; the Linen reference at highest


def _rounded(x, phase: float):
  """A product's rounding at a TPU's default precision, simulated on a CPU: an error of up to 1e-3 that depends
  on the implementation (`phase`), none at `highest`."""
  if jax.config.jax_default_matmul_precision == 'default':
    return x + 1e-3 * jnp.sin(3 * x + phase)
  return x


class LinenRounded(nn.Module):
  @nn.compact
  def __call__(self, x):
    return _rounded(nn.Dense(4)(x), phase=0.0)


class NNXRounded(nnx.Module):
  def __init__(self, rngs, scale: float = 1.0):
    self.linear = nnx.Linear(3, 4, rngs=rngs)
    self.scale = scale

  def __call__(self, x):
    return _rounded(self.linear(x), phase=1.0) * self.scale


def test_at_the_default_precision_rounding_passes_within_the_calibrated_noise_and_a_wrong_port_fails():
  mapping = TreeMapping(tuple(LeafRule(('linear', name), (('params', 'Dense_0', name),)) for name in ('kernel', 'bias')))
  variables = LinenRounded().init(jax.random.key(0), X)
  report = parity.compare(LinenRounded(), variables, NNXRounded(nnx.Rngs(0)), X, mapping=mapping, precision='default')
  assert report.ok, report.to_text()
  output = next(d for d in report.differences if d.check == 'output')
  assert output.max_abs > 1e-4 and output.noise > 1e-4  # far above atol: only the calibration lets it pass
  assert 'noise=' in report.to_text()
  assert parity.compare(LinenRounded(), variables, NNXRounded(nnx.Rngs(0)), X, mapping=mapping).ok  # at highest
  # 10% off: far above the simulated rounding, and above a TPU's own bf16 passes (which add to it there)
  wrong = parity.compare(LinenRounded(), variables, NNXRounded(nnx.Rngs(0), scale=1.1), X, mapping=mapping,
                         precision='default')
  assert ('output', 'output') in {(d.check, d.path) for d in wrong.failures}


class LinenGumbelHead(nn.Module):
  """wav2vec2's quantizer in small: in train mode it samples Gumbel noise from the 'gumbel' stream."""

  features: int = 3

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    logits = nn.Dense(self.features)(x)
    if not deterministic:
      logits = logits + jax.random.gumbel(self.make_rng('gumbel'), logits.shape)
    return jax.nn.softmax(logits), logits.mean()


class NNXGumbelHead(nnx.Module):
  def __init__(self, in_features: int, features: int = 3, *, rngs: nnx.Rngs, shift: float = 0.0):
    self.linear = nnx.Linear(in_features, features, rngs=rngs)
    self.gumbel_rngs = rngs.gumbel.fork()
    self.deterministic = True
    self.shift = shift

  def __call__(self, x):
    logits = self.linear(x) + self.shift
    if not self.deterministic:
      logits = logits + jax.random.gumbel(self.gumbel_rngs(), logits.shape)
    return jax.nn.softmax(logits), logits.mean()


@pytest.mark.parametrize('shift, ok', [(0.0, True), (0.5, False)])
def test_train_results_that_other_rng_streams_change_are_not_compared_and_a_wrong_port_still_fails(shift, ok):
  """The train-mode outputs depend on the 'gumbel' keys, which NNX derives otherwise: they are left out, with a
  note naming them, while the eval output and gradients are compared; a port wrong on purpose (its logits shifted,
  which softmax hides but the mean shows) fails."""
  linen = LinenGumbelHead()
  variables = linen.init(jax.random.key(0), X)
  port = NNXGumbelHead(X.shape[-1], rngs=nnx.Rngs(0, gumbel=1), shift=shift)
  report = parity.compare(linen, variables, port, X, rng_streams=['gumbel'])
  assert report.ok is ok, report.to_text()
  assert not any(d.check == 'train output' for d in report.differences)
  assert not any('train-mode call skipped' in note for note in report.notes), report.notes
  assert any('train-mode results not compared, as they change with the keys of the rng streams gumbel' in note
             and 'train output 0, train output 1' in note for note in report.notes), report.notes
  if not ok:
    assert {d.check for d in report.failures} >= {'output'}
