"""Dependencies point one way: the runtime never imports the codemod or libcst, and the codemod imports jax
only where it runs the user's models (`--examples`, `verify`, `convert`, `demo`, `layers --verify`)."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_NO_JAX = 'bad = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "flax", "orbax"))\nassert not bad, bad\n'


def test_runtime_does_not_import_libcst_or_codemods():
  script = (
      'import sys, nnx_bridge\n'
      'bad = sorted(m for m in sys.modules if m.split(".")[0] in ("libcst", "codemods"))\n'
      'assert not bad, bad\n'
  )
  subprocess.run([sys.executable, '-c', script], check=True)


def test_public_api():
  import nnx_bridge

  for name in nnx_bridge.__all__:
    assert hasattr(nnx_bridge, name), name
  assert callable(nnx_bridge.from_linen) and callable(nnx_bridge.to_linen)


def test_cli_version_and_help(capsys):
  from codemods import cli

  assert cli.main([]) == 0
  assert 'layers' in capsys.readouterr().out
  with pytest.raises(SystemExit) as exit:
    cli.main(['--version'])
  assert exit.value.code == 0
  assert capsys.readouterr().out.strip() == f'linen2nnx {__import__("nnx_bridge").__version__}'


def test_the_layer_table_imports_without_jax():
  subprocess.run([sys.executable, '-c', 'import sys, nnx_bridge.layer_table\n' + _NO_JAX], check=True)


def test_the_engine_and_the_rules_import_without_jax():
  script = 'import sys, codemods.engine, codemods.rules\nassert "jax" not in sys.modules\n' + _NO_JAX
  subprocess.run([sys.executable, '-c', script], check=True)


def test_migrate_check_of_one_file_imports_no_jax():
  script = (
      'import sys\n'
      'from codemods import cli\n'
      f'code = cli.main(["migrate", "--check", "-j", "1", {str(ROOT / "fixtures" / "L2N002" / "setup_mlp.in.py")!r}])\n'
      'assert code == 1, code\n' + _NO_JAX
  )
  subprocess.run([sys.executable, '-c', script], check=True, capture_output=True)
