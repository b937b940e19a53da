"""A fake of a collections system's escalation endpoint (the boundary we cannot run here): a local HTTP server that
checks the `Dunning-Signature` and dedupes on `Idempotency-Key` the way a receiver is asked to, and records every
request. It can answer late (after the client's timeout, so the hand-over is `unknown`), with given statuses, with
one status for everything (`default_status`: a receiver that is down), or hold a request after acting on it until
the test releases it (`hold_from`: the n-th request on, so a test can kill the run in the middle of its loop)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    key: str
    signature: str
    body: bytes

    @property
    def document(self) -> dict:
        return json.loads(self.body)

    @property
    def timestamp(self) -> int:
        return int(dict(p.split("=", 1) for p in self.signature.split(","))["t"])


@dataclass
class Receiver:
    secret: str
    requests: list[Received] = field(default_factory=list)
    accepted: dict[str, bytes] = field(default_factory=dict)  # first body per Idempotency-Key: what it acted on
    statuses: list[int] = field(default_factory=list)  # answers to give, in order (then `default_status`)
    late: int = 0  # this many first requests are answered only after `late_seconds`
    late_seconds: float = 1.5
    default_status: int = 200
    # the receiver's own record: the body it acted on per key (a 2xx it gave, or a request it held), and how often it
    # acted; a key it acted on before is answered 200 again without acting (its idempotency contract)
    acted: dict[str, bytes] = field(default_factory=dict)
    acted_count: Counter = field(default_factory=Counter)
    hold_from: int | None = None  # from this request on (1-based), act, then answer only once `released` is set
    released: threading.Event = field(default_factory=threading.Event)

    def valid(self, received: Received) -> bool:
        parts = dict(p.split("=", 1) for p in received.signature.split(","))
        expected = hmac.new(self.secret.encode(), f"{parts['t']}.".encode() + received.body, hashlib.sha256)
        return hmac.compare_digest(expected.hexdigest(), parts["v1"])

    def keys_requested(self) -> Counter:
        return Counter(r.key for r in self.requests)

    def _act(self, received: Received) -> None:
        if received.key not in self.acted:
            self.acted[received.key] = received.body
            self.acted_count[received.key] += 1


class EscalationServer:
    def __init__(self, receiver: Receiver):
        self.receiver = receiver
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received = Received(self.headers["Idempotency-Key"], self.headers["Dunning-Signature"], body)
                rec = outer.receiver
                rec.requests.append(received)
                if not rec.valid(received):
                    self.send_response(401)
                    self.end_headers()
                    return
                rec.accepted.setdefault(received.key, body)  # a repeated key: the first result, acted on once
                if received.key in rec.acted:  # done before: the first result again, nothing done twice
                    self._answer(200)
                    return
                if rec.hold_from is not None and len(rec.requests) >= rec.hold_from:
                    rec._act(received)  # it acted, and its answer never reaches the client
                    rec.released.wait(120)
                    self._answer(200)
                    return
                if rec.late > 0:
                    rec.late -= 1
                    time.sleep(rec.late_seconds)  # the receiver is slow: the client's timeout (config) fires first
                status = rec.statuses.pop(0) if rec.statuses else rec.default_status
                if 200 <= status < 300:
                    rec._act(received)
                self._answer(status)

            def _answer(self, status: int) -> None:
                try:
                    self.send_response(status)
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:  # the client is gone (killed, or it timed out)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/escalations"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> EscalationServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.receiver.released.set()
        self.server.shutdown()
        self.server.server_close()
