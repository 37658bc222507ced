"""L2N002: `flax.linen.Module` classes (setup style and `@nn.compact`) -> `nnx.Module`.

## What it does
Converts each module-level Linen class of a file into an NNX class: an `__init__(self, <fields>, *,
<sizes>, rngs: nnx.Rngs)` that stores the fields, runs the `setup()` body and builds every layer,
`self.param` and `self.variable` the `@nn.compact` method creates (layers from the layer table,
`nnx_bridge.layer_table`), and a `__call__` that uses them. Sizes NNX needs up front are derived
from the code or become keyword-only constructor arguments, each reported with its source;
train/eval switches go (`model.train()` / `model.eval()` set them); decode caches get an
`init_cache`; `nn.scan` / `nn.vmap` / `nn.remat` / `nn.jit` over classes of the file, control
flow, layers built in loops, module factories and tied weights have NNX counterparts. Everything else
of the class is kept as it is: its decorators (`@gin.configurable`), class keywords (`metaclass=`), plain
extra bases (a mixin of the file, `abc.ABC`), computed field defaults, class attributes, and plain blocks
of the body that build nothing; a local of the method bound once to code of fields and constants
(`initializer = nn.initializers.xavier_uniform()`) is evaluated in `__init__` where a construction reads
it (`head.py`). A class of another file of the run that was converted is built as one of the file
(`interface.py`: its record carries what a construction of it needs). A class left as Linen builds the classes
it uses that were converted through
`nnx_bridge.to_linen`, on the same variables, where it can. docs/migrate.md describes each case.

## Why
NNX modules are plain Python objects that own their state: variables exist from `__init__` on,
so the lazy shape inference of `@nn.compact` and the scope APIs have no counterpart, and the
layer sizes Linen infers on the first call must be known when the module is built.

## Example
```python
class MLP(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features)(x)
```
becomes
```python
class MLP(nnx.Module):
  def __init__(self, features: int, *, linear_in_features: int, rngs: nnx.Rngs):
    self.features = features
    self.linear = nnx.Linear(in_features=linear_in_features, out_features=self.features, rngs=rngs)

  def __call__(self, x):
    return self.linear(x)
```

## What stays a TODO
A class the rule cannot convert whole is left as Linen, with a TODO at the line that keeps it so, saying
what to write instead where there is one (a Linen transform or a dataclass decorator over the class, a
base out of sight, `kw_only=`, a `dataclasses.field(...)` default, a local bound twice): scope APIs other
than param / variable / make_rng / sow / is_initializing / is_mutable_collection('params') and the
decode-cache pattern, Linen names without an NNX counterpart, constructions NNX cannot build in `__init__` (under conditions on the
call, in loops other than the converted ones, in nested functions), sizes or shapes the code does
not fix where NNX needs them, and train/eval switches used other than to set train/eval arguments.
A class left as Linen keeps the classes it uses Linen too where no to_linen bridge keeps it running
on the same variables (`linen_parents.py` says when).

## Layout
Analyse: `facts.py` (`FileFacts`, once per file, with `factory_scan.with_factories`). Decide:
`head.py` checks the class head and fields (what stays as it is), then `planner.py` fills a fresh `plan.ClassRewrite` per class with the planning passes, functions of a
`context.ClassContext` (`scope.py`, `children.py`, `lifted.py`, `modes.py`, `decode_cache.py`, `loops.py`,
`factories.py`, `tied.py`, `example_shapes.py`), which share through modules that import no pass: `queries.py`,
`constructions.py` (what a construction builds), `init_code.py` (a child's `__init__` code), `sizes.py` over the
size/shape interpreter `dims.py`, and `nodes.py`; a class that fails is dropped whole; `decide.py` decides the
file's classes together (`linen_parents.py`: the to_linen bridges of classes left as Linen, with the Linen names
`bridge_names.py` finds). Rewrite: `rule.py`
applies the converted classes' `plan.FileRewrite`, with `emit.py` (the NNX code) and `entries.py` (the report);
`interface.py` carries a converted class to the other files of the run that build it.
"""

from codemods.rules.l2n002.rule import (
    ConvertModuleDefinitionsRule as ConvertModuleDefinitionsRule,
)

__all__ = ('ConvertModuleDefinitionsRule',)
