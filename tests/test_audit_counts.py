"""The audit's counts (`dunning.report.audit.summarize`) in one pass, and an ingest part's stamp read cheaply: the
same answers as before, for less."""

from __future__ import annotations

import datetime as dt

import polars as pl

from dunning.report import audit as audit_rules

AS_OF = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)


def test_the_counts_in_one_pass_are_those_of_a_filter_each_nulls_included():
    rows = [
        # kind, outcome, reason, owed, stated, remaining
        ("reminder", "sent", None, True, 100, 100),
        ("reminder", "sent", None, False, 100, 100),  # sent for an invoice not owed
        ("reminder", "sent", None, None, 100, 90),  # owed unknown, amount mismatched
        ("reminder", "sent", None, True, None, 100),  # no stated amount: no mismatch counted
        ("reminder", "held", "provider_failure", True, None, 100),  # still held from an earlier cycle
        ("reminder", "held", "no_email_address", True, None, 100),
        ("reminder", "dry_run", None, True, None, 100),
        ("reminder", "sent", "payment_url_dropped", True, 50, 50),
        ("payment_failed", "failed", None, None, None, None),
        ("payment_failed", "unknown", None, None, None, None),
        ("escalation", "held", "unknown_outcome", True, None, 10),
    ]
    audit = pl.DataFrame(
        rows,
        schema={
            "kind": pl.String,
            "outcome": pl.String,
            "reason": pl.String,
            "owed": pl.Boolean,
            "amount_stated_minor": pl.Int64,
            "remaining_minor": pl.Int64,
        },
        orient="row",
    )
    one_filter_each = {
        "due": audit.filter((pl.col("kind") == "reminder") & ~audit_rules.still_held_expr()).height,
        "still_held": audit.filter(audit_rules.still_held_expr()).height,
        **{str(o): audit.filter(pl.col("outcome") == o).height for o in audit_rules.SUMMARIZED_OUTCOMES},
        "not_owed_reminded": audit_rules.not_owed_reminded(audit).height,
        "payment_urls_dropped": audit.filter(pl.col("reason") == "payment_url_dropped").height,
        "cc_addresses_dropped": audit.filter(pl.col("reason") == "cc_address_dropped").height,
        "amount_mismatches": audit_rules.amount_mismatches(audit).height,
    }
    counts = audit_rules.summarize(audit)
    assert counts == one_filter_each
    assert counts["not_owed_reminded"] == 2 and counts["amount_mismatches"] == 1 and counts["still_held"] == 2
    assert audit_rules.summarize(audit.clear()) == {name: 0 for name in counts}


def test_an_ingest_parts_stamp_is_read_from_its_footer_and_any_other_file_has_none(tmp_path):
    """`part_stamp` reads the ingest's snapshot time and invoice count from a part's Parquet metadata (without
    importing pyarrow.parquet); a plain Parquet file, a broken one or a CSV has no stamp."""
    from dunning.ingest.store import PartStamp, parquet_bytes, part_stamp

    frame = pl.DataFrame({"invoice_id": ["in_1"]})
    stamped = tmp_path / "part.parquet"
    stamped.write_bytes(parquet_bytes(frame, taken_at=AS_OF, invoices=12))
    assert part_stamp(stamped) == PartStamp(AS_OF, 12)
    only_time = tmp_path / "only-time.parquet"
    only_time.write_bytes(parquet_bytes(frame.clear(), taken_at=AS_OF))
    assert part_stamp(only_time) == PartStamp(AS_OF, None)
    plain = tmp_path / "plain.parquet"
    frame.write_parquet(plain)
    assert part_stamp(plain) is None
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    assert part_stamp(broken) is None
    assert part_stamp(tmp_path / "missing.parquet") is None
    assert part_stamp(tmp_path / "snapshot.csv") is None
