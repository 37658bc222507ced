"""L2N003 training and decoding code run for real: each fixture and its port, from the same start, compute the same."""

import pathlib
import runpy

import pytest
from flax import nnx

from codemods import rules as registry
from codemods.options import STEP_STYLES
from codemods.options import MigrationOptions
from codemods.transform import transform_source
from tests.codemods.rules import training_parity as parity

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N003'


def _run_both(case: str, linen_class: str, nnx_class: str, script: str | None = None):
  """Runs `<case>.in.py` recording its model, then `<case>.out.py` (or `script`) started from it."""
  with parity.recording_linen(linen_class) as linen:
    linen_globals = runpy.run_path(str(FIXTURES / f'{case}.in.py'))
  with parity.transferring_into(nnx_class, linen) as ported:
    nnx_globals = runpy.run_path(script or str(FIXTURES / f'{case}.out.py'))
  return linen, linen_globals, ported, nnx_globals


def test_guide_training_step_trains_to_the_same_parameters():
  with parity.same_masks():  # Dropout(0.5) in train mode: one mask on both sides (see training_parity)
    linen, linen_globals, ported, nnx_globals = _run_both('guide_training_step', 'Model', 'Model')
  parity.assert_same_state({'params': linen_globals['params']}, ported)
  parity.assert_close(linen_globals['logits'], nnx_globals['logits'])


def test_same_masks_is_what_makes_dropout_training_comparable():
  """Without it the two libraries' masks differ (different rng derivations), and so do the results."""
  linen, linen_globals, ported, nnx_globals = _run_both('guide_training_step', 'Model', 'Model')
  with pytest.raises(AssertionError):
    parity.assert_close(linen_globals['logits'], nnx_globals['logits'])


def test_guide_train_state_trains_to_the_same_parameters():
  linen, linen_globals, ported, nnx_globals = _run_both('guide_train_state', 'Dense', 'Linear')
  state = linen_globals['state']
  parity.assert_same_state({'params': state.params}, ported)
  parity.assert_close(linen_globals['logits'], nnx_globals['logits'])
  assert int(nnx_globals['optimizer'].step[...]) == int(state.step) == 3


def test_optax_batch_stats_trains_to_the_same_losses_and_statistics():
  linen, linen_globals, ported, nnx_globals = _run_both('optax_batch_stats', 'CNN', 'CNN')
  for name in ('losses', 'logits', 'mean'):  # per-step losses; eval logits and BatchNorm mean after training
    parity.assert_close(linen_globals[name], nnx_globals[name])
  parity.assert_same_state(linen.final, ported)  # params and batch stats, from the jitted eval step


def test_freeze_unfreeze_port_trains_to_the_same_losses():
  linen, linen_globals, ported, nnx_globals = _run_both('freeze_unfreeze', 'Regressor', 'Regressor')
  parity.assert_close(linen_globals['losses'], nnx_globals['losses'])
  parity.assert_same_state({'params': linen_globals['params']}, ported)
  parity.assert_close(linen_globals['predictions'], nnx_globals['predictions'])
  assert nnx_globals['parameter_count'] == linen_globals['parameter_count'] == 49  # leaves of nnx.state(model, nnx.Param)


def test_the_parity_checks_reject_a_port_that_trains_differently(tmp_path):
  wrong = tmp_path / 'wrong.py'
  wrong.write_text((FIXTURES / 'guide_train_state.out.py').read_text().replace('optax.adam(1e-3)', 'optax.adam(2e-3)'))
  linen, linen_globals, ported, nnx_globals = _run_both('guide_train_state', 'Dense', 'Linear', str(wrong))
  with pytest.raises(AssertionError):
    parity.assert_same_state({'params': linen_globals['state'].params}, ported)
  with pytest.raises(AssertionError):
    parity.assert_close(linen_globals['logits'], nnx_globals['logits'])


def test_training_code_outside_the_patterns_keeps_each_model_linen():
  source = (FIXTURES / 'todo_training_code.in.py').read_text()
  result = transform_source(source, registry.select_rules(['L2N003']))
  todos = [e.message for e in result.entries if e.code == 'L2N003' and e.kind == 'todo']
  assert len(todos) == 3
  assert 'jax.tree.map' in todos[0] and "mutable=['intermediates']" in todos[1] and 'static_argnums' in todos[2]
  assert result.source.count('.init(jax.random.key(0), jnp.ones((1, 3)))') == 3  # every model left as it was


def test_decode_view_generates_the_same_tokens_from_the_same_parameters():
  linen, linen_globals, ported, nnx_globals = _run_both('decode_view', 'AttentionLM', 'AttentionLM')
  parity.assert_close(linen_globals['tokens'], nnx_globals['tokens'])  # greedy tokens through the cache
  parity.assert_close(linen_globals['full'], nnx_globals['full'])  # the model itself kept decode=False


def test_kept_train_state_trains_to_the_same_parameters():
  """`--train-state keep` (guide_train_state.train-state=keep.out.py): the TrainState stays, around nnx.split state."""
  kept = str(FIXTURES / 'guide_train_state.train-state=keep.out.py')
  linen, linen_globals, ported, nnx_globals = _run_both('guide_train_state', 'Dense', 'Linear', kept)
  state = nnx_globals['state']
  assert type(state).__name__ == 'NNXTrainState' and int(state.step) == int(linen_globals['state'].step) == 3
  nnx.update(ported.model, state.params)  # the trained params live in the TrainState
  parity.assert_same_state({'params': linen_globals['state'].params}, ported)
  parity.assert_close(linen_globals['logits'], nnx_globals['logits'])
  parity.assert_close(linen_globals['kernel'], nnx_globals['kernel'])


def test_kept_train_state_refuses_a_model_with_train_eval_state():
  source = (FIXTURES / 'guide_train_state.in.py').read_text().replace(
      'model = nn.Dense(features=10)', 'model = Net()').replace(
      'sample_x = jnp.ones((1, 784))', 'class Net(nn.Module):\n  @nn.compact\n  def __call__(self, x, train: bool = False):\n'
      '    return nn.Dropout(0.5, deterministic=not train)(nn.Dense(10)(x))\n\n\nsample_x = jnp.ones((1, 784))')
  result = transform_source(source, registry.select_rules(['L2N003']), MigrationOptions(train_state='keep'))
  todos = [e.message for e in result.entries if e.code == 'L2N003' and e.kind == 'todo']
  assert len(todos) == 1 and 'use --train-state nnx' in todos[0]
  assert 'train_state.TrainState.create(' in result.source


def _assert_quick_start_trains_the_same(linen_globals, ported, nnx_globals, steps=4):
  for name, values in linen_globals['metrics_history'].items():  # clu's loss and accuracy, train and test
    assert len(values) == 2
    parity.assert_close(values, nnx_globals['metrics_history'][name])
  state = nnx_globals['state']
  assert int(state.step) == int(linen_globals['state'].step) == steps
  nnx.update(ported.model, state.params)  # the trained params live in the kept TrainState
  parity.assert_same_state({'params': linen_globals['state'].params}, ported)
  parity.assert_close(linen_globals['kernel'], nnx_globals['kernel'])


@pytest.mark.parametrize('train_state', ['nnx', 'keep'])
def test_quick_start_train_state_with_clu_metrics_is_kept_and_trains_the_same(tmp_path, train_state):
  # flax's Quick Start: clu metrics in a TrainState subclass, the module built by the caller and given to
  # create_train_state, compute_metrics(*, state, batch), `test_state = state`. The metrics are neither the
  # model's nor the optimizer's state, so even the default keeps the TrainState, around nnx.split state.
  source = (FIXTURES / 'train_state_metrics.in.py').read_text()
  result = transform_source(source, registry.select_rules(['L2N003']), MigrationOptions(train_state=train_state))
  assert not [e.message for e in result.entries if e.kind == 'todo']
  assert result.source == (FIXTURES / 'train_state_metrics.out.py').read_text()
  linen, linen_globals, ported, nnx_globals = _run_both('train_state_metrics', 'CNN', 'CNN')
  _assert_quick_start_trains_the_same(linen_globals, ported, nnx_globals)
  assert 'other_variables: nnx.State' in result.source.split('class TrainState')[1].split('def ')[0]


def test_an_ema_field_given_the_params_gets_the_split_params(tmp_path):
  # `ema_params=variables['params']` next to clu metrics: the kept TrainState's EMA starts from the nnx.split params.
  source = (FIXTURES / 'train_state_metrics.in.py').read_text()
  edits = [('  metrics: Metrics\n', '  metrics: Metrics\n  ema_params: Any\n'),
           ('import jax\n', 'from typing import Any\n\nimport jax\n'),
           ("  params = module.init(rng, jnp.ones([1, 8, 8, 1]))['params']", '  variables = module.init(rng, jnp.ones([1, 8, 8, 1]))'),
           ('apply_fn=module.apply, params=params, tx=tx,',
            "apply_fn=module.apply, params=variables['params'], tx=tx, ema_params=variables['params'],")]
  for old, new in edits:
    assert old in source
    source = source.replace(old, new, 1)
  linen_script, nnx_script = tmp_path / 'linen.py', tmp_path / 'nnx.py'
  linen_script.write_text(source)
  result = transform_source(source, registry.select_rules(['L2N003']))
  assert not [e.message for e in result.entries if e.kind == 'todo']
  assert 'ema_params=params,' in result.source and "variables['params']" not in result.source
  nnx_script.write_text(result.source)
  with parity.recording_linen('CNN') as linen:
    linen_globals = runpy.run_path(str(linen_script))
  with parity.transferring_into('CNN', linen) as ported:
    nnx_globals = runpy.run_path(str(nnx_script))
  _assert_quick_start_trains_the_same(linen_globals, ported, nnx_globals)
  nnx.update(ported.model, nnx_globals['state'].ema_params)  # still the initial params: nothing updates the EMA
  parity.assert_same_state({'params': linen_globals['state'].ema_params}, ported)


def test_the_quick_start_check_rejects_a_port_that_trains_differently(tmp_path):
  source = (FIXTURES / 'train_state_metrics.out.py').read_text()
  assert 'optax.sgd(learning_rate, momentum)' in source
  wrong = tmp_path / 'wrong.py'
  wrong.write_text(source.replace('optax.sgd(learning_rate, momentum)', 'optax.sgd(learning_rate)'))
  linen, linen_globals, ported, nnx_globals = _run_both('train_state_metrics', 'CNN', 'CNN', str(wrong))
  with pytest.raises(AssertionError):
    _assert_quick_start_trains_the_same(linen_globals, ported, nnx_globals)


@pytest.mark.parametrize('train_state', ['nnx', 'keep'])
def test_a_module_given_to_a_plain_train_state_factory_is_built_where_it_was(tmp_path, train_state):
  # The Quick Start without its metrics: flax's TrainState, so the default makes an nnx.Optimizer, and keep an
  # NNXTrainState placed before the factory; either way the module is built by the caller (`cnn = CNN()` ->
  # `CNN(<sizes>, rngs=nnx.Rngs(0))`, the key of the factory's init).
  source = (FIXTURES / 'train_state_metrics.in.py').read_text()
  edits = [("class TrainState(train_state.TrainState):\n  metrics: Metrics\n\n\n", ''),
           ('TrainState.create(\n      apply_fn=module.apply, params=params, tx=tx,\n      metrics=Metrics.empty())',
            'train_state.TrainState.create(apply_fn=module.apply, params=params, tx=tx)'),
           ('  state = compute_metrics(state=state, batch=batch)\n', '')]
  for old, new in edits:
    assert old in source
    source = source.replace(old, new)
  source = source[:source.index('  if (step + 1) % 2 == 0:')] + "kernel = state.params['Dense_1']['kernel']\n"
  source = source.replace('for step in range(4):', 'losses = []\nfor step in range(4):')
  source = source.replace('  state = train_step(state, batch)\n', '  state = train_step(state, batch)\n'
                          "  losses.append(compute_loss(state, batch))\n")
  source = source.replace('\n\ncnn = CNN()', """

@jax.jit
def compute_loss(state, batch):
  logits = state.apply_fn({'params': state.params}, batch['image'])
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch['label']).mean()


predictions = None
cnn = CNN()""")
  source += "predictions = jnp.argmax(state.apply_fn({'params': state.params}, batch['image']), -1)\n"
  ported = _port_and_run_both(tmp_path, source, 'CNN', MigrationOptions(train_state=train_state))
  assert 'cnn = CNN(conv_in_features=1, linear1_in_features=128, rngs=nnx.Rngs(0))' in ported
  assert 'module.init' not in ported
  if train_state == 'nnx':
    assert 'optimizer = nnx.Optimizer(module, tx, wrt=nnx.Param)\n  return module, optimizer' in ported
    assert 'TrainState.create' not in ported
  else:
    assert 'class NNXTrainState(train_state.TrainState):\n  other_variables: nnx.State\n\n\ndef create_train_state(' \
        in ported
    assert 'return NNXTrainState.create(apply_fn=graphdef.apply, params=params, tx=tx, ' \
           'other_variables=other_variables)' in ported


_GIVEN_MODULE_TODOS = [
    ('state = create_train_state(cnn, init_rng, learning_rate, momentum)\n',
     'state = create_train_state(cnn, init_rng, learning_rate, momentum)\nprint(cnn)\n',
     'cnn is used other than given to create_train_state(...) once'),
    ('init_rng = jax.random.key(0)\n', 'init_rng = jax.random.fold_in(jax.random.key(0), 1)\n',
     'init_rng, the key create_train_state initialises cnn with, is bound after it is built; bind the key first'),
    ('  params = module.init(rng,', '  rng, _ = jax.random.split(rng)\n  params = module.init(rng,',
     'is not a parameter of create_train_state bound only there'),
]


@pytest.mark.parametrize('old, new, reason', _GIVEN_MODULE_TODOS)
def test_a_given_module_the_rule_cannot_build_where_it_was_built_stays_linen_with_one_todo(old, new, reason):
  source = (FIXTURES / 'train_state_metrics.in.py').read_text()
  assert old in source
  result = transform_source(source.replace(old, new), registry.select_rules(['L2N003']))
  todos = [e.message for e in result.entries if e.code == 'L2N003' and e.kind == 'todo']
  assert len(todos) == 1 and reason in todos[0], todos
  assert "module.init(rng, jnp.ones([1, 8, 8, 1]))['params']" in result.source


def test_a_kept_train_state_subclass_with_batch_stats_stays_linen_with_one_todo():
  # Its batch statistics would have to move into other_variables, and the steps' updates with them.
  for train_state in ('keep', 'nnx'):
    source = (FIXTURES / 'train_state_factory.in.py').read_text().replace(
        '  batch_stats: Any\n', '  batch_stats: Any\n  ema_params: Any\n').replace(
        "batch_stats=variables['batch_stats'])", "batch_stats=variables['batch_stats'], ema_params=variables['params'])")
    result = transform_source(source, registry.select_rules(['L2N003']), MigrationOptions(train_state=train_state))
    todos = [e.message for e in result.entries if e.code == 'L2N003' and e.kind == 'todo']
    assert len(todos) == 1 and "the field batch_stats holding the 'batch_stats' collection" in todos[0], todos
    if train_state == 'nnx':
      assert todos[0].startswith('its field ema_params holds state that is neither the model')
    assert 'TrainState.create(' in result.source


_MODEL = '''import jax
import jax.numpy as jnp
import optax
import flax.linen as nn


class M(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x)


x = jnp.ones((4, 3))
model = M()
params = model.init(jax.random.key(0), x)['params']
tx = optax.sgd(0.1)
opt_state = tx.init(params)
'''


@pytest.mark.parametrize('code, reason', [
    ('@jax.jit\ndef step(params, opt_state):\n  grads = jax.grad(lambda p: model.apply({"params": p}, x).sum())(params)\n'
     '  updates, opt_state = tx.update(grads, opt_state)\n  params = optax.apply_updates(params, updates)\n'
     '  return params, opt_state\n\n\nresult = step(params, opt_state)\n',
     'unpacked in a different shape than it is returned'),
    ('def loss(params, x):\n  return model.apply({"params": params}, x).sum()\n\n\n'
     'grads = jax.grad(loss, argnums=1)(params, x)\n', 'argnums'),
    ('def step(params):\n  return model.apply({"params": params}, x)\n\n\nfast = jax.jit(step, static_argnums=0)\n'
     'y = fast(params)\n', 'jax.jit(step, ...) with static_argnums'),
    ('@jax.jit\ndef step(params):\n  return model.apply({"params": params}, x)\n\n\n'
     'y = step(params)\nz = step({"Dense_0": {}})\n', 'used other than called with the state of model'),
    ('params = load_checkpoint()\ny = model.apply({"params": params}, x)\n', 'also assigned other values'),
    ('y = model.apply({"params": params, "batch_stats": {}}, x)\n', 'that are not the state of model'),
])
def test_training_code_the_rule_cannot_follow_stays_linen_with_one_todo(code, reason):
  result = transform_source(_MODEL + '\n\n' + code, registry.select_rules(['L2N003']))
  todos = [e.message for e in result.entries if e.code == 'L2N003' and e.kind == 'todo']
  assert len(todos) == 1 and reason in todos[0], todos
  assert 'params = model.init(jax.random.key(0), x)[\'params\']' in result.source and 'tx.init(params)' in result.source


def test_train_state_factory_port_trains_to_the_same_losses_and_statistics():
  # A TrainState subclass with batch_stats, returned by create_train_state as `state`; the step's apply takes the
  # `train: bool = True` default, the eval step passes train=False.
  linen, linen_globals, ported, nnx_globals = _run_both('train_state_factory', 'ResNet', 'ResNet')
  parity.assert_close(linen_globals['losses'], nnx_globals['losses'])
  parity.assert_close(linen_globals['predictions'], nnx_globals['predictions'])
  parity.assert_same_state(linen.final, ported)  # params and batch stats, from the jitted eval step
  assert any(path[-1] == 'mean' for path in parity.flat_state(ported.model))
  assert linen_globals['losses'][-1] < linen_globals['losses'][0]


_DROPOUT_RNG = FIXTURES / 'train_state_dropout_rng.in.py'
_HF_STYLE = (  # transformers' Flax examples give the new key back through apply_gradients instead of replace
    ("  state = state.apply_gradients(grads=grads, batch_stats=new_model_state['batch_stats'])\n"
     "  return state.replace(dropout_rng=new_dropout_rng), loss\n"),
    ("  new_state = state.apply_gradients(\n      grads=grads, batch_stats=new_model_state['batch_stats'], "
     "dropout_rng=new_dropout_rng)\n  return new_state, loss\n"),
)


def _port_and_run_both(tmp_path, source: str, class_name: str, options: MigrationOptions = MigrationOptions()):
  """Ports `source` (no TODO may be left) and runs it and its port from the same start, one dropout mask on both."""
  linen_script, nnx_script = tmp_path / 'linen.py', tmp_path / 'nnx.py'
  linen_script.write_text(source)
  result = transform_source(source, registry.select_rules(['L2N003']), options)
  assert not [e.message for e in result.entries if e.kind == 'todo']
  nnx_script.write_text(result.source)
  with parity.same_masks():
    with parity.recording_linen(class_name) as linen:
      linen_globals = runpy.run_path(str(linen_script))
    with parity.transferring_into(class_name, linen) as ported:
      nnx_globals = runpy.run_path(str(nnx_script))
  parity.assert_close(linen_globals['losses'], nnx_globals['losses'])
  parity.assert_close(linen_globals['predictions'], nnx_globals['predictions'])
  if options.train_state == 'keep':
    nnx.update(ported.model, nnx_globals['state'].params)  # the trained params live in the kept TrainState
  parity.assert_same_state(linen.final, ported)
  assert linen_globals['losses'][-1] < linen_globals['losses'][0]
  return result.source


@pytest.mark.parametrize('step_style', STEP_STYLES)
@pytest.mark.parametrize('given_back', ['replace', 'apply_gradients'])
def test_a_dropout_key_field_goes_and_the_port_trains_the_same(tmp_path, given_back, step_style):
  # The key's split, its use in rngs= and its return into the state all go.
  source = _DROPOUT_RNG.read_text()
  if given_back == 'apply_gradients':
    assert _HF_STYLE[0] in source
    source = source.replace(*_HF_STYLE)
  ported = _port_and_run_both(tmp_path, source, 'Classifier', MigrationOptions(step_style=step_style))
  assert 'dropout_rng' not in ported.split('def train_step')[1] and 'class TrainState' not in ported
  assert 'rngs=nnx.Rngs(params_rng, dropout=dropout_rng))' in ported  # the key seeds the model's dropout stream


_JITTED_WHERE_RUN = {  # `jit_train_step = jax.jit(train_step, ...)` called in the loop, or the step's name rebound
    'alias': [('state = create_train_state(jax.random.key(0), 0.01)\n',
               'state = create_train_state(jax.random.key(0), 0.01)\n'
               'jit_train_step = jax.jit(train_step, donate_argnums=(0,))\n'),
              ('  state, loss = train_step(state, batch)', '  state, loss = jit_train_step(state, batch)')],
    'rebound': [('\n\n@jax.jit\ndef eval_step', '\n\ntrain_step = jax.jit(train_step)\n\n\n@jax.jit\ndef eval_step')],
}


@pytest.mark.parametrize('step_style', STEP_STYLES)
@pytest.mark.parametrize('wrapped', _JITTED_WHERE_RUN)
def test_a_step_jitted_where_it_is_run_becomes_an_nnx_jit_step(tmp_path, wrapped, step_style):
  source = _DROPOUT_RNG.read_text()
  for old, new in [('@jax.jit\ndef train_step(state, batch):', 'def train_step(state, batch):'),
                   *_JITTED_WHERE_RUN[wrapped]]:
    assert old in source
    source = source.replace(old, new)
  ported = _port_and_run_both(tmp_path, source, 'Classifier', MigrationOptions(step_style=step_style))
  jitted = {'alias': 'jit_train_step = nnx.jit(train_step)', 'rebound': 'train_step = nnx.jit(train_step)'}[wrapped]
  called = 'jit_train_step' if wrapped == 'alias' else 'train_step'
  assert jitted in ported.splitlines() and f'loss = {called}(model, optimizer, batch)' in ported


def test_batch_stats_given_back_through_replace(tmp_path):
  line = "  new_state = state.apply_gradients(grads=grads, batch_stats=new_model_state['batch_stats'])\n"
  source = (FIXTURES / 'train_state_factory.in.py').read_text()
  assert line in source
  source = source.replace(line, "  new_state = state.apply_gradients(grads=grads)\n"
                                "  new_state = new_state.replace(batch_stats=new_model_state['batch_stats'])\n")
  ported = _port_and_run_both(tmp_path, source, 'ResNet')
  assert '.replace(' not in ported


@pytest.mark.parametrize('use, reason', [
    ('  dropout_rng = jax.random.fold_in(state.dropout_rng, state.step)\n',
     "is passed to jax.random.fold_in, which is not converted yet (its splits, an apply's rngs= and its return"),
    ("  jax.debug.print('{}', new_dropout_rng)\n", 'is passed to jax.debug.print'),
])
def test_a_dropout_key_used_otherwise_stays_linen_with_one_todo(use, reason):
  line = '  dropout_rng, new_dropout_rng = jax.random.split(state.dropout_rng)\n'
  source = _DROPOUT_RNG.read_text()
  assert line in source
  if 'fold_in' in use:
    source = source.replace(line, use + '  new_dropout_rng = dropout_rng\n')
  else:
    source = source.replace(line, line + use)
  result = transform_source(source, registry.select_rules(['L2N003']))
  todos = [e.message for e in result.entries if e.code == 'L2N003' and e.kind == 'todo']
  assert len(todos) == 1 and reason in todos[0], todos
  assert 'TrainState.create(' in result.source
