"""The `message_secret` table: the deployment's secret that Message-IDs are signed with (`dunning.keys.MessageIds`).

It lives in the ledger so that every worker of one ledger (several homes on one PostgreSQL database, any number
of processes) mints and verifies with the same secret: the first live send makes it, in its own committed
transaction, before anything is claimed with it; two workers making it at once both end with the one that was
inserted first (`ON CONFLICT DO NOTHING`, then read). Reading never makes one: `dunning preview` and dry runs on a
ledger without a secret mint placeholders instead.

The secret is kept only here: the analysts' copy publishes a fixed list of tables that does not name this one
(`backends.publication.PUBLISHED_TABLES`), and nothing prints it or hands it to Dagster. `message_secret_env`
(config) names an environment variable that overrides it, for deployments that keep secrets outside the ledger.
"""

from __future__ import annotations

import datetime as dt
import secrets

from dunning.ledger.sql import SqlConnection

SECRET_BYTES = 32


class MessageSecretStore(SqlConnection):
    def message_secret(self, create_at: dt.datetime | None = None) -> str | None:
        """The ledger's Message-ID secret (hex), or None when it has none; with `create_at`, one is made first when
        missing (committed before this returns, unless an outer transaction holds it)."""
        if create_at is None:
            return self._stored_secret()
        with self.transaction() as con:
            con.execute(
                "INSERT INTO message_secret (id, secret, created_at) VALUES (1, ?, ?) ON CONFLICT (id) DO NOTHING",
                [secrets.token_hex(SECRET_BYTES), create_at],
            )
            return self._stored_secret()

    def _stored_secret(self) -> str | None:
        rows = self.con.execute("SELECT secret FROM message_secret WHERE id = 1").fetchall()
        return str(rows[0][0]) if rows else None
