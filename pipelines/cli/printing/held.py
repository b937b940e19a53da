"""The invoices held for a data problem (no address, an invalid one, a suppressed address), as `preview`, the run
summary and `status` print them: the first few by name, the rest counted, and the fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

NAMED_LIMIT = 10  # invoices named in text; `preview --json` and `status --json` list them all
FIXES = {
    "no_email_address": "give the customer an address (customer_email) in the billing system",
    "invalid_address": "customer_email must hold exactly one address; put copies in customer_cc",
    "suppressed": "the address bounced or complained: find a new contact (`dunning status` lists them)",
}


def held_for_data_lines(problems: Sequence[Mapping[str, Any]], where: str = "--json lists them all") -> list[str]:
    if not problems:
        return []
    lines = [f"held for their data (fix these in the billing system): {len(problems)} invoice(s)"]
    lines += [f"  {p['invoice_id']} of {p['customer_id']}: {p['reason']}" for p in problems[:NAMED_LIMIT]]
    if len(problems) > NAMED_LIMIT:
        lines.append(f"  … and {len(problems) - NAMED_LIMIT} more ({where})")
    for reason in dict.fromkeys(str(p["reason"]) for p in problems):
        if reason in FIXES:
            lines.append(f"  {reason}: {FIXES[reason]}")
    return lines
