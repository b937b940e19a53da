"""Ingest once, shards read their part: `dunning ingest` validates once and stores one part per shard (a directory, or
S3 through moto's server on 127.0.0.1, the boundary fake of the S3 wire protocol); `dunning run --shard K/N` reads
only its part; a missing or stale ingest is exit 2 naming it; shards and ingests racing still send each key once."""

from __future__ import annotations

import json
import socket

import pytest

from dunning.ingest.store import SnapshotStore
from tests.conftest import invoice

AS_OF = "2026-11-04T09:00:00Z"


def customers(n: int) -> list[dict]:
    return [invoice(invoice_id=f"in_{i}", customer_id=f"cus_{i}", customer_email=f"c{i}@example.com") for i in range(n)]


def config(tmp_path, shards: int = 2, extra: str = "") -> str:
    path = tmp_path / "config.yaml"
    path.write_text(f"shards: {shards}\n{extra}")
    return str(path)


def status_json(deployment) -> dict:
    code, out, err = deployment.cli("status", "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_one_ingest_then_each_shard_reads_only_its_part_and_together_they_send_what_one_run_sends(deployment, tmp_path):
    rows = customers(12) + [invoice(invoice_id="bad", amount_due="12.50")]
    cfg = config(tmp_path)
    code, out, err = deployment.cli("ingest", "--snapshot", str(deployment.snapshot(rows)), "--as-of", AS_OF,
                                    "--config", cfg)  # fmt: skip
    assert code == 0, err
    assert "12 rows accepted, 1 rejected" in out and "2 parts" in out
    assert deployment.query("SELECT count(*) FROM snapshot_quarantine") == [(1,)], "quarantined once, by the ingest"
    read = []
    for shard in ("0/2", "1/2"):
        code, out, err = deployment.cli("run", "--shard", shard, "--as-of", AS_OF, "--config", cfg)
        assert code == 0, err
        read.append(status_json(deployment)["last_run"]["rows_read"])
    assert sum(read) == 12 and all(0 < n < 12 for n in read), "each shard read its part, not the whole snapshot"
    assert deployment.query("SELECT count(*) FROM snapshot_quarantine") == [(1,)], "no shard quarantined it again"
    sent = sorted(k for m in deployment.outbox() for k in m["X-Dunning-Keys"].split(","))
    assert sent == sorted(f"dunning:in_{i}:1:day3" for i in range(12)), "each key once, across the shards"


def test_a_shard_without_an_ingest_for_its_hour_is_exit_2_naming_it(deployment, tmp_path):
    cfg = config(tmp_path)
    code, _, err = deployment.cli("run", "--shard", "0/2", "--as-of", AS_OF, "--config", cfg)
    assert code == 2 and "no ingest of 2 parts" in err and "run `dunning ingest`" in err
    deployment.cli("ingest", "--snapshot", str(deployment.snapshot(customers(3))), "--as-of", "2026-11-04T05:00:00Z",
                   "--config", cfg)  # fmt: skip
    code, _, err = deployment.cli("run", "--shard", "0/2", "--as-of", AS_OF, "--config", cfg)
    assert code == 2 and "within 1:00:00" in err, "an ingest four hours old is not this hour's"


def test_a_part_missing_or_altered_in_the_store_is_exit_2(deployment, tmp_path):
    cfg = config(tmp_path)
    deployment.cli("ingest", "--snapshot", str(deployment.snapshot(customers(4))), "--as-of", AS_OF, "--config", cfg)
    [part] = [p for p in (deployment.home / "store").rglob("part-1-of-2.parquet")]
    part.write_bytes(b"not the part")
    code, _, err = deployment.cli("run", "--shard", "1/2", "--as-of", AS_OF, "--config", cfg)
    assert code == 2 and "does not match its manifest" in err
    part.unlink()
    code, _, err = deployment.cli("run", "--shard", "1/2", "--as-of", AS_OF, "--config", cfg)
    assert code == 2 and "cannot be read" in err


@pytest.mark.slow
def test_two_ingests_of_one_hour_leave_the_newest_and_no_key_is_sent_twice(deployment, tmp_path):
    cfg = config(tmp_path, shards=1)
    for _ in range(2):
        deployment.cli(
            "ingest", "--snapshot", str(deployment.snapshot(customers(3))), "--as-of", AS_OF, "--config", cfg
        )
    manifests = SnapshotStore(str(deployment.home / "store")).manifests()
    assert len(manifests) == 2
    for _ in range(2):
        assert deployment.cli("run", "--shard", "0/1", "--as-of", AS_OF, "--config", cfg)[0] == 0
    assert len(deployment.outbox()) == 3


def test_plain_http_to_a_store_is_refused_unless_it_is_on_this_machine(tmp_path, monkeypatch):
    from dunning.errors import ConfigError

    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://s3.example.com:9000")
    with pytest.raises(ConfigError, match="AWS_ALLOW_HTTP=true is accepted only"):
        SnapshotStore("s3://bucket/prefix")


@pytest.fixture
def moto_s3(monkeypatch):
    """moto's S3 server on 127.0.0.1 (a fake at the boundary of S3, speaking its wire protocol), and a bucket."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    import requests

    requests.put(f"{endpoint}/dunning-test", timeout=10).raise_for_status()  # CreateBucket
    yield endpoint
    server.stop()


@pytest.mark.slow
def test_the_store_on_s3_holds_the_parts_and_a_shard_reads_its_own(deployment, tmp_path, moto_s3):
    cfg = config(tmp_path, extra="store: {url: 's3://dunning-test/acme'}\n")
    code, out, err = deployment.cli("ingest", "--snapshot", str(deployment.snapshot(customers(6))), "--as-of", AS_OF,
                                    "--config", cfg)  # fmt: skip
    assert code == 0, err
    store = SnapshotStore("s3://dunning-test/acme")
    [manifest] = store.manifests()
    assert sorted(p.shard for p in manifest.parts) == [0, 1] and manifest.rows == 6
    import polars as pl

    part = pl.read_parquet(store.read_part(manifest, 1))
    assert part.height == manifest.part(1).rows and part.height < 6


def test_a_shard_started_while_its_ingest_is_still_writing_parts_refuses_with_exit_2(deployment, tmp_path, monkeypatch):
    """The manifest is written last: parts without it are an ingest that does not exist yet for a reader."""
    from dunning.ingest import store as store_module

    cfg = config(tmp_path)
    written = []
    original = store_module.SnapshotStore.put

    def put(self, path, data):
        if path.endswith("manifest.json"):  # the ingest is stopped before its last write
            raise KeyboardInterrupt
        written.append(path)
        return original(self, path, data)

    monkeypatch.setattr(store_module.SnapshotStore, "put", put)
    code, _, _ = deployment.cli("ingest", "--snapshot", str(deployment.snapshot(customers(4))), "--as-of", AS_OF,
                                "--config", cfg)  # fmt: skip
    assert code == 130 and len(written) == 2, "both parts written, the manifest not"
    monkeypatch.setattr(store_module.SnapshotStore, "put", original)
    code, _, err = deployment.cli("run", "--shard", "0/2", "--as-of", AS_OF, "--config", cfg)
    assert code == 2 and "no ingest of 2 parts" in err
    assert deployment.outbox() == []


@pytest.mark.slow
def test_an_empty_part_carries_the_ingests_snapshot_time_so_no_shard_is_refused_as_stale(deployment, tmp_path):
    cfg = config(tmp_path, shards=4)
    rows = [invoice(invoice_id="in_a", customer_id="cus_a", snapshot_at="2026-11-04T08:50:00Z"),
            invoice(invoice_id="in_b", customer_id="cus_b", customer_email="b@example.com",
                    snapshot_at="2026-11-04T08:50:00Z")]  # fmt: skip
    assert (
        deployment.cli("ingest", "--snapshot", str(deployment.snapshot(rows)), "--as-of", AS_OF, "--config", cfg)[0]
        == 0
    )
    for shard in ("1/4", "3/4", "0/4", "2/4"):  # the empty parts first
        code, _, err = deployment.cli("run", "--shard", shard, "--as-of", AS_OF, "--config", cfg)
        assert code == 0, err
    taken = {t for (t,) in deployment.query("SELECT DISTINCT snapshot_taken_at FROM applied_snapshots")}
    assert len(taken) == 1, "every shard applied the ingest's snapshot time"
    assert len(deployment.outbox()) == 2


def test_of_two_ingests_of_one_hour_the_later_one_is_read(deployment, tmp_path):
    cfg = config(tmp_path, shards=1)
    deployment.cli("ingest", "--snapshot", str(deployment.snapshot(customers(2))), "--as-of", AS_OF, "--config", cfg)
    deployment.cli("ingest", "--snapshot", str(deployment.snapshot(customers(3))), "--as-of", AS_OF, "--config", cfg)
    [newest, _] = SnapshotStore(str(deployment.home / "store")).manifests()
    assert newest.rows == 3, "the corrected re-ingest wins, whatever its random suffix"


def test_a_hand_placed_or_damaged_manifest_is_never_read(deployment, tmp_path):
    from dunning.ingest.store import Manifest

    cfg = config(tmp_path)
    deployment.cli("ingest", "--snapshot", str(deployment.snapshot(customers(4))), "--as-of", AS_OF, "--config", cfg)
    [manifest_path] = (deployment.home / "store").rglob("manifest.json")
    doc = json.loads(manifest_path.read_text())
    for bad in ({"ingest_id": "../../../tmp/owned"}, {"as_of": "2026-11-04T09:00:00"}, {"parts": doc["parts"][:1]}):
        with pytest.raises(ValueError):
            Manifest.from_json(json.dumps({**doc, **bad}).encode(), folder=manifest_path.parent.name)
    manifest_path.write_text(json.dumps({**doc, "parts": doc["parts"][:1]}))
    code, _, err = deployment.cli("run", "--shard", "1/2", "--as-of", AS_OF, "--config", cfg)
    assert code == 2 and "no ingest of 2 parts" in err


@pytest.mark.parametrize(
    ("cron", "zone", "as_of", "interval"),
    [
        ("0 * * * *", "Europe/Berlin", "2026-10-25T01:30:00Z", "1:00:00"),  # the night clocks go back
        ("0 * * * *", "Europe/Berlin", "2026-03-29T01:30:00Z", "1:00:00"),  # and forward
        ("0 9 * * 1-5", "UTC", "2026-11-09T09:00:00Z", "3 days, 0:00:00"),  # Monday reads Friday's
        ("0 9,17 * * *", "UTC", "2026-11-04T09:00:00Z", "16:00:00"),
    ],
)
def test_the_window_a_shard_may_read_is_the_cron_interval_ending_at_it_in_real_time(cron, zone, as_of, interval):
    import datetime as dt

    from dunning.config import DunningConfig
    from dunning.run.ingest import cron_interval

    config = DunningConfig.model_validate({"timezone": zone, "schedule": {"cron": cron}})
    moment = dt.datetime.fromisoformat(as_of.replace("Z", "+00:00"))
    assert str(cron_interval(config, moment)) == interval


def test_a_store_that_cannot_be_listed_is_exit_2_in_one_line(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # nothing listens there
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_RETRIES", "0")
    cfg = config(tmp_path, extra="store: {url: 's3://nowhere/x'}\n")
    code, _, err = deployment.cli("run", "--shard", "0/2", "--as-of", AS_OF, "--config", cfg)
    assert code == 2 and "cannot be listed" in err and "Traceback" not in err
