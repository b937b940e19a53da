"""The snapshot store: where `dunning ingest` leaves a validated snapshot split by shard, for the shard runs to read.

`store.url` is a local directory (default `HOME/store`) or `s3://bucket/prefix`, both through `obstore` (the
Python binding of the Rust `object_store` crate: one API for a directory and S3-compatible stores, no boto stack,
credentials and endpoint read from the standard AWS environment variables, never the config). `AWS_ALLOW_HTTP=true`
(plain http) is accepted only for an endpoint on this machine (a MinIO or a test server on 127.0.0.1).

Layout, one folder per ingest:

    ingests/<ingest id>/part-<K>-of-<N>.parquet   the accepted rows of shard K, written first
    ingests/<ingest id>/manifest.json              written last: names every part, its rows and sha256

A part is visible only once complete (an S3 PUT is atomic; the local store writes a temporary file and renames
it); an ingest without its manifest does not exist for a reader. A shard run takes the newest complete manifest
whose as-of is at or before its own and within one cron interval (`choose_manifest`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import polars as pl

from dunning.errors import ConfigError, SnapshotError, StorageError
from dunning.storage_faults import storage_fault
from dunning.urls import is_loopback, store_url_problem

INGESTS = "ingests"
MANIFEST = "manifest.json"
FORMAT = 1
INGEST_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}")
TAKEN_AT_KEY = b"dunning.snapshot_taken_at"  # a part's Parquet metadata: the ingest's snapshot time, rows or none
INVOICES_KEY = b"dunning.snapshot_invoices"  # and the whole snapshot's accepted invoices (what a shrink is judged on)


@dataclass(frozen=True)
class Part:
    shard: int
    path: str
    rows: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    ingest_id: str
    as_of: dt.datetime
    taken_at: dt.datetime
    shards: int
    rows: int
    rejected: int
    source: str
    parts: tuple[Part, ...]
    written_at: dt.datetime | None = None  # when the manifest was written: of two ingests of one hour, the later wins

    def part(self, shard: int) -> Part:
        return next(p for p in self.parts if p.shard == shard)

    def to_json(self) -> bytes:
        return json.dumps({
            "format": FORMAT, "ingest_id": self.ingest_id, "as_of": self.as_of.isoformat(),
            "taken_at": self.taken_at.isoformat(), "shards": self.shards, "rows": self.rows,
            "rejected": self.rejected, "source": self.source,
            "written_at": self.written_at.isoformat() if self.written_at else None,
            "parts": [{"shard": p.shard, "path": p.path, "rows": p.rows, "sha256": p.sha256} for p in self.parts],
        }, indent=1).encode()  # fmt: skip

    @staticmethod
    def from_json(data: bytes, folder: str | None = None) -> Manifest:
        """A manifest as written by `dunning ingest`; ValueError for anything else (a hand-placed or damaged one is
        never read): its id the folder's, aware times, one part per shard 0..N-1 at the name the ingest gives it."""
        doc = json.loads(data)
        if doc.get("format") != FORMAT:
            raise ValueError(f"manifest format {doc.get('format')!r}")
        ingest_id = str(doc["ingest_id"])
        if not INGEST_ID.fullmatch(ingest_id) or (folder is not None and folder != ingest_id):
            raise ValueError(f"manifest names ingest {ingest_id!r}")
        times = [dt.datetime.fromisoformat(doc[k]) for k in ("as_of", "taken_at")]
        written = dt.datetime.fromisoformat(doc["written_at"]) if doc.get("written_at") else None
        if any(t.tzinfo is None for t in [*times, *([written] if written else [])]):
            raise ValueError("manifest times without a zone")
        shards = int(doc["shards"])
        parts = tuple(Part(int(p["shard"]), str(p["path"]), int(p["rows"]), str(p["sha256"])) for p in doc["parts"])
        if sorted(p.shard for p in parts) != list(range(shards)) or any(
            p.path != part_path(ingest_id, p.shard, shards) for p in parts
        ):
            raise ValueError("manifest parts are not one per shard at their names")
        return Manifest(
            ingest_id=ingest_id, as_of=times[0], taken_at=times[1], shards=shards, rows=int(doc["rows"]),
            rejected=int(doc["rejected"]), source=str(doc["source"]), parts=parts, written_at=written,
        )  # fmt: skip


def part_path(ingest_id: str, shard: int, shards: int) -> str:
    return f"{INGESTS}/{ingest_id}/part-{shard}-of-{shards}.parquet"


def _allow_http(url: str) -> bool:
    """Whether plain http may be used: only with `AWS_ALLOW_HTTP=true` and an endpoint on this machine."""
    if os.environ.get("AWS_ALLOW_HTTP", "").strip().lower() not in ("true", "1"):
        return False
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    host = urlsplit(endpoint).hostname
    if not endpoint.startswith("http://") or host is None or not is_loopback(host):
        raise ConfigError(
            "store.url: AWS_ALLOW_HTTP=true is accepted only with AWS_ENDPOINT_URL on this machine "
            f"(http://127.0.0.1:…); {url} would send credentials and invoices unencrypted"
        )
    return True


# what the operator reads of a store's refusal: the error's kind, never the server's text (its body can echo a
# request header such as x-amz-security-token, and Dagster keeps a step's error in the run's event log)
_REFUSALS = {"PermissionDeniedError": "permission denied", "UnauthenticatedError": "the credentials were refused"}
_STATUS = re.compile(r"non-2xx status code: (\d{3})")


def _refused(error: Exception) -> str | None:
    """Why the store refused a request when its server answered with an error (permissions, credentials, a
    signature it rejects, a failure of its own), in our words; None when it did not answer (unreachable) or the
    object is not there. obstore files a rejected signature (403) as a generic error: its status says it."""
    known = _REFUSALS.get(type(error).__name__)
    if known is not None or type(error).__name__ == "NotFoundError":
        return known
    status = _STATUS.search(str(error))
    if status is None or status.group(1) == "404":
        return None
    code = int(status.group(1))
    return f"the credentials were refused: HTTP {code}" if code in (401, 403) else f"HTTP {code}"


class SnapshotStore:
    """One store: a directory or an S3 prefix (module docstring). Its errors name the store and what was refused,
    never the server's answer: a refused write or a refused read is a `StorageError` (exit 8)."""

    def __init__(self, url: str):
        from obstore.store import LocalStore, S3Store

        problem = store_url_problem(url)
        if problem is not None:
            raise ConfigError(f"store.url {problem}")
        self.url = url
        if url.startswith("s3://"):
            parts = urlsplit(url)
            options: Any = {"allow_http": True} if _allow_http(url) else {}
            self._store: Any = S3Store(parts.netloc, prefix=parts.path.strip("/") or None, client_options=options)
        else:
            Path(url).mkdir(parents=True, exist_ok=True)
            self._store = LocalStore(url)

    def put(self, path: str, data: bytes) -> None:
        """Write `path`; StorageError naming the store and the path (never the server's text) when that fails."""
        import obstore

        try:
            obstore.put(self._store, path, data)
        except Exception as error:  # noqa: BLE001 - obstore's permission, transport and disk errors alike
            fault = storage_fault(str(error))  # a local store's full or read-only disk, in our words
            why = _refused(error) or (fault.reason if fault else type(error).__name__)
            raise StorageError(
                f"storage error: the store {self.url} refused to write {path} ({why}); check its permissions and "
                "the AWS_* environment: nothing of this ingest is published, the shards read the last complete one"
            ) from None

    def get(self, path: str) -> bytes:
        """Read `path`; StorageError when the store refuses (permissions, credentials), any other error as it is."""
        import obstore

        try:
            return bytes(obstore.get(self._store, path).bytes())
        except Exception as error:  # noqa: BLE001 - obstore's permission, not-found and transport errors alike
            why = _refused(error)
            if why is None:
                raise
            raise StorageError(
                f"storage error: the store {self.url} refused to read {path} ({why}); check its permissions and "
                "the AWS_* environment"
            ) from None

    def ingest_ids(self) -> list[str]:
        """The ingest folders in the store (one listing of folder names, not of every part ever written)."""
        import obstore

        try:
            listing = obstore.list_with_delimiter(self._store, f"{INGESTS}/")
        except Exception as error:  # noqa: BLE001 - obstore's transport and permission errors alike
            why = _refused(error)
            if why is not None:
                raise StorageError(f"storage error: the store {self.url} refused to list {INGESTS}/ ({why}); check "
                                   "its permissions and the AWS_* environment") from None  # fmt: skip
            raise SnapshotError(f"store {self.url} cannot be listed ({type(error).__name__}); check store.url and "
                                "the AWS_* environment") from None  # fmt: skip
        names = (str(p).rstrip("/").rsplit("/", 1)[-1] for p in listing["common_prefixes"])
        return sorted(n for n in names if INGEST_ID.fullmatch(n))

    def manifests(self, since: dt.datetime | None = None, until: dt.datetime | None = None) -> list[Manifest]:
        """The complete ingests in the store, newest first; with `since`/`until` only those whose as-of (the time
        in the ingest's id) lies between them, so a shard run reads a few manifests, not every one ever written. A
        damaged or hand-placed manifest is skipped."""
        found = []
        for ingest_id in self.ingest_ids():
            stamp = dt.datetime.strptime(ingest_id[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
            if (since is not None and stamp < since.replace(microsecond=0)) or (until is not None and stamp > until):
                continue
            try:
                found.append(Manifest.from_json(self.get(f"{INGESTS}/{ingest_id}/{MANIFEST}"), folder=ingest_id))
            except StorageError:  # refused: said, not taken for an ingest that does not exist
                raise
            except Exception:  # noqa: BLE001 - missing (still being written), damaged or hand-placed: not an ingest
                continue
        epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
        return sorted(found, key=lambda m: (m.as_of, m.written_at or epoch, m.ingest_id), reverse=True)

    def write_ingest(self, manifest: Manifest, parts: dict[int, bytes]) -> None:
        """Every part first, then the manifest that names them: readers see all of an ingest or none of it."""
        for part in manifest.parts:
            self.put(part.path, parts[part.shard])
        self.put(f"{INGESTS}/{manifest.ingest_id}/{MANIFEST}", manifest.to_json())

    def read_part(self, manifest: Manifest, shard: int) -> bytes:
        """Part `shard` of `manifest`, checked against the sha256 the manifest names."""
        part = manifest.part(shard)
        try:
            data = self.get(part.path)
        except StorageError:
            raise
        except Exception as error:  # noqa: BLE001 - obstore's not-found and transport errors alike
            raise SnapshotError(
                f"ingest {manifest.ingest_id}: part {shard}/{manifest.shards} cannot be read from {self.url} "
                f"({type(error).__name__}); run `dunning ingest` again"
            ) from None
        if hashlib.sha256(data).hexdigest() != part.sha256:
            raise SnapshotError(f"ingest {manifest.ingest_id}: part {shard}/{manifest.shards} does not match its "
                                "manifest (sha256); run `dunning ingest` again")  # fmt: skip
        return data

    # retention (`dunning.run.retention`): an ingest is listed and deleted whole, its manifest first
    def ingest_objects(self, ingest_id: str) -> list[tuple[str, int]]:
        """The objects of one ingest folder (path, bytes), its manifest first."""
        import obstore

        if not INGEST_ID.fullmatch(ingest_id):
            raise ValueError(f"not an ingest id: {ingest_id!r}")
        listing = obstore.list(self._store, prefix=f"{INGESTS}/{ingest_id}/")
        found = [(str(m["path"]), int(m["size"])) for chunk in listing for m in chunk]
        return sorted(found, key=lambda item: (not item[0].endswith("/" + MANIFEST), item[0]))

    def delete_ingest(self, ingest_id: str) -> int:
        """Delete one ingest folder, its manifest first (without it the ingest no longer exists for a reader, which
        never meets a missing part); returns its bytes."""
        import obstore

        objects = self.ingest_objects(ingest_id)
        for path, _ in objects:
            obstore.delete(self._store, path)
        if "://" not in self.url:  # a directory store keeps the emptied folder: it would still be listed
            with contextlib.suppress(OSError):
                (Path(self.url) / INGESTS / ingest_id).rmdir()
        return sum(size for _, size in objects)


def choose_manifest(
    manifests: list[Manifest], as_of: dt.datetime, shards: int, within: dt.timedelta
) -> Manifest | None:
    """The newest manifest of `shards` parts whose as-of is at or before `as_of` and no more than `within` before."""
    for manifest in manifests:
        if manifest.shards == shards and as_of - within <= manifest.as_of <= as_of:
            return manifest
    return None


def parquet_bytes(frame: pl.DataFrame, taken_at: dt.datetime | None = None, invoices: int | None = None) -> bytes:
    """A part as Parquet: lz4, no column statistics (a part is read whole, once, by its shard), and the ingest's
    snapshot time and whole invoice count in the file's metadata, so an empty part says them too."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    table = frame.to_arrow()
    stamp = {TAKEN_AT_KEY: taken_at.isoformat().encode()} if taken_at is not None else {}
    if invoices is not None:
        stamp[INVOICES_KEY] = str(invoices).encode()
    if stamp:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **stamp})
    out = io.BytesIO()
    pq.write_table(table, out, compression="lz4", write_statistics=False)
    return out.getvalue()


@dataclass(frozen=True)
class PartStamp:
    """What an ingest wrote into a part's metadata: the snapshot's time, and the whole snapshot's accepted invoices
    (None in a part an earlier release wrote)."""

    taken_at: dt.datetime
    invoices: int | None


def part_stamp(path: str | Path) -> PartStamp | None:
    """The stamp an ingest wrote into a part's metadata, or None for any other file (not an ingest's part)."""
    if not str(path).endswith(".parquet"):
        return None
    try:  # the footer's key-value metadata alone (polars: a millisecond; pyarrow.parquet's import was 0.1 s a run)
        metadata = pl.read_parquet_metadata(path)
        value, count = metadata.get(TAKEN_AT_KEY.decode()), metadata.get(INVOICES_KEY.decode())
        moment = dt.datetime.fromisoformat(value) if value else None
        invoices = int(count) if count else None
    except (OSError, ValueError, pl.exceptions.PolarsError):
        return None
    if moment is None or moment.tzinfo is None:
        return None
    return PartStamp(moment, invoices if invoices is not None and invoices >= 0 else None)
