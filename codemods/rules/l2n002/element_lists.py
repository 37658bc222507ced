"""setup() lists written out, for rule L2N002: `self.layer = [ConvLayer(c, stride=s), ConvLayer(c, activation=None)]`
(transformers' ResNet and RegNet layer collections), or a tuple built in steps, `self.layer = (A(...),)` then
`self.layer += (B(...),)`, also in the arms of an `if` on fields (transformers' T5 blocks).

Each element is a child of its own (`Child.element`: its index), converted in place, and the list becomes
`nnx.List([...])` with its formatting and comments kept. The list is used as a setup() list built by a loop is
(`loops.Loops.list_use`: `for layer in self.layer:` calling `layer(...)`, or `len(self.layer)`); such a loop is
walked once per element for sizes (`sizes.SizeWalk.loop`), the k-th walk calling element k, so that each
element's input size is what the element before it returned. Elements of several classes (RegNet's convolutions
and squeeze-excitation layer) are called with their input alone (`layer(hidden_state)`, `check_calls`), which each
takes. Linen names them `layer_0`, `layer_1`, ..., or by their name= when it is their index (`'0'`, `'1'`) or a
common start and their index (`'block_0'`, `'block_1'`), in every configuration the `if`s of setup() allow (T5's
`name=str(feed_forward_index)`, a counter moved on under the same `if` as the layer before it: `linen_pattern`).

A layer added under a condition makes the places of the later ones depend on it: an element's index
(`Child.element`) counts from the start when every element before it is unconditional, else from the end (T5's
feed-forward layer, `self.layer[-1]`); a call `self.layer[k](...)` is bound to the one element that can stand at k
where the call runs (`indexed_calls`: T5's `self.layer[1]` under a test that implies the decoder's condition is the
cross attention, never the feed-forward layer, which stands there only in an encoder).
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002 import constructions
from codemods.rules.l2n002.conditions import ArmPath, arm_path, may_meet, test_key
from codemods.rules.l2n002.nodes import is_self_attr
from codemods.rules.l2n002.plan import Child, ClassRewrite, Unsupported

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.context import ClassContext


def element_constructions(ctx: ClassContext, value: cst.List | cst.Tuple, attr: str) -> list[cst.Call] | None:
  """The constructions of `self.<attr> = [<construction>, ...]`; None when no element builds a module (plain
  code). Raises Unsupported for a list that mixes them with other values, or is built inside a block."""
  built = [e.value for e in value.elements if isinstance(e.value, cst.Call) and constructions.constructed(ctx, e.value)]
  if not built:
    return None
  if len(built) != len(value.elements) or any(isinstance(e, cst.StarredElement) for e in value.elements):
    raise Unsupported(value, f'self.{attr}: a list of layers beside other values (converted: a list whose every '
                             'element builds a layer)')
  line = ctx.facts.parent(ctx.facts.parent(value))  # the Assign's statement line, in setup()'s body or a block
  if not isinstance(ctx.facts.parent(ctx.facts.parent(line)), cst.FunctionDef):
    raise Unsupported(value, f'self.{attr}: a list of layers built inside a block of setup() (converted: at its '
                             'top level)')
  return built


def extension(ctx: ClassContext, statement: cst.BaseStatement, plan: ClassRewrite
              ) -> tuple[str, cst.List | cst.Tuple, list[cst.Call]] | None:
  """`self.<attr> += (B(...),)` of a list or tuple of layers setup() built before: its attribute, the added
  elements and their constructions; None for other statements."""
  if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
          and isinstance(aug := statement.body[0], cst.AugAssign) and isinstance(aug.operator, cst.AddAssign)
          and isinstance(aug.target, cst.Attribute) and is_self_attr(aug.target)
          and isinstance(aug.value, (cst.List, cst.Tuple))):
    return None
  attr = aug.target.attr.value
  if not any(c.attr == attr and c.element is not None for c in plan.children):
    return None
  built = [e.value for e in aug.value.elements
           if isinstance(e.value, cst.Call) and constructions.constructed(ctx, e.value)]
  if len(built) != len(aug.value.elements) or any(isinstance(e, cst.StarredElement) for e in aug.value.elements):
    raise Unsupported(aug.value, f'self.{attr}: layers added beside other values (converted: `self.{attr} += '
                                 '(<layer>(...), ...)`, every element building a layer)')
  return attr, aug.value, built


def place(ctx: ClassContext, plan: ClassRewrite, setup: cst.FunctionDef) -> None:
  """Each element's index in its list (from the end for one whose place depends on a condition before it) and Linen's
  name pattern of the list's elements; raises Unsupported where neither is fixed."""
  lists: dict[str, list[Child]] = {}
  for child in plan.children:
    if child.element is not None and not child.alternative:  # (another class the same construction may build)
      lists.setdefault(child.attr, []).append(child)
  for attr, elements in lists.items():
    paths = [arm_path(ctx, c.ctor) for c in elements]
    for k, child in enumerate(elements):
      if not any(paths[:k]):
        child.element = k
      elif not any(paths[k:]):
        child.element = k - len(elements)
      else:
        raise Unsupported(child.ctor, f'self.{attr}: a layer whose place in the list depends on conditions both '
                                      'before it and on itself or after it')
    pattern = linen_pattern(ctx, setup, elements, attr)
    for child in plan.children:
      if child.attr == attr and child.element is not None:
        first = next(c for c in elements if c.ctor is child.ctor)
        child.element, child.linen_name = first.element, pattern


def linen_pattern(ctx: ClassContext, setup: cst.FunctionDef, elements: list[Child], attr: str) -> str:
  """Linen's name of element `{i}`: `<attr>_{i}`, or what the elements' name= says when it is their index
  after a common start (`'0'`, `'1'`, `str(i)`: `{i}`) in every configuration of setup()'s `if`s; raises
  Unsupported for other names, which no pattern gives."""
  names = [next((a.value for a in c.ctor.args if a.keyword is not None and a.keyword.value == 'name'), None)
           for c in elements]
  if all(name is None for name in names):
    return f'{attr}_{{i}}'
  found = None if None in names else _names_by_place(ctx, setup, attr, dict(zip((c.ctor for c in elements), names)))
  starts = {name[:-len(str(k))] for k, name in found or () if name.endswith(str(k))}
  if not found or len(starts) != 1 or any(name != f'{next(iter(starts))}{k}' for k, name in found):
    raise Unsupported(elements[0].ctor, f'self.{attr}: a list of layers named '
                                        f'{", ".join(ctx.facts.code(n) for n in names if n)} (converted: no name=, or '
                                        'names that end in their index)')
  return f'{next(iter(starts))}{{i}}'


def _names_by_place(ctx: ClassContext, setup: cst.FunctionDef, attr: str, names: dict[cst.Call, cst.BaseExpression]
                    ) -> list[tuple[int, str]] | None:
  """Each element's place and name in each configuration of the tests of setup()'s `if`s (at most six), running its
  statements with int locals (`feed_forward_index = 1`, `+= 1`); None where a name or a test is beyond that."""
  tests = sorted({test_key(ctx, n.test) for n in descendants(setup.body) if isinstance(n, cst.If)})
  if len(tests) > 6:
    return None
  found: list[tuple[int, str]] = []
  for bits in range(2 ** len(tests)):
    truth = {test: bool(bits >> i & 1) for i, test in enumerate(tests)}
    if not _run(ctx, setup.body.body, truth, {}, [0], attr, names, found):
      return None
  return found


def _run(ctx: ClassContext, statements: tp.Sequence[cst.BaseStatement], truth: dict[str, bool], env: dict[str, int],
         place: list[int], attr: str, names: dict[cst.Call, cst.BaseExpression], found: list[tuple[int, str]]) -> bool:
  """Runs `statements` for `_names_by_place`; False where it cannot."""
  for statement in statements:
    if isinstance(statement, cst.If):
      node: cst.CSTNode | None = statement
      while isinstance(node, cst.If) and not truth[test_key(ctx, node.test)]:
        node = node.orelse
      arm = node.body if isinstance(node, (cst.If, cst.Else)) else None
      if arm is not None and not _run(ctx, arm.body, truth, env, place, attr, names, found):
        return False
      continue
    if not isinstance(statement, cst.SimpleStatementLine):
      inner = list(descendants(statement))
      if any(n in names for n in inner) or any(isinstance(n, (cst.AugAssign, cst.AssignTarget))
                                               and isinstance(n.target, cst.Name) and n.target.value in env
                                               for n in inner):
        return False  # a loop or a with block that adds layers or moves a counter on
      continue
    for small in statement.body:
      if isinstance(small, (cst.Assign, cst.AugAssign)) and _counter(small, env) is False:
        return False
      for ctor in (n for n in descendants(small) if n in names):
        name = _name_value(names[ctor], env)
        if name is None:
          return False
        found.append((place[0], name))
        place[0] += 1
  return True


def _counter(small: cst.Assign | cst.AugAssign, env: dict[str, int]) -> bool | None:
  """Keeps an int local up to date: `n = 1`, `n += 1`; False for an update of a counter in another form."""
  if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
    name, value = small.targets[0].target.value, small.value
    if isinstance(value, cst.Integer):
      env[name] = int(value.value)
    else:
      env.pop(name, None)
  elif isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name) and small.target.value in env:
    if not (isinstance(small.operator, cst.AddAssign) and isinstance(small.value, cst.Integer)):
      return False
    env[small.target.value] += int(small.value.value)
  return None


def _name_value(name: cst.BaseExpression, env: dict[str, int]) -> str | None:
  """The value of a name= in a run of setup(): a literal, or `str(<int literal or counter>)`."""
  if isinstance(name, cst.SimpleString):
    return name.evaluated_value
  if isinstance(name, cst.Call) and isinstance(name.func, cst.Name) and name.func.value == 'str' \
      and len(name.args) == 1 and name.args[0].keyword is None:
    value = name.args[0].value
    if isinstance(value, cst.Integer):
      return value.value
    if isinstance(value, cst.Name) and value.value in env:
      return str(env[value.value])
  return None


def indexed_calls(ctx: ClassContext, plan: ClassRewrite, methods: dict[str, cst.FunctionDef],
                  calls: dict[cst.Call, Child]) -> None:
  """Adds to `calls` each `self.layer[k](...)` of a list of elements with a literal k, bound to the element that can
  stand at k where the call runs; raises Unsupported where that is not one element."""
  lists = {c.attr for c in plan.children if c.element is not None}
  heads: dict[str, list[Child]] = {}  # the layers written out before a setup() list's loop, in order
  for child in plan.children:
    if child.head and not child.alternative:
      heads.setdefault(child.attr, []).append(child)
  for method in methods.values():
    for sub in descendants(method):
      if not (isinstance(sub, cst.Subscript) and isinstance(sub.value, cst.Attribute) and is_self_attr(sub.value)):
        continue
      if sub.value.attr.value in lists and (found := _indexed(ctx, plan, sub)) is not None:
        calls[found[0]] = found[1]
      elif sub.value.attr.value in heads and (found := _head_call(ctx, sub, heads[sub.value.attr.value])) is not None:
        calls[found[0]] = found[1]


def _head_call(ctx: ClassContext, subscript: cst.Subscript, heads: list[Child]) -> tuple[cst.Call, Child] | None:
  """`self.resnets[0](...)` of a setup() list whose first layers are written out before its loop (diffusers' mid
  blocks): the call and the layer written out at that literal index; None for another index or use."""
  found = _literal_call(ctx, subscript)
  return (found[0], heads[found[1]]) if found is not None and 0 <= found[1] < len(heads) else None


def _literal_call(ctx: ClassContext, subscript: cst.Subscript) -> tuple[cst.Call, int] | None:
  """The call `self.layer[k](...)` and its literal index k (negative from the end); None for another use."""
  call = ctx.facts.parent(subscript)
  if not (isinstance(call, cst.Call) and call.func is subscript and len(subscript.slice) == 1
          and isinstance(subscript.slice[0].slice, cst.Index)):
    return None
  index = subscript.slice[0].slice.value
  negative = isinstance(index, cst.UnaryOperation) and isinstance(index.operator, cst.Minus)
  literal = index.expression if negative else index
  if not isinstance(literal, cst.Integer):
    return None
  return call, -int(literal.value) if negative else int(literal.value)


def _indexed(ctx: ClassContext, plan: ClassRewrite, subscript: cst.Subscript) -> tuple[cst.Call, Child] | None:
  """The call `self.layer[k](...)` and the element it calls; None for another use of the subscript."""
  found = _literal_call(ctx, subscript)
  if found is None:
    return None
  call, k = found
  attr = subscript.value.attr.value
  elements = [c for c in plan.children if c.attr == attr and c.element is not None and not c.alternative]
  paths = [arm_path(ctx, c.ctor) for c in elements]
  where = arm_path(ctx, call)
  standing = [c for n, c in enumerate(elements) if may_meet(paths[n], where) and _may_stand(paths, n, k, where)]
  if len(standing) != 1:
    raise Unsupported(call, f'self.{attr}[{k}]: the layer it calls depends on conditions the call does not fix '
                            f'({len(standing)} layers of the list may stand there)')
  return call, standing[0]


def _may_stand(paths: list[ArmPath], n: int, k: int, where: ArmPath) -> bool:
  """Whether element `n` may stand at index `k` where a call on the arm path `where` runs: as many of the
  conditional elements before it (after it, for k < 0) are there as its place needs."""
  others = paths[:n] if k >= 0 else paths[n + 1:]
  place = k if k >= 0 else -k - 1
  fixed = sum(1 for path in others if not path)
  conditional = [path for path in others if path]
  needed = place - fixed
  present = sum(1 for path in conditional if path <= where)
  possible = sum(1 for path in conditional if may_meet(path, where))
  return present <= needed <= possible


def check_calls(ctx: ClassContext, plan: ClassRewrite, calls: dict[cst.Call, Child]) -> None:
  """Raises Unsupported for a loop over a list of layers some of which are added under a condition, and for a loop's
  call of a list of several classes that passes more than the element's input: what one class takes beside it (a
  train/eval switch), another may not."""
  for loop, child in ctx.loops.unrolled.items():
    if any(c.attr == child.attr and c.element is not None and arm_path(ctx, c.ctor) for c in plan.children):
      raise Unsupported(loop, f'a for loop over self.{child.attr}, a list of layers some of which setup() adds under a '
                              'condition (converted: calls by index, `self.layer[k](...)`)')
  for call, child in calls.items():
    if child.element is None or isinstance(call.func, cst.Subscript) \
        or len(call.args) == 1 and call.args[0].keyword is None and not call.args[0].star:
      continue  # not a loop's call, or `layer(x)`
    elements = [c for c in plan.children if c.attr == child.attr and c.element is not None]
    classes = sorted({constructions.constructed(ctx, c.ctor)[0] for c in elements})
    if len(classes) > 1:
      raise Unsupported(call, f'self.{child.attr}: a list of layers of several classes ({", ".join(classes)}) '
                              'called with more than its input (converted: `layer(x)`, which each takes)')
