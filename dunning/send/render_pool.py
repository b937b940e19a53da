"""Rendering across cores: worker processes turn send groups into bytes while the run hands them over.

Rendering an email (context, templates, MIME, serialization) is pure CPU and
was what bounded the send step, on one core. A `RenderPool` runs
`compose.wire_for` (the bytes of `render.render_for`'s message, the one entry
that picks the email kind, written without building the message) in worker
processes and returns `wire.WireEmail`s (bytes plus envelope), in the order of
the groups; the run's own process claims, hands the bytes to the provider and
records outcomes, as before. Nothing about claims changes: a chunk's keys are
claimed in one transaction before any of its emails is rendered, and a worker
never touches the ledger. A worker that dies leaves the emails it had not
rendered un-handed-over: the caller records them `failed` (they never reached
the provider, so a retry cannot duplicate them) and stops.

With the file outbox the workers also write each email into it themselves
(`outbox_dir`: the same file, by the same `FileOutbox.send_wire`, that the run's
process would write) and return its outcome instead of its bytes: taking 1.7 KB
back per email and writing it on a thread of the run's process was half of that
process's time in the send step, which it bounded. Then a worker that dies may
have written emails it did not report, so the caller records what it did not
hear about `unknown`, never `failed`, and the next run asks the outbox
(`lookup`: the file is there or not). Providers with connections, a health
stop or idempotency payloads (SMTP, Resend) are only ever handed bytes by the
run's process.

Workers die with the run (`_die_with_parent`) and, writing the outbox, pass
the run's hand-over gate (`dunning.send.handover`): nothing is written after the
run's claim lease ends, and each email is journaled first.

Workers are spawned (fresh interpreters that import this module only): the
run's process has threads (Dagster, DuckDB, the outbox writer), and forking it
as it is would be unsafe; spawned workers are the run's own children, so the
time they use counts in the run's CPU time (a forkserver's children would
not). They are started when the pool opens, before the first chunk is claimed,
and warm up (templates compiled, locale data loaded) while the claims run.
How many: `render_processes` in the config (`auto`: the machine's usable
cores divided by the runs of this deployment's job in progress on it, so
shard workers sharing a machine do not oversubscribe it); a batch under
`MIN_POOL_EMAILS` emails renders in the run's own process, where it costs less
than starting the workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

from dunning.email import templating
from dunning.email.compose import wire_for
from dunning.email.context import format_amount
from dunning.email.render import Sender, render_for
from dunning.email.wire import WireEmail
from dunning.send import heap
from dunning.send.handover import Deadline, HandOverGate
from dunning.send.providers.base import SendOutcome
from dunning.send.providers.file_outbox import FileOutbox
from dunning.vocabulary import EMAIL_KINDS

Record = dict[str, Any]
Built = WireEmail | str | SendOutcome  # an email's bytes, why it could not be built, or (outbox_dir) its outcome
BUILD_ERRORS = (ValueError, TypeError, LookupError, OSError)  # EmailBuildError, HeaderParseError, a bad template…
MIN_POOL_EMAILS = 300  # below this, starting workers costs more than it saves
GROUPS_PER_TASK = 32  # emails per round trip to a worker: large enough to amortize it, small to keep order cheap
START_METHOD = "spawn"  # never a plain fork of a process with threads


@dataclass(frozen=True)
class RenderSettings:
    """What every email of one run is rendered with. `render` replaces the packaged renderer (`render.render_for`,
    whose bytes `compose.wire_for` writes without building the message); it must be importable by name (a
    module-level function) so a worker process can be given it."""

    sender: Sender
    as_of: dt.datetime
    locale: str = "en_US"
    templates_dir: str | None = None
    render: Callable[..., Message] | None = None
    outbox_dir: str | None = None  # workers write each email into this file outbox and return its outcome
    # (policy, templates_dir) of each policy whose templates are not the top level's (`DunningConfig.policies`)
    policy_templates: tuple[tuple[str, str | None], ...] = ()

    def templates_for(self, records: list[Record]) -> str | None:
        """The templates of the policy that governs one email's invoices (an email groups one policy only)."""
        if self.policy_templates:
            policy = records[0].get("policy")
            for name, directory in self.policy_templates:
                if name == policy:
                    return directory
        return self.templates_dir

    def message(self, records: list[Record]) -> Message:
        """One group's email as a message, for a provider that sends messages."""
        render = self.render or render_for
        return render(
            records, sender=self.sender, as_of=self.as_of, locale=self.locale, templates_dir=self.templates_for(records)
        )

    def wire(self, records: list[Record]) -> WireEmail:
        """One group's email as bytes: the same bytes as serializing `message(records)`."""
        if self.render is not None:
            return WireEmail.of(self.message(records))
        return wire_for(
            records, sender=self.sender, as_of=self.as_of, locale=self.locale, templates_dir=self.templates_for(records)
        )


def build(records: list[Record], settings: RenderSettings) -> Built:
    """One group's email as bytes, or `email not built: …` when its data cannot make one (a header value with a
    line break, a recipient that is not one address, a template failing on this email's data)."""
    try:
        return settings.wire(records)
    except BUILD_ERRORS as exc:
        return not_built(exc)


def not_built(exc: Exception) -> str:
    """Why an email could not be built, as its keys' outcome records it."""
    return f"email not built: {type(exc).__name__}: {exc}"[:500]


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota when there is one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def pool_size(setting: int | str, local_runs: int = 1, cores: int | None = None) -> int:
    """Render processes for one run: `setting` when it is a number, else (`auto`) the usable cores shared among
    the `local_runs` runs of this deployment in progress on the machine. 1 means: render in the run's process."""
    if setting != "auto":
        return int(setting)
    return max(1, (cores or available_cores()) // max(1, local_runs))


_SETTINGS: RenderSettings | None = None  # in a worker process: set once when it starts
_OUTBOX: FileOutbox | None = None  # in a worker process, with `outbox_dir`: where it writes its emails
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when the thread that started it dies
PARENT_POLL_SECONDS = 0.25


def _die_with_parent(parent_pid: int) -> None:
    """A worker never outlives the run: the kernel kills it when its parent dies (Linux `PR_SET_PDEATHSIG`), and
    a watcher thread ends it if it finds itself re-parented (elsewhere, or if the parent died before the signal
    was set). Without this, a SIGKILLed run's workers were re-parented and went on writing the outbox."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _start_worker(
    settings: RenderSettings, parent_pid: int | None = None, deadline: Any = None, journal: str | None = None
) -> None:
    """A worker's start: die with the run, keep the settings, and compile what every email needs before the first
    one arrives. With the file outbox it writes emails itself, through the run's hand-over gate: each journaled,
    and none after the run's claim lease (`deadline`, shared with the run) ends."""
    global _SETTINGS, _OUTBOX
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    _SETTINGS = settings
    _OUTBOX = FileOutbox(settings.outbox_dir) if settings.outbox_dir else None
    if _OUTBOX is not None and deadline is not None:
        _OUTBOX.gate = HandOverGate(Deadline(deadline), journal)
    for kind in EMAIL_KINDS:
        for part in ("subject", "txt", "html"):
            # only a warm-up: an email that needs a template that fails reports the problem itself
            with contextlib.suppress(Exception):
                templating.template(settings.templates_dir, settings.locale, f"{kind}.{part}.j2")
    format_amount(0, "USD", settings.locale)
    heap.settle()  # what the worker loaded stays: its collections walk only what rendering allocates


def _ready() -> int:
    return os.getpid()


def _render_batch(groups: list[list[Record]]) -> list[Built]:
    assert _SETTINGS is not None, "a render worker starts with its settings"
    built = [build(records, _SETTINGS) for records in groups]
    if _OUTBOX is None:
        return built
    return [_OUTBOX.send_wire(email) if isinstance(email, WireEmail) else email for email in built]


def _in_order(futures: list[Future[list[Built]]]) -> Generator[Built, None, None]:
    try:
        for future in futures:
            yield from future.result()
    finally:
        for future in futures:
            future.cancel()


def _failing(futures: list[Future[list[Built]]], error: Exception) -> Generator[Built, None, None]:
    for future in futures:
        future.cancel()
    raise error
    yield  # a generator: raises when first asked for an email


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """While workers start, the program that opened the pool (the `dunning` command, Dagster's run worker) is not
    named as the main module: `multiprocessing` would run it again in every worker (a second of Dagster imports
    each), and a worker needs this module only."""
    main = sys.modules["__main__"]
    saved = {name: getattr(main, name) for name in ("__file__", "__spec__") if hasattr(main, name)}
    try:
        main.__spec__ = None
        if "__file__" in saved:
            del main.__file__
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


class RenderPool:
    """`processes` worker processes rendering with `settings`; a context manager (workers end on exit)."""

    def __init__(
        self, processes: int, settings: RenderSettings, deadline: Deadline | None = None, journal: str | None = None
    ):
        self.processes = processes
        self.delivers = settings.outbox_dir is not None  # its workers write the emails: it yields outcomes
        shared = deadline.shared if deadline is not None else None
        with _main_module_hidden():
            self._executor = ProcessPoolExecutor(
                max_workers=processes,
                mp_context=multiprocessing.get_context(START_METHOD),
                initializer=_start_worker,
                initargs=(settings, os.getpid(), shared, journal),
            )
            # one task per worker now, so every worker starts (and warms up) while the run claims its first chunk
            self._warming = [self._executor.submit(_ready) for _ in range(processes)]

    def render(self, groups: Sequence[list[Record]]) -> Generator[Built, None, None]:
        """Each group's email, in order. Every group is submitted now, so the workers render ahead of the caller;
        an exception while iterating (a worker died: `BrokenProcessPool`) means no later email was produced.
        Closing the generator cancels what is not rendered yet."""
        futures: list[Future[list[Built]]] = []
        try:
            for start in range(0, len(groups), GROUPS_PER_TASK):
                futures.append(self._executor.submit(_render_batch, list(groups[start : start + GROUPS_PER_TASK])))
        except Exception as exc:  # noqa: BLE001 - the pool is already broken: the first email raises it
            return _failing(futures, exc)
        return _in_order(futures)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RenderPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
