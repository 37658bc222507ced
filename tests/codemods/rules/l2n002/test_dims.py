"""codemods/rules/l2n002/dims.py on its own: the size values, their rules, and walks of small parsed bodies."""

import textwrap

import libcst as cst
import pytest
from libcst.metadata import ParentNodeProvider
from libcst.metadata import PositionProvider
from libcst.metadata import QualifiedNameProvider
from libcst.metadata import ScopeProvider

from codemods.analysis.hierarchy import LinenHierarchy
from codemods.options import MigrationOptions
from codemods.rules.l2n002.dims import INPUT_SHAPE
from codemods.rules.l2n002.dims import Input
from codemods.rules.l2n002.dims import Known
from codemods.rules.l2n002.dims import LastAxisWalk
from codemods.rules.l2n002.dims import broadcast
from codemods.rules.l2n002.dims import broadcast_shape
from codemods.rules.l2n002.dims import shape_code
from codemods.rules.l2n002.dims import split_last
from codemods.rules.l2n002.facts import analyse_file


class _Walk(cst.CSTVisitor):
  """Runs `LastAxisWalk` on the function `f` of a module, with the metadata a rule has."""

  METADATA_DEPENDENCIES = (ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider)

  def __init__(self, env: dict, branches: bool) -> None:
    super().__init__()
    self.env, self.branches, self.output = env, branches, None

  def visit_Module(self, node: cst.Module) -> bool:
    facts = analyse_file(node, self.get_metadata, None, MigrationOptions(), LinenHierarchy())
    function = next(s for s in node.body if isinstance(s, cst.FunctionDef) and s.name.value == 'f')
    ifs = [s for s in function.body.body if isinstance(s, cst.If)] if self.branches else []
    self.output = LastAxisWalk(facts, branches=ifs).walk(function.body, dict(self.env))
    return False


def _walk(source: str, env: dict, branches: bool = False) -> object:
  """What `LastAxisWalk` says the function `f` of `source` returns, its arguments' sizes given by `env`."""
  visitor = _Walk(env, branches)
  cst.MetadataWrapper(cst.parse_module(textwrap.dedent(source))).visit(visitor)
  return visitor.output


def test_dims_are_values():
  assert Known('self.features') == Known('self.features')
  assert Input(0) != Known('0')
  assert {Known('a'): 1}[Known('a')] == 1


def test_broadcast_prefers_the_size_the_code_fixes():
  assert broadcast(Known('self.d'), Known('self.d')) == Known('self.d')
  assert broadcast(Input(0), Known('self.d')) == Known('self.d')
  assert broadcast(None, Known('self.d')) == Known('self.d')
  assert broadcast(Input(0), Input(1)) is None
  assert broadcast(Input(0), None) == Input(0)  # a residual around layers the code does not size
  assert broadcast(None, Input(1)) == Input(1)
  assert broadcast(None, None) is None


def test_concatenate_of_known_sizes_is_their_sum():
  source = """
  import jax.numpy as jnp

  def f(a, b):
    h = jnp.concatenate([a, b], axis=-1)
    return h
  """
  assert _walk(source, {'a': Known('self.a'), 'b': Known('self.b * 2')}) == Known('self.a + (self.b * 2)')


def test_concatenate_with_an_input_is_unknown():
  source = """
  import jax.numpy as jnp

  def f(x, b):
    return jnp.concatenate([x, b], axis=-1)
  """
  assert _walk(source, {'x': Input(0), 'b': Known('self.b')}) is None


def test_concatenate_on_another_axis_is_unknown():
  source = """
  import jax.numpy as jnp

  def f(a, b):
    return jnp.concatenate([a, b], axis=0)
  """
  assert _walk(source, {'a': Known('self.a'), 'b': Known('self.a')}) is None


def test_elementwise_functions_and_scalar_arithmetic_keep_the_size():
  source = """
  import flax.linen as nn

  def f(x):
    y = nn.relu(x) * 2
    return y + 1
  """
  assert _walk(source, {'x': Input(0)}) == Input(0)


def test_other_calls_forget_the_size():
  source = """
  def f(x):
    y = g(x)
    return y
  """
  assert _walk(source, {'x': Known('self.d')}) is None


@pytest.mark.parametrize(('index', 'expected'), [
    ('[:, 0, :]', Known('self.d')), ('[..., :]', Known('self.d')), ('[0, :]', Known('self.d')),
    ('[:, 0]', None),  # the last axis of a 2-D array is gone: the rank is not known
    ('[:, :2]', None), ('[..., 0]', None),
])
def test_a_subscript_ending_in_a_bare_slice_keeps_the_last_axis(index, expected):
  source = f"""
  def f(h):
    return h{index}
  """
  assert _walk(source, {'h': Known('self.d')}) == expected


@pytest.mark.parametrize(('second', 'expected'), [('y', Known('self.d')), ('x', None)])
def test_a_conditional_keeps_a_size_only_when_every_arm_agrees(second, expected):
  source = f"""
  def f(x, y, flag):
    if flag:
      h = y
    else:
      h = {second}
    return h
  """
  assert _walk(source, {'x': Input(0), 'y': Known('self.d')}, branches=True) == expected


@pytest.mark.parametrize(('second', 'expected'), [('y', Known('self.d')), ('x', None)])
def test_a_conditional_expression_keeps_a_size_only_when_both_arms_agree(second, expected):
  source = f"""
  def f(x, y, flag):
    return y if flag else {second}
  """
  assert _walk(source, {'x': Input(0), 'y': Known('self.d')}) == expected


@pytest.mark.parametrize(('statement', 'expected'), [
    ('h += y', Known('self.d')),  # a residual: as `h = h + y`, the size the code fixes
    ('h *= 2', Input(0)),
    ('h += (y,)', None),  # a tuple grown by one element has no last axis
    ('h //= 2', None),  # not elementwise arithmetic the walk follows
])
def test_an_augmented_assignment_of_an_array_is_its_arithmetic(statement, expected):
  source = f"""
  def f(x, y):
    h = x
    {statement}
    return h
  """
  assert _walk(source, {'x': Input(0), 'y': Known('self.d')}) == expected


def test_shapes():
  assert split_last(INPUT_SHAPE) == (('*input_shape[:-1]',), 'input_shape[-1]')
  assert shape_code(INPUT_SHAPE) == 'input_shape'
  assert shape_code(('1', 'self.d')) == '(1, self.d)'
  assert broadcast_shape(INPUT_SHAPE, ('*input_shape[:-1]', 'self.d')) == ('*input_shape[:-1]', 'self.d')
  assert broadcast_shape(INPUT_SHAPE, ('1', 'self.d')) is None
  assert broadcast_shape(None, INPUT_SHAPE) is None


def test_a_tuples_last_element_is_followed_like_its_first():
  """`output = (h,)`, `output = (w,) + output` in one arm, `more += (x,)`: `[-1]` reads the last element's size,
  `[0]` the first's; a tuple whose last element the code does not show has none."""
  body = '''
      def f(x, w):
        output = (x,)
        if flag:
          output = (w,) + output
        more = (w,)
        more += (x,)
        return {}
      '''
  env = {'x': Input(0), 'w': Input(1)}
  assert _walk(body.format('output[-1]'), env, branches=True) == Input(0)
  assert _walk(body.format('more[-1]'), env, branches=True) == Input(0)
  assert _walk(body.format('more[0]'), env, branches=True) == Input(1)
  assert _walk(body.format('(rest + (w,))[-1]'), env, branches=True) == Input(1)
  assert _walk(body.format('((w,) + rest)[-1]'), env, branches=True) is None  # what `rest` ends with is unknown
