"""The DuckDB tables: the ledger that sends are claimed in, and the history around it.

`reminder_ledger.idempotency_key` is the PRIMARY KEY: the database, not
application code, is the last line of defence against a second send. All
timestamps are TIMESTAMPTZ; `claimed_at`/`sent_at` follow the cycle's clock
(`--as-of`), the `*_wall_at` columns record the real time.

These statements describe the current schema: a new ledger gets it whole, and
`migrations` brings older ledgers to it (each later column is also added there,
with `ADD COLUMN IF NOT EXISTS`, for ledgers made before it existed).
"""

from dunning.ledger.schema.desk_tables import DESK_DDL

LEDGER_COLUMNS = (
    "idempotency_key",
    "kind",
    "invoice_id",
    "customer_id",
    "customer_email",
    "cycle",
    "stage",
    "status",
    "amount_minor",
    "currency",
    "email_id",
    "message_id",
    "run_id",
    "claimed_at",
)

DDL = (
    """
    CREATE TABLE IF NOT EXISTS reminder_ledger (
        idempotency_key VARCHAR PRIMARY KEY,
        kind VARCHAR NOT NULL CHECK (kind IN ('reminder', 'apology', 'payment_failed', 'invoice', 'escalation')),
        invoice_id VARCHAR,
        customer_id VARCHAR NOT NULL,
        customer_email VARCHAR,
        cycle INTEGER,
        stage VARCHAR,
        status VARCHAR NOT NULL CHECK (status IN ('claimed', 'sent', 'failed', 'unknown', 'skipped')),
        amount_minor BIGINT,
        currency VARCHAR,
        email_id VARCHAR,
        message_id VARCHAR,
        run_id VARCHAR,
        claimed_at TIMESTAMPTZ,
        sent_at TIMESTAMPTZ,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error VARCHAR,
        next_attempt_at TIMESTAMPTZ,
        outcome_wall_at TIMESTAMPTZ,
        lease_expires_at TIMESTAMPTZ,
        provider_message_id VARCHAR,
        settled_run_id VARCHAR,
        policy VARCHAR NOT NULL DEFAULT 'default',
        skip_reason VARCHAR,
        refused_at TIMESTAMPTZ,
        refusal_alert_id VARCHAR,
        recipients VARCHAR
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS invoice_cycles (
        invoice_id VARCHAR PRIMARY KEY,
        cycle INTEGER NOT NULL,
        cycle_open BOOLEAN NOT NULL,
        opened_at TIMESTAMPTZ,
        closed_at TIMESTAMPTZ,
        last_stage VARCHAR,
        last_stage_days INTEGER,
        changed_snapshot_at TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS snapshot_quarantine (
        run_id VARCHAR NOT NULL,
        quarantined_at TIMESTAMPTZ NOT NULL,
        source VARCHAR,
        source_row BIGINT,
        invoice_id VARCHAR,
        rule VARCHAR NOT NULL,
        raw_row VARCHAR
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS alerts (
        alert_id VARCHAR PRIMARY KEY,
        created_at TIMESTAMPTZ NOT NULL,
        kind VARCHAR NOT NULL,
        severity VARCHAR NOT NULL,
        message VARCHAR NOT NULL,
        run_id VARCHAR,
        details VARCHAR,
        delivered_to VARCHAR,
        resolved_at TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS dunning_audit (
        run_id VARCHAR NOT NULL,
        as_of TIMESTAMPTZ NOT NULL,
        dry_run BOOLEAN NOT NULL,
        idempotency_key VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,
        invoice_id VARCHAR,
        customer_id VARCHAR,
        cycle INTEGER,
        stage VARCHAR,
        outcome VARCHAR NOT NULL,
        reason VARCHAR,
        owed BOOLEAN,
        amount_stated_minor BIGINT,
        remaining_minor BIGINT,
        currency VARCHAR,
        message_id VARCHAR,
        policy VARCHAR,
        waits_until TIMESTAMPTZ,
        also_held VARCHAR
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS dunning_runs (
        run_id VARCHAR PRIMARY KEY,
        as_of TIMESTAMPTZ NOT NULL,
        dry_run BOOLEAN NOT NULL,
        finished_wall_at TIMESTAMPTZ NOT NULL,
        snapshot_path VARCHAR,
        snapshot_rows BIGINT,
        rejected_rows BIGINT,
        due BIGINT,
        sent BIGINT,
        failed BIGINT,
        unknown BIGINT,
        held BIGINT,
        skipped BIGINT,
        emails BIGINT,
        not_owed_reminded BIGINT,
        outcome VARCHAR,
        rows_read BIGINT
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS pause_state (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        paused BOOLEAN NOT NULL,
        reason VARCHAR,
        changed_by VARCHAR,
        changed_at TIMESTAMPTZ NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS customer_claim_locks (
        customer_id VARCHAR PRIMARY KEY,
        touched_at TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS incidents (
        incident_id VARCHAR PRIMARY KEY,
        last_recovery_at TIMESTAMPTZ NOT NULL,
        since TIMESTAMPTZ,
        source VARCHAR,
        flooded_customers BIGINT,
        apologies_sent BIGINT
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS billing_events (
        event_id VARCHAR PRIMARY KEY,
        type VARCHAR NOT NULL,
        created_at TIMESTAMPTZ,
        invoice_id VARCHAR,
        customer_id VARCHAR,
        customer_email VARCHAR,
        currency VARCHAR,
        amount_remaining BIGINT,
        payload VARCHAR,
        first_run_id VARCHAR,
        received_at TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS event_quarantine (
        event_id VARCHAR,
        type VARCHAR,
        reason VARCHAR NOT NULL,
        run_id VARCHAR NOT NULL,
        received_at TIMESTAMPTZ NOT NULL,
        payload VARCHAR
    )
    """,
    # where polling a billing source stands (`ledger.cursors`): the newest event id whose notices are claimed, and
    # the one a run polled up to, waiting for its claims
    """
    CREATE TABLE IF NOT EXISTS source_cursors (
        source VARCHAR PRIMARY KEY,
        cursor VARCHAR,
        updated_at TIMESTAMPTZ,
        pending_cursor VARCHAR,
        pending_run_id VARCHAR,
        pending_at TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS invoice_history_daily (
        business_date DATE NOT NULL,
        run_id VARCHAR NOT NULL,
        as_of TIMESTAMPTZ NOT NULL,
        invoice_id VARCHAR NOT NULL,
        customer_id VARCHAR NOT NULL,
        customer_email VARCHAR,
        currency VARCHAR NOT NULL,
        amount_due BIGINT NOT NULL,
        amount_paid BIGINT NOT NULL,
        remaining_minor BIGINT NOT NULL,
        due_date DATE NOT NULL,
        status VARCHAR NOT NULL,
        days_overdue INTEGER,
        cycle INTEGER
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS simulated_sends (
        business_date DATE NOT NULL,
        policy_id VARCHAR NOT NULL,
        run_id VARCHAR NOT NULL,
        as_of TIMESTAMPTZ NOT NULL,
        idempotency_key VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,
        invoice_id VARCHAR,
        customer_id VARCHAR NOT NULL,
        customer_email VARCHAR,
        cycle INTEGER,
        stage VARCHAR,
        amount_minor BIGINT,
        currency VARCHAR,
        email_id VARCHAR
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS feature_state (
        feature VARCHAR PRIMARY KEY,
        enabled_on DATE NOT NULL,
        enabled_at TIMESTAMPTZ NOT NULL,
        run_id VARCHAR
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS provider_payloads (
        email_id VARCHAR PRIMARY KEY,
        idempotency_key VARCHAR NOT NULL,
        provider VARCHAR NOT NULL,
        payload VARCHAR NOT NULL,
        first_attempt_wall_at TIMESTAMPTZ NOT NULL,
        held_reason VARCHAR
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS applied_snapshots (
        run_id VARCHAR PRIMARY KEY,
        snapshot_taken_at TIMESTAMPTZ NOT NULL,
        as_of TIMESTAMPTZ NOT NULL,
        snapshot_path VARCHAR,
        stale_allowed BOOLEAN NOT NULL,
        applied_wall_at TIMESTAMPTZ NOT NULL,
        invoice_count BIGINT
    )
    """,
    # one row per exclusion (`dunning exclude`), kept after `dunning include` ends it; `active_target` is
    # 'scope:target_id' while it is in force and NULL once included: at most one active row per scope and target
    """
    CREATE TABLE IF NOT EXISTS exclusions (
        exclusion_id VARCHAR PRIMARY KEY,
        scope VARCHAR NOT NULL CHECK (scope IN ('customer', 'invoice')),
        target_id VARCHAR NOT NULL,
        active_target VARCHAR UNIQUE,
        reason VARCHAR,
        excluded_at TIMESTAMPTZ NOT NULL,
        excluded_by VARCHAR NOT NULL,
        until_date DATE,
        updated_at TIMESTAMPTZ,
        updated_by VARCHAR,
        included_at TIMESTAMPTZ,
        included_by VARCHAR
    )
    """,
    # what each live run was given and what the ledger held when it ended (`dunning.plan.unchanged`): a later run given
    # the same, with nothing come due in between, is skipped and recorded here as unchanged since `reference_run_id`
    """
    CREATE TABLE IF NOT EXISTS run_inputs (
        run_id VARCHAR PRIMARY KEY,
        shard VARCHAR NOT NULL,
        as_of TIMESTAMPTZ NOT NULL,
        business_date DATE NOT NULL,
        snapshot_path VARCHAR,
        snapshot_sha256 VARCHAR NOT NULL,
        config_sha256 VARCHAR NOT NULL,
        ledger_state VARCHAR,
        settled BOOLEAN,
        reference_run_id VARCHAR,
        recorded_wall_at TIMESTAMPTZ NOT NULL
    )
    """,
    # the invoices a sharded live run's snapshot held (`dunning.plan.unchanged`): its end state is hashed over their
    # rows, so another shard's writes do not count as a change for this one
    """
    CREATE TABLE IF NOT EXISTS run_scopes (
        run_id VARCHAR NOT NULL,
        invoice_id VARCHAR NOT NULL
    )
    """,
    # every write to invoice_history_daily, one row per merge that changed it (`dunning.ledger.stores.history`):
    # what the hourly no-op hashes instead of the history itself, which grows by a day of rows every day
    """
    CREATE TABLE IF NOT EXISTS history_writes (
        business_date DATE NOT NULL,
        run_id VARCHAR,
        shard_index INTEGER NOT NULL,
        shard_count INTEGER NOT NULL,
        rows_changed BIGINT NOT NULL,
        written_at TIMESTAMPTZ NOT NULL
    )
    """,
    # who is not to be emailed (`dunning.ledger.stores.suppressions`): a hard bounce, a complaint or an operator's
    # word; rows are kept after `dunning unsuppress` lifts them. `active_email` is the address while in force and NULL
    # once lifted: at most one suppression in force per address. `pending_*`: a hard bounce or complaint that came
    # during an operator's temporary suppression, holding the address for good once its `until` has passed
    """
    CREATE TABLE IF NOT EXISTS suppressions (
        suppression_id VARCHAR PRIMARY KEY,
        email VARCHAR NOT NULL,
        active_email VARCHAR UNIQUE,
        reason VARCHAR NOT NULL CHECK (reason IN ('hard_bounce', 'complaint', 'manual')),
        source VARCHAR NOT NULL,
        note VARCHAR,
        customer_id VARCHAR,
        event_key VARCHAR,
        created_at TIMESTAMPTZ NOT NULL,
        until DATE,
        lifted_at TIMESTAMPTZ,
        lifted_by VARCHAR,
        pending_reason VARCHAR,
        pending_source VARCHAR,
        pending_event_key VARCHAR,
        pending_at TIMESTAMPTZ
    )
    """,
    # one `contact_suppressed` alert per customer and suppressed address: the row is the alert's dedup
    """
    CREATE TABLE IF NOT EXISTS suppression_alerts (
        email VARCHAR NOT NULL,
        customer_id VARCHAR NOT NULL,
        alerted_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (email, customer_id)
    )
    """,
    # what came back after a send (`dunning.feedback`): bounces, complaints and other delivery reports, one row per
    # report (`event_key`), matched to our email and keys where the report names our Message-ID; `verdict` says why it
    # did or did not suppress (`dunning.run.feedback`)
    """
    CREATE TABLE IF NOT EXISTS delivery_events (
        event_key VARCHAR PRIMARY KEY,
        kind VARCHAR NOT NULL,
        source VARCHAR NOT NULL,
        email VARCHAR,
        message_id VARCHAR,
        idempotency_keys VARCHAR,
        customer_id VARCHAR,
        status_code VARCHAR,
        detail VARCHAR,
        reported_at TIMESTAMPTZ,
        recorded_at TIMESTAMPTZ NOT NULL,
        matched BOOLEAN NOT NULL,
        suppressed BOOLEAN NOT NULL,
        verdict VARCHAR
    )
    """,
    # the deployment's Message-ID secret (`dunning.ledger.stores.message_secret`): one row, made by the first live
    # send, read by every worker of this ledger; never published to the analysts' copy
    """
    CREATE TABLE IF NOT EXISTS message_secret (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        secret VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL
    )
    """,
    # late fees and statutory interest (`dunning.fees`, `ledger.stores.charges`): one row per
    # `fee:{invoice_id}:{cycle}:{kind}`, claimed in the transaction of the reminder that claims it, its amount fixed
    # then; posted to the billing system ledger first, with the three outcomes of a send (`external_id`: the fee
    # invoice there, `external_item_id`: this charge's item on it)
    """
    CREATE TABLE IF NOT EXISTS charges (
        charge_key VARCHAR PRIMARY KEY,
        invoice_id VARCHAR NOT NULL,
        customer_id VARCHAR NOT NULL,
        cycle INTEGER NOT NULL,
        kind VARCHAR NOT NULL CHECK (kind IN ('compensation', 'interest')),
        amount_minor BIGINT NOT NULL CHECK (amount_minor > 0),
        currency VARCHAR NOT NULL,
        basis VARCHAR NOT NULL,
        status VARCHAR NOT NULL CHECK (status IN ('proposed', 'approved', 'posted', 'failed', 'unknown', 'waived')),
        policy VARCHAR,
        stage VARCHAR,
        customer_type VARCHAR,
        balance_minor BIGINT,
        reminder_key VARCHAR,
        run_id VARCHAR,
        claimed_at TIMESTAMPTZ NOT NULL,
        decided_at TIMESTAMPTZ,
        decided_by VARCHAR,
        note VARCHAR,
        external_id VARCHAR,
        external_item_id VARCHAR,
        posted_at TIMESTAMPTZ,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at TIMESTAMPTZ,
        last_error VARCHAR,
        updated_at TIMESTAMPTZ
    )
    """,
    # a charge that waits for the rate table (`rate_unknown`): noted with its claiming reminder, claimed by the first
    # run that knows the rate while the invoice is still owed in that cycle
    """
    CREATE TABLE IF NOT EXISTS charge_waits (
        charge_key VARCHAR PRIMARY KEY,
        invoice_id VARCHAR NOT NULL,
        cycle INTEGER NOT NULL,
        kind VARCHAR NOT NULL,
        reason VARCHAR NOT NULL,
        reference VARCHAR,
        reminder_key VARCHAR,
        since TIMESTAMPTZ NOT NULL
    )
    """,
    *DESK_DDL,
)
