"""`MigrationRule.report_todo`: the TODO line goes above the statement once, and a second run finds it there."""

from codemods import rules as registry
from codemods.transform import transform_source

# The node left for a human sits in the first decorator of a method.
DECORATED = '''import functools

import flax.linen as nn

SCALE = nn.initializers.bogus


class Head(nn.Module):
  @functools.partial(jax_jit_like, init=nn.initializers.bogus)
  def helper(self, x):
    return x
'''


def test_a_todo_for_a_decorator_goes_above_the_decorators_and_is_not_added_again():
  once = transform_source(DECORATED, registry.ALL_RULES).source
  lines = once.splitlines()
  todo = '  # TODO(linen2nnx): nn.initializers.bogus: flax.nnx.initializers has no bogus; pick a replacement by hand'
  assert lines.count(todo) == 1 and lines[lines.index(todo) + 1].startswith('  @functools.partial(')
  assert transform_source(once, registry.ALL_RULES).source == once
