"""L2N002 on plain code in setup() (`codemods/rules/l2n002/setup_code.py`): what stays as it is in `__init__`
(parity: fixtures/L2N002/setup_plain_code.parity.json), and what keeps the class Linen, with a TODO at the
statement that names the exact blocker, the Linen program left as it was."""

import textwrap

import pytest

from codemods import rules as registry
from codemods.transform import transform_source

RULES = registry.select_rules(['L2N002'])

SOURCE = '''import flax.linen as nn
from .layers import make_norm

ACT2FN = {{"gelu": nn.gelu}}


def helper_dense(width):
  return nn.Dense(width)


def scale(width):
  return width * 2


class Identity(nn.Module):
  def __call__(self, x):
    return x


class M(nn.Module):
  width: int
  act: str = "gelu"

  def setup(self):
    self.dense = nn.Dense(self.width)
{statement}

  def _sizes(self):
    return self.width

  def __call__(self, x):
    return self.dense(x)
'''


@pytest.mark.parametrize('statement, line, blocker', [
    ('self.activation = ACT2FN[self.act] if self.act else Identity()', 26,
     'Identity, a Linen module class, is built inside a conditional expression (a if c else b)'),
    ('block = Identity', 26, 'Identity, a Linen module class, is named other than to build it'),
    ('self.norm = make_norm(self.width)', 26,
     'make_norm(...) calls .layers.make_norm, code of this project L2N002 does not follow'),
    ('self.head = helper_dense(self.width)', 26, 'helper_dense(...) calls helper_dense of this file, which may build'),
    ('self.size = self._sizes()', 26, 'self._sizes(...) calls a method of the class from setup()'),
    ('self.scale = self.param("scale", nn.initializers.ones, (self.width,)) * 2', 26,
     'self.param(...) inside a setup() statement'),
    ('for _ in range(2):\n  self.extra = Identity()', 27,
     'Identity, a Linen module class, is built inside a for loop'),
])
def test_a_statement_that_may_build_a_module_keeps_the_class_linen_with_its_blocker(statement, line, blocker):
  source = SOURCE.format(statement=textwrap.indent(statement, '    '))
  result = transform_source(source, RULES)
  assert 'class M(nn.Module)' in result.source and 'def setup(self):' in result.source
  (todo,) = [e for e in result.entries if e.kind == 'todo' and 'class M ' in e.message]
  assert todo.message.startswith('class M left as Linen: ') and blocker in todo.message, todo.message
  assert todo.line == line, todo


def test_plain_statements_stay_in_place_and_a_helper_that_builds_nothing_is_called():
  statement = 'width = scale(self.width)\nself.activation = ACT2FN[self.act]\nself.out = nn.Dense(width)'
  result = transform_source(SOURCE.format(statement=textwrap.indent(statement, '    ')), RULES)
  assert 'class M(nnx.Module)' in result.source
  init = result.source[result.source.index('class M('):result.source.index('def _sizes')]
  lines = [line.strip() for line in init.splitlines()[1:] if line.strip()]
  assert lines[4:] == ['width = scale(self.width)', 'self.activation = ACT2FN[self.act]',
                       'self.out = nnx.Linear(in_features=out_in_features, out_features=width, rngs=rngs)'], lines


CALLED = '''import flax.linen as nn


class M(nn.Module):
  use_head: bool = True

  def setup(self):
    self.dense = nn.Dense(3)
    self.head = nn.Dense(2)

  def __call__(self, x):
    x = self.dense(x)
{body}
'''


@pytest.mark.parametrize('body, created', [
    ('    return self.head(x) if self.use_head else x', 'if self.use_head else None'),
    ('    if not self.use_head:\n      return x\n    else:\n      return self.head(x)', 'if self.use_head else None'),
    ('    return self.head(x) if x.shape[-1] > 2 else x', None),  # a test on the call: NNX builds it always
    ('    y = self.head(x) if self.use_head else x\n    return self.head(y)', None),  # also called unconditionally
])
def test_a_submodule_called_only_under_a_field_condition_is_created_only_then(body, created):
  result = transform_source(CALLED.format(body=body), RULES)
  assert 'class M(nnx.Module)' in result.source, result.entries
  (line,) = [line.strip() for line in result.source.splitlines() if line.strip().startswith('self.head = ')]
  assert line.endswith(created or 'rngs=rngs)'), line


def test_a_switch_read_in_the_body_follows_train_and_eval():
  """fixtures/L2N002/switch_read_attention: `if not deterministic: dropout_rng = self.make_rng('dropout')` reads
  self.deterministic, which model.eval() / model.train() set: eval mode is Linen's deterministic call (parity in
  the fixture's sidecar), train mode draws attention dropout from the module's own stream, a fresh key per call."""
  import jax
  import numpy as np

  import nnx_bridge
  from tests.codemods.rules import test_fixture_parity as fixture_parity

  case = 'L2N002/switch_read_attention'
  entry = {**fixture_parity.spec(case, entry_id='causal'), 'fields': {'attention_dropout': 0.5}}
  linen_module, variables, model, (x, mask) = fixture_parity.models(case, entry)
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_module, model, x, mask))
  model.eval()
  assert model.deterministic is True
  evaluated = model(x, mask)
  np.testing.assert_allclose(evaluated, linen_module.apply(variables, x, mask), atol=1e-5)
  model.train()
  assert model.deterministic is False
  first, second = model(x, mask), model(x, mask)
  assert not np.allclose(first, evaluated) and not np.allclose(first, second)
  want = linen_module.apply(variables, x, mask, deterministic=False, rngs={'dropout': jax.random.key(1)})
  assert not np.allclose(want, evaluated)  # Linen's train mode drops attention weights too


def test_a_stream_named_like_an_rngs_sampler_is_reached_by_key_and_runs():
  """HF's Flax wav2vec2 draws `self.make_rng("gumbel")`; `rngs.gumbel` is nnx.Rngs's gumbel sampler."""
  import jax
  import numpy as np
  from flax import nnx

  source = '''import flax.linen as nn
import jax


class Quantizer(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(3)(x)
    return x + jax.random.gumbel(self.make_rng("gumbel"), x.shape)
'''
  result = transform_source(source, RULES)
  assert "self.gumbel_rngs = rngs['gumbel'].fork()" in result.source, result.source
  namespace = {}
  exec(compile(result.source, 'quantizer.py', 'exec'), namespace)
  model = namespace['Quantizer'](linear_in_features=2, rngs=nnx.Rngs(0, gumbel=1))
  x = jax.numpy.ones((2, 2))
  assert not np.allclose(model(x), model(x))  # a fresh gumbel draw each call
