"""A real, throwaway IMAP server for the tests: Debian's `dovecot-imapd`, started as `postgres_server` starts
PostgreSQL.

One dovecot per test, in a temporary directory, listening on a free loopback port with implicit TLS only (a
certificate for `localhost` the test makes with `openssl`, its own CA), one user with a static password, mail in a
Maildir the test writes into. As root the mail belongs to the `dovecot` system user (dovecot refuses to serve
mail as root). Tests that need it are skipped, with the reason, only when the binary is missing.
"""

from __future__ import annotations

import mailbox
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DOVECOT = shutil.which("dovecot") or ("/usr/sbin/dovecot" if Path("/usr/sbin/dovecot").exists() else None)
USER, PASSWORD = "collector", "the-imap-password-of-this-test"
MISSING = "dovecot is not installed (Debian: apt-get install dovecot-imapd; .ci/run installs it)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certificate(directory: Path, name: str = "localhost") -> tuple[Path, Path]:
    """A self-signed certificate for `name` (and 127.0.0.1), its own CA: (certificate, key)."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
         "-addext", f"subjectAltName=DNS:{name},IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@dataclass
class ImapServer:
    root: Path
    port: int
    cert: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def maildir(self) -> Path:
        return self.root / "mail" / USER / "Maildir"

    def url(self, folder: str = "INBOX", host: str = "localhost") -> str:
        return f"imaps://{USER}@{host}:{self.port}/{folder}"

    def deliver(self, messages: list[bytes]) -> None:
        """Put messages in the user's INBOX (as a delivery agent would), owned by the mail user."""
        self.maildir.parent.mkdir(parents=True, exist_ok=True)
        box = mailbox.Maildir(self.maildir, create=True)
        try:
            for raw in messages:
                box.add(raw)
        finally:
            box.close()
        self._own(self.root / "mail")

    def flags(self) -> list[str]:
        """The flags of every message, as dovecot keeps them in the Maildir file names."""
        box = mailbox.Maildir(self.maildir, create=False)
        try:
            return [box.get_message(key).get_flags() for key in box.iterkeys()]
        finally:
            box.close()

    @staticmethod
    def _own(path: Path) -> None:
        if os.getuid() != 0:
            return
        user = pwd.getpwnam("dovecot")
        for directory, _, files in os.walk(path):
            os.chown(directory, user.pw_uid, user.pw_gid)
            for name in files:
                os.chown(os.path.join(directory, name), user.pw_uid, user.pw_gid)

    def start(self) -> ImapServer:
        as_root = os.getuid() == 0
        mail_user = pwd.getpwnam("dovecot") if as_root else pwd.getpwuid(os.getuid())
        key = self.cert.with_suffix(".key")
        config = self.root / "dovecot.conf"
        config.write_text(
            f"base_dir = {self.root}/run\nstate_dir = {self.root}/state\nlog_path = {self.root}/dovecot.log\n"
            f"protocols = imap\nlisten = 127.0.0.1\nssl = required\nssl_cert = <{self.cert}\nssl_key = <{key}\n"
            "auth_mechanisms = plain\n"
            f"mail_location = maildir:{self.root}/mail/%u/Maildir\n"
            f"first_valid_uid = {mail_user.pw_uid}\nfirst_valid_gid = {mail_user.pw_gid}\n"
            + (f"default_internal_user = {mail_user.pw_name}\ndefault_login_user = {mail_user.pw_name}\n"
               f"default_internal_group = {pwd.getpwuid(mail_user.pw_uid).pw_name}\n" if not as_root else "")
            + f"passdb {{\n  driver = static\n  args = password={PASSWORD}\n}}\n"
            f"userdb {{\n  driver = static\n  args = uid={mail_user.pw_uid} gid={mail_user.pw_gid} "
            f"home={self.root}/mail/%u\n}}\n"
            "service imap-login {\n  inet_listener imap {\n    port = 0\n  }\n"
            f"  inet_listener imaps {{\n    port = {self.port}\n    ssl = yes\n  }}\n}}\n"
            "service anvil {\n  chroot =\n}\nservice imap-login {\n  chroot =\n}\n"
        )  # fmt: skip
        for sub in ("run", "state", "mail"):
            (self.root / sub).mkdir(exist_ok=True)
        self._own(self.root / "mail")
        assert DOVECOT is not None
        self.process = subprocess.Popen([DOVECOT, "-F", "-c", str(config)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)  # fmt: skip
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.root / "dovecot.log").read_text() if (self.root / "dovecot.log").exists() else ""
                raise RuntimeError(f"dovecot exited: {self.process.stderr.read().decode()} {log}")  # type: ignore[union-attr]
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError("dovecot did not listen within 15 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)  # its mail, keys and state: every run left one in /tmp


def start_imap_server() -> ImapServer:
    root = Path(tempfile.mkdtemp(prefix="dunning-imap-"))
    os.chmod(root, 0o755)  # the mail user traverses it
    cert, _ = make_certificate(root)
    os.chmod(root / "localhost.key", 0o644) if os.getuid() != 0 else None
    return ImapServer(root, _free_port(), cert).start()
