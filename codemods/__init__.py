"""codemods: rewrite Flax Linen source into Flax NNX (the `linen2nnx` command line)."""
