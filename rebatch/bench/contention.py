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

__all__ = ["busy_processes", "core_count", "cores", "on_core"]

_SPIN = "while True:\n    pass\n"


def cores() -> list[int]:
    """The cores this process may run on, by number (empty where the platform does not say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return []


@contextlib.contextmanager
def on_core(core: int | None) -> Iterator[None]:
    """Within the block, the calling thread runs on ``core`` alone; the process's other threads (torch's
    own pool among them) keep their cores. Nothing where ``core`` is None or the platform cannot pin a
    thread. Threads started within the block would inherit the one core: start them before."""
    if core is None or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)  # pid 0: the calling thread (Linux sets a thread's mask)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def core_count() -> int:
    """How many cores this process may run on."""
    return len(cores()) or os.cpu_count() or 1


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
