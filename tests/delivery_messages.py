"""Delivery reports as mail servers write them, for the feedback tests: RFC 3464 DSNs and RFC 5965 ARF complaints,
built with the standard `email` package, and Resend webhook events in Resend's documented shape."""

from __future__ import annotations

import mailbox
from email.message import EmailMessage, Message
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from pathlib import Path


def _original_headers(message_id: str | None, to: str) -> str:
    lines = [f"To: {to}", "From: billing@example.com", "Subject: Acme: a reminder about invoice in_1"]
    if message_id:
        lines.append(f"Message-ID: {message_id}")
    return "\r\n".join(lines) + "\r\n"


DATE = "Thu, 05 Nov 2026 10:00:00 +0000"


def dsn(recipient: str, message_id: str | None, *, status: str = "5.1.1", action: str = "failed",
        diagnostic: str = "smtp; 550 5.1.1 user unknown", date: str = DATE) -> bytes:  # fmt: skip
    """A bounce as Postfix writes it: a human part, the delivery-status part, the original's headers."""
    text = (
        "From: MAILER-DAEMON@mx.example.net\r\nTo: bounces@example.com\r\n"
        "Subject: Undelivered Mail Returned to Sender\r\n"
        f"Date: {date}\r\nMIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=delivery-status; boundary="BOUNDARY"\r\n\r\n'
        "--BOUNDARY\r\nContent-Type: text/plain\r\n\r\n"
        "I'm sorry to have to inform you that your message could not be delivered.\r\n\r\n"
        "--BOUNDARY\r\nContent-Type: message/delivery-status\r\n\r\n"
        "Reporting-MTA: dns; mx.example.net\r\nArrival-Date: Thu, 05 Nov 2026 09:59:58 +0000\r\n\r\n"
        f"Final-Recipient: rfc822; {recipient}\r\nOriginal-Recipient: rfc822;{recipient}\r\n"
        f"Action: {action}\r\nStatus: {status}\r\nDiagnostic-Code: {diagnostic}\r\n\r\n"
        "--BOUNDARY\r\nContent-Type: text/rfc822-headers\r\n\r\n"
        f"{_original_headers(message_id, recipient)}\r\n"
        "--BOUNDARY--\r\n"
    )
    return text.encode("utf-8", "surrogateescape")


def arf(recipient: str, message_id: str | None, *, original_rcpt: bool = True) -> bytes:
    """A complaint as a mailbox provider's feedback loop sends it."""
    rcpt = f"Original-Rcpt-To: {recipient}\r\n" if original_rcpt else ""
    text = (
        "From: fbl@isp.example\r\nTo: abuse@example.com\r\nSubject: Abuse report\r\n"
        "Date: Fri, 06 Nov 2026 08:00:00 +0000\r\nMIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=feedback-report; boundary="ARF"\r\n\r\n'
        "--ARF\r\nContent-Type: text/plain\r\n\r\nThis is an email abuse report.\r\n\r\n"
        "--ARF\r\nContent-Type: message/feedback-report\r\n\r\n"
        f"Feedback-Type: abuse\r\nUser-Agent: SomeGenerator/1.0\r\nVersion: 1\r\n{rcpt}\r\n"
        "--ARF\r\nContent-Type: text/rfc822-headers\r\n\r\n"
        f"{_original_headers(message_id, recipient)}\r\n"
        "--ARF--\r\n"
    )
    return text.encode()


def plain_reply(text: str = "Thanks, paid yesterday.") -> bytes:
    message = EmailMessage()
    message["From"] = "ada@example.com"
    message["To"] = "billing@example.com"
    message["Subject"] = "Re: your reminder"
    message.set_content(text)
    return message.as_bytes()


def nested(depth: int) -> bytes:
    """multipart/report nested `depth` levels deep (a parser bomb)."""
    inner: Message = MIMEText("x")
    for _ in range(depth):
        outer = MIMEMultipart("mixed")
        outer.attach(inner)
        inner = outer
    top = MIMEMultipart("report", report_type="delivery-status")
    top.attach(inner)
    return top.as_bytes()


def nested_raw(depth: int, size: int = 0) -> bytes:
    """A multipart/report with `depth` levels of multipart/mixed inside, written as bytes (the `email` package cannot
    write one that deep), padded with text lines to at least `size` bytes: the bounce that stalled an import."""
    head = [
        "From: MAILER-DAEMON@evil.example\r\nTo: bounces@example.com\r\nSubject: Undelivered Mail\r\n"
        'MIME-Version: 1.0\r\nContent-Type: multipart/report; report-type=delivery-status; boundary="b0"\r\n\r\n'
    ]
    for level in range(1, depth + 1):
        head.append(f'--b{level - 1}\r\nContent-Type: multipart/mixed; boundary="b{level}"\r\n\r\n')
    inner = f"--b{depth}\r\nContent-Type: text/plain\r\n\r\nx\r\n"
    tail = "".join(f"--b{level}--\r\n" for level in range(depth, -1, -1))
    padding = max(0, size - len("".join(head)) - len(inner) - len(tail))
    filler = ("filler text line\r\n" * (padding // 18 + 1)) if padding else ""
    return ("".join(head) + inner + filler + tail).encode()


def write_mbox(path: Path, messages: list[bytes]) -> Path:
    box = mailbox.mbox(path)
    try:
        for raw in messages:
            box.add(raw)
        box.flush()
    finally:
        box.close()
    return path


def write_maildir(path: Path, messages: list[bytes]) -> Path:
    box = mailbox.Maildir(path, create=True)
    try:
        for raw in messages:
            box.add(raw)
    finally:
        box.close()
    return path


def resend_event(kind: str, email_id: str, to: str, *, bounce_type: str = "Permanent",
                 created_at: str = "2026-11-05T10:00:00.000Z") -> dict:  # fmt: skip
    data: dict = {"email_id": email_id, "from": "Acme <billing@example.com>", "to": [to], "created_at": created_at,
                  "subject": "Acme: a reminder about invoice in_1"}  # fmt: skip
    if kind == "email.bounced":
        data["bounce"] = {"message": "The recipient's mailbox does not exist.", "subType": "General",
                          "type": bounce_type}  # fmt: skip
    return {"type": kind, "created_at": created_at, "data": data}
