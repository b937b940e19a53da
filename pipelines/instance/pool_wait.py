"""A run that waits for a `dunning_ledger` pool slot sleeps until its next claim check instead of spinning.

Dagster 1.13 (checked up to 1.13.29) computes the wait of a blocked step as
`min([0, *seconds_to_each_pending_check])` in
`InstanceConcurrencyContext.interval_to_next_pending_claim_check`: never more than 0, so the in-process executor's
`sleep_til_ready` never sleeps and its loop runs flat out until the slot frees. The claim itself is asked of the
storage only at each step's pending timeout (1 s, growing to 15 s), so the spinning does not make the wait shorter:
it only burns a core. Measured: two `dunning run` of 300 invoices started together on one home took 10-11 CPU-s
each, where one alone takes 2.4 (the second shard on a 2-core host slows the first by as much as it waits).

`apply()` replaces that one method with the wait it means: the time to the earliest pending check, at least 0. Its
one caller is `ActiveExecution.sleep_interval`, which only the in-process executor's loop uses (through
`sleep_til_ready`), and which also weighs the steps waiting to retry. A run cancelled while it waits ends when it
gets the slot, as before. Applied when `pipelines.instance` is imported (the instance class every process of a
home loads) and by the Definitions (the daemon's run workers, an instance on PostgreSQL). The private attributes it
reads are Dagster's; `tests/test_instance.py` drives a real claim through a real instance, so a rename shows there.
"""

from __future__ import annotations

import time

from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext


def seconds_to_next_pending_claim_check(context: InstanceConcurrencyContext) -> float:
    """How long a run with a step waiting for a pool slot may sleep before that step's next claim is due."""
    if not context._pending_claims:
        return 0.0
    now = time.time()
    # a pending step without a timeout (none set yet) is due now, as in Dagster's own code; a timeout left over for a
    # step no longer pending is not waited for
    due = (context._pending_timeouts.get(step, now) for step in context._pending_claims)
    return max(0.0, min(due) - now)


def apply() -> None:
    """Once per process; idempotent."""
    InstanceConcurrencyContext.interval_to_next_pending_claim_check = seconds_to_next_pending_claim_check  # type: ignore[method-assign]


apply()
