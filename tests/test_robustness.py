"""No hang, no side effect: interrupts at random points, concurrent calls with different torch thread
counts, ``fork`` during a call, another thread changing the collector; the process's state (collector,
thread counts, environment) is what it was, in every thread and in a forked child.

The stress test is bounded (a budget of seconds, well under 60 on two busy cores)."""

from __future__ import annotations

import gc
import itertools
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import torch_impl
from property_tests.compare import assert_same
from property_tests.data import jagged
from property_tests.kernels import forced

#: the two production paths (the forced one- and three-value chunks are for tiny inputs only)
PATHS = ["host_scatter", "element_indices"]
STRESS_BUDGET_S = 20.0  # wall time of the stress test's interrupt phase and thread phase together


def _call_inputs(
    rows: int, mean_len: int, *, seed: int = 0, micro_batches: int = 4
) -> tuple[list[Any], list[list[int]]]:
    """A call of about ``rows * mean_len * 4`` bytes per key (2 keys), rows long and short."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(rows, generator=g).tolist()
    cuts = [rows * m // micro_batches for m in range(micro_batches + 1)]
    indices = [sorted(perm[a:b]) for a, b in itertools.pairwise(cuts)]
    outs = []
    for part in indices:
        lengths = torch.randint(1, 2 * mean_len, (len(part),), generator=g).tolist()
        mo = {f"k{k}": jagged(torch.randn(sum(lengths), generator=g), lengths) for k in range(2)}
        mo["dense"] = torch.randn(len(part), 3, generator=g)
        outs.append({"model_output": mo, "loss": torch.tensor(1.0), "metrics": {"m": 1.0}})
    return outs, indices


def _state() -> dict[str, Any]:
    """What a call must leave as it found it (process-wide and the calling thread's)."""
    return {
        "gc_enabled": gc.isenabled(),
        "gc_threshold": gc.get_threshold(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "default_dtype": torch.get_default_dtype(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "switch_interval": sys.getswitchinterval(),
        "environ": dict(os.environ),
        "settings": torch_impl.get_settings(),
    }


def _threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.ident is not None}


# An interrupt that lands in a finalizer (a weakref callback of torch's) is ignored by Python by design,
# and reported as "unraisable": that is the interrupt being dropped, not the library failing.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
# Complex by design: one scenario's steps in order.
def test_stress_interrupts_and_concurrent_thread_counts() -> None:  # noqa: C901
    """KeyboardInterrupt (from a signal handler) at random points of calls of 1 to 32 MiB, on every path;
    then threads with different torch thread counts calling at once. Every call afterwards returns
    the exact result; the inputs are unchanged; no thread is left behind."""
    before_threads, before_state = _threads(), _state()
    sizes = [(256, 1024), (1024, 4096)]  # 2 keys of float32: about 2 and 32 MiB
    calls = {size: _call_inputs(*size, seed=i) for i, size in enumerate(sizes)}
    inputs_copy = {
        size: [[v.clone() for v in o["model_output"].values()] for o in outs]
        for size, (outs, _) in calls.items()
    }
    expected = {size: torch_impl.postprocess_batch(*calls[size]) for size in sizes}
    deadline = time.monotonic() + STRESS_BUDGET_S / 2
    rng = random.Random(0)

    armed = [False]

    def interrupt(signum: int, frame: Any) -> None:
        if armed[0]:
            armed[0] = False  # at most one interrupt per arming
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    interrupted = completed = 0
    try:
        while time.monotonic() < deadline or interrupted < 8:
            size = rng.choice(sizes)
            path = rng.choice(PATHS)
            start = time.perf_counter()
            try:
                try:
                    with forced(path):
                        armed[0] = True
                        signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-5, 0.02))
                        torch_impl.postprocess_batch(*calls[size])
                finally:
                    armed[0] = False
                    signal.setitimer(signal.ITIMER_REAL, 0)
                completed += 1
            except KeyboardInterrupt:
                interrupted += 1
            except Exception as err:  # an interrupt inside a callback of torch's C++ comes back wrapped
                if "KeyboardInterrupt" not in str(err):
                    raise
                interrupted += 1
            if time.perf_counter() - start > 30:
                pytest.fail("a call took more than 30 s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert interrupted >= 8, (interrupted, completed)
    for path in PATHS:  # the library is usable: every path, exact
        with forced(path):
            for size in sizes:
                assert_same(torch_impl.postprocess_batch(*calls[size]), expected[size])

    # concurrent calls from threads whose torch thread counts differ
    errors: list[BaseException] = []
    start_together = threading.Barrier(4)
    until = time.monotonic() + STRESS_BUDGET_S / 4

    def worker(threads: int, path: str) -> None:
        try:
            torch.set_num_threads(threads)
            start_together.wait(timeout=30)
            with forced(path):
                while time.monotonic() < until:
                    for size in sizes:
                        assert_same(torch_impl.postprocess_batch(*calls[size]), expected[size])
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    main_threads = torch.get_num_threads()
    workers = [
        threading.Thread(target=worker, args=(n, p), name=f"stress-{n}")
        for n, p in zip(
            (1, 2, 3, 4), ("host_scatter", "element_indices", "host_scatter", "element_indices"), strict=True
        )
    ]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=60)
        assert not [w.name for w in workers if w.is_alive()], "a thread is still inside a call after 60 s"
    finally:
        torch.set_num_threads(main_threads)
    assert not errors, errors
    for size in sizes:
        assert_same(torch_impl.postprocess_batch(*calls[size]), expected[size])
    for size, (outs, _) in calls.items():  # no call, interrupted or not, wrote into its inputs
        assert_same([list(o["model_output"].values()) for o in outs], inputs_copy[size])
    assert _threads() == before_threads
    assert _state() == before_state


@pytest.mark.parametrize("path", PATHS)
def test_a_call_leaves_the_process_as_it_found_it(path: str) -> None:
    outs, indices = _call_inputs(512, 512)
    seen: dict[str, Any] = {}

    def in_a_fresh_thread() -> None:
        before = _state()
        with forced(path):
            torch_impl.postprocess_batch(outs, indices)
        seen["fresh"] = (before, _state())

    before = _state()
    with forced(path):
        torch_impl.postprocess_batch(outs, indices)
        with torch.inference_mode():
            torch_impl.postprocess_batch(outs, indices)
    assert _state() == before
    t = threading.Thread(target=in_a_fresh_thread)
    t.start()
    t.join(timeout=60)
    assert seen["fresh"][0] == seen["fresh"][1]


def _during_a_call(action: Callable[[], None], *, rows: int = 2048, mean_len: int = 2048) -> None:
    """Run ``action`` on another thread while the calling thread is inside large calls."""
    outs, indices = _call_inputs(rows, mean_len)
    inside = threading.Event()
    done = threading.Event()

    def other() -> None:
        inside.wait(timeout=30)
        time.sleep(0.005)
        action()
        done.set()

    t = threading.Thread(target=other)
    t.start()
    try:
        inside.set()
        while not done.is_set():
            torch_impl.postprocess_batch(outs, indices)
    finally:
        t.join(timeout=60)
    assert not t.is_alive()


def test_another_threads_gc_disable_during_a_call_stays() -> None:
    assert gc.isenabled()
    try:
        _during_a_call(gc.disable)
        assert not gc.isenabled(), "the call switched the collector back on"
    finally:
        gc.enable()


_FORK_SCRIPT = """
import gc, os, sys, threading, time
import torch, torch_impl
from property_tests.data import jagged
x = [jagged(torch.randn(2048 * 256), [2048] * 256) for _ in range(4)]
idx = [list(range(m, 1024, 4)) for m in range(4)]
outs = [{"model_output": {"x": v}} for v in x]
inside, stop = threading.Event(), threading.Event()
def loop():
    while not stop.is_set():
        inside.set()
        torch_impl.postprocess_batch(outs, idx)
t = threading.Thread(target=loop)
t.start()
inside.wait(30)
time.sleep(0.01)
pid = os.fork()
if pid == 0:
    small = [{"model_output": {"x": jagged(torch.arange(3.0), [1, 2])}}]
    torch_impl.postprocess_batch(small, [[1, 0]])
    os._exit(0 if gc.isenabled() else 3)
_, status = os.waitpid(pid, 0)
stop.set()
t.join(30)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_fork_during_a_call_gives_a_child_with_the_collector_on() -> None:
    """In a fresh interpreter (no JAX, whose own fork hook warns): a thread is inside calls, the main
    thread forks; the child has the collector on and can call. Exit 3: collector off; a timeout: hung."""
    done = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_interpreter_exits_promptly_with_calls_in_flight() -> None:
    script = textwrap.dedent(
        """
        import threading, torch, torch_impl
        from property_tests.data import jagged
        x = [jagged(torch.randn(4096 * 64), [4096] * 64) for _ in range(4)]
        idx = [list(range(m, 256, 4)) for m in range(4)]
        outs = [{"model_output": {"x": v}} for v in x]
        def loop():
            for _ in range(20):
                torch_impl.postprocess_batch(outs, idx)
        threads = [threading.Thread(target=loop) for _ in range(2)]
        for t in threads:
            t.start()
        torch_impl.postprocess_batch(outs, idx)
        assert len(threading.enumerate()) == 3  # main and ours: rebatch starts none
        """
    )
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.getcwd(),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert time.monotonic() - start < 120
