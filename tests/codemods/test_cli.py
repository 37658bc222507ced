"""`codemods.cli`: a subcommand's bad flag is its own usage error, shown with its usage line (exit 2)."""

import pytest

from codemods import cli


@pytest.mark.parametrize('argv', [
    ['migrate', '--wirte', 'x'],
    ['verify', 'a.py:A', 'b.py:B', '--wirte'],
    ['convert', 'src', 'dst', '--wirte'],
    ['layers', '--wirte'],
    ['demo', '--wirte'],
], ids=lambda argv: argv[0])
def test_an_unknown_flag_of_a_subcommand_shows_its_usage(argv, capsys):
  with pytest.raises(SystemExit) as exit:
    cli.main(argv)
  err = capsys.readouterr().err
  assert exit.value.code == 2
  assert err.startswith(f'usage: linen2nnx {argv[0]} [-h]'), err
  assert err.endswith(f'linen2nnx {argv[0]}: error: unrecognized arguments: --wirte\n'), err


def test_an_unknown_flag_before_the_subcommand_shows_the_top_level_usage(capsys):
  with pytest.raises(SystemExit) as exit:
    cli.main(['--wirte', 'layers'])
  assert exit.value.code == 2
  assert capsys.readouterr().err.startswith('usage: linen2nnx [-h] [--version] COMMAND ...')
