"""Linen names the migrate report records as patterns over the parent's fields, resolved for verify and convert
by a small grammar: a layer numbered after a loop's (`Dense_{len(self.features[:-1])}`), never by eval."""

import pytest

from codemods.ports import linen_names


@pytest.mark.parametrize('pattern, fields, name', [
    ('Dense_{len(self.features[:-1])}', {'features': (4, 6, 3)}, 'Dense_2'),
    ('Dense_{self.num_layers}', {'num_layers': 3}, 'Dense_3'),
    ('Dense_{self.num_layers + 1}', {'num_layers': 3}, 'Dense_4'),
    ('Dense_{2 * self.depth - 1}', {'depth': 2}, 'Dense_3'),
    ('dense1', {}, 'dense1'),
])
def test_a_pattern_over_the_fields_names_the_layer(pattern, fields, name):
  assert linen_names.resolve(pattern, fields) == name


@pytest.mark.parametrize('pattern, fields', [
    ('Dense_{self.num_layers}', {}),  # a field the module does not hold
    ('Dense_{self.label}', {'label': 'a'}),  # not a number
    ('Dense_{__import__("os").getpid() + self.n}', {'n': 1}),  # outside the grammar: never evaluated
    ('Dense_{self.__class__}', {}),
])
def test_a_pattern_the_grammar_or_the_fields_do_not_resolve_is_none(pattern, fields):
  assert linen_names.resolve(pattern, fields) is None
