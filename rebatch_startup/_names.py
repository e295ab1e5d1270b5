"""The names of the files rebatch writes, one set a process (torch-free: `rebatch_startup` names them).

Every report and dump file a process writes is named ``PREFIX-TRAINER-HOST-RUN-PID.SUFFIX``: ``RUN`` is
this process's run id (`run_id`: its start time in UTC and 8 random hex digits, made once a process; a
forked child makes its own, ``os.register_at_fork``), ``PID`` its process id. Two runs whose processes
share a pid (two containers) or a host name never write the same file, and a forked child never writes
its parent's (`for_this_process`). `REPORT_NAME` is the pattern of a report's name, the only files
``rebatch report DIR`` reads in a directory.
"""

from __future__ import annotations

import os
import re
import time

from .trainers import names

__all__ = ["REPORT_NAME", "for_this_process", "process_file", "run_id"]

#: A report's file name, as `process_file` makes it for ``prefix="rebatch"``, ``suffix="json"``.
_TRAINER = "|".join(re.escape(name) for name in names())  # every declared trainer (`trainers.TRAINERS`)
REPORT_NAME = re.compile(rf"rebatch-(?:{_TRAINER})-[A-Za-z0-9_]+-\d{{8}}T\d{{6}}Z-[0-9a-f]{{8}}-\d+\.json")
#: The tail `process_file` (and `for_this_process`) put before a file's suffix: ``-RUN-PID``.
_TAIL = re.compile(r"-\d{8}T\d{6}Z-[0-9a-f]{8}-\d+$")

_run: str = ""


def _new_run() -> None:
    global _run
    _run = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(4).hex()


_new_run()
os.register_at_fork(after_in_child=_new_run)


def run_id() -> str:
    """This process's run id: ``YYYYmmddTHHMMSSZ-xxxxxxxx`` (UTC start time, 8 random hex digits)."""
    return _run


def process_file(directory: str, prefix: str, trainer: str, suffix: str) -> str:
    """``DIRECTORY/PREFIX-TRAINER-HOST-RUN-PID.SUFFIX`` (the host's first label, letters, digits and
    ``_`` only): one file a process, never one shared by many."""
    import socket

    host = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname().split(".")[0]) or "host"
    return os.path.join(directory, f"{prefix}-{trainer}-{host}-{run_id()}-{os.getpid()}.{suffix}")


def for_this_process(path: str, owner: int) -> str:
    """``path`` in process ``owner`` (the pid that was given it); in another process (a forked child)
    the same name with this process's ``-RUN-PID`` in place of the owner's (added when the name has
    none: a path given to ``install(report=...)``), so a child never writes its parent's file."""
    if os.getpid() == owner:
        return path
    head, name = os.path.split(path)
    stem, dot, suffix = name.rpartition(".")
    if not dot:
        stem, suffix = name, ""
    stem = _TAIL.sub("", stem)
    return os.path.join(head, f"{stem}-{run_id()}-{os.getpid()}{dot}{suffix}")
