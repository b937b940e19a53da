"""`dunning promise --import FILE.csv`: promises as a CRM or helpdesk export them (columns `invoice_id` or
`customer_id`, `until`, optional `amount_minor`, `note`, `promise_id`), checked by the rules of `promises` row by
row before any is recorded; a row whose promise is on record already (its own `promise_id`, else a digest of the
row) is left alone, so importing one file twice changes nothing."""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dunning.config import DunningConfig
from dunning.desk.promises import Target, build_promise, parse_amount, parse_promise_id
from dunning.errors import UserInputError
from dunning.ledger.base import Ledger
from dunning.plan.exclusions import clean_reason, clean_target, parse_until
from dunning.safe_text import for_terminal
from dunning.vocabulary import ExclusionScope

MAX_IMPORT_BYTES = 20 * 1024 * 1024
MAX_IMPORT_ROWS = 100_000
IMPORT_COLUMNS = ("invoice_id", "customer_id", "until", "amount_minor", "note", "promise_id")


def _import_id(row: dict[str, str]) -> str:
    """A row's promise id when the CRM gave none: a digest of what it promises, so the same row is the same promise."""
    text = "\x1f".join(row.get(c, "").strip() for c in IMPORT_COLUMNS[:-1])
    return "pr_csv_" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


@dataclass(frozen=True)
class Imported:
    added: list[str]
    on_record: int


def import_promises(ledger: Ledger, path: str, *, as_of: dt.datetime, by: str, config: DunningConfig) -> Imported:
    """`dunning promise --import FILE.csv`: every row checked first (rows whose promise is on record already are
    left alone), then all recorded at once; any bad row: UserInputError naming its line, nothing recorded."""
    file = Path(path)
    if file.stat().st_size > MAX_IMPORT_BYTES:
        raise UserInputError(f"{path}: larger than {MAX_IMPORT_BYTES // 1024 // 1024} MB; split it")
    try:
        text = file.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserInputError(f"{path}: not UTF-8 text") from None
    try:
        return _import_rows(ledger, path, text, as_of=as_of, by=by, config=config)
    except csv.Error as error:  # a field over the csv module's limit, a NUL byte: the file's problem, one line
        raise UserInputError(f"{path}: not a CSV file the import can read ({for_terminal(str(error))[:120]})") from None


def _import_rows(
    ledger: Ledger, path: str, text: str, *, as_of: dt.datetime, by: str, config: DunningConfig
) -> Imported:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [h.strip() for h in reader.fieldnames or []]
    unknown = [h for h in header if h not in IMPORT_COLUMNS]
    if unknown or "until" not in header or not ({"invoice_id", "customer_id"} & set(header)):
        raise UserInputError(
            f"{path}: columns must be invoice_id or customer_id, until, and optionally amount_minor, note, promise_id"
            + (f" (unknown: {', '.join(for_terminal(u)[:40] for u in unknown)})" if unknown else "")
        )
    reader.fieldnames = header
    rows: list[tuple[int, dict[str, str], str]] = []
    for line, raw in enumerate(reader, start=2):
        if len(rows) >= MAX_IMPORT_ROWS:
            raise UserInputError(f"{path}: more than {MAX_IMPORT_ROWS} rows; split it")
        row = {k: (v or "") for k, v in raw.items() if k is not None}
        if None in raw:
            raise UserInputError(f"{path} line {line}: more fields than columns")
        try:
            promise_id = parse_promise_id(row.get("promise_id")) or _import_id(row)
        except UserInputError as error:
            raise UserInputError(f"{path} line {line}: {error}") from None
        rows.append((line, row, promise_id))
    on_record = ledger.promise_ids_on_record([p for _, _, p in rows])
    built = []
    seen: set[str] = set()
    for line, row, promise_id in rows:
        if promise_id in on_record or promise_id in seen:
            continue
        seen.add(promise_id)
        try:
            built.append(_row_promise(ledger, row, promise_id, as_of=as_of, by=by, config=config))
        except UserInputError as error:
            raise UserInputError(f"{path} line {line}: {error}") from None
    added = []
    with ledger.transaction():
        for promise, covered in built:
            if ledger.add_promise(promise, covered):
                added.append(str(promise["promise_id"]))
    return Imported(added, len(rows) - len(built))


def _row_promise(
    ledger: Ledger, row: dict[str, str], promise_id: str, *, as_of: dt.datetime, by: str, config: DunningConfig
) -> tuple[dict[str, Any], list[tuple[str, int | None, int]]]:
    invoice_id, customer_id = row.get("invoice_id", "").strip(), row.get("customer_id", "").strip()
    if bool(invoice_id) == bool(customer_id):
        raise UserInputError("give invoice_id or customer_id (one of them)")
    scope = ExclusionScope.INVOICE if invoice_id else ExclusionScope.CUSTOMER
    target = Target(scope, clean_target(invoice_id or customer_id, scope))
    until = parse_until(row.get("until") or None)
    if until is None:
        raise UserInputError("until is empty (YYYY-MM-DD)")
    amount = parse_amount(row.get("amount_minor"), "amount_minor")
    note = clean_reason(row.get("note"), "note")
    return build_promise(ledger, target, until, amount, note, as_of=as_of, by=by, config=config, source="import",
                         promise_id=promise_id)  # fmt: skip
