"""Whole-row copies on the CPU: each output row is one contiguous copy of a source row, with no index buffer.

The output ``[N, *F]`` is cut into one contiguous range of rows per CPU thread (about equal numbers of
elements); each thread fills its range with one ``torch.cat(rows, out=range)``, where ``rows`` are views
of the source rows in output order. Run in threads with a single intra-op thread each, ``cat`` takes
its serial path (one ``memcpy`` per row), and the threads touch the fresh output's pages in parallel,
which is most of the cost of writing a new buffer. The per-row views come from one split per
micro-batch (made in C++, without autograd's view tracking: nothing here is differentiated), with
Python's cyclic garbage collector paused while they are made (tens of thousands of short-lived
tensors would otherwise set off full collections).

The copies may be left running (``pending``): the caller prepares the next key's views meanwhile and
waits for every copy before any output is handed out.

The threads are used only where nothing thread-local could be lost on the way: a plain CPU tensor,
no autograd, no active ``TorchDispatchMode`` or ``TorchFunctionMode``; inference mode is carried over.
Elsewhere (and under ``THREADS_MIN_BYTES``) the same copies run on the calling thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import itertools
import math
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ._parts import Part

#: Output bytes from which the copies are shared among the CPU threads.
THREADS_MIN_BYTES = 4 * 2**20

__all__ = ["copy_rows", "finish", "THREADS_MIN_BYTES"]

_lock = threading.Lock()
_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # (pid, threads, pool)


def _one_intra_op_thread() -> None:
    """Worker set-up: torch's per-thread OpenMP state initialised, then this thread alone set to one
    OpenMP thread (``omp_set_num_threads`` is per thread; ``torch.set_num_threads`` would also change
    the default of every thread started later in the process)."""
    torch.get_num_threads()  # torch's lazy per-thread initialisation, so it cannot undo the line below
    # Without the OpenMP symbol (another threading back end), cat takes its general path: same result.
    with contextlib.suppress(AttributeError, OSError, TypeError):
        ctypes.CDLL(None).omp_set_num_threads(1)


def _workers(threads: int) -> ThreadPoolExecutor:
    """The process's copy threads (made again after a fork, or when torch's thread count changes)."""
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid() or _pool[1] != threads:
            if _pool is not None and _pool[0] == os.getpid():
                _pool[2].shutdown(wait=False)
            pool = ThreadPoolExecutor(threads, thread_name_prefix="rebatch-copy", initializer=_one_intra_op_thread)
            _pool = (os.getpid(), threads, pool)
        return _pool[2]


def _threads_allowed(parts: Sequence[Part], out: torch.Tensor) -> bool:
    return (
        out.nbytes >= THREADS_MIN_BYTES
        and torch.get_num_threads() > 1
        and all(type(p.values) is torch.Tensor for p in parts)
        and torch._C._len_torch_dispatch_stack() == 0
        and not torch._C._is_torch_function_mode_enabled()
    )


def _cat_into(rows: Sequence[torch.Tensor], out: torch.Tensor, inference: bool) -> None:
    with torch.inference_mode(inference), torch.no_grad():
        torch.cat(rows, out=out)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def finish(pending: list[Future[None]]) -> None:
    """Wait for every copy left running (all of them, even if one failed), then raise the first error."""
    error: BaseException | None = None
    while pending:
        try:
            pending.pop(0).result()
        except BaseException as e:  # re-raised below, once the other copies have ended
            error = error or e
    if error is not None:
        raise error


def copy_rows(
    parts: Sequence[Part],
    inv: torch.Tensor,
    out_offsets: torch.Tensor,
    total: int,
    pending: list[Future[None]] | None = None,
) -> torch.Tensor:
    """Output values ``[N, *F]`` (CPU, contiguous parts): ``[rows[k] for k in inv]`` laid end to end,
    where ``rows`` are the parts' rows in concatenation order and ``inv`` ``[B]`` is the inverse
    permutation; ``out_offsets`` ``[B + 1]`` are the output's offsets (in rows of ``values``).

    With ``pending`` (a list), copies run on the copy threads may be left running: their futures are
    appended, and the output must not be read before `finish` (pending).
    """
    first = parts[0].values
    inner = math.prod(first.shape[1:])
    out = first.new_empty((total, *first.shape[1:]))
    flat = out.view(-1)
    with _collector_paused():
        rows = tuple(
            itertools.chain.from_iterable(
                torch.unsafe_split_with_sizes(p.values.view(-1), (p.offsets.diff() * inner).tolist()) for p in parts
            )
        )
        ordered = [rows[k] for k in inv.tolist()]
        del rows
        if not _threads_allowed(parts, out):
            torch.cat(ordered, out=flat)
            return out
        threads = min(torch.get_num_threads(), len(ordered))
        # Cut points: the output row where each thread's share of the elements begins.
        targets = torch.linspace(0, total, threads + 1, dtype=torch.float64)[1:-1].round().to(torch.int64)
        cuts = [0, *torch.searchsorted(out_offsets, targets).tolist(), len(ordered)]
        starts = (out_offsets[cuts] * inner).tolist()
        inference = torch.is_inference_mode_enabled()
        pool = _workers(threads)
        futures = [
            pool.submit(_cat_into, ordered[cuts[t] : cuts[t + 1]], flat[starts[t] : starts[t + 1]], inference)
            for t in range(threads)
            if cuts[t] < cuts[t + 1]
        ]
        del ordered
    if pending is None:
        finish(futures)
    else:
        pending.extend(futures)
    return out
