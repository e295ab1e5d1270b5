"""A fork server for the mutation runs: torch, JAX and pytest are imported once per session,
and each mutant's pytest run is a fork of that process instead of a fresh interpreter.

    python .ci/mutation/forkserver.py serve SOCKET     # started by .ci/mutation/run for each session
    python .ci/mutation/forkserver.py PYTEST_ARGS...   # a session's test command (in its scratch copy)

Why: a mutant the tests kill at once costs ~3 s of tests but ~5 s more of imports (2 shared cores); the
imports are the same for every mutant. The server imports third-party packages only, never a module of this
repository (those are the mutated ones: each fork imports them afresh from its working directory, without
bytecode files, as cosmic-ray's own runs do). JAX starts no backend in the server (nothing is computed
there), so each fork starts its own.

The client never turns a failure of this machinery into a kill: with no server (``REBATCH_FORKSERVER`` unset
or nothing listening), or a fork that died of a signal or failed before pytest ran, it runs
``python -m pytest`` itself, exactly the command it stands for.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import traceback

SOCKET_ENV = "REBATCH_FORKSERVER"
TRAILER = b"\n\x00rebatch-forkserver-status="  # then the wait status, in decimal, and a newline
NOT_RUN = 250  # exit status of a fork that could not start pytest


def serve(path: str) -> None:
    # third-party only, never a module of this repository; not Hypothesis either: it is a pytest plugin,
    # which pytest refuses to find already imported (its assertion rewriting)
    import jax
    import jax.numpy  # noqa: F401
    import numpy  # noqa: F401
    import pytest
    import tensordict  # noqa: F401
    import torch  # noqa: F401

    sys.dont_write_bytecode = True
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    while True:
        conn, _ = server.accept()
        with conn:
            request = json.loads(conn.makefile("rb").readline())
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child: one pytest run, its output on the connection
                status = NOT_RUN
                try:
                    os.setpgid(0, 0)  # its own group: a kill takes the processes it started too
                    server.close()
                    os.dup2(conn.fileno(), 1)
                    os.dup2(conn.fileno(), 2)
                    os.chdir(request["cwd"])
                    sys.path[0] = request["cwd"]  # as `python -m pytest` there has it
                    os.environ.clear()
                    os.environ.update(request["env"])
                    status = int(pytest.main(request["args"]))
                except BaseException:
                    traceback.print_exc()  # on the connection: the client shows it, then runs pytest itself
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(status)
            wait_status = watch(pid, conn)
            with contextlib.suppress(OSError):  # the client may be gone: nothing to tell
                conn.sendall(TRAILER + str(wait_status).encode() + b"\n")


def watch(pid: int, conn: socket.socket) -> int:
    """Wait for the fork; if its client goes away first (its timeout: an endless mutant), kill its group."""
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            return wait_status
        readable, _, _ = select.select([conn], [], [], 0.2)
        if readable and not conn.recv(1):  # the client never writes again: readable means it closed
            os.killpg(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]


def run(args: list[str]) -> int:
    path = os.environ.get(SOCKET_ENV)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not path:
            raise OSError("no fork server")
        client.connect(path)
    except OSError:
        return direct(args)
    request = {"cwd": os.getcwd(), "args": args, "env": dict(os.environ)}
    client.sendall(json.dumps(request).encode() + b"\n")
    chunks = []
    while chunk := client.recv(1 << 16):
        chunks.append(chunk)
    data = b"".join(chunks)
    head, found, tail = data.rpartition(TRAILER)
    if not found:
        return direct(args)  # the server died
    wait_status = int(tail.strip())
    if os.WIFSIGNALED(wait_status) or os.WEXITSTATUS(wait_status) == NOT_RUN:
        return direct(args)  # the fork died or never ran pytest: its verdict is not the tests'
    sys.stdout.buffer.write(head)
    sys.stdout.flush()
    return os.WEXITSTATUS(wait_status)


def direct(args: list[str]) -> int:
    os.execv(sys.executable, [sys.executable, "-m", "pytest", *args])
    return 1  # not reached


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    else:
        sys.exit(run(sys.argv[1:]))
