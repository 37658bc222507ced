"""L2N002 on scan over layers: nn.scan (optionally over nn.remat) of a block class stacks its params
along a leading layer axis; the NNX port builds the stack with nnx.vmap and runs it with nnx.scan.
Linen's stacked params transfer as they are, outputs and gradients match in eval and train mode
(same dropout masks), a permuted layer axis is caught, and the rematted stack rematerialises."""

import functools
import pathlib
import runpy

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import nnx_bridge
from nnx_bridge import checkpoint
from nnx_bridge.transfer import flat_linen, flat_nnx_variables
from tests.codemods.rules import training_parity as parity

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002'
GUIDE_X = jax.random.normal(jax.random.key(1), (4, 8))
IMAGES = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
VIT = dict(num_classes=5, patch=4, num_patches=4, depth=3, dim=16, mlp_dim=32, num_heads=2)
STACKED = ('params', 'Transformer', 'encoderblock')


def _load(case: str, suffix: str) -> dict:
  return runpy.run_path(str(FIXTURES / f'{case}.{suffix}.py'))


def _guide_nnx(seed: int = 0) -> nnx.Module:
  """The converted guide MLP (features 8, 5 layers): the one place that knows its constructor."""
  return _load('scan_layers', 'out')['MLP'](8, 5, rngs=nnx.Rngs(seed))


def _vit_nnx(dropout: float, seed: int = 0) -> nnx.Module:
  """The converted ViT at the VIT sizes, with the input sizes the rule added as constructor arguments."""
  return _load('scan_remat_encoder', 'out')['ViT'](
      **VIT, dropout=dropout, embedding_in_features=IMAGES.shape[-1],
      head_in_features=VIT['dim'], rngs=nnx.Rngs(seed))


def _guide_linen(split_dropout: bool = False) -> dict:
  """The guide's Linen classes; with `split_dropout`, its nn.scan also splits the 'dropout' rng.

  As the guide writes it (split_rngs={'params': True}) the scanned Dropout gets no 'dropout' rng,
  so the Linen MLP cannot run in train mode; the variant is the smallest change that can.
  """
  if not split_dropout:
    return _load('scan_layers', 'in')
  source = (FIXTURES / 'scan_layers.in.py').read_text()
  assert source.count("split_rngs={'params': True}") == 1
  namespace: dict = {}
  exec(compile(source.replace("split_rngs={'params': True}", "split_rngs={'params': True, 'dropout': True}"),
               'scan_layers_split_dropout', 'exec'), namespace)
  return namespace


def _guide(split_dropout: bool = False):
  """Linen guide MLP, its variables, and the converted MLP holding them (by the derived mapping)."""
  linen_module = _guide_linen(split_dropout)['MLP'](8, num_layers=5)
  variables = linen_module.init(jax.random.key(0), GUIDE_X, training=False)
  model = _guide_nnx(seed=5)
  mapping = nnx_bridge.derive_mapping(linen_module, model, GUIDE_X, training=False)
  nnx_bridge.linen_to_nnx(variables, model, mapping)
  return linen_module, variables, model, mapping


@functools.cache
def _vit_transferred(dropout: float):
  """Linen ViT, its variables, the split converted ViT holding them, and the mapping (built once: slow)."""
  linen_module = _load('scan_remat_encoder', 'in')['ViT'](**VIT, dropout=dropout)
  key = jax.random.key(0)
  variables = jax.jit(linen_module.init)({'params': key, 'dropout': key}, IMAGES)  # jit: faster than eager here
  model = _vit_nnx(dropout, seed=5)
  mapping = nnx_bridge.derive_mapping(linen_module, model, IMAGES, train=False)
  nnx_bridge.linen_to_nnx(variables, model, mapping)
  return linen_module, variables, nnx.split(model), mapping


def _vit(dropout: float = 0.1):
  """Linen ViT, its variables, a fresh converted ViT holding them (by the derived mapping), the mapping."""
  linen_module, variables, (graphdef, state), mapping = _vit_transferred(dropout)
  return linen_module, variables, nnx.merge(graphdef, state), mapping


def _loss(y: jax.Array) -> jax.Array:
  return jnp.sum(y ** 2)


def _assert_same_gradients(linen_forward, variables, model, x, mapping, atol: float = 1e-5) -> None:
  """d loss / d params of `linen_forward(params)` and of `model(x)` agree leaf by leaf, through `mapping`."""
  linen_grads = jax.jit(jax.grad(lambda p: _loss(linen_forward(p))))(variables['params'])
  want = mapping.only('params').linen_to_nnx(flat_linen({'params': linen_grads}), allow_lossy=True)
  grads = nnx.grad(lambda m: _loss(m(x)))(model)
  got = {tuple(map(str, path)): v.get_value() for path, v in nnx.to_flat_state(grads)}
  assert set(got) == set(want), sorted(set(got) ^ set(want))
  for path in sorted(want):
    np.testing.assert_allclose(got[path], want[path], atol=atol, rtol=1e-5, err_msg='/'.join(path))


def _stacked_shapes_agree(variables, model, mapping, prefix: tuple[str, ...], depth: int) -> int:
  """Every Linen leaf under `prefix` has leading axis `depth` and moves unchanged to an NNX leaf of its shape."""
  linen = flat_linen(variables)
  nnx_leaves = flat_nnx_variables(model)
  by_linen = {rule.linen[0]: rule for rule in mapping.rules}
  stacked = [key for key in linen if key[:len(prefix)] == prefix]
  assert stacked
  for key in stacked:
    rule = by_linen[key]
    assert rule.linen == (key,) and rule.concat_axis is None, rule  # one leaf to one leaf, no reshaping
    assert linen[key].shape[0] == depth, (key, linen[key].shape)
    assert nnx_leaves[rule.nnx].get_value().shape == linen[key].shape, (rule, linen[key].shape)
  return len(stacked)


def test_guide_eval_mode_matches_linen_outputs_and_gradients():
  linen_module, variables, model, mapping = _guide()
  assert variables['params']['ScanBlock_0']['Dense_0']['kernel'].shape == (5, 8, 8)
  assert _stacked_shapes_agree(variables, model, mapping, ('params', 'ScanBlock_0'), 5) == 2
  assert mapping.linen_keys == set(flat_linen(variables)) and not mapping.dropped
  model.eval()
  want = linen_module.apply(variables, GUIDE_X, training=False)
  np.testing.assert_allclose(model(GUIDE_X), want, atol=1e-5)
  _assert_same_gradients(
      lambda p: linen_module.apply({'params': p}, GUIDE_X, training=False), variables, model, GUIDE_X, mapping)
  report = nnx_bridge.compare(linen_module, variables, model, GUIDE_X, mapping=mapping, atol=1e-5)
  assert report.ok, report.to_text()
  assert len([d for d in report.differences if d.check == 'gradient']) == 2  # the stacked kernel and bias


def test_guide_as_written_cannot_run_linen_train_mode():
  linen_module, variables, _, _ = _guide()
  with pytest.raises(Exception, match='needs PRNG for "dropout"'):
    linen_module.apply(variables, GUIDE_X, training=True, rngs={'dropout': jax.random.key(3)})


def _assert_train_mode_matches(linen_module, variables, model, mapping, x, switch: str) -> None:
  """Train mode under the same dropout masks on both sides: outputs and gradients; dropout really changes them."""
  model.train()
  key = jax.random.key(3)
  train = lambda p: linen_module.apply({'params': p}, x, **{switch: True}, rngs={'dropout': key})
  with parity.same_masks():
    want = train(variables['params'])
    np.testing.assert_allclose(model(x), want, atol=1e-5)
    _assert_same_gradients(train, variables, model, x, mapping)
  assert not np.allclose(want, linen_module.apply(variables, x, **{switch: False}), atol=1e-5)  # dropout is on


def test_guide_train_mode_matches_linen_with_the_same_dropout_masks():
  linen_module, variables, model, mapping = _guide(split_dropout=True)
  _assert_train_mode_matches(linen_module, variables, model, mapping, GUIDE_X, 'training')
  # With real masks the model's rng stream advances: two train-mode calls drop different units.
  assert not np.allclose(model(GUIDE_X), model(GUIDE_X))


def test_encoder_checkpoint_transfers_with_identical_stacked_shapes():
  linen_module, variables, model, mapping = _vit()
  assert mapping.linen_keys == set(flat_linen(variables)) and not mapping.dropped
  assert _stacked_shapes_agree(variables, model, mapping, STACKED, VIT['depth']) == 16
  model.eval()
  eval_forward = lambda p: linen_module.apply({'params': p}, IMAGES, train=False)
  np.testing.assert_allclose(model(IMAGES), eval_forward(variables['params']), atol=1e-5)
  _assert_same_gradients(eval_forward, variables, model, IMAGES, mapping)


def test_encoder_train_mode_matches_linen_with_the_same_dropout_masks():
  _assert_train_mode_matches(*_vit(), IMAGES, 'train')


def test_reversed_layer_axis_is_caught():
  linen_module, variables, model, mapping = _vit()
  want = linen_module.apply(variables, IMAGES)
  # A checkpoint converted with its layer axis reversed (one kernel suffices): the state and outputs differ.
  kernel = model.Transformer.encoderblock.mlp_block.linear1.kernel
  kernel.set_value(kernel.get_value()[::-1])
  model.eval()
  assert not np.allclose(model(IMAGES), want, atol=1e-3)
  expected = flat_nnx_variables(nnx_bridge.linen_to_nnx(variables, nnx.clone(model), mapping))
  got = flat_nnx_variables(model)
  differing = [path for path in expected if not np.array_equal(got[path].get_value(), expected[path].get_value())]
  assert differing == [('Transformer', 'encoderblock', 'mlp_block', 'linear1', 'kernel')], differing


def test_compare_rejects_a_port_that_runs_the_layers_last_to_first(monkeypatch):
  linen_module, variables, model, mapping = _guide()
  assert nnx_bridge.compare(linen_module, variables, model, GUIDE_X, mapping=mapping, atol=1e-5).ok
  scan = nnx.scan
  monkeypatch.setattr(nnx, 'scan', lambda *args, **kwargs: scan(*args, **{**kwargs, 'reverse': True}))
  report = nnx_bridge.compare(linen_module, variables, model, GUIDE_X, mapping=mapping, atol=1e-5)
  assert not report.ok
  assert {'output', 'gradient'} <= {d.check for d in report.failures}, report.to_text()


def _gradient_jaxpr(model, x) -> str:
  """The jaxpr of d loss / d state (allow_int: the rng counts are integers)."""
  graphdef, state = nnx.split(model)
  loss = lambda state: jnp.sum(nnx.merge(graphdef, state)(x) ** 2)
  return str(jax.make_jaxpr(jax.grad(loss, allow_int=True))(state))


def test_encoder_gradient_rematerialises():
  _, _, model, _ = _vit()
  model.eval()
  jaxpr = _gradient_jaxpr(model, IMAGES)
  assert 'scan' in jaxpr
  assert jaxpr.count('remat') + jaxpr.count('checkpoint') >= 1, jaxpr


def test_encoder_orbax_checkpoint_converts_to_the_stacked_layout(tmp_path):
  """The Linen checkpoint on disk becomes an NNX one (nnx_bridge.checkpoint, orbax) that restores, the flax
  guide's way, into the converted ViT's params: the stacked leaves keep their shapes, and outputs match."""
  linen_module, variables, _, mapping = _vit(dropout=0.1)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / 'linen', variables)
  checkpointer.wait_until_finished()
  abstract = nnx.eval_shape(lambda: _vit_nnx(0.1))
  graphdef, abstract_params, _ = nnx.split(abstract, nnx.Param, ...)
  checkpoint.linen_to_nnx_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', mapping, nnx_abstract_state=abstract_params)
  params = ocp.StandardCheckpointer().restore(tmp_path / 'nnx', abstract_params)
  stacked = params['Transformer']['encoderblock']['mlp_block']['linear1']['kernel'][...]
  assert stacked.shape == variables['params']['Transformer']['encoderblock']['MlpBlock_0']['Dense_0']['kernel'].shape
  assert stacked.shape[0] == VIT['depth']
  model = _vit_nnx(0.1, seed=9)
  nnx.update(model, params)
  model.eval()
  np.testing.assert_allclose(model(IMAGES), linen_module.apply(variables, IMAGES), atol=1e-5)
