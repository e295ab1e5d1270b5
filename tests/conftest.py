"""The test suite touches nothing outside its own temporary directories.

Every Ray cluster a test starts lives in a temporary directory of its own (`ray_temp_dir`: ``ray start
--temp-dir``, ``ray.init(_temp_dir=...)``) and is stopped by the test that started it (`ray_head`: its own
``ray start --head --block`` process, sent SIGTERM; never ``ray stop``, which stops every Ray cluster on
the machine). The session checks that no test left Ray's current-cluster file in Ray's default temporary
directory (where ``ray start`` without ``--temp-dir`` writes it) or a process of its clusters behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: Every Ray temporary directory of this session starts so (a process naming it is this session's).
RAY_DIR_PREFIX = f"rb-ray-{os.getpid()}-"
#: Ray's current-cluster file in its default temporary directory (``RAY_TMPDIR``, else /tmp, then ``ray``).
DEFAULT_ADDRESS_FILE = Path(os.environ.get("RAY_TMPDIR", "/tmp"), "ray", "ray_current_cluster")


def processes_naming(marker: str) -> list[str]:
    """``"pid: command line"`` of each process of this machine whose command line holds ``marker``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (
                    Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
            except OSError:  # gone meanwhile
                continue
            if marker in cmdline:
                found.append(f"{entry.name}: {cmdline[:300]}")
    return found


def _address_file() -> tuple[bool, float]:
    try:
        return True, DEFAULT_ADDRESS_FILE.stat().st_mtime
    except OSError:
        return False, 0.0


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    before = _address_file()
    yield
    assert not processes_naming(RAY_DIR_PREFIX), "a test left a Ray process behind"
    assert _address_file() == before, (
        f"a test wrote {DEFAULT_ADDRESS_FILE} (a Ray cluster outside its own temp dir)"
    )


@pytest.fixture
def ray_temp_dir() -> Iterator[str]:
    """A Ray temporary directory of this test's own (short: Ray's socket paths must fit in 107 bytes),
    removed after it; the test fails if a process naming it is still alive a minute after the test."""
    path = tempfile.mkdtemp(prefix=RAY_DIR_PREFIX)
    yield path
    deadline = time.monotonic() + 60
    while (left := processes_naming(path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    shutil.rmtree(path, ignore_errors=True)
    assert not left, f"Ray processes left behind: {left}"


@pytest.fixture
def ray_head(ray_temp_dir: str) -> Iterator[str]:
    """A Ray head node of this test's own (``ray`` next to this interpreter), its address ``host:port``;
    stopped after the test through its own ``ray start --block`` process (SIGTERM: Ray stops the
    processes of that node only)."""
    import sys

    ray = shutil.which("ray", path=str(Path(sys.executable).parent))
    if ray is None:
        pytest.fail("the ray command is not installed next to this interpreter")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("REBATCH")}
    command = [ray, "start", "--head", "--block", f"--port={port}", f"--temp-dir={ray_temp_dir}"]
    command += ["--num-cpus=2", "--disable-usage-stats", "--include-dashboard=false"]
    head = subprocess.Popen(
        command, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        address_file = Path(ray_temp_dir, "ray_current_cluster")
        deadline = time.monotonic() + 120
        while not address_file.exists() and head.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert address_file.exists(), f"ray start --head did not come up (exit status {head.poll()})"
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()
        try:
            head.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


@pytest.fixture
def ray_traces() -> tuple[Path, object]:
    """``(Ray's default current-cluster file, processes_naming)``: what a test checks of its clusters."""
    return DEFAULT_ADDRESS_FILE, processes_naming


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Every record of rebatch's loggers (``rebatch``, ``rebatch.shadow``, ...) at WARNING or above (a handler
    of its own: a trainer imported by
    another test may keep records from the root logger)."""
    out: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = out.append  # type: ignore[method-assign]
    logger = logging.getLogger("rebatch")
    logger.addHandler(handler)
    yield out
    logger.removeHandler(handler)
