"""Splitting one day's cycle by customer, so several workers can share it.

Shard K of N (`K/N`, K counted from 0) owns the customers whose id hashes to K:
`zlib.crc32(customer_id as UTF-8) % N`. crc32 is fixed by the format, so every
worker, machine and Python version agrees on it (Python's own `hash` of a
string is salted per process and would send a customer to a different shard in
each worker). A row without a customer id (a rejected snapshot row, an event)
belongs to shard 0, so it is handled exactly once.

Correctness never depends on sharding: the ledger's primary key and the
claim-time cap already make every send exactly-once and capped, whoever sends
it. Sharding only decides who does the work, and keeping one customer in one
shard keeps their emails grouped and their cap checked in one place.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import polars as pl

from dunning.errors import UserInputError

MAX_SHARDS = 1024
_SHAPE = re.compile(r"\s*([0-9]{1,6})\s*/\s*([0-9]{1,6})\s*", re.ASCII)


def shard_of(customer_id: str | None, count: int) -> int:
    """The shard (0..count-1) that owns `customer_id`; no id (None or empty) is shard 0's."""
    if not customer_id:
        return 0
    return zlib.crc32(customer_id.encode("utf-8", "surrogatepass")) % count


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`; `Shard(0, 1)` (`EVERYONE`) is every customer."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise UserInputError(f"shard {self}: N must be between 1 and {MAX_SHARDS}")
        if not 0 <= self.index < self.count:
            raise UserInputError(f"shard {self}: K must be between 0 and N-1 (shards are numbered from 0)")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def everyone(self) -> bool:
        return self.count == 1

    def owns(self, customer_id: str | None) -> bool:
        return shard_of(customer_id, self.count) == self.index

    def owned_ids(self, frame: pl.DataFrame, column: str = "customer_id") -> pl.Series:
        """The distinct non-null ids in `frame[column]` this shard owns (hashed once per distinct id)."""
        ids = frame.get_column(column).cast(pl.String).drop_nulls().unique()
        mask = [self.owns(customer_id) for customer_id in ids.to_list()]
        return ids.filter(pl.Series(mask, dtype=pl.Boolean))

    def keep(self, frame: pl.DataFrame, column: str = "customer_id") -> pl.DataFrame:
        """The rows of `frame` whose `column` this shard owns (a null id: shard 0's); every row for `EVERYONE`."""
        if self.everyone or frame.is_empty():
            return frame
        mine = pl.col(column).cast(pl.String).is_in(self.owned_ids(frame, column).implode())
        return frame.filter(mine.fill_null(self.index == 0))


EVERYONE = Shard(0, 1)


def parse_shard(text: str) -> Shard:
    """`K/N` as a Shard, or UserInputError with one line saying what is wrong."""
    shown = repr(text[:40])
    match = _SHAPE.fullmatch(text)
    if match is None:
        raise UserInputError(f"shard {shown}: expected K/N, shard K of N counted from 0 (for example 0/3)")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or count > MAX_SHARDS:
        raise UserInputError(f"shard {shown}: N must be between 1 and {MAX_SHARDS}")
    if index >= count:
        raise UserInputError(f"shard {shown}: K must be below N (shards are numbered 0 to N-1)")
    return Shard(index, count)


def shard_or_everyone(text: str | None) -> Shard:
    """A run's shard from its config value: None (or empty) is every customer."""
    return parse_shard(text) if text else EVERYONE
