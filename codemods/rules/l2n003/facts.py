"""The records L2N003 works with: the kinds of Linen state, what a file holds, and the plan for one model.

*Analyse* finds `ModelSite`s (a model's construction and its `init`); *decide* follows the
model's state from there into a `ModelGroup` (the model's plan: every use of its state, its
step functions and the edits that convert them), and hands the rule a `ConvertedModel` (the
edits and report entries) or a `LeftAsLinen` with the reason; *rewrite* applies the edits.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst
from libcst.metadata import Scope

from codemods.report import ConvertedClass
from nnx_bridge.layer_table import LayerSpec

VARIABLES, OPT_STATE, TRAIN_STATE, UPDATES, OPTAX_UPDATES = (
    'variables', 'opt_state', 'train_state', 'updates', 'optax_updates')
"""Kinds of Linen state a name can hold; a collection's kind is 'collection:<name>'."""
MODEL_STATE = (VARIABLES, OPT_STATE, TRAIN_STATE)
KEPT_STATE, KEPT_PARAMS = 'kept_train_state', 'kept_params'
"""With `--train-state keep`: a TrainState kept around `nnx.split` state, and its `params` (an nnx.State)."""
KEPT = (KEPT_STATE, KEPT_PARAMS)
RNG_KEY = 'rng_key'
"""A TrainState field holding the key of the model's random streams (`dropout_rng`), and the keys split from it:
each use feeds an apply's `rngs=` or goes back into the state, and goes, since the NNX model holds nnx.Rngs."""


def collection(name: str) -> str:
  """The kind of the state of the collection `name` ('collection:params')."""
  return f'collection:{name}'


def collection_of(kind: str) -> str | None:
  """The collection a kind of state is, or None for the other kinds."""
  return kind.split(':', 1)[1] if kind.startswith('collection:') else None


def describe(kind: str) -> str:
  """The kind of state in words, for report messages."""
  name = collection_of(kind)
  if name is not None:
    return f'the {name!r} collection'
  return {VARIABLES: 'the variables', OPT_STATE: 'the optimizer state', TRAIN_STATE: 'the TrainState',
          KEPT_STATE: 'the kept TrainState', KEPT_PARAMS: 'the params of the kept TrainState',
          UPDATES: 'the mutated collections', OPTAX_UPDATES: 'the optax updates',
          RNG_KEY: "the TrainState's rng key"}[kind]


class Skip(Exception):
  """A use this rule does not convert: the whole model's code stays as it is, with a TODO."""

  def __init__(self, node: cst.CSTNode, message: str) -> None:
    super().__init__(message)
    self.node, self.message = node, message


Edit = tp.Callable[[tp.Any], tp.Any]
"""Builds the new node from the updated one (libcst's `updated_node`, of the edited node's type)."""
Replacement = list[cst.BaseStatement] | None
"""What a statement becomes: the statements in its place (itself among them to keep it), or None to remove it."""


@dataclasses.dataclass(frozen=True)
class InitStatement:
  """`target = model.init(...)`, or `target = model.init(...)['params']` (kind 'collection:params')."""

  statement: cst.SimpleStatementLine
  target: str
  model: str
  call: cst.Call
  kind: str


@dataclasses.dataclass(frozen=True)
class ModelClass:
  """What `Model(...)` / `nn.Dense(...)` builds: the record of its NNX class and the constructor arguments."""

  record: ConvertedClass
  layer: LayerSpec | None  # for a built-in layer used as the model (`nn.Dense(10)`)
  nnx_class: str
  arguments: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ModelSite:
  """A model's construction and its init, in one block of statements, or the init in a function the module is given
  to (`create_train_state(cnn, rng, ...)` once, `cnn = CNN()` in the caller's block before that call)."""

  statements: tuple[cst.BaseStatement, ...]  # the block of the init
  construction: cst.SimpleStatementLine
  init: InitStatement
  built: ModelClass
  given_by: cst.Call | None = None  # the call giving the module to the function that initialises it, if not built there


@dataclasses.dataclass(frozen=True)
class ConvertedModel:
  """The decision for a model whose code is converted: the edits that do it and the report entries."""

  statements: tp.Mapping[cst.CSTNode, Replacement]
  edits: tp.Mapping[cst.CSTNode, Edit]
  changes: tuple[tuple[cst.CSTNode, str], ...]


@dataclasses.dataclass(frozen=True)
class LeftAsLinen:
  """The decision for a model whose code is not converted: where and why."""

  node: cst.CSTNode
  reason: str


@dataclasses.dataclass(frozen=True)
class StepStyleChoice:
  """The style a training step is rewritten in (None: it stays `@nnx.jit`), and the report note saying why."""

  style: str | None
  note: str | None
  loops: tuple[tuple[cst.CSTNode, tuple[cst.Call, ...]], ...] = ()  # each loop calling the step, with its calls


@dataclasses.dataclass
class StepFunction:
  """A step or loss function the state is passed to: which parameters hold state, what it returns."""

  node: cst.FunctionDef | cst.Lambda
  loss_of: cst.Call | None = None  # the `jax.grad(fn)(params)` call, for a loss function
  transform: cst.Call | None = None  # its `jax.grad(fn)` (inline, or bound to a name: `grad_fn(params)`)
  kinds: dict[int, str] = dataclasses.field(default_factory=dict)  # parameter position -> kind
  drops: dict[tuple[int, ...], str] = dataclasses.field(default_factory=dict)  # returned state: path -> kind
  returns: dict[cst.Return, set[tuple[int, ...]]] = dataclasses.field(default_factory=dict)  # -> its drops
  calls: set[cst.Call] = dataclasses.field(default_factory=set)
  pmap: tuple[cst.Decorator | cst.Call, dict[str, cst.BaseExpression]] | None = None  # jax.pmap, its options
  wrapper: cst.Call | None = None  # the `jax.pmap(step, ...)` / `jax.jit(step)` an alias of the step is bound to


@dataclasses.dataclass
class ModelGroup:
  """One model's plan: its construction, its init, everything done with it and its state, and the edits.

  Built up while the state is followed; a `Skip` drops the whole group (nothing of it is applied).
  """

  model: str
  record: ConvertedClass
  init: cst.SimpleStatementLine
  scope: Scope  # the libcst scope of the init statement
  layer: LayerSpec | None = None  # for a built-in layer used as the model (`nn.Dense(10)`)
  construction: cst.Call | None = None  # `Model(...)`, which its decode-mode twins repeat with `decode=True`
  # What the walk found: the names holding state, the expressions and calls that use it.
  names: dict[tuple[int, str], str] = dataclasses.field(default_factory=dict)  # (scope id, name) -> kind
  name_scopes: dict[tuple[int, str], Scope] = dataclasses.field(default_factory=dict)
  recognized: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # assignments of state names we rewrote
  visited: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # state expressions we handled
  applies: dict[cst.Call, str | None] = dataclasses.field(default_factory=dict)  # apply call -> method
  applied: dict[cst.CSTNode, set[str]] = dataclasses.field(default_factory=dict)  # function -> modules it applies
  model_uses: set[cst.CSTNode] = dataclasses.field(default_factory=set)
  functions: dict[cst.CSTNode, StepFunction] = dataclasses.field(default_factory=dict)
  tuple_aliases: set[cst.Assign] = dataclasses.field(default_factory=set)
  twins: dict[str, Scope] = dataclasses.field(default_factory=dict)  # decode-mode views of the model -> their scope
  twin_views: dict[str, cst.BaseStatement] = dataclasses.field(default_factory=dict)  # -> the statement making it
  state_reads: list[tuple[cst.CSTNode, str]] = dataclasses.field(default_factory=list)  # node, nnx filter
  kept_steps: set[cst.FunctionDef] = dataclasses.field(default_factory=set)  # steps over a kept TrainState
  # What was decided: train/eval modes, the optimizer's name, a kept TrainState.
  modes: dict[cst.CSTNode, bool | None] = dataclasses.field(default_factory=dict)  # statement/function -> eval?
  kept_modes: set[bool] = dataclasses.field(default_factory=set)  # train/eval of the kept TrainState's applies
  optimizer: str | None = None
  kept_state: bool = False  # with --train-state keep, once the TrainState is kept
  kept_fields: tuple[str, ...] = ()  # the fields of a kept project's TrainState subclass (`metrics`), read as in Linen
  # Where the model is used from: its init, or the caller a TrainState factory returns it to (`state = create(...)`).
  anchor: cst.BaseStatement | None = None
  fields: dict[str, str] = dataclasses.field(default_factory=dict)  # TrainState subclass fields -> their kind
  field_updates: set[cst.Call] = dataclasses.field(default_factory=set)  # apply_gradients(field=...) calls
  rng_keys: dict[str, cst.BaseExpression] = dataclasses.field(default_factory=dict)  # RNG_KEY field -> its value
  rng_streams: set[str] = dataclasses.field(default_factory=set)  # the `rngs=` streams those keys fed
  pending_returns: list[tuple[cst.BaseExpression, str]] = dataclasses.field(default_factory=list)  # (node, kind)
  # The rewrite: statement replacements, node edits, report entries.
  statements: dict[cst.BaseStatement, Replacement] = dataclasses.field(default_factory=dict)
  edits: dict[cst.CSTNode, Edit] = dataclasses.field(default_factory=dict)
  changes: list[tuple[cst.CSTNode, str]] = dataclasses.field(default_factory=list)
  mode_inserts: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # statements a mode call is placed at
  done: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # calls / statements already rewritten
