"""The benchmark harness's worker processes: each runs one commit's ``ref``, ``torch_impl`` and
``property_tests`` (an extract made by `baseline_root`) or this checkout's, and answers JSON lines on its
pipes (`rebatch.bench.versus`, `rebatch.bench.checkcost` and `rebatch.bench.devicepath` each serve their
own protocol with ``--worker``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["IMPL_ENV", "ROOT", "Worker", "baseline_root", "describe", "serve"]

#: This checkout.
ROOT = Path(__file__).resolve().parents[2]


#: The worker's implementation: unset, ``torch_impl``'s drop-in; ``verl``, verl's own function.
IMPL_ENV = "REBATCH_VERSUS_IMPL"


class Worker:
    """One worker process with ``ref``/``torch_impl`` from ``root``; ``verl``: its ``impl`` is verl's own
    ``postprocess_batch_func`` instead of rebatch's drop-in; ``module``: the worker's module (its
    ``--worker`` serves the harness: `rebatch.bench.devicepath` has its own)."""

    def __init__(self, root: Path, *, verl: bool = False, module: str = "rebatch.bench.versus") -> None:
        env = dict(os.environ)
        env.pop(IMPL_ENV, None)
        if verl:
            env[IMPL_ENV] = "verl"
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(root), str(ROOT)]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            cwd=root,  # ``-m`` puts the working directory first on sys.path
        )
        self.root = root

    def ask(self, **msg: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.proc.wait()}")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(RuntimeError, BrokenPipeError, json.JSONDecodeError):
                self.ask(cmd="quit")
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def baseline_root(commit: str) -> Path:
    """An extract of ``ref``, ``torch_impl`` and ``property_tests`` at ``commit`` (cached under
    ``.cache/baseline-<commit>``). Extracted into a scratch folder beside it and renamed into place, so
    a process that finds the folder finds it whole, also while another extracts the same commit (CI's
    test lanes run side by side in one checkout): the first rename wins, the other extract is dropped."""
    full = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    folder = ROOT / ".cache" / f"baseline-{full[:7]}"
    if folder.exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", full, "ref", "torch_impl", "property_tests"],
        check=True,
        capture_output=True,
    ).stdout
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
        with contextlib.suppress(OSError):  # another process renamed its extract there first
            scratch.rename(folder)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # gone already where the rename took it
    return folder


def describe() -> str:
    """This checkout's commit, with ``+changes`` where its libraries differ from it."""
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "ref", "torch_impl"], capture_output=True
    ).returncode
    return (head or "unknown") + ("+changes" if dirty else "")


def serve(handle: Callable[[dict[str, Any]], dict[str, Any] | None]) -> int:
    """A worker's loop: each JSON line of stdin a command (``{"cmd": ...}``), each answered by one JSON
    line on stdout, ``handle(msg)``'s reply (None: an unknown command, answered as an error), until
    ``quit`` or the end of stdin. Anything else printed meanwhile goes to stderr."""
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but replies on the pipe
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "quit":
            return 0
        reply = handle(msg)
        if reply is None:
            reply = {"error": f"unknown command {msg['cmd']!r}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0
