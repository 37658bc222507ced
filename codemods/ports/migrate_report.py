"""`--migrate-report FILE.json`: build and check an NNX port from what `linen2nnx migrate` recorded.

`migrate --report-json` records, for each class it converted, where each argument of the new
`__init__` comes from and which NNX attribute each Linen submodule became. `verify` and
`convert` find the record of the NNX class they are given and use it three ways: to construct
the class (sizes are measured on the Linen model's own submodule calls, not guessed), to pair
Linen submodules with NNX attributes by name when deriving the leaf mapping, and to check that
the mapping agrees with it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import json
import os
import re
import typing as tp

from flax import linen as nn
from flax import nnx

from codemods import report
from codemods.ports import linen_names
from nnx_bridge import derive
from nnx_bridge import modes
from nnx_bridge.errors import BridgeError
from nnx_bridge.layer_table import find_layer_of_class
from nnx_bridge.linen_trace import LinenCall
from nnx_bridge.linen_trace import trace_linen
from nnx_bridge.treemap import TreeMapping

Path = tuple[str, ...]


class ReportError(ValueError):
  """A migrate report that has no usable record for the models given; commands exit 2 on it."""


class ReportMismatchError(BridgeError):
  """The leaf mapping puts a Linen submodule's leaves somewhere else than the record says."""


def _same_file(entry: str, source: str, report_dir: str) -> bool:
  """Whether a report's path names `source`: as given, or relative to the report's folder."""
  for candidate in dict.fromkeys((entry, os.path.join(report_dir, entry))):
    if os.path.isfile(candidate) and os.path.samefile(candidate, source):
      return True
  return False


def find_record(
    report_path: str, nnx_class: type
) -> tuple[str, report.ConvertedClass, dict[str, report.ConvertedClass]]:
  """The report's path of `nnx_class`'s file, its record, and that file's records by Linen name.

  A record matches when its `nnx_name` is the class's name and its file, as given or relative to
  the report's folder, is the file defining the class. None or several: ReportError.
  """
  with open(report_path, encoding='utf-8') as file:
    try:
      document = json.load(file)
    except json.JSONDecodeError as error:
      raise ReportError(f'{report_path}: not JSON ({error})') from None
  try:
    files = report.converted_classes_from_json(document)
  except ValueError as error:
    raise ReportError(f'{report_path}: {error}') from None
  source = inspect.getsourcefile(nnx_class)
  name = nnx_class.__name__
  report_dir = os.path.dirname(os.path.abspath(report_path))
  matches = [
      (path, record)
      for path, records in files.items()
      for record in records
      if record.nnx_name == name and source and _same_file(path, source, report_dir)
  ]
  if not matches:
    elsewhere = [path for path, records in files.items() if any(r.nnx_name == name for r in records)]
    recorded = f'{name} only in {", ".join(elsewhere)}' if elsewhere else f'no class named {name}'
    raise ReportError(
        f'{report_path} has no record of class {name} of {source}: it records {recorded} (its paths '
        'are read as written and relative to the report\'s folder)'
    )
  if len(matches) > 1:
    where = ', '.join(f'{path}:{record.line}' for path, record in matches)
    raise ReportError(f'{report_path} has {len(matches)} records of class {name} of {source} ({where}); keep one')
  path, record = matches[0]
  return path, record, {r.linen_name: r for r in files[path]}


@dataclasses.dataclass(frozen=True)
class Port:
  """The record of one converted class, with the Linen model it was converted from, traced.

  `records` are the records of the class's file by Linen name: a child that is an instance of a
  class of `defining_module` (the Python module of the Linen class) is followed into its own.
  """

  where: str
  record: report.ConvertedClass
  records: dict[str, report.ConvertedClass]
  defining_module: str
  classes: dict[Path, type]
  calls: dict[tuple[Path, str], LinenCall]

  def _record_at(self, path: Path) -> report.ConvertedClass | None:
    """The record of the converted class the Linen module at `path` is an instance of, if any."""
    if not path:
      return self.record
    cls = self.classes.get(path)
    if cls is None or cls.__module__ != self.defining_module:
      return None
    return self.records.get(cls.__name__)

  def _fields(self, path: Path) -> dict[str, tp.Any]:
    """The field values of the Linen module at `path`, from its first call."""
    return next((call.fields for (call_path, _), call in self.calls.items() if call_path == path), {})

  def _label(self, path: Path) -> str:
    cls = self.classes.get(path)
    return f'Linen {"/".join(path) or "<root>"}' + (f' ({cls.__name__})' if cls else '')

  # --- Constructor arguments -------------------------------------------------------------------

  def check_signature(self, nnx_class: type) -> None:
    """The record's arguments must be the class's: else the report is of another version of it."""
    parameters = list(inspect.signature(nnx_class.__init__).parameters.values())[1:]
    taken = [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    recorded = [argument.name for argument in self.record.arguments]
    if set(taken) != set(recorded):
      raise ReportError(
          f'{self.where} lists the arguments {recorded}, but {nnx_class.__name__}.__init__ takes {taken}: '
          'the report is of another version of the class; run linen2nnx migrate --report-json again'
      )

  def measured_sizes(self) -> dict[str, tp.Callable[[], tuple[tp.Any, str]]]:
    """For each size argument and each example-inputs argument of the record, a function measuring it on the
    Linen model: (value, where it was read)."""

    def measure(name: str) -> tuple[int, str]:
      try:
        return self._measure(self.record, name, ())
      except ReportError as error:
        raise ReportError(f'{error}; pass it: --nnx-kwargs \'{{"{name}": ...}}\'') from None

    def example(name: str) -> tuple[tuple[tp.Any, ...], str]:
      try:
        return self._example_inputs(self.record, name, ())
      except ReportError as error:
        raise ReportError(f'{error}; pass it: --nnx-kwargs \'{{"{name}": ...}}\'') from None

    measured = {
        argument.name: functools.partial(measure, argument.name)
        for argument in self.record.arguments
        if argument.origin in (report.INPUT_DIMENSION, report.UNDETERMINED)
    }
    return {**measured, **{argument.name: functools.partial(example, argument.name)
                           for argument in self.record.arguments if argument.origin == report.EXAMPLE_INPUTS}}

  def _example_inputs(self, record: report.ConvertedClass, name: str, path: Path) -> tuple[tuple[tp.Any, ...], str]:
    """Example inputs argument `name` of `record`'s class (the Linen module at `path`): the positional inputs of
    the first call of the Linen child it is for, arrays as `jax.ShapeDtypeStruct`s; followed into a converted
    child's record when it passes them on (`child_argument`)."""
    argument = next((a for a in record.arguments if a.name == name), None)
    linen_name = _first_element({c.nnx_attribute: c.linen_name for c in record.children}.get(argument.child),
                                self._fields(path)) if argument else None
    if linen_name is None:
      raise ReportError(f'{self.where}: {record.nnx_name}({name}=...) names no Linen child of its record')
    child = (*path, linen_name)
    if argument.child_argument is not None:
      inner = self._record_at(child)
      if inner is None:
        raise ReportError(f'{self.where}: {self._label(child)} is not a converted class with a record')
      return self._example_inputs(inner, argument.child_argument, child)
    call = self.calls.get((child, '__call__'))
    if call is None:
      raise ReportError(f'{self._label(child)} is not called on these inputs, so {record.nnx_name}({name}=...) '
                        'cannot be measured')
    shapes = ', '.join(str(list(value.shape)) for value in call.example if hasattr(value, 'shape'))
    return call.example, f'the inputs of the first call of {self._label(child)} ({shapes})'

  def _measure(self, record: report.ConvertedClass, name: str, path: Path) -> tuple[int | tuple[int, ...], str]:
    """Size argument `name` of `record`'s class, the Linen module at `path`, and how it was read.

    The argument says what it is: an argument of a child (`child_argument`), measured on the
    child's call (a child that is itself a converted class passes it on to one of its own size
    arguments, whose record says where it goes); or else the last axis of an input (`input`, as
    in a variable's shape), measured on the module's own call.
    """
    argument = next((a for a in record.arguments if a.name == name), None)
    where = f'{record.nnx_name}({name}=...)'
    if argument is None or argument.origin not in (report.INPUT_DIMENSION, report.UNDETERMINED):
      raise ReportError(f'{self.where}: {where} is not a size argument of its record')
    if argument.child_argument is None and argument.input is not None:
      return self._last_axis(path, argument.input, where)
    if argument.child_argument is None or argument.child is None:
      raise ReportError(f'{self.where}: {where} is not determined by the code ({argument.detail})')
    template = {c.nnx_attribute: c.linen_name for c in record.children}.get(argument.child)
    if argument.per_element and template is not None and '{' in template:
      others = {linen_names.resolve(c.linen_name, self._fields(path)) for c in record.children
                if c.nnx_attribute != argument.child}
      return self._each_element(path, template, argument.child_argument, where, others, argument.element_offset)
    linen_name = _first_element(template, self._fields(path))
    if linen_name is None:
      raise ReportError(f'{self.where}: the record of {record.nnx_name} names no Linen child {argument.child}')
    child = (*path, linen_name)
    if '{' in template:  # a list of several classes: the first element whose class takes the argument
      child = self._element_taking(path, template, argument.child_argument) or child
    inner = self._record_at(child)
    if inner is None:
      return self._layer_size(child, argument.child_argument, where)
    arm_argument = self._arm_argument(record, argument, inner)
    if arm_argument is None:  # Dinov2's `self.mlp`: SwiGLU in one arm, an MLP in the other, which this model built
      return 1, (f'unused: {where} sizes the {argument.child} another arm of an if builds, where this model built '
                 f'{inner.nnx_name}')
    return self._measure(inner, arm_argument, child)

  def _element_taking(self, path: Path, template: str, argument: str) -> Path | None:
    """The first element of the list the module at `path` names by `template` whose converted class takes the size
    argument `argument` (RegNet's Y layer: its squeeze-and-excitation layer, third of four), else None."""
    seen: set[Path] = set()
    for k in itertools.count():
      element = (*path, linen_names.resolve(re.sub(r'\{\w*\}', str(k), template), self._fields(path)))
      if element in seen or element not in self.classes:  # (a name that does not change with the index: once)
        return None
      seen.add(element)
      inner = self._record_at(element)
      if inner is not None and any(a.name == argument for a in inner.arguments):
        return element
    return None

  def _each_element(self, path: Path, template: str, nnx_argument: str, where: str,
                    others: set[str | None], offset: int = 0) -> tuple[tuple[int, ...], str]:
    """A per-element size argument (`tuple[int, ...]`): `nnx_argument` of each element of the layer list the Linen
    module at `path` names by `template` (`Dense_{i}`), measured on each element's call, in order, from the element
    after the `offset` layers written out before the loop's (RegNet's first stage) up to a name another child of the
    record takes (`others`: the layer after the loop's, `Dense_{self.num_layers}`)."""
    if not re.fullmatch(r'[^{}]*\{\w*\}[^{}]*', template):
      raise ReportError(f'{self.where}: {where} sizes the elements of a list named {template}, which are not '
                        'numbered by their index')
    sizes, described = [], []
    while (element := (*path, re.sub(r'\{\w*\}', str(offset + len(sizes)), template))) in self.classes \
        and element[-1] not in others:
      inner = self._record_at(element)
      size, how = self._layer_size(element, nnx_argument, where) if inner is None else \
          self._measure(inner, nnx_argument, element)
      sizes.append(size)
      described.append(how)
    if not sizes:
      raise ReportError(f'{self._label((*path, template))} is not called on these inputs, so {where} cannot be '
                        'measured')
    return tuple(sizes), '; '.join(described)

  def _arm_argument(self, record: report.ConvertedClass, argument: report.ConstructorArgument,
                    inner: report.ConvertedClass) -> str | None:
    """`argument.child_argument`; or, where the arms of an if build the child from other classes (T5's gated or
    plain feed-forward: `wi_0_in_features` or `wi_in_features`) and the record names the first arm's, the size
    argument of `inner` (the class this model built) that reads the same input of its call; None where the
    argument sizes only an arm this model did not build (its value is then never read)."""
    if any(a.name == argument.child_argument for a in inner.arguments):
      return argument.child_argument
    arms = [self.records.get(c.linen_class) for c in record.children if c.nnx_attribute == argument.child]
    first = next((a for arm in arms if arm is not None for a in arm.arguments if a.name == argument.child_argument),
                 None)
    twins = [a.name for a in inner.arguments if first is not None and first.input is not None
             and (a.origin, a.input) == (first.origin, first.input)]
    if len(twins) == 1:
      return twins[0]
    return None if first is not None and len(arms) > 1 else argument.child_argument

  def _layer_size(self, path: Path, nnx_argument: str, where: str) -> tuple[int, str]:
    """NNX argument `nnx_argument` of the table layer at Linen `path`, read off its first call."""
    label = self._label(path)
    call = self.calls.get((path, '__call__'))
    if call is None:
      raise ReportError(f'{label} is not called on these inputs, so {where} cannot be measured')
    row = find_layer_of_class(self.classes[path])
    source = dict(row.derived).get(nnx_argument) if row else None
    shapes = call.shapes(row.call_args) if row else ()
    value = source.evaluate(call.fields, shapes) if source else None
    if value is None:
      raise ReportError(f'{where}: the layer table does not say how {nnx_argument} of {label} is read off its inputs')
    inputs = ', '.join(f'{arg} {list(shape)}' for arg, shape in zip(row.call_args, shapes) if shape)
    return value, f'{nnx_argument} of {label} = {source.describe(row.call_args)}, measured on its call ({inputs})'

  def _last_axis(self, path: Path, name: str, where: str) -> tuple[int, str]:
    """The last axis of argument `name` of the first method of the Linen module at `path` that takes it."""
    label = self._label(path)
    for (call_path, method), call in self.calls.items():
      shape = call.named.get(name)
      if call_path == path and shape:
        return shape[-1], f'the last axis of {name} of {label}.{method}, measured on its call ({name} {list(shape)})'
    raise ReportError(
        f'{where}: no method of {label} called on these inputs takes an array {name}, so the last axis '
        f'of {name} cannot be measured'
    )

  # --- Child names -----------------------------------------------------------------------------

  def translate(self, linen_path: Path) -> tuple[Path, int, str | None]:
    """The NNX path the records give the longest prefix of a Linen path, and that prefix's length.

    The third item names a record that lacks the next component (a child it does not know), else
    None: the walk stopped at a module that is not a converted class (a table layer).
    """
    nnx_path: list[str] = []
    for index, name in enumerate(linen_path):
      record = self._record_at(linen_path[:index])
      if record is None:
        return tuple(nnx_path), index, None
      attribute = {c.linen_name: c.nnx_attribute for c in record.children}.get(name)
      if attribute is None:
        from codemods.rules.l2n002.loops import loop_entry  # `block_{i}`: an entry of an nnx.List built in a loop

        entry = loop_entry(record.children, name)
        if entry == ():  # a name after a loop of unknown length: not known from the records alone
          return tuple(nnx_path), index, None
        if entry is not None:
          nnx_path.extend(entry)
          continue
        return tuple(nnx_path), index, record.nnx_name
      nnx_path.extend(attribute.split('.'))  # `encoder.cell`: a cell Linen names beside the wrapper running it
    return tuple(nnx_path), len(linen_path), None

  def layer_pairs(self) -> dict[Path, Path]:
    """Each Linen module path the records translate whole, with its NNX path (for `derive_mapping`)."""
    pairs = {}
    for path in self.classes:
      nnx_path, length, _ = self.translate(path)
      if length == len(path):
        pairs[path] = nnx_path
    return pairs

  def disagreements(self, mapping: TreeMapping, nnx_model: nnx.Module | None = None) -> list[str]:
    """Where `mapping` puts a Linen submodule's leaves elsewhere than the records name it, one line each.

    A module NNX reaches by several paths (one embedding shared by encoder and decoder) is listed
    under one of them: the mapping may use any path to the object the record names.
    """
    problems: dict[str, None] = {}
    for rule in mapping.rules:
      for key in rule.linen:
        linen_path = tuple(key[1:])
        nnx_path, length, lacking = self.translate(linen_path)
        prefix = '/'.join(linen_path[: length + 1])
        if lacking is not None and length < len(linen_path) - 1:
          problems[f'Linen {prefix}: the record of {lacking} has no such child'] = None
        elif rule.nnx[: len(nnx_path)] != nnx_path \
            and not _same_object(nnx_model, rule.nnx[: len(rule.nnx) - (len(linen_path) - length)], nnx_path):
          problems[
              f'Linen {"/".join(linen_path[:length])}: the report says NNX {"/".join(nnx_path)}, the mapping '
              f'puts its leaves in {"/".join(rule.nnx[: len(nnx_path)])}'
          ] = None
    return list(problems)

  def mapping(
      self, linen_module: nn.Module, nnx_model: nnx.Module, *inputs: tp.Any, **call_kwargs: tp.Any
  ) -> tuple[TreeMapping, list[str]]:
    """The leaf mapping with layers paired by the records' names, and where call order disagrees.

    The second item lists the layers that call order alone would pair otherwise (empty when it
    cannot pair them at all): a port that calls branches in another order, or a wrong report.
    Raises MappingError (with those lines) when the named pairs do not fit, and ReportMismatchError
    when the mapping contradicts the records (a pair that names no layer, a child they lack).
    """
    try:
      by_order = self.disagreements(derive.derive_mapping(linen_module, nnx_model, *inputs, **call_kwargs), nnx_model)
    except derive.MappingError:
      by_order = []
    try:
      mapping = derive.derive_mapping(linen_module, nnx_model, *inputs, layer_pairs=self.layer_pairs(), **call_kwargs)
    except derive.MappingError as error:
      if by_order:
        raise derive.MappingError(f'{error}\nnote: {call_order_note(by_order)}') from error
      raise
    contradictions = self.disagreements(mapping, nnx_model)
    if contradictions:
      lines = ''.join(f'\n  {line}' for line in contradictions)
      raise ReportMismatchError(f'the leaf mapping does not agree with {self.where}:{lines}')
    return mapping, by_order


def _same_object(model: nnx.Module | None, path: Path, other: Path) -> bool:
  """Whether two attribute paths of `model` lead to one object (NNX reference sharing)."""
  if model is None:
    return False

  def at(path: Path) -> tp.Any:
    node = model
    for key in path:
      node = node[int(key)] if str(key).isdigit() else getattr(node, str(key), None)
    return node

  try:
    found = at(path)
  except (IndexError, KeyError, TypeError):
    return False
  return found is not None and found is at(other)


def call_order_note(disagreements: tp.Sequence[str]) -> str:
  """Says that the call order pairs layers unlike the report's names, naming them."""
  lines = ''.join(f'\n  {line}' for line in disagreements)
  return (
      "the call order pairs layers unlike the migrate report's names (the port calls them in another "
      f'order, or the report is wrong); by call order:{lines}'
  )


def load_port(
    report_path: str, nnx_class: type, linen: nn.Module, inputs: tuple[tp.Any, ...], call_kwargs: dict[str, tp.Any]
) -> Port:
  """The record of `nnx_class` in the report, checked against the Linen model, which is traced."""
  path, record, records = find_record(report_path, nnx_class)
  where = f'the record of {record.nnx_name} ({path}:{record.line}) in {report_path}'
  if type(linen).__name__ != record.linen_name:
    raise ReportError(f'{where} converts Linen {record.linen_name}, but the Linen model is a {type(linen).__name__}')
  trace = trace_linen(linen, inputs, call_kwargs, mode=modes.EVAL)
  port = Port(where, record, records, type(linen).__module__, trace.classes, trace.first_calls)
  port.check_signature(nnx_class)
  return port


def _first_element(linen_name: str | None, fields: tp.Mapping[str, tp.Any]) -> str | None:
  """The Linen name of the first element of a layer list the record names by a pattern (`{i}`, `block_{i}`: the
  elements `0`, `block_0`, ...), where its size arguments are measured (the others' follow from it in the port's
  code); a layer numbered after a loop's by its parent's `fields` (`Dense_{self.num_layers}`: `linen_names`); any
  other name as it is."""
  if linen_name is None:
    return None
  return linen_names.resolve(re.sub(r'\{\w+\}', '0', linen_name), fields)
