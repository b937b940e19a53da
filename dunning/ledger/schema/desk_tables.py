"""The collections desk's tables (`dunning.desk`): promises to pay and the invoices each covers, customers' replies
and their acknowledgements, notes, and where each IMAP folder was read up to.

Kept apart from `tables` (the cycle's own tables) and appended to its `DDL`, so both databases get them alike
(`pg_schema` derives PostgreSQL's from it). `customer_replies."from"` is quoted everywhere: FROM is a keyword.
"""

DESK_DDL = (
    # a promise to pay (`dunning promise`, `--import`): `invoice_id` null covers the invoices `promise_invoices` names
    # (the customer's open ones when it was made); `owed_minor` is what they owed then, which `amount_minor` is judged
    # against; `import_digest` makes importing one CSV row twice a no-op
    """
    CREATE TABLE IF NOT EXISTS promises (
        promise_id VARCHAR PRIMARY KEY,
        customer_id VARCHAR NOT NULL,
        invoice_id VARCHAR,
        until DATE NOT NULL,
        amount_minor BIGINT,
        currency VARCHAR,
        status VARCHAR NOT NULL CHECK (status IN ('active', 'kept', 'broken', 'cancelled')),
        created_at TIMESTAMPTZ NOT NULL,
        created_by VARCHAR NOT NULL,
        note VARCHAR,
        resolved_at TIMESTAMPTZ,
        owed_minor BIGINT NOT NULL,
        source VARCHAR NOT NULL,
        resolved_by VARCHAR,
        alert_id VARCHAR
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS promise_invoices (
        promise_id VARCHAR NOT NULL,
        invoice_id VARCHAR NOT NULL,
        cycle INTEGER,
        remaining_minor BIGINT NOT NULL,
        PRIMARY KEY (promise_id, invoice_id)
    )
    """,
    # a customer's reply to our email (`dunning feedback`): unique on its Message-ID, else a digest of the message
    """
    CREATE TABLE IF NOT EXISTS customer_replies (
        reply_key VARCHAR PRIMARY KEY,
        customer_id VARCHAR,
        "from" VARCHAR,
        subject VARCHAR,
        received_at TIMESTAMPTZ NOT NULL,
        matched_by VARCHAR NOT NULL CHECK (matched_by IN ('message_id', 'address')),
        automatic BOOLEAN NOT NULL,
        pauses BOOLEAN NOT NULL,
        message_id VARCHAR,
        in_reply_to VARCHAR,
        excerpt VARCHAR,
        source VARCHAR NOT NULL,
        recorded_at TIMESTAMPTZ NOT NULL,
        alert_id VARCHAR,
        unanswered_alert_id VARCHAR
    )
    """,
    # `dunning ack --customer`: every reply of the customer received at or before `acked_at` is answered
    """
    CREATE TABLE IF NOT EXISTS reply_acks (
        ack_id VARCHAR PRIMARY KEY,
        customer_id VARCHAR NOT NULL,
        acked_at TIMESTAMPTZ NOT NULL,
        acked_by VARCHAR NOT NULL,
        note VARCHAR,
        recorded_wall_at TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS customer_notes (
        note_id VARCHAR PRIMARY KEY,
        customer_id VARCHAR NOT NULL,
        noted_at TIMESTAMPTZ NOT NULL,
        noted_by VARCHAR NOT NULL,
        text VARCHAR NOT NULL
    )
    """,
    # `dunning feedback --imap`: the last UID read of each folder (no password in `mailbox`), under its UIDVALIDITY
    """
    CREATE TABLE IF NOT EXISTS imap_cursors (
        mailbox VARCHAR PRIMARY KEY,
        uidvalidity BIGINT NOT NULL,
        last_uid BIGINT NOT NULL,
        updated_at TIMESTAMPTZ NOT NULL
    )
    """,
)
