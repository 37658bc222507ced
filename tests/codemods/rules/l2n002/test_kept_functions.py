"""flax.linen functions of values alone stay as they are in a converted class: `nn.merge_param` (dopamine's routers
merge a call argument with a field of another name than a train/eval switch), spelled `nn.merge_param` or
`nn.module.merge_param`; the port computes the same, and fails the same where neither value is given."""

import runpy
import textwrap

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from codemods import rules as registry
from codemods.transform import transform_source

RULES = registry.select_rules(['L2N002'])
SOURCE = textwrap.dedent('''\
    from typing import Optional

    import flax.linen as nn
    import jax


    class RandomRouter(nn.Module):
      num_experts: Optional[int] = None
      k: Optional[int] = None

      @nn.compact
      def __call__(self, x, *, num_experts: Optional[int] = None, k: Optional[int] = None, key=None):
        num_experts = nn.merge_param('num_experts', num_experts, self.num_experts)
        k = nn.module.merge_param('k', k, self.k)
        probs = jax.random.normal(key, (x.shape[0], num_experts))
        weights, experts = jax.lax.top_k(probs, k=k)
        return x * weights.sum(-1, keepdims=True), experts
    ''')


def _run(tmp_path, name: str, source: str) -> dict:
  path = tmp_path / f'{name}.py'
  path.write_text(source)
  return runpy.run_path(str(path))


def test_merge_param_stays_and_the_port_routes_as_linen(tmp_path):
  result = transform_source(SOURCE.encode(), RULES)
  ported = result.source.decode()
  assert [e.kind for e in result.entries if e.kind == 'todo'] == []
  assert 'class RandomRouter(nnx.Module)' in ported and ported.count('merge_param(') == 2
  linen = _run(tmp_path, 'linen', SOURCE)['RandomRouter'](k=2)
  port = _run(tmp_path, 'port', ported)['RandomRouter'](k=2, rngs=nnx.Rngs(0))
  x, key = jnp.arange(12.0).reshape(3, 4), jax.random.key(7)
  want = linen.apply({}, x, num_experts=5, key=key)
  got = port(x, num_experts=5, key=key)
  assert all(jnp.array_equal(a, b) for a, b in zip(want, got))
  with pytest.raises(ValueError, match='num_experts'):  # neither the argument nor the field: both refuse
    linen.apply({}, x, key=key)
  with pytest.raises(ValueError, match='num_experts'):
    port(x, key=key)
