"""The version reads off the installed distribution, else off the source tree's pyproject.toml: a tree copied to a
machine without the package installed (the TPU machine reaches no registry) still imports and says its version."""

import importlib.metadata
import tomllib

from nnx_bridge import distribution as module


def _not_installed(name):
  raise importlib.metadata.PackageNotFoundError(name)


def test_the_installed_version_is_the_pyprojects():
  assert module.package_version() == tomllib.loads(module.PYPROJECT.read_text())['project']['version']


def test_a_source_tree_not_installed_reads_its_pyproject(monkeypatch, tmp_path):
  monkeypatch.setattr(importlib.metadata, 'version', _not_installed)
  (tmp_path / 'pyproject.toml').write_text('[project]\nname = "linen2nnx"\nversion = "9.8.7"\n')
  monkeypatch.setattr(module, 'PYPROJECT', tmp_path / 'pyproject.toml')
  assert module.package_version() == '9.8.7'
  monkeypatch.setattr(module, 'PYPROJECT', tmp_path / 'missing.toml')
  assert module.package_version() == '0+unknown'
