"""Weight tying through Linen's `.apply` and `.variables` (a decoder run on the embedding's kernel, a head reading
another submodule's params): the computation it runs, or the NNX Variable's value, in its place.

Planning functions over a `context.ClassContext`, run by `planner.plan_class`: they read the file's facts and
fill the class's plan.
"""

from __future__ import annotations

import typing as tp

import libcst as cst

from codemods.nodes import descendants
from codemods.rules.l2n002 import queries
from codemods.rules.l2n002.nodes import int_tuple, is_self_attr, literal_dict, literal_ints, paren, value_else_none
from codemods.rules.l2n002.plan import Child, ClassRewrite, Unsupported
from nnx_bridge.layer_signatures import installed_linen_default

if tp.TYPE_CHECKING:
  from codemods.rules.l2n002.context import ClassContext

_CONV = 'flax.linen.Conv'
_PADDINGS = frozenset({'SAME', 'VALID'})
_ATOMIC = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Tuple, cst.List, cst.Integer, cst.Float, cst.SimpleString)
"""Expressions that need no parentheses where an attribute read was."""


def tied_uses(ctx: ClassContext, plan: ClassRewrite, methods: dict[str, cst.FunctionDef],
              setup: cst.FunctionDef | None) -> set[cst.Attribute]:
  """Weight tying through Linen's `.apply` and `.variables`, for the submodules built in setup():

  - `self.decoder.apply({'params': {'kernel': shared}}, h)` of an `nn.Dense(..., use_bias=False)` becomes the
    computation it runs, `h @ shared` (both cast to the layer's dtype when it sets one). Linen creates no params
    for a layer only run through `.apply` (its variables are given), so such a layer goes: it is not created in
    __init__; one also called directly stays.
  - `self.encoder.variables['params']['embed']['embedding']` becomes the NNX Variable's value,
    `self.encoder.embed.embedding[...]`: the same array, and gradients reach it from every use.

  Returns the `self.<attr>` nodes handled; the planner skips them when it checks the submodules' uses."""
  handled: set[cst.Attribute] = set()
  from_setup = {c.attr: c for c in plan.children if not c.hoisted and c.api is None and not c.repeated}
  uses: dict[str, list[cst.Attribute]] = {}
  for method in methods.values():
    if method is setup:
      continue
    for sub in descendants(method):
      if isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value in from_setup:
        uses.setdefault(sub.attr.value, []).append(sub)
  call_method = methods.get('__call__')
  for attr, subs in uses.items():  # first the reads, which a tied apply's kernel may hold
    for sub in subs:
      parent = ctx.facts.parent(sub)
      if isinstance(parent, cst.Attribute) and parent.value is sub and parent.attr.value == 'variables':
        _variables_read(ctx, parent, from_setup[attr])
        handled.add(sub)
  for attr, subs in uses.items():
    child = from_setup[attr]
    tied, arms = [], []
    for sub in subs:
      parent = ctx.facts.parent(sub)
      call = ctx.facts.parent(parent)
      if isinstance(parent, cst.Attribute) and parent.value is sub and parent.attr.value == 'apply' \
          and isinstance(call, cst.Call) and call.func is parent:
        _tied_apply(ctx, call, child, {c.attr for c in plan.children if c.api == 'param'})
        tied.append(sub)
        arms.append(_arm(ctx, call, call_method, given=True))
      elif sub not in handled:
        arms.append(_arm(ctx, sub, call_method, given=False))
    handled.update(tied)
    if tied and len(tied) == len(subs):  # only run with given variables: Linen creates none for it
      _setup_reads(ctx, setup, child)
      plan.children.remove(child)
      ctx.plan.removed.add(ctx.facts.parent(ctx.facts.parent(child.ctor)))
      ctx.plan.lifted.add(child.ctor)
      ctx.plan.pending.append((child.ctor, f'self.{attr} is only run through .apply with given params, so Linen '
                                        f'creates none for it: not created in __init__'))
    elif tied:  # `if shared is not None: <tied> else: self.decoder(h)`: it exists when called without
      params = {a for a in arms if a is not None}
      if None in arms or len(params) != 1:
        raise Unsupported(child.ctor, f'self.{attr} is run both through .apply with a shared kernel and '
                                                 'directly, other than as `if <arg> is not None: <tied> else: <own>` '
                                                 'on one __call__ argument: when Linen creates its params is unknown')
      param = params.pop()
      flag = f'tied_{attr}'
      taken = {*plan.field_names, *(n for n, _ in plan.size_params), *plan.flags, 'rngs'}
      while flag in taken:
        flag += '_'
      plan.flags.append(flag)
      plan.tie_flags[param] = flag
      child.condition = f'not {flag}'
      ctx.plan.pending.append((child.ctor, f'self.{attr} is created only when not {flag}, a new constructor argument '
                                        f'(default False): Linen creates its params only when __call__ gets no '
                                        f'{param}; a parent passing {param} passes {flag}=True'))
  for child in plan.children:  # a child with tied layers: is it given their shared kernel?
    if child.sibling is not None and child.sibling.tie_flags:
      _pass_flags(ctx, plan, child, methods, setup)
  return handled


def _setup_reads(ctx: ClassContext, setup: cst.FunctionDef | None, child: Child) -> None:
  """`self.conv.features` in setup() of a layer that goes (only run through .apply): the value its constructor call
  gives that option, or Linen's default for it."""
  for sub in descendants(setup) if setup is not None else ():
    if not (isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value == child.attr):
      continue
    read = ctx.facts.parent(sub)
    if isinstance(read, cst.AssignTarget):
      continue  # `self.conv = nn.Conv(...)` itself
    name = read.attr.value if isinstance(read, cst.Attribute) and read.value is sub else None
    value = child.kwargs.get(name) if name is not None else None
    text = queries.code(ctx, value) if value is not None else _linen_default(child, name) if name is not None else None
    if text is None:
      raise Unsupported(sub, f'self.{child.attr}, a layer only run through .apply (which NNX does not create), is '
                             'read in setup() other than as an option its constructor call sets or Linen defaults')
    atomic = isinstance(value, _ATOMIC) if value is not None else isinstance(cst.parse_expression(text), _ATOMIC)
    ctx.plan.exprs[read] = text if atomic else paren(text)
    ctx.plan.pending.append((read, f'{ctx.facts.code(read)} -> {ctx.plan.exprs[read]}: the option of the layer, which '
                                   'is not created'))


def _linen_default(child: Child, name: str) -> str | None:
  """The code of Linen's default for option `name` of the child's layer, when it is a plain value."""
  default = installed_linen_default(child.spec.linen, name) if child.spec is not None else None
  return repr(default) if isinstance(default, (int, float, str, bool, tuple, type(None))) else None


def _arm(ctx: ClassContext, node: cst.CSTNode, method: cst.FunctionDef | None, given: bool) -> str | None:
  """The __call__ argument P when `node` runs only when P is given (`given`, under `if P is not None:`) or only
  when it is not (the else, or `if P is None:`); None otherwise."""
  params = {p.name.value: p for p in method.params.params[1:]} if method is not None else {}
  current = node
  while (parent := ctx.facts.parent(current)) is not None and parent is not method:
    if isinstance(parent, cst.Else):
      statement = ctx.facts.parent(parent)
      if isinstance(statement, cst.If):
        found = _none_test(statement.test, params)
        if found is not None and found[1] != given:
          return found[0]
    if isinstance(parent, cst.If) and current is parent.body:
      found = _none_test(parent.test, params)
      if found is not None and found[1] == given:
        return found[0]
    current = parent
  return None


def _none_test(test: cst.BaseExpression, params: dict[str, cst.Param]) -> tuple[str, bool] | None:
  """(P, True) for `P is not None`, (P, False) for `P is None`, P a __call__ argument defaulting to None."""
  if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.left, cst.Name) \
      and test.left.value in params and isinstance(test.comparisons[0].comparator, cst.Name) \
      and test.comparisons[0].comparator.value == 'None':
    default = params[test.left.value].default
    if isinstance(default, cst.Name) and default.value == 'None':
      operator = test.comparisons[0].operator
      if isinstance(operator, cst.IsNot):
        return test.left.value, True
      if isinstance(operator, cst.Is):
        return test.left.value, False
  return None


def _pass_flags(ctx: ClassContext, plan: ClassRewrite, child: Child, methods: dict[str, cst.FunctionDef],
                setup: cst.FunctionDef | None) -> None:
  """`tied_decoder=<when the calls pass shared_embedding>` for a child whose class ties a layer on one of its
  call arguments: every call of the child must agree, and the condition must be code __init__ can run."""
  flags = child.sibling.tie_flags
  calls = [sub for method in methods.values() if method is not setup for sub in descendants(method)
           if isinstance(sub, cst.Call) and (sub.func is child.ctor or isinstance(sub.func, cst.Attribute)
                                             and is_self_attr(sub.func) and sub.func.attr.value == child.attr
                                             and not child.hoisted)]
  if not calls:
    raise Unsupported(child.ctor, f'self.{child.attr} ties layers on its call arguments and is not '
                                             'called: when Linen creates their params is unknown')
  names = child.sibling.call_params
  for param, flag in flags.items():
    conditions = set()
    for call in calls:
      value = next((a.value for i, a in enumerate(call.args)
                    if (a.keyword.value if a.keyword is not None else names[i] if i < len(names) else None) == param),
                   None)
      conditions.add(_given(ctx, value, plan, flag, methods.get('__call__')))
    if len(conditions) != 1:
      raise Unsupported(child.ctor, f'the calls of self.{child.attr} disagree on whether they pass '
                                               f'{param}: when Linen creates the tied layer\'s params is unknown')
    condition = conditions.pop()
    if condition != 'False':
      child.sizes[flag] = condition
    ctx.plan.pending.append((child.ctor, f'{flag}={condition} for self.{child.attr}: its calls '
                                      f'{"pass" if condition == "True" else "do not pass" if condition == "False" else "pass, when " + condition + ","} '
                                      f'{param}'))


def _given(ctx: ClassContext, value: cst.BaseExpression | None, plan: ClassRewrite, flag: str,
           method: cst.FunctionDef | None) -> str:
  """Code valid in __init__ that says whether `value` (an argument of a call) is not None. A `__call__` argument
  defaulting to None passed on (`self.predictions(h, shared_embedding=shared_embedding)`) gives the class a flag
  of its own, which its parents set."""
  if value is None or isinstance(value, cst.Name) and value.value == 'None':
    return 'False'
  if not isinstance(value, cst.Name):
    return 'True'
  scope = ctx.facts.scope(value)
  assignments = list(scope[value.value]) if scope is not None else []
  params = list(method.params.params[1:]) if method is not None else []
  if len(assignments) == 1 and any(assignments[0].node is p for p in params):
    default = assignments[0].node.default
    if isinstance(default, cst.Name) and default.value == 'None':
      own = plan.tie_flags
      if value.value not in own:
        taken = {*plan.field_names, *(n for n, _ in plan.size_params), *plan.flags, 'rngs'}
        while flag in taken:
          flag += '_'
        plan.flags.append(flag)
        own[value.value] = flag
        ctx.plan.pending.append((value, f'new constructor argument {flag} (default False): whether the callers pass '
                                     f'{value.value}, which {plan.name} passes on to a layer tied on it'))
      return own[value.value]
  values = []
  for assignment in assignments:
    target = ctx.facts.parent(assignment.node) if isinstance(assignment, cst.metadata.Assignment) else None
    assign = ctx.facts.parent(target) if isinstance(target, cst.AssignTarget) else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and target.target is assignment.node):
      raise Unsupported(value, f'{value.value}, passed to a tied layer\'s argument, is not a local bound '
                                          'by plain assignments')
    values.append(assign)
  nones = [a for a in values if isinstance(a.value, cst.Name) and a.value.value == 'None']
  if not nones:
    return 'True' if values else 'False'
  statement = value_else_none(ctx.facts.parent, values)  # `if T: x = <array> else: x = None`
  if statement is not None:
    test = statement.test
    try:
      queries.check_hoistable(ctx, test)
    except Unsupported:
      test = None
    if test is not None and not any(isinstance(n, cst.Name) and n.value in ctx.plan.switches
                                    for n in (test, *descendants(test))):
      return queries.code(ctx, test)
  raise Unsupported(value, f'{value.value}, passed to a tied layer\'s argument, is None or not under a '
                                      'condition __init__ cannot evaluate (converted: `if <fields or config>: x = '
                                      '<array> else: x = None`)')


def _tied_apply(ctx: ClassContext, call: cst.Call, child: Child, params_of_class: set[str]) -> None:
  """`<layer>.apply({'params': {...}}, x)`: the computation the layer runs with the given arrays, in its place."""
  operand = lambda node: _operand_code(ctx, node, params_of_class)
  code = ctx.facts.code(call)
  spec = child.spec
  args = call.args
  params = None
  if len(args) == 2 and all(a.keyword is None and not a.star for a in args):
    variables = literal_dict(args[0].value)
    params = literal_dict(variables['params']) if variables is not None and set(variables) == {'params'} else None
  if spec is not None and spec.linen == _CONV and params is not None and 'kernel' in params \
      and set(params) <= {'kernel', 'bias'}:
    _conv_apply(ctx, call, child, params, args[1].value, operand)
    return
  kernel = params['kernel'] if params is not None and set(params) == {'kernel'} else None
  if spec is None or not spec.tied_kwargs or kernel is None:
    raise Unsupported(call, f'{code}: only `<nn.Dense>.apply({{"params": {{"kernel": k}}}}, x)` (a tied output '
                            'projection) and `<nn.Conv>.apply({"params": {"kernel": k, "bias": b}}, x)` are converted')
  use_bias = child.kwargs.get('use_bias')
  if not (isinstance(use_bias, cst.Name) and use_bias.value == 'False') or set(child.kwargs) - spec.tied_kwargs:
    raise Unsupported(call, f'{code}: the Dense has a bias or options other than {", ".join(sorted(spec.tied_kwargs))} '
                            '(converted: use_bias=False)')
  inputs = args[1].value
  if any(isinstance(n, cst.Call) for n in (inputs, kernel, *descendants(inputs), *descendants(kernel))):
    raise Unsupported(call, f'{code}: a tied apply of calls (bind its input and kernel to locals first)')
  left, right = operand(inputs), operand(kernel)
  if 'dtype' in child.kwargs:  # Dense casts its input and kernel to its dtype (None: their common type)
    dtype = queries.code(ctx, child.kwargs['dtype'])
    left, right = f'jnp.asarray({left}, {dtype})', f'jnp.asarray({right}, {dtype})'
  elif 'precision' not in child.kwargs:
    left, right = _operand(left), _operand(right)
  if 'precision' in child.kwargs:
    text = f'jnp.matmul({left}, {right}, precision={queries.code(ctx, child.kwargs["precision"])})'
  else:
    text = f'{left} @ {right}'
    if not isinstance(ctx.facts.parent(call), (cst.Assign, cst.Return, cst.Arg, cst.AugAssign)):
      text = f'({text})'
  if 'jnp' in text and not queries.jnp_bound(ctx, call):
    ctx.plan.imports.append(('jax.numpy', None, 'jnp'))
  ctx.plan.exprs[call] = text
  ctx.plan.pending.append((call, f'{code} -> {text}: the tied projection the Dense computes with the given kernel'))


def _operand_code(ctx: ClassContext, node: cst.BaseExpression, params_of_class: set[str]) -> str:
  """The code of an operand of a tied apply, the class's own params read as their values (`self.bias` ->
  `self.bias[...]`)."""
  reads = {sub: f'self.{sub.attr.value}[...]' for sub in (node, *descendants(node))
           if isinstance(sub, cst.Attribute) and is_self_attr(sub) and sub.attr.value in params_of_class}
  return queries.code(ctx, node, reads)


def _conv_apply(ctx: ClassContext, call: cst.Call, child: Child, params: dict[str, cst.BaseExpression],
                inputs: cst.BaseExpression, operand: tp.Callable[[cst.BaseExpression], str]) -> None:
  """`self.conv.apply({'params': {'kernel': k, 'bias': b}}, x)` of an `nn.Conv` (transformers' weight-normed
  convolution, its kernel computed in the call) -> the convolution Linen's Conv runs with those arrays:
  `jax.lax.conv_general_dilated` over the input and kernel cast to the layer's dtype, plus the bias."""
  code = ctx.facts.code(call)
  kwargs = child.kwargs
  size = kwargs.get('kernel_size')
  rank = len(size.elements) if isinstance(size, (cst.Tuple, cst.List)) else 1 if isinstance(size, cst.Integer) else 0
  strides = literal_ints(kwargs['strides']) if 'strides' in kwargs else [1]
  padding = kwargs.get('padding')
  use_bias = kwargs.get('use_bias')
  biased = not (isinstance(use_bias, cst.Name) and use_bias.value == 'False')
  if set(kwargs) - child.spec.tied_kwargs or not 1 <= rank <= 3 or strides is None or len(strides) not in (1, rank) \
      or not (padding is None or isinstance(padding, cst.SimpleString) and padding.evaluated_value in _PADDINGS) \
      or 'dtype' not in kwargs or ('bias' in params) != biased or (use_bias is not None and not biased and
                                                                   not isinstance(use_bias, cst.Name)):
    raise Unsupported(call, f'{code}: a Conv run with given params is converted when it has a literal kernel_size '
                            'tuple, literal int strides, padding "SAME" or "VALID", a dtype, and a bias given exactly '
                            f'when it uses one (options: {", ".join(sorted(child.spec.tied_kwargs))})')
  for name, module in (('jax', 'jax'), ('jnp', 'jax.numpy')):
    bound = ctx.facts.names_of(call, name)
    if bound - {module}:
      raise Unsupported(call, f'{code}: the name {name} is bound to something other than {module} here')
    if not bound:
      ctx.plan.imports.append((module, None, None if name == 'jax' else name))
  dtype = queries.code(ctx, kwargs['dtype'])
  cast = lambda node: f'jnp.asarray({operand(node)}, {dtype})'
  spatial = 'DHW'[-rank:]
  options = [f"dimension_numbers=('N{spatial}C', '{spatial}IO', 'N{spatial}C')"]
  options += [f'{k}={queries.code(ctx, kwargs[k])}' for k in ('feature_group_count', 'precision') if k in kwargs]
  window = int_tuple(strides * rank if len(strides) == 1 else strides)
  text = (f'jax.lax.conv_general_dilated({cast(inputs)}, {cast(params["kernel"])}, {window}, '
          f'{queries.code(ctx, padding) if padding is not None else repr("SAME")}, {", ".join(options)})')
  if 'bias' in params:
    text += f' + {cast(params["bias"])}'
  if not isinstance(ctx.facts.parent(call), (cst.Assign, cst.Return, cst.Arg, cst.AugAssign)):
    text = f'({text})'
  ctx.plan.exprs[call] = text
  ctx.plan.pending.append((call, f'{code} -> jax.lax.conv_general_dilated(...): the convolution the Conv computes '
                                 'with the given params'))


def _variables_read(ctx: ClassContext, variables: cst.Attribute, child: Child) -> None:
  """`self.encoder.variables['params']['embed']['embedding']` -> `self.encoder.embed.embedding[...]`."""
  node, keys = variables, []
  while isinstance(parent := ctx.facts.parent(node), cst.Subscript) and parent.value is node and len(parent.slice) == 1 \
      and isinstance(parent.slice[0].slice, cst.Index) and isinstance(parent.slice[0].slice.value, cst.SimpleString):
    keys.append(parent.slice[0].slice.value.evaluated_value)
    node = parent
  code = ctx.facts.code(node)
  if not keys or keys[0] != 'params':
    raise Unsupported(node, f'{code}: only reads of one param, self.<child>.variables["params"][...], are converted')
  attrs, current = [], child
  for i, key in enumerate(keys[1:], start=2):
    last = i == len(keys)
    if current.sibling is not None:
      found = next((c for c in current.sibling.children if c.linen_name == key and (c.api is None or c.api == 'param')),
                   None)
      if found is None or (found.api == 'param') != last:
        break
      attrs.append(found.attr)
      current = found
      if last:
        ctx.plan.exprs[node] = f'self.{child.attr}.{".".join(attrs)}[...]'
        break
    elif current.spec is not None and last and not current.spec.params.fuse and not current.spec.params.drop:
      attrs.append(dict(current.spec.params.key_renames).get(key, key))
      ctx.plan.exprs[node] = f'self.{child.attr}.{".".join(attrs)}[...]'
      break
    else:
      break
  if node not in ctx.plan.exprs:
    raise Unsupported(node, f'{code}: the path does not name one param of a converted submodule')
  ctx.plan.pending.append((node, f'{code} -> {ctx.plan.exprs[node]}, the NNX Variable\'s value (gradients reach it from '
                              'every use)'))


def _operand(code: str) -> str:
  """`code` as an operand of `@`: a name, attribute, subscript or call as it is, anything else parenthesised."""
  try:
    node = cst.parse_expression(code)
  except cst.ParserSyntaxError:
    return f'({code})'
  return code if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) else f'({code})'
