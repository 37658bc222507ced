"""Report entries for L2N002: what a converted class's plan says to the user, and its record in the JSON
report (constructor arguments, children, input sizes by source)."""

from __future__ import annotations

import libcst as cst

from codemods.report import (
  EXAMPLE_INPUTS,
  FIELD,
  FLAG,
  INPUT_SIZE_SOURCES,
  RNGS,
  ChildName,
  ConstructorArgument,
)
from codemods.rules.l2n002.plan import ClassRewrite, init_params, linen_class

INIT_CACHE = 'init_cache(input_shape, dtype=jnp.float32)'
"""The method every converted class holding a decode cache gets; input_shape is the shape of its first
`__call__` argument at full length (what Linen's init saw), dtype the caches' (as the layers compute)."""


def class_changes(plan: ClassRewrite, linen_base: str, variable_classes: dict[str, str]) -> list[str]:
  """The change entries of a converted class, in order: its new signature, hoisted children, dropped train/eval
  switches, new Variable types and init_cache."""
  if plan.helpers_only:
    return [f'class {plan.name}({linen_base}) -> nnx.Module, a base class of helpers only: no __init__ (its '
            'subclasses build the layers)']
  changes = [f'class {plan.name}({linen_base}) -> {plan.base} with __init__({", ".join(init_params(plan))})']
  hoisted = [c for c in plan.children if c.hoisted]
  if hoisted:
    mapping = ', '.join(dict.fromkeys(  # arms building one attribute: once
        f'{c.linen_name} -> self.{c.attr}' + (
            f' (its cell {c.cell.linen_name} -> self.{c.attr}.{c.wrapper.cell_attribute})' if c.cell else '')
        for c in hoisted))
    what = 'submodules and variables' if any(c.api for c in hoisted) else 'submodules'
    where = '@nn.compact ' if plan.compact else 'setup() '  # setup(): a parameter a property reads (derived_params)
    changes.append(f'{plan.name}: {where}{what} hoisted into __init__: {mapping}')
  for name in plan.mode_fields:
    changes.append(f'{plan.name}: train/eval field {name} dropped; use model.train() / model.eval()')
  for _, name, _ in plan.mode_params:
    default = plan.switch_defaults.get(name)
    start = '' if default is None else f' (the layers it fed start in the mode of its default, {name}={default})'
    changes.append(f'{plan.name}.__call__: train/eval argument {name} dropped; use model.train() / model.eval()'
                   f'{start}')
  for collection in plan.collections:
    changes.append(f'new Variable type {variable_classes[collection]} for the Linen collection {collection!r}')
  if plan.cache_lines:
    own = [f'self.{c.attr}' for c in plan.children if c.cache]
    held = [f'self.{c.attr}.{c.spec.cache.method if c.spec else "init_cache"}' for c in plan.children if c.holds_cache]
    what = ([f'creates the decode caches {", ".join(own)} (None until then)'] if own else []) \
        + ([f'calls {", ".join(held)}'] if held else [])
    changes.append(f'{plan.name}: new method {INIT_CACHE}, input_shape being the shape of {plan.cache_input} at '
                   f'full length (what Linen\'s init saw): it {" and ".join(what)}; call it before decoding')
  return changes


def child_todos(plan: ClassRewrite) -> list[tuple[cst.CSTNode, str]]:
  """What a converted class leaves to the user: Linen children wrapped by nnx_bridge.from_linen, inexact layers."""
  todos = []
  for child in plan.children:
    if child.bridged:
      todos.append((child.ctor, f'self.{child.attr}: {linen_class(child)} stays Linen ({child.bridged}), wrapped '
                                f'with nnx_bridge.from_linen; pass {child.attr}_example_inputs, a tuple of example '
                                'inputs of its call (arrays or jax.ShapeDtypeStruct)'))
    layer = child.cell or child
    if layer.spec is not None and not layer.spec.exact:
      at = f'self.{child.attr}.{child.wrapper.cell_attribute}' if child.cell else f'self.{child.attr}'
      todos.append((layer.ctor, f'{at}: {layer.spec.nnx} does not compute what {layer.spec.linen} does with '
                                f'trained weights: {layer.spec.inexact or layer.spec.note}'))
  return todos


def constructor_arguments(plan: ClassRewrite) -> list[ConstructorArgument]:
  """The NNX constructor's arguments: fields, sizes, example inputs of bridged children, rngs."""
  fields = [ConstructorArgument(name, FIELD, param) for name, param in zip(plan.field_names, plan.params)]
  examples = [ConstructorArgument(f'{c.attr}_example_inputs', EXAMPLE_INPUTS,
                                  f'example inputs of self.{c.attr}, the Linen {linen_class(c)} wrapped by '
                                  'nnx_bridge.from_linen', c.attr)
              for c in {c.attr: c for c in reversed(plan.children) if c.bridged}.values()]  # once for all its arms
  examples += [ConstructorArgument(f'{c.attr}_{name}', EXAMPLE_INPUTS, f'{name} of self.{c.attr} ({c.sibling.name})',
                                   c.attr, child_argument=name)
               for c in plan.children if c.sibling is not None for name in c.sibling.example_params]
  flags = [ConstructorArgument(name, FLAG, f'{name}: bool = False, ties a layer (see the class\'s TODO)')
           for name in plan.flags]
  return [*fields, *plan.size_arguments, *flags, *examples, ConstructorArgument('rngs', RNGS, 'nnx.Rngs')]


def child_names(plan: ClassRewrite) -> list[ChildName]:
  """Linen name -> NNX attribute of each child (a wrapped cell is named in the scope that built it)."""
  children = [ChildName(c.linen_name, c.attr, linen_class(c)) for c in plan.children]
  return children + [ChildName(c.cell.linen_name, f'{c.attr}.cell', linen_class(c.cell))
                     for c in plan.children if c.cell is not None]


def input_sizes(plan: ClassRewrite) -> dict[str, int]:
  """The class's layer input sizes (table layers, cells, `x.shape[-1]` in variables) by where they came from."""
  arguments = {name for name, _ in plan.size_params}
  counts = dict.fromkeys(INPUT_SIZE_SOURCES, 0)
  for child in plan.children:
    if child.spec is None and child.wrapper is None and child.api is None:
      continue  # a class of the file: its layers are counted in its own record
    for value in [*child.sizes.values(), *child.size_codes.values()]:
      source = 'arguments' if value in arguments else 'examples' if value in plan.traced_codes else 'code'
      counts[source] += 1
  return counts
