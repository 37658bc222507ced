"""`[tool.linen2nnx]` settings and the pre-commit hook definitions."""

import pathlib
import textwrap

import pytest
import yaml

from codemods import cli
from codemods import settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINEN = 'import flax.linen as nn\nbias_init = nn.initializers.zeros\n'


def test_nearest_pyproject_is_read(tmp_path):
  (tmp_path / 'pyproject.toml').write_text(textwrap.dedent('''
      [tool.linen2nnx]
      include = ["src/**"]
      exclude = ["src/legacy/"]
      select = ["L2N001"]
      jobs = 1
      train-state = "keep"
  '''))
  nested = tmp_path / 'src' / 'pkg'
  nested.mkdir(parents=True)
  loaded = settings.load_settings(nested)
  assert loaded == settings.Settings(include=('src/**',), exclude=('src/legacy/',), select=('L2N001',), jobs=1,
                                     train_state='keep', source=str(tmp_path / 'pyproject.toml'))


def test_no_table_means_no_settings(tmp_path):
  (tmp_path / 'pyproject.toml').write_text('[project]\nname = "x"\n')
  assert settings.load_settings(tmp_path) == settings.Settings(source=str(tmp_path / 'pyproject.toml'))


@pytest.mark.parametrize(
    'table, message',
    [
        ('includes = ["a"]', r"unknown keys \['includes'\]"),
        ('jobs = "2"', 'jobs must be an integer'),
        ('exclude = "tests/"', 'exclude must be a list of strings'),
        ('train-state = 1', 'train-state must be a string'),
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


def test_train_state_option_from_the_command_line_and_the_settings(tmp_path, monkeypatch, capsys):
  guide = (ROOT / 'fixtures' / 'L2N003' / 'guide_train_state.in.py').read_text()
  (tmp_path / 'train.py').write_text(guide)
  monkeypatch.chdir(tmp_path)
  assert cli.main(['migrate', '-j', '1', 'train.py']) == 0
  assert 'nnx.Optimizer(' in capsys.readouterr().out  # the default: nnx
  assert cli.main(['migrate', '-j', '1', '--train-state', 'keep', 'train.py']) == 0
  assert 'NNXTrainState.create(apply_fn=graphdef.apply' in capsys.readouterr().out
  (tmp_path / 'pyproject.toml').write_text('[tool.linen2nnx]\ntrain-state = "keep"\n')
  assert cli.main(['migrate', '-j', '1', 'train.py']) == 0
  assert 'NNXTrainState' in capsys.readouterr().out
  (tmp_path / 'pyproject.toml').write_text('[tool.linen2nnx]\ntrain-state = "tree"\n')
  assert cli.main(['migrate', '-j', '1', 'train.py']) == 2
  assert "train-state must be one of nnx, keep, got 'tree'" in capsys.readouterr().err


def test_train_state_option_reaches_the_worker_processes(tmp_path, monkeypatch, capsys):
  guide = (ROOT / 'fixtures' / 'L2N003' / 'guide_train_state.in.py').read_text()
  for name in ('a.py', 'b.py'):
    (tmp_path / name).write_text(guide)
  monkeypatch.chdir(tmp_path)
  assert cli.main(['migrate', '-j', '2', '--train-state', 'keep', 'a.py', 'b.py']) == 0
  assert capsys.readouterr().out.count('NNXTrainState.create(apply_fn=graphdef.apply') == 2


def test_pre_commit_hooks_run_the_cli():
  hooks = yaml.safe_load((ROOT / '.pre-commit-hooks.yaml').read_text())
  assert {hook['id'] for hook in hooks} == {'linen2nnx-check', 'linen2nnx-migrate'}
  parser = cli.build_parser()
  for hook in hooks:
    program, *argv = hook['entry'].split()
    assert program == 'linen2nnx'
    args = parser.parse_args([*argv, 'staged_file.py'])  # pre-commit appends the file names
    assert args.command == 'migrate' and args.paths == ['staged_file.py']
