"""Thin command-line views: each subcommand parses arguments and calls a plain function."""
