"""Phase 1 of `linen2nnx migrate` over the whole run: facts about every file, gathered before any file is
rewritten, that the rules read (docs/architecture.md). Today: the Linen class hierarchy across files."""
