"""Fields a class's builders fill with what their own call computes become keyword-only arguments of its
`__call__` (`codemods/rules/l2n002/call_fields.py`): the parity of `fixtures/L2N002/seq2seq_call_fields.*` proves the
port (tests/codemods/rules/test_fixture_parity.py); here, that a port ignoring the field is caught, and that the
field stays a field, or the class Linen, where a builder could not pass it at the call."""

from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source
from tests.codemods.rules.test_fixture_parity import FIXTURES, models, spec, wrong_port

CASE = 'L2N002/seq2seq_call_fields'


def _migrated(source: str) -> tuple[str, list[str]]:
  result = transform_source(source, registry.select_rules(['L2N002']))
  return result.source, [e.message for e in result.entries if e.kind == 'todo']


def test_a_port_that_ignores_the_state_given_at_the_call_is_caught(tmp_path):
  entry = spec(CASE, 'Seq2seq', 'gated')
  linen_module, variables, _, xs = models(CASE, entry)
  scope = wrong_port(CASE, 'state = jnp.broadcast_to(init_state[:, None, :]',
                     'state = jnp.broadcast_to(0.0 * init_state[:, None, :]', tmp_path)
  port = scope['Seq2seq'](**entry['sizes'], rngs=nnx.Rngs(0))
  assert not nnx_bridge.compare(linen_module, variables, port, *xs).ok


def test_a_builder_that_does_not_call_it_where_it_is_built_keeps_the_field():
  source = (FIXTURES / f'{CASE}.in.py').read_text().replace(
      '      logits = Decoder(init_state=init_decoder_state)(decoder_inputs)',
      '      decoder = Decoder(init_state=init_decoder_state)\n      logits = decoder(decoder_inputs)')
  migrated, todos = _migrated(source)
  assert 'def __call__(self, inputs, *, init_state' not in migrated and 'class Seq2seq(nn.Module):' in migrated
  assert any(m.startswith('class Seq2seq left as Linen: a constructor argument uses the local init_decoder_state, '
                          "the output of a submodule's call") for m in todos), todos


def test_a_linen_builder_keeps_the_class_linen():
  """A Linen class cannot wrap the converted class with nnx_bridge.to_linen, which would give the field to its
  constructor: the class stays Linen, and so do its converted builders, which would wrap it with from_linen."""
  source = (FIXTURES / f'{CASE}.in.py').read_text() + '''

@nn.jit
class JittedSeq2seq(nn.Module):
  @nn.compact
  def __call__(self, encoder_inputs, decoder_inputs):
    state = Encoder(hidden_size=4)(encoder_inputs)
    return Decoder(init_state=state)(decoder_inputs)
'''
  migrated, todos = _migrated(source)
  assert 'class Decoder(nn.Module):' in migrated and 'class JittedSeq2seq(nn.Module):' in migrated
  assert any(m.startswith('class Decoder kept as Linen') and 'Decoder takes init_state, gate at its call in NNX' in m
             for m in todos), todos
