"""The Dagster instance under the deployment's home, so every CLI run shows in the UI.

A brand-new SQLite instance migrates its storage on first use; two processes
doing that at once can crash ("alembic_version has more than one head"), so
the first use happens under an exclusive file lock.

The instance limits the `dunning_ledger` pool to one step at a time, or to
`shards` steps (the config's `shards:`, set by the CLI through
`set_pool_slots`, the call behind `dagster instance concurrency set`) so that
N shards of one day can work at once. Runs of the same shard (run tag
`dunning/shard`) queue one at a time instead of racing: the run queue's
per-value tag limit below, applied by the instance's QueuedRunCoordinator (the
default coordinator) to every run the daemon launches (schedule, UI). A run
whose process was killed keeps its pool slot until something marks it ended;
under `dagster dev` the daemon's run monitoring does that
(`free_slots_after_run_end_seconds`), but the CLI runs without a daemon, so it
reaps its own dead runs first: runs it started (tagged with host and pid)
whose process no longer exists are marked failed and their slots freed.

The instance is a `DunningInstance` (`instance_class:` in the dagster.yaml written here): Dagster's own SQLite
storage, with one connection kept per database file rather than a new SQLAlchemy engine and connection for each
write (a run's 80 events were 500 connections, a second of a run), and commits in WAL mode with
`synchronous=NORMAL`: Dagster's records of runs stay consistent on a crash, and only the last events before a power
loss could be lost (the ledger, DuckDB, is what records sends; a run whose end was lost is reaped as below). An
instance on PostgreSQL (`storage: postgres:`, `deploy/dagster.yaml`) is used as configured.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import socket
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import dagster as dg
import sqlalchemy
import yaml
from alembic import command as alembic_command
from alembic.config import Config
from alembic.script import ScriptDirectory
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage import sql as dagster_sql
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME, SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.sqlite_storage import (
    DagsterSqliteStorage,
    _event_logs_directory,
    _runs_directory,
    _schedule_directory,
)
from dagster._serdes import ConfigurableClassData

KEPT_ENGINES = 8  # database files of one event log whose connection stays open: the index and the latest runs'


class KeptScriptDirectory(ScriptDirectory):
    """Dagster's alembic scripts read once per process: each SQLite storage's start and each new run's event file
    asks for the head revision (and a new file is stamped with it), and alembic reads every revision file (about
    110 Python modules) each time it is asked: 0.16 CPU-s a time, four or five times a run. The scripts do not
    change while the process runs."""

    _kept: ClassVar[dict[tuple[str | None, str], ScriptDirectory]] = {}
    _kept_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def from_config(cls, config: Config) -> ScriptDirectory:
        # the run, event and schedule storages each have an alembic.ini, the same text, for the one script location
        ini = config.config_file_name
        key = (config.get_main_option("script_location"), Path(ini).read_text() if ini else "")
        with cls._kept_lock:
            if key not in cls._kept:
                cls._kept[key] = ScriptDirectory.from_config(config)
            return cls._kept[key]


# where Dagster's storages (`check_alembic_revision`) and alembic's commands (`stamp`, `upgrade`) look it up
dagster_sql.ScriptDirectory = KeptScriptDirectory  # type: ignore[misc]
alembic_command.ScriptDirectory = KeptScriptDirectory  # type: ignore[misc]


def _engine(url: str) -> sqlalchemy.engine.Engine:
    """One SQLite file's engine: a connection kept open and reused, commits in WAL mode with synchronous=NORMAL."""
    # one connection kept; more at once (the webserver's threads) each get their own, closed when returned
    engine = sqlalchemy.create_engine(
        url, pool_size=1, max_overflow=-1, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS}
    )

    @sqlalchemy.event.listens_for(engine, "connect")
    def _on_connect(connection: Any, _record: Any) -> None:
        connection.execute("PRAGMA synchronous=NORMAL")

    return engine


class _KeptEngine:
    """`connect()` through one engine for the storage's life (Dagster's SQLite storages make one per call)."""

    _conn_string: str
    _kept: sqlalchemy.engine.Engine | None = None
    _kept_lock = threading.Lock()

    @contextlib.contextmanager
    def connect(self) -> Iterator[sqlalchemy.Connection]:
        with self._kept_lock:
            if self._kept is None:
                self._kept = _engine(self._conn_string)
        with self._kept.connect() as connection, connection.begin():
            yield connection

    def dispose(self) -> None:
        if self._kept is not None:
            self._kept.dispose()
            self._kept = None
        super().dispose()  # type: ignore[misc]


class KeptRunStorage(_KeptEngine, SqliteRunStorage):
    pass


class KeptScheduleStorage(_KeptEngine, SqliteScheduleStorage):
    pass


class KeptEventLogStorage(SqliteEventLogStorage):
    """The event log (a SQLite file per run plus an index) with the engines of its latest files kept open."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._engines: OrderedDict[str, sqlalchemy.engine.Engine] = OrderedDict()
        self._tables_present: set[str] = set()
        self._index_for_tables: sqlalchemy.engine.Engine | None = None
        self._tables_lock = threading.Lock()
        super().__init__(base_dir, inst_data)

    def has_table(self, table_name: str) -> bool:
        """Dagster asks before every materialization and check (a new engine each time); a table, once there,
        stays. Its own engine, not `_connect`'s: it is asked while an index connection is open."""
        if table_name in self._tables_present:
            return True
        with self._tables_lock:  # not `_db_lock`: that one is held by the index connection open around this
            if self._index_for_tables is None:
                self._index_for_tables = _engine(self.conn_string_for_shard(INDEX_SHARD_NAME))
            engine = self._index_for_tables
        with engine.connect() as connection:
            present = bool(engine.dialect.has_table(connection, table_name))
        if present:
            self._tables_present.add(table_name)
        return present

    @contextlib.contextmanager
    def _connect(self, shard: str) -> Iterator[sqlalchemy.Connection]:
        with self._db_lock:  # as Dagster's: one connection of this storage at a time
            engine = self._engines.pop(shard, None)
            if engine is None:
                engine = _engine(self.conn_string_for_shard(shard))
                if shard not in self._initialized_dbs:
                    self._initdb(engine)
                    self._initialized_dbs.add(shard)
            self._engines[shard] = engine
            while len(self._engines) > KEPT_ENGINES:
                self._engines.popitem(last=False)[1].dispose()
            with engine.connect() as connection, connection.begin():
                yield connection

    def delete_events(self, run_id: str) -> None:
        super().delete_events(run_id)
        with self._db_lock:  # the run's file is deleted next (`assets.retention`): no connection kept to it
            engine = self._engines.pop(run_id, None)
        if engine is not None:
            engine.dispose()

    def dispose(self) -> None:
        with self._db_lock:
            while self._engines:
                self._engines.popitem()[1].dispose()
        with self._tables_lock:
            if self._index_for_tables is not None:
                self._index_for_tables.dispose()
                self._index_for_tables = None
        super().dispose()


class KeptSqliteStorage(DagsterSqliteStorage):
    """Dagster's default storage under the instance's directory, through the storages above."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self.base_dir = base_dir
        self._run_storage = KeptRunStorage.from_local(_runs_directory(base_dir))
        self._event_log_storage = KeptEventLogStorage(_event_logs_directory(base_dir))
        self._schedule_storage = KeptScheduleStorage.from_local(_schedule_directory(base_dir))
        self._inst_data = inst_data
        super(DagsterSqliteStorage, self).__init__()

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> KeptSqliteStorage:
        return cls.from_local(inst_data=inst_data, **config_value)


class DunningInstance(dg.DagsterInstance):
    """The instance the CLI's dagster.yaml names: Dagster's, with `KeptSqliteStorage` when no `storage:` is set."""

    @classmethod
    def config_schema(cls) -> dict:
        return {}

    @staticmethod
    def config_defaults(base_dir: str) -> Mapping[str, ConfigurableClassData | None]:
        defaults = dict(InstanceRef.config_defaults(base_dir))
        defaults["storage"] = ConfigurableClassData(
            __name__, KeptSqliteStorage.__name__, yaml.dump({"base_dir": base_dir}, default_flow_style=False)
        )
        return defaults


DAGSTER_YAML = """\
# Written by `dunning` on first use. See README "Running it for real" for production settings.
instance_class:
  module: pipelines.instance
  class: DunningInstance
telemetry:
  enabled: false
nux:
  enabled: false
run_monitoring:
  enabled: true
  free_slots_after_run_end_seconds: 300
concurrency:
  pools:
    default_limit: 1
  runs:
    tag_concurrency_limits:
      - key: dunning/shard
        value:
          applyLimitPerUniqueValue: true
        limit: 1
"""


# what earlier releases wrote: replaced by DAGSTER_YAML when found unchanged
EARLIER_DAGSTER_YAML = DAGSTER_YAML.replace(
    "instance_class:\n  module: pipelines.instance\n  class: DunningInstance\n", ""
)


PID_TAG, HOST_TAG = "dunning/pid", "dunning/host"
LIVE_STATUSES = (
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.QUEUED,
)


def owner_tags() -> dict[str, str]:
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark runs started by a dead `dunning` process on this host as failed, freeing their pool slots."""
    reaped = []
    host = socket.gethostname()
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=list(LIVE_STATUSES), tags={HOST_TAG: host})):
        pid = run.tags.get(PID_TAG)
        if pid and pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
            instance.report_run_failed(
                run,
                f"the dunning process {pid} on {host} ended without finishing this run "
                f"(killed, or it could not record the end: see its last step's log)",
            )
            instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
            reaped.append(run.run_id)
    return reaped


def last_own_run(
    instance: dg.DagsterInstance, since: dt.datetime | None = None
) -> tuple[dg.DagsterRun, str | None] | None:
    """The newest run this process started (after `since`) and the step it was in, if it stopped inside one.

    Best effort, for naming them in an error: the instance's storage may be what
    failed (a full disk), so any error reading it gives None, or no step."""
    try:
        runs = instance.get_runs(filters=dg.RunsFilter(tags=owner_tags(), created_after=since), limit=1)
    except Exception:  # noqa: BLE001 - the storage we are reporting on may be unreadable
        return None
    if not runs:
        return None
    open_steps: dict[str, None] = {}
    try:
        for record in instance.all_logs(runs[0].run_id):  # in-process executor: one step at a time
            event = record.dagster_event
            if event is None or not event.step_key:
                continue
            if event.is_step_start:
                open_steps[event.step_key] = None
            elif event.is_step_success or event.is_step_failure or event.is_step_skipped:
                open_steps.pop(event.step_key, None)
    except Exception:  # noqa: BLE001
        open_steps.clear()
    return runs[0], next(reversed(open_steps), None)


def runs_written_since(home: Path, since: dt.datetime) -> list[str]:
    """Ids of the runs whose own event log file (Dagster's SQLite layout: HOME/dagster/history/runs/<run id>.db,
    or its write-ahead log `.db-wal`, where a kept connection's commits stay until a checkpoint) was written since
    `since`. Names a run when its storage can no longer be read at all (on a full disk SQLite cannot even map its
    WAL index, so reads fail too)."""
    try:
        written = {
            f.name.split(".db", 1)[0]
            for f in (dagster_home(home) / "history" / "runs").glob("*-*-*-*-*.db*")
            if f.name.endswith((".db", ".db-wal")) and f.stat().st_mtime >= since.timestamp()
        }
    except OSError:
        return []
    return sorted(written)


def end_run_failed(instance: dg.DagsterInstance, run: dg.DagsterRun, message: str) -> bool:
    """Mark this process's unfinished run failed with `message` and free its pool slots (best effort: the
    storage may refuse this too; then the next CLI reaps it); False when it could not."""
    if run.status not in LIVE_STATUSES:
        return False
    try:
        instance.report_run_failed(run, message)
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
    except Exception:  # noqa: BLE001
        return False
    return True


def set_pool_slots(instance: dg.DagsterInstance, pool: str, slots: int) -> None:
    """Give `pool` exactly `slots` slots on this instance (what `dagster instance concurrency set` does), only
    when it differs: an explicit limit overrides `default_limit`, so it is set every time, to 1 as well."""
    storage = instance.event_log_storage
    if storage.get_concurrency_info(pool).slot_count != slots:
        storage.set_concurrency_slots(pool, slots)


def dagster_home(home: Path) -> Path:
    return home / "dagster"


def get_instance(home: Path) -> dg.DagsterInstance:
    """The instance at HOME/dagster, created and migrated once, under a lock."""
    directory = dagster_home(home)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".init.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        config = directory / "dagster.yaml"
        if not config.exists() or config.read_text() == EARLIER_DAGSTER_YAML:
            config.write_text(DAGSTER_YAML)
        os.environ["DAGSTER_HOME"] = str(directory)
        instance = dg.DagsterInstance.get()
        instance.get_runs(limit=1)  # forces storage creation/migration while we hold the lock
        reap_dead_runs(instance)
    return instance
