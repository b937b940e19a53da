"""What a template sees: the variables of each kind of email, formatted for the email's locale.

Amounts stay integers in minor units until here, where they are rendered with
the currency's real exponent through Babel (JPY has none, USD two), never with
hand-written arithmetic on floats; dates are Babel's `medium` format of the
locale (`Nov 1, 2026`, `01.11.2026`). Every value a template gets is built
here, once per email, as plain strings, numbers and lists: templates call no
code of ours.

The same builders make the sample contexts `dunning.email.templating` renders every
template against when the config loads, so "every variable the code provides"
is exactly what these functions return; the README's table of template
variables lists them.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections import defaultdict
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, Protocol

import babel
import babel.dates
import babel.numbers

from dunning.email.locales import language_of
from dunning.email.pay_links import https_url
from dunning.vocabulary import EmailKind, Tone

TONE_ORDER = {Tone.GENTLE: 0, Tone.FIRM: 1, Tone.FINAL: 2}
Context = dict[str, Any]


@functools.cache
def _number_format(currency: str, locale: str) -> tuple[babel.numbers.NumberPattern, babel.Locale, int]:
    """The currency's exponent and a plain number pattern with that many decimals, parsed once per currency."""
    digits = babel.numbers.get_currency_precision(currency)
    pattern = babel.numbers.parse_pattern("#,##0" + ("." + "0" * digits if digits else ""))
    return pattern, babel.Locale.parse(locale), digits


def format_amount(amount_minor: int, currency: str, locale: str = "en_US") -> str:
    """`12345, "USD"` -> `123.45 USD` (`de_DE`: `123,45 USD`): the ISO code is never ambiguous, a `$` is."""
    fast = _plain_format(currency, locale)
    if fast is not None:
        return f"{fast(int(amount_minor))} {currency}"
    pattern, parsed_locale, digits = _number_format(currency, locale)
    value = Decimal(int(amount_minor)).scaleb(-digits)
    return f"{pattern.apply(value, parsed_locale)} {currency}"


_PROBES = (0, 1, 7, 42, 99, 100, 999, 1000, 1234, 12345, 99999, 100000, 1234567, 10**9 + 7, 123456789012, 10**15)


@functools.cache
def _plain_format(currency: str, locale: str) -> Callable[[int], str] | None:
    """What Babel writes for an amount of `currency` in `locale`, with Python's integer formatting: the locale's
    group and decimal symbols and minus sign around groups of three digits. A fifth of the time to render a
    reminder went to Babel's general number formatting. Used only where it gives Babel's text on every probe, a
    positive and a negative of each length up to 16 digits; any other locale (other digits, other grouping) keeps
    Babel."""
    pattern, parsed_locale, digits = _number_format(currency, locale)
    try:
        group = babel.numbers.get_group_symbol(parsed_locale)
        decimal = babel.numbers.get_decimal_symbol(parsed_locale)
        minus = babel.numbers.get_minus_sign_symbol(parsed_locale)
    except (KeyError, ValueError):
        return None
    scale = 10**digits

    def plain(minor: int) -> str:
        whole, fraction = divmod(abs(minor), scale)
        text = f"{whole:,}".replace(",", group) + (f"{decimal}{fraction:0{digits}d}" if digits else "")
        return minus + text if minor < 0 else text

    for probe in (*_PROBES, *(-p for p in _PROBES if p)):
        if plain(probe) != pattern.apply(Decimal(probe).scaleb(-digits), parsed_locale):
            return None
    return plain


@functools.lru_cache(maxsize=8192)
def format_day(day: dt.date, locale: str) -> str:
    """`2026-11-01` -> `Nov 1, 2026` (en_US), `01.11.2026` (de_DE); cached: a batch repeats few dates."""
    return babel.dates.format_date(day, "medium", locale=locale)


def _day(value: Any, locale: str) -> tuple[str, str]:
    """A date as (formatted, ISO); a value that is not a date is shown as given."""
    if isinstance(value, dt.datetime):
        value = value.date()
    if isinstance(value, dt.date):
        return format_day(value, locale), value.isoformat()
    return str(value), str(value)


def format_moment(moment: dt.datetime, locale: str) -> str:
    """A UTC time to the minute: `Nov 8, 2026, 9:05 AM UTC`, `08.11.2026, 09:05 UTC`."""
    parsed = babel.Locale.parse(locale)
    time = babel.dates.format_time(moment, "short", tzinfo=dt.UTC, locale=parsed)
    day = babel.dates.format_date(moment.astimezone(dt.UTC).date(), "medium", locale=parsed)
    return f"{parsed.datetime_formats['medium'].format(time, day)} UTC"


def currency_totals(
    rows: Sequence[dict[str, Any]], locale: str, amount_field: str = "amount_minor"
) -> list[dict[str, str]]:
    totals: dict[str, int] = defaultdict(int)
    for r in rows:
        totals[r["currency"]] += int(r[amount_field])
    return [{"currency": c, "amount": format_amount(v, c, locale)} for c, v in sorted(totals.items())]


DEFAULT_SIGNATURE = "Billing team"
# the default signature in each packaged language (an operator's own `signature` is used as it is, in every one)
_DEFAULT_SIGNATURES = {"en": DEFAULT_SIGNATURE, "de": "Ihre Buchhaltung"}


class _Signer(Protocol):
    @property
    def company_name(self) -> str | None: ...

    @property
    def signature(self) -> str: ...


def signing(sender: _Signer, locale: str) -> Context:
    """Who signs an email, as every template sees it: `company_name` (None when not configured) and `signature`
    (the configured one, or the default in the email's language)."""
    signature = sender.signature
    if signature == DEFAULT_SIGNATURE:
        signature = _DEFAULT_SIGNATURES.get(language_of(locale), DEFAULT_SIGNATURE)
    return {"company_name": sender.company_name, "signature": signature}


def _common(locale: str, as_of: dt.datetime | None = None) -> Context:
    context: Context = {"locale": locale, "language": language_of(locale)}
    # who signs: the defaults, so a template checked on samples sees them; each email's own come from its sender
    context["company_name"] = None
    context["signature"] = _DEFAULT_SIGNATURES.get(context["language"], DEFAULT_SIGNATURE)
    if as_of is not None:
        context["as_of_date"], context["as_of_date_iso"] = _day(as_of.date(), locale)
    return context


def _invoice_line(r: dict[str, Any], locale: str) -> dict[str, Any]:
    due, due_iso = _day(r["due_date"], locale)
    paid = r["amount_paid"]
    return {
        "invoice_id": r["invoice_id"],
        "billing_period": r.get("billing_period"),
        "due_date": due,
        "due_date_iso": due_iso,
        "days_overdue": r["days_overdue"],
        "remaining": format_amount(r["amount_minor"], r["currency"], locale),
        # the templates show these only after a partial payment; most invoices have none
        "amount_due": format_amount(r["amount_due"], r["currency"], locale) if paid else None,
        "amount_paid": format_amount(paid, r["currency"], locale) if paid else None,
        "amount_paid_minor": paid,
        "payment_url": https_url(r.get("payment_url")),
    }


def first_contact(rows: Sequence[dict[str, Any]]) -> bool:
    """No reminder reached the customer earlier in the cycle of any invoice of this email (adopted ones count)."""
    return all(not r.get("reminders_sent_before") for r in rows)


def reminder_tone(rows: Sequence[dict[str, Any]]) -> Tone:
    """The firmest tone among the invoices of one email; gentle for a first contact under a policy whose
    `first_contact_tone` is `gentle` (the default): the stage recorded is still the highest reached."""
    if first_contact(rows) and all(r.get("gentle_first", False) for r in rows):
        return Tone.GENTLE
    return max((Tone(r["tone"]) for r in rows), key=TONE_ORDER.__getitem__)


def _reminder_line(r: dict[str, Any], locale: str) -> dict[str, Any]:
    """An invoice of a reminder: its line, its place in the cycle, and the late fees this email claims on it
    (`dunning.fees`): `fees` (each `kind`, `label`, `amount_minor`, `currency`, `amount`, `basis`),
    `interest_to_date` (the interest claimed, formatted, or None) and `total_claimed` (the remaining balance and the
    fees, formatted, or None without fees). `remaining` stays the invoice's own remaining balance."""
    line = _invoice_line(r, locale)
    days = int(r["days_overdue"])
    fees = [_fee_line(f, locale) for f in r.get("fees") or []]
    interest = [f for f in fees if f["kind"] == _fees().INTEREST] if fees else []
    same = [f["amount_minor"] for f in fees if f["currency"] == r["currency"]]
    line.update(
        stage=r.get("stage"),
        stage_index=r.get("stage_rank"),
        stage_count=r.get("stage_count"),
        reminders_sent_before=int(r.get("reminders_sent_before") or 0),
        days_until_due=-days,
        fees=fees,
        interest_to_date=interest[0]["amount"] if interest else None,
        total_claimed=format_amount(int(r["amount_minor"]) + sum(same), r["currency"], locale) if fees else None,
    )
    return line


def _fees() -> Any:
    """`dunning.fees.amounts` (the config's models come with it), imported by the first email that states a fee: a
    render worker making reminders without fees imports neither it nor pydantic (0.1 s of each worker's start)."""
    from dunning.fees import amounts

    return amounts


def _fee_line(fee: dict[str, Any], locale: str) -> dict[str, Any]:
    all_labels = _fees().LABELS
    labels = all_labels.get(language_of(locale), all_labels["en"])
    return {
        "kind": fee["kind"], "label": labels.get(fee["kind"], fee["kind"]), "amount_minor": fee["amount_minor"],
        "currency": fee["currency"], "amount": format_amount(int(fee["amount_minor"]), fee["currency"], locale),
        "basis": fee.get("basis"), "law": fee.get("law"),
    }  # fmt: skip


def broken_promise(rows: Sequence[dict[str, Any]], locale: str) -> Context | None:
    """The promise to pay this reminder follows up on (`dunning.desk.promises`: broken, no reminder since): its
    `until` date and promised `amount` (None when the promise named none), else None. The latest of the email's."""
    broken = [r for r in rows if r.get("broken_promise_until") is not None]
    if not broken:
        return None
    latest = max(broken, key=lambda r: r["broken_promise_until"])
    until, until_iso = _day(latest["broken_promise_until"], locale)
    amount = latest.get("broken_promise_amount_minor")
    return {
        "until": until,
        "until_iso": until_iso,
        "amount_minor": amount,
        "amount": format_amount(amount, latest["currency"], locale) if amount is not None else None,
    }


def reminder_context(rows: Sequence[dict[str, Any]], as_of: dt.datetime, locale: str) -> Context:
    """One reminder: `rows` are its invoices, one per row, sorted by invoice id."""
    invoices = [_reminder_line(r, locale) for r in rows]
    fees = [dict(f, invoice_id=i["invoice_id"]) for i in invoices for f in i["fees"]]
    return {
        "fees": fees,
        "fee_law": next((f["law"] for f in fees if f.get("law")), None),
        # of a one-invoice email (per invoice in `invoices` otherwise): the interest claimed and the total claimed
        "interest_to_date": invoices[0]["interest_to_date"] if len(invoices) == 1 else None,
        "total_claimed": invoices[0]["total_claimed"] if len(invoices) == 1 else None,
        "broken_promise": broken_promise(rows, locale),
        "customer_name": rows[0].get("customer_name"),
        "tone": str(reminder_tone(rows)),
        "first_contact": first_contact(rows),
        "policy": rows[0].get("policy") or "default",
        "invoices": invoices,
        # every invoice of the email is not yet overdue (due today or later): the "ahead of the due date" wording
        "upcoming": all(i["days_until_due"] >= 0 for i in invoices),
        "any_payment_url": any(i["payment_url"] for i in invoices),
        "totals": currency_totals(rows, locale),
        # the link for the button of a one-invoice email
        "payment_url": invoices[0]["payment_url"] if len(invoices) == 1 else None,
        **_common(locale, as_of),
    }


def invoice_context(rows: Sequence[dict[str, Any]], as_of: dt.datetime, locale: str) -> Context:
    """One invoice email: `rows` are the invoices newly issued to one customer, sorted by invoice id. Each shows its
    lines when the snapshot has them (`invoice_lines`), its total, what is already paid, its due date and pay link."""
    from dunning.plan.invoice_emails import invoice_lines  # polars and the config: only for invoice emails

    invoices = []
    for r in rows:
        line = _invoice_line(r, locale)
        lines = invoice_lines(r.get("invoice_lines"))
        line["total"] = format_amount(r["amount_due"], r["currency"], locale)
        line["lines"] = [
            {
                "description": item["description"],
                "quantity": item["quantity"],
                "amount": format_amount(item["amount_minor"], r["currency"], locale),
            }
            for item in lines or []
        ]
        invoices.append(line)
    return {
        "customer_name": rows[0].get("customer_name"),
        "invoices": invoices,
        "totals": currency_totals(rows, locale),
        "payment_url": invoices[0]["payment_url"] if len(invoices) == 1 else None,
        **_common(locale, as_of),
    }


def apology_context(
    flood: dict[str, Any], statement: Sequence[dict[str, Any]], as_of: dt.datetime, locale: str
) -> Context:
    """One apology: what happened (`flood`: emails, first_at, last_at) and what is owed now (`statement` rows)."""
    invoices = []
    for r in statement:
        due, due_iso = _day(r["due_date"], locale)
        invoices.append(
            {
                "invoice_id": r["invoice_id"],
                "due_date": due,
                "due_date_iso": due_iso,
                "remaining": format_amount(r["remaining_minor"], r["currency"], locale),
                "payment_url": https_url(r.get("payment_url")),
            }
        )
    return {
        "customer_name": flood.get("customer_name"),
        "emails": flood["emails"],
        "first_at": format_moment(flood["first_at"], locale),
        "last_at": format_moment(flood["last_at"], locale),
        "invoices": invoices,
        "any_payment_url": any(i["payment_url"] for i in invoices),
        "totals": currency_totals(statement, locale, amount_field="remaining_minor"),
        **_common(locale, as_of),
    }


def payment_failed_context(record: dict[str, Any], locale: str) -> Context:
    """The notice for one `invoice.payment_failed` event; `amount` is None when the event did not say."""
    amount = record.get("amount_minor")
    return {
        "customer_name": record.get("customer_name"),
        "invoice_id": record["invoice_id"],
        "amount": format_amount(amount, record["currency"], locale)
        if amount is not None and record.get("currency")
        else None,
        "payment_url": https_url(record.get("payment_url")),
        **_common(locale),
    }


# Samples for validating templates: every branch a template is likely to take (each tone, one invoice and
# several, a partial payment, with and without a name, a pay link and an amount), built by the builders above
_SAMPLE_AS_OF = dt.datetime(2026, 11, 8, 9, 30, tzinfo=dt.UTC)
_SAMPLE_URL = "https://pay.example.com/invoice/in_sample?s=1"


def _sample_row(
    invoice_id: str, tone: str, *, paid: int, url: str | None, name: str | None, days: int = 7, before: int = 0
) -> dict[str, Any]:
    return {
        "invoice_id": invoice_id,
        "customer_name": name,
        "currency": "EUR",
        "amount_minor": 123456 - paid,
        "amount_due": 123456,
        "amount_paid": paid,
        "due_date": dt.date(2026, 11, 1),
        "days_overdue": days,
        "tone": tone,
        "stage": "day7" if days > 0 else "before_due",
        "stage_rank": 2 if days > 0 else 1,
        "stage_count": 3,
        "reminders_sent_before": before,
        "gentle_first": True,
        "policy": "default",
        "billing_period": "2026-10" if paid else None,
        "payment_url": url,
    }


def sample_contexts(kind: EmailKind, locale: str) -> list[Context]:
    if kind is EmailKind.REMINDER:
        samples = []
        for tone in Tone:
            one = [_sample_row("in_1", tone, paid=2000, url=_SAMPLE_URL, name="Ada", before=1)]
            several = [
                _sample_row("in_1", tone, paid=0, url=None, name=None, before=2),
                _sample_row("in_2", tone, paid=500, url=_SAMPLE_URL, name=None),
            ]
            samples += [reminder_context(one, _SAMPLE_AS_OF, locale), reminder_context(several, _SAMPLE_AS_OF, locale)]
        # before the due date, a first contact: one invoice and several (one due today)
        ahead = [_sample_row("in_1", "gentle", paid=0, url=_SAMPLE_URL, name="Ada", days=-3)]
        today = [_sample_row("in_1", "gentle", paid=0, url=None, name=None, days=-3),
                 _sample_row("in_2", "gentle", paid=0, url=None, name=None, days=0)]  # fmt: skip
        # one invoice overdue and one not due yet, in one email: not "upcoming"
        mixed = [_sample_row("in_1", "gentle", paid=0, url=None, name="Ada", days=7),
                 _sample_row("in_2", "gentle", paid=0, url=_SAMPLE_URL, name="Ada", days=-3)]  # fmt: skip
        samples += [reminder_context(ahead, _SAMPLE_AS_OF, locale), reminder_context(today, _SAMPLE_AS_OF, locale),
                    reminder_context(mixed, _SAMPLE_AS_OF, locale)]  # fmt: skip
        # after a broken promise to pay, with and without a promised amount
        promised = dict(one[0], broken_promise_until=dt.date(2026, 11, 6), broken_promise_amount_minor=50000)
        vague = dict(one[0], broken_promise_until=dt.date(2026, 11, 6), broken_promise_amount_minor=None)
        samples += [
            reminder_context([promised], _SAMPLE_AS_OF, locale),
            reminder_context([vague], _SAMPLE_AS_OF, locale),
        ]
        return samples
    if kind is EmailKind.APOLOGY:
        flood = {"customer_name": "Ada", "emails": 12, "first_at": _SAMPLE_AS_OF, "last_at": _SAMPLE_AS_OF}
        owed = {"invoice_id": "in_1", "due_date": dt.date(2026, 11, 1), "remaining_minor": 123456, "currency": "EUR"}
        return [
            apology_context(flood, [dict(owed, payment_url=_SAMPLE_URL), owed], _SAMPLE_AS_OF, locale),
            apology_context(dict(flood, customer_name=None), [], _SAMPLE_AS_OF, locale),
        ]
    if kind is EmailKind.INVOICE:
        items = (
            '[{"description": "Pro plan", "amount": 100000, "quantity": 1}, {"description": "Seats", "amount": 23456}]'
        )
        issued = _sample_row("in_1", "gentle", paid=0, url=_SAMPLE_URL, name="Ada")
        first_of_two = _sample_row("in_1", "gentle", paid=0, url=None, name=None)
        second_of_two = _sample_row("in_2", "gentle", paid=500, url=_SAMPLE_URL, name=None)
        return [
            invoice_context([dict(issued, invoice_lines=items, days_overdue=-14)], _SAMPLE_AS_OF, locale),
            invoice_context(
                [dict(first_of_two, days_overdue=0), dict(second_of_two, invoice_lines=items)], _SAMPLE_AS_OF, locale
            ),
        ]
    notice = {"customer_name": "Ada", "invoice_id": "in_1", "amount_minor": 123456, "currency": "EUR"}
    return [
        payment_failed_context(dict(notice, payment_url=_SAMPLE_URL), locale),
        payment_failed_context(dict(notice, customer_name=None, amount_minor=None), locale),
    ]
