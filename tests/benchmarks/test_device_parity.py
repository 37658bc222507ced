"""`benchmarks/device_parity.py`: which rows count as not as expected, and the markdown it writes. (The script
itself runs the demo, verify and checkpoints for minutes; it is run by hand on each machine.)"""

from benchmarks import device_parity


def test_a_row_is_unexpected_when_its_result_is_not_the_expected_one_and_a_control_never_is():
  rows = [
      {'expected': 'PASS', 'result': 'PASS'},
      {'expected': 'FAIL', 'result': 'PASS'},  # a wrong port that passed
      {'expected': 'ok', 'result': 'ok: bit-exact, numpy arrays'},
      {'expected': 'ok', 'result': 'FAIL: ValueError: Topology mismatch detected.'},
      {'expected': 'PASS', 'result': 'usage error (exit 2)'},
      {'expected': 'control', 'result': 'FAIL: ValueError: Topology mismatch detected.'},  # only recorded
  ]
  assert device_parity.unexpected(rows) == [rows[1], rows[3], rows[4]]


def test_the_rows_are_a_markdown_table_in_the_first_rows_column_order():
  rows = [{'port': 'MLP', 'result': 'PASS'}, {'result': 'FAIL: a | b', 'port': 'wrong'}]
  assert device_parity.markdown_table(rows) == (
      '| port | result |\n|---|---|\n| MLP | PASS |\n| wrong | FAIL: a / b |')
  assert device_parity.markdown_table([]) == '(no rows)'
