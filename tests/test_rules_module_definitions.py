"""L2N002 fixtures run for real: Linen input vs converted NNX output, with transferred parameters."""

import pathlib
import runpy

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / 'fixtures' / 'L2N002'
RULES = registry.select_rules(['L2N002'])

# case -> (class, Linen fields, NNX kwargs the report asks for, inputs, Linen mode kwargs)
CASES = {
    'guide_basic_module': ('Model', dict(dmid=6, dout=3), dict(block_linear_in_features=5),
                           (jnp.ones((2, 5)),), dict(training=False)),
    'setup_mlp': ('MLP', dict(hidden=4), dict(dense1_in_features=5), (jnp.ones((2, 5)),), {}),
    'compact_dropout_batchnorm': ('Net', dict(width=6), dict(stem_in_features=5), (jnp.ones((3, 5)),), dict(train=False)),
}


def _load(case: str, suffix: str) -> dict:
  return runpy.run_path(str(FIXTURES / f'{case}.{suffix}.py'))


@pytest.mark.parametrize('case', sorted(CASES))
def test_converted_model_matches_linen(case):
  name, fields, sizes, inputs, mode = CASES[case]
  inputs = tuple(jax.random.normal(jax.random.key(i), x.shape) for i, x in enumerate(inputs))
  linen_module = _load(case, 'in')[name](**fields)
  variables = linen_module.init(jax.random.key(0), *inputs, **mode)
  nnx_model = _load(case, 'out')[name](**fields, **sizes, rngs=nnx.Rngs(0, dropout=1))
  report = nnx_bridge.compare(linen_module, variables, nnx_model, *inputs)
  assert report.ok, report.to_text()
  assert not any('skipped' in note for note in report.notes) or not mode


def test_new_size_arguments_are_reported():
  result = transform_source((FIXTURES / 'setup_mlp.in.py').read_text(), RULES)
  messages = [e.message for e in result.entries]
  assert "new constructor argument dense1_in_features: in_features of self.dense1, the input dimension of self.dense1's call argument x" in messages
  assert 'dense2_in_features' not in result.source  # derived: self.hidden


def test_dropout_trains_with_its_own_rng_stream():
  model = _load('compact_dropout_batchnorm', 'out')['Net'](width=6, stem_in_features=5, rngs=nnx.Rngs(0, dropout=1))
  x = jax.random.normal(jax.random.key(0), (3, 5))
  model.train()
  first, second = model(x), model(x)
  assert not jnp.allclose(first, second)  # fresh masks, BatchNorm stats updated in place
  model.eval()
  assert jnp.allclose(model(x), model(x))


@pytest.mark.parametrize('case', sorted(p.name[:-6] for p in FIXTURES.glob('*.in.py')))
def test_migrating_again_changes_nothing(case):
  once = transform_source((FIXTURES / f'{case}.in.py').read_text(), registry.ALL_RULES)
  assert transform_source(once.source, registry.ALL_RULES).source == once.source


def test_todo_case_is_left_unchanged_with_reasons():
  source = (FIXTURES / 'todo_param.in.py').read_text()
  result = transform_source(source, RULES)
  assert [e.kind for e in result.entries] == ['todo', 'todo']
  code_lines = [line for line in result.source.splitlines() if 'TODO(linen2nnx)' not in line]
  assert code_lines == source.splitlines()


@pytest.mark.parametrize('snippet, reason', [
    ('  @nn.compact\n  def __call__(self, x):\n    d = nn.Dense(3)\n    return d(x)\n', 'not called where it is constructed'),
    ('  @nn.compact\n  def __call__(self, x):\n    return nn.scan(nn.Dense)(3)(nn.Dense(3)(x))\n', 'no automatic NNX conversion'),
    ('  @nn.compact\n  def __call__(self, x):\n    return nn.Dense(3)(x + self.make_rng("dropout"))\n', 'self.make_rng'),
    ('  def setup(self):\n    self.d = nn.Dense(3, dot_general_cls=None)\n  def __call__(self, x):\n    return self.d(x)\n',
     'no NNX counterpart'),
    ('  @nn.compact\n  def __call__(self, x, train):\n    return nn.Dropout(0.5)(x, deterministic=train)\n', 'train/eval'),
    ('  @nn.compact\n  def __call__(self, x):\n    return nn.Dense(x.shape[-1])(x)\n', 'local x'),
])
def test_unsupported_constructs_are_todos(snippet, reason):
  source = f'import flax.linen as nn\n\n\nclass M(nn.Module):\n{snippet}'
  result = transform_source(source, RULES)
  assert [e.kind for e in result.entries] == ['todo'] and reason in result.entries[0].message, result.entries
  assert 'nn.Module' in result.source and 'nnx' not in result.source.replace('TODO(linen2nnx)', '')
