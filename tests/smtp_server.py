"""A real SMTP server (aiosmtpd) on localhost whose answers the test scripts.

`script` maps the n-th DATA exchange (1-based) to a behaviour: "ok" (default),
"554"/"451" (reject the data), or "slow" (keep the message, answer only after
`slow_seconds`, longer than the client's timeout). Every message the server
kept is in `received`, so a test can count deliveries per key.
"""

from __future__ import annotations

import asyncio
import email
import socket
import threading
from email import policy

from aiosmtpd.controller import Controller


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ScriptedHandler:
    def __init__(self, script: dict[int, str] | None = None, slow_seconds: float = 3.0):
        self.script = dict(script or {})
        self.slow_seconds = slow_seconds
        self.received: list[email.message.EmailMessage] = []
        self.attempts = 0
        self._lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):
        with self._lock:
            self.attempts += 1
            behaviour = self.script.get(self.attempts, "ok")
        if behaviour == "554":
            return "554 5.7.1 Message rejected"
        if behaviour == "451":
            return "451 4.3.0 Try again later"
        message = email.message_from_bytes(envelope.content, policy=policy.default)
        with self._lock:
            self.received.append(message)
        if behaviour == "slow":
            await asyncio.sleep(self.slow_seconds)
        return "250 OK"

    def keys(self) -> list[str]:
        return [k for m in self.received for k in m["X-Dunning-Keys"].split(",")]


class SmtpServer:
    def __init__(self, handler: ScriptedHandler, port: int | None = None):
        self.handler = handler
        self.port = port or free_port()
        self.controller = Controller(handler, hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> "SmtpServer":
        self.controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self.controller.stop()


def smtp_config(path, port: int, timeout: float = 1.0, extra: str = "") -> str:
    path.write_text(
        f"provider: {{kind: smtp, host: 127.0.0.1, port: {port}, timeout_seconds: {timeout}, from: billing@example.com}}\n"
        f"retry: {{max_attempts: 3, backoff_minutes: 30}}\n{extra}"
    )
    return str(path)
