"""The dunning domain: pure Python, no Dagster. Rooms by concern, each importing only the rooms below it.

    run      the one composition of a cycle (cycle, steps, the resume guard, settings)
    report   what a cycle proves afterwards: the audit, flood recovery
    send     claim, hand over, record: the send loop, providers, the hand-over journal, alerts
    email    what a customer reads: context, templates, locales, rendering to bytes
    plan     what is due and when: stages, the breaker, exclusions, notices, the unchanged hour, the clock
    ingest   what comes in: snapshot files, their row rules, Stripe objects and API, billing events
    ledger   what is on record: the tables, their stores, the DuckDB and PostgreSQL backends

Below them all, the shared base in this package's own modules: config, errors, vocabulary, keys, safe_text,
secret_env, currencies, sharding, storage_faults, private_files (and the demo data generator). The contracts in
pyproject.toml (`lint-imports`, part of `make lint`) hold the arrows.
"""
