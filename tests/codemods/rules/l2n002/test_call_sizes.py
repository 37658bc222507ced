"""A layer size that only the call knows, read from an element of a call value (`features =
lstm_state[0].shape[-1]`, evojax's seq2seq cell), becomes a constructor argument (parity:
fixtures/L2N002/evojax_carry_sizes.parity.json); the caller gives it, and a wrong one is an error, never a port
that runs."""

import textwrap

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec

CASE = 'L2N002/evojax_carry_sizes'


def test_the_size_is_a_constructor_argument_saying_where_it_comes_from():
  report = (FIXTURES / f'{CASE}.report.txt').read_text()
  assert 'new constructor argument lstmcell_features: the size of the last axis of lstm_state[0] (bound to features)' \
      in report


def test_a_port_built_with_another_size_fails_on_the_carry():
  linen_module, variables, nnx_model, xs = models(CASE, spec(CASE, 'Encoder'))
  final = nnx_model(*xs)
  assert [a.shape for a in final] == [(2, 5), (2, 5)]
  wrong = type(nnx_model)(5, encoder_lstm_lstmcell_features=6, encoder_lstm_lstmcell_in_features=4, rngs=nnx.Rngs(0))
  with pytest.raises((TypeError, ValueError)):
    jax.block_until_ready(wrong(jnp.ones((2, 6, 4))))


def test_a_submodule_output_given_to_a_constructor_says_to_give_it_to_the_call():
  """evojax's Seq2seq: the encoder's output is the decoder's field, which only the call knows."""
  source = textwrap.dedent('''\
      import flax.linen as nn

      class Decoder(nn.Module):
        init_state: tuple

        @nn.compact
        def __call__(self, x):
          return nn.Dense(3)(x) + self.init_state[0]

      class Seq2seq(nn.Module):
        @nn.compact
        def __call__(self, encoder_inputs, decoder_inputs):
          init_decoder_state = nn.Dense(3)(encoder_inputs)
          return Decoder(init_state=(init_decoder_state,))(decoder_inputs)
      ''')
  result = transform_source(source.encode(), registry.select_rules(['L2N002']))
  todos = [e.message for e in result.entries if e.kind == 'todo']
  assert any("init_decoder_state, the output of a submodule's call, which only the call knows" in t for t in todos), todos
