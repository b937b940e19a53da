"""Bounded work per report (round 4, item 7): a mailed "bounce" is refused on its raw bytes, before the standard
parser runs, when its tree would be too deep or too wide, and no message takes more than its time budget.

`mime_bounds.structure_problem` walks the bytes the way the parser will; the property test holds it to the
parser's own tree on generated messages (every line ending, folded parameters, digests, message/rfc822,
delivery-status blocks, boundaries that begin other boundaries): it refuses exactly the messages whose tree is deeper
or wider than the limits.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dunning.ingest import delivery_reports
from dunning.ingest.delivery_reports import MAX_DEPTH, MAX_PARTS, read_message
from dunning.ingest.mime_bounds import QUICK_BYTES, structure_problem
from tests.delivery_messages import dsn, nested_raw, write_mbox

FAR = 10**9  # a deadline never reached


def tree_shape(raw: bytes) -> tuple[int, int]:
    """(deepest depth, parts) of the tree the standard parser builds, counted as the reader walks it."""
    message = email.parser.BytesParser(policy=email.policy.compat32).parsebytes(raw)
    deepest, parts, stack = 0, 0, [(message, 0)]
    while stack:
        part, depth = stack.pop()
        parts += 1
        deepest = max(deepest, depth)
        payload = part.get_payload()
        if part.is_multipart() and isinstance(payload, list):
            stack.extend((p, depth + 1) for p in payload)
    return deepest, parts


@st.composite
def messages(draw) -> bytes:
    eol = draw(st.sampled_from(["\r\n", "\n", "\r"]))
    names = itertools.count()
    prefix = draw(st.sampled_from(["b", "=_b", "b-b"]))  # `b1` begins `b10`, `b-b1` has a dash

    def node(depth: int, in_digest: bool) -> list[str]:
        kinds = ["text", "delivery-status"] + (["multipart", "message"] if depth < 12 else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "text":
            return ["Content-Type: text/plain", "", "hello", "-- ", f"--{prefix}0x", "--"]
        if kind == "delivery-status":
            blocks = draw(st.lists(st.sampled_from(["Action: failed", "Status: 5.1.1", ""]), max_size=6))
            return ["Content-Type: message/delivery-status", "", *blocks]
        if kind == "message":
            head = [] if in_digest and draw(st.booleans()) else ["Content-Type: message/rfc822"]
            return [*head, "", "Subject: inner", *node(depth + 1, False)]
        boundary = f"{prefix}{next(names)}"
        subtype = draw(st.sampled_from(["mixed", "digest", "report"]))
        quoted = draw(st.sampled_from([f'"{boundary}"', boundary]))
        head = (
            [f"Content-Type: multipart/{subtype};", f"\tboundary={quoted}"]
            if draw(st.booleans())
            else [f"Content-Type: multipart/{subtype}; boundary={quoted}"]
        )
        body = [*head, "", "preamble"]
        for _ in range(draw(st.integers(0, 3))):
            body += [f"--{boundary}" + draw(st.sampled_from(["", " ", "\t "]))]
            body += node(depth + 1, subtype == "digest")
        if draw(st.booleans()):
            body += [f"--{boundary}--", "epilogue"]
        return body

    lines = ["From: someone@example.com", "Subject: a report", *node(0, False)]
    return (eol.join(lines) + draw(st.sampled_from([eol, ""]))).encode()


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), st.booleans())
def test_the_raw_walk_refuses_exactly_what_the_parsers_tree_exceeds(raw, large):
    """Small messages are first bounded by counting; `large` pads one past that, so the walk alone decides."""
    raw = raw + b"x" * QUICK_BYTES if large else raw
    deepest, parts = tree_shape(raw)
    if large:
        assert structure_problem(raw, max_depth=deepest, max_parts=parts, deadline=FAR) is None, "counted too much"
    if deepest:
        assert "deeper" in (structure_problem(raw, max_depth=deepest - 1, max_parts=FAR, deadline=FAR) or "")
    assert "parts" in (structure_problem(raw, max_depth=FAR, max_parts=parts - 1, deadline=FAR) or "")


def test_a_bounce_nested_900_levels_deep_is_unreadable_at_once_and_its_import_takes_well_under_a_second(
    deployment, tmp_path
):
    """350 KB with 900 nested multipart/mixed levels took 16 s to import (the depth limit ran on the finished tree)."""
    bomb = nested_raw(900, 350_000)
    assert len(bomb) >= 350_000
    started = time.perf_counter()
    reading = read_message(bomb, "mbox")
    assert [u.why for u in reading.unreadable] == [f"MIME nested deeper than {MAX_DEPTH}"]
    assert time.perf_counter() - started < 0.5
    box = write_mbox(tmp_path / "bomb.mbox", [bomb, nested_raw(900, 4_000_000), dsn("ada@example.com", None)])
    started = time.perf_counter()
    code, out, err = deployment.cli("feedback", "--mbox", str(box))
    took = time.perf_counter() - started
    assert code == 0, err
    assert "unreadable: 2 (2 new" in out and "1 new (hard_bounce 1)" in out, out
    assert took < 2.0, f"the import of two parser bombs took {took:.1f} s"
    why = {d for (d,) in deployment.query("SELECT detail FROM delivery_events WHERE kind = 'unreadable'")}
    assert why == {f"MIME nested deeper than {MAX_DEPTH}"}


def test_more_parts_than_the_limit_are_refused_before_the_parser_runs(monkeypatch):
    def parser_must_not_run(*_):
        raise AssertionError("the parser ran")

    monkeypatch.setattr(delivery_reports, "_parse", parser_must_not_run)
    wide = b"Content-Type: multipart/report; boundary=y\r\n\r\n" + b"--y\r\n\r\nx\r\n" * 200 + b"--y--\r\n"
    assert [u.why for u in read_message(wide, "mbox").unreadable] == [f"more than {MAX_PARTS} MIME parts"]
    assert [u.why for u in read_message(nested_raw(9), "mbox").unreadable] == [f"MIME nested deeper than {MAX_DEPTH}"]


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        pytest.param(
            b'Content-Type: multipart/mixed; boundary="a"\r\n\r\n--a\r\n'
            b'Content-Type: multipart/mixed; boundary="a"\r\n\r\n--a--\r\n',
            "a multipart boundary reused inside itself",
            id="reused-boundary",
        ),
        pytest.param(
            b"Content-Type: message/delivery-status\r\n\r\nContent-Type: multipart/mixed; boundary=z\r\n\r\n",
            "a delivery-status block with a Content-Type of its own",
            id="typed-status-block",
        ),
        pytest.param(b"Subject: x\r\n" * 20_001 + b"\r\nbody", "more than 20000 header lines", id="header-flood"),
    ],
)
def test_shapes_the_walk_cannot_follow_faithfully_are_refused(raw, why):
    """Past what counting alone bounds (small messages: `_surely_within`), the walk refuses what it cannot follow."""
    padded = raw + b"x" * QUICK_BYTES
    assert structure_problem(padded, max_depth=MAX_DEPTH, max_parts=MAX_PARTS, deadline=FAR) == why


def test_a_message_over_its_time_budget_is_unreadable_with_the_reason(monkeypatch):
    genuine = dsn("ada@example.com", "<m@example.com>")
    assert read_message(genuine, "mbox").reports, "within the budget it is read"
    monkeypatch.setattr(delivery_reports, "MESSAGE_SECONDS", -1.0)  # every deadline has passed
    reading = read_message(genuine, "mbox")
    assert reading.reports == [] and [u.why for u in reading.unreadable] == ["took longer than -1 s to read"]
