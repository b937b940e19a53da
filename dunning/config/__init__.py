"""The deployment's policy, from one optional YAML file, as a package by concern: one module per section of the
YAML, each key's documentation the docstring under it (the configuration reference is generated from them), and
the root model (`root.DunningConfig`) assembling the sections.

Every key has a documented default so that an empty (or absent) file is a working configuration; unknown keys and
wrong types are refused with a message that names the key, because a typo in a dunning policy silently falling
back to a default is how customers get the wrong email.

Owns: `base` (the strict model, the field types), `stages`, `providers`, `sending` (breaker, retry, the invoice
email), `sources` (source, events), `schedule` (the cron, send windows, holidays, escalation, what a policy
matches), `policies`, `alerts`, `feedback`, `desk` (promises, replies, IMAP), `storage` (ledger, store,
retention), `root` (`DunningConfig`) and `loading` (YAML to a config; the `ledger:` section alone). A new concern's
keys get their own module here (fees, the desk). Part of the shared base: imports no room of the domain. Import
names from `dunning.config`.
"""

from dunning.config.alerts import Alerts
from dunning.config.base import (
    ENV_NAME,
    GROUP_NAME,
    MAX_HOURS,
    NAME_PATTERN,
    Count,
    EnvName,
    Flag,
    MinorAmount,
    Number,
    Strict,
)
from dunning.config.desk import Imap, Promises, Replies
from dunning.config.feedback import Feedback
from dunning.config.fees import Compensation, Fees, Interest, RateEntry
from dunning.config.loading import load_config, load_ledger_settings, parse_config
from dunning.config.policies import FirstContactTone, Policy, ResolvedPolicy
from dunning.config.providers import PROVIDER_KEY_MEMORY_HOURS, STRUCTURAL_HEADERS, Provider
from dunning.config.root import DunningConfig
from dunning.config.schedule import DEFAULT_POLICY, WEEKDAYS, Escalation, Holidays, PolicyMatch, Schedule, SendWindow
from dunning.config.sending import Breaker, InvoiceEmails, Retry
from dunning.config.sources import Events, Source
from dunning.config.stages import DEFAULT_STAGES, MIN_STAGE_DAYS, Stage, check_stages
from dunning.config.storage import LedgerSettings, Retention, Store

__all__ = [
    "DEFAULT_POLICY", "DEFAULT_STAGES", "ENV_NAME", "GROUP_NAME", "MAX_HOURS", "MIN_STAGE_DAYS", "NAME_PATTERN",
    "PROVIDER_KEY_MEMORY_HOURS", "STRUCTURAL_HEADERS", "WEEKDAYS", "Alerts", "Breaker", "Compensation", "Count",
    "DunningConfig", "EnvName", "Escalation", "Events", "Feedback", "Fees", "FirstContactTone", "Flag", "Holidays",
    "Imap", "Interest", "InvoiceEmails", "LedgerSettings", "MinorAmount", "Number", "Policy", "PolicyMatch",
    "Promises", "Provider", "RateEntry", "Replies", "ResolvedPolicy", "Retention", "Retry", "Schedule", "SendWindow",
    "Source", "Stage", "Store", "Strict", "check_stages", "load_config", "load_ledger_settings", "parse_config",
]  # fmt: skip
