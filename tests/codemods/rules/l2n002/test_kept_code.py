"""L2N002 keeps the code and rewrites only the Linen API (`codemods/rules/l2n002/head.py`, `queries._value_alias`,
`planner._plain_block`): decorators, extra bases, class keywords, computed defaults, class attributes, locals of
fields and constants, and plain blocks stay as they are (parity: fixtures/L2N002/kept_code.parity.json); what
cannot stay keeps the class Linen, with a TODO at its line that says what to write instead."""

import re
import textwrap

import pytest

import nnx_bridge

from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import models, spec

RULES = registry.select_rules(['L2N002'])
CASE = 'L2N002/kept_code'


def test_decorator_ran_on_the_nnx_class_and_defaults_are_kept():
  _, _, nnx_model, _ = models(CASE, spec(CASE, 'AtariHead', 'raw'))
  registered = type(nnx_model).__init__.__globals__['CONFIGURABLES']
  assert registered['AtariHead'] is type(nnx_model)  # the decorator ran on the NNX class
  assert nnx_model.hidden_units == 8 and nnx_model.inputs_preprocessed is False and nnx_model.scale == 2.0
  assert nnx_model.linear1.kernel.shape == (5, 16)  # width = self.hidden_units * 2, read in __init__


def test_a_port_that_skips_the_kept_plain_code_fails():
  linen_module, variables, _, xs = models(CASE, spec(CASE, 'AtariHead', 'raw'))
  _, _, wrong, _ = models(CASE, spec(CASE, 'AtariHead', 'preprocessed'))  # skips the mixin's preprocess
  report = nnx_bridge.compare(linen_module, variables, wrong, *xs)
  assert not report.ok
  assert any(d.check == 'output' and not d.ok and d.max_abs > 1e-3 for d in report.differences)


def _migrate(body: str, head: str = 'class M(nn.Module):', prelude: str = '') -> tuple[str, list[str]]:
  source = 'import dataclasses\nimport flax.linen as nn\nfrom mixins import Mixin\n' + textwrap.dedent(prelude) \
      + head + '\n' + textwrap.indent(textwrap.dedent(body), '  ')
  result = transform_source(source.encode(), RULES)
  return result.source.decode(), [f'{e.line}:{e.column} {e.message}' for e in result.entries if e.kind == 'todo']


CALL = '''
features: int

@nn.compact
def __call__(self, x):
  return nn.Dense(self.features)(x)
'''


@pytest.mark.parametrize('head, body, prelude, todo', [
    ('@nn.jit\nclass M(nn.Module):', CALL, '', r'^4:1 .*the class decorator @nn\.jit is a Linen transform: apply it'),
    ('@dataclasses.dataclass\nclass M(nn.Module):', CALL, '', r'^4:1 .*@dataclasses\.dataclass writes an __init__'),
    ('class M(nn.Module, Mixin):', CALL, '', r'^4:20 .*the base Mixin is out of sight .*convert it with the class'),
    ('class M(nn.Module, Hooks):', CALL, 'class Hooks:\n  def setup(self):\n    self.ready = True\n',
     r'^7:20 .*the base Hooks defines a hook Linen runs \(setup'),
    ('class M(nn.Module, kw_only=True):', CALL, '', r'^4:20 .*kw_only= has no NNX counterpart: remove it'),
    ('class M(nn.Module):', '''
     features: list = dataclasses.field(default_factory=list)

     @nn.compact
     def __call__(self, x):
       return nn.Dense(len(self.features))(x)
     ''', '', r'^6:3 .*declared with dataclasses\.field\(\.\.\.\).*write a plain default'),
    ('class M(nn.Module):', '''
     features: int

     @nn.compact
     def __call__(self, x):
       init = nn.initializers.zeros
       if x.ndim > 2:
         init = nn.initializers.ones
       return nn.Dense(self.features, kernel_init=init)(x)
     ''', '', r'^13:48 .*the local init, rebound by code that reads x, which only the call knows'),
    ('class M(nn.Module):', '''
     @nn.compact
     def __call__(self, x):
       width = x.shape
       return nn.Dense(width[0] * 2)(x)
     ''', '', r'^9:21 .*the local width, whose value reads x, which only the call knows'),
    ('class M(nn.Module):', '''
     @nn.compact
     def __call__(self, x):
       def init(key, shape, dtype=jnp.float32):
         return jnp.ones(shape, dtype) * x.mean()  # a value of the input, not its size
       return nn.Dense(3, kernel_init=init)(x)
     ''', '', r'^10:36 .*uses init, defined in the method, which reads x, a local of the method that only the call knows'),
    ('class M(nn.Module):', '''
     @nn.compact
     def __call__(self, x):
       return x * self.param('w')
     ''', '', r'^8:16 .*self\.param with \*args or \*\*kwargs, or without an init function: give its name, '
               r'init_fn by position or by name'),
])
def test_what_cannot_stay_keeps_the_class_linen_with_a_todo_at_its_line(head, body, prelude, todo):
  source, todos = _migrate(body, head, prelude)
  assert 'class M(nn.Module' in source and 'from flax import nnx' not in source  # the Linen program, as it was
  assert len(todos) == 1 and re.search(todo, todos[0]), todos


def test_plain_blocks_stay_but_a_block_calling_a_method_of_the_class_is_refused():
  plain = '''
      features: int

      def halve(self, x):
        return x / 2

      @nn.compact
      def __call__(self, x):
        while x.sum() > 10:
          x = {step}
        return nn.Dense(self.features)(x)
      '''
  source, todos = _migrate(plain.format(step='x / 2'))
  assert not todos and 'while x.sum() > 10:\n      x = x / 2' in source and 'class M(nnx.Module)' in source
  source, todos = _migrate(plain.format(step='self.halve(x)'))  # a method may build layers in every iteration
  assert 'class M(nn.Module)' in source and len(todos) == 1 and re.search(r'^13:5 .*nested blocks', todos[0]), todos


def test_a_linen_type_in_an_annotation_stays_as_written():
  """`precision: PrecisionLike = None` (flax's linen_design_test): a type in an annotation is plain Python, not
  Linen's module API; it stays, and so does its import, while the class converts. A Linen name NNX has no
  counterpart of used as a value still keeps the class Linen."""
  body = '''
  features: int
  precision: PrecisionLike = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    return nn.Dense(self.features, precision=self.precision)(x)
  '''
  prelude = 'from flax.linen.linear import PrecisionLike\nfrom flax.linen.linear import Array\n'
  migrated, todos = _migrate(body, prelude=prelude)
  assert not todos, todos
  assert 'class M(nnx.Module):' in migrated and 'precision: PrecisionLike = None, *' in migrated
  assert 'def __call__(self, x: Array) -> Array:' in migrated
  assert 'from flax.linen.linear import PrecisionLike\n' in migrated
  migrated, todos = _migrate(body.replace('precision=self.precision', 'precision=PrecisionLike'), prelude=prelude)
  assert 'class M(nn.Module):' in migrated and any('PrecisionLike has no automatic NNX conversion here' in t
                                                    for t in todos), todos
