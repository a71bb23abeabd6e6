"""Subcommands of the `kvlab` CLI, one module each: add_arguments(parser) and run(args)."""
