"""find_seams: the uses of NNX classes a migrated tree would break on, across files, and none where the code works."""

import dataclasses

from codemods.analysis import seams
from codemods.analysis.seams import find_seams

LAYERS = '''from flax import nnx


class Block(nnx.Module):
  def __init__(self, features: int, *, linear_in_features: int, rngs: nnx.Rngs):
    self.linear = nnx.Linear(linear_in_features, features, rngs=rngs)

  def __call__(self, x):
    return self.linear(x)
'''

BROKEN_MODELS = '''import flax.linen as nn

from pkg.layers import Block


class Tower(nn.Module):
  @nn.compact
  def __call__(self, x):
    return Block(3)(x)


class Wider(Block):
  features: int

  def setup(self):
    pass
'''

BROKEN_TRAIN = '''import jax.numpy as jnp

from pkg import layers


def init(rng):
  block = layers.Block(3)
  return block.init(rng, jnp.ones((1, 4)))


def init_again(rng):
  return layers.Block(3, linear_in_features=4, rngs=rng).init_with_output(rng, jnp.ones((1, 4)))
'''

WORKING_MODELS = '''import flax.linen as nn
from flax import nnx

import nnx_bridge
from pkg.layers import Block


class Tower(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nnx_bridge.to_linen(Block, 3, linear_in_features=4)(x)


def build(features: int):
  block: Block = Block(features, linear_in_features=4, rngs=nnx.Rngs(0))
  return block(1.0)
'''


def _seams(tmp_path, **files: str) -> list[seams.Seam]:
  """The seams of a package `pkg` (its layers and `files`), written under tmp_path, with paths relative to it."""
  tree = {'pkg/__init__.py': '', 'pkg/layers.py': LAYERS, **{f'pkg/{k}.py': v for k, v in files.items()}}
  for path, text in tree.items():
    (tmp_path / path).parent.mkdir(exist_ok=True)
    (tmp_path / path).write_text(text)
  found = find_seams({str(tmp_path / path): text for path, text in tree.items()}, [str(tmp_path)])
  relative = lambda path: path[len(str(tmp_path)) + 1:]
  return [dataclasses.replace(s, path=relative(s.path), target_path=relative(s.target_path)) for s in found]


def test_each_kind_of_broken_use_is_found_across_files(tmp_path):
  found = _seams(tmp_path, models=BROKEN_MODELS, train=BROKEN_TRAIN)
  assert [(s.path, s.line, s.kind, s.user) for s in found] == [
      ('pkg/models.py', 9, seams.LINEN_BUILDS_NNX, 'Tower'),
      ('pkg/models.py', 12, seams.LINEN_SUBCLASSES_NNX, 'Wider'),
      ('pkg/train.py', 7, seams.MISSING_ARGUMENTS, None),
      ('pkg/train.py', 8, seams.LINEN_API_ON_NNX, None),
      ('pkg/train.py', 12, seams.LINEN_API_ON_NNX, None),
  ]
  assert all(s.target == 'pkg.layers.Block' and s.target_path == 'pkg/layers.py' for s in found)
  missing = found[2]
  assert 'needs linear_in_features, rngs here' in missing.message and not missing.flagged


def test_working_uses_are_not_seams(tmp_path):
  """Bridged with to_linen, built with every required argument, named in an annotation: nothing to report."""
  assert _seams(tmp_path, models=WORKING_MODELS) == []


def test_a_use_whose_todo_is_already_there_is_flagged(tmp_path):
  found = _seams(tmp_path, train=BROKEN_TRAIN)
  lines = BROKEN_TRAIN.splitlines(keepends=True)
  lines.insert(6, f'  {found[0].todo}\n')
  again = _seams(tmp_path, train=''.join(lines))
  assert [s.flagged for s in again] == [True, False, False]


def test_files_that_do_not_parse_are_left_out(tmp_path):
  assert {s.path for s in _seams(tmp_path, train='def broken(:\n', models=BROKEN_MODELS)} == {'pkg/models.py'}


HOLDERS = '''from pkg.layers import Block


class BlockModel:
  module_class = Block
  config_class: type = dict


class Registry:
  """A class attribute that only names a config, or a string: nothing is held."""
  name = 'Block'
'''


def test_a_class_attribute_holding_an_nnx_class_is_a_seam(tmp_path):
  found = _seams(tmp_path, wrappers=HOLDERS)
  assert [(s.path, s.line, s.kind, s.user) for s in found] == [('pkg/wrappers.py', 5, seams.HELD_FOR_LINEN_CODE,
                                                                 'BlockModel')]
  assert found[0].message.startswith('BlockModel.module_class holds Block, an NNX module')
  assert _seams(tmp_path, wrappers=HOLDERS.replace('module_class = Block', 'module_class = None')) == []


# flax's imagenet layout: models.py names its variants with partial, train.py builds one by that name.
VARIANTS = '''from functools import partial

from pkg.layers import Block

Block3 = partial(Block, 3)
SameBlock = Block
'''

VARIANT_TRAIN = '''import jax.numpy as jnp
from flax import nnx

from pkg import variants


def init(rng):
  model = variants.Block3()
  return model.init(rng, jnp.ones((1, 4)))


def built(rng):
  return variants.Block3(linear_in_features=4, rngs=nnx.Rngs(rng)), variants.SameBlock(3)
'''


def test_a_partial_or_alias_of_an_nnx_class_is_followed_with_what_it_gives(tmp_path):
  found = _seams(tmp_path, variants=VARIANTS, train=VARIANT_TRAIN)
  assert [(s.path, s.line, s.kind) for s in found] == [
      ('pkg/train.py', 8, seams.MISSING_ARGUMENTS),
      ('pkg/train.py', 9, seams.LINEN_API_ON_NNX),
      ('pkg/train.py', 13, seams.MISSING_ARGUMENTS),
  ]
  assert found[0].message.startswith(  # not features: the partial gives it
      'Block3 (Block) is now an NNX module and needs linear_in_features, rngs here (Block3(..., linear_in_features=')
  assert found[2].message.startswith('SameBlock (Block) is now an NNX module and needs linear_in_features, rngs')


LOOKUP_TRAIN = '''from pkg import layers


def create_model(name: str):
  model_cls = getattr(layers, name)
  version = getattr(layers, '__version__', None)
  return model_cls(3), version
'''


def test_a_class_looked_up_by_name_in_a_module_of_nnx_classes_is_a_seam(tmp_path):
  found = _seams(tmp_path, train=LOOKUP_TRAIN)
  assert [(s.path, s.line, s.kind, s.target) for s in found] == [
      ('pkg/train.py', 5, seams.LOOKUP_BY_NAME, 'pkg.layers.Block')]
  assert found[0].message.startswith('getattr(layers, ...) looks up a class of ')


TWO_FOLDERS_TRAIN = '''import jax
import jax.numpy as jnp
import models

params = models.Net(features=8).init(jax.random.key(0), jnp.ones((1, 4)))
'''


def test_a_script_imports_the_module_beside_it_not_a_namesake_of_another_folder(tmp_path):
  """Issue 35: `import models` in beta/train.py is beta/models.py (a plain class with init/apply), not alpha's
  Linen Net that the run converted: no seam, so no TODO and no rewrite in beta; alpha's use still has its seam."""
  sources = {
      'alpha/models.py': 'from flax import nnx\n\n\nclass Net(nnx.Module):\n  def __init__(self, features, *, rngs):\n'
                         '    self.features = features\n',
      'beta/models.py': 'class Net:\n  def __init__(self, features=8):\n    self.features = features\n\n'
                        '  def init(self, key, x):\n    return {"w": x.sum()}\n',
      'alpha/train.py': TWO_FOLDERS_TRAIN,
      'beta/train.py': TWO_FOLDERS_TRAIN,
  }
  paths = {name: str(tmp_path / name) for name in sources}
  found = find_seams({paths[name]: text for name, text in sources.items()},
                     [str(tmp_path), str(tmp_path / 'alpha'), str(tmp_path / 'beta')])
  assert {(s.path, s.target_path) for s in found} == {(paths['alpha/train.py'], paths['alpha/models.py'])}


def test_a_class_names_its_own_files_namesake_not_one_of_another_folders_file_of_the_same_name(tmp_path):
  """flax's examples in one run: ogbg_molpcba/models.py's GraphNet (Linen) builds its own MLP, which stays Linen,
  while sst2/models.py's MLP converted. Both files are the module `models`: GraphNet's `MLP` is its own file's, not a
  seam on sst2's (which would keep sst2's MLP Linen for a use it never has)."""
  sources = {
      'graphs/models.py': 'import flax.linen as nn\n\n\nclass MLP(nn.Module):\n  @nn.compact\n'
                          '  def __call__(self, x):\n    return nn.Dense(2)(x)\n\n\nclass GraphNet(nn.Module):\n'
                          '  @nn.compact\n  def __call__(self, x):\n    return MLP()(x)\n',
      'text/models.py': 'from flax import nnx\n\n\nclass MLP(nnx.Module):\n  def __init__(self, *, rngs):\n'
                        '    self.linear = nnx.Linear(2, 2, rngs=rngs)\n',
  }
  paths = {name: str(tmp_path / name) for name in sources}
  found = find_seams({paths[name]: text for name, text in sources.items()},
                     [str(tmp_path), str(tmp_path / 'graphs'), str(tmp_path / 'text')])
  assert found == []
  nnx_graphs = sources['graphs/models.py'].replace('class MLP(nn.Module)', 'class MLP(nnx.Module)').replace(
      'import flax.linen as nn\n', 'import flax.linen as nn\nfrom flax import nnx\n')  # its own MLP converted
  found = find_seams({paths['graphs/models.py']: nnx_graphs, paths['text/models.py']: sources['text/models.py']},
                     [str(tmp_path), str(tmp_path / 'graphs'), str(tmp_path / 'text')])
  assert {(s.kind, s.target_path) for s in found} == {('linen-builds-nnx', paths['graphs/models.py'])}


def test_a_module_level_alias_of_an_nnx_class_used_by_a_linen_class_of_the_file_is_a_seam(tmp_path):
  """`Tower = CNN`, then a Linen class of the same file builds `Tower(...)`: the NNX class is built the Linen way,
  so the run keeps it Linen (before, the alias hid it and the program broke without a TODO)."""
  source = ('import flax.linen as nn\nfrom flax import nnx\n\n\nclass CNN(nnx.Module):\n  def __init__(self, *, rngs):\n'
            '    pass\n\n\nTower = CNN\n\n\nclass Head(nn.Module):\n  @nn.compact\n  def __call__(self, x):\n'
            '    return Tower()(x)\n')
  path = str(tmp_path / 'heads.py')
  found = find_seams({path: source}, [str(tmp_path)])
  assert [(s.kind, s.target_path, s.user) for s in found] == [('linen-builds-nnx', path, 'Head')]


def test_a_keyword_the_nnx_constructor_does_not_take_is_a_seam(tmp_path):
  """A field the converted class now takes at its call (`call_fields.py`), still given to its constructor by code
  outside the run's Linen classes, fails with a TypeError: a TODO there; the same call without it is no seam."""
  train = '''from flax import nnx

from pkg.layers import Block


def build(state):
  return Block(3, init_state=state, linear_in_features=4, rngs=nnx.Rngs(0))


def build_right():
  return Block(3, linear_in_features=4, rngs=nnx.Rngs(0))
'''
  found = _seams(tmp_path, train=train)
  assert [(s.path, s.line, s.kind) for s in found] == [('pkg/train.py', 7, seams.MISSING_ARGUMENTS)]
  assert 'whose constructor takes no init_state' in found[0].message
