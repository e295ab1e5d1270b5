"""Whole-row copies on the CPU: each output row is one contiguous copy of a source row, with no index buffer.

The output ``[N, *F]`` is cut into one contiguous range of rows per CPU thread (about equal numbers of
elements); each thread fills its range with one ``torch.cat(rows, out=range)``, where ``rows`` are views
of the source rows in output order. Run in threads with a single intra-op thread each, ``cat`` takes
its serial path (one ``memcpy`` per row), and the threads have the kernel map the fresh output's pages
in parallel (`map_pages`), which is most of the cost of writing a new buffer. The per-row views come
from one split per micro-batch (made in C++, without autograd's view tracking: nothing here is
differentiated), with Python's cyclic garbage collector paused (`collector_paused`: tens of thousands
of short-lived tensors would otherwise set off full collections).

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
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from ._parts import Part

#: Output bytes from which the copies are shared among the CPU threads.
THREADS_MIN_BYTES = 2**19

__all__ = ["collector_paused", "copy_rows", "finish", "map_pages", "POPULATE", "THREADS_MIN_BYTES"]

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
    """The process's copy threads, one per intra-op thread (made again after a fork, or when torch's
    thread count changes)."""
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


PAGE_BYTES = 4096
#: Map a fresh range's pages with ``madvise(MADV_POPULATE_WRITE)`` (Linux >= 5.14) rather than one
#: fault per page (measured 4 to 8% faster on the longest copies). False: one write per page.
POPULATE = True
_MADV_POPULATE_WRITE = 23
#: Bytes per ``madvise`` call: each call holds the process's memory-map lock, which the calling
#: thread's allocations wait for (one call per range measured 10% slower on a 128 MiB output).
POPULATE_CHUNK_BYTES = 2**22


def _find_madvise() -> Any:
    """libc's ``madvise`` (Linux only), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_madvise = _find_madvise()


def map_pages(piece: torch.Tensor) -> None:
    """Have the kernel map ``piece``'s pages before it is written: a fresh buffer's pages are
    otherwise mapped on first write, one fault per 4 KiB page, most of the cost of filling it. The
    whole pages inside ``piece`` are mapped by ``madvise(MADV_POPULATE_WRITE)``, ``POPULATE_CHUNK_BYTES``
    per call, which leaves their contents alone; where the kernel refuses it (older than 5.14, or not
    Linux), one element per page is written instead. Either way the rows are copied over the range
    afterwards."""
    start = piece.data_ptr()
    first = -(-start // PAGE_BYTES) * PAGE_BYTES
    end = (start + piece.nbytes) // PAGE_BYTES * PAGE_BYTES
    if POPULATE and _madvise is not None and end > first:
        at = first
        while at < end:
            n = min(POPULATE_CHUNK_BYTES, end - at)
            if _madvise(at, n, _MADV_POPULATE_WRITE) != 0:
                break
            at += n
        else:
            return
    piece[:: max(1, PAGE_BYTES // piece.element_size())].zero_()


def _fill(piece: torch.Tensor, rows: Future[list[torch.Tensor]], inference: bool) -> None:
    """On a copy thread: map ``piece``'s pages (`map_pages`), then, once the calling thread has made
    them, copy ``rows`` into ``piece`` back to back."""
    with torch.inference_mode(inference), torch.no_grad():
        map_pages(piece)
        torch.cat(rows.result(), out=piece)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off (process-wide) within the block. The row views are tens
    of thousands of short-lived tensors; a collection set off while they are alive would walk every
    object of the process. `postprocess_batch` keeps it paused until its copies have finished and
    their views are released: measured about 4% faster on the longest copies."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def finish(pending: list[Future[None]], *, raise_errors: bool = True) -> None:
    """Wait for every copy left running (all of them, even if one failed), then raise the first error
    (unless ``raise_errors`` is false: the caller is already raising one of its own)."""
    error: BaseException | None = None
    while pending:
        try:
            pending.pop(0).result()
        except BaseException as e:  # re-raised below, once the other copies have ended
            error = error or e
    if error is not None and raise_errors:
        raise error


def copy_rows(
    parts: Sequence[Part],
    lengths: torch.Tensor,
    inv: torch.Tensor,
    out_offsets: torch.Tensor,
    total: int,
    pending: list[Future[None]] | None = None,
) -> torch.Tensor:
    """Output values ``[N, *F]`` (CPU, contiguous parts): ``[rows[k] for k in inv]`` laid end to end,
    where ``rows`` are the parts' rows in concatenation order (``lengths`` ``[B]``: their lengths, in
    rows of ``values``) and ``inv`` ``[B]`` is the inverse permutation; ``out_offsets`` ``[B + 1]`` are
    the output's offsets (in rows of ``values``).

    With ``pending`` (a list), copies run on the copy threads may be left running: their futures are
    appended, and the output must not be read before `finish` (pending).
    """
    first = parts[0].values
    inner = math.prod(first.shape[1:])
    out = first.new_empty((total, *first.shape[1:]))
    flat = out.view(-1)
    threaded = _threads_allowed(parts, out)
    futures: list[Future[None]] = []
    views: list[Future[list[torch.Tensor]]] = []  # each thread's rows, handed over once made
    if threaded:
        # One range of output rows per thread, with about equal numbers of elements. The threads
        # start by mapping their range's pages (the kernel's work of a fresh buffer) while this
        # thread makes the row views, then copy the rows.
        threads = min(torch.get_num_threads(), out_offsets.numel() - 1)
        targets = torch.linspace(0, total, threads + 1, dtype=torch.float64)[1:-1].round().to(torch.int64)
        cuts = [0, *torch.searchsorted(out_offsets, targets).tolist(), out_offsets.numel() - 1]
        starts = (out_offsets[cuts] * inner).tolist()
        ranges = [
            (cuts[t], cuts[t + 1], flat[starts[t] : starts[t + 1]]) for t in range(threads) if cuts[t] < cuts[t + 1]
        ]
        pool = _workers(torch.get_num_threads())
        views = [Future() for _ in ranges]
        inference = torch.is_inference_mode_enabled()
        futures = [pool.submit(_fill, piece, v, inference) for (_, _, piece), v in zip(ranges, views, strict=True)]
    try:
        with collector_paused():
            sizes = (lengths * inner).tolist()  # every row's element count, all parts at once
            bounds = list(itertools.accumulate((p.rows for p in parts), initial=0))
            rows = tuple(
                itertools.chain.from_iterable(
                    torch.unsafe_split_with_sizes(p.values.view(-1), sizes[a:b])
                    for p, a, b in zip(parts, bounds[:-1], bounds[1:], strict=True)
                )
            )
            ordered = [rows[k] for k in inv.tolist()]
            del rows
            if not threaded:
                torch.cat(ordered, out=flat)
                return out
            for (a, b, _), v in zip(ranges, views, strict=True):
                v.set_result(ordered[a:b])
            del ordered
    except BaseException as e:
        for v in views:
            if not v.done():
                v.set_exception(e)
        finish(futures, raise_errors=False)
        raise
    if pending is None:
        finish(futures)
    else:
        pending.extend(futures)
    return out
