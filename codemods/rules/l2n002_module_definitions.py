"""L2N002: `flax.linen.Module` classes (setup style and `@nn.compact`) -> `nnx.Module`.

## What it does
For a module-level class whose only base is `flax.linen.Module` and whose body holds annotated
fields and methods, it writes `__init__(self, <fields>, *, <sizes>, rngs: nnx.Rngs)` that stores
each field, then moves the `setup()` body there and hoists every layer, `self.param` and
`self.variable` of the `@nn.compact` method (`__call__` or another one) into attributes
(`linear`, `linear1`, ..., its `name=`, or the variable's name). Layers come from the layer
table (`nnx_bridge.layer_table`): renamed kwargs, explicit Linen defaults, `rngs=rngs`.
`self.param(name, init, *args)` becomes `nnx.Param(init(rngs.params(), *args))` (read back as
`self.<name>[...]`); `self.variable(collection, name, init, *args)` becomes the collection's
NNX Variable type (flax's own, or a generated `nnx.Variable` subclass registered under the
collection's name) holding `init(*args)`; `self.make_rng('s')` draws from a stream forked from
`rngs` in `__init__`; `self.sow('collection', ...)` sows the collection's Variable type;
`if self.is_initializing():` blocks go and `if not self.is_initializing():` blocks stay
unconditional (NNX creates variables in `__init__`, never in a call).

Decode caches: the Linen pattern `flag = self.has_variable('cache', 'k')`, `k = self.variable(
'cache', 'k', init, *shape_args)`, ..., `if flag: <update>` becomes `nnx.Cache` attributes (None
in `__init__`) created by a new method `init_cache(input_shape, dtype=jnp.float32)` from shapes
derived in terms of the first call input's (`input_shape`); the flag becomes a check that it
ran and the update runs always. A class whose children hold decode caches (converted classes,
table layers with a `cache` entry in decode mode) gets an `init_cache` calling theirs.

NNX sizes taken from call inputs are derived from the code (a field, a config attribute, the
`features` of the layer before, a `concatenate` of known sizes, through calls of the class's
own methods, the carry of a scan over layers) or become keyword-only constructor arguments named
after their role, each reported with its source. Constructor arguments may read the input's
width (`nn.Dense(x.shape[-1])`, or a local `d = x.shape[-1]` / `n, _, d = x.shape`): they get
what the code says of that input where it is read. `__call__` arguments named like a train/eval switch (`training`,
`deterministic`, ...) that only feed `deterministic=` / `use_running_average=` are dropped:
NNX's `model.train()` / `model.eval()` set those. A class of the same file used as a child is
converted with it; a field typed `nn.Module` becomes an `nnx.Module` parameter. `nn.relu` and
the other functions NNX shares become `nnx.X`. A table wrapper (`nn.RNN`, the table's
`WRAPPERS`) around a table cell built in its constructor call becomes `nnx.RNN(<NNX cell>, ...)`,
the cell's sizes read off the wrapper's inputs. A layer whose row is not exact (GRUCell) is
converted with a TODO quoting the row's `inexact` sentence.

Scanned cells: `nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False},
in_axes=<int>, out_axes=<int>)(...)` over a class `Cell` of the same file (its `__call__(carry, x)`
returning `(carry, y)`), built in `setup()` or in the @nn.compact method (called where it is built,
or bound once to a local then called once as `cell(carry, x)` and through its methods), becomes
the converted `Cell` in `self.cell` (Linen's `ScanCell_0`), and its call `nnx.scan(lambda cell,
carry, x: cell(carry, x), in_axes=(None, nnx.Carry, <in>), out_axes=(nnx.Carry, <out>))(self.cell,
carry, x)`: the cell broadcast to every step, as its params are in Linen. The cell's carry has the
size of the carry it returns (the first of the returned pair), so a `concatenate([carry, x])` of it
and an input gets a size argument `<input>_features` for the input's last axis.

Rematerialised submodules: `nn.remat(Block, ...)(...)` / `nn.checkpoint(Block, ...)(...)` over a
class `Block` of the same file (options `prevent_cse=`, `policy=`, a literal `static_argnums=`),
built in `setup()` or in the @nn.compact method (called where built, or bound once to a local
then called once), becomes the converted `Block` in `self.block` (Linen's `CheckpointBlock_0`)
and its call `nnx.remat(lambda module, x: module(x), <options>)(self.block, x)`. Linen's
static_argnums count `self` as argument 0, as nnx.remat counts the module: the same numbers, less
the train/eval switches the call drops. `nn.jit(Block, static_argnums=, donate_argnums=)` likewise
becomes an `nnx.jit` around the call.

Stacked copies: scan over layers `nn.scan(Block or nn.remat(Block, ...), variable_axes={'params': 0,
...}, split_rngs={'params': True, ...}, length=n, in_axes=, out_axes=, metadata_params=)` and the
ensemble `nn.vmap(Block, ..., axis_size=n)` (also through a local `ScanBlock = nn.scan(...)`)
become `nnx.vmap(lambda rngs: Block(..., rngs=rngs))(rngs.split(n))` in __init__, the variables
stacked on axis 0 as Linen's are, and a call through nnx.scan (`in_axes=(0, nnx.Carry, ...)`) or
nnx.vmap (`in_axes=(0, ...)`), nnx.remat inside for a rematted block. `bool` fields named like a
train/eval switch (the guide's `Block.training`) that only feed train/eval arguments are dropped.

Control flow: `nn.cond` / `nn.switch` become `nnx.cond` / `nnx.switch` with the same arguments
(the module passed to each branch), `nn.while_loop(cond_fn, body_fn, self, init)` an nnx.while_loop
over `(self, init)`; branches must not use Linen scope APIs on their module.

Config-driven and shared code: `dense = functools.partial(nn.Dense, ...)` in the @nn.compact method
makes each `dense(...)` a construction with the partial's arguments first; a layer built under an
`if`/`else` whose test reads only fields and config exists in __init__ under the same test (None
otherwise); a layer bound to a local (`embed = nn.Embed(...)`) and used several times, methods
included (`embed.attend(h)`), is one attribute.

Module factories and tying (module_factories.py): a field the class calls as `self.conv(...)(x)` (flax's
ResNet `ModuleDef`s) stays a parameter holding an NNX factory, called in __init__ with the input size and
rngs as the NNX layer its constructions in this file pass (all the same kind: a table layer, a partial of
one, or a class of the file) takes them; the parent's `conv = partial(nn.Conv, ...)` moves into __init__ as
`partial(nnx.Conv, ...)` without train/eval kwargs. `Callable` fields called with one argument are
activations. `self.decoder.apply({'params': {'kernel': k}}, h)` of a bias-free Dense becomes `h @ k` (a layer
only run so is not created: Linen creates no params for it; one run tied under `if arg is not None:` and
directly in the else exists `if not tied_<attr>`, a keyword-only flag its parents set), and
`self.child.variables['params'][...]` the NNX Variable's value.

Loops (layer_loops.py): an @nn.compact `for` over `range(<fields, config, literals>)`, `enumerate(<field>)`
or a field, whose body is simple statements building table layers or classes of the file called at once,
makes one `nnx.List` per construction, built in __init__ by a comprehension over the same iterator, and the
loop indexes it (`self.linears[i](x)`, an index added by `enumerate` where the loop has none). Sizes come
from walking the body for the first iteration and for the later ones (`din if i == 0 else
self.features[i - 1]`); Linen names count across iterations (`Dense_{i}`) or follow `name=f'layer_{i}'`. A
setup() `self.layers = [<layer> for ... in <iterator>]` (or built by `layers.append(<layer>)` in a for loop)
becomes an nnx.List, sized through the `for layer in self.layers:` loops of the other methods.

Classes that stay Linen: a class given by name to a Linen function NNX has no counterpart of
(`nn.map_variables(Block, ...)`), with every class it builds, is kept Linen with a TODO; where a
converted class builds a kept or unconverted class, the construction is wrapped with
`nnx_bridge.from_linen(..., *<attr>_example_inputs, rngs=rngs)`, a new constructor argument.

## Left as a TODO (the class is not changed)
`self.has_variable` outside the decode-cache pattern, or a cache whose shape (or an input of a
child holding one) the code does not fix; `self.put_variable` and the other scope APIs; Linen names
without a known NNX counterpart (lifted transforms with options other than above, `nn.Bidirectional`,
unknown layers, module factories of unknown or mixed kinds, an `nn.RNN` cell built elsewhere or of a class of one's own);
constructions in loops other than above (later-iteration sizes the code cannot express, `if`s, `break`,
scope APIs or transforms in the body, loops over inputs), in conditionals on the call or elif chains, in
nested functions, or neither
called at once nor bound to a local only called; shapes that use
a local other than an input's last axis; kwargs NNX does not take; train/eval switches used
otherwise; other statements in the class or in `setup()`.
"""

from __future__ import annotations

import dataclasses
import keyword
import re
import typing as tp

import libcst as cst
import libcst.helpers
from libcst.metadata import PositionProvider
from libcst.metadata import QualifiedNameProvider
from libcst.metadata import QualifiedNameSource
from libcst.metadata import ScopeProvider

from codemods.example_sizes import ClassSizes
from codemods.report import EXAMPLE_INPUTS
from codemods.report import FIELD
from codemods.report import INPUT_DIMENSION
from codemods.report import INPUT_SIZE_SOURCES
from codemods.report import RNGS
from codemods.report import UNDETERMINED
from codemods.report import ChildName
from codemods.report import ConstructorArgument
from codemods.rule import CLASSES_KEY
from codemods.rule import MigrationRule
from codemods.rule import descendants
from codemods.rules.l2n001_convert_initializers import NNX_INITIALIZERS
from codemods.rules.l2n001_convert_initializers import nnx_initializer_target
from codemods.rules.layer_loops import Loops
from codemods.rules.module_factories import Factories
from codemods.rules.module_factories import tied_uses
from codemods.variable_types import flax_variable_type
from codemods.vocabulary import BROADCAST_NAMES
from codemods.vocabulary import COMPACT_NAMES
from codemods.vocabulary import CONCATENATE
from codemods.vocabulary import CONTROL_FLOW
from codemods.vocabulary import CONVERTED_APIS
from codemods.vocabulary import ELEMENTWISE
from codemods.vocabulary import JIT_NAMES
from codemods.vocabulary import LAYER_MODE_KWARGS
from codemods.vocabulary import MODE_PARAMS
from codemods.vocabulary import MODULE_NAMES
from codemods.vocabulary import NNX_TWINS
from codemods.vocabulary import PARTIAL_NAMES
from codemods.vocabulary import REMAT_NAMES
from codemods.vocabulary import SCAN_NAMES
from codemods.vocabulary import SCOPE_APIS
from codemods.vocabulary import STACK_OPTIONS
from codemods.vocabulary import TILE
from codemods.vocabulary import VMAP_NAMES
from codemods.vocabulary import WHILE_OPTIONS
from codemods.vocabulary import WRAPPING
from nnx_bridge.layer_table import InputDim
from nnx_bridge.layer_table import InputDimsAt
from nnx_bridge.layer_table import SAME_AS_INPUT
from nnx_bridge.layer_table import WRAPPERS
from nnx_bridge.layer_table import LayerSpec
from nnx_bridge.layer_table import WrapperSpec
from nnx_bridge.layer_table import find_layer
from nnx_bridge.layer_table import find_wrapper
from nnx_bridge.layer_table import linen_fields
from nnx_bridge.layer_table import nnx_arguments

HAS_VARIABLE_HINT = (' (a decode cache or a lazily created variable: in NNX, create it in an explicit '
                     'cache-initialisation method)')
SCAN_PATTERN = ("nn.scan(<a cell class of this file>, variable_broadcast='params', split_rngs={'params': False}, "
                'in_axes=<int>, out_axes=<int>)')

Dim = tuple[str, tp.Any] | None
"""A last-axis size: ('known', code valid in __init__), ('input', i) (the class's call argument i), or None."""

Shape = tuple[str, ...] | None
"""A whole shape as the parts of a tuple display valid in init_cache: ('*input_shape[:-1]', 'self.features'),
in terms of `input_shape`, the shape of the first call argument; None when the code does not fix it."""

INPUT_SHAPE = ('*input_shape',)
INIT_CACHE = 'init_cache(input_shape, dtype=jnp.float32)'
"""The method every converted class holding a decode cache gets; input_shape is the shape of its first
`__call__` argument at full length (what Linen's init saw), dtype the caches' (as the layers compute)."""
ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)


class _Unsupported(Exception):
  """A construct that keeps the class from being converted."""

  def __init__(self, node: cst.CSTNode, message: str) -> None:
    super().__init__(message)
    self.node, self.message = node, message


@dataclasses.dataclass(frozen=True)
class _Stacked:
  """An `nn.scan` over layers or an `nn.vmap` ensemble (`variable_axes={'params': 0}`): copies of a class whose
  variables are stacked along axis 0, created by nnx.vmap and run by nnx.scan / nnx.vmap."""

  transform: str  # 'scan' or 'vmap'
  length: str  # the number of copies, as code valid in __init__
  in_axes: tuple[str, ...]  # of each call argument (for scan: after the carry): '0', or 'None' (broadcast)
  out_axes: str  # of the output (for scan: of the second returned value)
  remat: str | None  # the nnx.remat options of an nn.remat inside ('' for none); None: no remat
  metadata: str | None  # transform_metadata code (Linen's metadata_params)
  axis_name: str | None  # nn.vmap's axis_name, as code
  split: tuple[str, ...]  # the rng streams Linen splits per layer (the others: the same key in every layer)


@dataclasses.dataclass
class _Child:
  """One submodule of the converted class."""

  attr: str
  linen_name: str
  ctor: cst.Call
  spec: LayerSpec | None
  sibling: _Plan | None
  kwargs: dict[str, cst.BaseExpression]
  sizes: dict[str, str] = dataclasses.field(default_factory=dict)
  done: bool = False
  text: str = ''
  hoisted: bool = False  # built inline in the @nn.compact method, so __init__ gets a new line
  api: str | None = None  # 'param' / 'variable' for a variable; None for a submodule
  collection: str = ''  # a variable's Linen collection
  mode_defaults: dict[str, bool] = dataclasses.field(default_factory=dict)  # deterministic=... from a switch default
  var_type: str = ''  # the NNX Variable type of a variable
  shape_refs: dict[cst.Subscript, str] = dataclasses.field(default_factory=dict)  # `x.shape[-1]` -> x
  size_codes: dict[cst.CSTNode, str] = dataclasses.field(default_factory=dict)  # ... -> code in __init__
  ref_dims: dict[cst.CSTNode, tp.Any] = dataclasses.field(default_factory=dict)  # ... -> what the code said of it
  cache: bool = False  # a decode-cache variable: None in __init__, created by init_cache
  cache_text: str = ''  # its creation in init_cache
  wrapper: WrapperSpec | None = None  # a table wrapper (nn.RNN) around `cell`
  cell: _Child | None = None  # the table layer the wrapper runs, built in its constructor call
  scan: tuple[int, int] | None = None  # (in_axes, out_axes) of an nn.scan over a cell class of the file
  remat: tuple[str, str] | None = None  # (`nnx.remat` / `nnx.jit`, its options) of nn.remat / nn.jit over a class
  stacked: _Stacked | None = None  # an nn.scan over layers / nn.vmap ensemble of a class of the file
  bridged: str = ''  # why a Linen construction stays Linen, wrapped by nnx_bridge.from_linen; '' when converted
  condition: str | None = None  # built only when this holds (code for __init__), else the attribute is None

  @property
  def holds_cache(self) -> bool:
    """A submodule with a decode cache: a converted class with init_cache, or a table layer in decode mode."""
    if self.sibling is not None:
      return self.sibling.cache_input is not None
    if self.spec is None or self.spec.cache is None or self.spec.cache.switch not in self.kwargs:
      return False
    switch = self.kwargs[self.spec.cache.switch]
    return not (isinstance(switch, cst.Name) and switch.value == 'False')


@dataclasses.dataclass
class _Plan:
  """What the class becomes."""

  name: str
  params: list[str]
  field_names: list[str]
  call_params: list[str]
  compact: bool
  linen_fields: list[str] = dataclasses.field(default_factory=list)  # all Linen fields, mode fields included
  mode_fields: dict[str, bool] = dataclasses.field(default_factory=dict)  # `training: bool` field -> inverted
  children: list[_Child] = dataclasses.field(default_factory=list)
  size_params: list[tuple[str, Dim]] = dataclasses.field(default_factory=list)
  output: Dim = None  # the last-axis size `__call__` returns, when the code determines it
  carry_output: Dim = None  # for a class the file scans: the last-axis size of the carry `__call__` returns
  size_arguments: list[ConstructorArgument] = dataclasses.field(default_factory=list)
  mode_params: list[tuple[int, str, bool]] = dataclasses.field(default_factory=list)
  linen_nodes: list[cst.CSTNode] = dataclasses.field(default_factory=list)
  streams: dict[str, str] = dataclasses.field(default_factory=dict)  # rng stream -> attribute
  collections: list[str] = dataclasses.field(default_factory=list)  # that need a generated Variable type
  output_shape: Shape = None  # the whole shape `__call__` returns, in terms of its first input's (`input_shape`)
  cache_lines: list[str] = dataclasses.field(default_factory=list)  # the body of init_cache; empty: none
  cache_input: str | None = None  # the `__call__` argument whose shape init_cache takes
  example_params: list[str] = dataclasses.field(default_factory=list)  # example inputs of bridged Linen children
  base: str = 'nnx.Module'  # the NNX base class: a project base class of the run keeps its name
  flags: list[str] = dataclasses.field(default_factory=list)  # keyword-only `bool = False` arguments (tied layers)
  helpers_only: bool = False  # a base class holding only helpers: no __init__ of its own


def _nnx_counterpart(qualified: str) -> str | None:
  """'nnx.initializers.zeros' / 'nnx.relu': the flax.nnx name of the same Linen object, if any."""
  initializer = nnx_initializer_target(qualified)
  if initializer is not None:
    return f'nnx.{initializer}' if initializer.rpartition('.')[2] in NNX_INITIALIZERS | {'initializers'} else None
  name = qualified.rpartition('.')[2]
  return f'nnx.{name}' if name in NNX_TWINS else None


def _draws_rngs(plan: _Plan) -> bool:
  """Whether a converted class draws random numbers in its call: a layer the table says draws dropout keys,
  make_rng, or a child that does."""
  return bool(plan.streams) or any(
      c.spec is not None and c.spec.draws_dropout is not None
      and (c.spec.draws_dropout == 'always' or c.spec.draws_dropout in c.kwargs)
      or c.sibling is not None and _draws_rngs(c.sibling) for c in plan.children)


def _init_params(plan: _Plan) -> list[str]:
  """The NNX `__init__` parameters after self: the fields, then keyword-only sizes, example inputs and rngs."""
  return [*plan.params, '*', *(f'{p}: int' for p, _ in plan.size_params),
          *(f'{p}: bool = False' for p in plan.flags), *(f'{p}: tuple' for p in plan.example_params), 'rngs: nnx.Rngs']


def _snake(name: str) -> str:
  return re.sub(r'(?<=[a-z0-9])(?=[A-Z])', '_', name).lower()


class ConvertModuleDefinitionsRule(MigrationRule):
  """Converts Linen module classes built from table layers and scope variables into NNX modules."""

  CODE = 'L2N002'
  REQUIRES = ('Module',)
  DESCRIPTION = 'nn.Module classes (setup or @nn.compact) -> nnx.Module with __init__(..., rngs).'
  METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider)

  def __init__(self, context: cst.codemod.CodemodContext) -> None:
    super().__init__(context)
    self._plans: dict[str, _Plan] = {}
    self._linen_classes: set[str] = set()
    self._global_names: set[str] = set()
    self._class_plans: dict[cst.ClassDef, _Plan] = {}
    self._calls: dict[cst.Call, tuple[str | None, set[int]]] = {}
    self._exprs: dict[cst.CSTNode, str] = {}  # original node -> the code replacing it
    self._aliases: dict[cst.Name, str] = {}  # `cfg` -> `self.config` in code moved to __init__ only
    self._ifs: dict[cst.If, bool] = {}  # `if [not] self.is_initializing():` -> whether its body stays
    self._methods: dict[cst.FunctionDef, set[str]] = {}
    self._variable_classes: dict[str, str] = {}  # collection -> the Variable type generated for it
    self._pending: list[tuple[cst.CSTNode, str]] = []
    self._switches: dict[str, bool] = {}
    self._field_switches: dict[str, bool] = {}  # the class's train/eval fields (`training: bool`) -> inverted
    self._traced: ClassSizes = {}  # what the example trace says of the class's layer sizes (`--examples`)
    self._traced_codes: set[str] = set()  # the class's sizes the traces gave (and those the code derives from them)
    self._mode_uses: set[cst.Name] = set()
    self._switch_defaults: dict[str, bool] = {}  # __call__ switches with a literal default
    self._branches: set[cst.If] = set()  # conditionals of plain code in @nn.compact bodies
    self._statements: dict[cst.CSTNode, str] = {}  # original statement -> the code replacing it
    self._cache_flags: dict[cst.Call, str] = {}  # `flag = self.has_variable('cache', ...)` -> flag
    self._scans: dict[cst.Call, tuple[int, int]] = {}  # `nn.scan(Cell, ...)(...)` -> (in_axes, out_axes)
    self._scan_calls: dict[cst.Call, _Child] = {}  # a call of a scanned cell -> the child, run by nnx.scan
    self._scan_names: dict[cst.Name, _Child] = {}  # `rnn` in `rnn.initial_state(...)` -> the child
    self._removed: set[cst.CSTNode] = set()  # statements that go (`rnn = nn.scan(...)(...)`, now in __init__)
    self._scanned_cells: set[str] = set()  # classes of the file some nn.scan(<class>, ...) runs
    self._remats: dict[cst.Call, tuple[str, str]] = {}  # `nn.remat(Block, ...)(...)` -> (`nnx.remat`, its options)
    self._remat_calls: dict[cst.Call, _Child] = {}  # a call of a rematted submodule -> the child, run by nnx.remat
    self._stacks: dict[cst.Call, _Stacked] = {}  # `nn.scan(Block, variable_axes=...)(...)` / nn.vmap -> its options
    self._stack_calls: dict[cst.Call, _Child] = {}  # a call of stacked copies -> the child, run by nnx.scan / nnx.vmap
    self._while_loops: set[cst.Call] = set()  # `nn.while_loop(...)` calls, rewritten around (self, init)
    self._lifted: set[cst.CSTNode] = set()  # `ScanBlock = nn.scan(...)`, `conv = partial(nn.Conv, ...)` values: gone
    self._partials: dict[cst.Call, cst.Call] = {}  # `conv(...)` -> the `partial(nn.Conv, ...)` it calls
    self._conditions: dict[cst.Call, str] = {}  # a construction under `if <field test>:` -> when it exists
    self._extra_calls: dict[cst.Call, cst.Call] = {}  # a later call of a submodule bound to a local -> its ctor
    self._kept_linen: dict[str, str] = {}  # classes that stay Linen because Linen-only code uses them -> why
    self._class_defs: dict[str, cst.ClassDef] = {}  # the file's top-level classes by name
    self._factories = Factories(self, _Unsupported)  # ModuleDef / partial factory fields (module_factories.py)
    self._loops = Loops(_Unsupported)  # layers built in for loops -> nnx.List attributes (layer_loops.py)

  # --- traversal -------------------------------------------------------------------------------

  def visit_Module(self, node: cst.Module) -> None:
    self._linen_classes = {
        s.name.value for s in node.body if isinstance(s, cst.ClassDef) and self._is_linen_class(s)
    }
    self._scanned_cells = {
        target.value for sub in descendants(node)
        if isinstance(sub, cst.Call) and sub.args and self._has_name(sub.func, SCAN_NAMES)
        and isinstance(target := self._unremat(sub.args[0].value), cst.Name) and target.value in self._linen_classes
    }
    scope = self.get_metadata(ScopeProvider, node, None)
    self._global_names = {a.name for a in scope.assignments} if scope is not None else set()
    self._class_defs = {s.name.value: s for s in node.body if isinstance(s, cst.ClassDef)}
    self._kept_linen = self._linen_only_uses(node)
    self._factories.scan(node)

  def _linen_only_uses(self, node: cst.Module) -> dict[str, str]:
    """Classes of the file that Linen-only code uses (`nn.map_variables(Block, ...)`, a Linen function NNX has no
    counterpart of, given the class itself), and the classes those use: they stay Linen, so that code keeps
    running on Linen modules; a converted class building one wraps it with nnx_bridge.from_linen."""
    converted = SCAN_NAMES | REMAT_NAMES | JIT_NAMES | VMAP_NAMES | set(CONTROL_FLOW)
    kept: dict[str, str] = {}
    for call in descendants(node):
      if not (isinstance(call, cst.Call) and isinstance(call.func, (cst.Name, cst.Attribute))) \
          or not self._is_linen_name(call.func) or self._has_name(call.func, converted):
        continue
      for arg in call.args:
        if arg.keyword is None and isinstance(arg.value, cst.Name) and arg.value.value in self._linen_classes:
          kept.setdefault(arg.value.value, f'{self.module.code_for_node(call.func)} has no NNX counterpart')
    pending = list(kept)
    while pending:  # what a kept class builds stays Linen with it
      user = pending.pop()
      for sub in descendants(self._class_defs[user]):
        if isinstance(sub, cst.Name) and sub.value in self._linen_classes and sub.value not in kept:
          kept[sub.value] = f'the Linen class {user}, kept as Linen, uses it'
          pending.append(sub.value)
    return kept

  def visit_ClassDef(self, node: cst.ClassDef) -> None:
    if node.name.value not in self._linen_classes or not isinstance(self._parent(node), cst.Module):
      return
    if node.name.value in self._kept_linen:
      self.report_todo(node, f'class {node.name.value} kept as Linen: {self._kept_linen[node.name.value]}; a converted '
                             'class building it wraps it with nnx_bridge.from_linen')
      return
    saved = (dict(self._calls), dict(self._exprs), dict(self._ifs), dict(self._methods), dict(self._variable_classes),
             dict(self._statements), dict(self._scan_calls), dict(self._scan_names), set(self._removed),
             dict(self._remat_calls), dict(self._stack_calls), set(self._while_loops))
    self._pending = []
    try:
      plan = self._plan(node)
    except _Unsupported as error:
      (self._calls, self._exprs, self._ifs, self._methods, self._variable_classes, self._statements,
       self._scan_calls, self._scan_names, self._removed, self._remat_calls, self._stack_calls, self._while_loops) = saved
      self.report_todo(error.node, f'class {node.name.value} left as Linen: {error.message}')
      return
    self._plans[node.name.value] = self._class_plans[node] = plan
    self.add_needed_import('flax', 'nnx')
    if plan.cache_lines and not self._jnp_bound(node):
      self.add_needed_import('jax.numpy', asname='jnp')
    if plan.example_params:
      self.add_needed_import('nnx_bridge')
    for used in plan.linen_nodes:
      self.remove_import_of(used)
    self._report(node, plan)
    for where, message in self._pending:
      self.report_change(where, message)
    for child in plan.children:
      if child.bridged:
        self.report_todo(child.ctor, f'self.{child.attr}: {_linen_class(child)} stays Linen ({child.bridged}), wrapped '
                                     f'with nnx_bridge.from_linen; pass {child.attr}_example_inputs, a tuple of example '
                                     'inputs of its call (arrays or jax.ShapeDtypeStruct)')
      layer = child.cell or child
      if layer.spec is not None and not layer.spec.exact:
        at = f'self.{child.attr}.{child.wrapper.cell_attribute}' if child.cell else f'self.{child.attr}'
        self.report_todo(layer.ctor, f'{at}: {layer.spec.nnx} does not compute what {layer.spec.linen} does with '
                                     f'trained weights: {layer.spec.inexact or layer.spec.note}')

  def on_leave(self, original_node: cst.CSTNode, updated_node: tp.Any) -> tp.Any:
    updated_node = super().on_leave(original_node, updated_node)
    if original_node in self._removed:
      return cst.RemoveFromParent()
    if original_node in self._scan_names:
      return cst.parse_expression(f'self.{self._scan_names[original_node].attr}')
    if original_node in self._exprs:
      return cst.parse_expression(self._exprs[original_node])
    if original_node in self._ifs:
      return cst.FlattenSentinel(updated_node.body.body) if self._ifs[original_node] else cst.RemoveFromParent()
    if original_node in self._statements:
      return cst.parse_statement(self._statements[original_node]).with_changes(leading_lines=updated_node.leading_lines)
    return updated_node

  def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
    if original_node in self._scan_calls:  # `cell(carry, x)` -> nnx.scan over the cell, broadcast to every step
      child = self._scan_calls[original_node]
      in_axis, out_axis = child.scan
      args = ', '.join(cst.Module([]).code_for_node(a.value) for a in updated_node.args)
      return cst.parse_expression(
          f'nnx.scan(lambda cell, carry, x: cell(carry, x), in_axes=(None, nnx.Carry, {in_axis}), '
          f'out_axes=(nnx.Carry, {out_axis}))(self.{child.attr}, {args})')
    dropped = self._calls.get(original_node, (None, set()))[1]
    if original_node in self._stack_calls:  # `blocks(x, None)` -> nnx.scan / nnx.vmap over the stacked copies
      child = self._stack_calls[original_node]
      stacked = child.stacked
      values = [cst.Module([]).code_for_node(a.value) for i, a in enumerate(updated_node.args) if i not in dropped]
      scan = stacked.transform == 'scan'
      count = len(values) - scan
      xs = ['x'] if count == 1 else [f'x{i}' for i in range(1, count + 1)]
      params = ', '.join(['carry', *xs] if scan else xs)
      body = f'lambda layer, {params}: layer({params})'
      if stacked.remat is not None:
        body = f'nnx.remat({body}{", " if stacked.remat else ""}{stacked.remat})'
      options = [f'in_axes=({", ".join(["0", *(["nnx.Carry"] if scan else []), *stacked.in_axes])})',
                 f'out_axes=(nnx.Carry, {stacked.out_axes})' if scan else f'out_axes={stacked.out_axes}',
                 *([f'transform_metadata={stacked.metadata}'] if stacked.metadata else []),
                 *([f'axis_name={stacked.axis_name}'] if stacked.axis_name else [])]
      return cst.parse_expression(
          f'nnx.{stacked.transform}({body}, {", ".join(options)})(self.{child.attr}, {", ".join(values)})')
    if original_node in self._remat_calls:  # `block(x)` -> nnx.remat over a lambda calling the submodule
      child = self._remat_calls[original_node]
      kept = [a for i, a in enumerate(original_node.args) if i not in dropped]
      values = [cst.Module([]).code_for_node(a.value) for i, a in enumerate(updated_node.args) if i not in dropped]
      names = [a.value.value if isinstance(a.value, cst.Name) and not keyword.iskeyword(a.value.value) else ''
               for a in kept]
      if all(names) and len(set(names)) == len(names) and 'module' not in names:
        params = call = ', '.join(names)
      else:
        params = call = 'x' if len(values) == 1 else ', '.join(f'x{i}' for i in range(1, len(values) + 1))
      transform, options = child.remat[0], f', {child.remat[1]}' if child.remat[1] else ''
      return cst.parse_expression(
          f"{transform}(lambda module, {params}: module({call}){options})(self.{child.attr}, {', '.join(values)})")
    if original_node in self._while_loops:  # the module travels in the loop state, beside the carry
      cond, body, _, init = (cst.Module([]).code_for_node(a.value) for a in updated_node.args if a.keyword is None)
      cond, body = (f if isinstance(a.value, cst.Name) else f'({f})' for f, a in zip((cond, body), updated_node.args))
      return cst.parse_expression(
          f'nnx.while_loop(lambda state: {cond}(*state), lambda state: (state[0], {body}(*state)), (self, {init}))[1]')
    if original_node not in self._calls:
      return updated_node
    attr, dropped = self._calls[original_node]
    args = [a for i, a in enumerate(updated_node.args) if i not in dropped]
    if args:
      args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    func = cst.parse_expression(f'self.{attr}') if attr else updated_node.func
    return updated_node.with_changes(func=func, args=args)

  def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
    if original_node not in self._methods:
      return updated_node
    dropped = self._methods[original_node]
    params = [p for p in updated_node.params.params if p.name.value not in dropped]
    if params:
      params[-1] = params[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    body = updated_node.body
    if body.body and isinstance(body, cst.IndentedBlock) and body.body[0].leading_lines \
        and all(line.comment is None for line in body.body[0].leading_lines):  # the statement above it went
      first = body.body[0].with_changes(leading_lines=[])
      updated_node = updated_node.with_changes(body=body.with_changes(body=[first, *body.body[1:]]))
    decorators = [
        new for old, new in zip(original_node.decorators, updated_node.decorators)
        if not self._has_name(old.decorator, COMPACT_NAMES)
    ]
    return updated_node.with_changes(params=updated_node.params.with_changes(params=params), decorators=decorators)

  def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
    plan = self._class_plans.get(original_node)
    if plan is None:
      return updated_node
    body: list[cst.BaseStatement] = []
    init_index = None
    setup_body: list[cst.BaseStatement] = []
    leading: tp.Sequence[cst.EmptyLine] = ()
    for statement in updated_node.body.body:
      if _field_name(statement) is not None:
        if init_index is None:  # __init__ takes the first field's place, and its blank lines
          init_index, leading = len(body), statement.leading_lines
      elif isinstance(statement, cst.FunctionDef) and statement.name.value == 'setup':
        setup_body = list(statement.body.body)
      else:
        body.append(statement)
    if plan.helpers_only:
      return updated_node.with_changes(bases=[cst.Arg(cst.parse_expression('nnx.Module'))])
    init = self._init(plan, setup_body).with_changes(leading_lines=leading)
    if init_index is None and body and _is_docstring(body[0]):
      init_index, init = 1, init.with_changes(leading_lines=[cst.EmptyLine()])
    init_index = init_index or 0
    body.insert(init_index, init)
    if plan.cache_lines:
      init_index += 1
      body.insert(init_index, self._init_cache(plan).with_changes(leading_lines=[cst.EmptyLine(indent=False)]))
    if init_index + 1 < len(body) and not body[init_index + 1].leading_lines:  # a blank line after __init__
      body[init_index + 1] = body[init_index + 1].with_changes(leading_lines=[cst.EmptyLine()])
    return updated_node.with_changes(
        bases=[cst.Arg(cst.parse_expression(plan.base))], body=updated_node.body.with_changes(body=body)
    )

  def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
    """Puts each generated Variable type just above the first class that uses it."""
    for name, supplier in self._factories.unconverted_suppliers():
      self.report_todo(self._class_defs[supplier], f'{supplier} stays Linen but passes layer factories to {name}, '
                                                  'converted to NNX: pass NNX factories (partial(nnx.Conv, ...))')
    body: list[cst.CSTNode] = []
    done: set[str] = set()
    for old, new in zip(original_node.body, updated_node.body):
      plan = self._class_plans.get(old)
      needed = [c for c in (plan.collections if plan else ()) if c not in done]
      if needed:
        blank = 0
        while blank < len(new.leading_lines) and new.leading_lines[blank].comment is None:
          blank += 1
        for i, collection in enumerate(needed):
          spacing = new.leading_lines[:blank] if i == 0 else [cst.EmptyLine(), cst.EmptyLine()]
          body.append(self._variable_class(collection).with_changes(leading_lines=spacing))
        new = new.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *new.leading_lines[blank:]])
        done.update(needed)
      body.append(new)
    return updated_node.with_changes(body=body) if done else updated_node

  # --- planning --------------------------------------------------------------------------------

  def _plan(self, node: cst.ClassDef) -> _Plan:
    if node.decorators or node.keywords or len(node.bases) != 1:
      raise _Unsupported(node, 'class decorators, keywords or several bases')
    base = self._project_base(node)
    if base is not None and base not in self.hierarchy.plain_bases:
      where = 'this file' if base.rpartition('.')[0] == self.hierarchy.module else 'another file'
      raise _Unsupported(node, f'it inherits fields or submodules from {base} ({where}), which is not converted with it')
    if not self.nnx_is_free(node):
      raise _Unsupported(node, 'the name nnx is bound to something else here')
    if f'{self.hierarchy.module}.{node.name.value}' in self.hierarchy.plain_bases:
      return self._plain_base_plan(node)
    fields, methods = [], {}
    for statement in node.body.body:
      if _field_name(statement) is not None:
        fields.append(statement)
      elif isinstance(statement, cst.FunctionDef):
        methods[statement.name.value] = statement
      elif not _is_docstring(statement):
        raise _Unsupported(statement, 'only annotated fields and methods are converted')
    field_names = [_field_name(f) for f in fields]
    for field, name in zip(fields, field_names):
      value = field.body[0].value
      if name in ('name', 'parent', 'rngs') or (value is not None and _has_call(value)):
        raise _Unsupported(field, f'field {name} (a reserved name or a computed default)')
    mode_fields = {name: MODE_PARAMS[name] for field, name in zip(fields, field_names)
                   if name in MODE_PARAMS and field.body[0].value is None
                   and self.module.code_for_node(field.body[0].annotation.annotation) == 'bool'}
    linen_field_names = field_names
    fields = [f for f, name in zip(fields, field_names) if name not in mode_fields]
    field_names = [name for name in field_names if name not in mode_fields]
    for sub in descendants(node):  # self.has_variable: a decode-cache pattern of the @nn.compact method, or a TODO
      if isinstance(sub, cst.Attribute) and _is_self_attr(sub) and sub.attr.value in SCOPE_APIS - CONVERTED_APIS - {'has_variable'}:
        raise _Unsupported(sub, f'self.{sub.attr.value} has no automatic NNX conversion')
    setup, call = methods.get('setup'), methods.get('__call__')
    compact = [m for m in methods.values() if any(self._has_name(d.decorator, COMPACT_NAMES) for d in m.decorators)]
    if len(compact) > 1:
      raise _Unsupported(compact[1], 'several @nn.compact methods')
    method = compact[0] if compact else None
    if call is None:
      raise _Unsupported(node, 'no __call__ to convert')
    if setup is not None and (len(setup.params.params) != 1 or setup.decorators):
      raise _Unsupported(setup, 'setup() with arguments or decorators')
    mode = self._mode_params(call)
    if method is not None and method is not call and any(p.name.value in MODE_PARAMS for p in method.params.params):
      raise _Unsupported(method, 'train/eval arguments of an @nn.compact method other than __call__')
    params = [self.module.code_for_node(f.body[0]).strip() for f in fields]
    call_params = [p.name.value for p in call.params.params[1:]]
    plan = _Plan(node.name.value, params, field_names, call_params, method is not None, linen_field_names, mode_fields)
    if base is not None:  # a subclass of a project base class keeps it (converted in its own file)
      plan.base = self.module.code_for_node(node.bases[0].value)
    self._switches = {name: MODE_PARAMS[name] for name in mode.values()}
    self._field_switches = mode_fields
    self._traced = self.options.example_sizes.of_class(self.context.filename, node.name.value)
    self._traced_codes = set()
    self._mode_uses = set()
    taken = set(field_names) | set(methods) | {'rngs'}
    counts: dict[str, int] = {}
    self._factories.prepare(node.name.value, method)
    if setup is not None:
      self._plan_setup(plan, setup, counts)
    inline = self._plan_compact(plan, method, counts) if method is not None else {}
    self._name_children(plan.children, taken)
    for child in plan.children:
      if child.condition is not None:
        named = any(a.keyword is not None and a.keyword.value == 'name' for a in child.ctor.args)
        shift = '' if named else (f'; when it is not, the auto-named layers created after it shift down (the next '
                                  f'of its class is then {child.linen_name}): name= fixes the names')
        self._pending.append((child.ctor, f'self.{child.attr} is created only when {child.condition} (else None), '
                                          f'as Linen creates it only then{shift}'))
    plan.collections = [c.collection for c in plan.children if c.var_type == self._variable_classes.get(c.collection)]
    self._plan_scope_calls(node, plan, setup, taken | {c.attr for c in plan.children})
    calls = self._child_calls(plan, methods, setup, inline)
    self._loops.after_calls(self, plan, calls)
    marks = (len(plan.size_params), len(plan.size_arguments), len(self._pending))
    scanned = plan.name in self._scanned_cells  # first what the code says, then with the carry's size and traces
    traced, self._traced = self._traced, ({} if scanned else self._traced)
    carry = self._derive(plan, methods, call, calls)
    self._traced = traced
    if scanned and plan.size_params[marks[0]:]:  # a scanned cell: again, its carry's size known
      del plan.size_params[marks[0]:], plan.size_arguments[marks[1]:], self._pending[marks[2]:]
      for child in plan.children:
        child.done, child.sizes, child.size_codes, child.ref_dims = False, {}, {}, {}
      self._derive(plan, methods, call, calls, carry)
    self._plan_init_cache(node, plan, call, calls, taken)
    keywords = {sub.keyword for sub in descendants(call.body) if isinstance(sub, cst.Arg)}
    for sub in descendants(call.body):
      if isinstance(sub, cst.Name) and sub.value in self._switches and sub not in self._mode_uses | keywords:
        raise _Unsupported(sub, f'the train/eval switch {sub.value} is used other than to set train/eval arguments')
    for sub in descendants(node):
      if isinstance(sub, cst.Attribute) and _is_self_attr(sub) and sub.attr.value in mode_fields \
          and sub not in self._mode_uses:
        raise _Unsupported(sub, f'the train/eval field {sub.attr.value} is used other than to set train/eval arguments')
    allowed = {node.bases[0].value} | {d.decorator for d in (method.decorators if method else ())}
    allowed |= {child.ctor.func for child in plan.children if child.api is None and not child.bridged} | self._lifted
    allowed |= {child.cell.ctor.func for child in plan.children if child.cell is not None}
    allowed |= self._plan_control_flow(node)
    for field in fields:  # `encoder: nn.Module` holds a submodule the caller builds: an NNX one now
      annotation = field.body[0].annotation.annotation
      if self._has_name(annotation, MODULE_NAMES):
        self._exprs[annotation] = 'nnx.Module'
        allowed.add(annotation)
    bridged = {child.ctor for child in plan.children if child.bridged}  # stays Linen code
    plan.linen_nodes = [*allowed, *self._convert_linen_refs(node, allowed | bridged)]
    plan.example_params = [f'{child.attr}_example_inputs' for child in plan.children if child.bridged]
    plan.params = [self._code(f.body[0]).strip() for f in fields]
    for child in plan.children:
      child.text = 'nnx.data(None)' if child.cache else self._variable_text(child) if child.api else self._ctor_text(child)
      if child.condition is not None:
        child.text = f'{child.text} if {child.condition} else None'
      child.text = self._loops.wrap(self, child)  # built in a loop: nnx.List([<it> for <target> in <iterator>])
      if not child.hoisted:
        self._exprs[child.ctor] = child.text
    plan.mode_params = [(i, name, MODE_PARAMS[name]) for i, name in mode.items()]
    if mode or method is call:
      self._methods[call] = set(mode.values())
    if method is not None and method is not call:
      self._methods[method] = set()
    return plan

  def _mode_params(self, call: cst.FunctionDef) -> dict[int, str]:
    params = call.params
    if isinstance(params.star_arg, cst.Param) or params.star_kwarg or params.posonly_params or params.kwonly_params:
      raise _Unsupported(call, f'{call.name.value} takes *args, **kwargs, positional-only or keyword-only arguments')
    names = [p.name.value for p in params.params[1:]]
    defaults = {p.name.value: p.default for p in params.params[1:] if p.default is not None}
    self._switch_defaults = {
        name: default.value == 'True' for name, default in defaults.items()
        if name in MODE_PARAMS and isinstance(default, cst.Name) and default.value in ('True', 'False')
    }
    return {i: name for i, name in enumerate(names) if name in MODE_PARAMS}

  def _plan_setup(self, plan: _Plan, setup: cst.FunctionDef, counts: dict[str, int]) -> None:
    """setup() statements: `self.<attr> = <table layer or same-file class>(...)`, self.param or self.variable."""
    for statement in setup.body.body:
      if self._loops.setup_append(self, statement, setup):  # `layers = []` + `for ...: layers.append(...)`: go
        continue
      target = _self_assignment(statement)
      value = statement.body[0].value if target is not None else None
      if isinstance(value, cst.Call) and _scope_api(value) in ('param', 'variable'):
        child = self._variable(value, target, hoisted=False)
      elif isinstance(value, cst.Call) and self._constructed(value) is not None:
        child = self._child(value, counts, target)
      elif isinstance(value, cst.ListComp):  # `self.layers = [nn.Dense(f) for f in ...]`: an nnx.List (layer_loops)
        child = self._child(self._loops.setup_list(self, value, target), counts, target)
      elif (appended := self._loops.appended(self, value, target)) is not None:  # `self.layers = layers` (appended)
        child = self._child(appended, counts, target)
      else:
        raise _Unsupported(statement, 'a setup() statement other than self.<attr> = <layer>(...) / self.param / self.variable')
      if target in {c.attr for c in plan.children}:
        raise _Unsupported(statement, f'self.{target} assigned twice')
      plan.children.append(child)

  def _plan_compact(self, plan: _Plan, method: cst.FunctionDef, counts: dict[str, int]) -> dict[cst.Call, cst.Call]:
    """Layers and variables built inline in the @nn.compact method; returns each layer's call."""
    ctors = [c for c in descendants(method) if isinstance(c, cst.Call) and self._constructed(c) is not None]
    cells = {self._cell_arg(c) for c in ctors}  # built in a wrapper's constructor call: part of that child
    ctors = [c for c in ctors if c not in cells]
    for call in descendants(method.body):  # `self.conv(...)(x)`: a module built from a ModuleDef or factory
      if isinstance(call, cst.Call) and isinstance(call.func, cst.Call) and call.func not in ctors \
          and call not in ctors:
        raise _Unsupported(call, f'{self.module.code_for_node(call.func.func)}(...)(...) builds a submodule from a '
                                 'ModuleDef, factory or layer NNX has no counterpart of')
    variables = [c for c in descendants(method.body) if isinstance(c, cst.Call) and _scope_api(c) in ('param', 'variable')]
    if not ctors and not variables and not plan.children:
      raise _Unsupported(method, 'no submodule or variable created in the @nn.compact method')
    caches = self._decode_caches(plan, method)
    self._straight_line(method.body, {*ctors, *variables} - caches)
    outer = {}
    for sub in descendants(method):
      if isinstance(sub, (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.FunctionDef,
                          cst.IfExp, cst.BooleanOperation)):
        if any(c in ctors or c in variables for c in descendants(sub)):
          raise _Unsupported(sub, 'a submodule or variable created in a lambda, comprehension, nested function '
                                  'or conditional expression')
      if isinstance(sub, cst.Call) and sub.func in ctors:
        outer[sub.func] = sub
    scan_names: dict[cst.Call, list[cst.Name]] = {}
    for ctor in ctors:  # `rnn = nn.scan(Cell, ...)(...)`, then `rnn(carry, x)` once and `rnn.<method>(...)`
      if (ctor in self._scans or ctor in self._remats or ctor in self._stacks) and ctor not in outer:
        outer[ctor], scan_names[ctor] = self._scan_local(method, ctor)
      elif ctor not in outer and self._bound_local(method, ctor) is not None \
          and not any(self._constructed(ctor)[0] in w.cells for w in WRAPPERS):  # `embed = nn.Embed(...)`, shared
        calls, scan_names[ctor] = self._shared_local(method, ctor)
        outer[ctor] = calls[0]
        self._extra_calls.update((call, ctor) for call in calls[1:])
    holders = set()  # locals bound to a self.variable(...), whose `.value` becomes `[...]`
    for node in descendants(method.body):
      if node in variables:
        child = self._variable(node, None, hoisted=True, cache=node in caches)
        self._exprs[node] = f'self.{child.attr}[...]' if child.api == 'param' else f'self.{child.attr}'
        plan.children.append(child)
        assign = self._parent(node)
        if child.api == 'variable' and isinstance(assign, cst.Assign) and len(assign.targets) == 1 \
            and isinstance(assign.targets[0].target, cst.Name):
          holders.add(assign.targets[0].target.value)
      elif node in ctors:
        if node not in outer:
          wrappers = [w.linen.rpartition('.')[2] for w in WRAPPERS if self._constructed(node)[0] in w.cells]
          hint = f' (a cell: build it in the {wrappers[0]}(...) call to convert both)' if wrappers else ''
          raise _Unsupported(node, f'a submodule that is not called where it is constructed{hint}')
        child = self._child(node, counts, None)
        child.hoisted = True
        child.condition = self._conditions.get(node)
        plan.children.append(child)
        self._scan_names.update((name, child) for name in scan_names.get(node, ()))
    for sub in descendants(method.body):
      if isinstance(sub, cst.Attribute) and isinstance(sub.value, cst.Name) and sub.value.value in holders \
          and sub.attr.value == 'value':
        self._exprs[sub] = f'{sub.value.value}[...]'
    for partial in dict.fromkeys(self._partials[c] for c in ctors if c in self._partials):
      self._pending.append((partial, f'{self.module.code_for_node(partial)}: each call of it becomes a construction '
                                     'in __init__ with its arguments (the statement goes)'))
    return {c.ctor: outer[c.ctor] for c in plan.children if c.hoisted and c.api is None}

  def _straight_line(self, body: cst.BaseSuite, built: set[cst.Call]) -> None:
    """Simple statements, and conditionals of plain code: no loops, and a construction (`built`) only in an
    `if <test>: ... else: ...` of simple statements whose test __init__ can evaluate (see _conditions)."""
    for statement in body.body:
      if _is_straight_statement(statement):
        continue
      if isinstance(statement, cst.For):  # layers built in a loop: nnx.List attributes (layer_loops.py)
        self._loops.plan(self, statement, built)
        continue
      branches = [statement, *(s for s in descendants(statement) if isinstance(s, cst.If))]
      if not isinstance(statement, cst.If) or any(isinstance(s, cst.BaseCompoundStatement) and not isinstance(s, cst.If)
                                                 for s in descendants(statement)) \
          or any(_has_scope_call(b.test) and not _is_initializing_if(b) for b in branches):
        raise _Unsupported(statement, 'the @nn.compact body has loops, conditionals or nested blocks')
      if any(s in built for s in descendants(statement)):
        self._conditions.update(self._construction_conditions(statement, built))
      self._branches.update(branches)

  def _construction_conditions(self, statement: cst.If, built: set[cst.Call]) -> dict[cst.Call, str]:
    """`if self.config.use_norm: x = nn.LayerNorm()(x)`: each construction in it, with the condition (code for
    __init__) under which it exists; a test that depends on the call (an input, a train/eval switch) is refused."""
    arms = _arms(statement)
    if len(arms) > 2 or isinstance(statement.orelse, cst.If) \
        or any(arm is not None and not all(_is_straight_statement(s) for s in arm.body) for arm in arms):
      raise _Unsupported(statement, 'submodules created in an elif chain or a nested block')
    test = statement.test
    if any(isinstance(n, cst.Name) and n.value in self._switches for n in (test, *descendants(test))):
      raise _Unsupported(test, 'a submodule created under a train/eval switch (in NNX it exists in both modes)')
    try:
      self._check_hoistable(test)
    except _Unsupported:
      raise _Unsupported(test, 'a submodule created under a condition on the call (its inputs or locals): NNX '
                               'creates submodules in __init__') from None
    code = self._code(test)
    conditions = {}
    negated = f'not {code}' if isinstance(test, (cst.Name, cst.Attribute)) else f'not ({code})'
    for arm, condition in zip(arms, (code, negated)):
      for sub in (descendants(arm) if arm is not None else ()):
        if sub in built:
          conditions[sub] = condition
    return conditions

  def _decode_caches(self, plan: _Plan, method: cst.FunctionDef) -> set[cst.Call]:
    """The decode-cache patterns of the @nn.compact method; returns their self.variable calls.

    The pattern (flax's MultiHeadDotProductAttention, the lm1b and wmt examples), in one block:
    `flag = self.has_variable('cache', 'k')`, then `v = self.variable('cache', 'k', init, *args)`
    for each cache, then `if flag: <the update>` (an else is only run by Linen's init). Linen's
    init creates the caches and leaves them as `init` made them; later calls run the update. In
    NNX init_cache creates them, the flag becomes a check that it ran, and the update always runs.
    """
    found: set[cst.Call] = set()
    for call in descendants(method.body):
      if isinstance(call, cst.Call) and _scope_api(call) == 'has_variable':
        found |= self._decode_cache(plan, method, call)
    return found

  def _decode_cache(self, plan: _Plan, method: cst.FunctionDef, call: cst.Call) -> set[cst.Call]:
    unsupported = lambda node, why: _Unsupported(node, f'{why}{HAS_VARIABLE_HINT}')
    assign, line = self._parent(call), None
    if isinstance(assign, cst.Assign):
      line = self._parent(assign)
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
            and assign.value is call and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
            and len(call.args) == 2 and all(a.keyword is None and isinstance(a.value, cst.SimpleString) for a in call.args)):
      raise unsupported(call, "self.has_variable other than `flag = self.has_variable('cache', '<name>')`")
    collection, name = (a.value.evaluated_value for a in call.args)
    if collection != 'cache':
      raise unsupported(call, f'self.has_variable on the collection {collection!r} (only decode caches, in '
                              "'cache', are converted)")
    if method.name.value != '__call__':
      raise unsupported(call, 'a decode cache in an @nn.compact method other than __call__')
    flag = assign.targets[0].target.value
    block = self._parent(line)
    statements = list(block.body)
    start = statements.index(line)
    guard = next((s for s in statements[start + 1:] if isinstance(s, cst.If) and isinstance(s.test, cst.Name)
                  and s.test.value == flag), None)
    if guard is None:
      raise unsupported(call, f'a self.has_variable flag {flag} not tested by an `if {flag}:` after it in the same block')
    caches: dict[str, cst.Call] = {}
    holders: dict[str, str] = {}
    for statement in statements[start + 1:statements.index(guard)]:
      target = _assigned_name(statement)
      value = statement.body[0].value if target else None
      if isinstance(value, cst.Call) and _scope_api(value) == 'variable' and value.args \
          and isinstance(value.args[0].value, cst.SimpleString) and value.args[0].value.evaluated_value == 'cache' \
          and len(value.args) > 1 and isinstance(value.args[1].value, cst.SimpleString):
        caches[value.args[1].value.evaluated_value] = value
        holders[target] = value.args[1].value.evaluated_value
    if name not in caches:
      raise unsupported(call, f"self.has_variable('cache', {name!r}) without a "
                              f"`{name} = self.variable('cache', {name!r}, ...)` between it and `if {flag}:`")
    uses = [n for n in descendants(method.body) if isinstance(n, cst.Name) and n.value == flag]
    if [n for n in uses if n is not assign.targets[0].target and n is not guard.test]:
      raise unsupported(call, f'the self.has_variable flag {flag} used other than as `if {flag}:`')
    inside = set(descendants(guard.body))
    for node in descendants(method.body):
      if isinstance(node, cst.Name) and node.value in holders:
        parent = self._parent(node)
        if isinstance(parent, cst.AssignTarget) and self._parent(parent).value in caches.values():
          continue  # `cached_key = self.variable('cache', ...)`
        if isinstance(parent, cst.Attribute) and parent.attr is node or isinstance(parent, cst.Arg) and parent.keyword is node:
          continue  # `other.cached_key`, `f(cached_key=...)`: not the local
        if not (isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == 'value'):
          raise unsupported(node, f'the decode cache {holders[node.value]} used other than through .value')
        if _is_written(parent, self._parent) and parent not in inside:
          raise _Unsupported(node, f'the decode cache {holders[node.value]} is written outside `if {flag}:`, so '
                                   "Linen's init writes it too: init_cache cannot create it as that init did")
    self._cache_flags[call] = flag
    self._statements[line] = (f'if self.{name} is None:\n'
                              f"  raise ValueError('{plan.name}: the decode cache is empty: call init_cache(input_shape) first')\n")
    self._ifs[guard] = True
    dropped = ' (its else, which only Linen\'s init ran, goes)' if guard.orelse is not None else ''
    self._pending.append((call, f'`{flag} = self.has_variable({collection!r}, {name!r})` -> a check that init_cache '
                                f'created the decode caches; the `if {flag}:` block runs always{dropped}'))
    return set(caches.values())

  def _child(self, ctor: cst.Call, counts: dict[str, int], attr: str | None) -> _Child:
    linen, spec, sibling = self._constructed(ctor)
    if spec is None and sibling is None and linen in self._linen_classes:
      return self._bridged_child(ctor, linen, counts, attr)
    wrapper = find_wrapper(linen) if spec is None and sibling is None else None
    stacked, wrapped = self._stacks.get(ctor), self._remats.get(ctor)
    short = ('Scan' if ctor in self._scans else stacked.transform.capitalize() if stacked else '') \
        + ('Checkpoint' if stacked and stacked.remat is not None else
           next(w[3] for w in WRAPPING.values() if w[1] == wrapped[0]) if wrapped else '') \
        + linen.rpartition('.')[2]  # Linen names it ScanCell_0, CheckpointBlock_0, ScanCheckpointBlock_0, VmapBlock_0
    args = [*self._partials[ctor].args[1:], *ctor.args] if ctor in self._partials else ctor.args
    if any(a.star for a in args):
      raise _Unsupported(ctor, 'a constructor call with *args or **kwargs')
    positional = [a.value for a in args if a.keyword is None]
    names = linen_fields(linen) if sibling is None else tuple(sibling.linen_fields)
    if len(positional) > len(names):
      raise _Unsupported(ctor, f'too many positional arguments for {short}')
    kwargs = dict(zip(names, positional))
    kwargs.update((a.keyword.value, a.value) for a in args if a.keyword is not None)
    if 'parent' in kwargs:
      raise _Unsupported(ctor, 'parent= is not converted')
    name = kwargs.pop('name', None)
    listed = self._loops.list_name(self, ctor, name)  # built in a loop, name=f'layer_{i}': the nnx.List `layers`
    if name is not None and listed is None and not _literal_identifier(name):
      raise _Unsupported(ctor, 'name= is not a literal identifier')
    cell = self._cell(ctor, wrapper, kwargs.pop(wrapper.cell_kwarg, None), counts) if wrapper is not None else None
    refs = self._size_refs(kwargs.values())
    for value in kwargs.values():
      self._check_hoistable(value, skip=set(refs))
    explicit = listed or (name.evaluated_value if name is not None else attr)
    if not explicit:
      counts[short] = counts.get(short, -1) + 1  # Linen numbers auto-named children per class
    child = _Child(explicit or '', explicit or f'{short}_{counts[short]}', ctor, spec, sibling, kwargs,
                   wrapper=wrapper, cell=cell, scan=self._scans.get(ctor), remat=self._remats.get(ctor), stacked=stacked,
                   shape_refs=refs)
    self._ctor_modes(child)
    return child

  def _size_refs(self, values: tp.Iterable[cst.CSTNode]) -> dict[cst.CSTNode, str]:
    """Input sizes a constructor argument reads: `x.shape[-1]` (-> x), or a local bound once to one, as
    `d = x.shape[-1]` or `n, _, d = x.shape` (-> d); `_derive` finds what the code says of each."""
    refs = {}
    for value in values:
      for sub in (value, *descendants(value)):
        if _last_axis_of_name(sub):
          refs[sub] = sub.value.value.value
        elif isinstance(sub, cst.Name) and self._size_local(sub) is not None:
          refs[sub] = sub.value
    return refs

  def _size_local(self, name: cst.Name) -> str | None:
    """The array whose last axis the local `name` is bound to, once, in the method: None for other names."""
    scope = self.get_metadata(ScopeProvider, name, None)
    if scope is None or isinstance(scope, (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)) \
        or name.value not in scope:
      return None
    assignments = list(scope[name.value])
    if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
      return None
    assign = next((node for node in self._ancestors(assignments[0].node) if isinstance(node, cst.Assign)), None)
    local = _size_local_of(assign) if assign is not None else None
    return local[1] if local is not None and local[0] == name.value else None

  def _ancestors(self, node: cst.CSTNode) -> tp.Iterator[cst.CSTNode]:
    parent = self._parent(node)
    while parent is not None and not isinstance(parent, (cst.BaseStatement, cst.BaseSmallStatement)):
      yield parent
      parent = self._parent(parent)
    if parent is not None:
      yield parent

  def _bridged_child(self, ctor: cst.Call, linen: str, counts: dict[str, int], attr: str | None) -> _Child:
    """A Linen class of the file that stays Linen, built by `ctor`: wrapped with nnx_bridge.from_linen, initialised
    from example inputs the converted class takes as a constructor argument."""
    self._check_hoistable(ctor, linen=True)
    name = next((a.value for a in ctor.args if a.keyword is not None and a.keyword.value == 'name'), None)
    if name is not None and not _literal_identifier(name):
      raise _Unsupported(ctor, 'name= is not a literal identifier')
    explicit = name.evaluated_value if name is not None else attr
    if isinstance(ctor.func, cst.Call):  # Linen names nn.map_variables(Block) Map_variablesBlock_0
      short = self.module.code_for_node(ctor.func.func).rpartition('.')[2].capitalize() + linen
    else:
      short = linen
    if not explicit:
      counts[short] = counts.get(short, -1) + 1
    why = self._kept_linen.get(linen, 'it was not converted (see its TODO)')
    return _Child(explicit or '', explicit or f'{short}_{counts[short]}', ctor, None, None, {}, bridged=why)

  def _variable(self, call: cst.Call, attr: str | None, hoisted: bool, cache: bool = False) -> _Child:
    """A `self.param(name, init, *args)` / `self.variable(collection, name, init, *args)` call.

    A decode cache (`cache`) is made by init_cache, from shapes `_plan_init_cache` derives.
    """
    api = _scope_api(call)
    if any(a.star for a in call.args) or any(a.keyword is not None for a in call.args[:3 if api == 'variable' else 2]):
      raise _Unsupported(call, f'self.{api} with *args, **kwargs or keyword leading arguments')
    if any(a.keyword is not None and a.keyword.value == 'unbox' for a in call.args):
      raise _Unsupported(call, f'self.{api} with unbox=')
    lead = 3 if api == 'variable' else 2
    if len(call.args) < lead:
      raise _Unsupported(call, f'self.{api} without an init function')
    if api == 'variable':
      if not isinstance(call.args[0].value, cst.SimpleString):
        raise _Unsupported(call, 'self.variable with a collection that is not a literal string')
      collection = call.args[0].value.evaluated_value
      name = call.args[1].value
    else:
      collection, name = 'params', call.args[0].value
    if not _literal_identifier(name):
      raise _Unsupported(call, f'self.{api} with a name that is not a literal identifier')
    refs = {} if not hoisted or cache else self._size_refs(arg.value for arg in call.args[lead - 1:])
    for arg in call.args[lead - 1:] if not cache else ():
      self._check_hoistable(arg.value, skip=set(refs))
    if api == 'param':
      var_type = 'nnx.Param'
    else:
      var_type = flax_variable_type(collection) or self._variable_class_name(collection)
    return _Child(attr or name.evaluated_value, name.evaluated_value, call, None, None, {}, hoisted=hoisted,
                  api=api, collection=collection, var_type=var_type, shape_refs=refs, cache=cache)

  def _variable_class_name(self, collection: str) -> str:
    if collection not in self._variable_classes:
      base = ''.join(part[:1].upper() + part[1:] for part in re.split(r'\W|_', collection) if part)
      base = base if base.isidentifier() and not keyword.iskeyword(base) else 'Collection'
      name = base
      while name in self._global_names or name in self._variable_classes.values():
        name = f'{base}Variable' if name == base else name + '_'
      self._variable_classes[collection] = name
    return self._variable_classes[collection]

  def _variable_class(self, collection: str) -> cst.ClassDef:
    name = self._variable_classes[collection]
    return cst.parse_statement(
        f'@nnx.register_variable_name({collection!r}, overwrite=True)\n'
        f'class {name}(nnx.Variable):\n'
        f'  """Variables of the Linen collection {collection!r}."""\n'
    )

  def _plan_scope_calls(self, node: cst.ClassDef, plan: _Plan, setup: cst.FunctionDef | None, taken: set[str]) -> None:
    """self.make_rng / self.sow / self.is_initializing; any other scope API keeps the class Linen."""
    handled = {c.ctor for c in plan.children if c.api is not None} | set(self._cache_flags)
    in_setup = set(descendants(setup)) if setup is not None else set()
    for sub in descendants(node):
      if not (isinstance(sub, cst.Attribute) and _is_self_attr(sub) and sub.attr.value in SCOPE_APIS):
        continue
      api, call = sub.attr.value, self._parent(sub)
      if call in handled:
        continue
      if not (isinstance(call, cst.Call) and call.func is sub):
        raise _Unsupported(sub, f'self.{api} used other than by calling it')
      if sub in in_setup or api not in CONVERTED_APIS - {'param', 'variable'}:
        raise _Unsupported(sub, f'self.{api} has no automatic NNX conversion{" in setup()" if sub in in_setup else ""}'
                                + (HAS_VARIABLE_HINT if api == 'has_variable' else ''))
      if api == 'make_rng':
        self._make_rng(plan, call, taken)
      elif api == 'sow':
        self._sow(plan, call, taken)
      else:
        self._is_initializing(call)

  def _make_rng(self, plan: _Plan, call: cst.Call, taken: set[str]) -> None:
    if len(call.args) != 1 or call.args[0].keyword is not None or not isinstance(call.args[0].value, cst.SimpleString):
      raise _Unsupported(call, 'self.make_rng with a stream name that is not a literal string')
    stream = call.args[0].value.evaluated_value
    if stream not in plan.streams:
      base = f'{stream}_rngs' if stream.isidentifier() else 'rngs_stream'
      attr = base
      while attr in taken or attr in plan.streams.values():
        attr += '_'
      plan.streams[stream] = attr
      self._pending.append((call, f"self.make_rng({stream!r}) -> self.{attr}(), a stream forked from rngs in __init__"))
    self._exprs[call] = f'self.{plan.streams[stream]}()'

  def _sow(self, plan: _Plan, call: cst.Call, taken: set[str]) -> None:
    first = call.args[0].value if call.args and call.args[0].keyword is None else None
    if not isinstance(first, cst.SimpleString):
      raise _Unsupported(call, 'self.sow with a collection that is not a literal string')
    name = call.args[1].value if len(call.args) > 1 else None
    if not isinstance(name, cst.SimpleString) or name.evaluated_value in taken | set(plan.streams.values()):
      # NNX's sow outside nnx.capture stores the value as an attribute of that name.
      raise _Unsupported(call, 'self.sow with a name that is not a literal string or that names an attribute')
    collection = first.evaluated_value
    var_type = flax_variable_type(collection)
    if var_type is None:
      var_type = self._variable_class_name(collection)
      plan.collections += [collection] if collection not in plan.collections else []
    self._exprs[first] = var_type
    self._pending.append((call, f'self.sow({collection!r}, ...) -> self.sow({var_type}, ...); '
                                f'collect the values with nnx.capture(model, {var_type})'))

  def _is_initializing(self, call: cst.Call) -> None:
    parent = self._parent(call)
    negated = isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not)
    statement = self._parent(parent) if negated else parent
    if not (isinstance(statement, cst.If) and statement.test is (parent if negated else call) and statement.orelse is None):
      raise _Unsupported(call, 'self.is_initializing() other than as `if [not] self.is_initializing():` without else')
    self._ifs[statement] = negated
    what = 'kept unconditionally' if negated else 'removed'
    self._pending.append((call, f'`if {"not " if negated else ""}self.is_initializing():` block {what}: '
                                f'NNX creates variables in __init__, never during a call'))

  def _child_calls(self, plan: _Plan, methods: dict[str, cst.FunctionDef], setup: cst.FunctionDef | None,
                   inline: dict[cst.Call, cst.Call]) -> dict[cst.Call, _Child]:
    """Every call of a submodule in the class's methods; setup params read back become `[...]` reads."""
    by_ctor = {c.ctor: c for c in plan.children}
    calls = {call: by_ctor[ctor] for ctor, call in inline.items()}
    for call, ctor in self._extra_calls.items():  # `embed(...)` again: the same submodule
      if ctor in by_ctor:
        calls[call] = by_ctor[ctor]
        self._calls[call] = (by_ctor[ctor].attr, set())
    for child, call in zip([by_ctor[c] for c in inline], inline.values()):
      self._calls[call] = (child.attr, set())
      if child.scan is not None:
        self._scan_call(call, child)
      if child.remat is not None:
        self._remat_call(call, child)
      if child.stacked is not None:
        self._stack_call(call, child)
    tied = tied_uses(self._factories, plan, methods, setup)  # `.apply` with a shared kernel, `.variables[...]`
    from_setup = {c.attr: c for c in plan.children if not c.hoisted}
    for method in methods.values():
      if method is setup:
        continue
      for sub in descendants(method):
        if not (isinstance(sub, cst.Attribute) and _is_self_attr(sub) and sub.attr.value in from_setup) or sub in tied:
          continue
        child, parent = from_setup[sub.attr.value], self._parent(sub)
        if self._loops.list_use(self, sub, child, calls):  # `for layer in self.layers:` over a setup() list
          continue
        if child.api == 'param':
          if isinstance(parent, (cst.AssignTarget, cst.AugAssign)) or isinstance(parent, cst.Del):
            raise _Unsupported(sub, f'self.{child.attr} (a param) assigned to')
          self._exprs[sub] = f'self.{child.attr}[...]'
        elif child.api == 'variable':
          if isinstance(parent, cst.Attribute) and parent.value is sub and parent.attr.value == 'value':
            self._exprs[parent] = f'self.{child.attr}[...]'  # `.value` is deprecated in NNX
        elif child.api is None:
          if (child.scan is not None or child.remat is not None or child.stacked is not None) \
              and isinstance(parent, cst.Attribute) and parent.value is sub \
              and isinstance(self._parent(parent), cst.Call) and self._parent(parent).func is parent:
            continue  # `self.rnn.initial_state(...)`: a method of the cell, called outside the scan
          if not (isinstance(parent, cst.Call) and parent.func is sub):
            raise _Unsupported(sub, f'self.{sub.attr.value} used other than by calling it')
          calls[parent] = child
          if child.scan is not None:
            self._scan_call(parent, child)
          if child.remat is not None:
            self._remat_call(parent, child)
          if child.stacked is not None:
            self._stack_call(parent, child)
    return calls

  def _check_hoistable(self, value: cst.CSTNode, skip: tp.Collection[cst.CSTNode] = (), linen: bool = False) -> None:
    """Code moved into __init__ must mean the same there: no locals (but `skip`), Linen names NNX shares (any
    Linen name, with `linen`: code that stays Linen)."""
    if value in skip or value in self._factories.hoistable or value in self._loops.refs \
        or (self._is_linen_name(value) if linen else self._nnx_name_for(value) is not None):
      return
    if isinstance(value, cst.Name) and value.value != 'self' and value.value not in self._switches:
      scope = self.get_metadata(ScopeProvider, value, None)
      outer = (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)
      assignments = list(scope[value.value]) if scope is not None else []
      if scope is not None and not isinstance(scope, outer) and any(not isinstance(a.scope, outer) for a in assignments):
        alias = self._self_alias(assignments)
        if alias is None:
          raise _Unsupported(value, f'a constructor argument uses the local {value.value}')
        self._aliases[value] = alias
    for child in value.children:
      self._check_hoistable(child, skip, linen)

  def _self_alias(self, assignments: list[cst.metadata.BaseAssignment]) -> str | None:
    """`self.config` when the local is bound once, by `name = self.config` (or a longer chain, or an attribute
    chain of such a local: `p = cfg.patch_size`)."""
    if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
      return None
    target = self._parent(assignments[0].node)
    assign = self._parent(target) if isinstance(target, cst.AssignTarget) else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and target.target is assignments[0].node):
      return None
    chain = assign.value
    while isinstance(chain, cst.Attribute):
      chain = chain.value
    if not isinstance(chain, cst.Name) or assign.value is chain:
      return None
    code = self.module.code_for_node(assign.value)
    if chain.value == 'self':
      return code
    scope = self.get_metadata(ScopeProvider, chain, None)  # `p = cfg.patch_size` after `cfg = self.config`
    base = self._self_alias(list(scope[chain.value])) if scope is not None and chain.value in scope else None
    return None if base is None else base + code[len(chain.value):]

  def _name_children(self, children: list[_Child], taken: set[str]) -> None:
    """Gives auto-named children a readable, deterministic, collision-free attribute name."""
    explicit = [c.attr for c in children if c.attr]
    if len(set(explicit)) != len(explicit) or set(explicit) & taken:
      raise _Unsupported(children[0].ctor, 'duplicate names, or names shadowing a field or method')
    taken = taken | set(explicit)
    auto = [c for c in children if not c.attr]
    bases = ['cell' if c.scan else _snake(c.linen_name.rpartition('_')[0]) if c.bridged
             else f'{_snake(c.sibling.name)}s' if c.stacked
             else _snake((c.spec or c.wrapper).nnx.rpartition('.')[2]) if c.spec or c.wrapper
             else _snake(c.sibling.name) for c in auto]
    bases = [self._loops.plural(c, base) for c, base in zip(auto, bases)]  # a loop's nnx.List: `linears`
    for i, (child, base) in enumerate(zip(auto, bases)):
      attr = f'{base}{bases[:i].count(base) + 1}' if bases.count(base) > 1 else base
      while attr in taken:
        attr += '_'
      child.attr = attr
      taken.add(attr)

  # --- sizes and train/eval switches -----------------------------------------------------------

  def _derive(self, plan: _Plan, methods: dict[str, cst.FunctionDef], call: cst.FunctionDef,
              calls: dict[cst.Call, _Child], carry: Dim = None) -> Dim:
    """Fills each child's NNX sizes, walking `__call__` in order and into the class's own methods.

    A size is followed through straight-line code only; elsewhere a child's sizes become
    constructor arguments. For a cell the file scans with nn.scan, `carry` is the size of its
    first call argument (the carry it returns has it); the size of the carry `__call__` returns
    (the first of a returned pair) comes back, and a concatenate of known sizes and inputs gets
    a size argument for each input's last axis.
    """
    scanned = plan.name in self._scanned_cells
    returned: list[Dim] = []
    shared: dict[tp.Any, str] = {}
    visited: set[cst.Call] = set()
    active: list[cst.FunctionDef] = []
    variables = {c.ctor: c for c in plan.children if c.api is not None and c.hoisted}
    size_locals: dict[str, Dim] = {}  # `d = x.shape[-1]`: what the code said of x there

    def dim(expr: cst.CSTNode, env: dict[str, Dim], derive: bool) -> Dim:
      if isinstance(expr, cst.Call) and expr in calls:
        return visit(expr, env, derive)
      if isinstance(expr, cst.Call) and expr in variables:
        resolve(variables[expr], env, derive)
        return last_of_shape(variables[expr]) if derive else None
      method = self._own_method(expr, methods)
      if method is not None:
        return enter(expr, method, env, derive)
      if derive and isinstance(expr, cst.Name):
        return env.get(expr.value)
      if derive and self._factories.is_activation(expr):  # `self.act(x)`, a Callable field: elementwise
        return dim(expr.args[0].value, env, derive)
      if derive and isinstance(expr, cst.Call) and self._has_name(expr.func, ELEMENTWISE) \
          and len(expr.args) == 1 and expr.args[0].keyword is None and not expr.args[0].star:
        return dim(expr.args[0].value, env, derive)
      if derive and isinstance(expr, cst.Call) and self._has_name(expr.func, CONCATENATE):
        return concatenated(expr, env, derive)
      if derive and isinstance(expr, cst.Call) and self._has_name(expr.func, TILE) and len(expr.args) == 2 \
          and isinstance(expr.args[1].value, (cst.List, cst.Tuple)) and expr.args[1].value.elements \
          and isinstance(expr.args[1].value.elements[-1].value, cst.Integer) \
          and expr.args[1].value.elements[-1].value.value == '1':
        dim(expr.args[1].value, env, derive)
        return dim(expr.args[0].value, env, derive)
      if derive and isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, ARITHMETIC):
        left, right = dim(expr.left, env, derive), dim(expr.right, env, derive)
        return right if _is_number(expr.left) else left if _is_number(expr.right) else _broadcast(left, right)
      for sub in expr.children:
        dim(sub, env, derive)
      target = self._reshape_target(expr) if derive else None
      if target and isinstance(target[-1].value, cst.Name) and target[-1].value.value in size_locals:
        return size_locals[target[-1].value.value]  # `jnp.reshape(x, (n, h * w, c))` after `n, h, w, c = x.shape`
      last = self._reshaped_last(expr) if derive else None
      return ('known', last) if last is not None else None

    def scanned_carry(target: cst.BaseExpression, call: cst.Call, env: dict[str, Dim], derive: bool) -> Dim:
      """`x, _ = <scan over a class of the file>(x, ...)`: the carry's size, from what the class returns."""
      child = calls[call]
      if not (derive and isinstance(target, cst.Tuple) and len(target.elements) == 2
              and isinstance(target.elements[0].value, cst.Name) and child.sibling is not None
              and (child.scan is not None or child.stacked is not None) and child.sibling.carry_output is not None):
        return None
      carry = child.sibling.carry_output
      if carry[0] == 'input':
        return dim(call.args[carry[1]].value, env, derive) if carry[1] < len(call.args) else None
      code = self._in_caller(carry[1], child)
      return None if code is None else ('known', code)

    def last_of_shape(child: _Child) -> Dim:
      """A param's last axis: the last of its literal shape tuple (`self.param('p', init, (1, n, d))`)."""
      shape = child.ctor.args[2].value if child.api == 'param' and len(child.ctor.args) > 2 else None
      if not isinstance(shape, (cst.Tuple, cst.List)) or not shape.elements \
          or isinstance(shape.elements[-1], cst.StarredElement):
        return None
      last = shape.elements[-1].value
      if last in child.shape_refs:
        return child.ref_dims.get(last)
      try:
        self._check_hoistable(last)
      except _Unsupported:
        return None
      return ('known', self._code(last))

    def concatenated(expr: cst.Call, env: dict[str, Dim], derive: bool) -> Dim:
      """`jnp.concatenate([a, b], axis=-1)` of known sizes: their sum."""
      first = expr.args[0].value if expr.args else None
      axis = [a.value for a in expr.args[1:] if a.keyword is None or a.keyword.value == 'axis']
      if not (isinstance(first, (cst.List, cst.Tuple)) and len(axis) == 1 and _is_minus_one(axis[0])):
        for sub in expr.children:
          dim(sub, env, derive)
        return None
      parts = [dim(e.value, env, derive) for e in first.elements]
      if scanned and carry is not None and parts and all(p is not None for p in parts) \
          and any(p[0] == 'known' for p in parts):  # a cell's carry and input: the input's last axis
        parts = [p if p[0] == 'known' else ('known', input_size(p[1], expr)) for p in parts]
      if not parts or any(isinstance(e, cst.StarredElement) for e in first.elements) \
          or any(p is None or p[0] != 'known' for p in parts):
        return None
      return ('known', ' + '.join(_paren(p[1]) for p in parts))

    def input_size(index: int, node: cst.CSTNode) -> str:
      """A size argument for the last axis of call argument `index`."""
      key = ('input', index)
      if key not in shared:
        name = f'{plan.call_params[index]}_features'
        while name in plan.field_names or name in {p for p, _ in plan.size_params} or name == 'rngs':
          name += '_'
        plan.size_params.append((name, key))
        detail = f'the size of the last axis of {plan.call_params[index]}'
        plan.size_arguments.append(ConstructorArgument(name, INPUT_DIMENSION, detail, None,
                                                       input=plan.call_params[index]))
        self._pending.append((node, f'new constructor argument {name}: {detail}'))
        shared[key] = name
      return shared[key]

    def visit(node: cst.Call, env: dict[str, Dim], derive: bool) -> Dim:
      visited.add(node)
      child = calls[node]
      dropped = self._call_modes(node, child)
      attr = self._calls[node][0] if node in self._calls else None
      if attr or dropped:
        self._calls[node] = (attr, dropped)
      arg_dims = [dim(a.value, env, derive) for a in node.args]
      if child.ctor in self._loops.sites:  # built in a for loop: sized by layer_loops from every iteration
        self._loops.seen(self, child, node, arg_dims)
        return self._output(child, arg_dims)
      if not child.done:
        child.done = True
        shape_sizes(child, env, derive)
        for nnx_arg, index, optional in self._size_sources(child):
          position = self._call_arg(node, child, index)
          if position is None and optional:
            continue
          source = arg_dims[position] if position is not None else None
          if source is not None and source[0] == 'known':
            child.sizes[nnx_arg] = source[1]
            continue
          key = source if source is not None else (child.attr, nnx_arg)
          if key not in shared:
            argument = self.module.code_for_node(node.args[position].value) if position is not None else None
            where = None if argument is None else f"the input dimension of self.{child.attr}'s call argument {argument}"
            shared[key] = self._size_param(plan, child, nnx_arg, where, source, node, input_index=position)
          child.sizes[nnx_arg] = shared[key]
      if child.wrapper is not None and any(a.keyword is not None and a.keyword.value in child.wrapper.output_unless
                                           for a in node.args):
        return None  # `return_carry=True` at call time: a (carry, outputs) pair
      return self._output(child, arg_dims)

    def resolve(child: _Child, env: dict[str, Dim], derive: bool) -> None:
      """A hoisted variable's shape: each `x.shape[-1]` from what the code says of x."""
      if child.done:
        return
      child.done = True
      shape_sizes(child, env, derive)

    def shape_sizes(child: _Child, env: dict[str, Dim], derive: bool) -> None:
      """Each `x.shape[-1]` (or local bound to one) in a child's arguments: what the code says of x."""
      for ref, name in child.shape_refs.items():
        source = (size_locals.get(name) if isinstance(ref, cst.Name) else env.get(name)) if derive else None
        child.ref_dims[ref] = source
        if source is not None and source[0] == 'known':
          child.size_codes[ref] = _paren(source[1])
          continue
        key = source if source is not None else (child.attr, name)
        if key not in shared:
          array = self._size_local(ref) if isinstance(ref, cst.Name) else name
          label = array if array == name else f'{array} (bound to {name})'
          shared[key] = self._size_param(plan, child, 'features', f'the size of the last axis of {label}', source, ref,
                                         shape_ref=True)
        child.size_codes[ref] = shared[key]

    def enter(node: cst.Call, method: cst.FunctionDef, env: dict[str, Dim], derive: bool) -> Dim:
      """A call of one of the class's own methods: its arguments bound to what the caller knows."""
      arg_dims = [(a.keyword.value if a.keyword else i, dim(a.value, env, derive)) for i, a in enumerate(node.args)]
      if method in active or any(a.star for a in node.args):
        return None
      names = [p.name.value for p in method.params.params[1:]]
      inner = {names[k] if isinstance(k, int) and k < len(names) else k: d for k, d in arg_dims}
      active.append(method)
      try:
        return walk(method.body, inner, derive and self._is_straight(method.body))
      finally:
        active.pop()

    def branch(statement: cst.If, env: dict[str, Dim], derive: bool) -> None:
      """A conditional of plain code: a name keeps what the code says of it only when every arm agrees."""
      arms = _arms(statement)
      for test in _tests(statement):
        dim(test, env, derive)
      ends = []
      for arm in arms:
        ends.append(dict(env))
        if arm is not None:
          walk(arm, ends[-1], derive)
      for name in {name for end in ends for name in end}:
        values = [end.get(name) for end in ends]
        env[name] = values[0] if all(v == values[0] for v in values) else None

    def walk(body: cst.BaseSuite, env: dict[str, Dim], derive: bool) -> Dim:
      output: Dim = None
      for statement in self._effective(body.body):
        if statement in self._branches:
          branch(statement, env, derive)
          continue
        if statement in self._loops.loops:  # a for loop: walked for its first and its later iterations
          self._loops.derive(self, plan, statement, env, derive, walk, shared)
          continue
        parts = statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]
        for part in parts:
          if isinstance(part, cst.Return) and part.value is not None:
            value = part.value
            if scanned and active == [call] and isinstance(value, cst.Tuple) and len(value.elements) == 2 \
                and not any(isinstance(e, cst.StarredElement) for e in value.elements):
              returned[:] = [dim(value.elements[0].value, env, derive)]
              dim(value.elements[1].value, env, derive)
              output = None
              continue
            output = dim(part.value, env, derive)
            continue
          local = _size_local_of(part) if isinstance(part, cst.Assign) else None
          if local is not None:
            size_locals[local[0]] = env.get(local[1]) if derive else None
          if isinstance(part, cst.Assign) and len(part.targets) == 1 and isinstance(part.targets[0].target, cst.Name):
            env[part.targets[0].target.value] = dim(part.value, env, derive)
            continue
          if isinstance(part, cst.Assign) and len(part.targets) == 1 and part.value in calls:
            dim(part, env, derive)
            first = scanned_carry(part.targets[0].target, part.value, env, derive)
            for sub in (part.targets[0].target, *descendants(part.targets[0].target)):
              if isinstance(sub, cst.Name):
                env[sub.value] = first if first is not None and sub is part.targets[0].target.elements[0].value else None
            continue
          dim(part, env, derive)
          targets = [t.target for t in getattr(part, 'targets', ())] + [getattr(part, 'target', None)]
          for target in filter(None, targets):
            for sub in (target, *descendants(target)):
              if isinstance(sub, cst.Name):
                env[sub.value] = None
      return output

    inputs = {name: ('input', i) for i, name in enumerate(plan.call_params)}
    if carry is not None and plan.call_params:
      inputs[plan.call_params[0]] = carry
    active.append(call)
    plan.output = walk(call.body, inputs, self._is_straight(call.body))
    if self._returns_in_branches(call):
      plan.output = None
    for node in calls:  # calls in methods __call__ does not reach: still checked, sizes undetermined
      if node not in visited:
        visit(node, {}, False)
    for child in plan.children:
      if child.api is not None and child.hoisted:
        resolve(child, {}, False)
      elif child.api is None and not child.done:
        for nnx_arg, index, optional in self._size_sources(child):
          if not optional:
            child.sizes[nnx_arg] = self._size_param(plan, child, nnx_arg, None, None, child.ctor)
    plan.carry_output = returned[0] if returned else None
    return returned[0] if returned and returned[0] is not None and returned[0][0] == 'known' else None

  def _returns_in_branches(self, method: cst.FunctionDef) -> bool:
    """A `return` in a conditional: what the last one returns is not all the method may return."""
    inside = set(descendants(method))
    return any(isinstance(sub, cst.Return) for branch in self._branches & inside for sub in descendants(branch))

  def _is_straight(self, body: cst.BaseSuite) -> bool:
    """Straight-line code, or conditionals of plain code that `_straight_line` let through."""
    return all(_is_straight_statement(s) or s in self._branches or s in self._loops.loops for s in body.body)

  def _reshaped_last(self, expr: cst.CSTNode) -> str | None:
    """`x.reshape(..., n)` / `jnp.reshape(x, (..., n))`: the code of n, when it is valid in __init__."""
    shape = self._reshape_target(expr)
    last = shape[-1] if shape else None
    if last is None or isinstance(last, cst.StarredElement) or _is_minus_one(last.value):
      return None
    try:
      self._check_hoistable(last.value)
    except _Unsupported:
      return None
    return self._code(last.value)

  def _reshape_target(self, expr: cst.CSTNode) -> list[cst.BaseElement] | None:
    """The target shape's elements of `x.reshape(a, b)`, `x.reshape((a, b))` or `jnp.reshape(x, (a, b))`."""
    if not isinstance(expr, cst.Call) or any(a.keyword is not None for a in expr.args):
      return None
    imported = any(q.source == QualifiedNameSource.IMPORT for q in self.get_metadata(QualifiedNameProvider, expr.func, set()))
    if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == 'reshape' and not imported:
      args = list(expr.args)
    elif self._has_name(expr.func, {'jax.numpy.reshape'}) and len(expr.args) == 2:
      args = list(expr.args[1:])
    else:
      return None
    if len(args) == 1 and isinstance(args[0].value, (cst.Tuple, cst.List)) and not args[0].star:
      return list(args[0].value.elements)
    if any(a.star == '**' for a in args):
      return None
    return [cst.StarredElement(a.value) if a.star else cst.Element(a.value) for a in args]

  # --- decode caches: init_cache ---------------------------------------------------------------

  def _plan_init_cache(self, node: cst.ClassDef, plan: _Plan, call: cst.FunctionDef, calls: dict[cst.Call, _Child],
                       taken: set[str]) -> None:
    """Whole shapes through `__call__` and, for a class with decode caches, the body of init_cache.

    A class whose `__call__` creates decode caches (`_decode_caches`) creates them in
    init_cache(input_shape, dtype) instead, from the shapes the code gives them in terms of the
    shape of its first input; a class with children holding decode caches (converted classes
    with an init_cache, table layers in decode mode) calls theirs with their inputs' shapes.
    Whatever the code does not fix keeps the class Linen.
    """
    inputs: dict[str, list[Shape]] = {}  # a child holding a cache -> the shapes init_cache takes, per call
    dtypes: dict[str, str | None] = {}
    own = {c.ctor: c for c in plan.children if c.cache}

    def shape(expr: cst.CSTNode, env: dict[str, Shape]) -> Shape:
      if isinstance(expr, cst.Name):
        return env.get(expr.value)
      if isinstance(expr, cst.Call) and expr in calls:
        return layer(expr, env)
      if isinstance(expr, cst.Call) and self._has_name(expr.func, ELEMENTWISE) \
          and len(expr.args) == 1 and expr.args[0].keyword is None and not expr.args[0].star:
        return shape(expr.args[0].value, env)
      if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, ARITHMETIC):
        left, right = shape(expr.left, env), shape(expr.right, env)
        return right if _is_number(expr.left) else left if _is_number(expr.right) else _broadcast_shape(left, right)
      for sub in expr.children:
        shape(sub, env)
      return self._reshaped(expr, env)

    def layer(node: cst.Call, env: dict[str, Shape]) -> Shape:
      child = calls[node]
      args = [shape(a.value, env) for a in node.args]
      if child.holds_cache:
        wanted = child.spec.cache.shape_args if child.spec is not None else (0,)
        position = next((p for p in (self._call_arg(node, child, i) for i in wanted) if p is not None), None)
        inputs.setdefault(child.attr, []).append(args[position] if position is not None else None)
      first = self._call_arg(node, child, 0) if not child.bridged else None
      source = args[first] if first is not None else None
      if source is None or child.wrapper is not None:
        return None
      return self._layer_shape(child, source) if child.spec is not None else self._sibling_shape(child, source)

    def dtype_of(value: cst.CSTNode) -> str | None:
      """The dtype of a layer's output: init_cache's dtype, unless the layer sets its own."""
      if isinstance(value, cst.Call) and value in calls and calls[value].spec is not None:
        kwargs = calls[value].kwargs
        if 'dtype' not in kwargs:
          return 'dtype'
        code = _paren(self._code(kwargs['dtype']))
        return f'dtype if {code} is None else {code}'
      return dtypes.get(value.value) if isinstance(value, cst.Name) else None

    def branch(statement: cst.If, env: dict[str, Shape]) -> None:
      for test in _tests(statement):
        shape(test, env)
      ends = []
      for arm in _arms(statement):
        ends.append((dict(env), dict(dtypes)))
        if arm is not None:
          walk(arm, ends[-1][0])
      for name in {name for end, _ in ends for name in end}:
        values = [end.get(name) for end, _ in ends]
        env[name] = values[0] if all(v == values[0] for v in values) else None
        dtypes[name] = None if env[name] is None else dtypes.get(name)

    def walk(body: cst.BaseSuite, env: dict[str, Shape]) -> Shape:
      output: Shape = None
      for statement in self._effective(body.body):
        if statement in self._branches:
          branch(statement, env)
          continue
        if statement in self._loops.loops:  # a for loop building layers: its first and later iterations
          self._loops.shapes(statement, env, walk)
          continue
        if not isinstance(statement, cst.SimpleStatementLine):  # other blocks: their calls learn nothing
          for sub in descendants(statement):
            if isinstance(sub, cst.Call) and sub in calls:
              layer(sub, {})
          _forget(statement, env)
          continue
        for part in statement.body:
          name = _assigned_name(cst.SimpleStatementLine([part]))
          if isinstance(part, cst.Return) and part.value is not None:
            output = shape(part.value, env)
          elif name is not None and part.value in own:  # a decode cache, made from what the code says so far
            self._cache_text(own[part.value], env, dtypes)
            env[name] = dtypes[name] = None
          elif name is not None:
            env[name], dtypes[name] = shape(part.value, env), dtype_of(part.value)
          elif isinstance(part, cst.AugAssign) and isinstance(part.target, cst.Name) \
              and type(part.operator).__name__.removesuffix('Assign') in {o.__name__ for o in ARITHMETIC}:
            value = shape(part.value, env)
            target = part.target.value
            env[target] = env.get(target) if _is_number(part.value) else _broadcast_shape(env.get(target), value)
          else:
            for sub in part.children:
              shape(sub, env)
            _forget(part, env)
      return output

    env: dict[str, Shape] = {plan.call_params[0]: INPUT_SHAPE} if plan.call_params else {}
    plan.output_shape = walk(call.body, env)
    if self._returns_in_branches(call):
      plan.output_shape = None
    holders = [c for c in plan.children if c.holds_cache]
    if not own and not holders:
      return
    if 'init_cache' in taken | {c.attr for c in plan.children}:
      raise _Unsupported(node, 'decode caches, and the class already has an attribute init_cache')
    if not plan.call_params:
      raise _Unsupported(node, 'decode caches, and __call__ takes no input whose shape init_cache could take')
    if {'input_shape', 'dtype'} & self._global_names:
      raise _Unsupported(node, "decode caches, and a module-level name input_shape or dtype that init_cache's "
                               'arguments would hide')
    self._jnp_bound(node)
    lines = []
    for child in plan.children:
      if child.cache:
        lines.append(f'self.{child.attr} = {child.cache_text}')
      elif child.holds_cache:
        shapes = inputs.get(child.attr, [])
        if not shapes:
          raise _Unsupported(child.ctor, f'self.{child.attr} holds a decode cache and __call__ does not call it: '
                                         'init_cache cannot derive the shape of its input')
        if any(s is None for s in shapes) or len(set(shapes)) != 1:
          raise _Unsupported(child.ctor, f'init_cache cannot derive the shape of the input of self.{child.attr}, '
                                         'which holds a decode cache: the code does not fix it')
        method = child.spec.cache.method if child.spec is not None else 'init_cache'
        lines.append(f'self.{child.attr}.{method}({_shape_code(shapes[0])}, dtype)')
        lines[-1] = self._loops.cache_line(child, lines[-1])  # an nnx.List: `for block in self.blocks: ...`
    plan.cache_lines, plan.cache_input = lines, plan.call_params[0]

  def _cache_text(self, child: _Child, env: dict[str, Shape], dtypes: dict[str, str | None]) -> None:
    """A decode cache's creation in init_cache: each `x.shape` / `x.dtype` of its arguments from what the code says of x."""
    replacements: dict[cst.CSTNode, str] = {}
    for arg in child.ctor.args[2:]:
      for sub in (arg.value, *descendants(arg.value)):
        if isinstance(sub, cst.Attribute) and isinstance(sub.value, cst.Name) and sub.attr.value in ('shape', 'dtype'):
          known = env.get(sub.value.value) if sub.attr.value == 'shape' else dtypes.get(sub.value.value)
          if known is not None:
            replacements[sub] = _shape_code(known) if sub.attr.value == 'shape' else known
    for arg in child.ctor.args[2:]:
      try:
        self._check_hoistable(arg.value, skip=set(replacements))
      except _Unsupported as error:
        raise _Unsupported(error.node, f'init_cache cannot derive the decode cache {child.linen_name}: '
                                       f'{self.module.code_for_node(error.node)} is not fixed by the code before it '
                                       '(only the .shape and .dtype of layer outputs and of the first input are)') from None
    child.size_codes = replacements
    child.cache_text = self._variable_text(child)

  def _layer_shape(self, child: _Child, source: tuple[str, ...]) -> Shape:
    """A table layer's output shape from its input's, per the row's `output_shape`."""
    out = child.spec.output_shape
    if out is None or any(k in child.kwargs for k in out.unless):
      return None
    lead, last = _split_last(source)
    for kwarg in out.trailing:
      if kwarg == SAME_AS_INPUT:
        trailing: tuple[str, ...] = (last,)
        break
      if kwarg in child.kwargs:
        value = child.kwargs[kwarg]
        if isinstance(value, (cst.Tuple, cst.List)) and out.tuple_ok:
          if any(isinstance(e, cst.StarredElement) for e in value.elements):
            return None
          trailing = tuple(self._code(e.value) for e in value.elements)
        elif out.tuple_ok and not isinstance(value, cst.Integer):
          return None  # an int or a tuple: the code does not say which
        else:
          trailing = (self._code(value),)
        break
    else:
      return None
    return _simplify((*(source if out.keep == 'all' else lead), *trailing))

  def _sibling_shape(self, child: _Child, source: tuple[str, ...]) -> Shape:
    """A same-file class's output shape, in the caller's terms."""
    out = child.sibling.output_shape
    if out is None:
      return None
    lead, last = _split_last(source)
    parts: list[str] = []
    for part in out:
      if part in ('*input_shape', '*input_shape[:-1]', 'input_shape[-1]'):
        parts += {'*input_shape': source, '*input_shape[:-1]': lead, 'input_shape[-1]': (last,)}[part]
        continue
      star = '*' if part.startswith('*') else ''
      code = None if 'input_shape' in part else self._in_caller(part[len(star):], child)
      if code is None:
        return None
      parts.append(star + code)
    return _simplify(tuple(parts))

  def _reshaped(self, expr: cst.CSTNode, env: dict[str, Shape]) -> Shape:
    """`y.reshape(*x.shape[:-1], n)` and the like: the shape, from what the code says of x."""
    elements = self._reshape_target(expr)
    if not elements:
      return None
    parts: list[str] = []
    for element in elements:
      value = element.value
      if isinstance(element, cst.StarredElement):
        sliced = isinstance(value, cst.Subscript) and len(value.slice) == 1 \
            and isinstance(value.slice[0].slice, cst.Slice) and value.slice[0].slice.lower is None \
            and value.slice[0].slice.step is None and value.slice[0].slice.upper is not None \
            and _is_minus_one(value.slice[0].slice.upper)
        base = value.value if sliced else value
        if not (isinstance(base, cst.Attribute) and isinstance(base.value, cst.Name) and base.attr.value == 'shape'):
          return None
        known = env.get(base.value.value)
        if known is None:
          return None
        parts += _split_last(known)[0] if sliced else known
        continue
      if _is_minus_one(value):
        return None
      try:
        self._check_hoistable(value)
      except _Unsupported:
        return None
      parts.append(self._code(value))
    return _simplify(tuple(parts))

  def _jnp_bound(self, node: cst.ClassDef) -> bool:
    """Whether `jnp` is `jax.numpy` here (False: unbound, the import is added); raises when it is something else."""
    scope = self.get_metadata(ScopeProvider, node, None)
    names = {qn.name for a in scope['jnp'] for qn in a.get_qualified_names_for('jnp')} if scope is not None else set()
    if names - {'jax.numpy'}:
      raise _Unsupported(node, "decode caches, and the name jnp (init_cache's default dtype is jnp.float32) is "
                               'bound to something else here')
    return bool(names)

  def _init_cache(self, plan: _Plan) -> cst.FunctionDef:
    source = (
        'def init_cache(self, input_shape: tuple[int, ...], dtype=jnp.float32):\n'
        f'  """Creates the decode caches as Linen\'s init did for `{plan.cache_input}` of shape input_shape (full length)."""\n'
        + ''.join(f'  {line}\n' for line in plan.cache_lines)
    )
    return cst.parse_statement(source)

  def _effective(self, statements: tp.Sequence[cst.BaseStatement]) -> tp.Iterator[cst.BaseStatement]:
    """The statements that run in NNX: `if [not] self.is_initializing():` blocks resolved."""
    for statement in statements:
      if statement in self._ifs:
        if self._ifs[statement]:
          yield from self._effective(statement.body.body)
      else:
        yield statement

  def _own_method(self, expr: cst.CSTNode, methods: dict[str, cst.FunctionDef]) -> cst.FunctionDef | None:
    """The method of this class that `expr` (`self.<method>(...)`) calls, if any."""
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and _is_self_attr(expr.func):
      method = methods.get(expr.func.attr.value)
      if method is not None and method.name.value != 'setup' \
          and all(self._has_name(d.decorator, COMPACT_NAMES) for d in method.decorators):
        return method
    return None

  def _size_param(self, plan: _Plan, child: _Child, nnx_arg: str, where: str | None, source: Dim,
                  node: cst.CSTNode, shape_ref: bool = False, input_index: int | None = None) -> str:
    """A new keyword-only constructor argument for a size the code does not determine, unless the example
    trace (`--examples`) found one expression of the class's fields for it: then that expression. `shape_ref`:
    an `x.shape[-1]` the child's arguments read, rather than an input size of the child."""
    traced = self._traced.get((child.linen_name, nnx_arg)) \
        if child.api is None and child.spec is not None and not shape_ref else None
    if child.sibling is not None and input_index is not None:  # a class of the file: the input it is called with
      traced = self._traced.get((child.linen_name, f'input:{input_index}'))
    if traced is not None and traced.expression is not None:
      self._traced_codes.add(traced.expression)
      self._pending.append((node, f'{nnx_arg} of self.{child.attr} = {traced.expression}, from the example trace: '
                                  f'{traced.describe()}'))
      return traced.expression
    name = f'{child.attr}_{nnx_arg}'
    while name in plan.field_names or name in {p for p, _ in plan.size_params} or name == 'rngs':
      name += '_'
    plan.size_params.append((name, source))
    input_name = plan.call_params[source[1]] if source is not None and source[0] == 'input' else None
    if child.api or shape_ref:  # an `x.shape[-1]` in a variable's shape: measurable when x is a call argument
      origin = INPUT_DIMENSION if input_name else UNDETERMINED
      read = 'the shape' if child.api else 'the arguments'
      detail = f'{where}, in {read} of self.{child.attr}' + ('' if input_name else ', not determined by the code')
      argument = ConstructorArgument(name, origin, detail, child.attr, input=input_name)
    else:
      origin = UNDETERMINED if where is None else INPUT_DIMENSION
      if where is None:
        where = f'not determined by the code of __call__ (pass what self.{child.attr} needs)'
      detail = f'{nnx_arg} of self.{child.attr}, {where}' + (f' ({traced.describe()})' if traced else '')
      argument = ConstructorArgument(name, origin, detail, child.attr, child_argument=nnx_arg, input=input_name)
    plan.size_arguments.append(argument)
    self._pending.append((node, f'new constructor argument {name}: {detail}'))
    return name

  def _size_sources(self, child: _Child) -> list[tuple[str, int, bool]]:
    """(NNX argument, call-argument index or -1, optional) for each size NNX needs up front."""
    if child.bridged:  # initialised from example inputs instead
      return []
    if child.sibling is not None:
      return [(name, source[1] if source and source[0] == 'input' else -1, False)
              for name, source in child.sibling.size_params]
    if child.wrapper is not None:  # the cell's sizes, read off the wrapper's inputs
      feeds = dict(child.wrapper.cell_inputs)
      sources = []
      for nnx_arg, index, optional in self._size_sources(child.cell):
        if index not in feeds:
          raise _Unsupported(child.ctor, f'{nnx_arg} of {child.cell.spec.nnx} comes from a cell input '
                                         f'{child.wrapper.linen} does not feed')
        sources.append((nnx_arg, feeds[index], optional))
      return sources
    sources = []
    for nnx_arg, source in child.spec.derived:
      if isinstance(source, InputDim) and source.axis == -1:
        sources.append((nnx_arg, source.arg, source.optional))
      elif isinstance(source, InputDimsAt) and source.axes_kwarg in child.kwargs:
        raise _Unsupported(child.ctor, f'{nnx_arg} of {child.spec.nnx} from {source.axes_kwarg}= is not derived yet')
      elif isinstance(source, InputDimsAt) and not source.as_mapping and source.default == -1:
        sources.append((nnx_arg, source.arg, False))
      elif not (isinstance(source, InputDimsAt) and source.as_mapping and not source.default):
        raise _Unsupported(child.ctor, f'{nnx_arg} of {child.spec.nnx} is not derived yet')
    return sources

  def _call_arg(self, call: cst.Call, child: _Child, index: int) -> int | None:
    """The position in `call.args` of the call argument `index`, by position or by name."""
    if index < 0:
      return None
    names = (child.spec or child.wrapper).call_args if child.spec or child.wrapper else child.sibling.call_params
    for position, arg in enumerate(call.args):
      if arg.keyword is None and position == index:
        return position
      if arg.keyword is not None and index < len(names) and arg.keyword.value == names[index]:
        return position
    return None

  def _output(self, child: _Child, arg_dims: list[Dim]) -> Dim:
    """The last-axis size of a child's output, from the layer table or a converted sibling class."""
    first = arg_dims[0] if arg_dims else None

    def known(node: cst.CSTNode) -> Dim:  # an input size read in the arguments is what the code said of it
      return child.ref_dims.get(node) if node in child.shape_refs else ('known', self._code(node, child.size_codes))
    if child.wrapper is not None:  # the cell's features, unless it returns the carry too
      size = child.cell.kwargs.get(child.wrapper.output_size)
      if size is None or any(k in child.kwargs for k in child.wrapper.output_unless):
        return None
      return ('known', self._code(size))
    if child.spec is None:
      return self._sibling_output(child, arg_dims)
    size = child.spec.output_size
    if size == SAME_AS_INPUT:
      return first
    if size is not None and size in child.kwargs:
      return known(child.kwargs[size])
    out = child.spec.output_shape  # else the last of the trailing axes the whole output shape has
    if size is not None or out is None or any(k in child.kwargs for k in out.unless):
      return None
    kwarg = next((k for k in out.trailing if k == SAME_AS_INPUT or k in child.kwargs), None)
    value = child.kwargs.get(kwarg)
    if kwarg == SAME_AS_INPUT:
      return first
    if isinstance(value, (cst.Tuple, cst.List)) and out.tuple_ok and value.elements \
        and not isinstance(value.elements[-1], cst.StarredElement):
      return known(value.elements[-1].value)
    if value is not None and (not out.tuple_ok or isinstance(value, cst.Integer)):
      return known(value)
    return None

  def _sibling_output(self, child: _Child, arg_dims: list[Dim]) -> Dim:
    """A same-file class's output size, in the caller's terms: one of its fields, or an input."""
    output = child.sibling.output if child.sibling is not None else None
    if output is None:
      return None
    if output[0] == 'input':
      return arg_dims[output[1]] if output[1] < len(arg_dims) else None
    code = self._in_caller(output[1], child)
    return None if code is None else ('known', code)

  def _in_caller(self, code: str, child: _Child) -> str | None:
    """Code of a same-file class (`self.heads * self.dim`) in the terms of the class that builds it
    as `child`: each `self.<field>` replaced by the argument passed for it; None when one is not passed."""
    fields, missing = child.sibling.field_names, []

    class Fields(cst.CSTTransformer):
      def leave_Attribute(_, original: cst.Attribute, updated: cst.BaseExpression) -> cst.BaseExpression:
        if _is_self_attr(original):
          name = original.attr.value
          if name in fields and name in child.kwargs:
            return cst.parse_expression(_paren(self._code(child.kwargs[name])))
          missing.append(name)
        return updated

    try:
      original = cst.parse_expression(code)
    except cst.ParserSyntaxError:
      return None
    nodes = (original, *descendants(original))
    arguments = {name for name, _ in child.sibling.size_params}
    if any(isinstance(n, cst.Name) and n.value in arguments for n in nodes):
      return None  # a size argument of the class (`self.mlp_dim or 4 * linear1_in_features`): not the caller's
    selves = [n for n in nodes if isinstance(n, cst.Name) and n.value == 'self']
    if len(selves) != len([n for n in nodes if isinstance(n, cst.Attribute) and _is_self_attr(n)]):
      return None  # `self` used other than as `self.<field>`
    node = original.visit(Fields())
    return None if missing else cst.Module([]).code_for_node(node)

  def _switch(self, value: cst.BaseExpression, inverted: bool) -> bool | None:
    """Checks that `value` is a __call__ train/eval switch (or its negation) meaning the same as the target.

    Returns the target's value when the switch keeps its default (a literal bool), else None.
    """
    negated = isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Not)
    name = value.expression if negated else value
    if isinstance(name, cst.Attribute) and _is_self_attr(name) and name.attr.value in self._field_switches \
        and negated ^ inverted == self._field_switches[name.attr.value]:
      self._mode_uses.add(name)  # `deterministic=not self.training`, a train/eval field
      return None
    if not (isinstance(name, cst.Name) and name.value in self._switches and negated ^ inverted == self._switches[name.value]):
      raise _Unsupported(value, 'a train/eval argument that is not a matching __call__ switch or train/eval field')
    self._mode_uses.add(name)
    default = self._switch_defaults.get(name.value)
    return None if default is None else default ^ negated

  def _linen_call_params(self, name: str) -> list[cst.Param]:
    """The `__call__` parameters (after self) of the Linen class `name` of this file."""
    body = self._class_defs[name].body.body
    call = next((s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == '__call__'), None)
    return list(call.params.params[1:]) if call is not None else []

  def _ctor_modes(self, child: _Child) -> None:
    """Drops the constructor's train/eval kwargs (a layer's, a train/eval field of a class of the file), which
    NNX's train()/eval() set."""
    for key in [k for k in child.kwargs if child.spec is not None and k in LAYER_MODE_KWARGS]:
      self._mode_default(child, key, self._switch(child.kwargs.pop(key), False))
    if child.sibling is not None:
      for name, inverted in child.sibling.mode_fields.items():
        if name not in child.kwargs:
          raise _Unsupported(child.ctor, f'the train/eval field {name} of {child.sibling.name} is not given')
        self._switch(child.kwargs.pop(name), inverted)

  def _mode_default(self, child: _Child, attribute: str, value: bool | None) -> None:
    """A layer fed by a switch with a default starts in that mode, as the Linen call without it did."""
    if value is not None and child.spec is not None:
      child.mode_defaults[attribute] = value

  def _call_modes(self, call: cst.Call, child: _Child) -> set[int]:
    """Checks a child call's train/eval arguments; returns the positions to drop."""
    if child.bridged:  # a switch given to a Linen train/eval argument: the wrapper's train()/eval() set it
      target = self._kept_target(child.ctor.func) or child.ctor.func.value
      names = [p.name.value for p in self._linen_call_params(target)]
      dropped = set()
      for position, arg in enumerate(call.args):
        name = arg.keyword.value if arg.keyword is not None else names[position] if position < len(names) else None
        if name not in MODE_PARAMS:
          continue
        try:
          default = self._switch(arg.value, MODE_PARAMS[name])
        except _Unsupported:  # a literal or other value: passed on to the Linen call as written
          continue
        dropped.add(position)
        if default is not None:  # the wrapper starts in the mode the switch's default gave
          child.mode_defaults['eval_mode'] = default ^ MODE_PARAMS[name]
      return dropped
    if child.wrapper is not None:
      wrapper = child.wrapper
      if len([a for a in call.args if a.keyword is None]) > len(wrapper.call_args):
        raise _Unsupported(call, 'positional arguments beyond the layer inputs')
      for arg in call.args:
        if arg.keyword is not None and arg.keyword.value in wrapper.linen_only_call:
          raise _Unsupported(arg, f'{arg.keyword.value}= of a {wrapper.linen} call has no NNX counterpart')
      return set()
    if child.spec is not None:
      if len([a for a in call.args if a.keyword is None]) > len(child.spec.call_args):
        raise _Unsupported(call, 'positional arguments beyond the layer inputs')
      targets = {name: False for name in LAYER_MODE_KWARGS}
    else:
      targets = {}
      for index, name, inverted in child.sibling.mode_params:
        targets[index] = targets[name] = inverted
    dropped, seen = set(), set()
    for position, arg in enumerate(call.args):
      key = arg.keyword.value if arg.keyword is not None else position
      if key in targets:
        default = self._switch(arg.value, targets[key])
        if child.spec is not None:
          self._mode_default(child, key, default)
        dropped.add(position)
        seen.add(key)
    if child.sibling is not None and any(i not in seen and n not in seen for i, n, _ in child.sibling.mode_params):
      raise _Unsupported(call, f'a train/eval argument of {child.sibling.name} left to its default')
    return dropped

  def _ctor_text(self, child: _Child) -> str:
    """The NNX constructor call of `child`, as code valid in __init__."""
    code = lambda node: self._code(node, child.size_codes)
    if child.bridged:
      mode = ', eval_mode=True' if child.mode_defaults.get('eval_mode') else ''
      return f'nnx_bridge.from_linen({code(child.ctor)}, *{child.attr}_example_inputs, rngs=rngs{mode})'
    if child.wrapper is not None:
      wrapper = child.wrapper
      child.cell.sizes = child.sizes
      accepted, only = nnx_arguments(wrapper.nnx), {k.name for k in wrapper.linen_only}
      args = [self._ctor_text(child.cell)]
      for name, value in child.kwargs.items():
        if name in only or name not in accepted:
          raise _Unsupported(value, f'{name}= of {wrapper.linen} has no NNX counterpart to pass it to')
        args.append(f'{name}={code(value)}')
      args += ['rngs=rngs'] if wrapper.rngs else []
      return f'nnx.{wrapper.nnx.rpartition(".")[2]}({", ".join(args)})'
    if child.sibling is not None:
      fields = child.sibling.field_names
      args = [code(v) if i < len(fields) and f == fields[i] else f'{f}={code(v)}'
              for i, (f, v) in enumerate(child.kwargs.items())]
      args += [f'{k}={v}' for k, v in child.sizes.items()]
      built = f'{self._factories.callee.get(child.ctor, child.sibling.name)}({", ".join([*args, "rngs=rngs"])})'
      if child.stacked is not None:  # one layer per split key, variables stacked on axis 0
        metadata = f', transform_metadata={child.stacked.metadata}' if child.stacked.metadata else ''
        return f'nnx.vmap(lambda rngs: {built}{metadata})(rngs.split({child.stacked.length}))'
      return built
    spec = child.spec
    renames, accepted = dict(spec.arg_renames), nnx_arguments(spec.nnx)
    only = {k.name for k in spec.linen_only}
    args = [f'{k}={v}' for k, v in child.sizes.items()]
    for name, value in child.kwargs.items():
      new = renames.get(name, name)
      if name in only or new not in accepted:
        raise _Unsupported(value, f'{name}= of {spec.linen} has no NNX counterpart to pass it to')
      args.append(f'{new}={code(value)}')
    callee = self._factories.callee.get(child.ctor)  # a factory: its partial holds the Linen defaults
    args += [f'{k}={v!r}' for k, v in spec.linen_defaults if k not in child.kwargs and callee is None]
    args += [f'{k}={v!r}' for k, v in child.mode_defaults.items() if k in accepted]
    return f'{callee or "nnx." + spec.nnx.rpartition(".")[2]}({", ".join([*args, "rngs=rngs"])})'

  def _variable_text(self, child: _Child) -> str:
    """`nnx.Param(init(rngs.params(), *args))` / `<Type>(init(*args))`, as code valid in __init__."""
    lead = 2 if child.api == 'param' else 3
    init, rest = child.ctor.args[lead - 1].value, child.ctor.args[lead:]
    code = lambda node: self._code(node, child.size_codes)
    args = [f'{a.keyword.value}={code(a.value)}' if a.keyword else code(a.value) for a in rest]
    if child.api == 'param':
      return f'nnx.Param({code(init)}({", ".join(["rngs.params()", *args])}))'
    if isinstance(init, cst.Lambda):
      if not args and init.params.deep_equals(cst.Parameters()):
        return f'{child.var_type}({code(init.body)})'
      return f'{child.var_type}(({code(init)})({", ".join(args)}))'
    return f'{child.var_type}({code(init)}({", ".join(args)}))'

  # --- helpers ---------------------------------------------------------------------------------

  def _constructed(self, call: cst.Call) -> tuple[str, LayerSpec | None, _Plan | None] | None:
    factory = self._factories.constructed(call)  # `self.conv(...)` of a ModuleDef field, `conv(...)` of a factory
    if factory is not None:
      return factory
    partial = self._partial_of(call.func) if isinstance(call.func, cst.Name) else None
    if partial is not None:  # `conv = partial(nn.Conv, use_bias=False)`, then `conv(features, ...)(x)`
      self._partials[call] = partial
    func = partial.args[0].value if partial is not None else call.func
    lifted = self._lifted_alias(call.func) if isinstance(call.func, cst.Name) else call.func
    scanned = self._scanned_class(lifted, call) if isinstance(lifted, cst.Call) else None
    if scanned is not None:
      sibling = self._plans.get(scanned)
      if sibling is None:
        raise _Unsupported(call, f'{scanned} is a Linen module that was not converted')
      return scanned, None, sibling
    rematted = self._rematted_class(call.func) if isinstance(call.func, cst.Call) else None
    if rematted is not None:
      sibling = self._plans.get(rematted)
      if sibling is None:
        raise _Unsupported(call, f'{rematted} is a Linen module that was not converted')
      return rematted, None, sibling
    if isinstance(func, cst.Name) and func.value in self._linen_classes:
      return func.value, None, self._plans.get(func.value)  # no plan: a Linen class, bridged
    kept = self._kept_target(func)
    if kept is not None:
      return kept, None, None
    if not isinstance(func, (cst.Name, cst.Attribute)):
      return None
    for qualified in self.get_metadata(QualifiedNameProvider, func, set()):
      spec = find_layer(qualified.name)
      if spec is not None and spec.nnx is not None:
        return spec.linen, spec, None
      wrapper = find_wrapper(qualified.name)
      if wrapper is not None:
        return wrapper.linen, None, None
    return None

  def _lifted_class(self, call: cst.Call, names: tp.Collection[str]) -> list[cst.BaseExpression] | None:
    """The positional arguments of `nn.scan(Cell, ...)` / `nn.remat(Block, ...)` (one of `names`) when they are
    exactly one Linen class of this file; None for any other call."""
    if not self._has_name(call.func, names):
      return None
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    if len(positional) != 1 or not isinstance(positional[0], cst.Name) \
        or positional[0].value not in self._linen_classes:
      return None
    return positional

  def _partial_of(self, name: cst.Name) -> cst.Call | None:
    """The `functools.partial(<layer or class>, ...)` bound to `name` by the one statement `name = partial(...)`
    of the method, every use of `name` a call: the statement goes, each call is a construction with the partial's
    arguments first. None for other names."""
    bound = self._local_call(name, PARTIAL_NAMES)
    if bound is None:
      return None
    line, assignment, value = bound
    if not value.args or value.args[0].keyword is not None or any(a.star for a in value.args):
      return None
    for reference in assignment.references:
      use = reference.node
      if not (isinstance(self._parent(use), cst.Call) and self._parent(use).func is use):
        raise _Unsupported(use, f'the partial {name.value} used other than by calling it')
    self._removed.add(line)
    self._lifted.update((value.func, value.args[0].value))  # its arguments are converted with each construction
    return value

  def _local_call(self, name: cst.Name, funcs: tp.Collection[str]
                  ) -> tuple[cst.SimpleStatementLine, cst.metadata.Assignment, cst.Call] | None:
    """The statement `name = f(...)` binding a function-scope local once, with `f` one of `funcs`: the statement,
    the local's assignment and the call; None otherwise."""
    scope = self.get_metadata(ScopeProvider, name, None)
    if scope is None or isinstance(scope, (cst.metadata.GlobalScope, cst.metadata.BuiltinScope)):
      return None
    assignments = list(scope[name.value])
    if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
      return None
    target = self._parent(assignments[0].node)
    assign = self._parent(target) if isinstance(target, cst.AssignTarget) else None
    line = self._parent(assign) if isinstance(assign, cst.Assign) else None
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and len(assign.targets) == 1
            and isinstance(assign.value, cst.Call) and isinstance(assign.value.func, (cst.Name, cst.Attribute))
            and self._has_name(assign.value.func, funcs)):
      return None
    return line, assignments[0], assign.value

  def _kept_target(self, func: cst.CSTNode) -> str | None:
    """`Block` for `nn.map_variables(Block, ...)`: a Linen function over a class kept as Linen."""
    if isinstance(func, cst.Call) and isinstance(func.func, (cst.Name, cst.Attribute)) and self._is_linen_name(func.func):
      return next((a.value.value for a in func.args if a.keyword is None and isinstance(a.value, cst.Name)
                   and a.value.value in self._kept_linen), None)
    return None

  def _lifted_alias(self, name: cst.Name) -> cst.Call | None:
    """The `nn.scan(...)` call bound to `name` by the one statement `ScanBlock = nn.scan(...)` of the method, which
    goes (its construction holds the conversion); None for other names."""
    bound = self._local_call(name, SCAN_NAMES | VMAP_NAMES) if name.value not in self._linen_classes else None
    if bound is None:
      return None
    line, assignment, value = bound
    if [r.node for r in assignment.references] != [name]:
      raise _Unsupported(value, f'{name.value} = nn.scan(...) used other than to build one submodule')
    self._removed.add(line)
    self._lifted.add(value)
    return value

  def _unremat(self, node: cst.CSTNode) -> cst.CSTNode:
    """`Block` for `nn.remat(Block, ...)`; `node` itself otherwise."""
    if isinstance(node, cst.Call) and self._has_name(node.func, REMAT_NAMES) and node.args:
      return node.args[0].value
    return node

  def _scanned_class(self, scan: cst.Call, ctor: cst.Call) -> str | None:
    """`Cell` for `nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False}, in_axes=1, out_axes=1)`
    over a Linen class of this file, recording its axes; `Block` for a scan over layers (`variable_axes`) or an
    nn.vmap ensemble (see _stacked_class); None for any other call. Other options over such a class: a TODO."""
    kwargs = {a.keyword.value: a.value for a in scan.args if a.keyword is not None}
    if 'variable_axes' in kwargs and self._has_name(scan.func, SCAN_NAMES):
      return self._stacked_class(scan, ctor, kwargs, 'scan')
    if self._has_name(scan.func, VMAP_NAMES) and isinstance(scan.func, (cst.Name, cst.Attribute)):
      return self._stacked_class(scan, ctor, kwargs, 'vmap')
    positional = self._lifted_class(scan, SCAN_NAMES)
    if positional is None:
      return None
    code = lambda key: self.module.code_for_node(kwargs[key]) if key in kwargs else None
    broadcast, split = kwargs.get('variable_broadcast'), kwargs.get('split_rngs')
    axes = [kwargs.get('in_axes'), kwargs.get('out_axes')]
    if any(a.star for a in scan.args) or set(kwargs) != {'variable_broadcast', 'split_rngs', 'in_axes', 'out_axes'} \
        or not (isinstance(broadcast, cst.SimpleString) and broadcast.evaluated_value == 'params') \
        or not (isinstance(split, cst.Dict) and len(split.elements) == 1
                and isinstance(split.elements[0], cst.DictElement)
                and isinstance(split.elements[0].key, cst.SimpleString)
                and split.elements[0].key.evaluated_value == 'params'
                and isinstance(split.elements[0].value, cst.Name) and split.elements[0].value.value == 'False') \
        or not all(isinstance(a, cst.Integer) for a in axes):
      given = ', '.join(f'{k}={code(k)}' for k in kwargs)
      raise _Unsupported(scan, f'nn.scan({positional[0].value}, {given}) is converted only as {SCAN_PATTERN} '
                               '(parameters shared by every step: nnx.scan over the cell), or over layers')
    self._scans[ctor] = (int(axes[0].value), int(axes[1].value))
    return positional[0].value

  def _stacked_class(self, lifted: cst.Call, ctor: cst.Call, kwargs: dict[str, cst.BaseExpression],
                     transform: str) -> str:
    """`Block` for `nn.scan(Block or nn.remat(Block, ...), variable_axes={'params': 0, ...}, split_rngs={'params':
    True, ...}, length=n, in_axes=..., out_axes=..., metadata_params=...)` (scan over layers) or the same nn.vmap
    with axis_size=n (an ensemble): copies created by nnx.vmap over split rngs in __init__ (the same stacked
    layout), run by nnx.scan / nnx.vmap; records the options."""
    given = ', '.join(f'{k}={self.module.code_for_node(v)}' for k, v in kwargs.items())
    positional = [a.value for a in lifted.args if a.keyword is None]
    target = self._unremat(positional[0]) if len(positional) == 1 else None
    if not (isinstance(target, cst.Name) and target.value in self._linen_classes):
      raise _Unsupported(lifted, f'nn.{transform} of something other than a Linen class of this file (or nn.remat of '
                                 'one)')
    sibling = self._plans.get(target.value)
    if sibling is None:
      raise _Unsupported(ctor, f'{target.value} is a Linen module that was not converted')
    options = STACK_OPTIONS[transform]
    stop = f'nn.{transform}({target.value}, {given}) is converted only '
    if any(a.star for a in lifted.args) or set(kwargs) - set(options):
      raise _Unsupported(lifted, stop + f'with the options {", ".join(options)}')
    axes = self._literal_dict(kwargs.get('variable_axes', cst.Dict([])))
    if axes is None or 'params' not in axes or not all(isinstance(v, cst.Integer) and v.value == '0' for v in axes.values()):
      raise _Unsupported(lifted, stop + "with variable_axes of literal collections stacked on axis 0, 'params' among "
                                        'them')
    split = self._literal_dict(kwargs.get('split_rngs', cst.Dict([])))
    if split is None or not all(isinstance(v, cst.Name) and v.value in ('True', 'False') for v in split.values()) \
        or not (isinstance(split.get('params'), cst.Name) and split['params'].value == 'True'):
      raise _Unsupported(lifted, stop + "with split_rngs={'params': True, ...} (each copy initialised from its own key)")
    if options[0] not in kwargs:
      raise _Unsupported(lifted, stop + f'with {options[0]}= (nnx.vmap creates that many copies in __init__)')
    for key in (options[0], 'metadata_params', 'axis_name'):  # moved into __init__ / the NNX call
      if key in kwargs:
        self._check_hoistable(kwargs[key])
    scan = transform == 'scan'
    mode_positions = {i + 1 for i, _, _ in sibling.mode_params}  # Linen's numbering: self is 0
    count = len(sibling.call_params) - scan
    in_axes = kwargs.get('in_axes', cst.Integer('0'))
    entries = [e.value for e in in_axes.elements] if isinstance(in_axes, cst.Tuple) else [in_axes] * count
    if len(entries) != count or not all(
        isinstance(e, cst.Integer) and e.value == '0' or self._has_name(e, BROADCAST_NAMES)
        or isinstance(e, cst.Name) and e.value == 'None' for e in entries):
      raise _Unsupported(lifted, stop + f'with in_axes of 0 or {"nn.broadcast" if scan else "None"} for each of the '
                                        f'{count} inputs{" after the carry" if scan else ""}')
    out_axes = kwargs.get('out_axes', cst.Integer('0'))
    if not isinstance(out_axes, cst.Integer):
      raise _Unsupported(lifted, stop + 'with an int out_axes')
    metadata = None
    if 'metadata_params' in kwargs:
      keys = [e.key for e in getattr(kwargs['metadata_params'], 'elements', ()) if isinstance(e, cst.DictElement)]
      metadata = self._code(kwargs['metadata_params'], {key: self._nnx_name_for(key) for key in keys
                                                        if self._nnx_name_for(key) is not None})
    remat = None if positional[0] is target else self._wrapping_options(positional[0], sibling, 'remat', under=transform)
    self._stacks[ctor] = _Stacked(
        transform, self._code(kwargs[options[0]]),
        tuple('0' if isinstance(e, cst.Integer) else 'None'
              for i, e in enumerate(entries, start=1 + scan) if i not in mode_positions),
        out_axes.value, remat[1] if remat else None, metadata,
        self._code(kwargs['axis_name']) if 'axis_name' in kwargs else None,
        tuple(sorted(s for s, v in split.items() if v.value == 'True')))
    return target.value

  def _plan_control_flow(self, node: cst.ClassDef) -> set[cst.CSTNode]:
    """`nn.cond(pred, f, g, self, *xs)` / `nn.switch(i, branches, self, *xs)` -> nnx.cond / nnx.switch with the
    same arguments (each branch gets the module, as in Linen); `nn.while_loop(cond_fn, body_fn, self, init)` ->
    nnx.while_loop over `(self, init)`. Returns the Linen names converted."""
    converted = set()
    for call in descendants(node):
      if not (isinstance(call, cst.Call) and isinstance(call.func, (cst.Name, cst.Attribute))):
        continue
      names = {q.name for q in self.get_metadata(QualifiedNameProvider, call.func, set())}
      kind = next((CONTROL_FLOW[n] for n in names if n in CONTROL_FLOW), None)
      if kind is None:
        continue
      target, at = kind
      func = self.module.code_for_node(call.func)
      positional = [a.value for a in call.args if a.keyword is None and not a.star]
      options = {a.keyword.value for a in call.args if a.keyword is not None}
      loop = target == 'nnx.while_loop'
      if any(a.star for a in call.args) or options - set(WHILE_OPTIONS if loop else ()) \
          or len(positional) <= at or (loop and len(positional) != 4) \
          or not (isinstance(positional[at], cst.Name) and positional[at].value == 'self'):
        accepted = f' (and {", ".join(WHILE_OPTIONS)}, which NNX does not need)' if loop else ''
        raise _Unsupported(call, f'{func}(...) is converted with its arguments by position, self as the module'
                                 f'{accepted}')
      for branch in positional[1:at]:
        self._check_branch(branch, func)
      if loop:
        self._while_loops.add(call)
        dropped = f'; {", ".join(sorted(options))} dropped (NNX carries every Variable)' if options else ''
        self._pending.append((call, f'{func}(cond_fn, body_fn, self, init) -> nnx.while_loop over (self, init), '
                                    f'the functions still given the module{dropped}'))
      else:
        self._exprs[call.func] = target
        self._pending.append((call, f'{func}(...) -> {target}(...): the same arguments, each branch given the module'))
      converted.add(call.func)
    return converted

  def _check_branch(self, branch: cst.BaseExpression, func: str) -> None:
    """A branch of lifted control flow: a lambda or function (or a list of them) that uses its module argument
    only through attributes other than Linen's scope APIs, and no Linen name outside this class."""
    if isinstance(branch, (cst.List, cst.Tuple)):
      for element in branch.elements:
        self._check_branch(element.value, func)
      return
    function = branch
    if isinstance(branch, cst.Name):
      scope = self.get_metadata(ScopeProvider, branch, None)
      assignments = list(scope[branch.value]) if scope is not None else []
      if len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment):
        raise _Unsupported(branch, f'a {func} branch bound more than once, or not in this file')
      function = assignments[0].node
      target = self._parent(function)
      assign = self._parent(target) if isinstance(target, cst.AssignTarget) else None
      if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
        return self._check_branch(assign.value, func)
      if not isinstance(function, cst.FunctionDef):
        raise _Unsupported(branch, f'a {func} branch that is not a function of this file')
      if isinstance(self._parent(function), cst.Module) and any(
          self._nnx_name_for_or_none(sub) is None and self._is_linen_name(sub) for sub in descendants(function)):
        raise _Unsupported(branch, f'the {func} branch {branch.value} (outside the class) uses Linen names')
    if not isinstance(function, (cst.Lambda, cst.FunctionDef)) or not function.params.params:
      raise _Unsupported(branch, f'a {func} branch other than a lambda or function taking the module first')
    module = function.params.params[0].name.value
    for sub in descendants(function.body):
      if isinstance(sub, cst.Attribute) and isinstance(sub.value, cst.Name) and sub.value.value == module \
          and sub.attr.value in SCOPE_APIS:
        raise _Unsupported(sub, f'{module}.{sub.attr.value} in a {func} branch (variables created or read through '
                                'Linen scope APIs)')

  def _is_linen_name(self, node: cst.CSTNode) -> bool:
    return isinstance(node, (cst.Name, cst.Attribute)) and any(
        q.name == 'flax.linen' or q.name.startswith('flax.linen.')
        for q in self.get_metadata(QualifiedNameProvider, node, set()))

  def _nnx_name_for_or_none(self, node: cst.CSTNode) -> str | None:
    try:
      return self._nnx_name_for(node)
    except _Unsupported:
      return None

  def _literal_dict(self, node: cst.BaseExpression) -> dict[str, cst.BaseExpression] | None:
    """`{'params': 0}` as a dict of its string keys; None for anything else."""
    if not isinstance(node, cst.Dict) or not all(
        isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString) for e in node.elements):
      return None
    return {e.key.evaluated_value: e.value for e in node.elements}

  def _rematted_class(self, lifted: cst.Call) -> str | None:
    """`Block` for `nn.remat(Block, prevent_cse=..., policy=..., static_argnums=<int or tuple of ints>)` (or
    nn.checkpoint), or `nn.jit(Block, static_argnums=..., donate_argnums=...)`, over a Linen class of this file,
    recording the NNX transform and its options; None for any other call. Other options (`variables=`, `rngs=`,
    `concrete=`, `methods=`, ...): a TODO."""
    for kind, (names, transform, _, _) in WRAPPING.items():
      positional = self._lifted_class(lifted, names)
      if positional is None:
        continue
      sibling = self._plans.get(positional[0].value)
      options = self._wrapping_options(lifted, sibling, kind) if sibling is not None else None
      outer = self._parent(lifted)
      if options is not None and isinstance(outer, cst.Call) and outer.func is lifted:
        self._remats[outer] = options
      return positional[0].value
    return None

  def _wrapping_options(self, lifted: cst.Call, sibling: _Plan, kind: str, under: str = '') -> tuple[str, str]:
    """The NNX transform (`nnx.remat`) and its options for `nn.remat(Block, ...)` / `nn.jit(Block, ...)`,
    static_argnums renumbered for the train/eval arguments the NNX call drops. Linen counts `self` as argument 0
    of __call__, as the NNX transform counts the module given first: otherwise the same numbers. `under` an
    nnx.scan / nnx.vmap, no static argument may remain (traced there)."""
    _, transform, accepted, _ = WRAPPING[kind]
    kwargs = {a.keyword.value: a.value for a in lifted.args if a.keyword is not None}
    func, name = self.module.code_for_node(lifted.func), sibling.name
    given = ', '.join(f'{k}={self.module.code_for_node(v)}' for k, v in kwargs.items())
    numbers = {k: self._literal_ints(v) for k, v in kwargs.items() if k.endswith('argnums')}
    if any(a.star for a in lifted.args) or set(kwargs) - set(accepted) or None in numbers.values():
      raise _Unsupported(lifted, f'{func}({name}, {given}) is converted only with the options '
                                 f'{", ".join(accepted)} (argnums literal), which {transform} takes')
    for value in kwargs.values():
      self._check_hoistable(value)
    codes = {k: self._code(kwargs[k], {}) for k in accepted if k in kwargs}
    modes = {i + 1 for i, _, _ in sibling.mode_params}
    for key, given_numbers in numbers.items():
      kept = [n - sum(m < n for m in modes) for n in given_numbers if n not in modes]
      if under and kept and key == 'static_argnums':
        raise _Unsupported(lifted, f'{func}({name}, {given}) under nn.{under}: static arguments other than '
                                   f'train/eval switches (traced inside nnx.{under})')
      del codes[key]
      if kept:
        codes[key] = f'({", ".join(map(str, kept))},)'
    return transform, ', '.join(f'{k}={v}' for k, v in codes.items())

  def _literal_ints(self, node: cst.BaseExpression) -> list[int] | None:
    """`2` or `(1, 2)` as a list of ints; None for anything else."""
    if isinstance(node, cst.Integer):
      return [int(node.value)]
    if isinstance(node, cst.Tuple) and all(isinstance(e.value, cst.Integer) for e in node.elements):
      return [int(e.value.value) for e in node.elements]
    return None

  def _remat_call(self, call: cst.Call, child: _Child) -> None:
    """A call of a rematted submodule: positional arguments only, nnx.remat runs it."""
    if any(a.keyword is not None or a.star for a in call.args):
      raise _Unsupported(call, f'a {child.remat[0]}-wrapped submodule called with keyword or starred arguments '
                               '(converted: positional)')
    self._remat_calls[call] = child
    transform, options = child.remat[0], f' ({child.remat[1]})' if child.remat[1] else ''
    effect = 'its activations recomputed in the backward pass' if transform == 'nnx.remat' else 'compiled on its own'
    self._pending.append((call, f'the {transform.partition(".")[2]}-wrapped submodule self.{child.attr} called through '
                                f'{transform}{options}: {effect}, as in Linen'))

  def _bound_local(self, method: cst.FunctionDef, ctor: cst.Call) -> cst.Name | None:
    """The local `name` of a statement `name = <ctor>` of the method's own body, else None."""
    assign = self._parent(ctor)
    line = self._parent(assign) if isinstance(assign, cst.Assign) else None
    if isinstance(assign, cst.Assign) and assign.value is ctor and len(assign.targets) == 1 \
        and isinstance(assign.targets[0].target, cst.Name) and isinstance(line, cst.SimpleStatementLine) \
        and len(line.body) == 1 and line in method.body.body:
      return assign.targets[0].target
    return None

  def _shared_local(self, method: cst.FunctionDef, ctor: cst.Call) -> tuple[list[cst.Call], list[cst.Name]]:
    """`embed = nn.Embed(...)` in the @nn.compact method, then `embed(tokens)` and `embed.attend(h)`: one
    submodule used in several places (weight tying). Returns the calls, in order, and the names read through an
    attribute."""
    calls, names = self._local_uses(method, ctor, 'submodule')
    if not calls:
      raise _Unsupported(ctor, f'the submodule {self._bound_local(method, ctor).value} is never called (its input '
                               'size comes from a call)')
    return calls, names

  def _scan_local(self, method: cst.FunctionDef, ctor: cst.Call) -> tuple[cst.Call, list[cst.Name]]:
    """`rnn = nn.scan(Cell, ...)(...)` in the @nn.compact method: the statement goes (the cell is built in
    __init__), `rnn.<method>` reads the attribute; returns the one call `rnn(carry, x)`."""
    if self._bound_local(method, ctor) is None:
      if ctor in self._remats:
        raise _Unsupported(ctor, 'an nn.remat submodule neither called where it is built nor bound by '
                                 '`name = nn.remat(...)(...)`')
      raise _Unsupported(ctor, 'an nn.scan cell neither called where it is built nor bound by `name = nn.scan(...)(...)`')
    kind = 'rematted submodule' if ctor in self._remats else 'scanned cell'
    calls, names = self._local_uses(method, ctor, kind)
    if len(calls) != 1:
      raise _Unsupported(ctor, f'the {kind} {self._bound_local(method, ctor).value} is called {len(calls)} times '
                               '(converted: once)')
    return calls[0], names

  def _local_uses(self, method: cst.FunctionDef, ctor: cst.Call, kind: str) -> tuple[list[cst.Call], list[cst.Name]]:
    """The uses of the local a `name = <ctor>` statement binds: its calls, in order, and the names read through an
    attribute (`rnn.initial_state`); any other use is refused. The statement goes (the child is built in __init__)."""
    target = self._bound_local(method, ctor)
    local = target.value
    assignments = list(self.get_metadata(ScopeProvider, target).assignments[local])
    if len(assignments) != 1:
      raise _Unsupported(ctor, f'the {kind} {local} is rebound in the method')
    calls, names = [], []
    for reference in assignments[0].references:
      use = reference.node
      parent = self._parent(use)
      if isinstance(parent, cst.Call) and parent.func is use:
        calls.append(parent)
      elif isinstance(parent, cst.Attribute) and parent.value is use:
        names.append(use)
      else:
        raise _Unsupported(use, f'the {kind} {local} used other than by calling it or one of its methods')
    self._removed.add(self._parent(self._parent(ctor)))
    position = lambda call: self.get_metadata(PositionProvider, call).start
    calls.sort(key=lambda call: (position(call).line, position(call).column))
    return calls, names

  def _stack_call(self, call: cst.Call, child: _Child) -> None:
    """A call of stacked copies: every argument by position (for scan, `(carry, *xs)`); nnx.scan runs the layers
    in turn, nnx.vmap the ensemble's members side by side."""
    stacked = child.stacked
    if any(a.keyword is not None or a.star for a in call.args) or len(call.args) != len(child.sibling.call_params):
      raise _Unsupported(call, f'nn.{stacked.transform} copies called other than with all of {child.sibling.name}\'s '
                               'arguments by position')
    self._stack_calls[call] = child
    remat = '' if stacked.remat is None else (
        f', each rematerialised (nnx.remat{f"({stacked.remat})" if stacked.remat else ""})')
    unsplit = '' if 'dropout' in stacked.split or not _draws_rngs(child.sibling) else (
        f'; split_rngs names only {", ".join(stacked.split)}: no other rng stream reached the Linen copies (a dropout '
        'in train mode failed there), NNX splits every stream per copy')
    run = 'nnx.scan, one layer after the other' if stacked.transform == 'scan' else 'nnx.vmap, side by side'
    self._pending.append((call, f'the nn.{stacked.transform} of {child.sibling.name} ({child.linen_name}) -> '
                                f'self.{child.attr}, {stacked.length} copies created by nnx.vmap over '
                                f'rngs.split({stacked.length}) (variables stacked on axis 0, as Linen\'s), run by '
                                f'{run}{remat}{unsplit}'))

  def _scan_call(self, call: cst.Call, child: _Child) -> None:
    """A call of a scanned cell: `(carry, x)` by position, nnx.scan runs it."""
    if len(call.args) != 2 or any(a.keyword is not None or a.star for a in call.args):
      raise _Unsupported(call, 'a scanned cell called other than as cell(carry, x)')
    self._scan_calls[call] = child
    in_axis, out_axis = child.scan
    self._pending.append((call, f'the nn.scan call {self.module.code_for_node(call.func)}(...) -> nnx.scan over '
                                f'self.{child.attr}, the cell broadcast to every step (its params are shared): '
                                f'in_axes=(None, nnx.Carry, {in_axis}), out_axes=(nnx.Carry, {out_axis})'))

  def _cell_arg(self, ctor: cst.Call) -> cst.BaseExpression | None:
    """The cell argument of a wrapper's constructor call (`nn.RNN(<cell>)`), if `ctor` builds a wrapper."""
    built = self._constructed(ctor)
    wrapper = find_wrapper(built[0]) if built is not None else None
    if wrapper is None:
      return None
    position = linen_fields(wrapper.linen).index(wrapper.cell_kwarg)
    positional = [a.value for a in ctor.args if a.keyword is None]
    if position < len(positional):
      return positional[position]
    return next((a.value for a in ctor.args if a.keyword is not None and a.keyword.value == wrapper.cell_kwarg), None)

  def _cell(self, ctor: cst.Call, wrapper: WrapperSpec, value: cst.BaseExpression | None,
            counts: dict[str, int]) -> _Child:
    """The table cell a wrapper is built around, built in the wrapper's constructor call."""
    built = self._constructed(value) if isinstance(value, cst.Call) else None
    if built is None or built[0] not in wrapper.cells:
      short = wrapper.linen.rpartition('.')[2]
      cells = ', '.join(c.rpartition('.')[2] for c in wrapper.cells)
      raise _Unsupported(value or ctor, f'{short} over a cell other than a {cells} built in its constructor call '
                                        '(a cell class of your own, or a cell built elsewhere)')
    return self._child(value, counts, None)

  def _nnx_name_for(self, node: cst.CSTNode) -> str | None:
    """The NNX name for a Linen name (`nn.relu` -> `nnx.relu`); None for other code.

    Raises _Unsupported for a Linen name NNX has no counterpart of.
    """
    names = {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}
    linen = {n for n in names if n == 'flax.linen' or n.startswith('flax.linen.')}
    if not (isinstance(node, (cst.Name, cst.Attribute)) and linen):
      return None
    targets = {_nnx_counterpart(n) for n in linen}
    if len(targets) != 1 or None in targets or linen != names:
      raise _Unsupported(node, f'{self.module.code_for_node(node)} has no automatic NNX conversion here')
    return targets.pop()

  def _convert_linen_refs(self, node: cst.CSTNode, allowed: set[cst.CSTNode]) -> list[cst.CSTNode]:
    """Schedules `nn.relu` -> `nnx.relu` for Linen names NNX shares; returns the nodes converted."""
    converted = []
    for child in node.children:
      if child in allowed:
        continue
      target = self._nnx_name_for(child)
      if target is not None:
        self._exprs[child] = target
        converted.append(child)
        continue
      converted += self._convert_linen_refs(child, allowed)
    return converted

  def _code(self, node: cst.CSTNode, replacements: dict[cst.CSTNode, str] | None = None) -> str:
    """The code of `node` moved to __init__, with Linen names (and `replacements`) rewritten."""
    return self.module.code_for_node(node.visit(_Replace({**self._exprs, **self._aliases, **(replacements or {})})))

  def _has_name(self, node: cst.CSTNode, names: tp.Collection[str]) -> bool:
    return any(q.name in names for q in self.get_metadata(QualifiedNameProvider, node, set()))

  def _is_linen_class(self, node: cst.ClassDef) -> bool:
    """Whether a base is flax.linen.Module or, with one base, a Linen class of the run (`hierarchy.py`)."""
    return any(self._has_name(base.value, MODULE_NAMES) for base in node.bases) or self._project_base(node) is not None

  def _project_base(self, node: cst.ClassDef) -> str | None:
    """The fully qualified name of the only base of `node`, when it is a Linen class of the run, else None."""
    if len(node.bases) != 1:
      return None
    names = self.get_metadata(QualifiedNameProvider, node.bases[0].value, set())
    return next((found for q in names if (found := self.hierarchy.resolve(q.name)) is not None), None)

  def _plain_base_plan(self, node: cst.ClassDef) -> _Plan:
    """A base class of the run that only holds helpers (`LinenHierarchy.plain_bases`): an nnx.Module with its
    Linen names converted; its subclasses, converted in their own files, build the layers and variables."""
    for sub in descendants(node):
      if isinstance(sub, cst.Attribute) and _is_self_attr(sub) and sub.attr.value in SCOPE_APIS:
        raise _Unsupported(sub, f'self.{sub.attr.value} in a helper of a base class')
    plan = _Plan(node.name.value, [], [], [], False, helpers_only=True)
    plan.linen_nodes = [node.bases[0].value, *self._convert_linen_refs(node, {node.bases[0].value})]
    return plan

  def _parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
    return self.get_metadata(cst.metadata.ParentNodeProvider, node, None)

  def _report(self, node: cst.ClassDef, plan: _Plan) -> None:
    linen_base = self.module.code_for_node(node.bases[0].value)
    if plan.helpers_only:
      self.report_change(node, f'class {plan.name}({linen_base}) -> nnx.Module, a base class of helpers only: no '
                               '__init__ (its subclasses build the layers)')
      return
    signature = ', '.join(_init_params(plan))
    self.report_change(node, f'class {plan.name}({linen_base}) -> {plan.base} with __init__({signature})')
    hoisted = [c for c in plan.children if c.hoisted]
    if hoisted:
      mapping = ', '.join(
          f'{c.linen_name} -> self.{c.attr}' + (
              f' (its cell {c.cell.linen_name} -> self.{c.attr}.{c.wrapper.cell_attribute})' if c.cell else '')
          for c in hoisted)
      what = 'submodules and variables' if any(c.api for c in hoisted) else 'submodules'
      self.report_change(node, f'{plan.name}: @nn.compact {what} hoisted into __init__: {mapping}')
    for name in plan.mode_fields:
      self.report_change(node, f'{plan.name}: train/eval field {name} dropped; use model.train() / model.eval()')
    for _, name, _ in plan.mode_params:
      default = self._switch_defaults.get(name)
      start = '' if default is None else f' (the layers it fed start in the mode of its default, {name}={default})'
      self.report_change(node, f'{plan.name}.__call__: train/eval argument {name} dropped; '
                               f'use model.train() / model.eval(){start}')
    for collection in plan.collections:
      name = self._variable_classes[collection]
      self.report_change(node, f'new Variable type {name} for the Linen collection {collection!r}')
    if plan.cache_lines:
      own = [f'self.{c.attr}' for c in plan.children if c.cache]
      held = [f'self.{c.attr}.{c.spec.cache.method if c.spec else "init_cache"}' for c in plan.children if c.holds_cache]
      what = ([f'creates the decode caches {", ".join(own)} (None until then)'] if own else []) \
          + ([f'calls {", ".join(held)}'] if held else [])
      self.report_change(node, f'{plan.name}: new method {INIT_CACHE}, input_shape being the shape of '
                               f'{plan.cache_input} at full length (what Linen\'s init saw): it {" and ".join(what)}; '
                               'call it before decoding')
    fields = [ConstructorArgument(name, FIELD, param) for name, param in zip(plan.field_names, plan.params)]
    examples = [ConstructorArgument(f'{c.attr}_example_inputs', EXAMPLE_INPUTS,
                                    f'example inputs of self.{c.attr}, the Linen {_linen_class(c)} wrapped by '
                                    'nnx_bridge.from_linen', c.attr) for c in plan.children if c.bridged]
    arguments = [*fields, *plan.size_arguments, *examples, ConstructorArgument('rngs', RNGS, 'nnx.Rngs')]
    children = [ChildName(c.linen_name, c.attr, _linen_class(c)) for c in plan.children]
    children += [ChildName(c.cell.linen_name, f'{c.attr}.cell', _linen_class(c.cell))  # Linen names a wrapped cell
                 for c in plan.children if c.cell is not None]                      # in the scope that built it
    self.report_class(node, plan.name, arguments, children, call_arguments=plan.call_params,
                      mode_arguments=[name for _, name, _ in plan.mode_params])
    records = self.context.scratch[CLASSES_KEY]  # the record report_class just made
    records[-1] = dataclasses.replace(records[-1], cache_input=plan.cache_input, input_sizes=self._input_sizes(plan))

  def _input_sizes(self, plan: _Plan) -> dict[str, int]:
    """The class's layer input sizes (table layers, cells, `x.shape[-1]` in variables) by where they came from."""
    arguments = {name for name, _ in plan.size_params}
    counts = dict.fromkeys(INPUT_SIZE_SOURCES, 0)
    for child in plan.children:
      if child.spec is None and child.wrapper is None and child.api is None:
        continue  # a class of the file: its layers are counted in its own record
      for value in [*child.sizes.values(), *child.size_codes.values()]:
        source = 'arguments' if value in arguments else 'examples' if value in self._traced_codes else 'code'
        counts[source] += 1
    return counts

  def _init(self, plan: _Plan, setup_body: list[cst.BaseStatement]) -> cst.FunctionDef:
    params = ', '.join(['self', *_init_params(plan)])
    fields = [f'self.{name} = {name}' for name in plan.field_names]
    later = [*self._factories.lines.get(plan.name, ()), *(f'self.{c.attr} = {c.text}' for c in plan.children if c.hoisted)]
    later += [f'self.{attr} = rngs{_stream(stream)}.fork()' for stream, attr in plan.streams.items()]
    source = f'def __init__({params}):\n' + ''.join(f'  {line}\n' for line in [*fields, *later] or ['pass'])
    init = cst.parse_statement(source)
    lines = list(init.body.body)
    body = [*lines[:len(fields)], *setup_body, *lines[len(fields):]] if fields or later else setup_body or lines
    return init.with_changes(body=init.body.with_changes(body=body))


class _Replace(cst.CSTTransformer):
  """Replaces given nodes of the original tree with code."""

  def __init__(self, replacements: dict[cst.CSTNode, str]) -> None:
    super().__init__()
    self._replacements = replacements

  def on_leave(self, original_node: cst.CSTNode, updated_node: tp.Any) -> tp.Any:
    if original_node in self._replacements:
      return cst.parse_expression(self._replacements[original_node])
    return updated_node


def _linen_class(child: _Child) -> str | None:
  """'flax.linen.Dense' for a table layer, 'Block' for a class converted with it, None for a variable."""
  if child.spec is not None or child.wrapper is not None:
    return (child.spec or child.wrapper).linen
  if child.bridged:
    return child.ctor.func.value if isinstance(child.ctor.func, cst.Name) else cst.Module([]).code_for_node(child.ctor.func)
  return child.sibling.name if child.sibling is not None else None


def _scope_api(call: cst.Call) -> str | None:
  """'param' for `self.param(...)`, ...: the Linen scope API a call uses, else None."""
  func = call.func
  if isinstance(func, cst.Attribute) and _is_self_attr(func) and func.attr.value in SCOPE_APIS:
    return func.attr.value
  return None


def _is_initializing_if(statement: cst.CSTNode) -> bool:
  """`if self.is_initializing():` / `if not self.is_initializing():` without an else."""
  if not isinstance(statement, cst.If) or statement.orelse is not None:
    return False
  test = statement.test
  if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
    test = test.expression
  return isinstance(test, cst.Call) and _scope_api(test) == 'is_initializing' and not test.args


def _assigned_name(statement: cst.CSTNode) -> str | None:
  """The name of a `name = value` statement, else None."""
  if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
    assign = statement.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
      return assign.targets[0].target.value
  return None


def _is_written(node: cst.CSTNode, parent_of: tp.Callable[[cst.CSTNode], cst.CSTNode | None]) -> bool:
  """Whether `node` is (part of) an assignment target: `node = ...`, `node += ...`, `a, node = ...`."""
  parent = parent_of(node)
  while isinstance(parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
    node, parent = parent, parent_of(parent)
  return isinstance(parent, cst.AssignTarget) or (isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is node)


def _has_scope_call(node: cst.CSTNode) -> bool:
  return any(isinstance(sub, cst.Call) and _scope_api(sub) for sub in (node, *descendants(node)))


def _is_straight_statement(statement: cst.CSTNode) -> bool:
  """A simple statement, or an `if [not] self.is_initializing():` block NNX resolves."""
  return isinstance(statement, cst.SimpleStatementLine) or _is_initializing_if(statement)


def _split_last(shape: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
  """The leading parts and the last axis of a shape: ('*input_shape',) -> (('*input_shape[:-1]',), 'input_shape[-1]')."""
  *lead, last = shape
  if last.startswith('*'):
    return (*lead, f'{last}[:-1]'), f'{last[1:]}[-1]'
  return tuple(lead), last


def _simplify(parts: tuple[str, ...]) -> tuple[str, ...]:
  """('*e[:-1]', 'e[-1]') -> ('*e',)."""
  out: list[str] = []
  for part in parts:
    if out and out[-1].startswith('*') and out[-1].endswith('[:-1]') and part == f'{out[-1][1:-len("[:-1]")]}[-1]':
      out[-1] = out[-1][:-len('[:-1]')]
    else:
      out.append(part)
  return tuple(out)


def _shape_code(shape: tuple[str, ...]) -> str:
  if len(shape) == 1 and shape[0].startswith('*'):
    return shape[0][1:]
  return f'({", ".join(shape)}{"," if len(shape) == 1 else ""})'


def _broadcast_shape(left: Shape, right: Shape) -> Shape:
  """The shape of `left op right`: as `_broadcast`, on the last axis once the leading ones agree."""
  if left is None or right is None or left == right:
    return left if left == right else None
  (lead, last), (other_lead, other_last) = _split_last(left), _split_last(right)
  if lead != other_lead:
    return None
  if last == other_last:
    return left
  if ('input_shape' in last) != ('input_shape' in other_last):  # a size the code fixes wins over an input's
    return _simplify((*lead, other_last if 'input_shape' in last else last))
  return None


def _forget(node: cst.CSTNode, env: dict[str, tp.Any]) -> None:
  """Every name `node` assigns no longer has what the code said of it."""
  for sub in descendants(node):
    targets = []
    if isinstance(sub, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr, cst.AsName)):
      targets.append(sub.target if not isinstance(sub, cst.AsName) else sub.name)
    for target in targets:
      for name in (target, *descendants(target)):
        if isinstance(name, cst.Name) and name.value in env:
          env[name.value] = None


def _arms(statement: cst.If) -> list[cst.BaseSuite | None]:
  """The bodies of an if / elif / else chain; None for a missing else."""
  arms: list[cst.BaseSuite | None] = []
  node: cst.CSTNode | None = statement
  while isinstance(node, cst.If):
    arms.append(node.body)
    node = node.orelse
  arms.append(node.body if isinstance(node, cst.Else) else None)
  return arms


def _tests(statement: cst.If) -> list[cst.BaseExpression]:
  tests = []
  node: cst.CSTNode | None = statement
  while isinstance(node, cst.If):
    tests.append(node.test)
    node = node.orelse
  return tests


def _is_number(node: cst.CSTNode) -> bool:
  if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
    node = node.expression
  return isinstance(node, (cst.Integer, cst.Float))


def _broadcast(left: Dim, right: Dim) -> Dim:
  """The last axis of `left op right`: theirs when they agree, else the one the code fixes.

  Two arrays combined elementwise have the same last axis unless one of them is 1 and
  broadcasts: a size the code fixes (a field) wins over an input's, or over one it does not say
  (a residual reassigned in one arm of an `if`).
  """
  if left == right:
    return left
  kinds = {side[0] if side is not None else None for side in (left, right)}
  if 'known' in kinds and kinds <= {'known', 'input', None}:
    return left if left is not None and left[0] == 'known' else right
  return None


def _last_axis_of_name(node: cst.CSTNode) -> bool:
  """`x.shape[-1]` for a plain name x."""
  return (isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute)
          and isinstance(node.value.value, cst.Name) and node.value.attr.value == 'shape'
          and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index)
          and _is_minus_one(node.slice[0].slice.value))


def _size_local_of(assign: cst.Assign) -> tuple[str, str] | None:
  """(local, array) for `d = x.shape[-1]` and `n, _, d = x.shape` (the last target is the last axis)."""
  if len(assign.targets) != 1:
    return None
  target, value = assign.targets[0].target, assign.value
  if isinstance(target, cst.Name) and _last_axis_of_name(value):
    return target.value, value.value.value.value
  if isinstance(target, (cst.Tuple, cst.List)) and target.elements and isinstance(target.elements[-1].value, cst.Name) \
      and not isinstance(target.elements[-1], cst.StarredElement) and isinstance(value, cst.Attribute) \
      and value.attr.value == 'shape' and isinstance(value.value, cst.Name):
    return target.elements[-1].value.value, value.value.value
  return None


def _is_minus_one(node: cst.CSTNode) -> bool:
  return (isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus)
          and isinstance(node.expression, cst.Integer) and node.expression.value == '1')


def _literal_identifier(node: cst.CSTNode) -> bool:
  return (isinstance(node, cst.SimpleString) and node.evaluated_value.isidentifier()
          and not keyword.iskeyword(node.evaluated_value))


def _paren(code: str) -> str:
  return code if re.fullmatch(r'[\w.]+', code) else f'({code})'


def _stream(stream: str) -> str:
  return f'.{stream}' if stream.isidentifier() and not keyword.iskeyword(stream) else f'[{stream!r}]'


def _field_name(statement: cst.CSTNode) -> str | None:
  """The name of a dataclass field `name: T` / `name: T = default`, else None."""
  if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
    assign = statement.body[0]
    if isinstance(assign, cst.AnnAssign) and isinstance(assign.target, cst.Name):
      return assign.target.value
  return None


def _is_docstring(statement: cst.CSTNode) -> bool:
  return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
          and isinstance(statement.body[0], cst.Expr) and isinstance(statement.body[0].value, cst.BaseString))


def _is_self_attr(node: cst.Attribute) -> bool:
  return isinstance(node.value, cst.Name) and node.value.value == 'self'


def _self_assignment(statement: cst.CSTNode) -> str | None:
  """The attribute of a `self.<attr> = value` statement, else None."""
  if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
    assign = statement.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
      target = assign.targets[0].target
      if isinstance(target, cst.Attribute) and _is_self_attr(target):
        return target.attr.value
  return None


def _has_call(node: cst.CSTNode) -> bool:
  return any(isinstance(sub, cst.Call) for sub in (node, *descendants(node)))
