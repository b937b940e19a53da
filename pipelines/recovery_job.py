"""The flood recovery job: sends the apologies for one incident. Launched by `dunning recover`, never scheduled.

It is the one send that works while the pipeline is paused, because it is the
remedy; its keys (`apology:{incident}:{customer}`) make a second run for the
same incident send nothing.
"""

import datetime as dt

import dagster as dg

from dunning.errors import DunningError
from dunning.plan.clock import parse_as_of, utc_now
from dunning.plan.policy import with_balances
from dunning.report import recovery
from dunning.run import cycle
from resources.dunning import DunningHome

DEFAULT_LOOKBACK = dt.timedelta(days=7)  # how far back to look for a flood when --since is not given


class RecoveryRequest(dg.Config):
    incident_id: str
    snapshot_path: str
    since: str | None = None
    sent_log_path: str | None = None
    as_of: str | None = None


@dg.op(tags={"dunning/kind": "recovery"}, pool="dunning_ledger")
def send_flood_apologies(
    context: dg.OpExecutionContext, config: RecoveryRequest, dunning_home: DunningHome
) -> dg.Output[dict]:
    """Finds the customers a flood reached and sends each one apology with a correct statement of what they owe."""
    try:
        settings = dunning_home.settings()
        as_of = parse_as_of(config.as_of)
        since = parse_as_of(config.since) if config.since else as_of - DEFAULT_LOOKBACK
        snapshot = with_balances(cycle.load_snapshot(config.snapshot_path, settings).valid)
        with dunning_home.ledger() as ledger, dunning_home.provider(settings) as provider:
            report = recovery.recover(
                ledger,
                provider,
                snapshot,
                settings,
                incident_id=config.incident_id,
                run_id=context.run_id,
                as_of=as_of,
                since=since,
                sent_log=config.sent_log_path,
                now=utc_now,
            )
            ledger.publish(dunning_home.root)  # analysts see the incident and its apologies at once
    except DunningError as error:
        raise dg.Failure(
            description=str(error), metadata={"error_class": type(error).__name__}, allow_retries=False
        ) from None
    summary = {
        "incident_id": config.incident_id,
        "flooded_customers": report.flooded.height,
        "apologies_sent": report.send.sent,
        "already_apologized": report.send.lost,
        "failed": report.send.failed,
        "unknown": report.send.unknown,
        "unmapped_addresses": report.unmapped_addresses,
        "unreachable_customers": report.unreachable,
    }
    return dg.Output(
        summary, metadata={k: dg.MetadataValue.json(v) if isinstance(v, list) else v for k, v in summary.items()}
    )


@dg.job(
    executor_def=dg.in_process_executor,
    tags={"dunning/kind": "recovery"},
    description="Flood recovery: one apology per flooded customer per incident. Never scheduled.",
)
def flood_recovery():
    send_flood_apologies()
