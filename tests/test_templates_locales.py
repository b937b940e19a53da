"""Operator templates (sandboxed, checked when the config loads), per-customer languages, From name and Reply-To."""

import datetime as dt
import email
import json
from email import policy
from pathlib import Path

import pytest

import dunning.email as templates_package
from dunning.config import parse_config
from dunning.email.locales import email_locale, known_locale
from dunning.email.render import WIRE_POLICY, Sender, apology_email, payment_failed_email, reminder_email
from dunning.email.templating import TEMPLATE_NAMES, check_templates
from dunning.errors import ConfigError
from dunning.run.settings import parse_settings
from tests.conftest import invoice
from tests.helpers import reminder_row
from tests.smtp_server import ScriptedHandler, SmtpServer
from tests.stripe_server import KEY, FakeStripe, fixture_invoice, payment_failed_event, stripe_invoice

AS_OF = dt.datetime(2026, 11, 8, tzinfo=dt.UTC)
RUN_AT = "2026-11-05T09:00:00Z"
PAY = "https://pay.example.com/in_de?s=1&t=2"


def parse(message) -> email.message.EmailMessage:
    return email.message_from_bytes(message.as_bytes(policy=WIRE_POLICY), policy=policy.default)


def text_of(message) -> str:
    return message.get_body(("plain",)).get_content().replace("\r\n", "\n")


def html_of(message) -> str:
    return message.get_body(("html",)).get_content().replace("\r\n", "\n")


def write_templates(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return root


def config_file(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# --- packaged templates and languages ---------------------------------------------------------------------------


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_every_packaged_template_passes_the_check_it_imposes_on_operators():
    check_templates(None, "en_US")
    check_templates(None, "de_DE")
    packaged = Path(__file__).parents[1] / "dunning" / "email" / "templates"
    for language in ("", "de"):
        assert {p.name for p in (packaged / language).glob("*.j2")} == set(TEMPLATE_NAMES)


@pytest.mark.parametrize(
    "value, expected",
    [("de_DE", "de_DE"), ("de-DE", "de_DE"), ("de", "de"), ("pt-BR", "pt_BR"), ("xx_YY", None), ("klingon", None),
     ("", None), ("de\nDE", None), (None, None), (42, None), ("d" * 100, None)],
)  # fmt: skip
def test_locales_are_read_with_babel_and_unknown_ones_are_none(value, expected):
    assert known_locale(value) == expected


def test_an_email_takes_the_locale_of_its_smallest_invoice_id_that_has_a_known_one():
    rows = [
        {"invoice_id": "in_3", "customer_locale": "fr_FR"},
        {"invoice_id": "in_1", "customer_locale": "xx_YY"},
        {"invoice_id": "in_2", "customer_locale": "de_DE"},
    ]
    assert email_locale(rows, "en_US") == "de_DE"
    assert email_locale(list(reversed(rows)), "en_US") == "de_DE"  # whatever order the snapshot gave
    assert email_locale([{"invoice_id": "in_1", "customer_locale": None}], "en_GB") == "en_GB"


def test_a_german_reminder_is_german_with_german_numbers_and_dates():
    message = parse(
        reminder_email(
            [reminder_row(customer_locale="de_DE", currency="EUR", amount_minor=123456, payment_url=PAY)],
            sender="b@example.com",
            message_id="<de@example.com>",
            as_of=AS_OF,
        )
    )
    assert message["Subject"] == "Zweite Erinnerung: Rechnung in_1 ist noch unbezahlt"
    text = text_of(message)
    assert "Guten Tag Ada," in text and "fällig am 01.11.2026" in text
    assert "1.234,56 EUR offen (von 123,45 EUR; 20,00 EUR erhalten)" in text
    assert f"Online bezahlen: {PAY}" in text and "Beträge mit Stand vom 08.11.2026." in text
    assert '<html lang="de">' in html_of(message) and "Rechnung in_1 bezahlen</a>" in html_of(message)


def test_the_config_locale_is_the_default_language():
    german = parse(reminder_email([reminder_row()], sender="b@example.com", message_id="<d@x.com>", as_of=AS_OF,
                                  locale="de_DE"))  # fmt: skip
    english = parse(reminder_email([reminder_row(customer_locale="en_GB")], sender="b@example.com",
                                   message_id="<d@x.com>", as_of=AS_OF, locale="de_DE"))  # fmt: skip
    assert german["Subject"].startswith("Zweite Erinnerung") and "103,45 USD" in text_of(german)
    assert english["Subject"].startswith("Second reminder") and "due 1 Nov 2026" in text_of(english)


def test_notices_and_apologies_speak_german_too():
    notice = parse(
        payment_failed_email(
            {
                "customer_name": None,
                "invoice_id": "in_1",
                "amount_minor": 123456,
                "currency": "EUR",
                "customer_email": "ada@example.com",
                "message_id": "<p@example.com>",
                "idempotency_key": "event:evt_1",
                "customer_locale": "de-DE",
                "payment_url": PAY,
            },  # fmt: skip
            sender="b@example.com",
            as_of=AS_OF,
        )
    )
    assert notice["Subject"] == "Zahlung für Rechnung in_1 fehlgeschlagen"
    assert "Guten Tag," in text_of(notice) and "Der Betrag von 1.234,56 EUR ist weiterhin fällig." in text_of(notice)
    assert f"Rechnung online bezahlen: {PAY}" in text_of(notice)
    flood = {"customer_name": "Ada", "emails": 9, "customer_locale": "de_DE",
             "first_at": dt.datetime(2026, 11, 7, 6, 5, tzinfo=dt.UTC), "last_at": AS_OF}  # fmt: skip
    owed = [{"invoice_id": "in_1", "due_date": dt.date(2026, 11, 1), "remaining_minor": 500, "currency": "EUR"}]
    apology = parse(apology_email(flood, owed, to="ada@example.com", sender="b@example.com", key="apology:i:c",
                                  message_id="<a@example.com>", as_of=AS_OF))  # fmt: skip
    assert apology["Subject"] == "Entschuldigung für die Zahlungs-E-Mails, die Sie erhalten haben"
    assert "Zwischen 07.11.2026, 06:05 UTC und 08.11.2026, 00:00 UTC" in text_of(apology)
    assert "- Rechnung in_1, fällig am 01.11.2026: 5,00 EUR offen" in text_of(apology)


def test_the_same_inputs_give_the_same_bytes():
    def build() -> bytes:
        rows = [reminder_row(customer_locale="de_DE", payment_url=PAY), reminder_row(invoice_id="in_0", tone="final")]
        sender = Sender("billing@example.com", "Müller & Söhne GmbH", "ar@example.com")
        return reminder_email(rows, sender=sender, message_id="<s@example.com>", as_of=AS_OF).as_bytes(
            policy=WIRE_POLICY
        )

    assert build() == build()


# --- From name and Reply-To --------------------------------------------------------------------------------------


NAMES = ["Müller & Söhne GmbH", 'Acme, "Billing" <Dept>', 'Zoë "Ünïcode", <x> \\ Søn', "Acme"]


@pytest.mark.parametrize("name", NAMES)
def test_the_from_name_is_encoded_and_reads_back_exactly(name):
    sender = Sender("billing@example.com", name, "ar@example.com")
    message = reminder_email([reminder_row()], sender=sender, message_id="<f@example.com>", as_of=AS_OF)
    raw = message.as_bytes(policy=WIRE_POLICY)
    assert raw.split(b"\r\n\r\n", 1)[0].isascii()  # RFC 2047 or a quoted string, never raw UTF-8 in a header
    parsed = parse(message)
    [address] = parsed["From"].addresses
    assert (address.display_name, address.addr_spec) == (name, "billing@example.com")
    assert [a.addr_spec for a in parsed["Reply-To"].addresses] == ["ar@example.com"]
    assert parsed.get_all("To") == ["ada@example.com"] and parsed.get_all("Bcc") is None


@pytest.mark.parametrize(
    "provider, key",
    [
        ('{from_name: "Acme\\r\\nBcc: x@evil.test"}', "provider.from_name"),
        ('{from_name: "Acme\\nBilling"}', "provider.from_name"),
        ('{from_name: "Acme\\u2028Billing"}', "provider.from_name"),
        ("{from_name: " + "x" * 65 + "}", "provider.from_name"),
        ('{reply_to: "ar@example.com\\r\\nBcc: x@evil.test"}', "provider.reply_to"),
        ('{reply_to: "ar@example.com, x@evil.test"}', "provider.reply_to"),
        ('{reply_to: "Accounts <ar@example.com>"}', "provider.reply_to"),
    ],
)
def test_header_injection_through_the_config_is_refused_when_it_loads(deployment, tmp_path, provider, key):
    config = config_file(tmp_path / "conf", f"provider: {provider}\n")
    code, out, err = deployment.run([invoice()], RUN_AT, "--config", str(config))
    assert code == 2 and key in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (deployment.home / "dunning.duckdb").exists() and deployment.outbox() == []


class EnvelopeHandler(ScriptedHandler):
    """The scripted server, also keeping each message's SMTP envelope sender."""

    def __init__(self) -> None:
        super().__init__()
        self.mail_from: list[str] = []

    async def handle_DATA(self, server, session, envelope):
        self.mail_from.append(envelope.mail_from)
        return await super().handle_DATA(server, session, envelope)


@pytest.mark.slow
def test_over_smtp_the_from_header_has_the_name_and_the_envelope_the_bare_address(deployment, tmp_path):
    handler = EnvelopeHandler()
    with SmtpServer(handler) as server:
        config = config_file(
            tmp_path / "conf",
            f"provider: {{kind: smtp, host: 127.0.0.1, port: {server.port}, timeout_seconds: 5, "
            "from: billing@example.com, from_name: 'Acme, \"Billing\" <Dept>', reply_to: ar@example.com}\n",
        )
        code, out, err = deployment.run([invoice()], RUN_AT, "--config", str(config))
    assert code == 0, err
    assert handler.mail_from == ["billing@example.com"]
    [message] = handler.received
    [sender] = message["From"].addresses
    assert (sender.display_name, sender.addr_spec) == ('Acme, "Billing" <Dept>', "billing@example.com")
    assert str(message["Reply-To"]) == "ar@example.com"


# --- operator templates ------------------------------------------------------------------------------------------

BROKEN = [
    # (file, source, what the error names)
    ("reminder.txt.j2", "Hello {{ customer }}\n", ("reminder.txt.j2, line 1", "unknown variable 'customer'")),
    ("reminder.txt.j2", "Hello\n{% if tone == 'never' %}\n{{ bogus }}{% endif %}\n", ("line 3", "'bogus'")),
    ("reminder.html.j2", "<p>\n{% for inv in invoices %}\n{{ inv.invoice_id }\n", ("reminder.html.j2, line 3", "")),
    ("reminder.txt.j2", "{{ invoices[0].nonexistent }}\n", ("reminder.txt.j2, line 1", "nonexistent")),
    ("apology.txt.j2", "{{ ''.__class__.__mro__[1].__subclasses__() }}\n", ("apology.txt.j2, line 1", "unsafe")),
    ("payment_failed.txt.j2", "x\n{{ customer_name.__init__.__globals__ }}\n", ("payment_failed.txt.j2, line 2", "")),
    ("reminder.txt.j2", "{{ invoices.append(1) }}{{ invoices.clear() }}\n", ("reminder.txt.j2, line 1", "unsafe")),
    ("reminder.html.j2", "<p>{{ customer_name|safe }}</p>\n", ("reminder.html.j2, line 1", "safe")),
    ("reminder.html.j2", "{% autoescape false %}{{ customer_name }}{% endautoescape %}\n", ("line 1", "autoescap")),
    ("reminder.html.j2", '{% include "_footer.txt.j2" %}\n', ("line 1", "_footer.txt.j2")),
    ("reminder.txt.j2", "{% include customer_name %}\n", ("line 1", "in quotes")),
    ("reminder.txt.j2", "{{ range(10) | random }}\n", ("line 1", "random")),
    ("reminder.subject.j2", "Reminder\n\nfor {{ customer_name }}\n", ("reminder.subject.j2", "one line")),
    ("remindr.txt.j2", "typo in the name\n", ("remindr.txt.j2", "not a template name")),
    ("DE/reminder.txt.j2", "Hallo\n", ("DE/reminder.txt.j2", "not a locale name")),
    ("de/x/reminder.txt.j2", "Hallo\n", ("reminder.txt.j2", "one language directory deep")),
    ("de/reminder.txt.j2", "Hallo {{ kunde }}\n", ("de/reminder.txt.j2, line 1", "'kunde'")),
]


@pytest.mark.parametrize("name, source, expected", BROKEN, ids=[f"{n}:{s[:20]}" for n, s, _ in BROKEN])
def test_a_broken_template_stops_the_run_before_anything_is_claimed(deployment, tmp_path, name, source, expected):
    write_templates(tmp_path / "conf" / "templates", {name: source, "_footer.txt.j2": "Bye\n"})
    config = config_file(tmp_path / "conf", "templates_dir: templates\n")
    code, out, err = deployment.run([invoice()], RUN_AT, "--config", str(config))
    assert code == 2, (out, err)
    assert "templates_dir" in err and all(part in err for part in expected), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (deployment.home / "dunning.duckdb").exists() and deployment.outbox() == []


def test_a_missing_templates_dir_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="templates_dir: not a directory"):
        parse_settings({"templates_dir": str(tmp_path / "nowhere")})


def test_a_relative_templates_dir_is_taken_from_the_config_files_directory(tmp_path, monkeypatch):
    write_templates(tmp_path / "conf" / "mine", {"reminder.txt.j2": "Pay {{ totals[0].amount }}\n"})
    monkeypatch.chdir(tmp_path)
    config = parse_config({"templates_dir": "mine"}, base_dir=tmp_path / "conf")
    assert config.templates_dir == str((tmp_path / "conf" / "mine").resolve())
    message = reminder_email([reminder_row()], sender="b@example.com", message_id="<r@example.com>", as_of=AS_OF,
                             templates_dir=config.templates_dir)  # fmt: skip
    assert text_of(parse(message)).strip() == "Pay 103.45 USD"


def test_partials_of_the_same_kind_may_be_included(tmp_path):
    root = write_templates(
        tmp_path,
        {
            "_footer.html.j2": "<p>Questions? Write to us about {{ invoices|length }} invoice(s).</p>\n",
            "reminder.html.j2": '<p>{{ customer_name }}</p>\n{% include "_footer.html.j2" %}',
        },
    )
    check_templates(str(root))
    message = reminder_email([reminder_row(customer_name="<b>Ada</b>")], sender="b@example.com",
                             message_id="<p@example.com>", as_of=AS_OF, templates_dir=str(root))  # fmt: skip
    html = html_of(parse(message))
    assert html == "<p>&lt;b&gt;Ada&lt;/b&gt;</p>\n<p>Questions? Write to us about 1 invoice(s).</p>\n"


# --- end to end --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_each_customer_gets_their_language_and_unknown_ones_fall_back(deployment, tmp_path):
    rows = [
        invoice(invoice_id="in_de", customer_id="cus_de", customer_email="de@example.com", currency="EUR",
                amount_due=123456, customer_locale="de_DE", payment_url=PAY),
        invoice(invoice_id="in_at", customer_id="cus_at", customer_email="at@example.com", customer_locale="de-AT"),
        invoice(invoice_id="in_xx", customer_id="cus_xx", customer_email="xx@example.com", customer_locale="xx_YY"),
        invoice(invoice_id="in_bad", customer_id="cus_bad", customer_email="bad@example.com",
                customer_locale="de\u2028DE"),
        invoice(invoice_id="in_en", customer_id="cus_en", customer_email="en@example.com"),
    ]  # fmt: skip
    pf_invoice = fixture_invoice()
    pf_invoice.update(id="in_de", customer="cus_de", customer_email="de@example.com", status="open",
                      amount_remaining=123456, currency="eur")  # fmt: skip
    events = tmp_path / "events.json"
    events.write_text(json.dumps([payment_failed_event("evt_de", pf_invoice, dt.datetime(2026, 11, 5, tzinfo=dt.UTC))]))
    code, out, err = deployment.run(rows, RUN_AT, "--events", str(events))
    assert code == 0, err
    assert deployment.query("SELECT count(*) FROM snapshot_quarantine") == [(0,)]  # a locale never rejects a row
    by_kind = {(str(m["To"]), str(m["X-Dunning-Kind"])): m for m in deployment.outbox()}
    german = by_kind["de@example.com", "reminder"]
    assert german["Subject"] == "Zahlungserinnerung: Rechnung in_de ist überfällig"
    assert "1.234,56 EUR offen" in text_of(german) and "fällig am 01.11.2026" in text_of(german)
    assert f"Online bezahlen: {PAY}" in text_of(german)
    notice = by_kind["de@example.com", "payment_failed"]
    assert notice["Subject"] == "Zahlung für Rechnung in_de fehlgeschlagen"
    assert "1.234,56 EUR" in text_of(notice) and f"Rechnung online bezahlen: {PAY}" in text_of(notice)
    assert by_kind["at@example.com", "reminder"]["Subject"].startswith("Zahlungserinnerung")
    for address in ("xx@example.com", "bad@example.com", "en@example.com"):
        english = by_kind[address, "reminder"]
        assert english["Subject"] == f"Friendly reminder: invoice in_{address.split('@')[0]} is overdue"
        assert "100.00 USD remaining" in text_of(english) and "due Nov 1, 2026" in text_of(english)


@pytest.mark.slow
def test_operator_templates_override_by_name_and_language(deployment, tmp_path):
    write_templates(
        tmp_path / "conf" / "mine",
        {
            "reminder.txt.j2": "{{ customer_name }}, please pay {% for t in totals %}{{ t.amount }}{% endfor %}.\n",
            "de/reminder.subject.j2": "Mahnung: {{ totals[0].amount }} offen",
        },
    )
    config = config_file(
        tmp_path / "conf",
        "templates_dir: mine\n"
        "provider: {from: billing@example.com, from_name: Müller & Söhne GmbH, reply_to: ar@example.com}\n",
    )
    rows = [
        invoice(),
        invoice(invoice_id="in_de", customer_id="cus_de", customer_email="de@example.com", customer_locale="de_DE"),
    ]
    code, out, err = deployment.run(rows, RUN_AT, "--config", str(config))
    assert code == 0, err
    emails = {str(m["To"]): m for m in deployment.outbox()}
    english, german = emails["ada@example.com"], emails["de@example.com"]
    assert text_of(english).strip() == "Ada, please pay 100.00 USD."  # the operator's text
    assert english["Subject"] == "Friendly reminder: invoice in_1 is overdue"  # the packaged subject
    assert "<table>" in html_of(english)  # the packaged HTML
    assert german["Subject"] == "Mahnung: 100,00 USD offen"  # the operator's German subject
    assert text_of(german).startswith("Guten Tag Ada,")  # German text: packaged de/ before the default language
    for message in (english, german):
        [sender] = message["From"].addresses
        assert (sender.display_name, sender.addr_spec) == ("Müller & Söhne GmbH", "billing@example.com")
        assert str(message["Reply-To"]) == "ar@example.com"


@pytest.mark.slow
def test_a_stripe_pull_brings_each_customers_language_and_pay_link(deployment, monkeypatch):
    as_of = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    german = stripe_invoice(0, as_of, hosted_invoice_url="https://invoice.stripe.com/i/acct_1/test_de?s=ap")
    german["customer"] = {"id": "cus_de", "object": "customer", "preferred_locales": ["de-DE", "en"]}
    english = stripe_invoice(2, as_of, hosted_invoice_url="javascript:alert(1)")
    with FakeStripe() as fake:
        fake.invoices = [german, english]
        deployment.home.mkdir(parents=True)
        (deployment.home / "config.yaml").write_text(
            f"source: {{kind: stripe, api_base: '{fake.url}', max_network_retries: 0, timeout_seconds: 5}}\n"
        )
        monkeypatch.setenv("STRIPE_API_KEY", KEY)
        code, out, err = deployment.cli("run", "--as-of", as_of.isoformat())
        assert code == 0, err
        assert fake.requests_to("/v1/invoices")[0].get("expand[0]") == "data.customer"
    emails = {str(m["To"]): m for m in deployment.outbox()}
    de = emails[german["customer_email"]]
    assert de["Subject"] == "Zahlungserinnerung: Rechnung in_fake00000 ist überfällig"
    assert "Online bezahlen: https://invoice.stripe.com/i/acct_1/test_de?s=ap" in text_of(de)
    en = emails[english["customer_email"]]
    assert en["Subject"].startswith("Friendly reminder") and "javascript" not in text_of(en) + html_of(en)
    assert deployment.query("SELECT invoice_id, reason FROM dunning_audit ORDER BY 1") == [
        ("in_fake00000", None),
        ("in_fake00002", "payment_url_dropped"),
    ]


def test_templates_see_jinjas_globals_and_a_dict_methods_name_keeps_the_sandboxs_rule():
    from jinja2.exceptions import SecurityError, UndefinedError

    from dunning.email.templating import environment

    env = environment(None)
    globals_used = "{{ range(3)|list }} {{ namespace(a=1).a }} {% set j = joiner('/') %}{{ j() }}a{{ j() }}b"
    assert env.from_string(globals_used).render() == "[0, 1, 2] 1 a/b"
    context = {"d": {"items": "data", "keys": "data", "invoice_id": "in_1"}}
    # an item whose key is a dict method's name is that method, as in the sandbox: never the data
    assert env.from_string("{{ d.invoice_id }} {{ d.items is callable }} {{ d['items'] }}").render(context) == (
        "in_1 True data"
    )
    with pytest.raises(SecurityError):
        env.from_string("{{ d.update }}").render({"d": {"update": "data"}})
    with pytest.raises(UndefinedError):
        env.from_string("{{ lipsum() }}").render()


OLD_UPCOMING = '{SET} upcoming = invoices|selectattr("days_until_due", "ge", 0)|list|length == invoices|length -%}\n'


def _as_copied_from_the_previous_release(text: str) -> str:
    """A packaged template as the release before this one shipped it: `upcoming` and the pay-link test computed in
    the template with `selectattr` (about a fifth of an email's rendering), not read from the context."""
    for one in ("{%- set one = invoices|length == 1 -%}\n", "{% set one = invoices|length == 1 -%}\n"):
        text = text.replace(one, one + OLD_UPCOMING.replace("{SET}", one.split(" set ")[0] + " set"), 1)
    return text.replace("any_payment_url", 'invoices|selectattr("payment_url")|list|length > 0')


def test_an_operators_copy_of_the_earlier_templates_renders_what_the_packaged_ones_now_render(tmp_path):
    """The context's `upcoming` and `any_payment_url` are what the earlier templates computed, on every sample."""
    from dunning.email.context import sample_contexts
    from dunning.email.templating import render
    from dunning.vocabulary import EmailKind

    packaged = Path(templates_package.__file__).parent / "templates"
    copied = 0
    for source in [*packaged.glob("*.j2"), *packaged.glob("de/*.j2")]:
        old = _as_copied_from_the_previous_release(source.read_text())
        if old != source.read_text():
            target = tmp_path / source.relative_to(packaged)
            target.parent.mkdir(exist_ok=True)
            target.write_text(old)
            copied += 1
    assert copied == 8, "the reminder's three templates and the apology's HTML, in English and German"
    for locale in ("en_US", "de_DE"):
        for kind in (EmailKind.REMINDER, EmailKind.APOLOGY):
            for context in sample_contexts(kind, locale):
                assert render(str(tmp_path), locale, kind, context) == render(None, locale, kind, context)
