"""The Dagster instance the CLI writes (`pipelines.instance`): one kept SQLite connection per database file rather
than a new engine per write, an earlier release's dagster.yaml upgraded, run files found through their WAL."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import subprocess
import time

import dagster as dg
import pytest
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext

from assets.common import LEDGER_POOL
from pipelines import instance as instance_module
from tests.conftest import invoice
from tests.helpers import DUNNING, proc_stat


def _count_sqlite_connects(monkeypatch) -> list[str]:
    opened: list[str] = []
    real = sqlite3.connect

    def counting(database, *args, **kwargs):
        opened.append(str(database))
        return real(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", counting)
    monkeypatch.setattr(sqlite3.dbapi2, "connect", counting)
    return opened


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_run_writes_its_events_through_a_few_kept_sqlite_connections(deployment, monkeypatch):
    code, _, err = deployment.run([invoice()], "2026-11-05T09:00:00Z", "--dry-run")  # the instance is created
    assert code == 0, err
    opened = _count_sqlite_connects(monkeypatch)
    code, _, err = deployment.run([invoice()], "2026-11-06T09:00:00Z", "--dry-run")
    assert code == 0, err
    connections = len(opened)
    instance = dg.DagsterInstance.from_config(str(deployment.home / "dagster"))
    events = len(instance.all_logs(instance.get_run_records(limit=1)[0].dagster_run.run_id))
    assert events > 50
    # Dagster's own SQLite storage opens a connection for every write (about 6 per event); the kept engines open
    # one per file (runs, schedules, the event index, the run's own file) and a few more for the storage's setup
    assert connections <= 20, f"{connections} SQLite connections for a run of {events} events"


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_the_instance_is_dunnings_and_keeps_its_records_readable_by_dagsters_own(deployment):
    code, _, err = deployment.run([invoice()], "2026-11-05T09:00:00Z", "--dry-run")
    assert code == 0, err
    kept = instance_module.get_instance(deployment.home)
    try:
        assert isinstance(kept, instance_module.DunningInstance)
        assert isinstance(kept.event_log_storage, instance_module.KeptEventLogStorage)
        run_id = kept.get_run_records(limit=1)[0].dagster_run.run_id
        # Dagster's plain SQLite storage (what `dagster dev` would use without our class) reads the same files
        plain = dg.DagsterInstance.local_temp(str(deployment.home / "dagster"))
        assert plain.get_run_by_id(run_id).status == dg.DagsterRunStatus.SUCCESS
        assert len(plain.all_logs(run_id)) == len(kept.all_logs(run_id))
        # retention deletes a run's events and its file: no kept connection stays on it
        kept.delete_run(run_id)
        assert kept.get_run_by_id(run_id) is None
        assert run_id not in kept.event_log_storage._engines
    finally:
        kept.dispose()


def test_an_earlier_releases_dagster_yaml_is_upgraded_and_an_edited_one_kept(tmp_path):
    home = tmp_path / "home"
    directory = instance_module.dagster_home(home)
    directory.mkdir(parents=True)
    (directory / "dagster.yaml").write_text(instance_module.EARLIER_DAGSTER_YAML)
    instance = instance_module.get_instance(home)
    instance.dispose()
    assert (directory / "dagster.yaml").read_text() == instance_module.DAGSTER_YAML
    assert isinstance(instance, instance_module.DunningInstance)

    edited = tmp_path / "edited"
    directory = instance_module.dagster_home(edited)
    directory.mkdir(parents=True)
    mine = instance_module.EARLIER_DAGSTER_YAML.replace("enabled: false", "enabled: false  # mine", 1)
    (directory / "dagster.yaml").write_text(mine)
    instance = instance_module.get_instance(edited)
    instance.dispose()
    assert (directory / "dagster.yaml").read_text() == mine, "an operator's own dagster.yaml is never rewritten"
    assert not isinstance(instance, instance_module.DunningInstance)


def test_a_run_whose_events_are_still_in_the_wal_is_found_by_its_files(tmp_path):
    runs = instance_module.dagster_home(tmp_path) / "history" / "runs"
    runs.mkdir(parents=True)
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    run_id = "0b1c2d3e-0000-4000-8000-000000000001"
    con = sqlite3.connect(runs / f"{run_id}.db")
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    old = since.timestamp() - 60  # the main file last written before the command started; its log since
    os.utime(runs / f"{run_id}.db", (old, old))
    con.execute("INSERT INTO t VALUES (1)")
    con.commit()
    assert instance_module.runs_written_since(tmp_path, since) == [run_id]
    con.close()
    (runs / "index.db").write_text("")
    assert instance_module.runs_written_since(tmp_path, since) == [run_id]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_dagsters_alembic_scripts_are_read_once_per_process(deployment, monkeypatch):
    """Every storage's start and every run's new event file asked alembic for the head revision, and alembic read
    its ~110 revision modules each time (0.16 CPU-s a time, five a run); the scripts do not change in a process."""
    from alembic.script import ScriptDirectory

    reads: list[str] = []
    real = ScriptDirectory._load_revisions

    def counting(self):
        reads.append(self.dir)
        return real(self)

    monkeypatch.setattr(ScriptDirectory, "_load_revisions", counting)
    monkeypatch.setattr(instance_module.KeptScriptDirectory, "_kept", {})
    for day in ("05", "06"):  # a new instance (three storages), then a second run: a new event file, stamped
        code, _, err = deployment.run([invoice()], f"2026-11-{day}T09:00:00Z", "--dry-run")
        assert code == 0, err
    assert len(reads) == 1, reads


def test_a_steps_output_is_captured_to_the_uis_files_without_a_tail_process(tmp_path, monkeypatch):
    """The instance's compute log manager writes a step's stdout and stderr (at the file descriptors, so a C
    library's output too) to the files the UI reads, and starts no process to mirror them (Dagster's starts a
    `tail -F` and a Python watcher per stream)."""
    import subprocess
    import sys

    instance = instance_module.get_instance(tmp_path / "home")
    try:
        manager = instance.compute_log_manager
        assert isinstance(manager, instance_module.FileComputeLogManager)

        def no_process(*args, **kwargs):
            raise AssertionError(f"a process was started to capture a step's output: {args}")

        monkeypatch.setattr(subprocess, "Popen", no_process)
        log_key = ["a-run-id", "compute_logs", "step"]
        with manager.capture_logs(log_key):
            os.write(sys.stdout.fileno(), b"to stdout\n")
            print("to stderr", file=sys.stderr, flush=True)
        assert manager.is_capture_complete(log_key)
        captured = manager.get_log_data(log_key)
        assert captured.stdout == b"to stdout\n" and captured.stderr == b"to stderr\n"
    finally:
        instance.dispose()


def test_a_schema_probe_that_answered_yes_is_not_asked_again_and_a_no_always_is(tmp_path):
    """Dagster asks before each event and run update whether a column, table or finished data migration is there
    (`PRAGMA table_xinfo`, the secondary-index table): once yes, the kept storages answer from memory; a no is
    asked of the database every time, so a migration made meanwhile is seen."""
    import sqlalchemy

    instance = instance_module.get_instance(tmp_path / "home")
    statements: list[str] = []

    def record(conn, cursor, statement, *args):
        statements.append(statement)

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", record)
    try:
        events, runs = instance.event_log_storage, instance.run_storage
        probes = (events.has_asset_key_index_cols, runs.has_run_stats_index_cols, runs.has_backfill_id_column)
        assert all(probe() for probe in probes)  # asked (unless the instance's start asked already)
        statements.clear()
        assert all(probe() for probe in probes) and events.has_asset_key_col("last_materialization_timestamp")
        assert statements == [], "answered from memory"
        assert not events.has_asset_key_col("a column Dagster never made")
        assert len([s for s in statements if "table_xinfo" in s]) == 1, "a no is asked of the database"
        statements.clear()
        assert not events.has_secondary_index("a migration never made")
        assert not events.has_secondary_index("a migration never made")
        assert len([s for s in statements if "secondary_indexes" in s]) == 2, "a no is asked again"
        events.enable_secondary_index("a migration now made")
        statements.clear()
        assert events.has_secondary_index("a migration now made") and events.has_secondary_index("a migration now made")
        assert len([s for s in statements if "secondary_indexes" in s]) == 1
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "before_cursor_execute", record)
        instance.dispose()


def test_a_run_with_its_step_logs_asked_for_mirrors_its_output_as_dagsters_manager_does(tmp_path, monkeypatch):
    """`dunning run -v` shows Dagster's step logs while the run goes: inside `mirrored_to_terminal(True)` the
    capture is Dagster's own (its `tail -F` copies the file to the terminal); outside it, no process is started."""
    import subprocess
    import sys

    from pipelines.instance.compute_logs import mirrored_to_terminal

    instance = instance_module.get_instance(tmp_path / "home")
    started: list[str] = []
    real = subprocess.Popen

    def recording(args, *rest, **kwargs):
        started.append(str(args[0]))
        return real(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording)
    try:
        manager = instance.compute_log_manager
        with mirrored_to_terminal(False), manager.capture_logs(["run-1", "compute_logs", "quiet"]):
            print("quiet", file=sys.stderr, flush=True)
        assert started == []
        with mirrored_to_terminal(True), manager.capture_logs(["run-2", "compute_logs", "watched"]):
            print("watched", file=sys.stderr, flush=True)
        assert "tail" in started, "Dagster's mirror"
        assert manager.get_log_data(["run-2", "compute_logs", "watched"]).stderr == b"watched\n"
        with manager.capture_logs(["run-3", "compute_logs", "after"]):
            pass
        assert started.count("tail") == 2, "one tail per stream, and none once the block ended"
    finally:
        instance.dispose()


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU of a live process, from /proc."""
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
def test_a_run_waiting_for_the_ledger_pool_slot_sleeps_instead_of_spinning(deployment):
    """Dagster's in-process executor never slept while a step waited for a pool slot (`pipelines.instance.pool_wait`):
    a shard waiting behind another burned a core for as long as it waited."""
    code, _, err = deployment.run([invoice()], "2026-11-05T09:00:00Z")  # the home, its instance and its pool
    assert code == 0, err
    instance = instance_module.get_instance(deployment.home)
    storage = instance.event_log_storage
    assert storage.claim_concurrency_slot(LEDGER_POOL, "another-run", "its_step").is_claimed
    process = subprocess.Popen(
        [DUNNING, "--home", str(deployment.home), "run", "--snapshot", str(deployment.snapshot([invoice()])),
         "--as-of", "2026-11-06T09:00:00Z"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not storage.get_concurrency_info(LEDGER_POOL).pending_step_count:
            assert time.monotonic() < deadline and process.poll() is None, "the run never waited for the slot"
            time.sleep(0.05)
        before = _cpu_seconds(process.pid)
        time.sleep(1.5)  # the window observed: the run waits the whole of it (the slot is still held)
        spent = _cpu_seconds(process.pid) - before
        storage.free_concurrency_slots_for_run("another-run")
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        instance.dispose()
    assert process.returncode == 0, err
    assert "dunning cycle" in out
    assert spent < 0.4, f"a run waiting 1.5 s for its pool slot used {spent:.2f} CPU-s (spinning uses about 1.5)"


def test_the_wait_for_a_pool_slot_is_the_time_to_the_next_claim_check(tmp_path):
    """A real claim refused by a real SQLite instance: the step's next check is a second away, and the executor
    may sleep until then (Dagster's own answer was 0, always)."""
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        instance.event_log_storage.set_concurrency_slots("a_pool", 1)
        assert instance.event_log_storage.claim_concurrency_slot("a_pool", "another-run", "its_step").is_claimed
        run = instance.create_run_for_job(dg.GraphDefinition(name="nothing").to_job())
        with InstanceConcurrencyContext(instance, run) as context:
            assert context.interval_to_next_pending_claim_check() == 0.0, "nothing pending: nothing to wait for"
            assert not context.claim("a_pool", "the_step")
            assert context.has_pending_claims()
            assert 0.5 < context.interval_to_next_pending_claim_check() <= 1.0
