"""Dagster resources and partitions: the adapters between Dagster and the domain.

The layers point one way: `dunning` (pure domain) <- `resources` <- `checks` <-
`assets` <- `pipelines`. Checks and assets both need the deployment's home and
the run's request, so those live here, below both of them.
"""
