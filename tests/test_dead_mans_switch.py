"""The dead man's switch: silence pages once per episode, old `unknown` keys page, and status tells both apart.

Runs go through the real CLI (they write `dunning_runs` with the real wall clock); the switch is then
evaluated with an injected `now` hours later, never by sleeping.
"""

import datetime as dt
import json

import dagster as dg
import duckdb
import pytest

from dunning.config import Alerts, parse_config
from dunning.errors import ConfigError, LedgerBusy
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.send import liveness
from pipelines import sensors
from pipelines.cli import status as report
from pipelines.definitions import defs
from pipelines.sensors import dead_mans_switch
from resources.dunning import DunningHome
from tests.conftest import invoice, write_snapshot

HOUR = dt.timedelta(hours=1)
TODAY = dt.datetime.now(dt.UTC).date()


def tick(monkeypatch, home, now: dt.datetime, cursor: str | None = None) -> dg.SensorEvaluationContext:
    """One evaluation of the sensor as the daemon would run it, at wall-clock `now`."""
    monkeypatch.setattr(sensors, "utc_now", lambda: now)
    context = dg.build_sensor_context(resources={"dunning_home": DunningHome(home=str(home))}, cursor=cursor)
    result = dead_mans_switch(context)
    assert isinstance(result, dg.SkipReason), "the switch never requests a run"
    context.skip_message = result.skip_message
    return context


def alerts(deployment, kind: str) -> list[tuple]:
    return deployment.query("SELECT message, resolved_at FROM alerts WHERE kind = ? ORDER BY created_at", [kind])


def finished(deployment, run_id_prefix: str = "") -> dt.datetime:
    [(at,)] = deployment.query(
        "SELECT max(finished_wall_at) FROM dunning_runs WHERE run_id LIKE ? || '%' AND run_id NOT LIKE 'backfill:%'",
        [run_id_prefix],
    )
    return at


def test_the_sensor_is_registered_running_and_requests_nothing():
    sensor = defs.resolve_sensor_def("dead_mans_switch")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert sensor.minimum_interval_seconds == 300


@pytest.mark.slow
def test_silence_pages_once_per_episode_and_a_new_run_resolves_it(deployment, monkeypatch):
    home = deployment.home
    fresh = tick(monkeypatch, home, dt.datetime.now(dt.UTC) + 100 * HOUR)
    assert "no live run recorded yet" in fresh.skip_message
    assert alerts(deployment, "stale_runs") == [], "a deployment that never ran is not paged"

    assert deployment.run([invoice()], "2026-11-05T09:00:00Z")[0] == 0
    first = finished(deployment)
    tick(monkeypatch, home, first + 2 * HOUR)
    assert alerts(deployment, "stale_runs") == []

    context = tick(monkeypatch, home, first + 4 * HOUR)
    [(message, resolved)] = alerts(deployment, "stale_runs")
    assert "no live run has completed for 4.0 h" in message and "alerts.stale_after_hours: 3" in message
    assert resolved is None and "stale_runs: raised" in context.skip_message
    tick(monkeypatch, home, first + 5 * HOUR)
    assert len(alerts(deployment, "stale_runs")) == 1, "one page per episode"

    assert deployment.run([invoice()], "2026-11-05T10:00:00Z")[0] == 0
    second = finished(deployment)
    tick(monkeypatch, home, second + HOUR)
    [(_, resolved)] = alerts(deployment, "stale_runs")
    assert resolved is not None, "a completed live run ends the episode"

    tick(monkeypatch, home, second + 4 * HOUR)
    episodes = alerts(deployment, "stale_runs")
    assert len(episodes) == 2 and episodes[0][1] is not None and episodes[1][1] is None, "a later episode pages again"

    # paused: the schedule skips, so silence is expected; status still warns, the switch does not page
    assert deployment.cli("pause", "--reason", "maintenance")[0] == 0
    tick(monkeypatch, home, second + 6 * HOUR)
    assert [r[1] is not None for r in alerts(deployment, "stale_runs")] == [True, True]
    with open_ledger(home / "dunning.duckdb") as ledger:
        text = report.status_text(report.status(ledger, now=second + 6 * HOUR))
    assert "WARNING: no live run has completed for 6.0 h" in text and "does not page" in text


@pytest.mark.slow
def test_unknown_keys_waiting_too_long_page_and_clear_when_resolved(deployment, monkeypatch):
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"c{i}", customer_email=f"c{i}@example.com") for i in range(2)]
    assert deployment.run(rows, "2026-11-05T09:00:00Z")[0] == 0
    old, recent = "dunning:in_0:1:day3", "dunning:in_1:1:day3"
    now = finished(deployment)
    con = duckdb.connect(str(deployment.home / "dunning.duckdb"))
    con.execute(
        "UPDATE reminder_ledger SET status = 'unknown', outcome_wall_at = ? WHERE idempotency_key = ?",
        [now - 30 * HOUR, old],
    )
    con.execute(
        "UPDATE reminder_ledger SET status = 'unknown', outcome_wall_at = ? WHERE idempotency_key = ?",
        [now - HOUR, recent],
    )
    con.close()

    for _ in range(2):
        tick(monkeypatch, deployment.home, now + HOUR)
    [(message, resolved)] = alerts(deployment, "stale_unknown")
    assert message.startswith("1 unknown key(s) waiting over 24 h") and old in message and recent not in message
    assert resolved is None
    assert alerts(deployment, "stale_runs") == [], "a run finished an hour ago"

    code, out, _ = deployment.cli("status")
    assert code == 0 and f"unknown keys waiting over 24 h: 1 (oldest {old} since" in out
    status = json.loads(deployment.cli("status", "--json")[1])
    assert status["unknown_overdue"] == 1 and status["oldest_unknown_overdue"]["idempotency_key"] == old

    (deployment.home / "config.yaml").write_text(
        "alerts:\n  unknown_after_hours: 0.5\n"
    )  # status reads HOME/config.yaml
    status = json.loads(deployment.cli("status", "--json")[1])
    assert status["unknown_overdue"] == 2 and status["unknown_after_hours"] == 0.5
    (deployment.home / "config.yaml").unlink()

    assert deployment.cli("resolve", old, "--sent")[0] == 0
    tick(monkeypatch, deployment.home, now + 2 * HOUR)
    [(_, resolved)] = alerts(deployment, "stale_unknown")
    assert resolved is not None


@pytest.mark.slow
def test_status_shows_the_last_live_run_and_the_last_backfill_apart(deployment):
    assert deployment.run([invoice()], "2026-11-05T09:00:00Z")[0] == 0
    [(live_id,)] = deployment.query("SELECT run_id FROM dunning_runs")
    day = TODAY - dt.timedelta(days=3)
    write_snapshot(deployment.home / "landing" / f"{day.isoformat()}.csv", [invoice()])
    code, _, err = deployment.cli("backfill", "--from", day.isoformat(), "--to", day.isoformat())
    assert code == 0, err
    [(backfill_id,)] = deployment.query("SELECT run_id FROM dunning_runs WHERE run_id <> ?", [live_id])
    assert backfill_id.startswith(f"backfill:{day}")

    code, out, _ = deployment.cli("status")
    assert f"last live run: {live_id[:8]} finished " in out and "(0.0 h ago)" in out
    assert f"last backfill: {backfill_id} finished" in out and "WARNING" not in out
    status = json.loads(deployment.cli("status", "--json")[1])
    assert status["last_run"]["run_id"] == status["last_live_run"]["run_id"] == live_id
    assert status["last_backfill"]["run_id"] == backfill_id
    assert status["stale_runs"] is False and status["paused"] is False and status["unknown_overdue"] == 0
    assert status["hours_since_last_live_run"] < 1

    # five hours pass for the live run only: the later backfill does not count as a live run
    con = duckdb.connect(str(deployment.home / "dunning.duckdb"))
    con.execute(
        "UPDATE dunning_runs SET finished_wall_at = finished_wall_at - INTERVAL 5 HOUR WHERE run_id = ?", [live_id]
    )
    con.close()
    code, out, _ = deployment.cli("status")
    assert "WARNING: no live run has completed for 5.0 h (alerts.stale_after_hours: 3)" in out
    status = json.loads(deployment.cli("status", "--json")[1])
    assert status["stale_runs"] is True and 4.9 < status["hours_since_last_live_run"] < 5.1


@pytest.mark.slow
def test_a_ledger_held_past_the_threshold_pages_once_without_the_ledger(tmp_path, monkeypatch):
    def held(self, timeout_seconds=None):
        raise LedgerBusy("held")

    sent = []
    monkeypatch.setattr(DunningHome, "ledger", held)
    monkeypatch.setattr(sensors, "deliver", lambda alert, settings: sent.append(alert))
    start = dt.datetime(2026, 11, 30, 9, tzinfo=dt.UTC)
    first = tick(monkeypatch, tmp_path, start)
    assert sent == [] and json.loads(first.cursor)["held_since"] == start.isoformat()
    later = tick(monkeypatch, tmp_path, start + 4 * HOUR, first.cursor)
    again = tick(monkeypatch, tmp_path, start + 5 * HOUR, later.cursor)
    assert [a.kind for a in sent] == ["stale_runs"] and "held by another process for 4.0 h" in sent[0].message
    monkeypatch.undo()
    released = tick(monkeypatch, tmp_path, start + 6 * HOUR, again.cursor)
    assert released.cursor is None


@pytest.mark.parametrize(
    "value, ok", [(3, True), (0.5, True), (0, False), (-1, False), ("3", False), (True, False), (24 * 367, False)]
)
def test_thresholds_are_strict_positive_bounded_numbers(value, ok):
    data = {"alerts": {"stale_after_hours": value, "unknown_after_hours": value}}
    if ok:
        assert parse_config(data).alerts.stale_after_hours == value
    else:
        with pytest.raises(ConfigError, match="alerts.stale_after_hours"):
            parse_config(data)
    assert Alerts().stale_after_hours == 3 and Alerts().unknown_after_hours == 24


def test_assess_alone_reports_never_and_pages_nothing(tmp_path):
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        state, actions = liveness.watch(ledger, Alerts(), dt.datetime(2026, 11, 30, tzinfo=dt.UTC))
        assert state.last_live_run is None and not state.stale_runs and state.unknown_overdue == 0
        assert actions == {"stale_runs": "clear", "stale_unknown": "clear"}
        assert ledger.frame("SELECT * FROM alerts").is_empty()
