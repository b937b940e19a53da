"""Garbage collection tuned for a batch run: what is loaded is frozen, and young collections come less often.

A 1M-invoice cycle spent 1.8 s of its run's process in CPython's cyclic
garbage collector, 1,590 collections, most of them walking the objects every
import leaves behind (Dagster alone is hundreds of thousands), while the
claims of the send step waited on that process. `settle` moves every object
alive now to the permanent generation, which the collector never walks
again (`gc.freeze`), and raises the allocations between young collections
from CPython's 700. In the 1M cycle: 1.8 s → 0.6 s (`bench/RESULTS.md`,
2026-12-01T14:00–14:35). Reference counting still frees almost everything at
once; only garbage in cycles waits longer. What is frozen is never
collected, including a cycle that was already garbage when `settle` ran:
a process that ends with its run (the command, Dagster's run worker, a
render worker) can afford that, which is why only they call it.
"""

from __future__ import annotations

import gc

YOUNG_COLLECTION_EVERY = 20_000  # allocations, net of frees, between young collections (CPython's default: 700)


def settle() -> None:
    """Freeze what is alive now and space out young collections; call it once the process has loaded what it
    needs (again later freezes what was loaded since)."""
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, middle, oldest)
