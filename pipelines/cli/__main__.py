"""`python -m pipelines.cli`: the `dunning` command."""

from pipelines.cli import entry

entry()
