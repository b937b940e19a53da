from pathlib import Path

import pytest

from dunning.config import DunningConfig, load_config
from dunning.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults_are_the_documented_ones():
    config = load_config(None)
    assert [(s.name, s.days_overdue, s.min_remaining_ratio) for s in config.stages] == [
        ("day3", 3, 0.0),
        ("day7", 7, 0.0),
        ("day14", 14, 0.25),
    ]
    assert config.group_by == "customer"
    assert config.timezone == "UTC"
    assert config.on_invalid_rows == "proceed"
    assert (config.breaker.max_emails, config.breaker.window_hours) == (2, 24)
    assert config.provider.kind == "file"


def test_a_file_may_set_one_key(tmp_path):
    config = load_config(write(tmp_path, "group_by: invoice\n"))
    assert config.group_by == "invoice"
    assert config.stages == DunningConfig().stages


def test_the_spec_example_file_parses(tmp_path):
    config = load_config(
        write(
            tmp_path,
            """
stages:
  - {name: day3,  days_overdue: 3,  min_remaining_ratio: 0.0}
  - {name: day7,  days_overdue: 7,  min_remaining_ratio: 0.0}
  - {name: day14, days_overdue: 14, min_remaining_ratio: 0.25}
group_by: customer
timezone: UTC
on_invalid_rows: proceed
breaker: {max_emails: 2, window_hours: 24}
provider:
  kind: smtp
  host: 127.0.0.1
  port: 25
  timeout_seconds: 10
  starttls: true
  tls: none
  username_env: SMTP_USERNAME
  password_env: SMTP_PASSWORD
  from: billing@example.com
alerts: {webhook_url: null}
""",
        )
    )
    assert config.provider.kind == "smtp" and config.provider.from_address == "billing@example.com"


@pytest.mark.parametrize(
    "text, named",
    [
        ("group_bye: invoice\n", "group_bye"),
        ("breaker: {max_emails: two}\n", "breaker.max_emails"),
        ("provider: {kind: fax}\n", "provider.kind"),
        ("breaker: {max_emails: 2, window: 24}\n", "breaker.window"),
        ("timezone: Mars/Olympus\n", "timezone"),
        ("claim_chunk_size: 0\n", "claim_chunk_size"),
        ("claim_chunk_size: lots\n", "claim_chunk_size"),
    ],
)
def test_unknown_keys_and_wrong_types_name_the_key(tmp_path, text, named):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text))
    assert named in str(error.value)


def test_stages_must_increase(tmp_path):
    with pytest.raises(ConfigError, match="strictly increasing"):
        load_config(write(tmp_path, "stages: [{name: a, days_overdue: 7}, {name: b, days_overdue: 3}]\n"))


def test_missing_and_unparsable_files_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "stages: [\n"))


@pytest.mark.parametrize(
    "text, chunk",
    [
        ("", 10_000),  # the file outbox can say what a crashed run's claims became
        ("provider: {kind: resend, from: billing@example.com}\n", 10_000),
        ("provider: {kind: smtp, from: billing@example.com}\n", 2_000),  # unknowns wait for a human
        ("provider: {kind: smtp, from: billing@example.com, idempotency_header: Resend-Idempotency-Key}\n", 10_000),
        ("claim_chunk_size: 500\n", 500),
        ("claim_chunk_size: auto\nprovider: {kind: smtp, from: billing@example.com}\n", 2_000),
    ],
)
def test_the_claim_chunk_is_small_where_a_crash_leaves_unknowns_for_a_human(tmp_path, text, chunk):
    assert load_config(write(tmp_path, text) if text else None).claim_chunk() == chunk
