"""Secrets come from environment variables only, are checked when read, and never become data.

The config names variables (`provider.api_key_env: RESEND_API_KEY`), never holds
a secret. Two things went wrong before this module:

- a secret read with a trailing newline (secret files and Kubernetes secrets
  often end in one) made `requests` raise `InvalidHeader`, whose text quotes
  the whole `Bearer re_…` header; that text was stored in the ledger, the
  alerts, the analysts' files and Dagster's event log;
- a secret pasted where a variable's *name* belongs was echoed back by
  "environment variable <the secret> is not set".

So: `read_secret` strips surrounding whitespace, refuses a value that still
holds a control character (naming the variable, never the value), and
remembers every secret read in this process; `scrub` masks every remembered
secret in a text, and is applied wherever an error text is stored or shown (the
ledger's `last_error`, alerts and their webhook bodies, Dagster's step
failures, the terminal), whatever library produced the text. `not_a_secret`
refuses, at config load, a variable name that looks like a secret itself, and
`shown_name` prints a variable's name only when it looks like one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from dunning.errors import ConfigError
from dunning.safe_text import has_control

SECRET_PREFIXES = ("sk_", "rk_", "re_", "whsec_", "pk_live_", "xoxb-", "xoxp-", "ghp_", "AKIA")
LOOKS_LIKE_A_SECRET = "this looks like the secret itself: put the secret in an environment variable and name it here"
_CONVENTIONAL_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
# shorter values would mask ordinary words in every text ("billing", "admin"); a secret that short is not one
MIN_MASKED = 8
_KNOWN: set[str] = set()


def looks_like_a_secret(name: str) -> bool:
    """A known secret prefix (Stripe, Resend, Svix, Slack, GitHub, AWS), or longer than 40 characters with upper
    and lower case and digits: the shape of an API key, not of a variable name."""
    if name.startswith(SECRET_PREFIXES):
        return True
    mixed = any(c.islower() for c in name) and any(c.isupper() for c in name) and any(c.isdigit() for c in name)
    return len(name) > 40 and mixed


def not_a_secret(name: str) -> str:
    """For a config field that names an environment variable: ValueError (which never quotes the value) when
    the name looks like the secret itself."""
    if looks_like_a_secret(name):
        raise ValueError(LOOKS_LIKE_A_SECRET)
    return name


def shown_name(name: str) -> str:
    """A variable's name as an error may print it: conventional names (`RESEND_API_KEY`) as they are; anything else
    (a short password pasted where the name belongs) as `the variable it names`."""
    conventional = _CONVENTIONAL_NAME.fullmatch(name) is not None and not looks_like_a_secret(name)
    return f"${name}" if conventional else "the variable it names"


def remember(values: Iterable[str | None]) -> None:
    """Secrets this process holds, to be masked in every text it stores or shows (`scrub`)."""
    for value in values:
        if value:
            for form in {value, value.strip()}:
                if len(form) >= MIN_MASKED:
                    _KNOWN.add(form)


def read_secret(name: str, key: str, environ: Mapping[str, str] | None = None, *, masked: bool = True) -> str:
    """The value of environment variable `name` (config key `key` named it), stripped of surrounding whitespace;
    ConfigError naming the key and the variable, never the value, when it is unset, empty, or holds a control
    character after stripping. `masked=False` for what is read the same way but is no secret (an SMTP user name,
    which would mask ordinary words)."""
    raw = (environ if environ is not None else os.environ).get(name)
    if raw is None or not raw.strip():
        raise ConfigError(f"{key}: environment variable {shown_name(name)} is not set or empty")
    if masked:
        remember([raw])
    value = raw.strip()
    if has_control(value):
        raise ConfigError(
            f"{key}: the value of {shown_name(name)} holds a line break or control character inside it (the value "
            "is not shown); set it again without one"
        )
    return value


def remember_configured(names: Iterable[str | None], environ: Mapping[str, str] | None = None) -> None:
    """The values of the variables a config names, remembered before anything can fail on them: an error raised
    before a provider or source reads its key must not show it either."""
    source = environ if environ is not None else os.environ
    remember(source.get(name) for name in names if name)


def scrub(text: str) -> str:
    """`text` with every secret this process holds masked (`***`), also as Python's repr escapes it."""
    if not _KNOWN or not text:
        return text
    for secret in sorted(_KNOWN, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "***")
        escaped = repr(secret)[1:-1]
        if escaped != secret and escaped in text:
            text = text.replace(escaped, "***")
    return text


def holds_a_secret(text: str) -> bool:
    return scrub(text) != text


def holding_any() -> bool:
    """Whether this process holds any secret to mask (when not, `scrub` has nothing to do)."""
    return bool(_KNOWN)
