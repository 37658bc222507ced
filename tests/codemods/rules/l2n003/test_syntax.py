"""The metadata-free syntax helpers of L2N003: pruning returned state, reading literals, decorators."""

import libcst as cst

from codemods.rules.l2n003.syntax import after_docstring
from codemods.rules.l2n003.syntax import literal_keys
from codemods.rules.l2n003.syntax import mutable_collections
from codemods.rules.l2n003.syntax import pruned_value
from codemods.rules.l2n003.syntax import rngs_code
from codemods.rules.l2n003.syntax import transform_of
from codemods.rules.l2n003.syntax import with_state


def _code(node: cst.CSTNode | None) -> str | None:
  return None if node is None else cst.Module([]).code_for_node(node)


def test_pruned_value_drops_the_state_paths_and_unwraps_a_single_element():
  value = cst.parse_expression('(params, (stats, aux), loss)')
  assert _code(pruned_value(value, {(0,), (1, 0)})) == '(aux, loss)'
  assert _code(pruned_value(value, {(0,), (1,)})) == 'loss'
  assert pruned_value(value, {(0,), (1,), (2,)}) is None
  assert pruned_value(value, {()}) is None


def test_with_state_puts_the_state_last():
  assert with_state(None, 'state') == 'state'
  assert with_state(cst.parse_expression('loss'), 'state') == 'loss, state'
  assert with_state(cst.parse_expression('loss, acc'), 'state') == '(loss, acc), state'


def test_literal_keys_and_mutable_collections_read_only_literals():
  assert literal_keys(cst.parse_expression("{'params': p, 'batch_stats': s}")) == ['params', 'batch_stats']
  assert literal_keys(cst.parse_expression('{name: p}')) is None
  assert literal_keys(cst.parse_expression('variables')) is None
  assert mutable_collections(cst.parse_expression("['batch_stats']")) == ['batch_stats']
  assert mutable_collections(cst.parse_expression("'cache'")) == ['cache']
  assert mutable_collections(cst.parse_expression('True')) is None


def test_rngs_code_reads_a_literal_seed():
  assert rngs_code('jax.random.key(0)') == 'nnx.Rngs(0)'
  assert rngs_code('random.PRNGKey(42)') == 'nnx.Rngs(42)'
  assert rngs_code('key') == 'nnx.Rngs(key)'


def test_transform_of_names_jit_and_pmap_decorators_with_their_options():
  assert transform_of(cst.parse_expression('jax.jit')) == ('jit', {})
  kind, options = transform_of(cst.parse_expression("partial(jax.pmap, axis_name='batch')"))
  assert kind == 'pmap' and list(options) == ['axis_name']
  assert transform_of(cst.parse_expression('functools.lru_cache')) == (None, {})


def test_after_docstring_keeps_the_docstring_first():
  body = cst.parse_module('"""Doc."""\nreturn x\n').body
  merge = cst.parse_statement('model = nnx.merge(graphdef, state)\n')
  assert [_code(s).strip() for s in after_docstring(body, merge)] == [
      '"""Doc."""', 'model = nnx.merge(graphdef, state)', 'return x']
