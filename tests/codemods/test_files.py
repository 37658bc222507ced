"""`codemods.files`: unreadable directories are reported, symlinks written through, owner and mode kept, a
path that holds no Python file is a usage error, and an output path that cannot be written is refused."""

import ast
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


FOLDER_WITHOUT_PYTHON = ("a folder without .py or .ipynb files (.gitignore'd ones do not count); "
                         f'{files.ACCEPTED}')


@pytest.mark.parametrize('names', [[], ['notes.txt', 'sub/data.json'], ['.gitignore', 'build/a.py']],
                         ids=['empty', 'no_python', 'only_ignored'])
def test_a_folder_without_python_files_is_a_usage_error(tmp_path, names, capsys):
  for name in names:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text('build/\n' if name == '.gitignore' else LINEN)
  with pytest.raises(files.NoPythonFiles, match=f"^{tmp_path}: a folder without .py or .ipynb files"):
    migrate([tmp_path], rules=RULES)
  assert cli.main(['migrate', str(tmp_path)]) == 2
  assert capsys.readouterr().err == f'linen2nnx migrate: {tmp_path}: {FOLDER_WITHOUT_PYTHON}\n'


def test_a_path_without_python_is_a_usage_error_beside_good_ones_and_nothing_is_written(tmp_path, capsys):
  _tree(tmp_path, ['src/a.py', 'empty/.keep'])
  (tmp_path / 'notes.txt').write_text(LINEN)
  for argv, wrong, message in [
      (['src', 'notes.txt'], 'notes.txt', f'not a Python file; {files.ACCEPTED}'),
      (['src', 'empty'], 'empty', FOLDER_WITHOUT_PYTHON),
  ]:
    assert cli.main(['migrate', '--write', *(str(tmp_path / path) for path in argv)]) == 2
    assert capsys.readouterr().err == f'linen2nnx migrate: {tmp_path / wrong}: {message}\n'
    assert (tmp_path / 'src' / 'a.py').read_text() == LINEN


def test_a_python_file_without_flax_and_python_scripts_are_taken(tmp_path, capsys):
  """What pre-commit's `python` type passes is taken: the hooks never get a usage error for a file it staged."""
  (tmp_path / 'plain.py').write_text('import os\n')
  (tmp_path / 'train').write_text('#!/usr/bin/env python3\n' + LINEN)
  (tmp_path / 'app.wsgi').write_text(LINEN)
  assert cli.main(['migrate', '--write', *(str(tmp_path / name) for name in ('plain.py', 'train', 'app.wsgi'))]) == 0
  assert 'linen2nnx migrate: 2 changed, 0 unchanged, 1 skipped (no flax), 0 failed' in capsys.readouterr().err
  assert (tmp_path / 'train').read_text() == '#!/usr/bin/env python3\n' + MIGRATED
  assert (tmp_path / 'app.wsgi').read_text() == MIGRATED


def test_a_run_whose_globs_leave_out_every_file_is_an_empty_result(tmp_path):
  _tree(tmp_path, ['a.py'])
  assert files.find_files([tmp_path], exclude=['*.py']) == files.FoundFiles((), (), 1)
  assert migrate([tmp_path], rules=RULES, exclude=['*.py']).files == ()


@pytest.mark.parametrize('make, path, problem', [
    (None, 'missing/r.json', 'the folder {root}/missing does not exist; create it first (mkdir -p {root}/missing) or '
                             'give a path in another folder'),
    ('folder', 'out', 'is a folder; give the path of a file, in it or elsewhere'),
    ('file', 'out/r.json', '{root}/out is a file, not a folder; give a path in a folder'),
], ids=['no_folder', 'a_folder', 'under_a_file'])
def test_an_output_file_that_cannot_be_written_is_refused(tmp_path, make, path, problem):
  if make == 'folder':
    (tmp_path / 'out').mkdir()
  elif make == 'file':
    (tmp_path / 'out').write_text('')
  with pytest.raises(ValueError) as error:
    files.check_output('--report-json', str(tmp_path / path))
  assert str(error.value) == f'--report-json {tmp_path / path}: {problem.format(root=tmp_path)}'
  files.check_output('--report-json', str(tmp_path / 'ok.json'))
  files.check_output('--report-json', None)


@pytest.mark.skipif(os.name != 'posix' or os.geteuid() == 0, reason='root writes anywhere')
def test_an_output_in_a_read_only_folder_is_refused(tmp_path):
  (tmp_path / 'ro').mkdir(mode=0o555)
  with pytest.raises(ValueError, match='the folder .*/ro is not writable; give a path in a folder you can write to'):
    files.check_output('--report-json', str(tmp_path / 'ro' / 'r.json'))
  with pytest.raises(ValueError, match='the folder .*/ro is not writable'):
    files.check_output('DST', str(tmp_path / 'ro' / 'new' / 'ckpt'), new_folder=True)


def test_a_new_folder_must_not_exist_and_may_need_its_parents(tmp_path):
  files.check_output('DST', str(tmp_path / 'a' / 'b' / 'new'), new_folder=True)
  with pytest.raises(ValueError, match=f'^DST {tmp_path}: already exists; give a new path$'):
    files.check_output('DST', str(tmp_path), new_folder=True)
  (tmp_path / 'f').write_text('')
  with pytest.raises(ValueError, match='f is a file, not a folder'):
    files.check_output('DST', str(tmp_path / 'f' / 'new'), new_folder=True)


@pytest.mark.parametrize('code, imports', [
    (b'import flax.linen as nn\n', True),
    (b'from flax import linen as nn\n', True),
    (b'\xef\xbb\xbfimport jax, flax\r\n', True),
    (b'if True:\n  from flax.training import train_state\n', True),
    (b'x = 1; import flax\n', True),
    (b'try: import flax\nexcept ImportError: flax = None\n', True),
    (b'import os, \\\n    flax.linen\n', True),
    (b'# uses flax\n_MODELS = {"modeling_flax_bert": ["FlaxBertModel"]}\n', False),
    (b'"""\nimport flax\n"""\nimport flaxformer\nfrom flaxy import x\nfrom .flax import y\n', False),
    (b'import jax  # not flax\n', False),
])
def test_imports_flax_reads_import_statements_not_mentions(code, imports):
  assert files.imports_flax(ast.parse(code)) is imports
