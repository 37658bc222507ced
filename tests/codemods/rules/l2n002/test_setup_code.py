"""L2N002 on plain code in setup() (`codemods/rules/l2n002/setup_code.py`): what stays as it is in `__init__`
(parity: fixtures/L2N002/setup_plain_code.parity.json), and what keeps the class Linen, with a TODO at the
statement that names the exact blocker, the Linen program left as it was."""

import pathlib
import re
import textwrap

import jax
import jax.numpy as jnp
import libcst as cst
import pytest
from flax import nnx

import nnx_bridge

from codemods import rules as registry
from codemods.rules.l2n002.nodes import may_hold_modules
from codemods.transform import transform_source

RULES = registry.select_rules(['L2N002'])

SOURCE = '''import flax.linen as nn
from .layers import make_norm

ACT2FN = {{"gelu": nn.gelu}}


def helper_dense(width):
  return nn.Dense(width)


def scale(width):
  return width * 2


class Identity(nn.Module):
  def __call__(self, x):
    return x


class M(nn.Module):
  width: int
  act: str = "gelu"

  def setup(self):
    self.dense = nn.Dense(self.width)
{statement}

  def _sizes(self):
    return self.width

  def __call__(self, x):
    return self.dense(x)


class Positions(nn.Embed):  # transformers' FlaxOPTLearnedPositionalEmbedding: a Linen layer, subclassed
  def __call__(self, positions):
    return super().__call__(positions + 2)
'''


@pytest.mark.parametrize('statement, line, blocker', [
    ('self.activation = Identity() if self.act else (Identity() if self.width else None)', 26,
     'Identity, a Linen module class, is built inside a conditional expression (a if c else b)'),
    ('self.activation = Identity() if self.is_initializing() else None', 26,
     'Identity, a Linen module class, is built inside a conditional expression (a if c else b)'),
    ('block = Identity\nself.kind = block', 26, 'Identity, a Linen module class, is named other than to build it'),
    ('self.norm = make_norm(self.width)', 26,
     'make_norm(...) calls .layers.make_norm, code of this project L2N002 does not follow'),
    ('self.head = helper_dense(self.width)', 26, 'helper_dense(...) calls helper_dense of this file, which may build'),
    ('self.size = self._sizes()', 26, 'self._sizes(...) calls a method of the class from setup()'),
    ('self.positions = Positions(8, self.width)', 26,
     'Positions(...) builds Positions, a subclass of a Linen layer, which L2N002 does not convert'),
    ('self.scale = self.param("scale", nn.initializers.ones, (self.width,)) * self.param("s", nn.initializers.ones, ())',
     26,
     'self.param(...) inside a setup() statement'),
    ('for _ in range(2):\n  self.extra = Identity()', 27,
     'Identity, a Linen module class, is built inside a for loop'),
])
def test_a_statement_that_may_build_a_module_keeps_the_class_linen_with_its_blocker(statement, line, blocker):
  source = SOURCE.format(statement=textwrap.indent(statement, '    '))
  result = transform_source(source, RULES)
  assert 'class M(nn.Module)' in result.source and 'def setup(self):' in result.source
  (todo,) = [e for e in result.entries if e.kind == 'todo' and 'class M ' in e.message]
  assert todo.message.startswith('class M left as Linen: ') and blocker in todo.message, todo.message
  assert todo.line == line, todo


def test_plain_statements_stay_in_place_and_a_helper_that_builds_nothing_is_called():
  statement = 'width = scale(self.width)\nself.activation = ACT2FN[self.act]\nself.out = nn.Dense(width)'
  result = transform_source(SOURCE.format(statement=textwrap.indent(statement, '    ')), RULES)
  assert 'class M(nnx.Module)' in result.source
  init = result.source[result.source.index('class M('):result.source.index('def _sizes')]
  lines = [line.strip() for line in init.splitlines()[1:] if line.strip()]
  assert lines[4:] == ['width = scale(self.width)', 'self.activation = ACT2FN[self.act]',
                       'self.out = nnx.Linear(in_features=out_in_features, out_features=width, rngs=rngs)'], lines


CALLED = '''import flax.linen as nn


class M(nn.Module):
  use_head: bool = True

  def setup(self):
    self.dense = nn.Dense(3)
    self.head = nn.Dense(2)

  def __call__(self, x):
    x = self.dense(x)
{body}
'''


@pytest.mark.parametrize('body, created', [
    ('    return self.head(x) if self.use_head else x', 'if self.use_head else None'),
    ('    if not self.use_head:\n      return x\n    else:\n      return self.head(x)', 'if self.use_head else None'),
    ('    return self.head(x) if x.shape[-1] > 2 else x', None),  # a test on the call: NNX builds it always
    ('    y = self.head(x) if self.use_head else x\n    return self.head(y)', None),  # also called unconditionally
])
def test_a_submodule_called_only_under_a_field_condition_is_created_only_then(body, created):
  result = transform_source(CALLED.format(body=body), RULES)
  assert 'class M(nnx.Module)' in result.source, result.entries
  (line,) = [line.strip() for line in result.source.splitlines() if line.strip().startswith('self.head = ')]
  assert line.endswith(created or 'rngs=rngs)'), line


CONDITIONAL = pathlib.Path(__file__).resolve().parents[4] / 'fixtures' / 'L2N002' / 'setup_conditional_children'


def _basic_layer(source: str, **fields):
  namespace: dict = {}
  exec(compile(source, '<source>', 'exec'), namespace)
  return namespace['BasicLayer'](**fields)


@pytest.mark.parametrize('fields', [dict(in_channels=3, out_channels=4, stride=2), dict(in_channels=4, out_channels=4)])
def test_a_port_that_builds_a_conditional_child_always_is_caught(fields):
  """The fixture's BasicLayer (parity: setup_conditional_children.parity.json) against a port that creates the
  shortcut whatever the fields say: the variables differ where Linen does not create it."""
  linen_module = _basic_layer((CONDITIONAL.with_suffix('.in.py')).read_text(), **fields)
  x = jax.random.normal(jax.random.key(0), (2, 6, 6, fields['in_channels']))
  variables = linen_module.init(jax.random.key(1), x)
  port = CONDITIONAL.with_suffix('.out.py').read_text()
  always, found = re.subn(r'rngs=rngs\)\s+if should_apply_shortcut\s+else None', 'rngs=rngs)', port)  # the shortcut built always
  assert found == 1
  sizes = dict(conv_in_convolution_in_features=fields['in_channels'], rngs=nnx.Rngs(0))
  right = _basic_layer(port, **fields, **sizes)
  wrong = _basic_layer(always, **fields, **sizes)
  assert nnx_bridge.compare(linen_module, variables, right, x).ok
  if 'shortcut' in variables['params']:
    return  # the wrong port is right here
  with pytest.raises(nnx_bridge.MappingError, match='NNX shortcut/convolution .* has no Linen counterpart'):
    nnx_bridge.compare(linen_module, variables, wrong, x)


@pytest.mark.parametrize('value, kept', [
    ('nn.Dense(self.width) if self.use_block else None', 'if self.use_block else None'),
    ('None if not self.use_block else nn.Dense(self.width)', 'None if not self.use_block else nnx.Linear('),
])
@pytest.mark.parametrize('use_block', [True, False])
def test_a_conditional_child_is_created_when_linen_creates_it(value, kept, use_block):
  source = f'''import flax.linen as nn


class M(nn.Module):
  width: int
  use_block: bool = True

  def setup(self):
    self.block = {value}

  def __call__(self, x):
    if self.block is None:
      return x
    return self.block(x)
'''
  result = transform_source(source, RULES)
  assert kept in result.source and not [e for e in result.entries if e.kind == 'todo'], result.source
  linen_namespace: dict = {}
  namespace: dict = {}
  exec(compile(source, '<linen>', 'exec'), linen_namespace)
  exec(compile(result.source, '<converted>', 'exec'), namespace)
  x = jax.random.normal(jax.random.key(0), (2, 3))
  linen_module = linen_namespace['M'](3, use_block=use_block)
  variables = linen_module.init(jax.random.key(1), x) if use_block else {}
  model = namespace['M'](3, use_block=use_block, block_in_features=3, rngs=nnx.Rngs(0))
  assert (model.block is None) is (not use_block)
  if use_block:
    assert nnx_bridge.compare(linen_module, variables, model, x).ok
  else:
    assert (model(x) == linen_module.apply({}, x)).all()


@pytest.mark.parametrize('use, blocker', [
    ('    if self.block:\n      x = self.block(x)', 'self.block used other than by calling it'),
    ('    blocks = [self.block]\n    x = blocks[0](x)', 'self.block used other than by calling it'),
])
def test_a_conditional_child_used_other_than_called_or_tested_for_none_stays_linen(use, blocker):
  source = f'''import flax.linen as nn


class M(nn.Module):
  width: int
  use_block: bool = True

  def setup(self):
    self.block = nn.Dense(self.width) if self.use_block else None

  def __call__(self, x):
{use}
    return x
'''
  result = transform_source(source, RULES)
  assert 'class M(nn.Module)' in result.source
  (todo,) = [e for e in result.entries if e.kind == 'todo']
  assert blocker in todo.message, todo.message


PLACEHOLDER = '''import flax.linen as nn


class M(nn.Module):
  def setup(self):
    self.linear = None

  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(x)
'''


def test_an_attribute_setup_sets_to_none_is_no_auto_named_childs():
  """`self.linear = None` in setup() stays a plain None (no submodule replaces it): the auto-named Dense of the
  compact body takes another attribute, and the port runs."""
  port = transform_source(PLACEHOLDER, RULES).source
  assert 'self.linear = None' in port and 'self.linear_ = nnx.Linear(' in port, port
  namespace: dict = {}
  exec(compile(port, 'port.py', 'exec'), namespace)
  model = namespace['M'](linear__in_features=2, rngs=nnx.Rngs(0))
  assert model.linear is None and model(jnp.ones((1, 2))).shape == (1, 3)


def test_a_switch_read_in_the_body_follows_train_and_eval():
  """fixtures/L2N002/switch_read_attention: `if not deterministic: dropout_rng = self.make_rng('dropout')` reads
  self.deterministic, which model.eval() / model.train() set: eval mode is Linen's deterministic call (parity in
  the fixture's sidecar), train mode draws attention dropout from the module's own stream, a fresh key per call."""
  import jax
  import numpy as np

  import nnx_bridge
  from tests.codemods.rules import test_fixture_parity as fixture_parity

  case = 'L2N002/switch_read_attention'
  entry = {**fixture_parity.spec(case, entry_id='causal'), 'fields': {'attention_dropout': 0.5}}
  linen_module, variables, model, (x, mask) = fixture_parity.models(case, entry)
  nnx_bridge.linen_to_nnx(variables, model, nnx_bridge.derive_mapping(linen_module, model, x, mask))
  model.eval()
  assert model.deterministic is True
  evaluated = model(x, mask)
  np.testing.assert_allclose(evaluated, linen_module.apply(variables, x, mask), atol=1e-5)
  model.train()
  assert model.deterministic is False
  first, second = model(x, mask), model(x, mask)
  assert not np.allclose(first, evaluated) and not np.allclose(first, second)
  want = linen_module.apply(variables, x, mask, deterministic=False, rngs={'dropout': jax.random.key(1)})
  assert not np.allclose(want, evaluated)  # Linen's train mode drops attention weights too


def test_a_stream_named_like_an_rngs_sampler_is_reached_by_key_and_runs():
  """HF's Flax wav2vec2 draws `self.make_rng("gumbel")`; `rngs.gumbel` is nnx.Rngs's gumbel sampler."""
  import jax
  import numpy as np
  from flax import nnx

  source = '''import flax.linen as nn
import jax


class Quantizer(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(3)(x)
    return x + jax.random.gumbel(self.make_rng("gumbel"), x.shape)
'''
  result = transform_source(source, RULES)
  assert "self.gumbel_rngs = rngs['gumbel'].fork()" in result.source, result.source
  namespace = {}
  exec(compile(result.source, 'quantizer.py', 'exec'), namespace)
  model = namespace['Quantizer'](linear_in_features=2, rngs=nnx.Rngs(0, gumbel=1))
  x = jax.numpy.ones((2, 2))
  assert not np.allclose(model(x), model(x))  # a fresh gumbel draw each call


DROP_PATH = '''import flax.linen as nn
import jax
import jax.numpy as jnp
from typing import Optional


class FlaxBeitDropPath(nn.Module):
    """Drop paths (Stochastic Depth) per sample (when applied in main path of residual blocks)."""

    rate: float

    @nn.module.compact
    def __call__(self, inputs, deterministic: Optional[bool] = True):
        if self.rate == 0.0:
            return inputs
        keep_prob = 1.0 - self.rate
        if deterministic:
            return inputs
        else:
            shape = (inputs.shape[0],) + (1,) * (inputs.ndim - 1)
            rng = self.make_rng("droppath")
            random_tensor = keep_prob + jax.random.uniform(rng, shape=shape, dtype=inputs.dtype)
            binary_tensor = jnp.floor(random_tensor)
            output = inputs / keep_prob * binary_tensor
            return output
'''


def test_a_module_that_only_draws_random_numbers_converts_and_drops_like_linen():
  """BEiT's and Dinov2's DropPath: an @nn.compact module without variables, drawing from its own stream. NNX draws
  other numbers than Linen, so what is compared is what the module does: the identity in eval mode; in train
  mode each sample is either dropped (0) or scaled by 1 / keep_prob, in both."""
  result = transform_source(DROP_PATH, RULES)
  assert 'class FlaxBeitDropPath(nnx.Module)' in result.source and 'rngs.droppath.fork()' in result.source, result.source
  linen_namespace: dict = {}
  namespace: dict = {}
  exec(compile(DROP_PATH, '<linen>', 'exec'), linen_namespace)
  exec(compile(result.source, '<converted>', 'exec'), namespace)
  x = jnp.ones((64, 3))
  linen_module = linen_namespace['FlaxBeitDropPath'](rate=0.5)
  model = namespace['FlaxBeitDropPath'](rate=0.5, rngs=nnx.Rngs(0, droppath=1))
  model.eval()
  assert (model(x) == x).all() and (linen_module.apply({}, x) == x).all()
  model.train()
  nnx_out = model(x)
  linen_out = linen_module.apply({}, x, deterministic=False, rngs={'droppath': jax.random.key(1)})
  for out in (nnx_out, linen_out):
    kept = out[:, 0] != 0
    assert ((out == 0) | (out == 2.0)).all() and (out == out[:, :1]).all()  # whole samples dropped or scaled
    assert 0 < int(kept.sum()) < 64
  assert not (model(x) == nnx_out).all()  # a fresh draw each call


def test_a_conditional_child_of_a_class_that_stays_linen_keeps_its_parent_linen():
  """A bridged child needs example inputs whether it is created or not, and a Linen parent cannot wrap a class
  holding one: the conditional stays a blocker."""
  source = '''import flax.linen as nn


class Kept(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x + self.variables['params']['b']


class M(nn.Module):
  use_kept: bool = True

  def setup(self):
    self.kept = Kept() if self.use_kept else None

  def __call__(self, x):
    return self.kept(x) if self.kept is not None else x
'''
  result = transform_source(source, RULES)
  assert 'class M(nn.Module)' in result.source
  (todo,) = [e for e in result.entries if e.kind == 'todo' and 'class M ' in e.message]
  assert 'Kept, a Linen module class, is built inside a conditional expression' in todo.message, todo.message


PARTIAL_PROJECTIONS = '''from functools import partial

import flax.linen as nn
import jax.numpy as jnp


class FlaxTinyAttention(nn.Module):
    embed_dim: int = 4

    def setup(self):
        dense = partial(nn.Dense, self.embed_dim, use_bias=False)
        {assignment}

    def __call__(self, hidden_states):
        return self.q_proj(hidden_states) * self.k_proj(hidden_states)
'''


def test_projections_built_in_one_tuple_assignment_convert_in_place():
  """transformers' GPT-J: `self.q_proj, self.k_proj = dense(), dense()` from a partial of nn.Dense."""
  source = PARTIAL_PROJECTIONS.format(assignment='self.q_proj, self.k_proj = dense(), dense()')
  result = transform_source(source, RULES)
  assert 'self.q_proj, self.k_proj = nnx.Linear(' in result.source, result.source
  linen_namespace, namespace = {}, {}
  exec(compile(source, '<linen>', 'exec'), linen_namespace)
  exec(compile(result.source, '<converted>', 'exec'), namespace)
  x = jax.random.normal(jax.random.key(0), (2, 3, 5))
  linen_module = linen_namespace['FlaxTinyAttention']()
  model = namespace['FlaxTinyAttention'](q_proj_in_features=5, rngs=nnx.Rngs(0))
  assert nnx_bridge.compare(linen_module, linen_module.init(jax.random.key(1), x), model, x).ok


def test_a_submodule_built_in_other_setup_code_keeps_the_class_linen():
  """A construction inside plain setup() code (here a dict) is not converted there: the class stays Linen whole,
  with the partial statement it uses, rather than losing the partial and keeping a Linen call."""
  source = PARTIAL_PROJECTIONS.format(
      assignment="self.projections = {'q': dense(), 'k': dense()}\n        self.q_proj, self.k_proj = "
                 "self.projections['q'], self.projections['k']")
  result = transform_source(source, RULES)
  assert [e.kind for e in result.entries] == ['todo'], result.entries
  assert 'dense() builds a submodule in setup() code other than' in result.entries[0].message
  assert [line for line in result.source.splitlines() if 'TODO(linen2nnx)' not in line] == source.splitlines()


def test_a_library_named_like_a_folder_of_the_run_is_not_project_code(tmp_path, monkeypatch):
  """A run over `agents/` without `__init__.py` files names its `agents/jax/` folder's modules `jax.*`, but Python
  imports `jax` from where it is installed: `jnp.array(...)` in setup() is plain code that stays, while
  `helpers.build(...)`, a module of the run (`agents/tools/`), may build a Linen module and keeps its class Linen."""
  from codemods.engine import migrate  # pylint: disable=import-outside-toplevel
  folder, tools = tmp_path / 'agents' / 'jax', tmp_path / 'agents' / 'tools'
  folder.mkdir(parents=True)
  tools.mkdir()
  helpers = ('import flax.linen as nn\n\n\ndef build(n):\n  return nn.Dense(n)\n\n\n'
             'class Other(nn.Module):\n  @nn.compact\n  def __call__(self, x):\n    return nn.Dense(2)(x)\n')
  (tools / 'helpers.py').write_text(helpers)
  (folder / 'other.py').write_text('import flax.linen as nn\n\n\nclass Head(nn.Module):\n  @nn.compact\n'
                                   '  def __call__(self, x):\n    return nn.Dense(2)(x)\n')
  network = textwrap.dedent('''\
      import flax.linen as nn
      import jax.numpy as jnp
      {extra}

      class Net(nn.Module):
        scale: tuple = (1.0, 2.0)

        def setup(self):
          self._scale = {call}
          self.dense = nn.Dense(3)

        def __call__(self, x):
          return self.dense(x * self._scale[0])
      ''')
  monkeypatch.chdir(tmp_path)
  (folder / 'networks.py').write_text(network.format(extra='', call='jnp.array(self.scale)'))
  migrate(['agents'], rules=RULES, write=True, jobs=1)
  assert 'class Net(nnx.Module):' in (folder / 'networks.py').read_text()
  (folder / 'networks.py').write_text(network.format(extra='from tools import helpers', call='helpers.build(3)'))
  (tools / 'helpers.py').write_text(helpers)  # Linen again, as before the first run
  migrate(['agents'], rules=RULES, write=True, jobs=1)
  assert 'helpers.build(...) calls tools.helpers.build, code of this project' in (folder / 'networks.py').read_text()
  assert 'class Net(nn.Module):' in (folder / 'networks.py').read_text()


def test_a_call_of_what_a_plain_function_of_the_file_returns_stays_but_one_of_a_module_builder_keeps_the_class():
  """flax's lm1b `sinusoidal_init(max_len=...)(None, shape, None)` calls the initializer a module-level function of
  the file returns: plain code (fixtures/L2N002/plain_function_call.*, with parity). A function of the file that
  names a Linen layer may return a module: `f(...)(x)` then keeps the class Linen at that line."""
  source = (CONDITIONAL.parent / 'plain_function_call.in.py').read_text()
  rules = registry.select_rules(['L2N002'])
  assert 'AddPositionEmbs' in {c.linen_name for c in transform_source(source, rules).classes}
  builder = source.replace('    return jnp.array(pe[np.newaxis, :, :])\n',
                           '    return jnp.array(pe[np.newaxis, :, :]) + nn.Dense(1).__class__.__name__.count("x")\n')
  assert builder != source
  todos = [e.message for e in transform_source(builder, rules).entries if e.kind == 'todo']
  assert any('class AddPositionEmbs left as Linen: sinusoidal_init(...)(...) builds a submodule from sinusoidal_init'
             in m for m in todos), todos


NESTED_INIT = 'L2N002/nested_init_function'


def test_a_nested_initializer_moves_into_init_and_initialises_as_linen_did():
  """jax-md's BesselEmbedding: `def init_fn(key, shape)` in the compact body initialises `self.param`; its copy in
  `__init__` gives the Linen initial values (parity on trained values: fixtures/L2N002/nested_init_function.*)."""
  import jax
  import numpy as np
  from flax import nnx
  from tests.codemods.rules.test_fixture_parity import FIXTURES
  linen_scope, nnx_scope = {}, {}
  exec(compile((FIXTURES / f'{NESTED_INIT}.in.py').read_text(), 'linen.py', 'exec'), linen_scope)
  exec(compile((FIXTURES / f'{NESTED_INIT}.out.py').read_text(), 'nnx.py', 'exec'), nnx_scope)
  linen = linen_scope['BesselEmbedding'](4, 0.5, 3.0)
  params = linen.init(jax.random.key(0), jax.numpy.ones((5,)))['params']
  port = nnx_scope['BesselEmbedding'](4, 0.5, 3.0, rngs=nnx.Rngs(0))
  np.testing.assert_allclose(port.frequencies[...], params['frequencies'])
  wrong = (FIXTURES / f'{NESTED_INIT}.out.py').read_text().replace('jnp.arange(1, n + 1)', 'jnp.arange(n)', 1)
  scope: dict = {}
  exec(compile(wrong, 'wrong.py', 'exec'), scope)
  assert not np.allclose(scope['BesselEmbedding'](4, 0.5, 3.0, rngs=nnx.Rngs(0)).frequencies[...],
                         params['frequencies'])


def test_a_nested_initializer_reading_a_local_of_the_call_keeps_the_class_linen():
  from codemods import rules as registry
  from codemods.transform import transform_source
  from tests.codemods.rules.test_fixture_parity import FIXTURES
  source = (FIXTURES / f'{NESTED_INIT}.in.py').read_text().replace(
      '      return jnp.arange(1, n + 1) * jnp.pi', '      return jnp.arange(1, n + 1) * jnp.pi / rs.shape[0]')
  result = transform_source(source, registry.select_rules(['L2N002']))
  assert result.classes == ()
  (todo,) = [e.message for e in result.entries if e.kind == 'todo']
  assert todo.endswith('a constructor argument uses init_fn, defined in the method, which reads rs, a local of the '
                       'method that only the call knows: make it a field, or a constructor argument'), todo


@pytest.mark.parametrize('body, holds', [
    ('    index = []\n    for l in range(3):\n      index.append(l - 1)', False),  # numbers: plain code
    ('    index = []\n    n = 2\n    index.append(n * 2)', False),
    ('    index = []\n    for l in range(3):\n      index.append(nn.Dense(l))', True),
    ('    index = []\n    for l in self.sizes:\n      index.append(l)', True),  # a field's items may be modules
    ('    index = []\n    index += [nn.Dense(2)]', True),
    ('    index = []\n    index.append(len(self.sizes))', True),  # a call L2N002 does not follow
])
def test_a_setup_list_holds_modules_unless_plainly_numbers(body, holds):
  """jax-md's `expand_index = []` filled with `l - 1` in loops over range(...) is plain code; a list that may
  receive a module is a setup() list of layers, converted in its own shapes or kept Linen with a TODO."""
  setup = cst.parse_module(f'def setup(self):\n{body}\n').body[0]
  assert may_hold_modules(setup, 'index') is holds
