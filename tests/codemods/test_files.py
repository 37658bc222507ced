"""`codemods.files`: unreadable directories are reported, symlinks written through, owner and mode kept,
and a run that finds no Python file says so."""

import json
import os
import pathlib

import pytest

from codemods import cli
from codemods import files
from codemods import rules as registry
from codemods.engine import migrate

RULES = registry.select_rules(['L2N001'])
LINEN = 'import flax.linen as nn\n\nW = nn.initializers.zeros\n'
MIGRATED = 'from flax import nnx\n\nW = nnx.initializers.zeros\n'


def _tree(root: pathlib.Path, names: list[str]) -> pathlib.Path:
  for name in names:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(LINEN)
  return root


def _deny(monkeypatch, denied: pathlib.Path) -> None:
  """Makes listing `denied` fail as a chmod 000 directory does, for a user that is not root."""
  scandir = os.scandir

  def guarded(path='.'):
    if os.path.abspath(os.fspath(path)) == str(denied):
      raise PermissionError(13, 'Permission denied', os.fspath(path))
    return scandir(path)

  monkeypatch.setattr(os, 'scandir', guarded)


def _check_denied_is_failed(tmp_path: pathlib.Path) -> None:
  result = migrate([tmp_path], rules=RULES, write=True, jobs=1)
  denied = (tmp_path / 'secret').as_posix()
  assert [(o.path, o.status, o.error) for o in result.failed] == [
      (denied, 'failed', 'cannot read directory: Permission denied')]
  assert result.summary() == {'changed': 1, 'unchanged': 0, 'skipped': 0, 'failed': 1}
  assert denied in [f['path'] for f in json.loads(result.to_json())['files']]
  assert (tmp_path / 'a.py').read_text() == MIGRATED


def test_a_directory_that_cannot_be_listed_is_a_failed_outcome(tmp_path, monkeypatch):
  _tree(tmp_path, ['a.py', 'secret/b.py'])
  _deny(monkeypatch, tmp_path / 'secret')
  _check_denied_is_failed(tmp_path)


@pytest.mark.skipif(os.name != 'posix' or os.geteuid() == 0, reason='root reads a chmod 000 directory')
def test_a_chmod_000_directory_is_a_failed_outcome(tmp_path):
  _tree(tmp_path, ['a.py', 'secret/b.py'])
  (tmp_path / 'secret').chmod(0)
  try:
    _check_denied_is_failed(tmp_path)
  finally:
    (tmp_path / 'secret').chmod(0o755)


def test_a_symlinked_file_is_written_through_and_stays_a_link(tmp_path):
  outside = _tree(tmp_path / 'outside', ['target.py']) / 'target.py'
  tree = tmp_path / 'tree'
  tree.mkdir()
  (tree / 'link.py').symlink_to(outside)
  result = migrate([tree], rules=RULES, write=True, jobs=1)
  assert [(pathlib.Path(o.path).name, o.status) for o in result.files] == [('link.py', 'changed')]
  assert (tree / 'link.py').is_symlink() and (tree / 'link.py').resolve() == outside
  assert outside.read_text() == MIGRATED


def test_a_file_found_through_a_link_and_by_name_is_migrated_once(tmp_path):
  _tree(tmp_path, ['a.py'])
  (tmp_path / 'b.py').symlink_to('a.py')
  assert files.find_files([tmp_path]).files == ((tmp_path / 'a.py').as_posix(),)
  result = migrate([tmp_path], rules=RULES, write=True, jobs=2)
  assert [(pathlib.Path(o.path).name, o.status) for o in result.files] == [('a.py', 'changed')]
  assert (tmp_path / 'b.py').is_symlink() and (tmp_path / 'a.py').read_text() == MIGRATED


def test_a_rewritten_file_keeps_its_mode_owner_and_group(tmp_path):
  path = _tree(tmp_path, ['a.py']) / 'a.py'
  path.chmod(0o640)
  owner = (1234, 2345) if os.geteuid() == 0 else (os.getuid(), os.getgid())
  if os.geteuid() == 0:
    os.chown(path, *owner)
  files.write_atomic(str(path), MIGRATED.encode())
  status = path.stat()
  assert (status.st_mode & 0o7777, status.st_uid, status.st_gid) == (0o640, *owner)
  assert path.read_text() == MIGRATED
  assert sorted(os.listdir(tmp_path)) == ['a.py']  # no temporary file left


@pytest.mark.parametrize('names', [[], ['notes.txt', 'sub/data.json']], ids=['empty', 'no_python'])
def test_a_run_that_finds_no_python_file_says_so(tmp_path, names, capsys):
  for name in names:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text('x')
  with pytest.raises(ValueError, match=f'^no Python files found under {tmp_path}$'):
    migrate([tmp_path], rules=RULES)
  assert cli.main(['migrate', str(tmp_path)]) == 2
  assert capsys.readouterr().err == f'linen2nnx migrate: no Python files found under {tmp_path}\n'


def test_a_run_whose_globs_leave_out_every_file_is_an_empty_result(tmp_path):
  _tree(tmp_path, ['a.py'])
  assert files.find_files([tmp_path], exclude=['*.py']) == files.FoundFiles((), (), 1)
  assert migrate([tmp_path], rules=RULES, exclude=['*.py']).files == ()
