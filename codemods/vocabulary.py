"""The Linen (and JAX) names the codemod recognises, other than layers: the one place rules look them up.

Layer classes and what they become live in `nnx_bridge/layer_table.py`; everything else a rule matches by
qualified name (scope APIs, lifted transforms, ModuleDef factories, train/eval keywords, the functions of
training code) is here, as data. Names are qualified as libcst's QualifiedNameProvider gives them
(`flax.linen.scan`, with the submodule spellings flax re-exports). `tests/codemods/test_vocabulary.py` checks each
entry against the installed flax, so that a flax release that moves or drops a name fails there first.

This module imports only the layer table (no jax), so that `linen2nnx migrate` starts fast.
"""

from __future__ import annotations

import re

from nnx_bridge.layer_spec import Window
from nnx_bridge.layer_table import MODE_ARGUMENTS

# --- modules and their methods -------------------------------------------------------------------

MODULE_NAMES = frozenset({'flax.linen.Module', 'flax.linen.module.Module'})
COMPACT_NAMES = frozenset({'flax.linen.compact', 'flax.linen.module.compact'})
NOWRAP_NAMES = frozenset({'flax.linen.nowrap', 'flax.linen.module.nowrap'})
"""A method Linen does not wrap (no scope of its own): NNX wraps no method, so the decorator goes."""
MERGE_PARAM_NAMES = frozenset({'flax.linen.merge_param', 'flax.linen.module.merge_param'})
"""`merge_param(name, a, b)`: whichever of a field and a call argument is not None (an error when both or neither
are), a function of values alone that NNX code calls as it is; a train/eval switch merged with its field becomes the
field (`modes.merged_switches`)."""
SCOPE_APIS = frozenset({
    'param', 'variable', 'make_rng', 'sow', 'has_variable', 'is_initializing', 'is_mutable_collection',
    'put_variable', 'get_variable', 'has_rng', 'scope', 'variables', 'perturb', 'bind', 'apply', 'init',
    'init_with_output', 'lazy_init', 'path', 'clone', 'copy', 'tabulate', 'module_paths', 'unbind',
})
"""The `nn.Module` members that reach Linen's scope (variables, rngs, binding): code calling one on `self` is
Linen code."""
CONVERTED_APIS = frozenset({'param', 'variable', 'make_rng', 'sow', 'is_initializing', 'is_mutable_collection'})
"""The scope APIs L2N002 rewrites into NNX code (the others keep a class Linen)."""
STATE_APIS = frozenset({'param', 'variable', 'make_rng', 'sow', 'has_variable', 'put_variable', 'get_variable',
                        'variables', 'has_rng', 'scope', 'is_initializing', 'is_mutable_collection', 'perturb'})
"""The scope APIs that create or read a module's variables and rngs: a base class using one in setup/__call__
holds state (a subset of SCOPE_APIS)."""

# --- train/eval keywords -------------------------------------------------------------------------

MODE_PARAMS = {m.name: m.inverted for m in MODE_ARGUMENTS}
"""Linen's train/eval argument names -> whether True means eval mode (`deterministic`) rather than train."""
LAYER_MODE_KWARGS = frozenset(m.name for m in MODE_ARGUMENTS if m.name == m.nnx_attribute)
"""The train/eval keywords an NNX layer keeps as a constructor attribute of the same name."""
EVAL_VALUE = {m.name: not m.inverted for m in MODE_ARGUMENTS}
"""The value of each Linen train/eval argument that means eval mode (`training=False`, `deterministic=True`)."""
EVAL_ATTRIBUTES = ', '.join(f'{m.nnx_attribute}=True' for m in MODE_ARGUMENTS if m.name == m.nnx_attribute) \
    + ', raise_if_not_found=False'
"""The keyword arguments of `nnx.with_attributes` that set what `nnx.Module.eval()` sets."""

# --- lifted transforms and control flow ----------------------------------------------------------

SCAN_NAMES = frozenset({'flax.linen.scan', 'flax.linen.transforms.scan'})
VMAP_NAMES = frozenset({'flax.linen.vmap', 'flax.linen.transforms.vmap'})
REMAT_NAMES = frozenset({'flax.linen.remat', 'flax.linen.checkpoint', 'flax.linen.transforms.checkpoint',
                         'flax.linen.transforms.remat'})
JIT_NAMES = frozenset({'flax.linen.jit', 'flax.linen.transforms.jit'})
PARTITIONING_REMAT_NAMES = frozenset({'flax.linen.partitioning.remat'})  # its argnums do not count the module
BROADCAST_NAMES = frozenset({'flax.linen.broadcast', 'flax.core.broadcast', 'flax.core.axes_scan.broadcast'})
STACK_OPTIONS = {  # the options of a stacking nn.scan / nn.vmap that are converted, the size option first
    'scan': ('length', 'variable_axes', 'split_rngs', 'in_axes', 'out_axes', 'metadata_params'),
    'vmap': ('axis_size', 'variable_axes', 'split_rngs', 'in_axes', 'out_axes', 'metadata_params', 'axis_name'),
}
REMAT_OPTIONS = ('prevent_cse', 'policy', 'static_argnums')  # nnx.remat takes these as they are
WRAPPING = {  # a Linen transform of a class -> (its names, the NNX transform of the call, the options it takes as
    #           they are, Linen's child-name prefix, what to add to its argnums to count the module as the NNX
    #           transform does)
    'remat': (REMAT_NAMES, 'nnx.remat', REMAT_OPTIONS, 'Checkpoint', 0),
    'partitioning_remat': (PARTITIONING_REMAT_NAMES, 'nnx.remat', REMAT_OPTIONS, 'Core_remat_static', 1),
    'jit': (JIT_NAMES, 'nnx.jit', ('static_argnums', 'donate_argnums'), 'Jit', 0),
}
CONTROL_FLOW = {  # a Linen lifted control-flow function -> (its NNX counterpart, the position of the module argument)
    'flax.linen.cond': ('nnx.cond', 3),
    'flax.linen.switch': ('nnx.switch', 2),
    'flax.linen.while_loop': ('nnx.while_loop', 2),
}
WHILE_OPTIONS = ('carry_variables', 'broadcast_variables', 'split_rngs')  # NNX carries every Variable itself

# --- ModuleDefs and factories --------------------------------------------------------------------

PARTIAL_NAMES = frozenset({'functools.partial'})
TO_LINEN_NAMES = frozenset({'nnx_bridge.to_linen', 'nnx_bridge.nnx_in_linen.to_linen', 'flax.nnx.bridge.to_linen',
                            'flax.nnx.bridge.wrappers.to_linen'})
"""An NNX class wrapped as a Linen module: what a Linen parent builds where a migrated run bridged it."""
CALLABLE = re.compile(r'^(?:(?:typing|tp|collections\.abc)\.)?Callable\b')
"""A field annotation naming a callable (`act: Callable = nn.relu`)."""

# --- initializers (L2N001) ---------------------------------------------------------------------

LINEN_INITIALIZERS = 'flax.linen.initializers'
# The public names of flax.nnx.initializers (flax 0.12.8); tests/codemods/test_vocabulary.py checks each one.
NNX_INITIALIZERS = frozenset({
    'Initializer', 'constant', 'delta_orthogonal', 'glorot_normal', 'glorot_uniform',
    'he_normal', 'he_uniform', 'kaiming_normal', 'kaiming_uniform', 'lecun_normal',
    'lecun_uniform', 'normal', 'ones', 'ones_init', 'orthogonal', 'truncated_normal', 'uniform',
    'variance_scaling', 'xavier_normal', 'xavier_uniform', 'zeros', 'zeros_init',
})
# Initializers flax.linen re-exports at its top level.
LINEN_TOP_LEVEL_INITIALIZERS = frozenset({'zeros_init', 'ones_init'})


def nnx_initializer_target(qualified_name: str) -> str | None:
  """'flax.linen.initializers.zeros' -> 'initializers.zeros' (under `nnx.`); None for anything else."""
  if qualified_name == LINEN_INITIALIZERS:
    return 'initializers'
  if qualified_name.startswith(LINEN_INITIALIZERS + '.') and qualified_name.count('.') == 3:
    return 'initializers.' + qualified_name.rpartition('.')[2]
  if qualified_name.rpartition('.')[::2] in {('flax.linen', name) for name in LINEN_TOP_LEVEL_INITIALIZERS}:
    return 'initializers.' + qualified_name.rpartition('.')[2]
  return None


# --- functions -----------------------------------------------------------------------------------

NNX_TWINS = frozenset({
    'PARTITION_NAME', 'avg_pool', 'celu', 'elu', 'gelu', 'glu', 'hard_sigmoid', 'hard_silu', 'hard_swish',
    'hard_tanh', 'leaky_relu', 'log_sigmoid', 'log_softmax', 'logical_axis_rules', 'logsumexp', 'max_pool',
    'one_hot', 'pool', 'relu', 'relu6', 'selu', 'sigmoid', 'silu', 'soft_sign', 'softmax', 'softplus',
    'standardize', 'swish', 'tanh',
})
"""The non-class names flax.linen exports whose very object flax.nnx exports under the same name (`nn.relu` is
`nnx.relu`), as measured on the installed flax by tests/codemods/test_vocabulary.py (kept here so migrate needs no jax)."""
RNGS_ATTRIBUTES = frozenset({
    'ball', 'bernoulli', 'beta', 'binomial', 'bits', 'broadcast', 'categorical', 'cauchy', 'chisquare', 'choice',
    'delta_orthogonal', 'dirichlet', 'double_sided_maxwell', 'exponential', 'f', 'fork', 'gamma', 'generalized_normal',
    'geometric', 'glorot_normal', 'glorot_uniform', 'gumbel', 'he_normal', 'he_uniform', 'items', 'kaiming_normal',
    'kaiming_uniform', 'laplace', 'lecun_normal', 'lecun_uniform', 'loggamma', 'logistic', 'lognormal', 'maxwell',
    'multinomial', 'multivariate_normal', 'normal', 'orthogonal', 'pareto', 'permutation', 'poisson', 'rademacher',
    'randint', 'rayleigh', 'split', 't', 'triangular', 'truncated_normal', 'uniform', 'variance_scaling', 'wald',
    'weibull_min', 'xavier_normal', 'xavier_uniform',
})
"""The public attributes of nnx.Rngs (its samplers, `fork`, `split`, `items`): an rng stream of one of these names is
`rngs['gumbel']`, as `rngs.gumbel` is the sampler (measured by tests/codemods/test_vocabulary.py)."""
NNX_SAME_SIGNATURE = frozenset({'combine_masks', 'make_attention_mask', 'make_causal_mask'})
"""The non-class names flax.linen exports that flax.nnx exports too, as another function of the same signature that
computes the same (measured by tests/codemods/test_vocabulary.py): `nn.combine_masks` -> `nnx.combine_masks`."""
NNX_CALL_TWINS: dict[str, tuple[str, tuple[str, ...], dict[str, str]]] = {
    'with_partitioning': ('with_partitioning', ('fn', 'names', 'mesh'),
                          {'fn': 'initializer', 'names': 'sharding', 'mesh': 'mesh'}),
    'with_logical_partitioning': ('with_partitioning', ('fn', 'names', 'mesh'),
                                  {'fn': 'initializer', 'names': 'sharding', 'mesh': 'mesh', 'rules': 'sharding_rules'}),
}
"""flax.linen functions whose flax.nnx counterpart takes the same arguments under other keywords: Linen name -> (NNX
name, the Linen parameters both take in that order by position, Linen keyword -> NNX keyword). NNX has one sharding
annotation: it reads the names of `nnx.with_partitioning` through the logical axis rules in effect
(`nnx.logical_axis_rules`, the context Linen's `nn.logical_axis_rules` sets too, or its `sharding_rules`), the same
specs as Linen's where a rule maps every logical name (checked by tests/codemods/test_vocabulary.py); a name no rule
maps stays a mesh axis name in NNX, where Linen replicates its axis."""
LINEN_ARRAY_FUNCTIONS = frozenset({'flax.linen.attention.dot_product_attention_weights',
                                   'flax.linen.attention.dot_product_attention'})
"""flax.linen functions of arrays only (no Linen module or scope: they take their dropout key as an argument) with no
flax.nnx export of the same signature: NNX code calls them as they are (measured by tests/codemods/test_vocabulary.py)."""
LINEN_KEPT_FUNCTIONS = LINEN_ARRAY_FUNCTIONS | MERGE_PARAM_NAMES
"""The flax.linen functions a converted class calls as they are: no module, scope or rng of Linen in them."""
ELEMENTWISE = frozenset(
    f'{module}.{name}'
    for module in ('flax.linen', 'flax.nnx', 'jax.nn', 'jax.numpy')
    for name in ('relu', 'relu6', 'gelu', 'silu', 'swish', 'sigmoid', 'tanh', 'elu', 'selu', 'celu',
                 'leaky_relu', 'softplus', 'soft_sign', 'hard_tanh', 'log_sigmoid', 'softmax', 'log_softmax')
)
"""Functions that keep their input's shape (the size interpreter follows sizes through them)."""
ACTIVATION_TABLES = frozenset({'modeling_flax_utils.ACT2FN'})
"""Dicts of elementwise activation functions, by the end of their qualified name (transformers'
`from ...modeling_flax_utils import ACT2FN`: gelu, relu, silu, tanh, ... by name): `self.act = ACT2FN[name]` in
setup() keeps sizes through `self.act(x)`."""
POOLING = frozenset(f'{module}.{name}' for module, names in (
    ('flax.linen', ('avg_pool', 'max_pool', 'pool')), ('flax.linen.pooling', ('avg_pool', 'max_pool', 'min_pool', 'pool')),
    ('flax.nnx', ('avg_pool', 'max_pool', 'min_pool', 'pool'))) for name in names)
"""flax's pooling functions: windows over the axes between the batch and the last, which they keep (`nn.avg_pool(x,
(2, 2))` of an NHWC array keeps C), as tests/codemods/test_vocabulary.py measures on the installed flax."""
WINDOW_POOLING = frozenset(name for name in POOLING if not name.endswith('.pool'))
"""Those of POOLING called `f(inputs, window_shape, strides=None, padding='VALID')` (`pool` takes init and reduce_fn
first)."""
POOLING_WINDOW = Window('window_shape', default_padding='VALID')
"""How the WINDOW_POOLING functions size the axes they pool."""
REDUCTIONS = frozenset(f'jax.numpy.{name}' for name in (
    'mean', 'sum', 'max', 'min', 'prod', 'std', 'var', 'amax', 'amin', 'median', 'nanmean', 'nansum', 'nanmax', 'nanmin'))
"""jax.numpy reductions over `axis=`: they keep the last axis when every reduced axis is a negative literal other
than -1 (`jnp.mean(x, axis=(-3, -2))`); a positive axis could be the last one of an input of unknown rank."""
CONCATENATE = frozenset({'jax.numpy.concatenate'})
SAME_SHAPE = frozenset({'jax.numpy.asarray', 'jax.numpy.array', 'jax.lax.stop_gradient', 'jax.numpy.flip',
                        'jax.numpy.roll'})
"""Functions whose first argument's shape is their result's, whatever else they are given: casts (`jnp.asarray(inputs,
self.dtype)`; `x.astype(dtype)` too) and moves of elements along axes (`jnp.flip(x, axis=1)`, `jnp.roll(x, 1)`)."""
TILE = frozenset({'jax.numpy.tile'})  # keeps the last axis when its last repetition is a literal 1

# --- training code (L2N003) ----------------------------------------------------------------------

ARRAY_MAKERS = re.compile(r'^(jnp|jax\.numpy|np|numpy)\.(ones|zeros|empty)$')
GRADS = {'jax.grad': 'nnx.grad', 'grad': 'nnx.grad', 'jax.value_and_grad': 'nnx.value_and_grad',
         'value_and_grad': 'nnx.value_and_grad'}
JITS = ('jax.jit', 'jit')
TREE_MAPS = ('jax.tree.map', 'jax.tree_util.tree_map', 'jax.tree_map', 'tree_map')
FREEZERS = re.compile(r'^(flax\.core\.(frozen_dict\.)?)?(freeze|unfreeze)$')
REPLICATES = re.compile(r'^((flax\.)?jax_utils\.)?(replicate|unreplicate)$')
PMAPS = ('jax.pmap', 'pmap')
PMAP_OPTIONS = ('axis_name', 'in_axes', 'donate_argnums')
"""The `jax.pmap` options a converted step keeps (`donate_argnums` is dropped, reported)."""
TREE_READERS = ('jax.tree.leaves', 'jax.tree_util.tree_leaves', 'jax.tree_leaves', 'jax.tree.reduce',
                'jax.tree_util.tree_reduce', 'optax.global_norm')
"""Functions of a whole tree that do not depend on its paths: given the state, they get `nnx.state(model, ...)`."""
IN_PLACE_COLLECTIONS_EXCLUDED = ('params', 'intermediates')
"""`mutable=` collections whose NNX counterpart is not an in-place update of the model."""
