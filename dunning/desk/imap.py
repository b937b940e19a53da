"""`dunning feedback --imap imaps://user@host:993/FOLDER`: the bounce and reply mailbox read over IMAP.

- TLS from the first byte (`imaps`), the server's certificate and host name verified against the system's
  authorities or `feedback.imap.ca_file` (a private CA); plain `imap://` is refused.
- The password comes from the environment variable `feedback.imap.password_env` names; it is never printed,
  logged or stored (the cursor's mailbox name has no password: a URL holding one is refused).
- The folder is opened read-only (EXAMINE) and each message fetched with `BODY.PEEK[]`: nothing is deleted,
  moved or flagged, not even `\\Seen`.
- Read by UID from a cursor kept in the ledger (`imap_cursors`: the folder's UIDVALIDITY and the last UID read):
  a run reads only what came since; a folder whose UIDVALIDITY changed (recreated) is read again from the start,
  which changes nothing already recorded (reports and replies are unique on their own keys). The cursor moves only
  once what was read is recorded, so a failure in between reads the same messages again.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import imaplib
import os
import re
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from dunning.config import DunningConfig
from dunning.errors import DunningError, UserInputError
from dunning.ingest.delivery_reports import MAX_MESSAGE_BYTES, Reading, read_message
from dunning.ledger.base import Ledger
from dunning.safe_text import for_terminal
from dunning.secret_env import read_secret

_UID = re.compile(rb"\bUID (\d+)")


@dataclass(frozen=True)
class Mailbox:
    user: str
    host: str
    port: int
    folder: str

    @property
    def name(self) -> str:
        """What the cursor is kept under (no password)."""
        return f"imaps://{self.user}@{self.host}:{self.port}/{self.folder}"


def parse_url(url: str) -> Mailbox:
    """`imaps://user@host[:993]/FOLDER` (FOLDER default INBOX); UserInputError naming what is wrong."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port or 993
    except ValueError:
        raise UserInputError(
            f"--imap {for_terminal(url)[:200]!r} is not a URL (imaps://user@host:993/FOLDER)"
        ) from None
    if parts.scheme != "imaps":
        raise UserInputError("--imap needs imaps:// (IMAP over TLS); a plain imap:// connection would send the "
                             "password in the clear")  # fmt: skip
    if parts.password is not None:
        raise UserInputError("--imap: put no password in the URL; set the variable feedback.imap.password_env names")
    if not parts.username or not parts.hostname:
        raise UserInputError("--imap needs a user and a host: imaps://user@host:993/FOLDER")
    folder = unquote(parts.path.lstrip("/")) or "INBOX"
    if any(c in folder for c in '\r\n"\\') or len(folder) > 200:
        raise UserInputError(f"--imap folder {for_terminal(folder)[:200]!r} is not a usable folder name")
    return Mailbox(unquote(parts.username), parts.hostname, port, folder)


def imap_folder_name(folder: str) -> str:
    """`folder` as IMAP names it on the wire (RFC 3501 5.1.3, modified UTF-7): printable ASCII as it is, `&` as
    `&-`, every other run as `&` + its UTF-16 in base64 with `,` for `/` + `-` ("Rückläufer": "R&APw-ckl&AOQ-ufer")."""
    out: list[str] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            encoded = base64.b64encode("".join(run).encode("utf-16-be")).decode("ascii").rstrip("=")
            out.append("&" + encoded.replace("/", ",") + "-")
            run.clear()

    for char in folder:
        if 0x20 <= ord(char) <= 0x7E:
            flush()
            out.append("&-" if char == "&" else char)
        else:
            run.append(char)
    flush()
    return "".join(out)


def _context(config: DunningConfig) -> ssl.SSLContext:
    ca_file = config.feedback.imap.ca_file
    if ca_file is not None and not os.path.isfile(ca_file):
        raise UserInputError(f"feedback.imap.ca_file {ca_file}: not a file")
    context = ssl.create_default_context(cafile=ca_file)
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _password(config: DunningConfig) -> str:
    """The mailbox's password, remembered as a secret (masked in every text this process stores or shows)."""
    return read_secret(config.feedback.imap.password_env, "feedback.imap.password_env")


def _ok(typ: str, data: object, what: str) -> None:
    if typ != "OK":
        raise DunningError(f"IMAP {what} refused: {for_terminal(str(data))[:200]}")


def _fetched(data: list[object]) -> Iterator[tuple[int, bytes]]:
    for item in data:
        if isinstance(item, tuple) and len(item) >= 2 and isinstance(item[0], bytes) and isinstance(item[1], bytes):
            found = _UID.search(item[0])
            if found:
                yield int(found.group(1)), item[1]


@dataclass(frozen=True)
class ImapRead:
    reading: Reading
    last_uid: int
    uidvalidity: int
    messages: int


def read_mailbox(ledger: Ledger, mailbox: Mailbox, config: DunningConfig) -> ImapRead:
    """The messages of `mailbox` after the ledger's cursor, read-only; DunningError when the server cannot be
    reached or refuses (the cursor is left where it was)."""
    settings = config.feedback.imap
    password = _password(config)
    context = _context(config)
    try:
        client = imaplib.IMAP4_SSL(mailbox.host, mailbox.port, ssl_context=context, timeout=settings.timeout_seconds)
    except ssl.SSLCertVerificationError as error:
        raise DunningError(f"IMAP {mailbox.host}:{mailbox.port}: the server's certificate does not verify "
                           f"({error.verify_message}); feedback.imap.ca_file names a private CA") from None  # fmt: skip
    except (OSError, imaplib.IMAP4.error) as error:
        raise DunningError(
            f"IMAP {mailbox.host}:{mailbox.port} unreachable: {for_terminal(str(error))[:200]}"
        ) from None
    try:
        try:
            client.login(mailbox.user, password)
        except imaplib.IMAP4.error:
            raise UserInputError(f"IMAP {mailbox.host}: login refused for {for_terminal(mailbox.user)} (wrong user "
                                 f"or the password in {settings.password_env})") from None  # fmt: skip
        quoted = '"' + imap_folder_name(mailbox.folder) + '"'
        typ, data = client.select(quoted, readonly=True)
        _ok(typ, data, f"EXAMINE {mailbox.folder}")
        _, answered = client.response("UIDVALIDITY")
        validity = int(bytes(answered[-1]).decode("ascii")) if answered and answered[-1] else 0
        cursor = ledger.imap_cursor(mailbox.name)
        last = cursor[1] if cursor is not None and cursor[0] == validity else 0
        typ, data = client.uid("SEARCH", f"UID {last + 1}:*")
        _ok(typ, data, "UID SEARCH")
        uids = sorted(int(u) for u in (data[0] or b"").split() if int(u) > last)
        reading = Reading()
        newest = last
        for start in range(0, len(uids), settings.batch):
            batch = uids[start : start + settings.batch]
            typ, data = client.uid(
                "FETCH", ",".join(str(u) for u in batch), f"(UID BODY.PEEK[]<0.{MAX_MESSAGE_BYTES + 1}>)"
            )
            _ok(typ, data, "UID FETCH")
            for uid, raw in _fetched(list(data)):
                reading.add(read_message(raw, "imap"))
                newest = max(newest, uid)
        return ImapRead(reading, newest, validity, len(uids))
    except (OSError, imaplib.IMAP4.error) as error:  # a timeout is an OSError
        raise DunningError(f"IMAP {mailbox.host}:{mailbox.port}: {for_terminal(str(error))[:200]}") from None
    finally:
        with contextlib.suppress(OSError, imaplib.IMAP4.error):
            client.logout()


def commit_cursor(ledger: Ledger, mailbox: Mailbox, read: ImapRead, at: dt.datetime) -> None:
    """Move the folder's cursor past what was read and recorded."""
    ledger.set_imap_cursor(mailbox.name, read.uidvalidity, read.last_uid, at)
