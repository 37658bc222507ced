"""One module per `linen2nnx` subcommand, each with `add_parser(subparsers)` and `run(args)`."""
