"""The SQLite storage of the instance the CLI writes: Dagster's own, with its connections kept.

The instance is a `DunningInstance` (`instance_class:` in the dagster.yaml `pipelines.instance` writes):
Dagster's own SQLite storage, with one connection kept per database file rather than a new SQLAlchemy engine and
connection for each write (a run's 84 events were 512 connections, about a second of a run; 13 now), and commits
in WAL mode with `synchronous=NORMAL`: Dagster's records of runs stay consistent on a crash, and only the last
events before a power loss could be lost (the ledger, DuckDB, is what records sends; a run whose end was lost is
reaped, `pipelines.instance.reap_dead_runs`). Dagster's alembic scripts are read once per process
(`KeptScriptDirectory`), and its schema probes, once answered yes, are not asked again (`_kept_once_true`). Steps'
stdout and stderr go to the UI's files without Dagster's mirroring processes (`FileComputeLogManager`). An instance
on PostgreSQL (`storage: postgres:`, `deploy/dagster.yaml`) is used as configured.

Imported by `pipelines.instance` only (its dagster.yaml names `pipelines.instance.DunningInstance`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
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

from pipelines.instance.compute_logs import FileComputeLogManager

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


def _kept_once_true(method: Callable[..., bool]) -> Callable[..., bool]:
    """A schema probe of Dagster's storage (is this column, table or finished data migration there?) answered from
    memory once it has answered yes: a schema only grows (`dagster instance migrate` adds, nothing at run time
    removes), and Dagster asks again before each event and run update (42 of a run's 427 statements were
    `PRAGMA table_xinfo`, 13 more the secondary-index check). A "no" is asked again every time, as Dagster does."""

    @functools.wraps(method)
    def probe(self: Any, *args: Any) -> bool:
        key = (method.__name__, *(a for a in args if isinstance(a, str)))
        kept: set = self.__dict__.setdefault("_schema_seen", set())
        if key in kept:
            return True
        answer = method(self, *args)
        if answer:
            kept.add(key)
        return answer

    return probe


class KeptRunStorage(_KeptEngine, SqliteRunStorage):
    has_run_stats_index_cols = _kept_once_true(SqliteRunStorage.has_run_stats_index_cols)
    has_bulk_actions_selector_cols = _kept_once_true(SqliteRunStorage.has_bulk_actions_selector_cols)
    has_backfill_id_column = _kept_once_true(SqliteRunStorage.has_backfill_id_column)
    has_bulk_action_job_name_column = _kept_once_true(SqliteRunStorage.has_bulk_action_job_name_column)
    has_backfill_tags_table = _kept_once_true(SqliteRunStorage.has_backfill_tags_table)


class KeptScheduleStorage(_KeptEngine, SqliteScheduleStorage):
    pass


class KeptEventLogStorage(SqliteEventLogStorage):
    """The event log (a SQLite file per run plus an index) with the engines of its latest files kept open."""

    has_asset_key_col = _kept_once_true(SqliteEventLogStorage.has_asset_key_col)
    _has_asset_key_col_on_connection = _kept_once_true(SqliteEventLogStorage._has_asset_key_col_on_connection)
    has_secondary_index = _kept_once_true(SqliteEventLogStorage.has_secondary_index)

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._engines: OrderedDict[str, sqlalchemy.engine.Engine] = OrderedDict()
        self._index_for_tables: sqlalchemy.engine.Engine | None = None
        self._tables_lock = threading.Lock()
        super().__init__(base_dir, inst_data)

    @_kept_once_true
    def has_table(self, table_name: str) -> bool:
        """Dagster asks before every materialization and check (a new engine each time); a table, once there,
        stays. Its own engine, not `_connect`'s: it is asked while an index connection is open."""
        with self._tables_lock:  # not `_db_lock`: that one is held by the index connection open around this
            if self._index_for_tables is None:
                self._index_for_tables = _engine(self.conn_string_for_shard(INDEX_SHARD_NAME))
            engine = self._index_for_tables
        with engine.connect() as connection:
            return bool(engine.dialect.has_table(connection, table_name))

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
        defaults["compute_logs"] = ConfigurableClassData(
            FileComputeLogManager.__module__, FileComputeLogManager.__name__, defaults["compute_logs"].config_yaml
        )
        return defaults
