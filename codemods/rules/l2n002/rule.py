"""The L2N002 rule: libcst visitor glue over the passes (see the package docstring)."""

from __future__ import annotations

import dataclasses
import typing as tp

import libcst as cst
from libcst.metadata import QualifiedNameProvider, ScopeProvider

from codemods.report import TO_LINEN_BRIDGED
from codemods.rule import CLASSES_KEY, MigrationRule
from codemods.rules.l2n002 import emit, entries, nodes
from codemods.rules.l2n002.decide import LeftLinen, decide_classes
from codemods.rules.l2n002.factory_fields import unconverted_suppliers
from codemods.rules.l2n002.factory_scan import with_factories
from codemods.rules.l2n002.facts import FileFacts, analyse_file
from codemods.rules.l2n002.interface import interface_of, sibling_plan
from codemods.rules.l2n002.linen_parents import ToLinenBridge, bridge_facts
from codemods.rules.l2n002.plan import ClassRewrite, FileRewrite
from codemods.rules.l2n002.sizes import setup_bindings
from codemods.vocabulary import COMPACT_NAMES


class ConvertModuleDefinitionsRule(MigrationRule):
  """Converts Linen module classes built from table layers and scope variables into NNX modules."""

  CODE = 'L2N002'
  REQUIRES = ('Module',)
  DECIDES_CLASSES = True
  DESCRIPTION = 'nn.Module classes (setup or @nn.compact) -> nnx.Module with __init__(..., rngs).'
  METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider)

  def __init__(self, context: cst.codemod.CodemodContext) -> None:
    super().__init__(context)
    self.facts: FileFacts | None = None  # set by visit_Module
    self.file = FileRewrite()
    self.left: dict[str, LeftLinen] = {}  # the classes left as Linen, by name
    self.bridges: dict[str, list[ToLinenBridge]] = {}  # Linen class -> its to_linen constructions

  def visit_Module(self, node: cst.Module) -> None:
    imported = {name: sibling_plan(record.interface, name.rpartition('.')[0])  # by qualified name, of its module
                for name, record in self.imported_classes.items() if record.interface is not None}
    facts = with_factories(analyse_file(node, self.get_metadata, self.context.filename, self.options, self.hierarchy,
                                        self.kept_classes, self.unbridged_classes, imported))
    decisions = decide_classes(facts)
    self.facts, self.file, self.left = decisions.facts, decisions.file, decisions.left
    self.report_awaited(facts.awaited)
    for bridge in decisions.bridges:
      self.bridges.setdefault(bridge.user, []).append(bridge)
      self.file.exprs[bridge.call] = bridge.code

  def visit_ClassDef(self, node: cst.ClassDef) -> None:
    left = self.left.get(node.name.value)
    if left is not None and self.facts.class_defs.get(node.name.value) is node:
      self.report_todo(left.node, left.message)
      for bridge in self.bridges.get(node.name.value, ()):
        self.add_needed_import('nnx_bridge')
        built = bridge.built.rpartition('.')[2]  # a class of another file: by its qualified name
        if bridge.test:
          self.report_change(bridge.call, f'isinstance(..., {built}) -> nnx_bridge.is_instance: {built}, converted to '
                                          f'NNX, is wrapped with nnx_bridge.to_linen in {bridge.user}')
          continue
        self.report_change(bridge.call, f'{built}, converted to NNX, is built by {bridge.user}, which stays '
                                        f'Linen: {TO_LINEN_BRIDGED}, its variables keep their Linen paths')
      return
    plan = self.file.classes.get(node)
    if plan is None:
      return
    for module, obj, asname in plan.imports:
      self.add_needed_import(module, obj, asname)
    self.add_needed_import('flax', 'nnx')
    if plan.cache_lines and not self.facts.names_of(node, 'jnp'):
      self.add_needed_import('jax.numpy', asname='jnp')
    if plan.example_params:
      self.add_needed_import('nnx_bridge')
    for used in plan.linen_nodes:
      self.remove_import_of(used)
    self._report(node, plan)
    for where, message in plan.pending:
      self.report_change(where, message)
    for where, message in entries.child_todos(plan):
      self.report_todo(where, message)

  def on_leave(self, original_node: cst.CSTNode, updated_node: tp.Any) -> tp.Any:
    updated_node = super().on_leave(original_node, updated_node)
    if original_node in self.file.removed:
      return cst.RemoveFromParent()
    if original_node in self.file.scan_names:
      return cst.parse_expression(f'self.{self.file.scan_names[original_node].attr}')
    if original_node in self.file.exprs:
      return cst.parse_expression(self.file.exprs[original_node])
    if original_node in self.file.lists:  # a setup() list of layers, its elements converted: an nnx.List
      return cst.Call(cst.parse_expression('nnx.List'), [cst.Arg(updated_node)])
    if original_node in self.file.ifs:
      kept = nodes.arm_run(updated_node, self.file.ifs[original_node])
      return cst.FlattenSentinel(kept) if kept else cst.RemoveFromParent()
    if original_node in self.file.statements:
      return cst.parse_statement(self.file.statements[original_node]).with_changes(leading_lines=updated_node.leading_lines)
    return updated_node

  def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
    file = self.file
    dropped = file.calls.get(original_node, (None, set()))[1]
    if original_node in file.scan_calls:
      return emit.scan_call(file.scan_calls[original_node], updated_node)
    if original_node in file.stack_calls:
      return emit.stack_call(file.stack_calls[original_node], updated_node, dropped)
    if original_node in file.remat_calls:
      return emit.remat_call(file.remat_calls[original_node], original_node, updated_node, dropped)
    if original_node in file.while_loops:
      return emit.while_loop_call(updated_node)
    if original_node in file.calls:
      updated_node = emit.submodule_call(file.calls[original_node], updated_node)
    if original_node in file.keywords:
      updated_node = nodes.with_keyword(updated_node, file.keywords[original_node])
    if original_node in file.eval_views:
      return emit.eval_view_call(updated_node)
    return updated_node

  def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
    if original_node not in self.file.methods and original_node not in self.file.added_params:
      return updated_node
    dropped = self.file.methods.get(original_node, set())
    parameters = updated_node.params
    params = [p for p in parameters.params if p.name.value not in dropped]
    keyword_only = [p for p in parameters.kwonly_params if p.name.value not in dropped]
    added = [cst.ensure_type(cst.parse_statement(f'def f(*, {code}): pass'), cst.FunctionDef).params.kwonly_params[0]
             for code in self.file.added_params.get(original_node, ())]  # `call_fields.py`
    keyword_only += added
    star = cst.ParamStar() if added and isinstance(parameters.star_arg, cst.MaybeSentinel) else parameters.star_arg
    star = star if keyword_only or not isinstance(star, cst.ParamStar) \
        else cst.MaybeSentinel.DEFAULT  # `*, train` with train gone: no bare `*`
    last = keyword_only or ([] if parameters.star_kwarg or isinstance(star, cst.Param) else params)
    if last and not parameters.star_kwarg:
      last[-1] = last[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    if params and (keyword_only or not isinstance(star, cst.MaybeSentinel)) and params[-1].comma == cst.MaybeSentinel.DEFAULT:
      params[-1] = params[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(' ')))
    body = updated_node.body
    if body.body and isinstance(body, cst.IndentedBlock) and body.body[0].leading_lines \
        and all(line.comment is None for line in body.body[0].leading_lines):  # the statement above it went
      first = body.body[0].with_changes(leading_lines=[])
      updated_node = updated_node.with_changes(body=body.with_changes(body=[first, *body.body[1:]]))
    decorators = [  # @nn.nowrap is gone already (`removed`)
        new for old, new in zip([d for d in original_node.decorators if d not in self.file.removed], updated_node.decorators)
        if not self.facts.has_name(old.decorator, COMPACT_NAMES)
    ]
    parameters = parameters.with_changes(params=params, kwonly_params=keyword_only, star_arg=star)
    return updated_node.with_changes(params=parameters, decorators=decorators)

  def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
    plan = self.file.classes.get(original_node)
    return updated_node if plan is None else emit.class_body(plan, updated_node)

  def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
    """Puts each generated Variable type just above the first class that uses it."""
    for name, supplier in unconverted_suppliers(self.facts.factories, self.file.plans):
      self.report_todo(self.facts.class_defs[supplier], f'{supplier} stays Linen but passes layer factories to {name}, '
                                                  'converted to NNX: pass NNX factories (partial(nnx.Conv, ...))')
    body: list[cst.CSTNode] = []
    done: set[str] = set()
    for old, new in zip(original_node.body, updated_node.body):
      plan = self.file.classes.get(old)
      needed = [c for c in (plan.collections if plan else ()) if c not in done]
      if needed:
        blank = 0
        while blank < len(new.leading_lines) and new.leading_lines[blank].comment is None:
          blank += 1
        for i, collection in enumerate(needed):
          spacing = new.leading_lines[:blank] if i == 0 else [cst.EmptyLine(), cst.EmptyLine()]
          body.append(emit.variable_class(collection, self.file.variable_classes[collection])
                       .with_changes(leading_lines=spacing))
        new = new.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *new.leading_lines[blank:]])
        done.update(needed)
      body.append(new)
    return updated_node.with_changes(body=body) if done else updated_node

  # --- report ----------------------------------------------------------------------------------

  def _report(self, node: cst.ClassDef, plan: ClassRewrite) -> None:
    for message in entries.class_changes(plan, self.facts.code(self.facts.linen_base(node).value), self.file.variable_classes):
      self.report_change(node, message)
    if plan.helpers_only:
      return
    self.report_class(node, plan.name, entries.constructor_arguments(plan), entries.child_names(plan),
                      call_arguments=plan.call_params, mode_arguments=[name for _, name, _ in plan.mode_params])
    records = self.context.scratch[CLASSES_KEY]  # the record report_class just made
    records[-1] = dataclasses.replace(records[-1], cache_input=plan.cache_input, input_sizes=entries.input_sizes(plan),
                                      mode_defaults={name: plan.switch_defaults[name] for _, name, _ in plan.mode_params
                                                     if name in plan.switch_defaults},
                                      interface=interface_of(plan, setup_bindings(self.facts, plan.name),
                                                             bridge_facts(self.facts, plan)))
