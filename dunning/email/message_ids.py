"""Which secret a deployment's Message-IDs are signed with (`dunning.keys.MessageIds`), read where it is kept.

`message_secret_env` (config) names an environment variable: its value mints, and is never stored. Otherwise the
ledger's `message_secret` row does, made by the first command that sends (`create_at`), never by one that only
reads: `dunning preview` and dry runs on a ledger without a secret get placeholder ids, which no email carries.
Verifying a report tries both secrets when both exist, so Message-IDs minted before `message_secret_env` was set
still verify after.

The secret is remembered as one (`secret_env.remember`): any text stored or shown has it masked.
"""

from __future__ import annotations

import datetime as dt

from dunning.config import DunningConfig
from dunning.errors import ConfigError
from dunning.keys import MIN_SECRET_BYTES, MessageIds
from dunning.ledger.base import Ledger
from dunning.secret_env import read_secret, remember, shown_name

KEY = "message_secret_env"


def message_ids(
    ledger: Ledger, config: DunningConfig, *, create_at: dt.datetime | None = None, required: bool = True
) -> MessageIds:
    """How `config`'s deployment mints and verifies Message-IDs on `ledger`. `create_at`: make the ledger's secret
    when it has none and no `message_secret_env` is set (a command about to send). Not `required` (`preview`): a
    `message_secret_env` that is not set gives placeholders instead of a ConfigError."""
    domain = config.provider.message_domain
    secrets: list[bytes] = []
    if config.message_secret_env:
        try:
            secrets.append(env_secret(config.message_secret_env))
        except ConfigError:
            if required:
                raise
            return MessageIds(domain)
        create_at = None  # the variable mints: the ledger needs no secret of its own
    stored = ledger.message_secret(create_at)
    if stored is not None:
        remember([stored])
        secrets.append(bytes.fromhex(stored))
    return MessageIds(domain, tuple(secrets))


def env_secret(name: str) -> bytes:
    """The value of the variable `message_secret_env` names, as the HMAC key; ConfigError (never quoting it) when it
    is unset or too short to be a secret."""
    value = read_secret(name, KEY)
    if len(value.encode()) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{KEY}: the value of {shown_name(name)} is shorter than {MIN_SECRET_BYTES} characters (it is not shown); "
            "set it to 32 or more random characters, e.g. the output of `openssl rand -hex 32`"
        )
    return value.encode()
