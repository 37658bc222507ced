"""Migrate Hugging Face transformers 4.46.3's Flax model files and verify every class the migration converted.

Run: python benchmarks/hf_zoo.py [--families bert,roberta,...] [--json FILE] [-j N] [--speed]

For each model family (`transformers/models/<family>/modeling_flax_<family>.py`, the installed package's; it needs
transformers' own dependencies, not torch), the file is copied into a scratch tree and migrated there with
`--report-json`; the migrated file is then imported inside the installed package (so that its relative imports
resolve) beside the original. Every class the migration converted is built from a tiny config, as HF's own tests
build their models, and called on inputs made from its `__call__`'s parameter names (`input_ids`,
`hidden_states`, `attention_mask`, ...); the NNX port is built from the migrate report's record (its sizes measured
on the Linen model) and compared with the Linen class on transferred parameters: eval-mode outputs, the gradient
of every parameter and a train-mode call (`linen2nnx verify --migrate-report`'s check).

A class left as Linen that now builds converted classes through `nnx_bridge.to_linen` is checked too: the migrated
class must create the original's variables and, on the original's own variables, give its outputs and gradients.

Prints one row per family (classes converted / kept Linen, TODOs, size arguments left, classes verified / failed /
not built, Linen classes with to_linen bridges verified / checked, and the largest forward and gradient
differences), then a total line, the migrate speed (files/s) and, for each class that was not verified, why,
grouped by cause. `--speed` only times migrate over the files, at -j 1
and -j 2 (speed is compared across runs only as a ratio measured in the same run, see docs/performance.md).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import inspect
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time
import traceback
import typing as tp

FAMILIES = (
    'albert', 'bart', 'beit', 'bert', 'big_bird', 'blenderbot', 'blenderbot_small', 'bloom', 'clip', 'dinov2',
    'distilbert', 'electra', 'gemma', 'gpt2', 'gpt_neo', 'gptj', 'llama', 'longt5', 'marian', 'mbart', 'mistral',
    'mt5', 'opt', 'pegasus', 'regnet', 'resnet', 'roberta', 'roberta_prelayernorm', 'roformer', 't5', 'vit',
    'wav2vec2', 'whisper', 'xglm', 'xlm_roberta',
)
"""The families whose `modeling_flax_<family>.py` defines Linen modules (the other Flax files re-export them)."""

TINY_CONFIG = {  # as HF's Flax model tests size their models: every key the family's config has is set
    'hidden_size': 16, 'num_hidden_layers': 2, 'num_attention_heads': 2, 'intermediate_size': 24, 'vocab_size': 64,
    'max_position_embeddings': 32, 'type_vocab_size': 2, 'embedding_size': 16, 'd_model': 16, 'd_kv': 8, 'd_ff': 24,
    'num_layers': 2, 'num_decoder_layers': 2, 'num_heads': 2, 'encoder_layers': 2, 'decoder_layers': 2,
    'encoder_attention_heads': 2, 'decoder_attention_heads': 2, 'encoder_ffn_dim': 24, 'decoder_ffn_dim': 24,
    'n_embd': 16, 'n_layer': 2, 'n_head': 2, 'n_positions': 32, 'n_inner': 24, 'num_key_value_heads': 1,
    'head_dim': 8, 'rotary_dim': 4, 'image_size': 16, 'patch_size': 4, 'num_channels': 3, 'projection_dim': 16,
    'hidden_sizes': [8, 16], 'depths': [1, 1], 'embedding_dim': 16, 'ffn_dim': 24, 'word_embed_proj_dim': 16,
    'attention_types': [[['global', 'local'], 1]], 'window_size': 4, 'block_size': 2, 'num_random_blocks': 1,
    'attention_type': 'original_full', 'num_mel_bins': 8, 'max_source_positions': 8, 'max_target_positions': 32,
    'classifier_proj_size': 8, 'num_labels': 3, 'pad_token_id': 1, 'relative_attention_num_buckets': 8,
    # functional dropout (`dot_product_attention_weights(dropout_rng=...)`) draws different keys on both sides,
    # so the train-mode check runs without it; nn.Dropout layers verify switches off itself
    'attention_probs_dropout_prob': 0.0, 'attention_dropout': 0.0, 'attn_pdrop': 0.0,
    'dropout_rate': 0.0,  # T5's attention drops its weights with it the same way (its nn.Dropout layers too)
    'drop_path_rate': 0.0,  # BEiT's stochastic depth draws a 'droppath' key the same way
    'do_stable_layer_norm': True,  # wav2vec2's Flax port supports only this
    'feat_extract_norm': 'layer',  # and only this feature encoder; its convolutions small enough for LENGTH
    'conv_dim': [8, 8], 'conv_kernel': [2, 2], 'conv_stride': [1, 1], 'num_feat_extract_layers': 2,
    'num_conv_pos_embeddings': 2, 'num_conv_pos_embedding_groups': 2,
}
BATCH, LENGTH = 2, 8


@dataclasses.dataclass
class ClassResult:
  """One converted class: verified (with the largest differences), failed (parity or an error), or not built."""

  family: str
  name: str
  status: str  # 'verified', 'failed' or 'not built'
  reason: str = ''
  forward: float = 0.0
  gradient: float = 0.0


@dataclasses.dataclass
class FamilyResult:
  family: str
  converted: int = 0
  kept_linen: int = 0
  todos: int = 0
  size_arguments: int = 0
  classes: list[ClassResult] = dataclasses.field(default_factory=list)
  linen_parents: list[ClassResult] = dataclasses.field(default_factory=list)  # Linen classes with to_linen bridges
  error: str = ''


def installed_file(family: str) -> pathlib.Path:
  spec = importlib.util.find_spec('transformers')
  if spec is None or not spec.origin:
    raise SystemExit('transformers==4.46.3 is not installed: pip install transformers==4.46.3')
  return pathlib.Path(spec.origin).parent / 'models' / family / f'modeling_flax_{family}.py'


def migrate_families(families: tp.Sequence[str], root: pathlib.Path, jobs: int) -> tuple[tp.Any, float]:
  """Copies the families' files under `root/transformers/models/` and migrates them in one run (timed)."""
  from codemods import rules as registry
  from codemods.engine import migrate

  for family in families:
    target = root / 'transformers' / 'models' / family / f'modeling_flax_{family}.py'
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(installed_file(family), target)
    (target.parent / '__init__.py').write_text('')
  for folder in (root / 'transformers', root / 'transformers' / 'models'):
    (folder / '__init__.py').write_text('')
  cwd = os.getcwd()
  os.chdir(root)
  try:
    start = time.perf_counter()
    result = migrate(['transformers'], rules=registry.ALL_RULES, write=True, jobs=jobs)
    seconds = time.perf_counter() - start
  finally:
    os.chdir(cwd)
  (root / 'report.json').write_text(result.to_json())
  return result, seconds


def import_migrated(family: str, path: pathlib.Path) -> tp.Any:
  """The migrated file as a module of the installed package `transformers.models.<family>`."""
  name = f'transformers.models.{family}._nnx_{path.stem}'
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def tiny_config(config_class: type) -> tp.Any:
  """The family's config at the harness's tiny sizes. T5's and LongT5's modules read `config.causal`, which their
  model sets on its encoder's copy of the config (False) and its decoder's (True): the harness builds an encoder's."""
  defaults = config_class().to_dict()
  config = config_class(**{key: value for key, value in TINY_CONFIG.items() if key in defaults})
  if 'is_encoder_decoder' in defaults and not hasattr(config, 'causal'):
    config.causal = False
  return config


def _hidden(config: tp.Any) -> int:
  """The width of the family's hidden states; a vision family's last stage (ResNet's `hidden_sizes`)."""
  width = next((getattr(config, k) for k in ('hidden_size', 'd_model', 'n_embd') if hasattr(config, k)), None)
  return width if width is not None else config.hidden_sizes[-1]


def make_inputs(linen_class: type, config: tp.Any, channels: int | None = None) -> tuple[tuple, dict[str, tp.Any]]:
  """Inputs for `linen_class.__call__` from its parameter names; raises LookupError for a name with no recipe. A
  vision family's feature map (`hidden_state`) has `channels` channels: the class's `in_channels`, else the
  embedder's width."""
  import jax
  import jax.numpy as jnp

  key = jax.random.key(0)
  hidden, vocab = _hidden(config), getattr(config, 'vocab_size', 64)
  tokens = (BATCH, 2, LENGTH) if 'MultipleChoice' in linen_class.__name__ else (BATCH, LENGTH)
  recipes: dict[str, tp.Callable[[], tp.Any]] = {
      'input_ids': lambda: jax.random.randint(key, tokens, 2, vocab, jnp.int32),
      'decoder_input_ids': lambda: jax.random.randint(key, tokens, 2, vocab, jnp.int32),
      'attention_mask': lambda: jnp.ones(tokens, jnp.int32),
      'decoder_attention_mask': lambda: jnp.ones(tokens, jnp.int32),
      'token_type_ids': lambda: jnp.zeros(tokens, jnp.int32),
      'position_ids': lambda: jnp.broadcast_to(jnp.arange(LENGTH), tokens).astype(jnp.int32),
      'decoder_position_ids': lambda: jnp.broadcast_to(jnp.arange(LENGTH), tokens).astype(jnp.int32),
      'hidden_states': lambda: jax.random.normal(key, (*tokens, hidden)),
      'features': lambda: jax.random.normal(key, (*tokens, hidden)),
      'encoder_output': lambda: jax.random.normal(key, (*tokens, hidden)),
      'input_tensor': lambda: jax.random.normal(jax.random.key(1), (*tokens, hidden)),  # a residual branch
      'attention_output': lambda: jax.random.normal(jax.random.key(1), (*tokens, hidden)),
      'key_value_states': lambda: jax.random.normal(jax.random.key(2), (*tokens, hidden)),  # an encoder's output
      'layer_head_mask': lambda: jnp.ones((getattr(config, 'num_attention_heads', 2),)),
      'head_mask': lambda: jnp.ones((getattr(config, 'num_hidden_layers', 2), getattr(config, 'num_attention_heads', 2))),
      'pooled_output': lambda: jax.random.normal(key, (BATCH, hidden)),
      'pixel_values': lambda: jax.random.normal(
          key, (BATCH, getattr(config, 'image_size', 16), getattr(config, 'image_size', 16),
                getattr(config, 'num_channels', 3))),
      'input_values': lambda: jax.random.normal(key, (BATCH, 400)),
      'hidden_state': lambda: jax.random.normal(key, (BATCH, 8, 8, channels or getattr(config, 'embedding_size', 8))),
      'input_features': lambda: jax.random.normal(key, (BATCH, getattr(config, 'num_mel_bins', 8), 16)),
  }
  if hasattr(config, 'hidden_sizes'):  # a vision family's stages call their feature map `x` (ResNet, RegNet)
    recipes['x'] = recipes['hidden_state']
  if 'Decoder' in linen_class.__name__:  # a seq2seq decoder runs on an encoder's output, which Linen needs to create
    #                                       the cross-attention's params (created when first called)
    recipes['encoder_hidden_states'] = lambda: jax.random.normal(jax.random.key(2), (*tokens, hidden))
    recipes['encoder_attention_mask'] = lambda: jnp.ones(tokens, jnp.int32)
  args = []
  for name, parameter in list(inspect.signature(linen_class.__call__).parameters.items())[1:]:
    if name in ('deterministic', 'train'):
      continue  # compare sets the train/eval arguments
    if name in recipes:
      args.append(recipes[name]())
    elif parameter.default is parameter.empty:
      raise LookupError(f'no input recipe for the __call__ argument {name!r}')
    else:
      break
  return tuple(args), {}


def verify_class(family: str, name: str, original: tp.Any, migrated: tp.Any, report_path: str) -> ClassResult:
  """Builds the Linen class and its port, and compares them (`linen2nnx verify --migrate-report`'s check)."""
  from codemods.ports import model_refs

  linen_class, nnx_class = getattr(original, name), getattr(migrated, name)
  built = _build(family, name, original, linen_class)
  if isinstance(built, ClassResult):
    return built
  linen, args, kwargs = built
  try:
    port, nnx_kwargs = load_port(report_path, nnx_class, linen, args, kwargs)
  except Exception as error:  # the Linen class fails on these inputs, or a size cannot be measured
    return ClassResult(family, name, 'not built', _short(error))
  return compare_port(family, name, model_refs.Example(linen, args, kwargs), lambda: nnx_class(**nnx_kwargs), port)


def load_port(report_path: str, nnx_class: type, linen: tp.Any, args: tuple, kwargs: dict) -> tuple[tp.Any, dict]:
  """The port of `nnx_class` from its migrate record, and the keyword arguments that build it for these inputs;
  a size of a submodule Linen does not create here is given as 1: the port must not build it either."""
  from codemods.ports import migrate_report
  from codemods.ports import model_refs

  port = migrate_report.load_port(report_path, nnx_class, linen, args, kwargs)
  measured, unused = port.measured_sizes(), {}
  for size, measure in measured.items():
    try:
      measure()
    except migrate_report.ReportError as error:
      if 'is not called on these inputs' not in str(error):
        raise
      unused[size] = 1
  nnx_kwargs, _ = model_refs.nnx_constructor_kwargs(nnx_class, linen, (*args, *kwargs.values()), unused, 0,
                                                     measured=measured)
  return port, nnx_kwargs


def compare_port(where: str, name: str, example: tp.Any, build: tp.Callable[[], tp.Any], port: tp.Any,
                 **options: tp.Any) -> ClassResult:
  """`verify`'s check of the NNX model `build()` makes against the Linen `example`, as one result; the Linen
  model's other rng streams (BEiT's 'droppath') are added as the errors name them."""
  from codemods.commands.verify import check_port

  streams: list[str] = []
  while True:
    try:
      result, _ = check_port(example, build(), port, rng_streams=streams, **options)
      break
    except Exception as error:
      stream = re.search(r'needs PRNG for "(\w+)"', str(error))
      if stream is None or stream[1] in streams:
        return ClassResult(where, name, 'failed', _short(error))
      streams.append(stream[1])
  forward = max((d.max_abs for d in result.differences if d.check == 'output'), default=0.0)
  gradient = max((d.max_abs for d in result.differences if d.check == 'gradient'), default=0.0)
  failed = sorted({d.check for d in result.failures if hasattr(d, 'check')})
  return ClassResult(where, name, 'verified' if result.ok else 'failed',
                     '' if result.ok else f'differs: {", ".join(failed) or "partition specs"}', forward, gradient)


def _build(family: str, name: str, original: tp.Any, linen_class: type) -> tuple[tp.Any, tuple, dict] | ClassResult:
  """The Linen class built from a tiny config, and inputs for its call; a 'not built' result where there are none."""
  try:
    fields = {f.name: f for f in dataclasses.fields(linen_class)}
    config_class = _config_class(original, fields['config'].type) if 'config' in fields else None
    if config_class is None:
      return ClassResult(family, name, 'not built', 'no config field')
    config = tiny_config(config_class)
    required = [f for f in fields.values() if f.init and f.name not in ('config', 'parent', 'name')
                and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    flags = {f.name: False for f in required if f.type in (bool, 'bool')}  # T5's `has_relative_attention_bias`
    widths = {'in_channels': getattr(config, 'embedding_size', None),  # a vision stage's (ResNet, RegNet): from
              'out_channels': (getattr(config, 'hidden_sizes', None) or [None])[0]}  # the embedder to the first stage
    flags |= {f.name: widths[f.name] for f in required if widths.get(f.name) is not None}
    linen = linen_class(config=config, **flags)
    args, kwargs = make_inputs(linen_class, config, flags.get('in_channels'))
  except LookupError as error:
    return ClassResult(family, name, 'not built', str(error))
  except Exception as error:  # a config the harness cannot build (`config: Union[TextConfig, VisionConfig]`)
    return ClassResult(family, name, 'not built', f'no tiny config: {_short(error)}')
  return linen, args, kwargs


def verify_linen_parent(family: str, name: str, original: tp.Any, migrated: tp.Any) -> ClassResult:
  """A class left as Linen that now builds converted classes through `nnx_bridge.to_linen`: the migrated class
  must create the original's variables (same paths, shapes and dtypes) and, run on the original's own variables,
  give the same outputs and the same gradient of every parameter."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  built = _build(family, name, original, getattr(original, name))
  if isinstance(built, ClassResult):
    return built
  linen, args, kwargs = built
  bridged = getattr(migrated, name)(**{f.name: getattr(linen, f.name) for f in dataclasses.fields(linen)
                                       if f.init and f.name not in ('parent', 'name')})
  key = jax.random.key(0)
  try:
    variables = linen.init(key, *args, **kwargs)
  except Exception as error:  # the original does not run on the harness's config or inputs
    return ClassResult(family, name, 'not built', f'the Linen original fails: {_short(error)}')
  try:
    layout = lambda tree: jax.tree.map(lambda leaf: (leaf.shape, leaf.dtype), tree)
    if layout(bridged.init(key, *args, **kwargs)) != layout(variables):  # run for real: init is where it differs
      return ClassResult(family, name, 'failed', 'differs: the variables it creates')
    outputs = [jax.tree.leaves(m.apply(variables, *args, **kwargs)) for m in (linen, bridged)]
    total = lambda m: lambda params: sum(leaf.sum() for leaf in jax.tree.leaves(
        m.apply({**variables, 'params': params}, *args, **kwargs)) if jnp.issubdtype(leaf.dtype, jnp.floating))
    grads = [jax.tree.leaves(jax.grad(total(m))(variables['params'])) for m in (linen, bridged)]
  except Exception as error:
    return ClassResult(family, name, 'failed', _short(error))
  largest = lambda pairs: max((float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in pairs), default=0.0)
  forward, gradient = largest(zip(*outputs)), largest(zip(*grads))
  ok = len(outputs[0]) == len(outputs[1]) and forward <= 1e-5 and gradient <= 1e-4
  return ClassResult(family, name, 'verified' if ok else 'failed', '' if ok else 'differs: output or gradient',
                     forward, gradient)


def _linen_parents(migrated: tp.Any) -> list[str]:
  """The classes of the migrated module left as Linen whose code builds a class through nnx_bridge.to_linen."""
  from flax import linen as nn

  return [name for name, value in vars(migrated).items()
          if inspect.isclass(value) and issubclass(value, nn.Module) and value.__module__ == migrated.__name__
          and 'nnx_bridge.to_linen(' in inspect.getsource(value)]


def _config_class(module: tp.Any, annotation: tp.Any) -> type | None:
  """The config class a `config: BertConfig` field names (a string under `from __future__ import annotations`)."""
  return getattr(module, annotation.split('.')[-1], None) if isinstance(annotation, str) else annotation


def _short(error: Exception) -> str:
  frames = traceback.extract_tb(error.__traceback__)
  where = f' at {pathlib.Path(frames[-1].filename).name}:{frames[-1].lineno}' if frames else ''
  text = ' '.join(str(error).split())
  return f'{type(error).__name__}: {text[:400]}{where}'


def run(families: tp.Sequence[str], jobs: int) -> tuple[list[FamilyResult], float]:
  with tempfile.TemporaryDirectory() as scratch:
    root = pathlib.Path(scratch)
    result, seconds = migrate_families(families, root, jobs)
    document = json.loads((root / 'report.json').read_text())
    by_path = {f['path']: f for f in document['files']}
    results = []
    for family in families:
      relative = f'transformers/models/{family}/modeling_flax_{family}.py'
      entry = by_path.get(relative)
      found = FamilyResult(family)
      results.append(found)
      if entry is None or entry['status'] == 'failed':
        found.error = 'migrate failed' if entry else 'not migrated'
        continue
      found.todos = entry['todos']
      found.converted = len(entry['classes'])
      found.kept_linen = sum(1 for e in entry['entries'] if e['kind'] == 'todo' and ' as Linen' in e['message'])
      found.size_arguments = sum(1 for c in entry['classes'] for a in c['arguments']
                                 if a['origin'] in ('input_dimension', 'undetermined'))
      if not entry['classes']:
        continue
      try:
        original = importlib.import_module(f'transformers.models.{family}.modeling_flax_{family}')
        migrated = import_migrated(family, root / relative)
      except Exception as error:
        found.error = f'the migrated file does not import: {_short(error)}'
        continue
      for record in entry['classes']:
        found.classes.append(verify_class(family, record['nnx_name'], original, migrated, str(root / 'report.json')))
      found.linen_parents = [verify_linen_parent(family, name, original, migrated) for name in _linen_parents(migrated)]
      verified = sum(c.status == 'verified' for c in found.classes)
      print(f'hf_zoo: {family}: {verified} of {len(found.classes)} converted classes verified', file=sys.stderr,
            flush=True)
    return results, seconds


def migrate_speed(families: tp.Sequence[str], jobs: int) -> float:
  """Files per second of one `migrate --write` run over the families' files at `-j jobs` (nothing verified)."""
  with tempfile.TemporaryDirectory() as scratch:
    _, seconds = migrate_families(families, pathlib.Path(scratch), jobs)
  return len(families) / seconds


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--families', default=','.join(FAMILIES))
  parser.add_argument('--json', help='also write the rows as JSON')
  parser.add_argument('-j', '--jobs', type=int, default=2)
  parser.add_argument('--speed', action='store_true', help='only time migrate over the files at -j 1 and -j 2')
  args = parser.parse_args()
  families = [f for f in args.families.split(',') if f]
  if args.speed:
    for jobs in (1, 2):
      print(f'migrate -j {jobs}: {migrate_speed(families, jobs):.2f} files/s over {len(families)} files')
    return
  results, seconds = run(families, args.jobs)
  print(f'{"family":22} {"conv":>4} {"kept":>4} {"todo":>4} {"size":>4} {"ok":>3} {"fail":>4} {"n/b":>4} {"brdg":>5}'
        '  max fwd / grad diff')
  reasons: collections.Counter[str] = collections.Counter()
  for r in results:
    counts = collections.Counter(c.status for c in r.classes)
    checked = [*r.classes, *r.linen_parents]
    fwd = max((c.forward for c in checked if c.status == 'verified'), default=0.0)
    grad = max((c.gradient for c in checked if c.status == 'verified'), default=0.0)
    bridges = f'{sum(c.status == "verified" for c in r.linen_parents)}/{len(r.linen_parents)}'
    print(f'{r.family:22} {r.converted:4} {r.kept_linen:4} {r.todos:4} {r.size_arguments:4} {counts["verified"]:3} '
          f'{counts["failed"]:4} {counts["not built"]:4} {bridges:>5}  {fwd:.1e} / {grad:.1e} {r.error}')
    reasons.update(f'{c.status}: {c.reason}' for c in r.classes if c.status != 'verified')
    reasons.update(f'to_linen parent {c.status}: {c.reason}' for c in r.linen_parents if c.status != 'verified')
  total = collections.Counter(c.status for r in results for c in r.classes)
  parents = [c for r in results for c in r.linen_parents]
  bridges = f'{sum(c.status == "verified" for c in parents)}/{len(parents)}'
  print(f'{"total":22} {sum(r.converted for r in results):4} {sum(r.kept_linen for r in results):4} '
        f'{sum(r.todos for r in results):4} {sum(r.size_arguments for r in results):4} {total["verified"]:3} '
        f'{total["failed"]:4} {total["not built"]:4} {bridges:>5}')
  print(f'migrate: {len(families)} files in {seconds:.1f} s ({len(families) / seconds:.2f} files/s, -j {args.jobs})')
  for reason, count in reasons.most_common():
    print(f'{count:4}  {reason}')
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=2))


if __name__ == '__main__':
  main()
