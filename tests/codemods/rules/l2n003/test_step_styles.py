"""`--step-style`: how L2N003 writes a converted training step, and that each style trains like Linen.

functional (the default): `@jax.jit` over `(graphdef, state)`, donating `state`, `nnx.split` (and a copy
of the state) before the loop that calls the step, `nnx.update` after it. cached: the `@nnx.jit` step called through
`nnx.cached_partial`. nnx-jit: the `@nnx.jit` step called with the model and optimizer. Each
style's port of the training scripts (and of the epoch fixture) is run from the Linen run's
initial variables and must give the same losses, outputs and final state (tests/codemods/rules/training_parity.py);
a port that leaves the model stale (no `nnx.update` after the loop) must fail that check. A step a
style cannot be applied to safely stays `@nnx.jit`, with a report entry that says why.
"""

from __future__ import annotations

import pathlib
import runpy

import jax
import pytest
from flax import nnx

from codemods import cli
from codemods import rules as registry
from codemods.options import STEP_STYLES
from codemods.options import MigrationOptions
from codemods.transform import transform_source
from tests.codemods.rules import training_parity as parity

ROOT = pathlib.Path(__file__).resolve().parents[4]
SCRIPTS = ROOT / 'fixtures' / 'training'
EPOCHS = ROOT / 'fixtures' / 'L2N003' / 'step_style_epochs.in.py'
MODELS = {'mlp_classifier': 'MLPClassifier', 'cnn_batchnorm': 'SmallCNN'}
KWARGS = {'mlp_classifier': {'dropout_rate': 0.0}, 'cnn_batchnorm': {}}
TOL = dict(rtol=1e-5, atol=1e-6)  # as tests/codemods/rules/l2n003/test_training_scripts.py
STALE = '  nnx.update((model, optimizer), state)\n'
COPY = 'state = jax.device_put(nnx.to_pure_dict(state), may_alias=False)'  # the state the step donates, a copy

# What each style writes for the scripts' `train_step(state, x, y, ...)` and its loop.
MARKERS = {
    'functional': ("  @jax.jit(donate_argnames='state')\n  def train_step(graphdef, state, ",
                   '    model, optimizer = nnx.merge(graphdef, state)\n',
                   'nnx.to_pure_dict(nnx.state((model, optimizer)))', '  graphdef, state = nnx.split((model, optimizer))\n',
                   f'  {COPY}\n', ', state = train_step(graphdef, state, ', STALE),
    'cached': ('  @nnx.jit\n  def train_step(model, optimizer, ',
               '  cached_train_step = nnx.cached_partial(train_step, model, optimizer)\n', ' = cached_train_step('),
    'nnx-jit': ('  @nnx.jit\n  def train_step(model, optimizer, ', ' = train_step(model, optimizer, '),
}


def convert(source: str, style: str, rules=registry.ALL_RULES, **options):
  """The result of migrating `source` (its `.source` is bytes)."""
  return transform_source(source.encode(), rules, MigrationOptions(step_style=style, **options))


def l2n003(source: str, style: str, **options):
  return convert(source, style, registry.select_rules(['L2N003']), **options)


def notes(result) -> list[str]:
  return [e.message for e in result.entries if 'step style' in e.message and 'not applied' in e.message]


@pytest.fixture(scope='module')
def linen_run():
  """Each training script's Linen run, once for the file."""
  runs = {}

  def run(name: str):
    if name not in runs:
      with parity.recording_linen(MODELS[name]) as record:
        losses, output = runpy.run_path(str(SCRIPTS / f'{name}.py'), run_name=f'_l2n_linen_{name}')['train'](**KWARGS[name])
        output = jax.block_until_ready(output)
      runs[name] = record, losses, output
    return runs[name]
  return run


def port_run(source: str, path: pathlib.Path, name: str, linen: parity.LinenRecord):
  path.write_text(source)
  with parity.transferring_into(MODELS[name], linen) as record:
    losses, output = runpy.run_path(str(path), run_name=f'_l2n_port_{name}')['train'](**KWARGS[name])
    output = jax.block_until_ready(output)
  return record, losses, output


def assert_trains_like_linen(linen_result, port_result) -> None:
  (linen, linen_losses, linen_output), (ported, losses, output) = linen_result, port_result
  parity.assert_close(linen_losses, losses, **TOL)
  parity.assert_close(linen_output, output, **TOL)
  parity.assert_same_state(linen.final, ported, **TOL)


# --- the training scripts, each style ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize('style', STEP_STYLES)
@pytest.mark.parametrize('name', MODELS)
def test_each_style_trains_to_the_same_losses_output_and_parameters(linen_run, tmp_path, name, style):
  result = convert((SCRIPTS / f'{name}.py').read_text(), style)
  assert not [e for e in result.entries if e.kind == 'todo']
  assert not notes(result), notes(result)  # applied, not fallen back
  source = result.source.decode()
  for marker in MARKERS[style]:
    assert marker in source, marker
  assert_trains_like_linen(linen_run(name), port_run(source, tmp_path / f'{name}.py', name, linen_run(name)[0]))


@pytest.mark.slow
def test_dropping_the_update_after_the_loop_leaves_the_model_stale_and_fails(linen_run, tmp_path):
  source = convert((SCRIPTS / 'mlp_classifier.py').read_text(), 'functional').source.decode()
  assert source.count(STALE) == 1
  stale = port_run(source.replace(STALE, ''), tmp_path / 'stale.py', 'mlp_classifier', linen_run('mlp_classifier')[0])
  parity.assert_close(linen_run('mlp_classifier')[1], stale[1], **TOL)  # the steps themselves are right ...
  with pytest.raises(AssertionError):
    parity.assert_same_state(linen_run('mlp_classifier')[0].final, stale[0], **TOL)  # ... the model never sees them
  with pytest.raises(AssertionError):
    assert_trains_like_linen(linen_run('mlp_classifier'), stale)


# --- the epoch fixture: an eval after each epoch, BatchNorm, a mode switch per epoch ------------


def _epochs(source: str, path: pathlib.Path):
  with parity.recording_linen('Net') as linen:
    linen_globals = runpy.run_path(str(EPOCHS))
  path.write_text(source)
  with parity.transferring_into('Net', linen) as ported:
    nnx_globals = runpy.run_path(str(path))
  return linen, linen_globals, ported, nnx_globals


@pytest.mark.slow
@pytest.mark.parametrize('style', STEP_STYLES)
def test_epoch_loop_with_evals_trains_the_same_in_each_style(tmp_path, style):
  result = l2n003(EPOCHS.read_text(), style)
  assert not notes(result), notes(result)
  linen, linen_globals, ported, nnx_globals = _epochs(result.source.decode(), tmp_path / 'epochs.py')
  for name in ('losses', 'eval_losses'):
    parity.assert_close(linen_globals[name], nnx_globals[name], **TOL)
  parity.assert_same_state(linen.final, ported, **TOL)  # params and batch stats after the last epoch


@pytest.mark.slow
def test_epoch_loop_without_the_update_evaluates_a_stale_model(tmp_path):
  source = l2n003(EPOCHS.read_text(), 'functional').source.decode()
  update = '    nnx.update((model, optimizer), state)\n'
  assert source.count(update) == 1
  check = 'assert len(losses) == 12 and eval_losses[-1] < eval_losses[0]\n'
  assert source.endswith(check)
  stale = source.replace(update, '')
  with pytest.raises(AssertionError):  # the fixture's own check: evaluation does not improve
    run_source(stale)
  linen, linen_globals, ported, nnx_globals = _epochs(stale.replace(check, ''), tmp_path / 'stale.py')
  parity.assert_close(linen_globals['losses'][:4], nnx_globals['losses'][:4], **TOL)  # the first epoch trains right
  for name in ('losses', 'eval_losses'):  # then each epoch starts again from the stale model
    with pytest.raises(AssertionError):
      parity.assert_close(linen_globals[name], nnx_globals[name], **TOL)


def test_functional_step_is_traced_once_across_epochs(monkeypatch):
  """Each epoch splits again; the graphdef is equal, so jax.jit reuses the compiled step."""
  source = l2n003(EPOCHS.read_text(), 'functional').source.decode()
  merges = []
  original = nnx.merge
  monkeypatch.setattr(nnx, 'merge', lambda *args, **kwargs: merges.append(1) or original(*args, **kwargs))
  namespace = {'__name__': 'epochs_port'}
  exec(compile(source, 'epochs_port.py', 'exec'), namespace)
  assert len(namespace['losses']) == 12
  assert len(merges) == 1  # nnx.merge runs only while tracing train_step


def test_functional_step_donates_a_copy_so_arrays_held_elsewhere_stay_valid():
  """The step's state buffers are donated (reused for the new state); the loop starts from a copy, so an array the
  model held before the loop, still held by other code, stays readable. Without the copy the first step deletes it."""
  source = l2n003(EPOCHS.read_text(), 'functional').source.decode()
  split = '    graphdef, state = nnx.split((model, optimizer))\n'
  assert source.count(split) == 1 and source.count(f'    {COPY}\n') == 1
  held = source.replace(split, '    held = jax.tree.leaves(nnx.to_pure_dict(nnx.state(model, nnx.Param)))\n' + split).replace(
      '    nnx.update((model, optimizer), state)\n',
      '    nnx.update((model, optimizer), state)\n    held_sums.append(float(sum(a.sum() for a in held)))\n')
  held = held.replace('\nlosses, eval_losses = train(', '\nheld_sums = []\nlosses, eval_losses = train(', 1)
  assert '\nheld_sums = []\n' in held
  namespace = run_source(held)
  assert len(namespace['losses']) == 12 and len(namespace['held_sums']) == 3
  with pytest.raises(ValueError, match='deleted or donated'):  # the model's own arrays donated: the held one is gone
    run_source(held.replace(COPY, 'state = nnx.to_pure_dict(state)'))


# --- where a style does not apply ---------------------------------------------------------------

_PROGRAM = '''import jax
import jax.numpy as jnp
import optax
import flax.linen as nn


class Regressor(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(nn.tanh(nn.Dense(8)(x)))


x = jnp.linspace(-1, 1, 16)[:, None]
y = jnp.sin(3 * x)
{extra}model = Regressor()
params = model.init(jax.random.key(0), x)['params']
tx = optax.adam(1e-2)
opt_state = tx.init(params)


@jax.jit
def train_step(params, opt_state, x, y):
  def loss_fn(params):
    return ((model.apply({{'params': params}}, x) - y) ** 2).mean()
  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = tx.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  return params, opt_state, loss


{loop}
predictions = model.apply({{'params': params}}, x)
'''


def program(loop: str, extra: str = '') -> str:
  return _PROGRAM.format(loop=loop, extra=extra)


def run_source(source: bytes | str) -> dict:
  namespace = {'__name__': 'step_style_port'}
  exec(compile(source, 'step_style_port.py', 'exec'), namespace)
  return namespace


def test_a_step_called_once_outside_a_loop_stays_nnx_jit():
  source = program('params, opt_state, loss = train_step(params, opt_state, x, y)\n')
  for style in ('functional', 'cached'):
    result = l2n003(source, style)
    assert notes(result) == [f'train_step: stays @nnx.jit over the model; step style {style} not applied: it is '
                             'called outside a loop (line 34)']
    assert '@nnx.jit\ndef train_step(model, optimizer, x, y):' in result.source.decode()
    run_source(result.source)


def test_a_loop_that_can_return_before_the_update_falls_back_to_cached():
  loop = ('def fit(params, opt_state):\n  for _ in range(5):\n    params, opt_state, loss = train_step(params, opt_state, x, y)\n'
          '    if loss < 1e-6:\n      return loss\n  return loss\n\n\nloss = fit(params, opt_state)\n')
  result = l2n003(program(loop), 'functional')
  assert len(notes(result)) == 1 and 'the loop that calls it can leave by a return before nnx.update' in notes(result)[0]
  assert notes(result)[0].endswith('cached instead (the next fastest)')
  assert '  cached_train_step = nnx.cached_partial(train_step, model, optimizer)\n' in result.source.decode()
  run_source(result.source)
  cached = l2n003(program(loop), 'cached')
  assert not notes(cached)
  assert '  cached_train_step = nnx.cached_partial(train_step, model, optimizer)\n' in cached.source.decode()
  run_source(cached.source)


def test_calls_in_nested_loops_fall_back():
  loop = ('for _ in range(2):\n  params, opt_state, loss = train_step(params, opt_state, x, y)\n'
          '  for _ in range(2):\n    params, opt_state, loss = train_step(params, opt_state, x, y)\n')
  result = l2n003(program(loop), 'functional')
  assert notes(result) and notes(result)[0].endswith('it is called in nested loops')
  run_source(result.source)


def test_functional_names_taken_by_other_code_get_an_nnx_prefix():
  loop = 'for _ in range(3):\n  params, opt_state, loss = train_step(params, opt_state, x, y)\n'
  result = l2n003(program(loop, extra="graphdef, state = 'kept', {'a': 1}\n"), 'functional')
  source = result.source.decode()
  assert 'nnx_graphdef, nnx_state = nnx.split((model, optimizer))\n' in source
  assert 'loss, nnx_state = train_step(nnx_graphdef, nnx_state, x, y)\n' in source
  namespace = run_source(result.source)
  assert namespace['graphdef'] == 'kept' and namespace['state'] == {'a': 1}
  assert int(namespace['optimizer'].step[...]) == 3  # nnx.update after the loop


def test_functional_reuses_the_name_of_the_linen_state():
  """`state` held the TrainState, whose every use is rewritten: the split state may take the name."""
  result = l2n003((ROOT / 'fixtures' / 'L2N003' / 'guide_train_state.in.py').read_text(), 'functional')
  assert 'graphdef, state = nnx.split((model, optimizer))' in result.source.decode()


def test_nnx_jit_style_writes_what_the_rule_always_wrote():
  loop = 'for _ in range(3):\n  params, opt_state, loss = train_step(params, opt_state, x, y)\n'
  source = l2n003(program(loop), 'nnx-jit').source.decode()
  assert '@nnx.jit\ndef train_step(model, optimizer, x, y):' in source
  assert '  loss = train_step(model, optimizer, x, y)\n' in source
  assert 'nnx.split' not in source and 'cached_partial' not in source


def test_keep_train_state_and_pmap_steps_say_why_no_style_applies():
  keep = l2n003((ROOT / 'fixtures' / 'L2N003' / 'guide_train_state.in.py').read_text(),
                'cached', train_state='keep')
  assert notes(keep) == ['train_step: stays a jax.jit step over the kept TrainState (--train-state keep); step style '
                         'cached not applied']
  pmap = l2n003((ROOT / 'fixtures' / 'L2N003' / 'pmap_data_parallel.in.py').read_text(), 'functional')
  assert [n.split(';')[0] for n in notes(pmap)] == ['train_step: stays an nnx.pmap step over the model']
  assert not notes(l2n003((ROOT / 'fixtures' / 'L2N003' / 'pmap_data_parallel.in.py').read_text(), 'nnx-jit'))


# --- the option ---------------------------------------------------------------------------------


def test_step_style_option_from_the_command_line_and_the_settings(tmp_path, monkeypatch, capsys):
  (tmp_path / 'train.py').write_text((ROOT / 'fixtures' / 'L2N003' / 'guide_train_state.in.py').read_text())
  monkeypatch.chdir(tmp_path)
  assert cli.main(['migrate', '-j', '1', 'train.py']) == 0
  assert 'graphdef, state = nnx.split((model, optimizer))' in capsys.readouterr().out  # the default: functional
  assert cli.main(['migrate', '-j', '1', '--step-style', 'cached', 'train.py']) == 0
  assert 'cached_train_step = nnx.cached_partial(train_step, model, optimizer)' in capsys.readouterr().out
  (tmp_path / 'pyproject.toml').write_text('[tool.linen2nnx]\nstep-style = "nnx-jit"\n')
  assert cli.main(['migrate', '-j', '1', 'train.py']) == 0
  out = capsys.readouterr().out
  assert '+@nnx.jit' in out and 'nnx.split' not in out
  assert cli.main(['migrate', '-j', '1', '--step-style', 'functional', 'train.py']) == 0  # the flag wins
  assert 'nnx.split((model, optimizer))' in capsys.readouterr().out
  (tmp_path / 'pyproject.toml').write_text('[tool.linen2nnx]\nstep-style = "fast"\n')
  assert cli.main(['migrate', '-j', '1', 'train.py']) == 2
  assert "step-style must be one of functional, cached, nnx-jit, got 'fast'" in capsys.readouterr().err
  with pytest.raises(ValueError):
    MigrationOptions(step_style='jit')


def test_step_style_option_reaches_the_worker_processes(tmp_path, monkeypatch, capsys):
  for name in ('a.py', 'b.py'):
    (tmp_path / name).write_text((ROOT / 'fixtures' / 'L2N003' / 'guide_train_state.in.py').read_text())
  monkeypatch.chdir(tmp_path)
  assert cli.main(['migrate', '-j', '2', '--step-style', 'cached', 'a.py', 'b.py']) == 0
  assert capsys.readouterr().out.count('nnx.cached_partial(train_step, model, optimizer)') == 2
