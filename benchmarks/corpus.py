"""Migrate the Flax code of six public packages, downloaded from the package registry, and verify what converted.

Run: python benchmarks/corpus.py [--packages a,b] [--cache DIR] [--json FILE] [-j N] [--no-verify] [--hf-families a,b]
(`--packages flax-examples`: flax's Linen example programs, from the flax 0.8.5 source archive, `FLAX_EXAMPLES`)

For each package at its pinned version (`PACKAGES`), the wheel is fetched with `pip download --no-deps` into the
cache folder (default `~/.cache/linen2nnx/corpus`; a wheel already there is reused) and the `.py` files of its
import root that mention `flax` are copied into a scratch tree. `linen2nnx migrate --write --report-json -j N` runs
over that tree (a subprocess, timed), then `linen2nnx migrate --check` over the migrated tree: a second run must
change nothing. The report's `fates` say what became of the Linen classes; the classes kept Linen because a
wrapper holds them as `module_class` (transformers' and diffusers' `Flax*PreTrainedModel`s, whose code runs them
the Linen way) are counted apart, out of the converted percentage's denominator.

Then every converted class is verified. transformers: with `benchmarks/hf_zoo.py`'s harness (tiny configs, inputs
from `__call__`'s parameter names) on the corpus run's migrated model files, beside the installed package (which
must be transformers 4.46.3). The other packages: the whole wheel is unpacked twice, once as is and once with the
migrated files over it (every `__init__.py` left empty, so that a module imports without the rest of its package's
dependencies), and each converted class is imported from both; the Linen class is built from its field defaults
(not built when a field has none), its `__call__` inputs tried at the shapes of `SHAPES` (float32, then int32)
until `init` works, and its NNX port built and compared as `linen2nnx verify --migrate-report` does (eval-mode
outputs, the gradient of every parameter, a train-mode call), within `TOLERANCE`. Missing dependencies (gin,
tensorflow, mujoco, jraph, ...) are not installed: a class whose module does not import is "not built", with why.

Prints one row per package and a total line, then the most frequent reasons for keeping classes Linen and for not
building or failing a class; `--json` writes all of it. Exit 0, or 1 when a file failed, a second run would change
something or a verified class differs, 3 when a wheel could not be downloaded.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import importlib
import importlib.metadata
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import typing as tp
import zipfile

try:
  from benchmarks import hf_zoo
except ImportError:  # run as a script: benchmarks/ is the first entry of sys.path
  import hf_zoo

ClassResult = hf_zoo.ClassResult
short_error = hf_zoo._short  # one line for an exception, with the file and line that raised it


@dataclasses.dataclass(frozen=True)
class Package:
  """A registry package at a pinned version, and the folder of its wheel (or, `sdist`, of its source archive)
  that holds the code migrated: an import root, or flax's example programs."""

  name: str
  version: str
  root: str
  sdist: bool = False  # the code is in the source archive only (flax's `examples/`)
  label: str = ''  # the name it is selected and shown by, when not the registry name

  @property
  def key(self) -> str:
    return self.label or self.name

  @property
  def wheel_prefix(self) -> str:
    return f'{re.sub(r"[-_.]+", "_", self.name).lower()}-{self.version}-'

  @property
  def archive_glob(self) -> str:
    return f'{self.name}-{self.version}.tar.gz' if self.sdist else f'{self.wheel_prefix}*.whl'


PACKAGES = (
    Package('transformers', '4.46.3', 'transformers'),
    Package('diffusers', '0.31.0', 'diffusers'),
    Package('dopamine-rl', '4.1.2', 'dopamine'),
    Package('brax', '0.14.2', 'brax'),
    Package('jax-md', '0.2.29', 'jax_md'),
    Package('evojax', '0.2.17', 'evojax'),
)
FLAX_EXAMPLES = Package('flax', '0.8.5', 'examples', sdist=True, label='flax-examples')
"""flax's Linen example programs (mnist, imagenet, wmt, lm1b, sst2, ...), from the source archive of a flax release
whose examples are Linen: selected by `--packages flax-examples`, not verified (their classes take configs)."""
DEFAULT_CACHE = pathlib.Path('~/.cache/linen2nnx/corpus')
SHAPES = ((2, 8), (2, 4, 4, 3), (2, 16, 16, 3), (2, 3))
"""The input shapes a Linen class is tried at, in order, until its `init` works."""
TOLERANCE = 1e-6
"""The largest absolute difference of an output or a gradient that a verified class may show."""
MODULE_CLASS_REASON = 'held in a class attribute'
"""The start of the grouped reason (`report._kept_reason`) of the classes a wrapper holds as `module_class`."""
MODE_NAMES = frozenset({'deterministic', 'use_running_average', 'train', 'training', 'is_training'})
EXIT_OK, EXIT_PROBLEMS, EXIT_NO_REGISTRY = 0, 1, 3
_REASONS = 3  # the most frequent reasons for keeping classes Linen shown per package


class RegistryError(RuntimeError):
  """A wheel that could not be downloaded: no registry, or no such version."""


# --- Fetching and unpacking ------------------------------------------------------------------------------------


def cached_wheel(package: Package, cache: pathlib.Path) -> pathlib.Path | None:
  found = sorted(cache.glob(package.archive_glob))
  return found[0] if found else None


def fetch_wheel(package: Package, cache: pathlib.Path) -> pathlib.Path:
  """The package's wheel (or source archive) in `cache`, downloaded there first (without dependencies) unless it
  is there already."""
  cached = cached_wheel(package, cache)
  if cached is not None:
    return cached
  cache.mkdir(parents=True, exist_ok=True)
  kind = '--no-binary=:all:' if package.sdist else '--only-binary=:all:'
  command = [sys.executable, '-m', 'pip', 'download', '--no-deps', kind, '--dest', str(cache),
             '--disable-pip-version-check', '--quiet', '--retries', '1', '--timeout', '30',
             f'{package.name}=={package.version}']
  try:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
  except subprocess.TimeoutExpired:
    raise RegistryError(f'pip download {package.name}=={package.version} took over 900 s') from None
  wheel = cached_wheel(package, cache)
  if done.returncode != 0 or wheel is None:
    last = (done.stderr.strip().splitlines() or ['no wheel'])[-1]
    raise RegistryError(f'pip download {package.name}=={package.version} failed: {last}')
  return wheel


def extract(wheel: pathlib.Path, root: str, target: pathlib.Path, flax_only: bool) -> list[str]:
  """Copies the `.py` files under `root/` of the wheel (or of the source archive's top folder) into `target` (with
  `flax_only`, those mentioning flax and every `__init__.py`, which make the folders packages: imports resolve as
  they do in the installed package); returns their paths, relative to `target`."""
  copied = []
  for name, read in _members(wheel):
    parts = pathlib.PurePosixPath(name).parts
    if not parts or parts[0] != root or not name.endswith('.py') or '..' in parts:
      continue
    data = read()
    if flax_only and b'flax' not in data and parts[-1] != '__init__.py':
      continue
    (target / name).parent.mkdir(parents=True, exist_ok=True)
    (target / name).write_bytes(data)
    copied.append(name)
  return sorted(copied)


def _members(archive: pathlib.Path) -> tp.Iterator[tuple[str, tp.Callable[[], bytes]]]:
  """The files of a wheel, or of a source archive below its top folder (`flax-0.8.5/`), with how to read each."""
  if archive.name.endswith('.tar.gz'):
    with tarfile.open(archive) as tar:
      for member in tar.getmembers():
        _, _, name = member.name.partition('/')
        if member.isfile() and name:
          yield name, lambda member=member: tar.extractfile(member).read()
    return
  with zipfile.ZipFile(archive) as wheel:
    for name in wheel.namelist():
      yield name, lambda name=name: wheel.read(name)


# --- Migrating and counting ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fates:
  """What became of a run's Linen classes, from its `--report-json` document (`fates_of`)."""

  converted: int
  kept_linen: int  # module_class-held ones included
  held: int  # kept because a wrapper holds them as `module_class`: counted apart
  kept_because: dict[str, int]  # the other reasons, most frequent first
  bridged: int
  todos: int
  failed_files: tuple[str, ...]

  @property
  def linen_classes(self) -> int:
    return self.converted + self.kept_linen

  @property
  def counted(self) -> int:
    """The percentage's denominator: the Linen classes, less those counted apart."""
    return self.linen_classes - self.held

  @property
  def percent(self) -> float | None:
    return 100.0 * self.converted / self.counted if self.counted else None


def _count(value: tp.Any, what: str) -> int:
  if not isinstance(value, int) or isinstance(value, bool) or value < 0:
    raise ValueError(f'not a migrate report: {what} is {value!r}, not a count')
  return value


def fates_of(document: tp.Any) -> Fates:
  """The fates of a `linen2nnx migrate --report-json` document, the `module_class`-held classes apart.

  Raises ValueError for a document of another shape, or one whose numbers disagree: counts that are not
  non-negative integers, reasons that do not add up to `kept_linen`, a `converted` other than the classes the
  files record.
  """
  if not isinstance(document, dict) or not isinstance(document.get('fates'), dict) \
      or not isinstance(document.get('files'), list):
    raise ValueError('not a migrate report: expected an object with "fates" and "files"')
  fates = document['fates']
  counts = {key: _count(fates.get(key), f'fates.{key}') for key in ('converted', 'kept_linen', 'bridged', 'todos')}
  reasons = fates.get('kept_because')
  if not isinstance(reasons, dict):
    raise ValueError(f'not a migrate report: fates.kept_because is {reasons!r}, not an object')
  reasons = {str(why): _count(n, f'fates.kept_because[{why!r}]') for why, n in reasons.items()}
  if sum(reasons.values()) != counts['kept_linen']:
    raise ValueError(f'the reasons count {sum(reasons.values())} classes kept Linen, fates.kept_linen says '
                     f'{counts["kept_linen"]}')
  if not all(isinstance(f, dict) and isinstance(f.get('classes'), list) for f in document['files']):
    raise ValueError('not a migrate report: every file needs a "classes" list')
  recorded = sum(len(f['classes']) for f in document['files'])
  if recorded != counts['converted']:
    raise ValueError(f'fates.converted is {counts["converted"]}, the files record {recorded} converted classes')
  held = sum(n for why, n in reasons.items() if why.startswith(MODULE_CLASS_REASON))
  others = sorted(((why, n) for why, n in reasons.items() if not why.startswith(MODULE_CLASS_REASON)),
                  key=lambda item: -item[1])
  failed = tuple(str(f.get('path')) for f in document['files'] if f.get('status') == 'failed')
  return Fates(counts['converted'], counts['kept_linen'], held, dict(others), counts['bridged'], counts['todos'],
               failed)


def migrate(tree: pathlib.Path, root: str, report: pathlib.Path, jobs: int, check: bool,
            flags: tp.Sequence[str] = ()) -> tuple[dict, float]:
  """`linen2nnx migrate --write` (or `--check`) over `tree/root` with `flags`, run in `tree`: (its report,
  seconds)."""
  command = [sys.executable, '-m', 'codemods.cli', 'migrate', '--check' if check else '--write',
             '--report-json', str(report), '-j', str(jobs), *flags, root]
  start = time.perf_counter()
  done = subprocess.run(command, cwd=tree, capture_output=True, text=True)
  seconds = time.perf_counter() - start
  if done.returncode not in (0, 1, 2) or not report.is_file():
    raise RuntimeError(f'linen2nnx migrate exited {done.returncode}: {done.stderr.strip()[-1000:]}')
  summary = [line for line in done.stderr.splitlines() if line.startswith('linen2nnx migrate:')]
  label = f'{root}, second run' if check else root
  print('\n'.join(f'corpus: {label}: {line}' for line in summary[:1 if check else None]), file=sys.stderr, flush=True)
  return json.loads(report.read_text()), seconds


def would_change(document: dict) -> list[str]:
  """The files a `--check` run would change (or could not process)."""
  return [f['path'] for f in document['files'] if f['status'] in ('changed', 'failed')]


# --- Verifying the five packages -------------------------------------------------------------------------------


def import_trees(package: Package, scratch: pathlib.Path, wheel: pathlib.Path, tree: pathlib.Path,
                 keep: tp.Collection[str]) -> tuple[pathlib.Path, pathlib.Path]:
  """The wheel unpacked as is and with the migrated files of `tree` over it; every `__init__.py` is left empty
  but those of `keep` (files defining converted classes)."""
  original, migrated = scratch / 'original', scratch / 'migrated'
  for target in (original, migrated):
    for name in extract(wheel, package.root, target, flax_only=False):
      if target is migrated and (tree / name).is_file():
        (target / name).write_bytes((tree / name).read_bytes())
      if name.endswith('__init__.py') and name not in keep:
        (target / name).write_text('')
  return original, migrated


def _drop_package(top: str) -> dict[str, tp.Any]:
  """Removes the package `top` and its modules from sys.modules; returns them."""
  names = [name for name in sys.modules if name == top or name.startswith(f'{top}.')]
  return {name: sys.modules.pop(name) for name in names}


def _import_all(root: pathlib.Path, modules: tp.Iterable[str]) -> dict[str, tp.Any]:
  """Each module imported from the tree at `root`, or why it does not import (a string)."""
  found: dict[str, tp.Any] = {}
  sys.path.insert(0, str(root))
  importlib.invalidate_caches()
  try:
    for name in modules:
      try:
        found[name] = importlib.import_module(name)
      except Exception as error:  # a dependency that is not installed, code the installed jax no longer runs
        found[name] = f'{name} does not import: {short_error(error)}'
  finally:
    sys.path.remove(str(root))
  return found


@contextlib.contextmanager
def imported(top: str, original: pathlib.Path, migrated: pathlib.Path,
             modules: tp.Sequence[str]) -> tp.Iterator[tuple[dict[str, tp.Any], dict[str, tp.Any]]]:
  """The modules imported from both trees; the migrated ones stay in sys.modules until the block ends (the
  migrate report finds a class by its module's file), the original ones are held by reference only."""
  saved = _drop_package(top)
  try:
    originals = _import_all(original, modules)
    _drop_package(top)
    yield originals, _import_all(migrated, modules)
  finally:
    _drop_package(top)
    sys.modules.update(saved)


def build_linen(linen_class: type) -> tuple[tp.Any, tuple, str]:
  """The Linen class built from its field defaults, and inputs its `init` works on: (module, inputs, '') or
  (None, (), why not)."""
  import jax
  import jax.numpy as jnp

  from codemods.commands.verify import abstract_linen
  from codemods.ports import model_refs

  missing = [f.name for f in dataclasses.fields(linen_class) if f.init and f.name not in ('parent', 'name')
             and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
  if missing:
    return None, (), f'fields without a default: {", ".join(missing)}'
  try:
    linen = linen_class()
    parameters = list(inspect.signature(linen_class.__call__).parameters.values())[1:]
  except Exception as error:
    return None, (), f'it cannot be built from its defaults: {short_error(error)}'
  names = [p.name for p in parameters if p.default is p.empty and p.name not in MODE_NAMES
           and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  failure = ''
  for shape in SHAPES:
    for dtype in (jnp.float32, jnp.int32):
      keys = [jax.random.key(index) for index in range(len(names))]
      inputs = tuple(jax.random.normal(k, shape) if dtype == jnp.float32 else jax.random.randint(k, shape, 0, 2)
                     for k in keys)
      try:
        abstract_linen(model_refs.Example(linen, inputs, {}), None)
        return linen, inputs, ''
      except model_refs.UsageError as error:
        failure = str(error)
  shapes = ', '.join(str(list(shape)) for shape in SHAPES)
  return None, (), f'init fails at every input shape tried ({shapes}); last: {failure[:300]}'


def check_converted(where: str, name: str, nnx_class: type, linen: tp.Any, inputs: tuple,
                    report_path: pathlib.Path) -> ClassResult:
  """The NNX port built from its migrate record and compared with the Linen model, as
  `linen2nnx verify --migrate-report` does; sizes of submodules Linen does not call here are left out."""
  from codemods.ports import model_refs

  try:
    port, kwargs = hf_zoo.load_port(str(report_path), nnx_class, linen, inputs, {})
  except Exception as error:
    return ClassResult(where, name, 'not built', f'the port\'s arguments: {short_error(error)}')
  return hf_zoo.compare_port(where, name, model_refs.Example(linen, inputs, {}), lambda: nnx_class(**kwargs), port,
                             atol=TOLERANCE, rtol=0.0)


def verify_package(package: Package, document: dict, tree: pathlib.Path, wheel: pathlib.Path,
                   scratch: pathlib.Path) -> list[ClassResult]:
  """Every converted class of the run, imported from both trees, built from its defaults and compared."""
  records = [(f['path'], r) for f in document['files'] for r in f['classes']]
  if not records:
    return []
  original_root, migrated_root = import_trees(package, scratch, wheel, tree, {path for path, _ in records})
  report_path = migrated_root / 'report.json'  # its paths are relative to the tree migrate ran in
  report_path.write_text(json.dumps(document))
  module_of = lambda path: path[:-len('.py')].removesuffix('/__init__').replace('/', '.')
  modules = list(dict.fromkeys(module_of(path) for path, _ in records))
  results = []
  with imported(package.root, original_root, migrated_root, modules) as (originals, migrated):
    for path, record in records:
      where, name = module_of(path), record['nnx_name']
      original, port = originals[where], migrated[where]
      if isinstance(original, str) or isinstance(port, str):
        results.append(ClassResult(where, name, 'not built', original if isinstance(original, str) else port))
        continue
      linen_class, nnx_class = getattr(original, record['linen_name'], None), getattr(port, name, None)
      if linen_class is None or nnx_class is None:
        results.append(ClassResult(where, name, 'not built', f'{where} defines no {record["linen_name"]} or {name}'))
        continue
      linen, inputs, why = build_linen(linen_class)
      results.append(ClassResult(where, name, 'not built', why) if linen is None
                     else check_converted(where, name, nnx_class, linen, inputs, report_path))
      print(f'corpus: {package.name}: {where}.{name}: {results[-1].status} {results[-1].reason}'[:300],
            file=sys.stderr, flush=True)
  return results


# --- Verifying transformers ------------------------------------------------------------------------------------


def verify_transformers(document: dict, tree: pathlib.Path, report_path: pathlib.Path,
                        families: tp.Collection[str] | None) -> tuple[list[ClassResult], list[ClassResult]]:
  """hf_zoo's harness over the corpus run's migrated model files (all of them, or those of `families`):
  (converted classes, Linen classes that build converted ones through to_linen)."""
  classes: list[ClassResult] = []
  parents: list[ClassResult] = []
  installed = _installed_version('transformers')
  for entry in document['files']:
    match = re.fullmatch(r'transformers/models/(\w+)/modeling_flax_(\w+)\.py', entry['path'])
    family = match[1] if match and match[1] == match[2] and match[1] in hf_zoo.FAMILIES else None
    why = ('not a model family file hf_zoo builds' if family is None
           else f'transformers {installed} is installed, not 4.46.3' if installed != '4.46.3'
           else 'left out: not in --hf-families' if families is not None and family not in families else '')
    if not entry['classes'] or why:
      classes += [ClassResult(family or entry['path'], r['nnx_name'], 'not built', why) for r in entry['classes']]
      continue
    try:
      original = importlib.import_module(f'transformers.models.{family}.modeling_flax_{family}')
      migrated = hf_zoo.import_migrated(family, tree / entry['path'])
    except Exception as error:
      classes += [ClassResult(family, r['nnx_name'], 'not built', f'it does not import: {short_error(error)}')
                  for r in entry['classes']]
      continue
    found = [within_tolerance(hf_zoo.verify_class(family, r['nnx_name'], original, migrated, str(report_path)))
             for r in entry['classes']]
    classes += found
    parents += [hf_zoo.verify_linen_parent(family, name, original, migrated)
                for name in hf_zoo._linen_parents(migrated)]
    print(f'corpus: transformers: {family}: {sum(c.status == "verified" for c in found)} of {len(found)} '
          'converted classes verified', file=sys.stderr, flush=True)
  return classes, parents


def within_tolerance(result: ClassResult) -> ClassResult:
  """hf_zoo verifies within verify's default tolerance; the corpus asks for `TOLERANCE`."""
  if result.status == 'verified' and max(result.forward, result.gradient) > TOLERANCE:
    return dataclasses.replace(result, status='failed', reason=f'differs by more than {TOLERANCE:g}')
  return result


def _installed_version(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


# --- One package, and the table --------------------------------------------------------------------------------


@dataclasses.dataclass
class PackageResult:
  package: str
  version: str
  files: int = 0  # the .py files of the package that mention flax, and its __init__.py: the tree migrate runs over
  fates: Fates | None = None
  seconds: float = 0.0
  second_run_changes: list[str] = dataclasses.field(default_factory=list)
  classes: list[ClassResult] = dataclasses.field(default_factory=list)
  linen_parents: list[ClassResult] = dataclasses.field(default_factory=list)  # transformers only
  verified: bool = False  # whether verification ran
  error: str = ''

  def count(self, status: str) -> int:
    return sum(c.status == status for c in self.classes)

  def largest(self, attribute: str) -> float:
    return max((getattr(c, attribute) for c in self.classes if c.status == 'verified'), default=0.0)


def run_package(package: Package, cache: pathlib.Path, jobs: int, verify: bool,
                hf_families: tp.Collection[str] | None = None, flags: tp.Sequence[str] = ()) -> PackageResult:
  """Fetches, migrates, migrates again with --check and (with `verify`) verifies one package; `flags` are more
  options of both migrate runs (`--unsafe-fixes`)."""
  verify = verify and not package.sdist  # example programs: their classes take configs, built by their mains
  found = PackageResult(package.key, package.version, verified=verify)
  wheel = fetch_wheel(package, cache)
  with tempfile.TemporaryDirectory(prefix=f'corpus-{package.root}-') as folder:
    scratch = pathlib.Path(folder)
    tree = scratch / 'tree'
    found.files = len(extract(wheel, package.root, tree, flax_only=True))
    report = tree / 'report.json'  # beside the package root: the report's paths resolve from its folder
    try:
      document, found.seconds = migrate(tree, package.root, report, jobs, check=False, flags=flags)
      found.fates = fates_of(document)
      second, _ = migrate(tree, package.root, scratch / 'check.json', jobs, check=True, flags=flags)
    except (RuntimeError, ValueError) as error:
      found.error = str(error)
      return found
    found.second_run_changes = would_change(second)
    if not verify:
      return found
    if package.name == 'transformers':
      found.classes, found.linen_parents = verify_transformers(document, tree, report, hf_families)
    else:
      found.classes = verify_package(package, document, tree, wheel, scratch / 'import')
  return found


def _percent(converted: int, counted: int) -> str:
  return f'{100.0 * converted / counted:.1f}' if counted else '-'


COLUMNS = (f'{"package":13} {"linen":>5} {"conv":>4} {"%":>5} {"apart":>5} {"kept":>4} {"brdg":>4} {"todo":>4} '
           f'{"fail":>4} {"2nd":>3} {"secs":>6} {"f/s":>5} {"ok":>3} {"bad":>3} {"n/b":>3}  max fwd / grad diff')


def table(results: tp.Sequence[PackageResult]) -> list[str]:
  """One row per package, then the total. *apart*: kept Linen because a wrapper holds them as module_class (out of
  the percentage's denominator); *fail*: files migrate failed on; *2nd*: whether a second run would change files;
  *ok* / *bad* / *n/b*: converted classes verified / failed / not built."""
  lines = [COLUMNS]
  for r in results:
    f = r.fates
    if f is None:
      lines.append(f'{r.package:13} {r.error}')
      continue
    checked = (f'{r.count("verified"):3} {r.count("failed"):3} {r.count("not built"):3}  '
               f'{r.largest("forward"):.1e} / {r.largest("gradient"):.1e}') if r.verified else '  -   -   -'
    lines.append(f'{r.package:13} {f.linen_classes:5} {f.converted:4} {_percent(f.converted, f.counted):>5} '
                 f'{f.held:5} {f.kept_linen - f.held:4} {f.bridged:4} {f.todos:4} {len(f.failed_files):4} '
                 f'{"yes" if r.second_run_changes else "no":>3} {r.seconds:6.1f} {r.files / r.seconds:5.2f} {checked}')
  done = [r for r in results if r.fates is not None]
  total = lambda attribute: sum(getattr(r.fates, attribute) for r in done)
  files, seconds = sum(r.files for r in done), sum(r.seconds for r in done)
  verified = [r for r in done if r.verified]
  count = lambda status: sum(r.count(status) for r in verified)
  largest = lambda attribute: max((r.largest(attribute) for r in verified), default=0.0)
  checked = (f'{count("verified"):3} {count("failed"):3} {count("not built"):3}  '
             f'{largest("forward"):.1e} / {largest("gradient"):.1e}') if verified else '  -   -   -'
  lines.append(f'{"TOTAL":13} {total("linen_classes"):5} {total("converted"):4} '
               f'{_percent(total("converted"), total("counted")):>5} {total("held"):5} '
               f'{total("kept_linen") - total("held"):4} {total("bridged"):4} {total("todos"):4} '
               f'{sum(len(r.fates.failed_files) for r in done):4} '
               f'{"yes" if any(r.second_run_changes for r in done) else "no":>3} {seconds:6.1f} '
               f'{files / seconds if seconds else 0.0:5.2f} {checked}')
  return lines


def details(results: tp.Sequence[PackageResult]) -> list[str]:
  """Per package: the most frequent reasons for keeping classes Linen, the files that failed or would change
  again; then why classes were not built or failed, most frequent first."""
  lines = []
  for r in results:
    if r.fates is None:
      continue
    reasons = '; '.join(f'{n} {why}' for why, n in list(r.fates.kept_because.items())[:_REASONS])
    more = len(r.fates.kept_because) - _REASONS
    lines.append(f'{r.package}: kept Linen: {reasons or "none"}' + (f'; {more} other reasons' if more > 0 else ''))
    lines += [f'{r.package}: migrate failed on {path}' for path in r.fates.failed_files]
    lines += [f'{r.package}: a second run would change {path}' for path in r.second_run_changes]
    parents = r.linen_parents
    if parents:
      lines.append(f'{r.package}: Linen classes building converted ones through to_linen: '
                   f'{sum(c.status == "verified" for c in parents)} of {len(parents)} verified')
  causes = collections.Counter(f'{r.package}: {c.status}: {_cause(c.reason)}' for r in results for c in r.classes
                               if c.status != 'verified')
  lines += [f'{n:4}  {cause}' for cause, n in causes.most_common()]
  return lines


def _cause(reason: str) -> str:
  """A reason on one line, cut short."""
  return ' '.join(reason.split())[:160]


def problems(results: tp.Sequence[PackageResult]) -> bool:
  return any(r.error or r.fates is None or r.fates.failed_files or r.second_run_changes or r.count('failed')
             for r in results)


def to_json(results: tp.Sequence[PackageResult]) -> dict[str, tp.Any]:
  rows = []
  for r in results:
    row = dataclasses.asdict(r)
    if r.fates is not None:
      row['fates'].update(linen_classes=r.fates.linen_classes, counted=r.fates.counted, percent=r.fates.percent)
      row['files_per_second'] = r.files / r.seconds if r.seconds else None
    rows.append(row)
  return {'tolerance': TOLERANCE, 'packages': rows, 'table': table(results)}


def select(names: str) -> list[Package]:
  """The packages named (registry names; `jax_md` for `jax-md` too), in the order given."""
  by_name = {re.sub(r'[-_.]+', '-', p.key): p for p in (*PACKAGES, FLAX_EXAMPLES)}
  wanted = [re.sub(r'[-_.]+', '-', name.strip().lower()) for name in names.split(',') if name.strip()]
  unknown = [name for name in wanted if name not in by_name]
  if unknown:
    raise SystemExit(f'corpus: unknown packages {unknown}; known: {", ".join(by_name)}')
  return [by_name[name] for name in wanted]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--packages', default=','.join(p.name for p in PACKAGES),
                      help='comma-separated (default: %(default)s); flax-examples: flax\'s Linen example programs')
  parser.add_argument('--cache', default=str(DEFAULT_CACHE), help='the wheels, downloaded once (default: %(default)s)')
  parser.add_argument('--json', help='also write the results as JSON')
  parser.add_argument('-j', '--jobs', type=int, default=2)
  parser.add_argument('--no-verify', action='store_true', help='migrate and count only')
  parser.add_argument('--hf-families', help='verify only these transformers families (default: every family whose '
                      'file has converted classes)')
  parser.add_argument('--unsafe-fixes', action='store_true',
                      help='migrate with --unsafe-fixes (classes refused at a statement convert, the statement under '
                           'a TODO; such classes do not verify until it is rewritten)')
  args = parser.parse_args()
  cache = pathlib.Path(os.path.expanduser(args.cache))
  families = set(args.hf_families.split(',')) if args.hf_families else None
  results = []
  for package in select(args.packages):
    try:
      results.append(run_package(package, cache, args.jobs, not args.no_verify, families,
                                 ('--unsafe-fixes',) if args.unsafe_fixes else ()))
    except RegistryError as error:
      print(f'corpus: {error}', file=sys.stderr)
      return EXIT_NO_REGISTRY
  print('\n'.join(table(results)))
  print('\n'.join(details(results)))
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(to_json(results), indent=2) + '\n')
  return EXIT_PROBLEMS if problems(results) else EXIT_OK


if __name__ == '__main__':
  sys.exit(main())
