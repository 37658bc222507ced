"""L2N003: the call sites and training code of converted models (`init`, `apply`, state reads, optimizers, steps) -> NNX.

## What it does
Rewrites the code that builds, initialises and uses a model of a class L2N002 converted in the
same file (or a built-in layer such as `nn.Dense(10)`): the `init` becomes the NNX construction,
`apply` a call of the model, reads of its variables attribute reads, `tx.init` / `TrainState`
an `nnx.Optimizer`, and steps over the params `nnx.jit` steps over the model (in the
`--step-style` chosen), including decode-mode views and `jax.pmap` steps.

## Why
NNX models hold their own state: the variables dicts, `init` / `apply` and the state threaded
through every step have no NNX counterpart, so each call site must change with the class.

## Example
```python
model = MLP(256, 10)
variables = model.init(jax.random.key(0), x)
y = model.apply(variables, x)
```
Use instead:
```python
model = MLP(256, 10, linear_in_features=x.shape[-1], rngs=nnx.Rngs(0))  # the size L2N002 added
y = model(x)
```

## What stays a TODO
Any other use of the model or its state (a tree map over the params, a checkpoint save, a
step with `static_argnums`, `mutable=['intermediates']`, a custom TrainState), `init` with
`method=`, a size the inputs of `init` do not determine: the whole model's code stays Linen,
with a TODO saying why. docs/migrate.md has the details.

Layout: `analyse` finds the models a file builds (`facts.ModelSite`), `decide` plans each one
(`follow.StateWalk` dispatches every use of its state to a pass), and the passes rewrite:
`construction`, `applies`, `state_reads`, `optimizers`, `train_state_keep`, `training_steps`,
`step_styles`, `decoding`, `data_parallel`, `modes`; `rule` is the libcst glue.
"""

from codemods.rules.l2n003.rule import ConvertInitApplyRule

__all__ = ['ConvertInitApplyRule']
