"""`@functools.partial(nn.scan, variable_broadcast='params', split_rngs={'params': False}, in_axes=..., out_axes=...)`
over `__call__` -> `@nnx.scan(in_axes=(None, nnx.Carry, ...), out_axes=(nnx.Carry, ...))`, and a Linen cell built
with `parent=None` kept for its carry (parity: fixtures/L2N002/sst2_scanned_lstm.parity.json)."""

import runpy
import textwrap

import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec

CASE = 'L2N002/sst2_scanned_lstm'
RULES = registry.select_rules(['L2N002'])
SIZES = {'forward_lstm_optimized_lstmcell_in_features': 4, 'backward_lstm_optimized_lstmcell_in_features': 4}


def test_a_port_scanning_another_axis_fails(tmp_path):
  """Scanning the batch axis instead of time, on inputs as long as they are many: it runs, to other outputs."""
  entry = {**spec(CASE, 'SimpleBiLSTM'), 'inputs': ['float32[3,3,4]', 'int32[3]:3']}
  linen_module, variables, nnx_model, xs = models(CASE, entry)
  assert nnx_bridge.compare(linen_module, variables, nnx_model, *xs).ok
  source = (FIXTURES / f'{CASE}.out.py').read_text()
  scanned = '@nnx.scan(in_axes=(None, nnx.Carry, 1), out_axes=(nnx.Carry, 1))'
  assert source.count(scanned) == 1
  path = tmp_path / 'wrong.py'
  path.write_text(source.replace(scanned, '@nnx.scan(in_axes=(None, nnx.Carry, 0), out_axes=(nnx.Carry, 0))'))
  wrong = runpy.run_path(str(path))['SimpleBiLSTM'](5, **SIZES, rngs=nnx.Rngs(0))
  report = nnx_bridge.compare(linen_module, variables, wrong, *xs)
  assert not report.ok and any(d.check == 'output' and not d.ok for d in report.differences)


@pytest.mark.parametrize('options, reason', [
    ("variable_broadcast='params', split_rngs={'params': False, 'dropout': True}, in_axes=1, out_axes=1",
     'converted over __call__ with the options'),
    ("variable_axes={'params': 0}, split_rngs={'params': True}, in_axes=1, out_axes=1",
     'converted over __call__ with the options'),
])
def test_other_scan_options_are_a_todo_at_the_decorator(options, reason):
  source = textwrap.dedent(f'''\
      import functools
      import flax.linen as nn

      class Cell(nn.Module):
        @functools.partial(nn.scan, {options})
        @nn.compact
        def __call__(self, carry, x):
          carry = nn.Dense(3)(carry) + x
          return carry, carry
      ''')
  result = transform_source(source.encode(), RULES)
  todos = [e for e in result.entries if e.kind == 'todo']
  assert len(todos) == 1 and reason in todos[0].message and todos[0].line == 5, todos
  assert 'class Cell(nn.Module)' in result.source.decode()


def test_a_scanned_call_that_draws_random_numbers_is_a_todo():
  source = textwrap.dedent('''\
      import functools
      import flax.linen as nn

      class Cell(nn.Module):
        @functools.partial(nn.scan, variable_broadcast='params', split_rngs={'params': False}, in_axes=1, out_axes=1)
        @nn.compact
        def __call__(self, carry, x):
          carry = nn.Dropout(0.5, deterministic=False)(nn.Dense(3)(carry) + x)
          return carry, carry
      ''')
  result = transform_source(source.encode(), RULES)
  todos = [e.message for e in result.entries if e.kind == 'todo']
  assert len(todos) == 1 and 'draws random numbers' in todos[0], todos
