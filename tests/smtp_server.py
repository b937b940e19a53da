"""A real SMTP server (aiosmtpd) on localhost whose answers the test scripts.

`script` maps the n-th DATA exchange (1-based) to a behaviour: "ok" (default),
"554"/"451" (reject the data), or "slow" (keep the message, answer only after
`slow_seconds`, longer than the client's timeout); `delay_seconds` slows every
answer, so a test can act in the middle of a batch. Every message the server
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


class RefusedPort:
    """A port on 127.0.0.1 that refuses connections while the `with` block runs: bound and never listening, so no
    parallel worker's server can take it meanwhile. (A port merely found free, `free_port`, was handed to another
    worker's SMTP server, which then accepted what a test expected refused, and took its emails.)"""

    def __init__(self) -> None:
        self._socket: socket.socket | None = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]

    def release(self) -> int:
        """Free the port (for a server the test starts on it next); its number."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        return self.port

    def __enter__(self) -> RefusedPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ScriptedHandler:
    def __init__(self, script: dict[int, str] | None = None, slow_seconds: float = 3.0, delay_seconds: float = 0.0):
        self.script = dict(script or {})
        self.slow_seconds = slow_seconds
        self.delay_seconds = delay_seconds  # before every answer: a slow relay, so a test can act mid-batch
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
        elif self.delay_seconds:
            await asyncio.sleep(self.delay_seconds)
        return "250 OK"

    def keys(self) -> list[str]:
        return [k for m in self.received for k in m["X-Dunning-Keys"].split(",")]


class SmtpServer:
    def __init__(self, handler: ScriptedHandler, port: int | None = None):
        self.handler = handler
        self.port = port or free_port()
        self.controller = Controller(handler, hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> SmtpServer:
        self.controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self.controller.stop()


def smtp_config(path, port: int, timeout: float = 1.0, extra: str = "") -> str:
    path.write_text(
        f"provider: {{kind: smtp, host: 127.0.0.1, port: {port}, timeout_seconds: {timeout}, "
        f"from: billing@example.com}}\n"
        f"retry: {{max_attempts: 3, backoff_minutes: 30}}\n{extra}"
    )
    return str(path)


class RawSmtpServer:
    """A hand-written SMTP server on a raw socket that misbehaves on purpose, one way per `mode`.

    Modes: `drop_on_data` (hangs up when it reads DATA), `stall_on_data` (never
    answers DATA), `stall_after_dot` (reads the whole message, never answers),
    `421_then_drop` (answers the first message's final dot with 421 and closes;
    later connections hang up on DATA). `messages` counts complete messages
    received (each would have been accepted by a real server).
    """

    def __init__(self, mode: str):
        self.mode = mode
        self.messages = 0
        self.data_commands = 0
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []

    def __enter__(self) -> RawSmtpServer:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            for conn in self._open:
                conn.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._open.append(conn)
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            conn.sendall(b"220 raw.test ESMTP\r\n")
            while True:
                line = reader.readline()
                if not line:
                    return
                verb = line.strip().split(b" ")[0].upper()
                if verb in (b"EHLO", b"HELO"):
                    conn.sendall(b"250 raw.test\r\n")
                elif verb in (b"MAIL", b"RCPT", b"RSET", b"NOOP"):
                    conn.sendall(b"250 OK\r\n")
                elif verb == b"QUIT":
                    conn.sendall(b"221 bye\r\n")
                    return
                elif verb == b"DATA":
                    with self._lock:
                        self.data_commands += 1
                        first = self.data_commands == 1
                    if self.mode == "drop_on_data" or (self.mode == "421_then_drop" and not first):
                        return
                    if self.mode == "stall_on_data":
                        self._stop.wait()
                        return
                    conn.sendall(b"354 go ahead\r\n")
                    while reader.readline() not in (b".\r\n", b""):
                        pass
                    with self._lock:
                        self.messages += 1
                    if self.mode == "stall_after_dot":
                        self._stop.wait()
                        return
                    conn.sendall(b"421 4.3.2 closing\r\n")
                    return
                else:
                    conn.sendall(b"502 no\r\n")
        except OSError:
            return
        finally:
            conn.close()
