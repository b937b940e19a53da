"""Renderers the render pool tests give to worker processes (importable by name, as a pool needs)."""

from __future__ import annotations

import os

from dunning.email.render import render_for

DIE_ON = "in_die"  # a worker that is given this invoice's email dies, as an OOM kill would end it


def render_or_die(records, **kwargs):
    if any(r["invoice_id"] == DIE_ON for r in records):
        os._exit(70)
    return render_for(records, **kwargs)
