"""`MigrationRule.report_todo`: the TODO line goes above the statement once, and a second run finds it there (as one
TODO, however it words why a class stays Linen for another's use)."""

from codemods import rules as registry
from codemods.report import kept_message, todo_key, used_message
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


def test_a_class_kept_for_the_same_user_keeps_its_todo_however_a_later_run_words_why():
  """`report.todo_key`: one TODO per class kept because another class uses it; a TODO naming another user, or any
  other TODO, is a TODO of its own."""
  kept = 'TODO(linen2nnx): ' + kept_message('Block', used_message('Model', 'it uses Block other than by building it'))
  reworded = 'TODO(linen2nnx): ' + kept_message('Block', used_message('Model', 'Block wraps Linen children'))
  other_user = 'TODO(linen2nnx): ' + kept_message('Block', used_message('Stage', 'it uses Block other than by building it'))
  assert todo_key(kept) == todo_key(reworded)
  assert todo_key(kept) != todo_key(other_user)
  assert todo_key('TODO(linen2nnx): x is not converted: a') != todo_key('TODO(linen2nnx): x is not converted: b')
