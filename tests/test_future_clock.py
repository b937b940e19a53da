"""No clock from the future by accident: a live run whose `--as-of` is more than 15 minutes ahead of the wall clock
needs `--allow-future-as-of` (exit 2 naming it otherwise); a dry run and `preview` may look ahead. Such a run dates
its snapshot by its clock, so every ordinary run after it is refused as stale: the refusal names that run."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from tests.conftest import invoice

ROWS = [invoice(invoice_id=f"in_{i}", customer_id=f"cus_{i}", customer_email=f"c{i}@example.com") for i in range(2)]


def ahead(**delta: float) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(**delta)).isoformat()


def test_a_live_run_hours_ahead_is_refused_naming_the_flag_and_writes_nothing(deployment):
    code, out, err = deployment.run(ROWS, ahead(hours=2, minutes=30))
    assert code == 2 and "Traceback" not in err
    assert "--allow-future-as-of" in err and re.search(r"2 h (29|30) min ahead of the wall clock", err), err
    assert not (deployment.home / "dunning.duckdb").exists(), "refused before the ledger was opened"
    assert not (deployment.home / "dagster").exists(), "and before Dagster started"
    assert deployment.outbox() == []


@pytest.mark.slow
def test_with_the_flag_the_run_goes_and_within_fifteen_minutes_it_needs_none(deployment):
    code, _, err = deployment.run(ROWS, ahead(minutes=10))
    assert code == 0, err
    assert len(deployment.outbox()) == 2
    code, _, err = deployment.run(ROWS, ahead(days=3), "--allow-future-as-of")
    assert code == 0, err


@pytest.mark.slow
def test_a_dry_run_and_a_preview_may_look_ahead(deployment):
    code, _, err = deployment.run(ROWS, ahead(days=20), "--dry-run")
    assert code == 0, err
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(deployment.snapshot(ROWS)), "--as-of", ahead(days=20), "--json"
    )
    assert code == 0, err
    assert len(json.loads(out)["emails"]) == 2
    assert deployment.outbox() == []


@pytest.mark.slow
def test_the_stale_refusal_after_a_run_from_the_future_names_that_run(deployment):
    code, out, err = deployment.run(ROWS, ahead(hours=2, minutes=30), "--allow-future-as-of")
    assert code == 0, err
    [future_run] = deployment.query("SELECT run_id FROM applied_snapshots")
    code, _, err = deployment.run(ROWS, ahead(minutes=0))
    assert code == 2 and "older than the last applied one" in err
    assert f"run {future_run[0][:8]} ran with --as-of" in err and "ahead of the wall clock" in err, err
    assert "--allow-stale" in err


@pytest.mark.slow
def test_a_run_launched_with_a_clock_ahead_outside_the_cli_is_refused_in_its_first_step(deployment):
    """The Dagster launchpad sets `cycle_request.as_of` itself: the first step refuses as the CLI does."""
    import dagster as dg

    from pipelines.cli import cycle as cli
    from pipelines.cli.printing import failures as report
    from pipelines.instance import get_instance

    snapshot = str(deployment.snapshot(ROWS))
    deployment.home.mkdir(parents=True)
    run_config = cli.cycle_run_config(deployment.home, None, snapshot_path=snapshot, as_of=ahead(hours=5))
    result = dg.execute_job(dg.reconstructable(cli.dunning_cycle), instance=get_instance(deployment.home),
                            run_config=run_config, raise_on_error=False)  # fmt: skip
    text, code = report.failed_run_report(result)
    assert code == 2 and "--allow-future-as-of" in text
    assert not (deployment.home / "dunning.duckdb").exists(), "refused before the ledger was opened"
    assert deployment.outbox() == []
