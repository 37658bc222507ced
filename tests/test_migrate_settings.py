"""`[tool.linen2nnx]` settings and the pre-commit hook definitions."""

import pathlib
import textwrap

import pytest
import yaml

from codemods import cli
from codemods import settings

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINEN = 'import flax.linen as nn\nbias_init = nn.initializers.zeros\n'


def test_nearest_pyproject_is_read(tmp_path):
  (tmp_path / 'pyproject.toml').write_text(textwrap.dedent('''
      [tool.linen2nnx]
      include = ["src/**"]
      exclude = ["src/legacy/"]
      select = ["L2N001"]
      jobs = 1
  '''))
  nested = tmp_path / 'src' / 'pkg'
  nested.mkdir(parents=True)
  loaded = settings.load_settings(nested)
  assert loaded == settings.Settings(('src/**',), ('src/legacy/',), ('L2N001',), 1, str(tmp_path / 'pyproject.toml'))


def test_no_table_means_no_settings(tmp_path):
  (tmp_path / 'pyproject.toml').write_text('[project]\nname = "x"\n')
  assert settings.load_settings(tmp_path) == settings.Settings(source=str(tmp_path / 'pyproject.toml'))


@pytest.mark.parametrize(
    'table, message',
    [
        ('includes = ["a"]', r"unknown keys \['includes'\]"),
        ('jobs = "2"', 'jobs must be an integer'),
        ('exclude = "tests/"', 'exclude must be a list of strings'),
    ],
)
def test_bad_settings_are_refused(tmp_path, table, message):
  (tmp_path / 'pyproject.toml').write_text(f'[tool.linen2nnx]\n{table}\n')
  with pytest.raises(ValueError, match=message):
    settings.load_settings(tmp_path)


def test_migrate_applies_the_settings(tmp_path, monkeypatch, capsys):
  (tmp_path / 'pyproject.toml').write_text('[tool.linen2nnx]\nexclude = ["legacy.py"]\njobs = 1\n')
  (tmp_path / 'model.py').write_text(LINEN)
  (tmp_path / 'legacy.py').write_text(LINEN)
  monkeypatch.chdir(tmp_path)
  assert cli.main(['migrate', '--check', '.']) == 1
  err = capsys.readouterr().err
  assert 'would change: model.py' in err and 'legacy.py' not in err
  (tmp_path / 'pyproject.toml').write_text('[tool.linen2nnx]\nselect = ["L2N999"]\n')
  assert cli.main(['migrate', '--check', '.']) == 2  # an unknown rule code is a usage error
  assert 'L2N999' in capsys.readouterr().err


def test_pre_commit_hooks_run_the_cli():
  hooks = yaml.safe_load((ROOT / '.pre-commit-hooks.yaml').read_text())
  assert {hook['id'] for hook in hooks} == {'linen2nnx-check', 'linen2nnx-migrate'}
  parser = cli.build_parser()
  for hook in hooks:
    program, *argv = hook['entry'].split()
    assert program == 'linen2nnx'
    args = parser.parse_args([*argv, 'staged_file.py'])  # pre-commit appends the file names
    assert args.command == 'migrate' and args.paths == ['staged_file.py']
