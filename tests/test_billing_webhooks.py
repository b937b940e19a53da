"""Chargebee's and Recurly's webhooks on `dunning serve-webhooks` (uvicorn on 127.0.0.1, as the command serves it):
verified (Basic auth in constant time; Recurly's HMAC with any signature and 5 minutes' tolerance, checked against
Recurly's own test vector), stored once (unique on the notification's id) and answered 2xx at once whatever
`source.kind` is; the next run of that source fetches each back from the API and applies it."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import time

import pytest
import requests

from dunning.config import load_config
from dunning.ingest.sources.webhooks import chargebee_authorized, recurly_verified
from dunning.run import inbox
from tests.billing_fakes import (
    CHARGEBEE_KEY,
    FIXTURES,
    FakeChargebee,
    chargebee_event,
    chargebee_invoice,
)
from tests.test_webhooks import Receiver

AS_OF = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
RECURLY_SECRET = "a recurly endpoint secret"


def test_recurlys_own_test_vector_verifies_and_any_signature_may_match():
    vector = json.loads((FIXTURES / "recurly" / "webhook_signature_vector.json").read_text())
    body = (FIXTURES / "recurly" / vector["body_file"]).read_bytes()
    header, secret = vector["header_value"], vector["secret"]
    stamp = int(header.split(",")[0])
    assert recurly_verified(header, body, secret, stamp + 1000)
    assert recurly_verified(f"{stamp},{'0' * 64},{header.split(',', 1)[1]}", body, secret, stamp), "any may match"
    assert not recurly_verified(header, body + b" ", secret, stamp), "the raw body, byte for byte"
    assert not recurly_verified(header, body, secret, stamp + 5 * 60 * 1000 + 1), "older than 5 minutes"
    assert not recurly_verified(header, body, "another secret", stamp)
    assert not recurly_verified(f"{stamp}", body, secret, stamp) and not recurly_verified(None, body, secret, stamp)


def test_chargebee_basic_auth_needs_both_user_and_password():
    good = "Basic " + base64.b64encode(b"hooks:s3cret").decode()
    assert chargebee_authorized(good, "hooks", "s3cret")
    assert not chargebee_authorized(good, "hooks", "other")
    assert not chargebee_authorized("Basic " + base64.b64encode(b"other:s3cret").decode(), "hooks", "s3cret")
    assert not chargebee_authorized("Basic not-base64!", "hooks", "s3cret") and not chargebee_authorized(None, "a", "b")


def recurly_headers(body: bytes, notification_id: str, at_ms: int | None = None) -> dict[str, str]:
    stamp = str(at_ms if at_ms is not None else int(time.time() * 1000))
    signature = hmac.new(RECURLY_SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"recurly-signature": f"{stamp},{signature}", "recurly-notification-id": notification_id,
            "content-type": "application/json"}  # fmt: skip


@pytest.mark.slow
def test_both_routes_verify_store_once_and_answer_whatever_the_source_is(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARGEBEE_WEBHOOK_USERNAME", "hooks")
    monkeypatch.setenv("CHARGEBEE_WEBHOOK_PASSWORD", "cb-hook-password")
    monkeypatch.setenv("RECURLY_WEBHOOK_SECRET", RECURLY_SECRET)
    event = json.dumps({"id": "ev_1", "event_type": "payment_failed", "api_version": "v2"}).encode()
    notification = (FIXTURES / "recurly" / "webhook_payment_failed.json").read_bytes()
    with Receiver(tmp_path) as receiver:  # source.kind is none: stored all the same
        cb = receiver.url("/webhooks/chargebee")
        assert requests.post(cb, data=event, auth=("hooks", "wrong"), timeout=5).status_code == 401
        assert requests.post(cb, data=event, timeout=5).status_code == 401
        first = requests.post(cb, data=event, auth=("hooks", "cb-hook-password"), timeout=5)
        again = requests.post(cb, data=event, auth=("hooks", "cb-hook-password"), timeout=5)
        assert (first.status_code, first.json(), again.status_code, again.json()) == (
            200, {"status": "stored"}, 200, {"status": "duplicate"})  # fmt: skip
        rc = receiver.url("/webhooks/recurly")
        stale = recurly_headers(notification, "n-1", int(time.time() * 1000) - 6 * 60 * 1000)
        assert requests.post(rc, data=notification, headers=stale, timeout=5).status_code == 400
        forged = {**recurly_headers(notification, "n-1"), "recurly-signature": f"{int(time.time() * 1000)},{'a' * 64}"}
        assert requests.post(rc, data=notification, headers=forged, timeout=5).status_code == 400
        ok = [requests.post(rc, data=notification, headers=recurly_headers(notification, "n-1"), timeout=5)
              for _ in range(2)]  # fmt: skip
        assert [r.json()["status"] for r in ok] == ["stored", "duplicate"]
    stored = sorted(p.name.split("-", 1)[0] for p in inbox.inbox_dir(tmp_path).glob("*.json"))
    assert stored == ["chargebee", "recurly"]
    assert inbox.pending(tmp_path) == [], "another source's notifications keep no run from being skipped"


@pytest.mark.slow
def test_the_next_chargebee_run_fetches_the_event_back_and_gives_one_notice(deployment, monkeypatch):
    monkeypatch.setenv("CHARGEBEE_WEBHOOK_USERNAME", "hooks")
    monkeypatch.setenv("CHARGEBEE_WEBHOOK_PASSWORD", "cb-hook-password")
    monkeypatch.setenv("CHARGEBEE_API_KEY", CHARGEBEE_KEY)
    with FakeChargebee() as fake:
        for n in range(2):
            fake.put(chargebee_invoice(n, AS_OF), at=1_790_000_000 + n)
        deployment.home.mkdir(parents=True, exist_ok=True)
        (deployment.home / "config.yaml").write_text(
            f"source: {{kind: chargebee, api_base: '{fake.api_base}', timeout_seconds: 5}}\n"
        )
        assert deployment.cli("run", "--as-of", AS_OF.isoformat())[0] == 0
        real = chargebee_event("ev_hook_1", "payment_failed", fake.invoices["cb_inv_0000"], AS_OF)
        fake.events.append(real)
        forged_body = json.dumps({**real, "content": {"invoice": {"id": "cb_inv_0001", "amount_due": 99}}}).encode()
        config = load_config(deployment.home / "config.yaml")
        with Receiver(deployment.home, config) as receiver:
            answer = requests.post(receiver.url("/webhooks/chargebee"), data=forged_body,
                                   auth=("hooks", "cb-hook-password"), timeout=5)  # fmt: skip
            assert answer.status_code == 200
        asked = len(fake.requests_to("/api/v2/events/ev_hook_1"))
        code, _, err = deployment.cli("run", "--as-of", (AS_OF + dt.timedelta(hours=1)).isoformat())
        assert code == 0, err
        assert len(fake.requests_to("/api/v2/events/ev_hook_1")) == asked + 1, "fetched back by its id"
        notices = [m for m in deployment.outbox() if m["X-Dunning-Kind"] == "payment_failed"]
        assert [m["X-Dunning-Keys"] for m in notices] == ["event:chargebee:ev_hook_1"], (
            "the API's invoice, not the body's"
        )
        assert "cb_inv_0000" in notices[0].get_body(("plain",)).get_content()
        assert inbox.pending(deployment.home, "chargebee") == [], "applied: the file is gone"
