"""A real, throwaway PostgreSQL server for the tests: Debian's `postgresql` binaries, one cluster per test session.

`initdb` and `pg_ctl` from `/usr/lib/postgresql/*/bin` (or the PATH) start a
cluster in a temporary directory, on a free loopback port, with `trust`
authentication (nothing leaves 127.0.0.1). PostgreSQL refuses to run as
root, so as root the cluster belongs to the `postgres` system user (`runuser`).
Each test gets its own database (`fresh_database`), so tests never share
state. Tests that need the server are skipped, with the reason, only when no
server binary can be found.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg

SUPERUSER = "postgres"


def server_bin_dir() -> Path | None:
    """The directory holding `initdb`, `pg_ctl` and `postgres`, newest major version first."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    for directory in candidates:
        if (Path(directory) / "initdb").exists() and (Path(directory) / "pg_ctl").exists():
            return Path(directory)
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).parent
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PostgresCluster:
    bin_dir: Path
    root: Path
    port: int

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def fresh_database(self, prefix: str = "t") -> str:
        """A new empty database; returns its DSN."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn(), autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, user="postgres", group="postgres")
        init = self._run("initdb", "-D", str(self.data_dir), "--auth=trust", f"--username={SUPERUSER}", "-E", "UTF8")
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr.strip()}")
        options = f"-k {self.root} -p {self.port} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on"
        log = str(self.root / "server.log")
        started = self._run("pg_ctl", "-w", "-D", str(self.data_dir), "-l", log, "-o", options, "start")
        if started.returncode != 0:
            log = (self.root / "server.log").read_text() if (self.root / "server.log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {started.stderr.strip()} {log[-2000:]}")

    def halt(self) -> None:
        """The server stopped at once, as a crash would (`-m immediate`: no shutdown checkpoint); data kept."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "stop")

    def resume(self) -> None:
        """The halted server started again on its data (it recovers from its WAL)."""
        options = f"-k {self.root} -p {self.port} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on"
        started = self._run("pg_ctl", "-w", "-D", str(self.data_dir), "-l", str(self.root / "server.log"), "-o",
                            options, "start")  # fmt: skip
        if started.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {started.stderr.strip()}")

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> PostgresCluster | None:
    """A started cluster, or None when this machine has no PostgreSQL server binaries."""
    bin_dir = server_bin_dir()
    if bin_dir is None:
        return None
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix="dunning-pg-", dir=base))
    os.chmod(root, 0o755)
    cluster = PostgresCluster(bin_dir, root, _free_port())
    cluster.start()
    return cluster
