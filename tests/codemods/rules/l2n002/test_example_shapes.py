"""The sizes only the input's whole shape decides (a Dense after convolutions, pooling and a flatten): L2N002 records
them as formulas over `input_shape` (`rules/l2n002/example_shapes.py`), and each formula gives, for inputs of
several shapes, the size the Linen layer really takes (measured with `jax.eval_shape` on the Linen model)."""

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn

from codemods import rules as registry
from codemods import shape_formulas
from codemods.transform import transform_source

CNN = '''import jax.numpy as jnp
from flax import linen as nn


class CNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Conv(features=8, kernel_size=(3, 3), strides=(2, 2), padding='VALID')(x)
    x = nn.relu(x)
    x = nn.max_pool(x, (2, 2), strides=(2, 2), padding='SAME')
    x = nn.Conv(features=16, kernel_size=(3, 3), padding=1)(x)
    x = nn.avg_pool(x, window_shape=(2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.Dense(features=32)(x)
    y = jnp.mean(nn.Dense(features=4)(x)[:, None, :], axis=1)
    return y
'''
OPEN_ENDED = '''from flax import linen as nn


class Head(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(features=self.features, kernel_size=(3, 3))(x)  # a field: the caller's value, unknown here
    x = x.reshape((x.shape[0], -1))
    return nn.Dense(features=4)(x)
'''


def _formulas(source: str) -> dict[str, dict[int, str]]:
  (record,) = transform_source(source, registry.ALL_RULES).classes
  return {a.name: dict(a.shape_formulas) for a in record.arguments if a.shape_formulas}


def _linen_cnn():
  namespace: dict = {}
  exec(compile(CNN, 'cnn.py', 'exec'), namespace)
  return namespace['CNN']()


@pytest.mark.parametrize('shape', [(1, 28, 28, 1), (2, 17, 9, 3), (1, 40, 24, 2)])
def test_the_formula_gives_the_size_linen_takes_for_each_input_shape(shape):
  formulas = _formulas(CNN)
  assert set(formulas) == {'linear1_in_features'} and set(formulas['linear1_in_features']) == {3, 4, 5}  # a 2-d convolution needs 3 axes
  variables = jax.eval_shape(_linen_cnn().init, jax.random.key(0), jnp.ones(shape))
  expected = variables['params']['Dense_0']['kernel'].shape[0]
  assert shape_formulas.evaluate(formulas['linear1_in_features'][len(shape)], shape) == expected


def test_a_size_a_field_decides_gets_no_formula():
  assert _formulas(OPEN_ENDED) == {}


@pytest.mark.parametrize('n, k, s, padding', [(n, k, s, p) for n in (7, 8, 28) for k in (1, 2, 3) for s in (1, 2, 3)
                                              for p in ('SAME', 'VALID', (1, 1), (0, 2))])
def test_the_window_rule_of_the_layer_table_is_flax_conv_and_pooling(n, k, s, padding):
  from nnx_bridge.layer_spec import Window
  code = Window.axis_code(f'{shape_formulas.SHAPE}[1]', k, s, padding)
  pads = padding if isinstance(padding, str) else [padding]
  conv = jax.eval_shape(nn.Conv(1, (k,), strides=s, padding=pads).init_with_output, jax.random.key(0),
                        jnp.ones((1, n, 1)))[0]
  pooled = nn.avg_pool(jnp.ones((1, n, 1)), (k,), (s,), pads)
  assert shape_formulas.evaluate(code, (1, n, 1)) == conv.shape[1] == pooled.shape[1]


def test_the_window_check_rejects_a_wrong_rule():
  # `n // s` is what SAME padding gives only when s divides n: 7 with stride 2 pools to 4, not 3.
  pooled = nn.avg_pool(jnp.ones((1, 7, 1)), (2,), (2,), 'SAME')
  assert shape_formulas.evaluate('input_shape[1] // 2', (1, 7, 1)) != pooled.shape[1]


@pytest.mark.parametrize('formula, value', [
    ('(input_shape[1] - 2) // 2 + 1', 14), ('-(-(input_shape[2]) // 3)', 10), ('input_shape[-1] * 4', 4),
    ('input_shape[7]', None), ('__import__("os").getpid()', None), ('input_shape.count(1)', None),
    ('input_shape[1] / 2', None), ('input_shape[0] // 0', None),
])
def test_formulas_are_evaluated_on_their_grammar_only(formula, value):
  assert shape_formulas.evaluate(formula, (1, 28, 28, 1)) == value
