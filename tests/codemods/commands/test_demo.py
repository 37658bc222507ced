"""`linen2nnx demo`: the bundled project migrates with no TODO and every model matches its Linen original;
a broken port is a FAIL row, and a project without examples is a usage error."""

import json
import pathlib
import shutil

import pytest

from codemods import cli
from codemods.commands import demo

EXAMPLES = {'variational_autoencoder', 'seq2seq_lstm', 'translator', 'vision_transformer', 'language_model', 'resnet'}


@pytest.fixture(scope='module')
def migrated(tmp_path_factory):
  """The bundled project, migrated once with its examples: (Linen copy, migrated copy, report path, result)."""
  work = tmp_path_factory.mktemp('demo')
  linen_dir, nnx_dir = work / 'linen', work / 'nnx'
  for target in (linen_dir, nnx_dir):
    shutil.copytree(demo.BUNDLED_PROJECT, target, ignore=shutil.ignore_patterns('__pycache__'))
  result = demo.migrate_project(nnx_dir, examples=True)
  report = work / 'migrate-report.json'
  report.write_text(result.to_json())
  return linen_dir, nnx_dir, report, result


@pytest.mark.slow
def test_the_bundled_project_passes(migrated):
  linen_dir, nnx_dir, report, result = migrated
  assert not result.failed
  assert not [e for f in result.files for e in f.entries if e.kind == 'todo']
  rows = {row.model: row for row in demo.check_models(linen_dir, nnx_dir, report, result, atol=1e-5)}
  assert set(rows) == EXAMPLES
  for row in rows.values():
    assert row.verdict == 'PASS' and row.todos == 0 and row.classes_converted > 0, row
    assert row.max_forward_diff <= 1e-5 and row.max_grad_diff <= 1e-5, row
  sizes = result.input_sizes()
  assert sizes['code'] + sizes['examples'] > sizes['arguments']
  migrated_vae = (nnx_dir / 'model_zoo' / 'vae.py').read_text()
  assert 'flax.linen' not in migrated_vae and 'nnx_bridge' not in migrated_vae  # plain NNX, no toolkit import


@pytest.mark.slow
def test_cached_decoding_and_method_calls_run_as_in_linen(migrated):
  """The LM's decode cache (an nnx.List of blocks, each with init_cache) decodes token by token exactly as the
  Linen model with `mutable=['cache']` does on the same parameters; the migrated helper functions run."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  import nnx_bridge
  from codemods import examples as example_traces
  from codemods.ports import model_refs

  linen_dir, nnx_dir, report, _ = migrated
  with demo._importable(linen_dir), demo._migrated_imports():
    (_, linen, inputs, kwargs), = [e for e in example_traces.load_examples(str(linen_dir / demo.EXAMPLES_FILE))
                                   if e[0] == 'language_model']
    model, port = demo.build_port(linen, inputs, kwargs, linen_dir, nnx_dir, report)
    variables = linen.init(jax.random.key(0), *inputs)
    mapping, _ = port.mapping(linen, model, *inputs)
    nnx_bridge.linen_to_nnx(variables, model, mapping)
    model.eval()
    prompt, steps = inputs[0][:, :3], 4
    full = (prompt.shape[0], prompt.shape[1] + steps)
    decoder = linen.clone(decode=True)
    cache = decoder.init(jax.random.key(1), jnp.ones(full, jnp.int32))['cache']
    nnx_decoder = nnx.with_attributes(model, decode=True)
    nnx_decoder.init_cache(full)
    token = prompt
    for _ in range(steps):
      want, updates = decoder.apply({'params': variables['params'], 'cache': cache}, token, mutable=['cache'])
      cache = updates['cache']
      got = nnx_decoder(token)
      np.testing.assert_allclose(got, want, atol=1e-5)
      token = jnp.argmax(want[:, -1:], axis=-1)
    lm = model_refs.load_object(f'{nnx_dir / "model_zoo" / "lm.py"}:greedy_generate')
    translator = model_refs.load_object(f'{nnx_dir / "model_zoo" / "translator.py"}:greedy_translate')
    assert lm(prompt, 3).shape == (2, 3) and translator(prompt, 2).shape == (2, 2)


def _flops(lowered) -> float:
  """The FLOPs of the program as traced, before XLA's optimisations (whose fusion choices differ run to run)."""
  return lowered.cost_analysis()['flops']


@pytest.mark.slow
def test_compiled_code_does_the_same_work(migrated):
  """Issue 8: each converted model's jitted forward and gradient lower to the FLOP count of the Linen original
  (within 1%: NNX's scan over stacked layers slices and transposes a little more) with as many parameters."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from codemods import examples as example_traces
  from nnx_bridge import modes

  linen_dir, nnx_dir, report, _ = migrated
  loss = lambda out: sum(jnp.sum(leaf.astype(jnp.float32) ** 2) for leaf in jax.tree.leaves(out))
  seen = set()
  with demo._importable(linen_dir), demo._migrated_imports():
    for name, linen, inputs, kwargs in example_traces.load_examples(str(linen_dir / demo.EXAMPLES_FILE)):
      model, _ = demo.build_port(linen, inputs, kwargs, linen_dir, nnx_dir, report)
      module, mode = modes.for_mode(linen, None, modes.mode_arguments_of(linen), **modes.EVAL)
      variables = module.init(jax.random.key(0), *inputs, **mode, **kwargs)
      model.eval()
      linen_forward = jax.jit(lambda v, *x: module.apply(v, *x, **mode, **kwargs)).lower(variables, *inputs)
      nnx_forward = nnx.jit(lambda m, *x: m(*x, **kwargs)).lower(model, *inputs)
      linen_grad = jax.jit(jax.grad(lambda p, *x: loss(module.apply({**variables, 'params': p}, *x, **mode, **kwargs)))
                           ).lower(variables['params'], *inputs)
      nnx_grad = nnx.jit(nnx.grad(lambda m, *x: loss(m(*x, **kwargs)))).lower(model, *inputs)
      assert _flops(nnx_forward) == pytest.approx(_flops(linen_forward), rel=0.01), name
      assert _flops(nnx_grad) == pytest.approx(_flops(linen_grad), rel=0.01), name
      linen_params = sum(leaf.size for leaf in jax.tree.leaves(variables['params']))
      assert sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))) == linen_params, name
      seen.add(name)
  assert seen == EXAMPLES


def test_the_flop_check_tells_models_apart():
  """The FLOP comparison above can fail: a port with a wider hidden layer compiles to more work."""
  import jax.numpy as jnp
  from flax import nnx

  x = jnp.ones((2, 6))
  narrow = nnx.jit(lambda m, x: m(x)).lower(nnx.Linear(6, 4, rngs=nnx.Rngs(0)), x)
  wide = nnx.jit(lambda m, x: m(x)).lower(nnx.Linear(6, 8, rngs=nnx.Rngs(0)), x)
  assert _flops(wide) != pytest.approx(_flops(narrow), rel=0.01)


def _vae_only_project(tmp_path: pathlib.Path) -> pathlib.Path:
  project = tmp_path / 'project'
  shutil.copytree(demo.BUNDLED_PROJECT, project, ignore=shutil.ignore_patterns('__pycache__'))
  (project / 'examples.py').write_text(
      'import jax\nfrom model_zoo.vae import VAE\n\n\n'
      'def vae():\n  return VAE(hidden=8, latents=2, out_dim=5), (jax.random.uniform(jax.random.key(0), (3, 5)),)\n')
  return project


def test_a_broken_port_is_a_fail_row(tmp_path):
  project = _vae_only_project(tmp_path)
  linen_dir, nnx_dir = tmp_path / 'linen', tmp_path / 'nnx'
  shutil.copytree(project, linen_dir)
  shutil.copytree(project, nnx_dir)
  result = demo.migrate_project(nnx_dir, examples=True)
  report = tmp_path / 'report.json'
  report.write_text(result.to_json())
  vae = nnx_dir / 'model_zoo' / 'vae.py'
  good = vae.read_text()
  for precision in ('highest', 'default'):
    (row,) = demo.check_models(linen_dir, nnx_dir, report, result, atol=1e-5, precision=precision)
    assert row.verdict == 'PASS', row
  vae.write_text(good.replace('x = nnx.relu(self.fc1(x))', 'x = nnx.gelu(self.fc1(x))'))
  for precision in ('highest', 'default'):
    (row,) = demo.check_models(linen_dir, nnx_dir, report, result, atol=1e-5, precision=precision)
    assert row.verdict == 'FAIL' and row.max_forward_diff > 1e-3, (precision, row)
  assert 'FAIL' in demo.format_table([row]) and '0 of 1 models PASS' in demo.format_table([row])


def test_the_command_prints_one_row_per_model_and_the_backend_and_precision(tmp_path, capsys):
  """Besides the table: on stderr, the temporary work folder with the --keep that keeps it, then a line as the
  migration starts and as each model is checked; the table says what its size args count."""
  import jax

  project = str(_vae_only_project(tmp_path))
  assert cli.main(['demo', '--project', project, '--json']) == 0
  out, err = capsys.readouterr()
  printed = json.loads(out)
  lines = err.splitlines()
  assert lines[0].startswith('linen2nnx demo: working in ') and lines[0].endswith(
      ', deleted at the end (--keep DIR keeps the migrated code)'), err
  assert lines[1] == 'linen2nnx demo: migrating project with the traces of examples.py ...', err
  assert 'from an argument of their class' in lines[2] and 'constructor' not in lines[2], err
  assert lines[3:] == ['linen2nnx demo: checking vae (1 of 1) ...'], err
  (row,) = printed['models']
  assert row['model'] == 'vae' and row['verdict'] == 'PASS' and row['classes_converted'] == 3
  assert (printed['backend'], printed['precision']) == (jax.default_backend(), 'highest')
  assert cli.main(['demo', '--project', project, '--precision', 'default']) == 0
  table = capsys.readouterr().out
  assert table.startswith(f"backend {jax.default_backend()}, matmul precision default (the backend's)")
  assert '1 of 1 models PASS' in table
  assert "size args: the input sizes a model's own constructor takes" in table


def test_a_project_without_examples_is_a_usage_error(tmp_path, capsys):
  assert cli.main(['demo', '--project', str(tmp_path)]) == 2
  assert 'has no examples.py' in capsys.readouterr().err
  assert cli.main(['demo', '--keep', str(tmp_path)]) == 2  # an existing folder is never written into
  assert 'already exists' in capsys.readouterr().err
  keep = tmp_path / 'kept'
  assert cli.main(['demo', '--project', str(_vae_only_project(tmp_path)), '--keep', str(keep), '--json']) == 0
  assert 'deleted at the end' not in capsys.readouterr().err and (keep / 'nnx' / 'model_zoo' / 'vae.py').is_file()


def test_a_keep_folder_that_cannot_be_created_is_one_line_and_exit_2(tmp_path, capsys):
  (tmp_path / 'file').write_text('')
  assert cli.main(['demo', '--keep', str(tmp_path / 'file' / 'work')]) == 2
  assert capsys.readouterr().err == (f'linen2nnx demo: --keep {tmp_path}/file/work: cannot be created (Not a '
                                     'directory); give a new folder in a folder you can write to\n')
