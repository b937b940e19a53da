"""One sample email through the configured provider, to see in a real mailbox what customers will get.

`dunning test-send --to you@example.com` renders a sample of one kind (a
reminder unless `--kind` says otherwise; `--stage` picks the reminder's stage
and so its tone; `--locale` the language) with the deployment's own templates,
sender and provider, marks it (`Subject` starts `[TEST] `, header
`X-Dunning-Test: 1`, keys `test:…`, a Message-ID of its own) and hands it to
the provider. It touches no ledger: a test email is never a row in
`reminder_ledger`, never counted by the breaker, never resent.
"""

from __future__ import annotations

import datetime as dt
import uuid
from email.header import decode_header, make_header
from email.message import Message
from pathlib import Path
from typing import Any

from dunning.config import DunningConfig
from dunning.email.render import apology_email, invoice_email, payment_failed_email, reminder_email
from dunning.errors import UserInputError
from dunning.plan.policies import stages_frame
from dunning.safe_text import header_value, is_address
from dunning.send.providers.base import SendOutcome
from dunning.send.providers.factory import build_provider
from dunning.send.sending import sender_of
from dunning.vocabulary import EmailKind

TEST_HEADER = "X-Dunning-Test"
TEST_PREFIX = "[TEST] "
KINDS = tuple(str(k) for k in EmailKind if k in (EmailKind.REMINDER, EmailKind.INVOICE, EmailKind.PAYMENT_FAILED,
                                                  EmailKind.APOLOGY))  # fmt: skip


def _row(to: str, key: str, tone: str, days_overdue: int) -> dict[str, Any]:
    return {
        "invoice_id": "in_test_0001",
        "customer_id": "cus_test",
        "customer_email": to,
        "customer_name": "Ada Lovelace",
        "currency": "EUR",
        "amount_minor": 121456,
        "remaining_minor": 121456,
        "amount_due": 123456,
        "amount_paid": 2000,
        "due_date": dt.date.today() - dt.timedelta(days=days_overdue),
        "days_overdue": days_overdue,
        "tone": tone,
        "stage": "test",
        "billing_period": None,
        "payment_url": None,
        "idempotency_key": key,
        "kind": "reminder",
    }


def sample_message(
    kind: str, to: str, config: DunningConfig, *, stage: str | None = None, locale: str | None = None
) -> Message:
    """The marked sample email of `kind` for `to`; UserInputError for an address that is not one, or a stage the
    config does not have."""
    if not is_address(to):
        raise UserInputError(f"--to {to!r} is not one plain address such as you@example.com")
    token = uuid.uuid4().hex[:16]
    key = f"test:{kind}:{token}"
    message_id = f"<test-{token}@{config.provider.message_domain}>"
    as_of = dt.datetime.now(dt.UTC)
    stages = stages_frame(config).unique("stage", keep="last", maintain_order=True)  # a name: one day everywhere
    chosen = stages.filter(stages["stage"] == stage) if stage else stages.filter(stages["policy"] == "default").head(1)
    if chosen.is_empty():
        raise UserInputError(f"--stage {stage!r} is not a configured stage: {', '.join(stages['stage'].to_list())}")
    tone, days = str(chosen["tone"][0]), int(chosen["stage_days"][0])
    sender, language, templates = sender_of(config), locale or config.locale, config.templates_dir
    row = _row(to, key, tone, days)
    if kind == EmailKind.INVOICE:
        message = invoice_email([dict(row, kind="invoice")], sender=sender, message_id=message_id, as_of=as_of,
                                locale=language, templates_dir=templates)  # fmt: skip
    elif kind == EmailKind.PAYMENT_FAILED:
        message = payment_failed_email(dict(row, kind="payment_failed", message_id=message_id), sender=sender,
                                       as_of=as_of, locale=language, templates_dir=templates)  # fmt: skip
    elif kind == EmailKind.APOLOGY:
        flood = {"customer_name": "Ada Lovelace", "emails": 3, "first_at": as_of, "last_at": as_of}
        statement = [{"invoice_id": "in_test_0001", "due_date": row["due_date"], "remaining_minor": 121456,
                      "currency": "EUR"}]  # fmt: skip
        message = apology_email(flood, statement, to=to, sender=sender, key=key, message_id=message_id, as_of=as_of,
                                locale=language, templates_dir=templates)  # fmt: skip
    else:
        message = reminder_email([row], sender=sender, message_id=message_id, as_of=as_of, locale=language,
                                 templates_dir=templates)  # fmt: skip
    return marked(message)


def marked(message: Message) -> Message:
    """`message` as a test: the Subject prefixed `[TEST] `, `X-Dunning-Test: 1` beside the other headers."""
    subject = str(make_header(decode_header(str(message["Subject"]))))
    del message["Subject"]
    message["Subject"] = header_value("Subject", TEST_PREFIX + subject)  # type: ignore[assignment]
    message[TEST_HEADER] = "1"
    return message


def send_sample(message: Message, config: DunningConfig, home: Path) -> SendOutcome:
    """The sample handed to the configured provider (built here: only this needs its secrets)."""
    with build_provider(config.provider, home) as provider:
        return provider.send(message)
