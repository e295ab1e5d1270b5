"""A contended machine on demand: one busy process per core, started and stopped by the harness.

`busy_processes` starts ``n`` Python processes that spin (``while True: pass``) at normal priority and
stops them when its block ends, on an exception or an interrupt too (terminate, then kill). Timings
taken inside show what a training process meets when data loaders, reward workers or other ranks keep
every core busy.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

__all__ = ["busy_processes", "core_count"]

_SPIN = "while True:\n    pass\n"


def core_count() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def busy_processes(n: int | None = None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Within the block, ``n`` (default: one per core) processes keep the cores busy."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(core_count() if n is None else n):
            procs.append(subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL))
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
