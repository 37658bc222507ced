"""What L2N002 decides for one class (`ClassRewrite`) and what the converted classes of a file add up to
(`FileRewrite`).

A `ClassRewrite` is made fresh for each class and filled by the passes; a class that cannot be converted
raises `Unsupported` and its ClassRewrite is dropped whole. Only a converted class's rewrite joins the
`FileRewrite`, which the rule's leave_* methods apply to the tree.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst

from codemods.example_sizes import ClassSizes
from codemods.report import ConstructorArgument
from nnx_bridge.layer_table import LayerSpec, WrapperSpec

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.dims import Dim, Shape


class Unsupported(Exception):
  """A construct that keeps the class from being converted."""

  def __init__(self, node: cst.CSTNode, message: str) -> None:
    super().__init__(message)
    self.node, self.message = node, message


@dataclasses.dataclass(frozen=True)
class Stacked:
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
class Child:
  """One submodule of the converted class."""

  attr: str
  linen_name: str
  ctor: cst.Call
  spec: LayerSpec | None
  sibling: ClassRewrite | None
  kwargs: dict[str, cst.BaseExpression]
  sizes: dict[str, str] = dataclasses.field(default_factory=dict)
  done: bool = False
  text: str = ''
  hoisted: bool = False  # built inline in the @nn.compact method, so __init__ gets a new line
  placeholder: bool = False  # setup() first sets its attribute to a plain value (`identity`): built as nnx.data(...)
  api: str | None = None  # 'param' / 'variable' for a variable; None for a submodule
  collection: str = ''  # a variable's Linen collection
  mode_defaults: dict[str, bool | str] = dataclasses.field(default_factory=dict)  # deterministic=... from a switch
  # default, or code: the field a switch was merged with (`self.deterministic`)
  var_type: str = ''  # the NNX Variable type of a variable
  shape_refs: dict[cst.Subscript, str] = dataclasses.field(default_factory=dict)  # `x.shape[-1]` -> x
  size_codes: dict[cst.CSTNode, str] = dataclasses.field(default_factory=dict)  # ... -> code in __init__
  ref_dims: dict[cst.CSTNode, Dim] = dataclasses.field(default_factory=dict)  # ... -> what the code said of it
  cache: bool = False  # a decode-cache variable: None in __init__, created by init_cache
  call_values: dict[str, cst.BaseExpression] = dataclasses.field(default_factory=dict)  # a class's call
  # fields given to its construction -> passed to its call instead
  cache_text: str = ''  # its creation in init_cache
  wrapper: WrapperSpec | None = None  # a table wrapper (nn.RNN) around `cell`
  cell: Child | None = None  # the table layer the wrapper runs, built in its constructor call
  scan: tuple[int, int] | None = None  # (in_axes, out_axes) of an nn.scan over a cell class of the file
  remat: tuple[str, str, str] | None = None  # (`nnx.remat` / `nnx.jit`, its options, Linen's name prefix) of
  #                                           nn.remat / nn.jit over a class
  stacked: Stacked | None = None  # an nn.scan over layers / nn.vmap ensemble of a class of the file
  bridged: str = ''  # why a Linen construction stays Linen, wrapped by nnx_bridge.from_linen; '' when converted
  condition: str | None = None  # built only when this holds (code for __init__), else the attribute is None
  alternative: bool = False  # another arm of a setup() `if` builds the attribute too (the first such child)
  element: int | None = None  # its index in a setup() list written out (`self.layer = [A(...), A(...)]`)
  head: bool = False  # written out before the loop that appends the rest of a setup() list (`layers = [Layer(...)]`)
  chosen: frozenset[tuple[str, bool]] = frozenset()  # the arms a local naming one class or another (`attention_layer
  #                                                    = A` in an if chain) names this child's class under

  @property
  def repeated(self) -> bool:
    """Whether another child holds the attribute first: a later arm's, a later element of a list, or the layers
    written out before a setup() list's loop (its loop's child holds it)."""
    return self.alternative or bool(self.element) or self.head

  @property
  def holds_cache(self) -> bool:
    """A submodule with a decode cache: a converted class with init_cache, or a table layer in decode mode; not
    where the construction gives its switch a literal False (wmt's encoder: `AddPositionEmbs(decode=False)`)."""
    if self.sibling is not None:
      holds, switch = self.sibling.cache_input is not None, self.sibling.cache_switch
    elif self.spec is not None and self.spec.cache is not None:
      holds, switch = self.spec.cache.switch in self.kwargs, self.spec.cache.switch
    else:
      return False
    value = self.kwargs.get(switch) if switch else None
    return holds and not (isinstance(value, cst.Name) and value.value == 'False')


Call = tuple[str | None, set[int]]
"""A rewritten call of a submodule: the attribute it calls (None: the callee stays) and the argument positions
it drops (train/eval switches)."""


@dataclasses.dataclass(frozen=True)
class EachElement:
  """The source of a size argument that holds one size per element of a layer list, in order (`tuple[int, ...]`):
  the list's layers are built in a loop whose input size changes from one iteration to the next in a way the code
  does not express (an activation looked up by name, `nn.glu`), so each element's size is the constructor's to give.
  """


EACH_ELEMENT = EachElement()


@dataclasses.dataclass(frozen=True)
class LinenBridgeFacts:
  """What a Linen class of another file needs to wrap a converted class with `nnx_bridge.to_linen`, worked out
  where the class is converted (`linen_parents.bridge_facts`) and carried in its record: why its NNX state does
  not map onto Linen's variable paths or its sizes are not shown by its call (`blocker`), else the NNX path ->
  Linen name of each child named otherwise, its size arguments shown by a required call argument and those a run
  of the call finds, the plain attributes a Linen parent may read through the bridge, and the first train/eval
  argument of its call that positional ones follow (`linen_parents._shifted_switch`); and how a run of its call
  shows each size argument it can (`linen_parents._run_size`), for a Linen class wrapping a class that builds it."""

  blocker: str | None
  linen_names: tuple[tuple[str, str], ...] = ()
  input_sizes: tuple[tuple[str, str], ...] = ()
  traced_sizes: tuple[tuple[str, str | None], ...] = ()  # -> the call argument of the module whose variable it
  # shapes (`to_linen(traced_inputs=)`), None: a table layer's input size (`to_linen(traced_sizes=)`)
  plain_attributes: tuple[str, ...] = ()
  shifted_switch: str | None = None
  run_sizes: tuple[tuple[str, str], ...] = ()  # size argument -> '' (a table layer's input size down the tree) or
  # the call argument shaping a variable of its own


@dataclasses.dataclass
class ClassRewrite:
  """What one class becomes, and the edits of its code that get it there."""

  name: str
  # the NNX class
  params: list[str] = dataclasses.field(default_factory=list)  # __init__'s field parameters, as code
  field_names: list[str] = dataclasses.field(default_factory=list)
  call_params: list[str] = dataclasses.field(default_factory=list)
  call_kwargs: str = ''  # `__call__` takes **kwargs: 'unread' (LongT5's attention layers, "to accept init_cache kwargs";
  #                       RegNet's `Identity`), 'read'; '' when it takes none
  compact: bool = False
  linen_fields: list[str] = dataclasses.field(default_factory=list)  # all Linen fields, mode fields included
  mode_fields: dict[str, bool] = dataclasses.field(default_factory=dict)  # `training: bool` field -> inverted
  children: list[Child] = dataclasses.field(default_factory=list)
  size_params: list[tuple[str, Dim | EachElement]] = dataclasses.field(default_factory=list)  # -> its source
  output: Dim = None  # the last-axis size `__call__` returns, when the code determines it
  carry_output: Dim = None  # for a class the file scans: the last-axis size of the carry `__call__` returns
  first_output: Dim = None  # of the first element of the tuple `__call__` returns (transformers' `outputs[0]`)
  last_output: Dim = None  # of its last element (DistilBERT's `layer_outputs[-1]`)
  size_arguments: list[ConstructorArgument] = dataclasses.field(default_factory=list)
  mode_params: list[tuple[int, str, bool]] = dataclasses.field(default_factory=list)
  linen_nodes: list[cst.CSTNode] = dataclasses.field(default_factory=list)
  streams: dict[str, str] = dataclasses.field(default_factory=dict)  # rng stream -> attribute
  collections: list[str] = dataclasses.field(default_factory=list)  # that need a generated Variable type
  output_shape: Shape = None  # the whole shape `__call__` returns, in terms of its first input's (`input_shape`)
  cache_lines: list[str] = dataclasses.field(default_factory=list)  # the body of init_cache; empty: none
  properties: list[str] = dataclasses.field(default_factory=list)  # generated properties, as code
  cache_input: str | None = None  # the `__call__` argument whose shape init_cache takes
  cache_switch: str | None = None  # the field the creation of its own caches is under (`if self.decode:`), if one
  example_params: list[str] = dataclasses.field(default_factory=list)  # example inputs of bridged Linen children
  base: str = 'nnx.Module'  # the NNX base class: a project base class of the run keeps its name
  base_index: int = 0  # the position of the Linen base among the class's bases (the others stay as they are)
  flags: list[str] = dataclasses.field(default_factory=list)  # keyword-only `bool = False` arguments (tied layers)
  helpers_only: bool = False  # a base class holding only helpers: no __init__ of its own
  init_lines: list[str] = dataclasses.field(default_factory=list)  # __init__ statements before the hoisted layers
  functions: list[cst.FunctionDef] = dataclasses.field(default_factory=list)  # functions of a method a constructor
  # argument names, copied into __init__ (`init_lines`) once the sizes they read are known
  tie_flags: dict[str, str] = dataclasses.field(default_factory=dict)  # __call__ argument tying a layer -> its flag
  call_fields: dict[str, str | None] = dataclasses.field(default_factory=dict)  # fields its builders fill with
  # what their call computes -> the default of the keyword-only __call__ argument they become (`call_fields.py`)
  origin: str = ''  # a class another file converted, built here from its record (`interface.py`): that file
  draws: bool = False  # for such a class: whether its call draws random numbers (its own children are not here)
  setup_bindings: tuple[dict[str, str], dict[str, str]] | None = None  # for such a class: `sizes.setup_bindings`
  bridge_facts: LinenBridgeFacts | None = None  # for such a class: what a Linen class here wraps it with
  # edits of the class's code (original node -> what replaces it)
  exprs: dict[cst.CSTNode, str] = dataclasses.field(default_factory=dict)
  statements: dict[cst.CSTNode, str] = dataclasses.field(default_factory=dict)
  removed: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # statements that go (now in __init__)
  keywords: dict[cst.Call, str] = dataclasses.field(default_factory=dict)  # call -> keyword argument added
  lists: set[cst.List] = dataclasses.field(default_factory=set)  # setup() lists of layers -> nnx.List([...])
  ifs: dict[cst.If, bool] = dataclasses.field(default_factory=dict)  # `if [not] self.is_initializing():` -> kept
  calls: dict[cst.Call, Call] = dataclasses.field(default_factory=dict)
  eval_views: set[cst.Call] = dataclasses.field(default_factory=set)  # a class's call without its switches: eval mode
  methods: dict[cst.FunctionDef, set[str]] = dataclasses.field(default_factory=dict)  # -> parameters dropped
  added_params: dict[cst.FunctionDef, list[str]] = dataclasses.field(default_factory=dict)  # -> keyword-only
  # parameters added, as code
  scan_calls: dict[cst.Call, Child] = dataclasses.field(default_factory=dict)  # run by nnx.scan over a cell
  scan_names: dict[cst.Name, Child] = dataclasses.field(default_factory=dict)  # `rnn` of `rnn.initial_state(...)`
  remat_calls: dict[cst.Call, Child] = dataclasses.field(default_factory=dict)  # run by nnx.remat / nnx.jit
  stack_calls: dict[cst.Call, Child] = dataclasses.field(default_factory=dict)  # run by nnx.scan / nnx.vmap
  while_loops: set[cst.Call] = dataclasses.field(default_factory=set)  # `nn.while_loop(...)` over (self, init)
  pending: list[tuple[cst.CSTNode, str]] = dataclasses.field(default_factory=list)  # report entries
  imports: list[tuple[str, str | None, str | None]] = dataclasses.field(default_factory=list)  # (module, obj, asname)
  variable_classes: dict[str, str] = dataclasses.field(default_factory=dict)  # collection -> Variable type, file's
  # what the passes learn of the class on the way
  aliases: dict[cst.Name, str | cst.BaseExpression] = dataclasses.field(default_factory=dict)  # `cfg` -> `self.config`, `init` -> its value, in __init__ code
  switches: dict[str, bool] = dataclasses.field(default_factory=dict)  # __call__ train/eval switches -> inverted
  switch_defaults: dict[str, bool] = dataclasses.field(default_factory=dict)  # switches with a literal default
  merged_switches: dict[str, cst.SimpleStatementLine | None] = dataclasses.field(default_factory=dict)  # switch ->
  # its `x = nn.merge_param('x', self.x, x)` with the field of its name (`modes.merged_switches`); None: of a class
  # of another file
  mode_uses: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # uses of switches that set train/eval args
  traced: ClassSizes = dataclasses.field(default_factory=dict)  # the example trace's layer sizes (`--examples`)
  traced_codes: set[str] = dataclasses.field(default_factory=set)  # sizes the traces gave
  branches: set[cst.If] = dataclasses.field(default_factory=set)  # conditionals of plain code in @nn.compact bodies
  cache_uses: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # has_variable / variables the cache pass took
  lazy_caches: dict[str, cst.Call] = dataclasses.field(default_factory=dict)  # cache created by the call -> its ctor
  scans: dict[cst.Call, tuple[int, int]] = dataclasses.field(default_factory=dict)  # nn.scan(Cell) -> axes
  remats: dict[cst.Call, tuple[str, str, str]] = dataclasses.field(default_factory=dict)  # nn.remat(Block) -> options
  stacks: dict[cst.Call, Stacked] = dataclasses.field(default_factory=dict)  # nn.scan over layers / nn.vmap
  lifted: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # `ScanBlock = nn.scan(...)` values: gone
  partials: dict[cst.Call, cst.Call] = dataclasses.field(default_factory=dict)  # `conv(...)` -> its partial
  arm_bound: dict[cst.Call, str] = dataclasses.field(default_factory=dict)  # construction bound to a local in one arm
  #                                    of an if, another arm binding the local to another -> the local
  open_locals: set[str] = dataclasses.field(default_factory=set)  # of those, the ones an arm binds to a module the
  #                                    code does not build (wmt's `input_embed = self.shared_embedding`): size unsaid
  conditions: dict[cst.Call, str] = dataclasses.field(default_factory=dict)  # construction -> when it exists
  extra_calls: dict[cst.Call, cst.Call] = dataclasses.field(default_factory=dict)  # later call of a local -> ctor
  factory_callee: dict[cst.Call, str] = dataclasses.field(default_factory=dict)  # through a factory -> NNX callee
  choices: dict[cst.Call, tp.Any] = dataclasses.field(default_factory=dict)  # `layer(...)` of a local naming one class
  #                                   or another -> its constructions.Choice list
  hoistable: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # valid in __init__ as they are
  factory_locals: dict[cst.SimpleStatementLine, list[cst.Name]] = dataclasses.field(default_factory=dict)
  reported_factories: set[str] = dataclasses.field(default_factory=set)  # factory fields already reported


@dataclasses.dataclass
class FileRewrite:
  """The converted classes of one file and their edits, which the rule applies as it leaves each node."""

  plans: dict[str, ClassRewrite] = dataclasses.field(default_factory=dict)  # by class name
  classes: dict[cst.ClassDef, ClassRewrite] = dataclasses.field(default_factory=dict)
  variable_classes: dict[str, str] = dataclasses.field(default_factory=dict)  # collection -> generated type
  exprs: dict[cst.CSTNode, str] = dataclasses.field(default_factory=dict)
  statements: dict[cst.CSTNode, str] = dataclasses.field(default_factory=dict)
  removed: set[cst.CSTNode] = dataclasses.field(default_factory=set)
  keywords: dict[cst.Call, str] = dataclasses.field(default_factory=dict)
  lists: set[cst.List] = dataclasses.field(default_factory=set)
  ifs: dict[cst.If, bool] = dataclasses.field(default_factory=dict)
  calls: dict[cst.Call, Call] = dataclasses.field(default_factory=dict)
  eval_views: set[cst.Call] = dataclasses.field(default_factory=set)
  methods: dict[cst.FunctionDef, set[str]] = dataclasses.field(default_factory=dict)
  added_params: dict[cst.FunctionDef, list[str]] = dataclasses.field(default_factory=dict)
  scan_calls: dict[cst.Call, Child] = dataclasses.field(default_factory=dict)
  scan_names: dict[cst.Name, Child] = dataclasses.field(default_factory=dict)
  remat_calls: dict[cst.Call, Child] = dataclasses.field(default_factory=dict)
  stack_calls: dict[cst.Call, Child] = dataclasses.field(default_factory=dict)
  while_loops: set[cst.Call] = dataclasses.field(default_factory=set)

  def add(self, node: cst.ClassDef, plan: ClassRewrite) -> None:
    """Takes in a converted class: its plan and its edits."""
    self.plans[plan.name] = self.classes[node] = plan
    self.variable_classes = dict(plan.variable_classes)
    self.exprs.update(plan.exprs)
    self.keywords.update(plan.keywords)
    self.statements.update(plan.statements)
    self.ifs.update(plan.ifs)
    self.calls.update(plan.calls)
    self.eval_views |= plan.eval_views
    self.methods.update(plan.methods)
    self.added_params.update(plan.added_params)
    self.scan_calls.update(plan.scan_calls)
    self.scan_names.update(plan.scan_names)
    self.remat_calls.update(plan.remat_calls)
    self.stack_calls.update(plan.stack_calls)
    self.removed |= plan.removed
    self.lists |= plan.lists
    self.while_loops |= plan.while_loops


def draws_rngs(plan: ClassRewrite) -> bool:
  """Whether a converted class draws random numbers in its call: a layer the table says draws dropout keys,
  make_rng, or a child that does."""
  return plan.draws or bool(plan.streams) or any(
      c.spec is not None and c.spec.draws_dropout is not None
      and (c.spec.draws_dropout == 'always' or c.spec.draws_dropout in c.kwargs)
      or c.sibling is not None and draws_rngs(c.sibling) for c in plan.children)


def init_params(plan: ClassRewrite) -> list[str]:
  """The NNX `__init__` parameters after self: the fields, then keyword-only sizes, example inputs and rngs."""
  return [*plan.params, '*',
          *(f'{p}: tuple[int, ...]' if isinstance(source, EachElement) else f'{p}: int' for p, source in plan.size_params),
          *(f'{p}: bool = False' for p in plan.flags), *(f'{p}: tuple' for p in plan.example_params), 'rngs: nnx.Rngs']


def linen_class(child: Child) -> str | None:
  """'flax.linen.Dense' for a table layer, 'Block' for a class converted with it, None for a variable."""
  if child.spec is not None or child.wrapper is not None:
    return (child.spec or child.wrapper).linen
  if child.bridged:
    return child.ctor.func.value if isinstance(child.ctor.func, cst.Name) else cst.Module([]).code_for_node(child.ctor.func)
  return child.sibling.name if child.sibling is not None else None
