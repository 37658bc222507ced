"""Linen transforms over methods (`lifted.plan_method_decorators`): `@functools.partial(nn.remat, static_argnums=...)`
and `@nn.jit` become the NNX transform over the same method, the argument numbers renumbered for the train/eval
arguments NNX drops, and `@nn.nowrap` goes (parity: fixtures/L2N002/method_transforms.parity.json); any other
Linen decorator of a method keeps the class Linen with a TODO at the decorator."""

import re
import runpy
import textwrap

import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec

CASE = 'L2N002/method_transforms'
RULES = registry.select_rules(['L2N002'])


def _port(tmp_path, old: str, new: str):
  """The fixture's port with one edit, as a module namespace."""
  text = (FIXTURES / f'{CASE}.out.py').read_text()
  assert old in text
  path = tmp_path / 'port.py'
  path.write_text(text.replace(old, new))
  return runpy.run_path(str(path))


def _classifier(namespace):
  return namespace['Classifier'](**spec(CASE, 'Classifier')['sizes'], rngs=nnx.Rngs(0, dropout=1))


def test_a_port_that_drops_the_static_flag_of_a_call_fails(tmp_path):
  linen_module, variables, _, xs = models(CASE, spec(CASE, 'Classifier'))
  wrong = _classifier(_port(tmp_path, 'self.block1(x, True)', 'self.block1(x, False)'))
  report = nnx_bridge.compare(linen_module, variables, wrong, *xs)
  assert not report.ok and ('output', 'output') in {(d.check, d.path) for d in report.failures}


def test_linens_argument_numbers_do_not_fit_the_nnx_method(tmp_path):
  """Why static_argnums is renumbered: Linen's numbers count the train argument NNX dropped."""
  _, _, _, xs = models(CASE, spec(CASE, 'Classifier'))
  kept = _classifier(_port(tmp_path, 'static_argnums=(2,)', 'static_argnums=(2, 3)'))
  with pytest.raises(ValueError, match='static_argnums'):
    kept(*xs)


@pytest.mark.parametrize('decorator, todo', [
    ("@functools.partial(nn.vmap, in_axes=0, variable_axes={'params': 0}, split_rngs={'params': True})",
     r'^6:4 .*@functools\.partial\(nn\.vmap, .*is a Linen transform over the method __call__: write its NNX '
     r'counterpart'),
    ('@functools.partial(nn.remat, concrete=True)',
     r'^6:4 .*over __call__ is converted with the options prevent_cse, policy, static_argnums given by name'),
])
def test_a_linen_decorator_without_a_conversion_keeps_the_class_linen_with_a_todo_at_it(decorator, todo):
  source = textwrap.dedent(f'''\
      import functools
      import flax.linen as nn


      class Block(nn.Module):
        {decorator}
        @nn.compact
        def __call__(self, x):
          return nn.Dense(4)(x)
      ''')
  result = transform_source(source.encode(), RULES)
  todos = [f'{e.line}:{e.column} {e.message}' for e in result.entries if e.kind == 'todo']
  assert result.classes == () and len(todos) == 1
  assert re.match(todo, todos[0]), todos
