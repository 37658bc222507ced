"""A size only the call knows (dopamine's MoE experts: `token_size = x.shape[0]`, then `nn.Dense(features=
token_size)`) becomes a constructor argument named after its local, which a class building the expert passes on as
its own; the ports run as the Linen originals on their variables. A local that is no size keeps the class Linen."""

import jax
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.transform import transform_source

EXPERTS = '''import flax.linen as nn


class ExpertModel(nn.Module):
  """The MLP of one expert; it may map back to the number of tokens it was given."""
  expert_hidden_size: int = 6
  maintain_token_size: bool = True

  @nn.compact
  def __call__(self, x):
    initializer = nn.initializers.xavier_uniform()
    token_size = x.shape[0]
    x = nn.relu(nn.Dense(features=self.expert_hidden_size, kernel_init=initializer)(x))
    hidden_x = x
    if self.maintain_token_size:
      x = nn.Dense(features=token_size, kernel_init=initializer)(x)
    return x, hidden_x


class Experts(nn.Module):
  expert_hidden_size: int = 6

  @nn.compact
  def __call__(self, x):
    first, _ = ExpertModel(self.expert_hidden_size, name='first')(x)
    last, _ = ExpertModel(self.expert_hidden_size, name='last')(x)
    return first + last
'''

X = jax.random.normal(jax.random.key(1), (3, 4))


def _namespaces(source: str) -> tuple[dict, dict]:
  linen, ported = {}, {}
  exec(compile(EXPERTS, 'linen', 'exec'), linen)
  exec(compile(source, 'nnx', 'exec'), ported)
  return linen, ported


def test_a_size_only_the_call_knows_is_a_constructor_argument_of_its_name():
  result = transform_source(EXPERTS, registry.select_rules(['L2N002']))
  assert 'def __init__(self, expert_hidden_size: int = 6, maintain_token_size: bool = True, *, token_size: int, ' \
         'linear1_in_features: int, rngs: nnx.Rngs):' in result.source, result.source
  assert 'nnx.Linear(in_features=self.expert_hidden_size, out_features=token_size, ' in result.source
  assert '    token_size = x.shape[0]\n' in result.source  # the statement stays for the rest of the call
  entries = [e.message for e in result.entries if e.kind == 'change']
  assert 'new constructor argument token_size: the value of the local token_size = x.shape[0] in the call, which ' \
         'only the call knows: give what it is for the inputs the model will run on (Linen fixed it at init)' in entries
  linen, ported = _namespaces(result.source)
  variables = linen['ExpertModel']().init(jax.random.key(0), X)
  model = ported['ExpertModel'](token_size=3, linear1_in_features=4, rngs=nnx.Rngs(0))
  assert nnx_bridge.compare(linen['ExpertModel'](), variables, model, X, train=False).ok


def test_a_class_building_it_passes_the_argument_on_as_its_own():
  result = transform_source(EXPERTS, registry.select_rules(['L2N002']))
  assert 'token_size=last_token_size' in result.source, result.source
  arguments = [a.name for a in result.classes[-1].arguments]
  assert {'first_token_size', 'last_token_size'} <= set(arguments), arguments
  linen, ported = _namespaces(result.source)
  variables = linen['Experts']().init(jax.random.key(0), X)
  sizes = {name: 3 if name.endswith('token_size') else 4 for name in arguments
           if name not in ('expert_hidden_size', 'rngs')}
  model = ported['Experts'](**sizes, rngs=nnx.Rngs(0))
  assert nnx_bridge.compare(linen['Experts'](), variables, model, X, train=False).ok


def test_the_comparison_rejects_a_port_sized_or_computing_otherwise():
  result = transform_source(EXPERTS, registry.select_rules(['L2N002']))
  linen, ported = _namespaces(result.source.replace('x = nnx.relu(', 'x = nnx.tanh('))
  variables = linen['ExpertModel']().init(jax.random.key(0), X)
  model = ported['ExpertModel'](token_size=3, linear1_in_features=4, rngs=nnx.Rngs(0))
  assert not nnx_bridge.compare(linen['ExpertModel'](), variables, model, X, train=False).ok


def test_a_local_only_the_call_knows_that_is_no_size_keeps_the_class_linen():
  source = EXPERTS.replace('token_size = x.shape[0]', 'token_size = x.mean()')
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert 'class ExpertModel(nn.Module):' in result.source
  todos = [e.message for e in result.entries if e.kind == 'todo']
  assert 'class ExpertModel left as Linen: a constructor argument uses the local token_size, whose value reads x, ' \
         'which only the call knows: make it a field, or a constructor argument' in todos, todos
