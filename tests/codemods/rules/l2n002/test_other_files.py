"""A Linen class that builds a class of another file of the run converts with it (`interface.py`,
`decisions.decide_run`'s retry): a package laid out as dopamine's networks, an encoder module and an agents module
that builds its classes through `from networks import encoders` and `from .encoders import Stack`. The ports run
against their Linen originals on transferred parameters; where the building class stays Linen, the class it builds
is kept Linen with why, and the program runs as before."""

from __future__ import annotations

import importlib
import pathlib
import sys
import textwrap
import typing as tp

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import nnx_bridge
from codemods import rules as registry
from codemods.engine import migrate

ENCODERS = '''\
"""Encoders shared by the agents' networks."""
import flax.linen as nn


class Stack(nn.Module):
  """A convolution, a max-pool and a residual block."""
  num_ch: int

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(self.num_ch, kernel_size=(3, 3), strides=1, padding='SAME')(x)
    x = nn.max_pool(x, window_shape=(3, 3), padding='SAME', strides=(2, 2))
    block_input = x
    x = nn.relu(x)
    x = nn.Conv(self.num_ch, kernel_size=(3, 3), strides=1, padding='SAME')(x)
    return x + block_input


class ImpalaEncoder(nn.Module):
  nn_scale: int = 1

  @nn.compact
  def __call__(self, x):
    x = Stack(num_ch=4 * self.nn_scale)(x)
    x = Stack(num_ch=8 * self.nn_scale)(x)
    return nn.relu(x)
'''

AGENTS = '''\
"""The agents' Q-networks."""
import flax.linen as nn
import jax.numpy as jnp

from networks import encoders
from .encoders import Stack


class QNetwork(nn.Module):
  num_actions: int
  inputs_preprocessed: bool = False

  @nn.compact
  def __call__(self, x):
    if not self.inputs_preprocessed:
      x = x.astype(jnp.float32) / 255.
    x = encoders.ImpalaEncoder()(x)
    x = x.reshape((x.shape[0], -1))
    x = nn.Dense(16)(x)
    return nn.Dense(self.num_actions)(nn.relu(x))


{small_head}
class SmallQNetwork(nn.Module):
  num_actions: int

  @nn.compact
  def __call__(self, x):
    x = Stack(num_ch=4)(x)
    return nn.Dense(self.num_actions)(x.mean(axis=(1, 2)))
'''

X = jax.random.uniform(jax.random.key(1), (2, 8, 8, 3), maxval=255.0)


def _project(root: pathlib.Path, small_head: str = '') -> pathlib.Path:
  package = root / 'networks'
  package.mkdir(parents=True)
  (package / '__init__.py').write_text('')
  (package / 'encoders.py').write_text(ENCODERS)
  (package / 'agents.py').write_text(AGENTS.format(small_head=small_head))
  return package


def _migrated(tmp_path: pathlib.Path, monkeypatch, small_head: str = ''):
  """The migrate result over the package, written, and the module `networks.agents` of each tree."""
  linen_root, nnx_root = tmp_path / 'linen', tmp_path / 'nnx'
  _project(linen_root, small_head), _project(nnx_root, small_head)
  monkeypatch.chdir(nnx_root)
  result = migrate(['networks'], rules=registry.ALL_RULES, write=True, jobs=1)
  again = migrate(['networks'], rules=registry.ALL_RULES, write=False, jobs=1)
  assert [o.path for o in again.files if o.status == 'changed'] == []  # a second run changes nothing
  return result, _agents(linen_root, monkeypatch), _agents(nnx_root, monkeypatch)


def _agents(root: pathlib.Path, monkeypatch):
  for name in [m for m in sys.modules if m == 'networks' or m.startswith('networks.')]:
    monkeypatch.delitem(sys.modules, name)
  monkeypatch.syspath_prepend(str(root))
  return importlib.import_module('networks.agents')


def test_classes_that_build_classes_of_another_file_convert_with_them(tmp_path, monkeypatch):
  result, linen, ported = _migrated(tmp_path, monkeypatch)
  assert result.fates()['converted'] == 4 and result.fates()['kept_linen'] == 0
  agents = (tmp_path / 'nnx' / 'networks' / 'agents.py').read_text()
  assert 'self.impala_encoder = encoders.ImpalaEncoder(stack1_conv1_in_features=' in agents
  assert 'self.stack = Stack(4, conv1_in_features=stack_conv1_in_features, rngs=rngs)' in agents

  model = ported.QNetwork(3, impala_encoder_stack1_conv1_in_features=3, linear1_in_features=32, rngs=nnx.Rngs(0))
  variables = linen.QNetwork(3).init(jax.random.key(0), X)
  report = nnx_bridge.compare(linen.QNetwork(3), variables, model, X)
  assert report.ok, report.to_text()
  assert {d.path for d in report.differences if d.check == 'gradient'} >= {
      'impala_encoder/stack1/conv1/kernel', 'impala_encoder/stack2/conv2/bias', 'linear2/kernel'}

  small = ported.SmallQNetwork(3, stack_conv1_in_features=3, linear_in_features=4, rngs=nnx.Rngs(0))
  small_variables = linen.SmallQNetwork(3).init(jax.random.key(0), X)
  assert nnx_bridge.compare(linen.SmallQNetwork(3), small_variables, small, X).ok


def test_the_comparison_of_classes_built_across_files_rejects_a_wrong_port(tmp_path, monkeypatch):
  _, linen, ported = _migrated(tmp_path, monkeypatch)
  wrong = ported.QNetwork(3, inputs_preprocessed=True, impala_encoder_stack1_conv1_in_features=3,
                          linear1_in_features=32, rngs=nnx.Rngs(0))  # skips the scaling of the inputs
  variables = linen.QNetwork(3).init(jax.random.key(0), X)
  report = nnx_bridge.compare(linen.QNetwork(3), variables, wrong, X)
  assert not report.ok and ('output', 'output') in {(d.check, d.path) for d in report.failures}


JITTED = textwrap.dedent('''\
    @nn.jit
    class JittedHead(nn.Module):
      @nn.compact
      def __call__(self, x):
        for _ in range(1):  # Linen numbers the stacks at run time: no wrapper can take their names
          x = Stack(num_ch=2)(x)
        return x

''')


def test_a_class_of_another_file_built_by_a_class_that_stays_linen_is_kept_linen(tmp_path, monkeypatch):
  result, linen, ported = _migrated(tmp_path, monkeypatch, small_head=JITTED)
  kept = {o.path: [e.message for e in o.entries if e.kind == 'todo'] for o in result.files}
  assert any('class Stack kept as Linen: the class JittedHead of networks/agents.py, which stays Linen, builds it'
             in message for message in kept['networks/encoders.py'])
  converted = {c.linen_name for o in result.files for c in o.classes}
  assert {'ImpalaEncoder', 'QNetwork'} <= converted and not {'Stack', 'JittedHead'} & converted
  head = ported.JittedHead()
  assert head.apply(head.init(jax.random.key(0), X), X).shape == (2, 4, 4, 2)
  want = linen.JittedHead().apply(linen.JittedHead().init(jax.random.key(0), X), X)
  assert jnp.allclose(head.apply(head.init(jax.random.key(0), X), X), want)


def test_a_package_given_as_the_folder_is_no_import_root_for_its_subpackages(tmp_path, monkeypatch):
  """dopamine's layout: `dopamine/jax/networks.py` imports the real jax; migrating the folder `dopamine` must not
  take `dopamine/jax` for the module `jax` (and `jnp.array` for code of the project)."""
  package = tmp_path / 'dopamine' / 'jax'
  package.mkdir(parents=True)
  (tmp_path / 'dopamine' / '__init__.py').write_text('')
  (package / '__init__.py').write_text('')
  (package / 'networks.py').write_text(textwrap.dedent('''\
      import flax.linen as nn
      import jax.numpy as jnp


      class ClassicControlDQNNetwork(nn.Module):
        num_actions: int
        min_vals: tuple = (-1.0, -2.0)

        def setup(self):
          self.offset = jnp.array(self.min_vals)
          self.head = nn.Dense(self.num_actions)

        def __call__(self, x):
          return self.head(x - self.offset)
      '''))
  monkeypatch.chdir(tmp_path)
  result = migrate(['dopamine'], rules=registry.ALL_RULES, write=False, jobs=1)
  assert [c.linen_name for o in result.files for c in o.classes] == ['ClassicControlDQNNetwork'], \
      [e.message for o in result.files for e in o.entries if e.kind == 'todo']


TABLES = '''\
"""Tables computed once, in numpy (jax-md's uma/common/so3.py)."""
import numpy as np


def coefficient_table(lmax):
  return np.arange((lmax + 1) ** 2, dtype=np.float32) / (lmax + 1) ** 2
'''

HELPERS = '''\
"""Helpers that build Linen layers."""
import flax.linen as nn


def coefficient_table(lmax):
  return nn.Dense(lmax)
'''

UMA = '''\
import flax.linen as nn

from {package} import tables


class Block(nn.Module):
  lmax: int = 2

  def setup(self):
    self.table = tables.coefficient_table(self.lmax)
    self.dense = nn.Dense((self.lmax + 1) ** 2)

  def __call__(self, x):
    return self.dense(x) * self.table
'''


@pytest.mark.parametrize('helper, converts', [(TABLES, True), (HELPERS, False)], ids=['numpy_tables', 'builds_layers'])
def test_setup_code_calling_a_plain_module_of_the_run_converts(tmp_path, monkeypatch, helper, converts):
  """A call of a function of another file of the run that knows nothing of flax is plain code, kept as it is in
  __init__; one of a file that may build Linen layers keeps the class Linen, with why."""
  for root in (tmp_path / 'linen', tmp_path / 'nnx'):
    package = root / 'uma'
    package.mkdir(parents=True)
    (package / '__init__.py').write_text('')
    (package / 'tables.py').write_text(helper)
    (package / 'blocks.py').write_text(UMA.format(package='uma'))
  monkeypatch.chdir(tmp_path / 'nnx')
  result = migrate(['uma'], rules=registry.ALL_RULES, write=True, jobs=1)
  todos = [e.message for o in result.files for e in o.entries if e.kind == 'todo']
  if not converts:
    assert result.fates()['converted'] == 0
    assert any('tables.coefficient_table(...) calls uma.tables.coefficient_table, code of this project L2N002 does '
               'not follow' in message for message in todos), todos
    return
  assert result.fates()['converted'] == 1, todos
  modules = {}
  for side in ('linen', 'nnx'):
    for name in [m for m in sys.modules if m == 'uma' or m.startswith('uma.')]:
      monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path / side))
    modules[side] = importlib.import_module('uma.blocks')
  x = jax.random.normal(jax.random.key(1), (2, 5))
  model = modules['nnx'].Block(dense_in_features=5, rngs=nnx.Rngs(0))
  linen_block = modules['linen'].Block()
  report = nnx_bridge.compare(linen_block, linen_block.init(jax.random.key(0), x), model, x)
  assert report.ok, report.to_text()


BLOCKS = '''import flax.linen as nn


class Block(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features)(x)


class Tower(nn.Module):
  features: int
  depth: int = 2

  def setup(self):
    self.blocks = [Block(self.features) for _ in range(self.depth)]

  def __call__(self, x):
    for block in self.blocks:
      x = block(x)
    return x
'''

USERS = '''import flax.linen as nn

from towers import blocks


@nn.jit
class Head(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(1):  # Linen numbers the towers at run time: no wrapper can take their names
      x = blocks.Tower(4)(x)
    return x
'''


def test_a_class_kept_for_another_files_use_does_not_wrap_what_it_builds_in_a_loop(tmp_path, monkeypatch):
  """`Tower` stays Linen because `Head` (another file, itself Linen) builds it; the Blocks it builds in a setup()
  list stay Linen with it rather than be wrapped with to_linen there, which a second run would read as a Linen module
  built in a loop and report another reason for `Tower` (diffusers' transformer blocks in their UNet blocks)."""
  package = tmp_path / 'towers'
  package.mkdir()
  (package / '__init__.py').write_text('')
  (package / 'blocks.py').write_text(BLOCKS)
  (package / 'heads.py').write_text(USERS)
  monkeypatch.chdir(tmp_path)
  result = migrate(['towers'], rules=registry.ALL_RULES, write=True, jobs=1)
  again = migrate(['towers'], rules=registry.ALL_RULES, write=False, jobs=1)
  assert [o.path for o in again.files if o.status == 'changed'] == []  # a second run changes nothing
  todos = [e.message for o in result.files for e in o.entries if e.kind == 'todo']
  assert any('class Block kept as Linen: the class Tower, left as Linen, uses it, and cannot wrap it with '
             'nnx_bridge.to_linen: Tower builds Block in a loop' in m for m in todos), todos
  assert 'nnx_bridge.to_linen(' not in (package / 'blocks.py').read_text()


def _two_trees(tmp_path: pathlib.Path, monkeypatch, files: dict[str, str], module: str,
               edit: tuple[str, tp.Callable[[str], str]] | None = None):
  """The migrate result over a package of `files` (relative path -> code; the first part the package, a file
  beside it out of the run), the migrated file `edit[0]` edited by `edit[1]`, and the module `module` of each tree,
  the original and the migrated."""
  trees = {side: tmp_path / side for side in ('linen', 'nnx')}
  package = next(iter(files)).split('/')[0]
  for root in trees.values():
    for name, code in files.items():
      (root / name).parent.mkdir(parents=True, exist_ok=True)
      (root / name).write_text(code)
  monkeypatch.chdir(trees['nnx'])
  result = migrate([package], rules=registry.ALL_RULES, write=True, jobs=1)
  again = migrate([package], rules=registry.ALL_RULES, write=False, jobs=1)
  assert [o.path for o in again.files if o.status == 'changed'] == []  # a second run changes nothing
  if edit is not None:
    path = trees['nnx'] / edit[0]
    path.write_text(edit[1](path.read_text()))
  modules = {}
  tops = {name.split('/')[0].removesuffix('.py') for name in files}
  for side, root in trees.items():
    for name in [m for m in sys.modules if m.split('.')[0] in tops]:
      monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(root))
    modules[side] = importlib.import_module(module)
  return result, modules['linen'], modules['nnx']


RESNET_BLOCK = '''\
"""A residual block in the style of diffusers' resnet_flax: its output size is a local of its setup()."""
import flax.linen as nn
import jax.numpy as jnp


class ResnetBlock(nn.Module):
  in_channels: int
  out_channels: int = None

  def setup(self):
    out_channels = self.in_channels if self.out_channels is None else self.out_channels
    self.norm1 = nn.GroupNorm(num_groups=2, epsilon=1e-5)
    self.conv1 = nn.Conv(out_channels, kernel_size=(3, 3), padding=((1, 1), (1, 1)))
    self.time_emb_proj = nn.Dense(out_channels)
    self.conv_shortcut = None
    if self.in_channels != out_channels:
      self.conv_shortcut = nn.Conv(out_channels, kernel_size=(1, 1), padding='VALID')

  def __call__(self, hidden_states, temb):
    residual = hidden_states
    hidden_states = self.conv1(nn.swish(self.norm1(hidden_states)))
    hidden_states = hidden_states + jnp.expand_dims(jnp.expand_dims(self.time_emb_proj(nn.swish(temb)), 1), 1)
    if self.conv_shortcut is not None:
      residual = self.conv_shortcut(residual)
    return hidden_states + residual
'''

DOWN_BLOCKS = '''\
"""A down block in the style of diffusers' unet_2d_blocks_flax, building the residual blocks of another file."""
import flax.linen as nn

from .resnet import ResnetBlock


class DownBlock(nn.Module):
  in_channels: int
  out_channels: int
  num_layers: int = 2

  def setup(self):
    resnets = []
    for i in range(self.num_layers):
      in_channels = self.in_channels if i == 0 else self.out_channels
      res_block = ResnetBlock(in_channels=in_channels, out_channels=self.out_channels)
      resnets.append(res_block)
    self.resnets = resnets

  def __call__(self, hidden_states, temb):
    for resnet in self.resnets:
      hidden_states = resnet(hidden_states, temb)
    return hidden_states
'''


def test_a_size_a_class_of_another_file_returns_may_name_a_local_of_its_setup(tmp_path, monkeypatch):
  """The block's later iterations take the residual block's output, `out_channels`, a local of that class's setup()
  in another file: the record carries what setup() binds it to, so the block's list needs sizes for its first
  iteration only. Without it, the size would change from one iteration to the next in a way the code does not
  express, and the block would stay Linen."""
  files = {'unets/__init__.py': '', 'unets/resnet.py': RESNET_BLOCK, 'unets/blocks.py': DOWN_BLOCKS}
  result, linen_blocks, nnx_blocks = _two_trees(tmp_path, monkeypatch, files, 'unets.blocks')
  assert {c.linen_name for o in result.files for c in o.classes} == {'ResnetBlock', 'DownBlock'}, \
      [e.message for o in result.files for e in o.entries if e.kind == 'todo']
  blocks = (tmp_path / 'nnx' / 'unets' / 'blocks.py').read_text()
  assert 'norm1_num_features=resnets_norm1_num_features if i == 0 else ' in blocks, blocks
  x, temb = jax.random.normal(jax.random.key(1), (2, 6, 6, 2)), jax.random.normal(jax.random.key(2), (2, 5))
  linen = linen_blocks.DownBlock(2, 4)
  variables = linen.init(jax.random.key(0), x, temb)
  sizes = {name: value for name, value in (('resnets_norm1_num_features', 2), ('resnets_time_emb_proj_in_features', 5))
           if name in blocks}
  port = nnx_blocks.DownBlock(2, 4, **sizes, rngs=nnx.Rngs(0))
  report = nnx_bridge.compare(linen, variables, port, x, temb)
  assert report.ok, report.to_text()
  assert {'resnets/0/conv_shortcut/kernel', 'resnets/1/conv1/kernel'} <= {
      d.path for d in report.differences if d.check == 'gradient'}


EMBEDDINGS = '''\
"""Embeddings in the style of diffusers' embeddings_flax and jax-md's UMA radial functions."""
import flax.linen as nn
import jax.numpy as jnp


class TimestepEmbedding(nn.Module):
  time_embed_dim: int = 32
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, temb):
    temb = nn.Dense(self.time_embed_dim, dtype=self.dtype, name='linear_1')(temb)
    temb = nn.silu(temb)
    return nn.Dense(self.time_embed_dim, dtype=self.dtype, name='linear_2')(temb)


class GaussianSmearing(nn.Module):
  num_gaussians: int = 6

  def setup(self):
    self.offset = jnp.linspace(0.0, 1.0, self.num_gaussians)
    self.scale = self.param('scale', nn.initializers.ones, (self.num_gaussians,))

  def __call__(self, dist):
    return jnp.exp(-((dist[..., None] - self.offset) * self.scale) ** 2)
'''

CONTROLNET = '''\
"""A top model in the style of diffusers' ControlNet: a base out of sight (a loader mixin) keeps it Linen."""
import flax.linen as nn
import jax.numpy as jnp

from loaders import ModelMixin

from . import embeddings
from .embeddings import TimestepEmbedding


class ControlNet(nn.Module, ModelMixin):
  features: int = 8
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.conv_in = nn.Dense(self.features, dtype=self.dtype)
    self.time_embedding = TimestepEmbedding(self.features * 4, dtype=self.dtype)

  @nn.compact
  def __call__(self, x, t, dist):
    smearing = embeddings.GaussianSmearing(num_gaussians=self.features, name='distance_expansion')
    h = self.conv_in(x) + self.time_embedding(t)[..., : self.features]
    return h * smearing(dist)
'''


ARGS = (jax.random.normal(jax.random.key(1), (2, 5)), jax.random.normal(jax.random.key(2), (2, 3)),
        jax.random.uniform(jax.random.key(3), (2,)))


def _controlnets(tmp_path: pathlib.Path, monkeypatch, edit=None):
  files = {'controlnets/__init__.py': '', 'controlnets/embeddings.py': EMBEDDINGS,
           'controlnets/controlnet.py': CONTROLNET, 'loaders.py': 'class ModelMixin:\n  pass\n'}
  return _two_trees(tmp_path, monkeypatch, files, 'controlnets.controlnet', edit)


def test_a_linen_class_wraps_a_class_another_file_converted_with_to_linen(tmp_path, monkeypatch):
  """ControlNet stays Linen (its base is out of sight) and builds classes of another file, by name in setup() and
  by module attribute with name= in a compact body: they convert all the same, and ControlNet wraps each with
  nnx_bridge.to_linen, so that the Linen program runs on the same variables (paths, values, gradients)."""
  result, linen, ported = _controlnets(tmp_path, monkeypatch)
  assert {c.linen_name for o in result.files for c in o.classes} == {'TimestepEmbedding', 'GaussianSmearing'}, \
      [e.message for o in result.files for e in o.entries if e.kind == 'todo']
  code = (tmp_path / 'nnx' / 'controlnets' / 'controlnet.py').read_text()
  assert "nnx_bridge.to_linen(TimestepEmbedding, self.features * 4, dtype=self.dtype, input_sizes=" in code, code
  assert "nnx_bridge.to_linen(embeddings.GaussianSmearing, num_gaussians=self.features, " \
         "name='distance_expansion')" in code, code
  assert issubclass(ported.embeddings.TimestepEmbedding, nnx.Module)
  variables = linen.ControlNet().init(jax.random.key(0), *ARGS)
  assert jax.tree.structure(ported.ControlNet().init(jax.random.key(0), *ARGS)) == jax.tree.structure(variables)
  assert {'time_embedding', 'distance_expansion'} <= set(variables['params'])
  params = jax.tree.map(lambda p: p + jax.random.uniform(jax.random.key(4), p.shape), variables['params'])  # trained
  loss = lambda module: lambda p: jnp.sum(jnp.sin(module.apply({'params': p}, *ARGS)))
  assert jnp.array_equal(linen.ControlNet().apply({'params': params}, *ARGS),
                         ported.ControlNet().apply({'params': params}, *ARGS))
  want, got = jax.grad(loss(linen.ControlNet()))(params), jax.grad(loss(ported.ControlNet()))(params)
  assert all(jnp.allclose(a, b, atol=1e-6) for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)))
  assert jnp.abs(got['distance_expansion']['scale']).sum() > 0
  assert jnp.abs(got['time_embedding']['linear_2']['kernel']).sum() > 0


def test_the_comparison_of_a_linen_class_wrapping_another_files_class_rejects_a_wrong_port(tmp_path, monkeypatch):
  """The check above fails when the converted class computes something else (relu for silu)."""
  _, linen, ported = _controlnets(tmp_path, monkeypatch, ('controlnets/embeddings.py', lambda code: code.replace('nnx.silu(', 'nnx.relu(')))
  variables = linen.ControlNet().init(jax.random.key(0), *ARGS)
  assert not jnp.allclose(linen.ControlNet().apply(variables, *ARGS), ported.ControlNet().apply(variables, *ARGS))


STACKS = '''\
"""A stack in the style of dopamine's Impala stack: two convolutions per block, which Linen counts across blocks."""
import flax.linen as nn


class Stack(nn.Module):
  num_ch: int
  num_blocks: int = 2

  @nn.compact
  def __call__(self, x):
    conv_out = nn.Conv(features=self.num_ch, kernel_size=(3, 3), strides=1, padding='SAME')(x)
    for _ in range(self.num_blocks):
      block_input = conv_out
      conv_out = nn.relu(conv_out)
      conv_out = nn.Conv(features=self.num_ch, kernel_size=(3, 3), strides=1, padding='SAME')(conv_out)
      conv_out = nn.relu(conv_out)
      conv_out = nn.Conv(features=self.num_ch, kernel_size=(3, 3), strides=1, padding='SAME')(conv_out)
      conv_out += block_input
    return conv_out
'''

STACK_HEADS = '''\
import flax.linen as nn

from stacks import encoders


@nn.jit
class Head(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = encoders.Stack(num_ch=4, name='stack')(x)
    return nn.Dense(2)(x.reshape((x.shape[0], -1)))
'''


def test_a_linen_class_wraps_a_class_whose_loop_layers_linen_counts_across_iterations(tmp_path, monkeypatch):
  """Linen names the two convolutions of block i `Conv_{1 + 2 * i}` and `Conv_{2 + 2 * i}`: the wrapper stores the
  NNX lists under those names, so the Linen head runs on the Linen variables, gradients included."""
  files = {'stacks/__init__.py': '', 'stacks/encoders.py': STACKS, 'stacks/heads.py': STACK_HEADS}
  result, linen, ported = _two_trees(tmp_path, monkeypatch, files, 'stacks.heads')
  assert {c.linen_name for o in result.files for c in o.classes} == {'Stack'}
  code = (tmp_path / 'nnx' / 'stacks' / 'heads.py').read_text()
  assert "'convs1': 'Conv_{1 + 2 * i}', 'convs2': 'Conv_{2 + 2 * i}'" in code, code
  x = jax.random.normal(jax.random.key(1), (2, 4, 4, 3))
  variables = linen.Head().init(jax.random.key(0), x)
  assert set(variables['params']['stack']) == {f'Conv_{k}' for k in range(5)}
  assert jax.tree.structure(ported.Head().init(jax.random.key(0), x)) == jax.tree.structure(variables)
  params = jax.tree.map(lambda p: p + jax.random.uniform(jax.random.key(4), p.shape), variables['params'])
  loss = lambda module: lambda p: jnp.sum(jnp.sin(module.apply({'params': p}, x)))
  assert jnp.allclose(linen.Head().apply({'params': params}, x), ported.Head().apply({'params': params}, x),
                      atol=1e-6)
  want, got = jax.grad(loss(linen.Head()))(params), jax.grad(loss(ported.Head()))(params)
  assert all(jnp.allclose(a, b, atol=1e-5) for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)))
  swapped = {**params, 'stack': {**params['stack'], 'Conv_3': params['stack']['Conv_4'],
                                 'Conv_4': params['stack']['Conv_3']}}  # the names matter: a swap is caught
  assert not jnp.allclose(linen.Head().apply({'params': params}, x), ported.Head().apply({'params': swapped}, x))


ACTORS = {
    'agents/__init__.py': '',
    'agents/base.py': textwrap.dedent('''\
        """An actor that stays Linen: its __call__ takes *args."""
        import flax.linen as nn


        class Actor(nn.Module):
          features: int = 4

          @nn.compact
          def __call__(self, x, *args):
            return nn.Dense(self.features)(x)
        '''),
    'agents/nets.py': textwrap.dedent('''\
        """dopamine's SAC network style: a class of another file built as `self.<attr> = ...` in setup()."""
        import flax.linen as nn

        from agents import base


        class Net(nn.Module):
          features: int = 4

          def setup(self):
            self.actor = base.Actor(self.features)
            self.head = nn.Dense(2)

          def __call__(self, x):
            return self.head(nn.tanh(self.actor(x)))
        '''),
}


def test_a_class_building_a_linen_class_another_file_keeps_wraps_it_with_from_linen(tmp_path, monkeypatch):
  """`base.Actor` stays Linen in its file; once the run has settled that, `Net` converts around it, the actor
  wrapped with nnx_bridge.from_linen (its example inputs a constructor argument), and runs as the Linen `Net` on
  its variables: forward and gradients."""
  result, linen, ported = _two_trees(tmp_path, monkeypatch, ACTORS, 'agents.nets')
  assert {c.linen_name for o in result.files for c in o.classes} == {'Net'}
  code = (tmp_path / 'nnx' / 'agents' / 'nets.py').read_text()
  assert 'self.actor = nnx_bridge.from_linen(base.Actor(self.features), *actor_example_inputs, rngs=rngs)' in code, code
  todos = {e.message for o in result.files for e in o.entries if e.kind == 'todo'}
  assert any(m.startswith('self.actor: base.Actor stays Linen (it stays Linen in its own file') for m in todos), todos
  x = jax.random.normal(jax.random.key(1), (2, 3))
  model = ported.Net(actor_example_inputs=(x,), head_in_features=4, rngs=nnx.Rngs(0))
  report = nnx_bridge.compare(linen.Net(), linen.Net().init(jax.random.key(0), x), model, x, train=False)
  assert report.ok, report


def test_the_comparison_of_a_class_wrapping_another_files_linen_class_rejects_a_wrong_port(tmp_path, monkeypatch):
  """The check above fails when the converted class computes something else (relu for tanh)."""
  _, linen, ported = _two_trees(tmp_path, monkeypatch, ACTORS, 'agents.nets',
                                ('agents/nets.py', lambda code: code.replace('nnx.tanh(', 'nnx.relu(')))
  x = jax.random.normal(jax.random.key(1), (2, 3))
  model = ported.Net(actor_example_inputs=(x,), head_in_features=4, rngs=nnx.Rngs(0))
  assert not nnx_bridge.compare(linen.Net(), linen.Net().init(jax.random.key(0), x), model, x, train=False).ok


def test_a_class_imported_under_another_name_is_wrapped_under_the_name_linen_gives_its_class(tmp_path, monkeypatch):
  """Linen numbers a module by its class's name, not by what the file imports it as: `Tower(...)(x)` of
  `from stacks.encoders import Stack as Tower` is `Stack_0`, and the wrapper takes that name."""
  heads = STACK_HEADS.replace('from stacks import encoders', 'from stacks.encoders import Stack as Tower') \
      .replace("x = encoders.Stack(num_ch=4, name='stack')(x)", 'x = Tower(num_ch=4)(x)')
  assert 'Tower(num_ch=4)(x)' in heads
  files = {'stacks/__init__.py': '', 'stacks/encoders.py': STACKS, 'stacks/heads.py': heads}
  result, linen, ported = _two_trees(tmp_path, monkeypatch, files, 'stacks.heads')
  assert {c.linen_name for o in result.files for c in o.classes} == {'Stack'}
  assert "nnx_bridge.to_linen(Tower, num_ch=4, name='Stack_0'" in (tmp_path / 'nnx' / 'stacks' / 'heads.py').read_text()
  x = jax.random.normal(jax.random.key(1), (2, 4, 4, 3))
  variables = linen.Head().init(jax.random.key(0), x)
  assert 'Stack_0' in variables['params']
  assert jax.tree.structure(ported.Head().init(jax.random.key(0), x)) == jax.tree.structure(variables)
  assert jnp.allclose(linen.Head().apply(variables, x), ported.Head().apply(variables, x), atol=1e-6)


CONTINUOUS_NETWORKS = '''\
"""Actor and critic networks in the style of dopamine's jax/continuous_networks.py."""
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


class ActorNetwork(nn.Module):
  action_dim: int
  num_layers: int = 2
  hidden_units: int = 8
  activation: Callable[[jax.Array], jax.Array] = nn.relu

  @nn.compact
  def __call__(self, state: jnp.ndarray) -> jnp.ndarray:
    x = state.astype(jnp.float32)
    for _ in range(self.num_layers):
      x = nn.Dense(features=self.hidden_units)(x)
      x = self.activation(x)
    loc = nn.Dense(features=self.action_dim)(x)
    return jnp.tanh(nn.Dense(features=self.action_dim)(x)) + loc


class CriticNetwork(nn.Module):
  num_layers: int = 2
  hidden_units: int = 8

  @nn.compact
  def __call__(self, state: jnp.ndarray, action: jnp.ndarray) -> jnp.ndarray:
    x = jnp.concatenate((state.astype(jnp.float32), action), axis=-1)
    for _ in range(self.num_layers):
      x = nn.relu(nn.Dense(features=self.hidden_units)(x))
    return nn.Dense(features=1)(x)


class ActorCriticNetwork(nn.Module):
  action_dim: int
  num_layers: int = 2
  hidden_units: int = 8

  def setup(self):
    self._actor = ActorNetwork(self.action_dim, self.num_layers, self.hidden_units)
    self._critic = CriticNetwork(num_layers=self.num_layers + 1)

  def __call__(self, state: jnp.ndarray) -> jnp.ndarray:
    action = self._actor(state)
    return action, self._critic(state, action)
'''
CALE_NETWORKS = '''\
"""A pixel encoder over a continuous agent, in the style of dopamine's labs/cale/networks.py."""
import flax.linen as nn
import jax.numpy as jnp

from agents import continuous_networks


class SACConvNetwork(nn.Module):
  action_dim: int
  sac_cls: nn.Module = continuous_networks.ActorCriticNetwork

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    x = nn.relu(nn.Conv(features=4, kernel_size=(3, 3))(x)).reshape((x.shape[0], -1))
    return self.sac_cls(self.action_dim, num_layers=3)(x)
'''


def test_layers_linen_numbers_after_a_loop_s_keep_their_names_under_the_bridge(tmp_path, monkeypatch):
  """The actor's last layers are Linen's `Dense_{self.num_layers}` and `Dense_{self.num_layers + 1}`: the wrapper
  stores them there by the NNX module's num_layers, whatever the construction gives it (the critic is built with
  num_layers=self.num_layers + 1), so the Linen class that stays builds both on its own variables."""
  files = {'agents/__init__.py': '', 'agents/continuous_networks.py': CONTINUOUS_NETWORKS,
           'agents/cale_networks.py': CALE_NETWORKS}
  result, linen_nets, nnx_nets = _two_trees(tmp_path, monkeypatch, files, 'agents.cale_networks')
  assert {c.linen_name for o in result.files for c in o.classes} == {'ActorNetwork', 'CriticNetwork'}, \
      [e.message for o in result.files for e in o.entries if e.kind == 'todo']
  code = (tmp_path / 'nnx' / 'agents' / 'continuous_networks.py').read_text()
  assert "linen_names={'linears': 'Dense_{}', 'linear1': 'Dense_{num_layers}', 'linear2': 'Dense_{num_layers + 1}'}" \
      in code and "linen_names={'linears': 'Dense_{}', 'linear': 'Dense_{num_layers}'}" in code, code
  x = jax.random.normal(jax.random.key(1), (2, 4, 4, 1))
  linen, bridged = linen_nets.SACConvNetwork(2), nnx_nets.SACConvNetwork(2)
  variables = linen.init(jax.random.key(0), x)
  trained = jax.tree.map(lambda v: v + 0.1 * jax.random.normal(jax.random.key(5), v.shape), variables)
  assert {'Dense_3', 'Dense_4'} <= set(variables['params']['ActorCriticNetwork_0']['_actor'])
  assert set(variables['params']['ActorCriticNetwork_0']['_critic']) == {'Dense_0', 'Dense_1', 'Dense_2', 'Dense_3',
                                                                          'Dense_4'}
  assert jax.tree.map(jnp.shape, bridged.init(jax.random.key(0), x)) == jax.tree.map(jnp.shape, variables)
  for got, want in zip(bridged.apply(trained, x), linen.apply(trained, x), strict=True):
    assert jnp.allclose(got, want, atol=1e-6)
  loss = lambda model: lambda p: sum(o.sum() for o in model.apply({'params': p}, x))
  grads = [jax.grad(loss(m))(trained['params']) for m in (linen, bridged)]
  for got, want in zip(jax.tree.leaves(grads[1]), jax.tree.leaves(grads[0]), strict=True):
    assert jnp.allclose(got, want, atol=1e-5)
  swapped = {**trained['params']['ActorCriticNetwork_0']['_actor']}
  swapped['Dense_3'], swapped['Dense_4'] = swapped['Dense_4'], swapped['Dense_3']
  wrong = {'params': {**trained['params'], 'ActorCriticNetwork_0': {
      **trained['params']['ActorCriticNetwork_0'], '_actor': swapped}}}
  assert not jnp.allclose(bridged.apply(wrong, x)[0], linen.apply(trained, x)[0], atol=1e-3)
