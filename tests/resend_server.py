"""A fake of Resend's email API (the real one cannot be reached from here), speaking its wire protocol.

`POST /emails` with `Authorization: Bearer KEY` and an `Idempotency-Key`
header answers `{"id": ...}`; within the idempotency window a repeated key
with the same body gets the first answer and sends nothing more, a repeated
key with another body gets `409 invalid_idempotent_request`, and a repeat
while the first is still in flight gets `409 concurrent_idempotent_requests`
(Resend's documented errors). `GET /emails/{id}` answers the email with its
`last_event`. A script of answers by request number lets a test make one
request hang past the client's timeout after it was accepted (the case that
makes an SMTP send `unknown` for good), accept a request and then answer 502 or an unreadable 200, or answer
401, 422, 429 (with `Retry-After`) or 500. `forget()` drops every key, as Resend does after 24 hours.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KEY = "re_test_key_for_the_fake_server"


@dataclass
class FakeResend:
    script: dict[int, str] = field(default_factory=dict)  # request number (from 1) -> "hang" | "401" | "422" | ...
    hang_seconds: float = 2.0
    retry_after: int | None = None  # seconds a scripted 429 asks the client to wait
    requests: list[dict[str, Any]] = field(default_factory=list)  # every POST /emails: headers and body
    delivered: list[dict[str, Any]] = field(default_factory=list)  # what a recipient would get: once per key
    answers: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # key -> (body, first answer)
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> FakeResend:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def do_POST(self) -> None:
                fake.post(self)

            def do_GET(self) -> None:
                fake.get(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def config(self, path, **provider: Any) -> str:
        settings = {"kind": "resend", "api_base": self.url, "timeout_seconds": 0.5, "from": "billing@example.com"}
        settings.update(provider)
        path.write_text(json.dumps({"provider": settings}))
        return str(path)

    @staticmethod
    def answer(
        handler: BaseHTTPRequestHandler,
        status: int,
        body: dict[str, Any] | bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:  # the client gave up waiting (the hang case)
            pass

    def error(
        self, handler: BaseHTTPRequestHandler, status: int, name: str, message: str, headers: dict | None = None
    ) -> None:
        self.answer(handler, status, {"statusCode": status, "name": name, "message": message}, headers=headers)

    def forget(self) -> None:
        """Every key forgotten, as Resend does 24 hours after a key's first request."""
        with self.lock:
            self.answers.clear()

    def post(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0)).decode()
        key = handler.headers.get("Idempotency-Key")
        with self.lock:
            self.requests.append({"key": key, "body": json.loads(body), "auth": handler.headers.get("Authorization")})
            scripted = self.script.get(len(self.requests), "")
        if handler.path != "/emails":
            return self.error(handler, 404, "not_found", "no such route")
        if handler.headers.get("Authorization") != f"Bearer {KEY}" or scripted == "401":
            # quoting what it was given, as real services' error texts often do: the pipeline must mask it
            given = handler.headers.get("Authorization") or ""
            return self.error(handler, 401, "missing_api_key", f"API key is invalid: {given}")
        if scripted in ("422", "429", "500"):
            names = {"422": "validation_error", "429": "rate_limit_exceeded", "500": "internal_server_error"}
            headers = {"Retry-After": str(self.retry_after)} if scripted == "429" and self.retry_after else None
            return self.error(handler, int(scripted), names[scripted], f"scripted {scripted}", headers)
        if scripted == "409-concurrent":
            return self.error(handler, 409, "concurrent_idempotent_requests", "the first request is in flight")
        with self.lock:
            if key in self.answers:
                first_body, first_answer = self.answers[key]
                if first_body != body:
                    return self.error(
                        handler, 409, "invalid_idempotent_request", "same idempotency key, different request"
                    )
                return self.answer(handler, 200, first_answer)
            email_id = f"re_{len(self.delivered) + 1:06d}"
            self.answers[key] = (body, {"id": email_id})
            self.delivered.append({"id": email_id, "key": key, **json.loads(body)})
        if scripted == "hang":  # accepted, but the answer never reaches the client in time
            self.release.wait(self.hang_seconds)
        if scripted == "500-after-accept":  # accepted, then a gateway answers 5xx
            return self.error(handler, 502, "internal_server_error", "bad gateway after the email was accepted")
        if scripted == "200-garbage":  # accepted, answered 200 with a body that is not JSON (a proxy's page)
            return self.answer(handler, 200, b"<html>ok</html>", content_type="text/html")
        self.answer(handler, 200, {"id": email_id})

    def get(self, handler: BaseHTTPRequestHandler) -> None:
        email_id = handler.path.rsplit("/", 1)[-1]
        found = next((d for d in self.delivered if d["id"] == email_id), None)
        if found is None:
            return self.error(handler, 404, "not_found", "email not found")
        self.answer(handler, 200, {"object": "email", "id": email_id, "last_event": "delivered"})

    def keys_delivered(self) -> list[str]:
        return [d["key"] for d in self.delivered]
