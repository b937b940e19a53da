"""Where a run's stdout and stderr go: the files the UI's "stdout" and "stderr" tabs show, and to the terminal
only when a person watches it.

Dagster's local compute log manager writes the same files and also mirrors each stream to the terminal through a
`tail -F` process and a Python process watching it: four processes a run, 0.05-0.08 CPU-s and their start-up's
wall time. The `dunning` command prints its own summary after the run, and its send progress bar writes to a copy
of the terminal's stderr taken before the run (`pipelines.cli.printing.progress_bar`); `dunning run -v` asks for
the mirror (`mirrored_to_terminal`), since Dagster's step logs are written during the run. The instance the CLI
writes (`pipelines.instance.DunningInstance`) uses this manager unless its dagster.yaml has a `compute_logs:`
section of its own.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from dagster._core.execution.compute_logs import redirect_to_file
from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION, LocalComputeLogManager
from dagster._serdes import ConfigurableClassData

_MIRRORED: ContextVar[bool] = ContextVar("dunning_compute_logs_mirrored", default=False)


@contextlib.contextmanager
def mirrored_to_terminal(wanted: bool) -> Iterator[None]:
    """While the block runs (the in-process executor runs the steps in it), captured output is also copied to the
    terminal, as Dagster's own manager does, when `wanted`."""
    token = _MIRRORED.set(wanted)
    try:
        yield
    finally:
        _MIRRORED.reset(token)


class FileComputeLogManager(LocalComputeLogManager):
    """Dagster's local compute log manager without the mirroring processes."""

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> FileComputeLogManager:
        return cls(inst_data=inst_data, **config_value)  # Dagster's names its own class here

    @contextlib.contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Iterator[CapturedLogContext]:
        if _MIRRORED.get():  # a person watches (`mirrored_to_terminal`): Dagster's own, mirror processes and all
            with super().capture_logs(log_key) as captured:
                yield captured
            return
        outpath = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        errpath = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        Path(outpath).parent.mkdir(parents=True, exist_ok=True)
        with redirect_to_file(sys.stdout, outpath), redirect_to_file(sys.stderr, errpath):
            yield CapturedLogContext(log_key)
        Path(self.complete_artifact_path(log_key)).touch()  # as Dagster's: the capture is complete
