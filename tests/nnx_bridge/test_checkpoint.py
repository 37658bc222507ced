"""Streaming orbax checkpoint conversion between the Linen and NNX layouts."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn
from flax import nnx

from nnx_bridge import checkpoint
from nnx_bridge.errors import ConversionInProgressError
from nnx_bridge.errors import LossyConversionError
from nnx_bridge.errors import StateMismatchError
from nnx_bridge.errors import UnreadableCheckpointError
from nnx_bridge.treemap import LeafRule
from nnx_bridge.treemap import TreeMapping

X = jnp.linspace(-1.0, 1.0, 6).reshape(3, 2)


class LinenNet(nn.Module):
  """q and k projections (one fused Linear in NNX), BatchNorm, two Dense, a bias NNX has no place for."""

  out: int = 2

  @nn.compact
  def __call__(self, x):
    h = jnp.concatenate([nn.Dense(3, name='q')(x), nn.Dense(3, name='k')(x)], axis=-1)
    h = nn.BatchNorm(use_running_average=True)(h)
    h = nn.relu(nn.Dense(4)(h))
    h = nn.Dense(self.out)(h)
    return h + self.param('extra', nn.initializers.zeros, (self.out,))


class NNXNet(nnx.Module):

  def __init__(self, rngs: nnx.Rngs, out: int = 2):
    self.qk = nnx.Linear(2, 6, rngs=rngs)
    self.bn = nnx.BatchNorm(6, use_running_average=True, rngs=rngs)
    self.layers = nnx.List([nnx.Linear(6, 4, rngs=rngs), nnx.Linear(4, out, rngs=rngs)])

  def __call__(self, x):
    return self.layers[1](nnx.relu(self.layers[0](self.bn(self.qk(x)))))


def _mapping(*, skip: tuple[str, ...] = ()) -> TreeMapping:
  """The hand-written plan for LinenNet -> NNXNet, without the NNX leaves in `skip`."""
  rules = [
      LeafRule(('qk', 'kernel'), (('params', 'q', 'kernel'), ('params', 'k', 'kernel')), concat_axis=1),
      LeafRule(('qk', 'bias'), (('params', 'q', 'bias'), ('params', 'k', 'bias')), concat_axis=0),
      LeafRule(('bn', 'scale'), (('params', 'BatchNorm_0', 'scale'),)),
      LeafRule(('bn', 'bias'), (('params', 'BatchNorm_0', 'bias'),)),
      LeafRule(('bn', 'mean'), (('batch_stats', 'BatchNorm_0', 'mean'),)),
      LeafRule(('bn', 'var'), (('batch_stats', 'BatchNorm_0', 'var'),)),
  ]
  for i in range(2):
    for name in ('kernel', 'bias'):
      rules.append(LeafRule(('layers', str(i), name), (('params', f'Dense_{i}', name),)))
  rules = [rule for rule in rules if '/'.join(rule.nnx) not in skip]
  return TreeMapping(tuple(rules), dropped=(('params', 'extra'),))


MAPPING = _mapping()


def _randomize(tree, seed: int):
  """Every leaf uniform in [0.5, 1.5) (so BatchNorm variances stay positive), a wrong mapping shows."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return treedef.unflatten([jax.random.uniform(k, x.shape, x.dtype, 0.5, 1.5) for k, x in zip(keys, leaves)])


def _linen_variables(out: int = 2) -> dict:
  variables = _randomize(LinenNet(out).init(jax.random.key(0), X), seed=1)
  variables['params']['extra'] = jnp.zeros_like(variables['params']['extra'])
  return variables


def _save(path, tree) -> None:
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(path, tree)
  checkpointer.wait_until_finished()


def _restore_nnx(path, out: int = 2) -> NNXNet:
  """Exactly the flax guide's restore: eval_shape, split, restore into the abstract state, merge."""
  abstract_model = nnx.eval_shape(lambda: NNXNet(nnx.Rngs(0), out))
  graphdef, abstract_state = nnx.split(abstract_model)
  state = ocp.StandardCheckpointer().restore(path, abstract_state)
  return nnx.merge(graphdef, state)


def _abstract_state(out: int = 2):
  return nnx.split(nnx.eval_shape(lambda: NNXNet(nnx.Rngs(0), out)))[1]


def _linen_abstract(out: int = 2):
  return jax.eval_shape(LinenNet(out).init, jax.random.key(0), X)


def _flat(tree) -> dict:
  return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.fixture
def linen_ckpt(tmp_path):
  variables = _linen_variables()
  _save(tmp_path / 'linen', variables)
  return tmp_path / 'linen', variables


def test_linen_checkpoint_restores_the_way_the_flax_guide_restores_nnx(linen_ckpt, tmp_path):
  src, variables = linen_ckpt
  checkpoint.linen_to_nnx_checkpoint(src, tmp_path / 'nnx', MAPPING, nnx_abstract_state=_abstract_state())

  model = _restore_nnx(tmp_path / 'nnx')

  np.testing.assert_allclose(model(X), LinenNet().apply(variables, X), rtol=1e-6)
  assert np.array_equal(model.layers[1].kernel[...], variables['params']['Dense_1']['kernel'])  # nnx.List index
  assert sorted(os.listdir(tmp_path)) == ['linen', 'nnx']  # no staging directory left behind


def test_files_are_those_standard_checkpointer_writes_for_the_nnx_state_but_the_device(linen_ckpt, tmp_path):
  checkpoint.linen_to_nnx_checkpoint(linen_ckpt[0], tmp_path / 'nnx', MAPPING)
  _save(tmp_path / 'reference', jax.device_put(nnx.state(_restore_nnx(tmp_path / 'nnx'))))

  for name in ('_METADATA', 'array_metadatas/process_0'):
    assert (tmp_path / 'nnx' / name).read_text() == (tmp_path / 'reference' / name).read_text(), name
  # orbax records the device each array was on, which another backend lacks; the conversion names none
  # (test_a_converted_checkpoint_restores_on_another_topology).
  device = str(jax.devices()[0])  # cpu:0 here, TPU_0(process=0,...) on a TPU
  assert f'"device_str\\": \\"{device}\\"' in (tmp_path / 'reference' / '_sharding').read_text()
  assert not (tmp_path / 'nnx' / '_sharding').exists()


def test_only_a_sharding_over_a_mesh_is_recorded():
  mesh = jax.make_mesh((1,), ('x',))
  assert checkpoint.records_sharding(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('x')))
  assert not checkpoint.records_sharding(jax.sharding.SingleDeviceSharding(jax.devices()[0]))  # names a device
  assert not checkpoint.records_sharding(None)


def test_the_abstract_state_is_optional(linen_ckpt, tmp_path):
  src, variables = linen_ckpt
  checkpoint.linen_to_nnx_checkpoint(src, tmp_path / 'nnx', MAPPING)

  np.testing.assert_allclose(_restore_nnx(tmp_path / 'nnx')(X), LinenNet().apply(variables, X), rtol=1e-6)


@pytest.mark.parametrize('layout', ['state', 'pure_dict'])
def test_nnx_checkpoint_converts_to_linen(tmp_path, layout):
  model = NNXNet(nnx.Rngs(0))
  nnx.update(model, _randomize(nnx.state(model), seed=2))
  state = nnx.state(model)
  _save(tmp_path / 'nnx', state if layout == 'state' else nnx.to_pure_dict(state))

  checkpoint.nnx_to_linen_checkpoint(
      tmp_path / 'nnx', tmp_path / 'linen', MAPPING, linen_abstract_variables=_linen_abstract()
  )

  variables = ocp.StandardCheckpointer().restore(tmp_path / 'linen')
  assert not np.any(variables['params']['extra'])  # the dropped leaf comes back as zeros
  np.testing.assert_allclose(LinenNet().apply(variables, X), model(X), rtol=1e-6)


def test_linen_nnx_linen_round_trip_is_bit_exact(linen_ckpt, tmp_path):
  src, variables = linen_ckpt
  checkpoint.linen_to_nnx_checkpoint(src, tmp_path / 'nnx', MAPPING, batch_bytes=64)
  checkpoint.nnx_to_linen_checkpoint(
      tmp_path / 'nnx', tmp_path / 'back', MAPPING, linen_abstract_variables=_linen_abstract(), batch_bytes=64
  )

  before, after = _flat(variables), _flat(ocp.StandardCheckpointer().restore(tmp_path / 'back'))
  assert before.keys() == after.keys()
  for key in before:
    assert after[key].dtype == before[key].dtype, key
    assert np.asarray(after[key]).tobytes() == np.asarray(before[key]).tobytes(), key


def test_one_collection_checkpoint_of_a_train_state(tmp_path):
  variables = _randomize(nn.Dense(3).init(jax.random.key(0), X), seed=3)
  _save(tmp_path / 'params', variables['params'])  # what saving a TrainState's params writes
  mapping = TreeMapping((
      LeafRule(('kernel',), (('params', 'kernel'),)),
      LeafRule(('bias',), (('params', 'bias'),)),
  ))

  checkpoint.linen_to_nnx_checkpoint(tmp_path / 'params', tmp_path / 'nnx', mapping, linen_collection='params')
  abstract = nnx.eval_shape(lambda: nnx.Linear(2, 3, rngs=nnx.Rngs(0)))
  graphdef, abstract_state = nnx.split(abstract)
  model = nnx.merge(graphdef, ocp.StandardCheckpointer().restore(tmp_path / 'nnx', abstract_state))
  np.testing.assert_allclose(model(X), nn.Dense(3).apply(variables, X), rtol=1e-6)

  checkpoint.nnx_to_linen_checkpoint(tmp_path / 'nnx', tmp_path / 'back', mapping, linen_collection='params')
  back = ocp.StandardCheckpointer().restore(tmp_path / 'back')
  assert set(back) == {'kernel', 'bias'}
  assert np.array_equal(back['kernel'], variables['params']['kernel'])


def _refuses(tmp_path, src, expected: list[str], **kwargs) -> None:
  with pytest.raises(StateMismatchError) as info:
    checkpoint.linen_to_nnx_checkpoint(src, tmp_path / 'nnx', kwargs.pop('mapping', MAPPING), **kwargs)
  for text in expected:
    assert text in str(info.value)
  assert sorted(os.listdir(tmp_path)) == ['linen']  # neither dst nor a staging directory


def test_missing_leaf_refuses_naming_both_sides(tmp_path):
  variables = _linen_variables()
  del variables['params']['Dense_1']['bias']
  _save(tmp_path / 'linen', variables)
  _refuses(tmp_path, tmp_path / 'linen', ['params/Dense_1/bias -> layers/1/bias/value', 'not in the checkpoint'])


def test_extra_leaf_refuses_naming_it(tmp_path):
  variables = _linen_variables()
  variables['params']['Dense_1']['scale'] = jnp.ones(2)
  _save(tmp_path / 'linen', variables)
  _refuses(tmp_path, tmp_path / 'linen', ['params/Dense_1/scale: in the checkpoint, not in the mapping'])


def test_wrong_shape_refuses_naming_both_sides(linen_ckpt, tmp_path):
  _refuses(
      tmp_path,
      linen_ckpt[0],
      ['params/Dense_1/kernel -> layers/1/kernel/value: the checkpoint gives float32[4,2], '
       'the NNX model expects float32[4,3]'],
      nnx_abstract_state=_abstract_state(out=3),
  )


def test_fused_leaf_is_checked_after_fusing(tmp_path):
  variables = _linen_variables()
  variables['params']['k'] = {'kernel': jnp.ones((2, 4)), 'bias': jnp.ones(4)}
  _save(tmp_path / 'linen', variables)
  _refuses(
      tmp_path,
      tmp_path / 'linen',
      ['params/q/kernel + params/k/kernel -> qk/kernel/value: the checkpoint gives float32[2,7], '
       'the NNX model expects float32[2,6]'],
      nnx_abstract_state=_abstract_state(),
  )


def test_flax_guide_replace_by_pure_dict_accepts_a_missing_leaf_ours_refuses(linen_ckpt, tmp_path):
  src, variables = linen_ckpt
  params = ocp.StandardCheckpointer().restore(src)['params']
  partial = {'layers': {0: dict(params['Dense_0']), 1: {'kernel': params['Dense_1']['kernel']}}}  # no layers/1/bias
  model = NNXNet(nnx.Rngs(0))
  state = nnx.state(model)
  nnx.replace_by_pure_dict(state, partial)  # the guide's partial restore: no error
  nnx.update(model, state)
  assert not np.array_equal(model.layers[1].bias[...], variables['params']['Dense_1']['bias'])  # still its init

  _refuses(
      tmp_path,
      src,
      ['params/Dense_1/bias: in the checkpoint, not in the mapping',
       'layers/1/bias/value: in the NNX model, nothing in the mapping makes it'],
      mapping=_mapping(skip=('layers/1/bias',)),
      nnx_abstract_state=_abstract_state(),
  )


def test_non_zero_dropped_leaf_needs_allow_lossy(tmp_path):
  variables = _linen_variables()
  variables['params']['extra'] = jnp.ones_like(variables['params']['extra'])
  _save(tmp_path / 'linen', variables)

  with pytest.raises(LossyConversionError, match='params/extra'):
    checkpoint.linen_to_nnx_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', MAPPING)
  assert not (tmp_path / 'nnx').exists()
  checkpoint.linen_to_nnx_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', MAPPING, allow_lossy=True)
  assert (tmp_path / 'nnx').exists()


def test_existing_destination_is_refused(linen_ckpt, tmp_path):
  (tmp_path / 'nnx').mkdir()
  with pytest.raises(FileExistsError, match='nnx exists'):
    checkpoint.linen_to_nnx_checkpoint(linen_ckpt[0], tmp_path / 'nnx', MAPPING)
  assert os.listdir(tmp_path / 'nnx') == []


def test_failure_mid_write_leaves_no_destination_and_no_staging(linen_ckpt, tmp_path, monkeypatch):
  restore, calls = checkpoint.restore_arrays, []

  def fail_on_second_batch(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
      raise OSError('disk gone')
    return restore(*args, **kwargs)

  monkeypatch.setattr(checkpoint, 'restore_arrays', fail_on_second_batch)
  with pytest.raises(OSError, match='disk gone'):
    checkpoint.linen_to_nnx_checkpoint(linen_ckpt[0], tmp_path / 'nnx', MAPPING, allow_lossy=True, batch_bytes=1)
  assert sorted(os.listdir(tmp_path)) == ['linen']


_KILLED_CHILD = textwrap.dedent('''
    import pathlib, sys, time
    from nnx_bridge import checkpoint
    from nnx_bridge.treemap import TreeMapping

    src, dst, mapping, started = sys.argv[1:]
    restore, calls = checkpoint.restore_arrays, []

    def hang_after_first_batch(*args, **kwargs):
      calls.append(1)
      if len(calls) == 2:  # the first batch is on disk, under the staging directory
        pathlib.Path(started).touch()
        time.sleep(600)
      return restore(*args, **kwargs)

    checkpoint.restore_arrays = hang_after_first_batch
    checkpoint.linen_to_nnx_checkpoint(src, dst, TreeMapping.load(mapping), allow_lossy=True, batch_bytes=1)
''')


def test_killed_conversion_leaves_no_destination_and_the_next_run_removes_its_staging(linen_ckpt, tmp_path):
  MAPPING.save(tmp_path / 'mapping.json')
  started = tmp_path / 'started'
  child = subprocess.Popen(
      [sys.executable, '-c', _KILLED_CHILD, str(linen_ckpt[0]), str(tmp_path / 'nnx'),
       str(tmp_path / 'mapping.json'), str(started)],
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'},  # an accelerator admits one process: the test's own
  )
  try:
    deadline = time.monotonic() + 60
    while not started.exists() and child.poll() is None and time.monotonic() < deadline:
      time.sleep(0.05)
    assert started.exists(), 'the conversion never reached its second batch'
  finally:
    child.send_signal(signal.SIGKILL)
    child.wait()

  assert not (tmp_path / 'nnx').exists()
  staging = [name for name in os.listdir(tmp_path) if name.startswith('.nnx.')]
  assert len(staging) == 1 and os.listdir(tmp_path / staging[0])  # killed mid-write, a hidden sibling stays

  assert checkpoint.clear_staging(tmp_path / 'nnx') == checkpoint.Leftovers((str(tmp_path / staging[0]),), ())
  checkpoint.linen_to_nnx_checkpoint(linen_ckpt[0], tmp_path / 'nnx', MAPPING)
  assert sorted(os.listdir(tmp_path)) == ['linen', 'mapping.json', 'nnx', 'started']


def _staging(tmp_path, dst: str, owner: dict | None) -> str:
  """A staging folder beside tmp_path/dst as a conversion leaves it, recording `owner` (None: no record)."""
  path = tmp_path / f'.{dst}.abc123.converting'
  (path / dst).mkdir(parents=True)
  (path / dst / 'part').write_bytes(b'x' * 1000)
  if owner is not None:
    record = {'dst': str(tmp_path / dst), 'host': socket.gethostname(), 'pid': os.getpid(), **owner}
    (path / 'linen2nnx-owner.json').write_text(json.dumps(record))
  return str(path)


def test_staging_folder_of_a_live_conversion_is_refused_and_kept(linen_ckpt, tmp_path):
  path = _staging(tmp_path, 'nnx', {'started': checkpoint._process_start(os.getpid())})  # this process is alive
  with pytest.raises(ConversionInProgressError, match='still running'):
    checkpoint.linen_to_nnx_checkpoint(linen_ckpt[0], tmp_path / 'nnx', MAPPING)
  assert os.path.exists(path) and not (tmp_path / 'nnx').exists()


def test_staging_folder_of_an_ended_process_whose_pid_was_reused_is_removed(linen_ckpt, tmp_path):
  path = _staging(tmp_path, 'nnx', {'started': 'another start time'})
  checkpoint.linen_to_nnx_checkpoint(linen_ckpt[0], tmp_path / 'nnx', MAPPING)
  assert not os.path.exists(path) and (tmp_path / 'nnx').is_dir()


def test_staging_folders_that_cannot_be_checked_or_are_another_destinations_are_kept(linen_ckpt, tmp_path):
  unowned = _staging(tmp_path, 'nnx', None)
  other = _staging(tmp_path, 'nnx.v2', {'started': 'another start time'})  # `.nnx.v2.*` also starts `.nnx.`
  foreign = tmp_path / '.nnx.def456.converting'
  foreign.mkdir()
  (foreign / 'linen2nnx-owner.json').write_text(
      json.dumps({'dst': str(tmp_path / 'nnx'), 'host': 'another-host', 'pid': 1, 'started': None})
  )

  assert checkpoint.clear_staging(tmp_path / 'nnx') == checkpoint.Leftovers((), (unowned, str(foreign)))
  checkpoint.linen_to_nnx_checkpoint(linen_ckpt[0], tmp_path / 'nnx', MAPPING)
  assert all(os.path.exists(path) for path in (unowned, other, foreign)) and (tmp_path / 'nnx').is_dir()


def test_relative_paths(linen_ckpt, tmp_path, monkeypatch):
  _, variables = linen_ckpt
  monkeypatch.chdir(tmp_path)
  checkpoint.linen_to_nnx_checkpoint('linen', 'nnx', MAPPING, nnx_abstract_state=_abstract_state())
  checkpoint.nnx_to_linen_checkpoint('nnx', 'back', MAPPING, linen_abstract_variables=_linen_abstract())

  np.testing.assert_allclose(_restore_nnx(tmp_path / 'nnx')(X), LinenNet().apply(variables, X), rtol=1e-6)
  back = ocp.StandardCheckpointer().restore(tmp_path / 'back')
  assert np.array_equal(back['params']['Dense_1']['kernel'], variables['params']['Dense_1']['kernel'])


def test_a_folder_that_is_not_a_checkpoint_is_named(linen_ckpt, tmp_path):
  (tmp_path / 'notes').mkdir()
  (tmp_path / 'notes' / 'README').write_text('not a checkpoint')
  with pytest.raises(UnreadableCheckpointError, match=r'notes is not an orbax checkpoint \(no _METADATA file\)'):
    checkpoint.linen_to_nnx_checkpoint(tmp_path / 'notes', tmp_path / 'nnx', MAPPING)
  with pytest.raises(UnreadableCheckpointError, match='README is a file'):
    checkpoint.linen_to_nnx_checkpoint(tmp_path / 'notes' / 'README', tmp_path / 'nnx', MAPPING)
  with pytest.raises(FileNotFoundError, match='No checkpoint at .*missing: no such folder'):
    checkpoint.linen_to_nnx_checkpoint(tmp_path / 'missing', tmp_path / 'nnx', MAPPING)

  # A CheckpointManager's folder: its steps are named.
  (tmp_path / 'run' / '100').mkdir(parents=True)
  os.rename(linen_ckpt[0], tmp_path / 'run' / '100' / 'default')
  with pytest.raises(UnreadableCheckpointError, match='it holds the checkpoints 100/default: give one of those'):
    checkpoint.linen_to_nnx_checkpoint(tmp_path / 'run', tmp_path / 'nnx', MAPPING)
  checkpoint.linen_to_nnx_checkpoint(tmp_path / 'run' / '100' / 'default', tmp_path / 'nnx', MAPPING)
  assert (tmp_path / 'nnx').is_dir()


def _largest_file(folder) -> str:
  files = [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names]
  return max(files, key=os.path.getsize)


def _truncate(path: str) -> None:
  with open(path, 'r+b') as stream:
    stream.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize(
    'damage, message',
    [
        (lambda ckpt: _truncate(ckpt / '_METADATA'), r'_METADATA cannot be read \(Expecting'),
        (lambda ckpt: _truncate(ckpt / 'array_metadatas' / 'process_0'), r'process_0 cannot be read'),
        (lambda ckpt: _truncate(ckpt / 'manifest.ocdbt'), r'cannot be read as an orbax checkpoint \(DATA_LOSS'),
        # One kernel large enough to be stored apart from the metadata: it fails when its data is read.
        (lambda ckpt: _truncate(_largest_file(ckpt)), r'cannot read one of bias, kernel \(.*"kernel/0.0"'),
    ],
    ids=['metadata', 'array_metadatas', 'manifest', 'array_data'],
)
def test_a_damaged_checkpoint_is_named_in_one_line(tmp_path, damage, message):
  variables = nn.Dense(64).init(jax.random.key(0), jnp.ones((1, 64)))
  _save(tmp_path / 'linen', variables['params'])
  mapping = TreeMapping(tuple(LeafRule((name,), (('params', name),)) for name in ('kernel', 'bias')))
  damage(tmp_path / 'linen')

  with pytest.raises(UnreadableCheckpointError, match=message) as info:
    checkpoint.linen_to_nnx_checkpoint(tmp_path / 'linen', tmp_path / 'nnx', mapping, linen_collection='params')
  assert str(tmp_path / 'linen') in str(info.value) and 'save it or copy it again' in str(info.value)
  assert '\n' not in str(info.value) and 'tensorstore_spec' not in str(info.value)
  assert sorted(os.listdir(tmp_path)) == ['linen']  # neither dst nor a staging directory


_SHARDED_CHILD = textwrap.dedent('''
    import sys
    import jax, jax.numpy as jnp, numpy as np, orbax.checkpoint as ocp
    from flax import linen as nn, nnx
    from jax.sharding import NamedSharding, PartitionSpec as P
    from nnx_bridge import checkpoint
    from nnx_bridge.treemap import LeafRule, TreeMapping

    tmp = sys.argv[1]
    mesh = jax.make_mesh((2,), ('x',))
    spec = {'kernel': P(None, 'x'), 'bias': P('x')}
    mapping = TreeMapping(tuple(LeafRule((name,), (('params', name),)) for name in spec))
    variables = nn.Dense(4).init(jax.random.key(0), jnp.ones((1, 2)))
    saver = ocp.StandardCheckpointer()
    saver.save(tmp + '/linen', variables)
    saver.wait_until_finished()

    abstract = nnx.eval_shape(lambda: nnx.Linear(2, 4, rngs=nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract)
    abstract_state = nnx.State({
        name: nnx.Param(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, spec[name])))
        for name, v in nnx.to_pure_dict(abstract_state).items()
    })
    checkpoint.linen_to_nnx_checkpoint(tmp + '/linen', tmp + '/nnx', mapping, nnx_abstract_state=abstract_state)

    stored = ocp.PyTreeCheckpointer().metadata(tmp + '/nnx').item_metadata.tree
    assert stored['kernel']['value'].sharding.partition_spec == (None, 'x'), stored
    restored = ocp.StandardCheckpointer().restore(tmp + '/nnx')  # no target: the stored sharding
    assert restored['kernel']['value'].sharding == NamedSharding(mesh, P(None, 'x'))
    model = nnx.merge(graphdef, ocp.StandardCheckpointer().restore(tmp + '/nnx', abstract_state))
    assert np.array_equal(model.kernel[...], variables['params']['kernel'])

    linen_abstract = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s)),
        jax.eval_shape(nn.Dense(4).init, jax.random.key(0), jnp.ones((1, 2))), {'params': spec})
    checkpoint.nnx_to_linen_checkpoint(tmp + '/nnx', tmp + '/back', mapping, linen_abstract_variables=linen_abstract)
    back = ocp.StandardCheckpointer().restore(tmp + '/back')
    assert back['params']['bias'].sharding == NamedSharding(mesh, P('x'))
    print('sharding kept')
''')


def _run_on_devices(count: int, script: str, *args) -> str:
  """`script` run with `args` in a CPU process of `count` devices (a simulated topology): its stdout."""
  env = dict(os.environ, XLA_FLAGS=f'--xla_force_host_platform_device_count={count}', JAX_PLATFORMS='cpu')
  result = subprocess.run([sys.executable, '-c', script, *map(str, args)], env=env, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def test_target_sharding_is_written_and_restored(tmp_path):
  assert 'sharding kept' in _run_on_devices(2, _SHARDED_CHILD, tmp_path)


_TOPOLOGY_CHILD = textwrap.dedent('''
    import sys
    import jax, jax.numpy as jnp, numpy as np, orbax.checkpoint as ocp
    from flax import linen as nn, nnx
    from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding
    from nnx_bridge import checkpoint, restore_linen_checkpoint
    from nnx_bridge.treemap import LeafRule, TreeMapping

    mode, tmp = sys.argv[1:]
    x = jnp.linspace(-1.0, 1.0, 6).reshape(3, 2)
    mapping = TreeMapping(tuple(LeafRule((name,), (('params', name),)) for name in ('kernel', 'bias')))

    def abstract(sharding=None):
      """The flax guide's abstract model; its state's leaves given `sharding(leaf)` when asked."""
      graphdef, state = nnx.split(nnx.eval_shape(lambda: nnx.Linear(2, 8, rngs=nnx.Rngs(0))))
      if sharding is not None:
        state = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding(leaf)), state)
      return graphdef, state

    def guide_restore(path, sharding=None):
      graphdef, state = abstract(sharding)
      return nnx.merge(graphdef, ocp.StandardCheckpointer().restore(path, state))

    if mode == 'write':  # every array on the last device of this host, which another host may lack
      last = SingleDeviceSharding(jax.devices()[-1])
      variables = jax.device_put(nn.Dense(8).init(jax.random.key(0), x), last)
      with ocp.StandardCheckpointer() as saver:
        saver.save(tmp + '/linen', variables)
      checkpoint.linen_to_nnx_checkpoint(tmp + '/linen', tmp + '/nnx', mapping,
                                         nnx_abstract_state=abstract(lambda leaf: last)[1])
      with ocp.StandardCheckpointer() as saver:  # the guide's own save
        saver.save(tmp + '/guide', nnx.state(guide_restore(tmp + '/nnx', lambda leaf: last)))
      np.savez(tmp + '/want.npz', **jax.device_get(variables['params']))
      print('written on', jax.devices()[-1])
    else:
      want = np.load(tmp + '/want.npz')

      def check(model):  # bit-exact
        for name in ('kernel', 'bias'):
          np.testing.assert_array_equal(np.asarray(getattr(model, name).get_value()), want[name])

      check(guide_restore(tmp + '/nnx'))  # no shardings: numpy arrays, on any host
      if len(jax.devices()) > 1:
        mesh = jax.make_mesh((2, len(jax.devices()) // 2), ('data', 'model'))
        model = guide_restore(tmp + '/nnx', lambda leaf: NamedSharding(mesh, P(*[None] * (leaf.ndim - 1), 'model')))
        assert model.kernel.get_value().sharding == NamedSharding(mesh, P(None, 'model'))
        check(model)
        model = guide_restore(tmp + '/nnx', lambda leaf: SingleDeviceSharding(jax.devices()[1]))
        assert model.kernel.get_value().devices() == {jax.devices()[1]}
        check(model)
      graphdef, state = abstract()
      check(nnx.merge(graphdef, restore_linen_checkpoint(state, tmp + '/linen')))
      try:
        guide_restore(tmp + '/guide')
        print('the guide save restores')
      except ValueError as error:
        print('the guide save fails:', str(error).splitlines()[0])
      print('restored on', len(jax.devices()), 'devices')
''')


@pytest.mark.slow
@pytest.mark.parametrize('written, restored', [(1, 8), (8, 1)])
def test_a_converted_checkpoint_restores_on_another_topology(tmp_path, written, restored):
  """Issue 36: on a TPU host, a converted checkpoint that named the device `cpu:0` failed the guide's restore.
  Simulated here by devices the other host lacks (`cpu:7` on a 1-device host), the checkpoint written with every
  array on the last device; it restores without shardings, over a mesh, on device 1, and by restore_linen_checkpoint."""
  _run_on_devices(written, _TOPOLOGY_CHILD, 'write', tmp_path)
  out = _run_on_devices(restored, _TOPOLOGY_CHILD, 'restore', tmp_path)
  assert f'restored on {restored} devices' in out
  if written > restored:  # the guide's own save names cpu:7: the failure the conversion avoids
    assert 'the guide save fails: Topology mismatch detected' in out
