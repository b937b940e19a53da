"""A run that waits for a `dunning_ledger` pool slot sleeps until its next claim check instead of spinning.

Dagster 1.13 (checked up to 1.13.29) computes the wait of a blocked step as
`min([0, *seconds_to_each_pending_check])` in
`InstanceConcurrencyContext.interval_to_next_pending_claim_check`: never more than 0, so the in-process executor's
`sleep_til_ready` never sleeps and its loop runs flat out until the slot frees. The claim itself is asked of the
storage only at each step's pending timeout (1 s, growing to 15 s), so the spinning does not make the wait shorter:
it only burns a core. Measured: two `dunning run` of 300 invoices started together on one home took 10-11 CPU-s
each, where one alone takes 2.4 (the second shard on a 2-core host slows the first by as much as it waits).

`apply()` replaces that one method with the wait it means: the time to the earliest pending check, at least 0. The
in-process executor is the only caller (`ActiveExecution.sleep_til_ready`). Applied when `pipelines.instance` is
imported (the instance class every process of a home loads) and by the Definitions (the daemon's run workers,
an instance on PostgreSQL).
"""

from __future__ import annotations

import time

from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext


def seconds_to_next_pending_claim_check(context: InstanceConcurrencyContext) -> float:
    """How long a run with a step waiting for a pool slot may sleep before that step's next claim is due."""
    if not context._pending_claims:
        return 0.0
    now = time.time()
    return max(0.0, min((ready_at - now for ready_at in context._pending_timeouts.values()), default=0.0))


def apply() -> None:
    """Once per process; idempotent."""
    InstanceConcurrencyContext.interval_to_next_pending_claim_check = seconds_to_next_pending_claim_check  # type: ignore[method-assign]


apply()
