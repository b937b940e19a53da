"""The schedule skips while paused; a failed run pages through the run-failure sensor, once."""

import datetime as dt

import dagster as dg
import pytest

from dunning.ledger.backends.duckdb_ledger import open_ledger
from pipelines.definitions import defs
from pipelines.sensors import page_on_run_failure
from resources.dunning import CycleRequest, DunningHome
from tests.conftest import invoice, write_snapshot
from tests.helpers import SCHEDULE_HOUR as HOUR
from tests.helpers import scheduled_requests


@pytest.mark.slow
def test_schedule_requests_one_keyed_run_per_hour_and_skips_while_paused(tmp_path):
    request = scheduled_requests(tmp_path)
    assert isinstance(request, dg.RunRequest)
    assert request.run_key == f"dunning-cycle-{HOUR.isoformat()}"
    assert request.partition_key == "2026-11-05"
    assert request.run_config["resources"]["cycle_request"]["config"]["as_of"] == HOUR.isoformat()
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        ledger.set_pause(True, "flood INC-9", "ops", HOUR)
    skipped = scheduled_requests(tmp_path)
    assert isinstance(skipped, dg.SkipReason) and "flood INC-9" in skipped.skip_message


def _failed_run(instance, home, snapshot, as_of="2026-11-30T09:00:00Z"):
    job = defs.resolve_job_def("dunning_cycle")
    return job.execute_in_process(
        instance=instance,
        raise_on_error=False,
        partition_key=as_of[:10],
        resources={
            "dunning_home": DunningHome(home=str(home)),
            "cycle_request": CycleRequest(snapshot_path=str(snapshot), as_of=as_of),
        },
    )


def _sense_failure(instance, result, home):
    """Evaluate the run-failure sensor on `result`'s failure, as the daemon would."""
    failure = instance.all_logs(result.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)[0].dagster_event
    context = dg.build_run_status_sensor_context(
        sensor_name="page_on_run_failure",
        dagster_event=failure,
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        resources={"dunning_home": DunningHome(home=str(home))},
    ).for_run_failure()
    page_on_run_failure(context)


@pytest.mark.slow
def test_a_failed_run_pages_once(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("DUNNING_HOME", str(home))
    with dg.instance_for_test() as instance:
        result = _failed_run(instance, home, tmp_path / "missing.csv")
        assert not result.success
        for _ in range(2):  # the daemon may evaluate a run twice: still one alert
            _sense_failure(instance, result, home)
    with open_ledger(home / "dunning.duckdb") as ledger:
        alerts = ledger.frame("SELECT kind, message, run_id FROM alerts").rows()
    assert len(alerts) == 1
    kind, message, run_id = alerts[0]
    assert kind == "run_failure" and run_id == result.run_id and "dunning_cycle" in message


@pytest.mark.slow
def test_a_breaker_trip_is_not_paged_twice(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("DUNNING_HOME", str(home))
    (home).mkdir()
    (home / "config.yaml").write_text("group_by: invoice\n")
    snapshot = write_snapshot(tmp_path / "s.csv", [invoice(invoice_id=f"i{n}") for n in range(3)])
    with dg.instance_for_test() as instance:
        result = _failed_run(instance, home, snapshot, as_of="2026-11-05T09:00:00Z")
        assert not result.success
        _sense_failure(instance, result, home)
    with open_ledger(home / "dunning.duckdb") as ledger:
        assert ledger.frame("SELECT kind FROM alerts").rows() == [("breaker",)]


def test_a_tick_without_a_landed_snapshot_or_a_source_skips_with_the_reason(tmp_path):
    skipped = scheduled_requests(tmp_path, land=False)
    assert isinstance(skipped, dg.SkipReason) and "no snapshot landed for 2026-11-05" in skipped.skip_message
    assert not (tmp_path / "dunning.duckdb").exists(), "no run, nothing opened"


def test_the_cron_comes_from_the_config_in_the_business_timezone(tmp_path):
    (tmp_path / "config.yaml").write_text("timezone: Europe/Berlin\nschedule: {cron: '30 9 * * 1-5'}\n")
    thursday_0930_berlin = dt.datetime(2026, 11, 5, 8, 30, tzinfo=dt.UTC)
    request = scheduled_requests(tmp_path, thursday_0930_berlin)
    assert isinstance(request, dg.RunRequest), request
    for not_a_tick in (dt.datetime(2026, 11, 5, 9, 30, tzinfo=dt.UTC), dt.datetime(2026, 11, 7, 8, 30, tzinfo=dt.UTC)):
        skipped = scheduled_requests(tmp_path, not_a_tick)
        assert isinstance(skipped, dg.SkipReason) and "not a tick of schedule.cron" in skipped.skip_message


@pytest.mark.parametrize("cron", ["61 * * * *", "0 * * *", "every hour"])
def test_a_bad_cron_is_a_config_error_naming_the_key(cron):
    from dunning.config import parse_config
    from dunning.errors import ConfigError

    with pytest.raises(ConfigError, match="schedule.cron"):
        parse_config({"schedule": {"cron": cron}})
