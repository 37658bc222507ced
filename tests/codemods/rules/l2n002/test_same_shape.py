"""Sizes flow through functions that keep their first argument's shape: casts and moves of elements along axes
(`jnp.flip`, `jnp.roll`, as sst2-style bidirectional encoders reverse their sequences), so the layer after them
needs no constructor argument; a function that may change the shape (`jnp.ravel`) still gives one."""

import runpy
import textwrap

import jax
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source

RULES = registry.select_rules(['L2N002'])
SOURCE = textwrap.dedent('''\
    import flax.linen as nn
    import jax.numpy as jnp


    class Reverser(nn.Module):
      @nn.compact
      def __call__(self, x):
        h = nn.Dense(5)(x)
        h = jnp.roll(jnp.flip(h, axis=1), 1, axis=-1)
        return nn.Dense(3)(h)
    ''')


def test_sizes_through_flip_and_roll_come_from_the_code(tmp_path):
  result = transform_source(SOURCE.encode(), RULES)
  ported = result.source.decode()
  assert 'nnx.Linear(in_features=5, out_features=3' in ported, ported
  (tmp_path / 'linen.py').write_text(SOURCE)
  (tmp_path / 'port.py').write_text(ported)
  linen = runpy.run_path(str(tmp_path / 'linen.py'))['Reverser']()
  port = runpy.run_path(str(tmp_path / 'port.py'))['Reverser'](linear1_in_features=4, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, 6, 4))
  variables = linen.init(jax.random.key(0), x)
  report = nnx_bridge.compare(linen, variables, port, x)
  assert report.ok, report.to_text()


def test_a_function_that_may_change_the_shape_gives_a_constructor_argument():
  source = SOURCE.replace('jnp.roll(jnp.flip(h, axis=1), 1, axis=-1)', 'jnp.ravel(h)[None]')
  ported = transform_source(source.encode(), RULES).source.decode()
  assert 'linear2_in_features' in ported and 'in_features=5, out_features=3' not in ported
