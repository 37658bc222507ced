"""Where a migrated tree would break at the seams between Linen and NNX code: the run's post-condition.

After the rules ran over every file, some classes are NNX and others stayed Linen, maybe in other
files than the code that uses them. `find_seams` reads the migrated sources (with Python's `ast`,
fast and enough for names and calls) and lists each use of an NNX class of the run that cannot
work as written:

- `LINEN_BUILDS_NNX`: a Linen class builds (or names) an NNX class other than through
  `nnx_bridge.to_linen`; it would build it the Linen way and fail at `init`.
- `LINEN_SUBCLASSES_NNX`: a Linen-style class (fields, `setup`, `@nn.compact`) subclasses an NNX class.
- `HELD_FOR_LINEN_CODE`: a class that is no module holds an NNX class in a class attribute
  (transformers' `class FlaxBertModel(FlaxBertPreTrainedModel): module_class = FlaxBertModule`), for
  code out of sight (a base class, a library) that builds it with Linen's arguments and runs it with
  `.init` / `.apply`.
- `MISSING_ARGUMENTS`: code outside Linen classes calls an NNX class without an argument its
  `__init__` requires (`rngs`, a layer size the conversion added), or with a keyword it does not take (a field
  the class now takes at its call).
- `LINEN_API_ON_NNX`: `.init` / `.apply` / `.init_with_output` / `.bind` / `.tabulate` on an NNX
  instance (built in the same expression, or bound to a name of the same function).
- `LOOKUP_BY_NAME`: `getattr(models, config.model)` on a module of the run that defines NNX classes
  (flax's imagenet `train.py`): which class it gives, and how it is then built and run, is out of
  sight.

The engine keeps the NNX class of the first three kinds Linen (its conversion is undone), and puts a
TODO above the statement of the other three (`codemods/decisions.py`); a use whose TODO is already there is
reported with `flagged=True`, so that a second run changes nothing. Names resolve through each file's
imports, as in `hierarchy.py`, and through module-level aliases of a class (`ResNet18 = partial(ResNet,
stage_sizes=[2, 2, 2, 2])`, flax's imagenet models; `Model = CNN`): a call of the alias gives what the
partial gives.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import typing as tp

from codemods.analysis.hierarchy import absolute_import
from codemods.analysis.hierarchy import module_names
from codemods.analysis.hierarchy import package_of
from codemods.rule import TODO_PREFIX
from codemods.vocabulary import PARTIAL_NAMES

LINEN_BUILDS_NNX = 'linen-builds-nnx'
LINEN_SUBCLASSES_NNX = 'linen-subclasses-nnx'
HELD_FOR_LINEN_CODE = 'held-for-linen-code'
MISSING_ARGUMENTS = 'missing-arguments'
LINEN_API_ON_NNX = 'linen-api-on-nnx'
LOOKUP_BY_NAME = 'lookup-by-name'
IMPORTABLE_SEAMS = frozenset({MISSING_ARGUMENTS, LINEN_API_ON_NNX})
"""The seams L2N003 may convert once it knows the record of a class another file converted (`engine._settle`)."""
LINEN_APIS = frozenset({'init', 'apply', 'init_with_output', 'bind', 'tabulate', 'lazy_init'})
_NNX_MODULE = frozenset({'flax.nnx.Module', 'flax.nnx.module.Module'})
_LINEN_MODULE = frozenset({'flax.linen.Module', 'flax.linen.module.Module'})
_BRIDGES = frozenset({'to_linen', 'ToLinen', 'is_instance'})  # an NNX class named in their arguments is bridged
_CLASS_USES = frozenset({LINEN_BUILDS_NNX, LINEN_SUBCLASSES_NNX, HELD_FOR_LINEN_CODE})


@dataclasses.dataclass(frozen=True)
class Seam:
  """One use of an NNX class that breaks, in the migrated source of `path` (1-based line, 0-based column)."""

  path: str
  line: int
  column: int
  kind: str
  target: str  # the NNX class, fully qualified
  target_path: str  # the file that defines it
  user: str | None  # the class that uses it (first three kinds)
  message: str
  flagged: bool = False  # its TODO is already right above the statement

  @property
  def todo(self) -> str:
    """The TODO comment line for it."""
    return TODO_PREFIX + self.message


@dataclasses.dataclass
class _Class:
  names: tuple[str, ...]
  bases: tuple[str, ...]
  node: ast.ClassDef
  path: str
  kind: str | None = None  # 'nnx' | 'linen', by its base chain


@dataclasses.dataclass(frozen=True)
class _Alias:
  """A module-level name bound to a class or to `partial(<class>, ...)`, with the arguments the partial gives."""

  target: str  # the class, fully qualified
  positional: int = 0
  keywords: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class _Signature:
  positional: tuple[str, ...]  # required, in order
  keyword_only: tuple[str, ...]  # required
  open: bool  # *args or **kwargs: what is required is unknown
  accepted: frozenset[str] = frozenset()  # every parameter's name


def find_seams(sources: tp.Mapping[str, str], roots: tp.Sequence[str] = ()) -> list[Seam]:
  """The broken uses of NNX classes in `sources` (.py path -> migrated code), sorted by path and line."""
  trees = {}
  for path, source in sources.items():
    try:
      trees[path] = ast.parse(source)
    except (SyntaxError, ValueError):
      continue
  scripts = {os.path.normpath(path): path for path in trees}
  aliases = {path: _aliases(tree, path, roots, scripts) for path, tree in trees.items()}
  classes = _classify([c for path, tree in trees.items() for c in _classes(tree, path, roots, aliases[path])])
  by_name = {name: c for c in classes for name in c.names}
  partials = {name: alias for path, tree in trees.items()
              for name, alias in _class_aliases(tree, path, roots, aliases[path]).items() if alias.target in by_name}
  seams = []
  for path, tree in trees.items():
    lines = sources[path].splitlines()
    for seam in _Walk(path, aliases[path], by_name, partials).run(tree):
      seams.append(dataclasses.replace(seam, flagged=_flagged(lines, seam.line, seam.todo)))
  return sorted(seams, key=lambda s: (s.path, s.line, s.column, s.kind))


def _file_key(path: str) -> str:
  """A module name no import spells: the file itself, told apart from a file of the same name in another folder."""
  return f'<{os.path.normpath(path)}>'


def _aliases(tree: ast.Module, path: str, roots: tp.Sequence[str], files: tp.Mapping[str, str]) -> dict[str, str]:
  """The names the file's imports bind (anywhere in the file) -> what they denote; its own classes under its names.

  A module of a file that is no package's (a script, `train.py`) is first looked for beside it, as Python puts a
  script's folder first on `sys.path`: `import models` in `beta/train.py` is `beta/models.py` (`files`: the run's
  files by normalised path), whatever other folder of the run has a `models.py`."""
  package = package_of(path)
  beside = lambda module: files.get(os.path.join(os.path.dirname(os.path.normpath(path)), f'{module}.py')) \
      if not package and module and '.' not in module else None
  found: dict[str, str] = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        local = beside(alias.name)
        module = _file_key(local) if local else alias.name.partition('.')[0] if not alias.asname else alias.name
        found[alias.asname or alias.name.partition('.')[0]] = module
    elif isinstance(node, ast.ImportFrom):
      local = beside(node.module) if node.level == 0 else None
      module = _file_key(local) if local else absolute_import(package, node.module, node.level)
      if module is not None:
        found.update({a.asname or a.name: f'{module}.{a.name}' for a in node.names if a.name != '*'})
  for node in tree.body:  # under the file's own key: two folders' `models.py` are both the module `models`
    if isinstance(node, ast.ClassDef):
      found.setdefault(node.name, f'{_file_key(path)}.{node.name}')
    elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
      found.setdefault(node.targets[0].id, f'{_file_key(path)}.{node.targets[0].id}')  # an alias: `_class_aliases`
  return found


def _dotted(node: ast.AST, aliases: tp.Mapping[str, str]) -> str | None:
  """`models.Tower` -> `pkg.models.Tower` through the file's imports; None for anything but a name chain."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name) or node.id not in aliases:
    return None
  return '.'.join([aliases[node.id], *reversed(parts)])


def _classes(tree: ast.Module, path: str, roots: tp.Sequence[str], aliases: tp.Mapping[str, str]) -> list[_Class]:
  names = [*module_names(path, roots), _file_key(path)]
  return [_Class(tuple(f'{name}.{node.name}' for name in names),
                 tuple(d for base in node.bases if (d := _dotted(base, aliases)) is not None), node, path)
          for node in tree.body if isinstance(node, ast.ClassDef)]


def _class_aliases(tree: ast.Module, path: str, roots: tp.Sequence[str],
                   aliases: tp.Mapping[str, str]) -> dict[str, _Alias]:
  """The file's module-level `Name = <class>` and `Name = partial(<class>, ...)`, under each module name of the
  file (the names are checked against the run's classes by the caller)."""
  found = {}
  for node in tree.body:
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
      continue
    value, alias = node.value, None
    if isinstance(value, ast.Call) and _dotted(value.func, aliases) in PARTIAL_NAMES and value.args \
        and not any(isinstance(a, ast.Starred) for a in value.args) and all(k.arg for k in value.keywords):
      target = _dotted(value.args[0], aliases)
      alias = _Alias(target, len(value.args) - 1, frozenset(k.arg for k in value.keywords)) if target else None
    elif isinstance(value, (ast.Name, ast.Attribute)) and (target := _dotted(value, aliases)) is not None:
      alias = _Alias(target)
    if alias is not None:
      found.update({f'{module}.{node.targets[0].id}': alias for module in [*module_names(path, roots), _file_key(path)]})
  return found


def _classify(classes: list[_Class]) -> list[_Class]:
  """Each class's kind by its base chain, to a fixpoint (bases may come from any file)."""
  by_name = {name: c for c in classes for name in c.names}
  changed = True
  while changed:
    changed = False
    for found in classes:
      if found.kind is not None:
        continue
      kinds = {'nnx' if b in _NNX_MODULE else 'linen' if b in _LINEN_MODULE else by_name[b].kind if b in by_name
               else None for b in found.bases} - {None}
      if kinds:
        found.kind, changed = ('nnx' if 'nnx' in kinds else 'linen'), True
  return classes


def _signature(found: _Class, by_name: tp.Mapping[str, _Class]) -> _Signature | None:
  """What the NNX class's `__init__` (its own, or its nearest NNX base's) requires; None: takes no arguments."""
  seen = set()
  while found is not None and id(found) not in seen:
    seen.add(id(found))
    init = next((n for n in found.node.body if isinstance(n, ast.FunctionDef) and n.name == '__init__'), None)
    if init is not None:
      args = init.args
      positional = [*args.posonlyargs, *args.args][1:]
      required = positional[:len(positional) - len(args.defaults)]
      keyword_only = [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None]
      return _Signature(tuple(a.arg for a in required), tuple(keyword_only), bool(args.vararg or args.kwarg),
                        frozenset(a.arg for a in (*positional, *args.kwonlyargs)))
    found = next((by_name[b] for b in found.bases if b in by_name), None)
  return None


def _linen_style(node: ast.ClassDef) -> bool:
  """Fields, setup() or an @compact method without an __init__: a Linen module's body."""
  methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
  compact = any((isinstance(d, ast.Attribute) and d.attr == 'compact') or (isinstance(d, ast.Name) and d.id == 'compact')
                for m in methods.values() for d in m.decorator_list)
  fields = any(isinstance(n, ast.AnnAssign) for n in node.body)
  return '__init__' not in methods and (compact or 'setup' in methods or fields)


def _flagged(lines: list[str], line: int, todo: str) -> bool:
  """Whether the comment `todo` sits in the comment lines right above `line`."""
  index = line - 2
  while index >= 0 and lines[index].lstrip().startswith('#'):
    if lines[index].strip() == todo:
      return True
    index -= 1
  return False


class _Walk(ast.NodeVisitor):
  """One file's uses of NNX classes, with the module-level class and the statement each is in."""

  def __init__(self, path: str, aliases: tp.Mapping[str, str], classes: tp.Mapping[str, _Class],
               partials: tp.Mapping[str, _Alias]) -> None:
    self.path, self.aliases, self.classes, self.partials = path, aliases, classes, partials
    self.seams: list[Seam] = []
    self.user: _Class | None = None  # the module-level class being walked
    self.statement: ast.stmt | None = None
    self.bridged: set[int] = set()  # ids of nodes inside nnx_bridge.to_linen(...) / is_instance(...)
    self.instances: dict[str, str] = {}  # locals of the current function bound to an NNX instance -> its class

  def run(self, tree: ast.Module) -> list[Seam]:
    for node in tree.body:
      self.user = next((c for c in self.classes.values() if c.node is node), None)
      self.instances = {}
      self.visit(node)
    return self.seams

  def _nnx(self, node: ast.AST) -> _Class | None:
    """The NNX class `node` names, directly or through a module-level alias or partial of it."""
    dotted = _dotted(node, self.aliases)
    if dotted in self.partials:
      dotted = self.partials[dotted].target
    found = self.classes.get(dotted) if dotted is not None else None
    return found if found is not None and found.kind == 'nnx' else None

  def _add(self, node: ast.AST, kind: str, target: _Class, message: str) -> None:
    statement = self.statement or node
    user = self.user.node.name if self.user is not None and kind in _CLASS_USES else None
    self.seams.append(Seam(self.path, statement.lineno, statement.col_offset, kind, target.names[0], target.path,
                           user, message))

  def generic_visit(self, node: ast.AST) -> None:
    if isinstance(node, ast.stmt):
      outer, self.statement = self.statement, node
      self._statement(node)
      super().generic_visit(node)
      self.statement = outer
    else:
      super().generic_visit(node)

  def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
    outer, self.instances = self.instances, {}
    for child in node.body:
      self.visit(child)
    for decorator in node.decorator_list:
      self.visit(decorator)
    self.instances = outer

  visit_AsyncFunctionDef = visit_FunctionDef

  def visit_ClassDef(self, node: ast.ClassDef) -> None:
    if self.user is not None and node is self.user.node and self.user.kind == 'nnx' and _linen_style(node):
      base = next((b for b in node.bases if self._nnx(b) is not None), None)
      if base is not None:
        target = self._nnx(base)
        self._add(node, LINEN_SUBCLASSES_NNX, target, f'the Linen-style class {node.name} subclasses {target.node.name}, '
                                                      'an NNX module: convert it too, or keep the base Linen')
    if self.user is not None and node is self.user.node and self.user.kind is None:
      self._held(node)
    for child in node.body:
      self.visit(child)

  def _held(self, node: ast.ClassDef) -> None:
    """`module_class = Block` in the body of a class that is no module: code out of sight builds and runs it."""
    for statement in node.body:
      targets = statement.targets if isinstance(statement, ast.Assign) else \
          [statement.target] if isinstance(statement, ast.AnnAssign) and statement.value is not None else []
      target = self._nnx(statement.value) if targets and isinstance(targets[0], ast.Name) else None
      if target is not None:
        self.statement = statement
        self._add(statement, HELD_FOR_LINEN_CODE, target,
                  f'{node.name}.{targets[0].id} holds {target.node.name}, an NNX module, for code that builds it with '
                  "a Linen module's arguments and runs it with .init / .apply: build it there with its rngs and call "
                  'it directly, or keep it Linen')
        self.statement = None

  def visit_AnnAssign(self, node: ast.AnnAssign) -> None:  # annotations name classes without using them
    if node.value is not None:
      self.statement = node
      self.visit(node.value)

  def visit_Call(self, node: ast.Call) -> None:
    if isinstance(node.func, (ast.Name, ast.Attribute)) and (_dotted(node.func, self.aliases) or '').rpartition('.')[2] in _BRIDGES:
      self.bridged.update(id(n) for n in ast.walk(node))
    target = self._nnx(node.func)
    if target is not None and not self._in_linen():
      self._check_arguments(node, target)
    if isinstance(node.func, ast.Name) and node.func.id == 'getattr' and node.func.id not in self.aliases \
        and len(node.args) >= 2:
      self._lookup(node)
    if isinstance(node.func, ast.Attribute) and node.func.attr in LINEN_APIS:
      built = self._nnx(node.func.value.func) if isinstance(node.func.value, ast.Call) else None
      if built is None and isinstance(node.func.value, ast.Name) and node.func.value.id in self.instances:
        built = self.classes[self.instances[node.func.value.id]]
      if built is not None and not self._in_linen():
        self._add(node, LINEN_API_ON_NNX, built, f'.{node.func.attr}() of a Linen module, on {built.node.name}, '
                  'now an NNX module: build it with its rngs and call it directly (nnx.split / nnx.state for its state)')
    self.generic_visit(node)

  def _lookup(self, call: ast.Call) -> None:
    """`getattr(models, name)` on a module of the run that defines NNX classes."""
    module = _dotted(call.args[0], self.aliases)
    found = [c for name, c in self.classes.items() if c.kind == 'nnx' and name.rpartition('.')[0] == module]
    if module is None or not found or (isinstance(call.args[1], ast.Constant) and call.args[1].value not in
                                       {c.node.name for c in found}):
      return
    names = ', '.join(sorted({c.node.name for c in found}))
    self._add(call, LOOKUP_BY_NAME, found[0], f'getattr({ast.unparse(call.args[0])}, ...) looks up a class of '
              f'{found[0].path} by name, and {names} there are NNX modules now: where the class it gives is built, '
              'pass its rngs and sizes, and call it directly instead of .init / .apply')

  def _statement(self, node: ast.stmt) -> None:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
      value = node.value
      target = self._nnx(value.func) if isinstance(value, ast.Call) else None
      if target is not None:
        self.instances[node.targets[0].id] = target.names[0]
      else:
        self.instances.pop(node.targets[0].id, None)

  def visit_Name(self, node: ast.Name) -> None:
    self._reference(node)

  def visit_Attribute(self, node: ast.Attribute) -> None:
    if not self._reference(node):
      self.generic_visit(node)

  def _reference(self, node: ast.AST) -> bool:
    target = self._nnx(node)
    if target is None:
      return False
    if self._in_linen() and id(node) not in self.bridged and not (self.user is not None and node in self.user.node.bases):
      self._add(node, LINEN_BUILDS_NNX, target, f'the Linen class {self.user.node.name} uses {target.node.name}, '
                                                'an NNX module: wrap it with nnx_bridge.to_linen, or keep it Linen')
    return True

  def _in_linen(self) -> bool:
    return self.user is not None and self.user.kind == 'linen'

  def _check_arguments(self, call: ast.Call, target: _Class) -> None:
    signature = _signature(target, self.classes)
    if signature is None or signature.open or any(isinstance(a, ast.Starred) for a in call.args) \
        or any(k.arg is None for k in call.keywords):
      return
    partial = self.partials.get(_dotted(call.func, self.aliases) or '', _Alias(''))
    given = {k.arg for k in call.keywords} | partial.keywords
    missing = [name for name in signature.positional[len(call.args) + partial.positional:] if name not in given]
    missing += [name for name in signature.keyword_only if name not in given]
    unexpected = [k.arg for k in call.keywords if k.arg not in signature.accepted]
    if unexpected and not missing:
      self._add(call, MISSING_ARGUMENTS, target, f'{target.node.name} is now an NNX module whose constructor takes no '
                f'{", ".join(unexpected)}: see its report entries (a field it now takes at its call: pass it there)')
    if missing:
      called = (_dotted(call.func, self.aliases) or '').rpartition('.')[2]
      name = target.node.name if called in ('', target.node.name) else f'{called} ({target.node.name})'
      self._add(call, MISSING_ARGUMENTS, target, f'{name} is now an NNX module and needs {", ".join(missing)} here '
                f'({called or target.node.name}(..., {", ".join(f"{m}=..." for m in missing)}))')
