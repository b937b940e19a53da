"""`dunning --version` and `dunning --help` answer without loading what only a run needs (issue 36: 0.3 s at
most; importing Dagster alone takes over a second). Each command imports what it needs when it runs, so these two
must import neither Dagster, polars, pandera nor DuckDB: checked in a fresh interpreter, since this one has them."""

import json
import subprocess
import sys

import pytest

from tests.conftest import invoice

HEAVY = ("dagster", "polars", "pandera", "duckdb", "pyarrow", "jinja2", "requests", "stripe")

PROBE = """
import json, sys
from pipelines import cli
try:
    code = cli.main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
print(json.dumps({"code": code, "modules": sorted({m.split('.')[0] for m in sys.modules})}), file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["run", "--help"], ["status", "--help"]])
def test_version_and_help_import_nothing_heavy(argv):
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60)
    probe = json.loads(done.stderr.strip().splitlines()[-1])
    assert probe["code"] in (0, None)
    assert done.stdout.strip(), "it printed its answer"
    assert sorted(set(HEAVY) & set(probe["modules"])) == []


def _packages_loaded_by(modules: str, packages: set[str]) -> list[str]:
    """Which of `packages` a fresh interpreter has loaded after `import {modules}` (this one has them all)."""
    probe = f"import json, sys, {modules}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return sorted(set(json.loads(done.stdout)) & packages)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_the_pipelines_definitions_leave_pandera_and_requests_to_the_steps_that_use_them():
    """A run's process imports the Definitions before anything else, an hour with nothing new and every shard
    included: pandera (a fifth of a second) is imported by the snapshot's validation and the breaker only, requests
    (0.1 s) by the code that posts (a webhook, the Resend provider, a Recurly pull)."""
    assert _packages_loaded_by("pipelines.definitions, pipelines.cli.cycle", {"pandera", "requests", "urllib3"}) == []


def test_a_render_worker_imports_neither_polars_nor_the_pydantic_config():
    """A render worker (`dunning.send.render_pool`, spawned per run for a large batch) imports its module only: no
    polars and no pydantic config (0.2 s of each worker's start, paid twice per shard run), until an email states
    a fee or lists invoice lines."""
    assert _packages_loaded_by("dunning.send.render_pool", {"polars", "pydantic", "duckdb", "dagster"}) == []


IDLE_PROBE = """
import json, sys
from pipelines import cli
code = cli.main(sys.argv[1:])
heavy = sorted({m.split('.')[0] for m in sys.modules} & {"pandera", "pyarrow", "requests", "urllib3"})
print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
"""


@pytest.mark.slow
def test_an_hour_with_nothing_new_imports_neither_pandera_pyarrow_nor_requests(deployment):
    """The hourly no-op hashes the snapshot and reads one row of the ledger: it validates nothing (pandera), makes
    no frame of DuckDB's (pyarrow, at the first one) and posts nothing (requests), 0.4 s between them."""
    snapshot = deployment.snapshot([invoice()])
    assert deployment.cli("run", "--snapshot", str(snapshot), "--as-of", "2026-11-05T09:00:00Z")[0] == 0
    argv = ["--home", str(deployment.home), "run", "--snapshot", str(snapshot), "--as-of", "2026-11-05T10:00:00Z"]
    idle = subprocess.run([sys.executable, "-c", IDLE_PROBE, *argv], capture_output=True, text=True, timeout=300)
    assert "nothing changed since run" in idle.stdout, idle.stdout + idle.stderr[-2000:]
    assert json.loads(idle.stderr.strip().splitlines()[-1]) == {"code": 0, "heavy": []}


def test_commands_parsed_one_after_another_in_one_process_keep_nothing_of_each_other():
    """`main` builds the parser once per process (`pipelines.cli._parser`): no option of one command may leak into
    the next."""
    from pipelines import cli

    first = cli._parser().parse_args(["run", "--dry-run", "--snapshot", "a.csv", "--home", "h"])
    second = cli._parser().parse_args(["run", "--snapshot", "b.csv"])
    assert (first.dry_run, first.home_sub, first.snapshot) == (True, "h", "a.csv")
    assert (second.dry_run, second.home_sub, second.snapshot) == (False, None, "b.csv")
    asked = (("--sent", ["k1", "k2"]), ("--not-sent", ["k3"]))
    resolved = [cli._parser().parse_args(["resolve", flag, *keys]) for flag, keys in asked]
    assert [(r.keys, r.sent) for r in resolved] == [(["k1", "k2"], True), (["k3"], False)]
    assert cli._parser() is cli._parser()
