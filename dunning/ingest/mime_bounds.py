"""A hostile message's MIME structure, bounded on its raw bytes before the standard parser reads it.

The standard `email` parser checks every line against the boundary of every multipart it is inside, so its cost is
lines times depth: one 350 KB bounce nested 900 `multipart/mixed` levels deep took 16 s to read, a 4 MB one 218 s,
and limits checked on the finished tree come too late. `structure_problem` walks the raw bytes once, the way the
parser will (header blocks, `Content-Type` read with the parser's own header and parameter rules, boundary lines
matched against the boundaries open at that point, `message/*` bodies read as messages, `message/delivery-status`
as header blocks), keeping a dictionary of open boundaries so each line costs one lookup whatever the depth, and
says why the message is refused when it is deeper than `max_depth`, has more than `max_parts` parts, more header
lines than `MAX_HEADER_LINES`, or a shape the walk cannot follow faithfully (a boundary reused inside itself, a
delivery-status block with a type of its own): what passes has at most the depth and parts the parser will build.
A message under 64 KB whose counts alone prove it within the limits (`_surely_within`: its `Content-Type` headers,
lines starting with `--`, line ends) is not walked: that is most bounces, at a few microseconds each.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from email.message import Message
from email.policy import compat32

MAX_HEADER_LINES = 20_000  # header lines in all of a message's parts: a bounce has a few hundred
CHECK_CLOCK_EVERY = 2_048  # lines looked at between two looks at the clock
_LINE_END = re.compile(rb"\r\n|\r|\n")  # the parser's line ends (`StringIO(newline='')`)
_HEADER_LINE = re.compile(rb"From |[\x21-\x39\x3b-\x7e]*:|[\t ]")  # `email.feedparser.headerRE`
_EMPTY_AFTER = re.compile(rb"(?>\r\n|\r|\n)(?=\r|\n)")  # a line's end followed by an empty line
_EOL = (b"\r", b"\n")
_TYPE_LINE = re.compile(rb"(?:\A|(?<=[\r\n]))content-type:", re.IGNORECASE)


class Refused(Exception):
    """Why a message is not given to the parser."""


@dataclass
class _Open:
    boundary: bytes
    depth: int  # the multipart's own depth; its parts are one deeper
    digest: bool  # multipart/digest: a part without a type is a message/rfc822


class _Walk:
    def __init__(self, raw: bytes, max_depth: int, max_parts: int, deadline: float):
        self.raw, self.max_depth, self.max_parts, self.deadline = raw, max_depth, max_parts, deadline
        self.open: list[_Open] = []
        self.where: dict[bytes, int] = {}  # an open boundary -> its index in `open`
        self.parts = 0
        self.header_lines = 0
        self.looked = 0

    def line_at(self, pos: int) -> tuple[bytes, bytes, int]:
        """The line starting at `pos`: its text, its text with its line end, and where the next one starts."""
        end = _LINE_END.search(self.raw, pos)
        if end is None:
            return self.raw[pos:], self.raw[pos:], len(self.raw)
        return self.raw[pos : end.start()], self.raw[pos : end.end()], end.end()

    def tick(self) -> None:
        self.looked += 1
        if self.looked % CHECK_CLOCK_EVERY == 0 and time.monotonic() > self.deadline:
            raise Refused("took longer than its time budget to look at")

    def boundary_of(self, line: bytes) -> tuple[int, bool] | None:
        """(index of the open multipart, whether it closes it) when `line` is one of the open boundaries' lines."""
        return self.after_dashes(line[2:])

    def after_dashes(self, rest: bytes) -> tuple[int, bool] | None:
        """`boundary_of` a line given without its leading `--` (the parser allows spaces and tabs after it)."""
        text = rest.rstrip(b" \t")
        at = self.where.get(text)
        if at is not None:
            return at, False
        if text.endswith(b"--"):
            at = self.where.get(text[:-2])
            if at is not None:
                return at, True
        return None

    def entity(self, pos: int, depth: int, default_type: str) -> tuple[int, str]:
        """Read the header block of one entity at `pos`; (where its body starts, what its body is)."""
        self.parts += 1
        if self.parts > self.max_parts:
            raise Refused(f"more than {self.max_parts} MIME parts")
        if depth > self.max_depth:
            raise Refused(f"MIME nested deeper than {self.max_depth}")
        content_type: list[str] = []
        in_type = False
        while pos < len(self.raw):
            self.tick()
            line, whole, after = self.line_at(pos)
            if line.startswith(b"--") and self.boundary_of(line) is not None:
                break  # the part ends here, headers and all (the parser's end-of-part matchers)
            if not line:
                pos = after
                break
            if not _HEADER_LINE.match(line):
                break  # the body starts without a blank line
            self.header_lines += 1
            if self.header_lines > MAX_HEADER_LINES:
                raise Refused(f"more than {MAX_HEADER_LINES} header lines")
            if line[:1] in (b" ", b"\t"):
                if in_type:
                    content_type.append(whole.decode("ascii", "surrogateescape"))
            else:
                in_type = not content_type and line.split(b":", 1)[0].lower() == b"content-type"
                if in_type:
                    content_type.append(whole.decode("ascii", "surrogateescape"))
            pos = after
        return pos, self.body_kind(content_type, depth, default_type)

    def body_kind(self, content_type: list[str], depth: int, default_type: str) -> str:
        """What follows the headers, by the parser's own reading of the `Content-Type` header."""
        kind, boundary, digest = _read_type(tuple(content_type), default_type)
        if kind == "multipart":
            if boundary is None:
                return "text"  # the parser reads such a body as text, to the end
            try:
                key = boundary.encode("ascii", "surrogateescape")
            except UnicodeEncodeError:  # decoded from RFC 2231 (`boundary*=utf-8''%C3%A9`): no line, read as ASCII,
                return "text"  # can ever match it, so the parser reads the body as text, to the end, as without one
            if key in self.where:
                raise Refused("a multipart boundary reused inside itself")
            self.where[key] = len(self.open)
            self.open.append(_Open(key, depth, digest))
            return "multipart"
        return kind

    def close_to(self, index: int) -> None:
        """Every multipart from `index` inward ends."""
        for ended in self.open[index:]:
            del self.where[ended.boundary]
        del self.open[index:]

    def next_boundary(self, pos: int) -> tuple[int, int, bool] | None:
        """The next line from `pos` that is an open boundary's: (where it starts, whose, whether it closes it).

        The scan is one regular expression of the boundaries open now (made again only when they change, at most
        once per part), so the lines between cost nothing in Python however many there are."""
        raw, search = self.raw, _lines_of(tuple(sorted(self.where))).search
        while True:
            found = search(raw, pos)
            if found is None:
                return None
            self.tick()
            start = found.start()
            if start == 0 or raw[start - 1] in b"\r\n":  # at a line's start
                hit = self.after_dashes(found.group(1))
                if hit is not None:
                    return start, hit[0], hit[1]
            pos = found.end()

    def past_repeats(self, pos: int, index: int) -> int:
        """Where the part after a separator line of multipart `index` starts: the parser consumes every line right
        after it that is a line of the same boundary, its closing form (`--b--`) included, which then closes
        nothing (`FeedParser._parsegen`: "consume any multiple boundary lines")."""
        while pos < len(self.raw):
            self.tick()
            line, _, after = self.line_at(pos)
            hit = self.boundary_of(line) if line.startswith(b"--") else None
            if hit is None or hit[0] != index:
                return pos
            pos = after
        return pos

    def delivery_status(self, pos: int, end: int, depth: int) -> None:
        """The header blocks of a `message/delivery-status` body: the parser makes each a message one deeper, one
        block, then one more after each empty line that is not the body's last line."""
        region = self.raw[pos:end]
        if _TYPE_LINE.search(region):
            raise Refused("a delivery-status block with a Content-Type of its own")
        empty = len(_EMPTY_AFTER.findall(region)) + (1 if region[:1] in _EOL else 0)
        blocks = 1 + empty - int(_ends_with_an_empty_line(region))
        if depth + 1 > self.max_depth:
            raise Refused(f"MIME nested deeper than {self.max_depth}")
        self.parts += blocks
        if self.parts > self.max_parts:
            raise Refused(f"more than {self.max_parts} MIME parts")

    def run(self) -> None:
        pos, depth, default_type = 0, 0, "text/plain"
        while True:
            pos, kind = self.entity(pos, depth, default_type)
            while kind == "message":  # a message/* body is another message's headers and body
                depth += 1
                pos, kind = self.entity(pos, depth, "text/plain")
            hit = self.next_boundary(pos) if self.open else None
            if kind == "delivery-status":
                self.delivery_status(pos, hit[0] if hit else len(self.raw), depth)
            while hit is not None:
                start, index, closes = hit
                _, _, pos = self.line_at(start)
                opened = self.open[index]
                if not closes:
                    self.close_to(index + 1)
                    pos = self.past_repeats(pos, index)
                    depth, default_type = opened.depth + 1, "message/rfc822" if opened.digest else "text/plain"
                    break
                self.close_to(index)  # the epilogue follows: text of the enclosing part, if any
                hit = self.next_boundary(pos) if self.open else None
            else:
                return


@functools.lru_cache(maxsize=1024)
def _read_type(content_type: tuple[str, ...], default_type: str) -> tuple[str, str | None, bool]:
    """(`multipart`, `delivery-status`, `message` or `text`; a multipart's boundary; whether it is a digest) as the
    parser reads the header lines `content_type` (most are alike from message to message: the answers are kept)."""
    part = Message()
    part.set_default_type(default_type)
    if content_type:
        part.set_raw(*compat32.header_source_parse(list(content_type)))
    kind = part.get_content_type()
    if part.get_content_maintype() == "multipart":
        return "multipart", part.get_boundary(), kind == "multipart/digest"
    if kind == "message/delivery-status":
        return "delivery-status", None, False
    return ("message" if part.get_content_maintype() == "message" else "text"), None, False


def _ends_with_an_empty_line(text: bytes) -> bool:
    if text.endswith(b"\r\n"):
        before = text[:-2]
    elif text[-1:] in _EOL:
        before = text[:-1]
    else:
        return False
    return not before or before[-1:] in _EOL


@functools.lru_cache(maxsize=256)
def _lines_of(boundaries: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """A line of one of `boundaries`: `--`, the boundary, maybe `--`, spaces or tabs, the line's end (the parser's
    `boundaryre`); the longest boundary first, so one that begins another is not taken for it."""
    names = b"|".join(re.escape(b) for b in sorted(boundaries, key=len, reverse=True))
    return re.compile(rb"--((?:" + names + rb")(?:--)?[ \t]*)(?:\r\n|\r|\n|\Z)")


QUICK_BYTES = 64 * 1024  # a message this small is first bounded by counting (`_surely_within`)


def _surely_within(raw: bytes, max_depth: int, max_parts: int) -> bool:
    """Whether counts alone prove `raw` within the limits, so the walk may be skipped (most bounces: a few
    microseconds instead of the walk's tens). Every container on the way down to the deepest part declares its type,
    or is a digest's untyped part, whose digest does: depth <= 2 x the `Content-Type` headers. A part follows a line
    starting with `--`, is a message/* body (typed, or a digest's untyped part) or a delivery-status block (one more
    per empty line): parts <= 1 + 2 x those lines + 2 x the headers + the empty lines (at most the line ends)."""
    types = raw.lower().count(b"content-type:")
    if 2 * types > max_depth:
        return False
    dashes = raw.count(b"\n--") + raw.count(b"\r--") + int(raw.startswith(b"--"))
    line_ends = raw.count(b"\n") + raw.count(b"\r") - raw.count(b"\r\n")
    return 1 + 2 * dashes + 2 * types + line_ends <= max_parts


def structure_problem(raw: bytes, *, max_depth: int, max_parts: int, deadline: float) -> str | None:
    """Why `raw` must not be parsed (deeper than `max_depth`, more than `max_parts` parts, ...), or None. `deadline`
    is a `time.monotonic()` past which the walk gives up (its cost is linear: a few milliseconds a megabyte)."""
    if len(raw) <= QUICK_BYTES and _surely_within(raw, max_depth, max_parts):
        return None
    try:
        _Walk(raw, max_depth, max_parts, deadline).run()
    except Refused as refused:
        return str(refused)
    return None
