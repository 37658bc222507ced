"""Building a Linen model and its migrated NNX port from file references and a migrate report.

`model_refs` builds both models from what a command line names (class references, kwargs,
inputs, an examples file); `migrate_report` finds the report's record of the NNX class and uses
it to construct the port and pair its layers with the Linen ones; `model_arguments` declares the
options the commands take for them. Used by `verify`, `convert` and `demo`.
"""
