"""L2N003's analysis on its own: the model sites a file holds and what their init calls give."""

import typing as tp

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper
from libcst.metadata import ParentNodeProvider
from libcst.metadata import PositionProvider
from libcst.metadata import QualifiedNameProvider
from libcst.metadata import ScopeProvider

from codemods.report import INPUT_DIMENSION
from codemods.report import ConstructorArgument
from codemods.report import ConvertedClass
from codemods.rules.l2n003.analyse import example_shape
from codemods.rules.l2n003.analyse import init_arguments
from codemods.rules.l2n003.analyse import model_sites
from codemods.rules.l2n003.analyse import size_arguments
from codemods.rules.l2n003.facts import LeftAsLinen
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.tree import Tree

MLP = ConvertedClass(1, 'MLP', 'MLP', (ConstructorArgument('din', INPUT_DIMENSION, 'x.shape[-1]', input='x'),), (),
                     call_arguments=('x',))


def _tree(source: str) -> tuple[cst.Module, Tree]:
  wrapper = MetadataWrapper(cst.parse_module(source))
  resolved = wrapper.resolve_many([ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider])

  def get_metadata(provider: type, node: cst.CSTNode, *default: tp.Any) -> tp.Any:
    value = resolved[provider].get(node, *default) if default else resolved[provider][node]
    return value() if callable(value) else value  # libcst computes qualified names lazily
  return wrapper.module, Tree(wrapper.module, get_metadata)


def test_a_site_pairs_the_construction_with_its_init():
  module, tree = _tree('model = MLP(256)\nx = jnp.ones((1, 784))\nvariables = model.init(key, x)\n'
                       "params = other.init(key)['params']\n")
  (site,) = model_sites(module, tree, {'MLP': MLP})
  assert (site.init.target, site.init.model, site.init.kind) == ('variables', 'model', 'variables')
  assert site.built.nnx_class == 'MLP' and site.built.arguments == ('256',)
  assert tree.code(site.construction) == 'model = MLP(256)'


def test_init_of_a_collection_and_a_layer_used_as_the_model():
  module, tree = _tree('import flax.linen as nn\nlayer = nn.Dense(10)\n'
                       "params = freeze(layer.init(key, x))['params']\n")
  (site,) = model_sites(module, tree, {})
  assert site.init.kind == 'collection:params'
  assert site.built.layer is not None and site.built.nnx_class == 'nnx.Linear'


def test_a_layer_with_star_arguments_is_left_as_linen():
  module, tree = _tree('import flax.linen as nn\nlayer = nn.Dense(*sizes)\nvariables = layer.init(key, x)\n')
  (site,) = model_sites(module, tree, {})
  assert isinstance(site.built, LeftAsLinen) and '*args' in site.built.reason


def test_init_arguments_give_the_rngs_and_the_sizes():
  module, tree = _tree("variables = model.init({'params': k1, 'dropout': k2}, jnp.ones((1, 784)))\n")
  call = module.body[0].body[0].value
  rngs, inputs = init_arguments(tree, 'model', MLP, call)
  assert rngs == 'nnx.Rngs(params=k1, dropout=k2)'
  assert size_arguments(tree, 'model', MLP, call, inputs) == ['din=784']
  assert example_shape(tree, inputs['x']) == '(1, 784)'


def test_init_with_method_is_not_converted():
  module, tree = _tree("variables = model.init(key, x, method='encode')\n")
  with pytest.raises(Skip, match='method='):
    init_arguments(tree, 'model', MLP, module.body[0].body[0].value)
