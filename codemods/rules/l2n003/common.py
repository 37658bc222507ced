"""What the L2N003 passes share: the per-file run, the walk over a model's state, and the edits of steps.

Every feature module takes a `Walk` (the model group being planned, the file's tree and run)
and records its edits and report entries on the group; it follows newly found state through
the walk's `name` / `use` / `target`, so that no feature imports another.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst
from libcst.metadata import Scope

from codemods.options import MigrationOptions
from codemods.report import ConvertedClass
from codemods.rules.l2n003.facts import OPT_STATE
from codemods.rules.l2n003.facts import TRAIN_STATE
from codemods.rules.l2n003.facts import ModelGroup
from codemods.rules.l2n003.facts import Replacement
from codemods.rules.l2n003.facts import Skip
from codemods.rules.l2n003.facts import StepFunction
from codemods.rules.l2n003.syntax import args_with_commas
from codemods.rules.l2n003.syntax import is_method
from codemods.rules.l2n003.syntax import params_with_commas
from codemods.rules.l2n003.syntax import single_name_target
from codemods.rules.l2n003.tree import Tree


@dataclasses.dataclass
class FileRun:
  """What the model groups of one file share, in the order they are planned."""

  records: tp.Mapping[str, ConvertedClass]  # the classes L2N002 converted, by name
  options: MigrationOptions
  names_in_module: frozenset[str]
  remove_import_of: tp.Callable[[cst.BaseExpression], None]
  statements: dict[cst.CSTNode, Replacement] = dataclasses.field(default_factory=dict)  # of the groups converted
  claimed: set[cst.CSTNode] = dataclasses.field(default_factory=set)  # init statements of decode-mode twins
  introduced: dict[str, int] = dataclasses.field(default_factory=dict)  # names the styles bind -> id of their group


class Walk(tp.Protocol):
  """Following one model's state through the file: the passes call back into it with the state they find."""

  group: ModelGroup
  tree: Tree
  run: FileRun

  def name(self, scope: Scope, name: str, kind: str) -> None:
    """`name` holds state of `kind` in `scope`: every use of it must be one this rule converts."""

  def use(self, node: cst.BaseExpression, kind: str) -> None:
    """One use of a state expression."""

  def target(self, target: cst.CSTNode, kind: str) -> None:
    """An assignment target that receives state."""

  def apply(self, call: cst.Call) -> None:
    """`model.apply(...)` / `state.apply_fn(...)`."""

  def moved(self, statement: cst.BaseStatement) -> None:
    """The model is used from `statement` on (a factory's caller, `model, optimizer = create_train_state(...)`)."""


def optimizer_name(walk: Walk, node: cst.CSTNode) -> str:
  """The name of the model's `nnx.Optimizer` (`optimizer`, or `nnx_optimizer` when that is taken)."""
  group = walk.group
  if group.optimizer is None:
    name = next((n for n in ('optimizer', 'nnx_optimizer') if n not in walk.run.names_in_module), None)
    if name is None:
      raise Skip(node, 'the names optimizer and nnx_optimizer are both taken')
    group.optimizer = name
  return group.optimizer


def module_for(walk: Walk, function: cst.CSTNode) -> str:
  """The module a step (or a loss inside it) applies: the model, or one decode-mode view of it."""
  group = walk.group
  modules = group.applied.get(mode_owner(walk, function), {group.model})
  if len(modules) != 1:
    raise Skip(function, f'{walk.tree.name_of(function)} applies both {" and ".join(sorted(modules))}')
  return next(iter(modules))


def mode_owner(walk: Walk, node: cst.CSTNode) -> cst.CSTNode:
  """The outermost function around `node` below the scope the model is used in, else its statement."""
  tree = walk.tree
  owner, current = None, node
  while current is not None:
    if isinstance(current, cst.FunctionDef) and not tree.encloses(current, walk.group.anchor or walk.group.init):
      owner = current
    current = tree.parent(current)
  return owner if owner is not None else tree.statement(node)


def state_names(walk: Walk, node: cst.CSTNode, kinds: dict[int, str]) -> dict[int, list[str]]:
  """For each state position, the NNX names replacing it: the first gets `model`, opt state `optimizer`."""
  result, seen, module = {}, set(), module_for(walk, node)
  for position in sorted(kinds):
    kind = kinds[position]
    wanted = [module] if kind != OPT_STATE else [optimizer_name(walk, node)]
    if kind == TRAIN_STATE:
      wanted = [module, optimizer_name(walk, node)] if _updates_optimizer(walk, node, position) else [module]
    if module not in seen and kind == OPT_STATE:
      wanted = [module, *wanted]
    result[position] = [n for n in wanted if n not in seen]
    seen.update(wanted)
  return result


def _updates_optimizer(walk: Walk, function: cst.CSTNode, position: int) -> bool:
  """Whether the TrainState parameter `position` of `function` is used for more than applying the model and
  reading its state (`state.apply_fn`, `state.params`, a subclass field): an eval step takes the model alone."""
  if not isinstance(function, cst.FunctionDef) or position >= len(function.params.params):
    return True
  tree, name = walk.tree, function.params.params[position].name.value
  scope = tree.scope(function.body)
  reads = {'apply_fn', 'params', *walk.group.fields}
  for assignment in tree.assignments(scope, name):
    for access in assignment.references:
      parent = tree.parent(access.node)
      if not (isinstance(parent, cst.Attribute) and parent.value is access.node and parent.attr.value in reads):
        return True
  return False


def rewrite_parameters(walk: Walk, record: StepFunction, new_names: dict[int, list[str]] | None = None,
                       lead: bool = False) -> None:
  """State parameters -> `model` (first one) and `optimizer`; the other state parameters go.

  `new_names` replaces the names of each state position; with `lead`, they come first.
  """
  params = record.node.params.params
  if new_names is None:
    new_names = state_names(walk, record.node, record.kinds)
  keep, leading = [], []
  for position, param in enumerate(params):
    names = new_names.get(position)
    if names is None:
      keep.append(param)
    else:
      (leading if lead else keep).extend(
          param.with_changes(name=cst.Name(n), annotation=None, default=None, comma=cst.MaybeSentinel.DEFAULT)
          for n in names)
  keep = [*leading, *keep]
  parameters = record.node.params
  walk.group.edits[parameters] = lambda updated: updated.with_changes(params=params_with_commas(
      [updated.params[params.index(p)] if p in params else p for p in keep]))


def rewrite_call(walk: Walk, call: cst.Call, names: dict[int, list[str]], func: str | None = None) -> None:
  """A call of a step: the state at each position of `names` becomes those names; `func` renames the callee."""
  def edit(updated: cst.Call) -> cst.Call:
    args = []
    for position, arg in enumerate(updated.args):
      if position in names:
        args.extend(cst.Arg(cst.Name(n)) for n in names[position])
      else:
        args.append(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT))
    updated = updated.with_changes(args=args_with_commas(args))
    return updated.with_changes(func=cst.Name(func)) if func is not None else updated
  walk.group.edits[call] = edit


def replace_statement(walk: Walk, small: cst.BaseSmallStatement, code: str) -> None:
  """Replaces the small statement `small` by the statement `code`."""
  walk.group.edits[small] = lambda _: cst.parse_statement(f'{code}\n').body[0]


def train_state_arguments(walk: Walk, call: cst.Call, fields: tp.Collection[str] = ()
                          ) -> tuple[cst.Assign | cst.Return, dict[str, cst.BaseExpression]]:
  """The assignment (or return) and keyword arguments of `state = TrainState.create(apply_fn=model.apply,
  params=..., tx=...)`, with the subclass's extra `fields` too."""
  group = walk.group
  parent = walk.tree.parent(call)
  arguments = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
  assigned = isinstance(parent, cst.Assign) and parent.value is call and single_name_target(parent)
  returned = isinstance(parent, cst.Return) and parent.value is call
  required = {'apply_fn', 'params', 'tx'}
  if not (assigned or returned) or not required <= set(arguments) <= required | set(fields) \
      or len(call.args) != len(arguments) or not is_method(arguments['apply_fn'], group.model, 'apply'):
    raise Skip(call, 'a TrainState other than TrainState.create(apply_fn=model.apply, params=params, tx=tx) '
                     'assigned to one name or returned')
  if group.optimizer is not None or group.kept_state:
    raise Skip(call, f'a second optimizer for {group.model}')
  group.model_uses.add(arguments['apply_fn'].value)
  return parent, arguments
