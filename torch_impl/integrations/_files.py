"""How rebatch writes a file (a shadow report, a dump): privately, whole, and never through a symlink.

`write_private` writes to a new temporary file in the target's directory (``O_CREAT | O_EXCL |
O_NOFOLLOW``, mode ``0o600``, a random name: one a write, never shared by threads), then renames it onto
the final name: a reader sees the old file or the new one, never half of one; a killed process leaves at
most a stray temporary file. A symlink planted at the temporary name is refused (``O_EXCL``); one at the
final name is replaced itself (a rename does not follow it), its target untouched.

`ProcessFile` is a file of this process: in a forked child, the same name with the child's run id and pid
(`rebatch_startup._names.for_this_process`). `Counters` is what every report shares (`_shadow.Shadow`,
`_counts.Counts`): per-name counters under a lock, renewed in a forked child (`rebatch_startup.renew_at_fork`:
the child counts its own calls, never waits on a parent thread's lock), written to its `ProcessFile`, and
at exit by the one writer of its report path (`WRITERS`: a reinstall replaces the old one, never adds).
`save_dump` writes a step in the one dump format (`DUMP_FORMAT`) read by ``rebatch check --dump``.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import logging
import os
import secrets
import threading
from collections.abc import Mapping
from typing import Any

from rebatch_startup._names import for_this_process, run_id
from rebatch_startup.forksafe import renew_at_fork

__all__ = ["DUMP_FORMAT", "Counters", "ProcessFile", "process_facts", "save_dump", "write_private"]

#: The value of a dump's ``"format"`` key (bumped when the layout changes).
DUMP_FORMAT = "rebatch-dump/1"

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def write_private(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a private temporary file in its directory, then rename it there."""
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, _FLAGS, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def save_dump(
    path: str, *, trainer: str, version: str | None, function: str, inputs: Mapping[str, Any]
) -> None:
    """Save a step: ``{"format": DUMP_FORMAT, "trainer", "trainer_version", "function", "inputs"}`` (the
    function's arguments by name, as plain lists, dicts, tensors and TensorDicts), with `write_private`."""
    import torch

    step = {
        "format": DUMP_FORMAT,
        "trainer": trainer,
        "trainer_version": version,
        "function": function,
        "inputs": dict(inputs),
    }
    buffer = io.BytesIO()
    torch.save(step, buffer)
    write_private(path, buffer.getvalue())


def process_facts() -> dict[str, Any]:
    """The process a report is of: ``pid``, ``host``, ``run`` (`rebatch_startup._names.run_id`), ``argv``."""
    import socket
    import sys

    return {"pid": os.getpid(), "host": socket.gethostname(), "run": run_id(), "argv": list(sys.argv)}


class ProcessFile:
    """``path`` in this process; in a forked child the same name with the child's ``-RUN-PID``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.owner = os.getpid()

    def now(self) -> str:
        """Where this process writes it."""
        return for_this_process(self.path, self.owner)


#: The one writer at exit of each report path in this process (the latest install's counters).
WRITERS: dict[str, Counters] = {}
log = logging.getLogger("rebatch")


@atexit.register
def _final_reports() -> None:
    for counters in list(WRITERS.values()):
        try:
            counters.write_report()
        except Exception as err:  # at exit: said once a report, never a traceback
            log.warning(
                f"rebatch: {counters.trainer}: cannot write {counters.report}: {type(err).__name__}: {err}"
            )


class Counters:
    """Per-name counters of one install of ``trainer`` (release ``version``) in this process (``by_name``,
    under ``lock``), and its report: ``report`` (a JSON file, or None) rewritten by `write_report` and a
    last time at exit. A forked child starts with counters and a lock of its own (`renew_in_child`) and
    writes its own file."""

    def __init__(self, trainer: str, version: str | None, report: str | None = None) -> None:
        self.trainer = trainer
        self.version = version
        self.report = report
        self.file = None if report is None else ProcessFile(report)
        self.renew_in_child()
        renew_at_fork(self)
        if report is not None:
            WRITERS[report] = self  # replaces a former install's writer of this path

    def renew_in_child(self) -> None:
        """Fresh counters and a fresh lock (in a forked child: `rebatch_startup.renew_at_fork`)."""
        self.lock = threading.Lock()
        self.by_name: dict[str, dict[str, float]] = {}
        #: the exceptions caught and not raised, by reason (`caught`), reported as ``"caught"``
        self.caught_by_reason: dict[str, int] = {}

    def caught(self, reason: str) -> bool:
        """Count one exception caught (not raised) for ``reason``; True the first time (then logged, once)."""
        with self.lock:
            n = self.caught_by_reason.get(reason, 0)
            self.caught_by_reason[reason] = n + 1
        return n == 0

    def stats(self, json_path: str | None = None) -> dict[str, Any]:
        """The counters, written as JSON to ``json_path`` when given."""
        raise NotImplementedError

    def finished(self, total: dict[str, Any], json_path: str | None, **fields: Any) -> dict[str, Any]:
        """``total`` with what every report holds: ``witness`` (the alignment witness's counters of this
        process), ``trainer``, ``version``, ``fields`` (``mode``, ...) and ``process``; written whole to
        ``json_path`` when given (`write_private`: a reader never sees half a report)."""
        from .._alignment import witness_stats

        with self.lock:
            total["caught"] = dict(self.caught_by_reason)
        total.update(witness=witness_stats(), trainer=self.trainer, version=self.version, **fields)
        total["process"] = process_facts()
        if json_path is not None:
            write_private(json_path, json.dumps(total, indent=1).encode())
        return total

    def write_report(self) -> None:
        """Rewrite the report (when there is one) with `stats`, where this process writes it."""
        if self.file is not None:
            self.stats(json_path=self.file.now())
