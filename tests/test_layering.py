"""Dependencies point one way: the runtime never imports the codemod or libcst."""

import subprocess
import sys

import pytest


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
