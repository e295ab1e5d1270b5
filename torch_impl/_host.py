"""The CPU path's bookkeeping on the host: offsets checked and row lengths derived with NumPy, and the
element-index path without autograd as NumPy scatters.

On the CPU a torch operation on a small tensor costs a few microseconds of dispatch, a NumPy one a
fraction of that, and CPU offsets can be read as NumPy arrays without a copy (``Tensor.numpy()``
shares the storage; several micro-batches' offsets through one ``cat``). `host_lengths` makes exactly the checks of `torch_impl._parts.check_offsets`
(and raises through the same `_explain_bad_offsets`, so every message is the same), in a constant
number of NumPy operations per key; `permute_by_host_indices` writes every value row of a part to its
destination with one NumPy fancy assignment per chunk of ``Settings.cpu_index_chunk`` value rows (the
index buffer stays that small: int64 per value row), on the calling thread; a key of one chunk is
laid end to end first and gathered at once, in a constant number of operations whatever M. Values are moved as
unsigned integers or raw bytes of their own width, so every dtype comes out bit for bit (NaN payloads
included). Neither path is used where a gradient can flow or for tensor subclasses (`host_movable`).
"""

from __future__ import annotations

import ctypes
import functools
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._bridge import numpy_bridge
from ._parts import JaggedPart, Part, _explain_bad_offsets
from ._rows import HostRows
from ._settings import get_settings

__all__ = [
    "address_space",
    "fault_in",
    "fault_origin",
    "fault_plan",
    "fault_step",
    "faulted_in_parallel",
    "fresh_output",
    "host_checkable",
    "host_lengths",
    "host_movable",
    "numpy_bridge",
    "numpy_bytes",
    "permute_by_host_indices",
    "scatter_rows",
    "touch_pages",
]

#: torch dtypes whose ``Tensor.numpy()`` works (the others, bfloat16 and float8 among them, are read
#: through a ``uint8`` view first).
_NUMPY_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    }
)


#: ``madvise`` advice: fault a range's pages in, writable, in one call (Linux >= 5.14).
_MADV_POPULATE_WRITE = 23
#: ``madvise`` advice: back a range with transparent huge pages where the kernel allows it.
_MADV_HUGEPAGE = 14
_PAGE = 4096
_HUGE_PAGE = 2**21


@functools.cache
def _madvise() -> Any:
    """libc's ``madvise``, or None where there is none (not Linux, not glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_THP = Path("/sys/kernel/mm/transparent_hugepage")


@functools.cache
def huge_pages_without_stalls() -> bool:
    """Whether advising ``MADV_HUGEPAGE`` gives huge pages without making the faulting thread wait:
    transparent huge pages ``enabled`` = ``madvise`` (only advised ranges get them; with ``always``
    every range already does) and ``defrag`` = ``defer`` or ``never`` (a huge page only where one is
    free, small pages otherwise). Under the other ``defrag`` modes (``madvise``, the kernel's default,
    ``always``, ``defer+madvise``) an advised fault compacts memory synchronously when no 2 MiB page
    is free: measured, 1.0-3.9 s for the first 168-512 MiB output on a 2-core machine with 24 GiB."""
    try:
        enabled = (_THP / "enabled").read_text()
        defrag = (_THP / "defrag").read_text()
    except OSError:
        return False
    return "[madvise]" in enabled and ("[defer]" in defrag or "[never]" in defrag)


def fresh_output(like: torch.Tensor, shape: tuple[int, ...], *, populate: bool = True) -> torch.Tensor:
    """``like.new_empty(shape)``, its whole pages faulted in at once where it spans at least
    ``Settings.cpu_prefault_min_bytes``: one ``madvise(MADV_POPULATE_WRITE)`` of the pages inside the
    buffer (nothing outside it; contents untouched: they are written next) instead of one page fault
    per 4 KiB as the copy first touches them; from ``Settings.cpu_parallel_fault_min_bytes``, where
    torch has more than one thread, on torch's threads instead (`touch_pages`). From
    ``Settings.cpu_hugepage_min_bytes``, where the kernel gives huge pages without stalling
    (`huge_pages_without_stalls`), the whole 2 MiB pages inside the buffer are first advised
    ``MADV_HUGEPAGE`` (what torch's own allocator does under ``THP_MEM_ALLOC_ENABLE=1``), so each
    faults in as one transparent huge page. Only the buffer's own pages are advised: a buffer that
    large is its own mapping (glibc's largest mmap threshold is 32 MiB), unmapped when the tensor is
    freed. Where an advice is unknown (older kernels) or there is no ``madvise``, nothing happens: the
    copy faults the pages in as before. ``populate=False``: only the huge-page advice and the parallel
    faulting; a writer that goes through the buffer in order faults the rest in as it goes
    (`fault_plan`)."""
    out = like.new_empty(shape)
    nbytes = out.numel() * out.element_size()
    settings = get_settings()
    if nbytes < settings.cpu_prefault_min_bytes or not out.is_cpu:
        return out
    madvise = _madvise()  # an error (EINVAL: advice unknown or refused) changes nothing
    ptr = out.data_ptr()
    if madvise is not None and nbytes >= settings.cpu_hugepage_min_bytes and huge_pages_without_stalls():
        start, end = _inside(ptr, nbytes, _HUGE_PAGE)
        if end > start:
            madvise(start, end - start, _MADV_HUGEPAGE)
    if faulted_in_parallel(nbytes):
        touch_pages(out)
    elif madvise is not None and populate:
        start, end = _inside(ptr, nbytes, _PAGE)
        if end > start:
            fault_in(start, end - start)
    return out


def faulted_in_parallel(nbytes: int) -> bool:
    """Whether `fresh_output` faults a CPU output of ``nbytes`` in on torch's threads (`touch_pages`):
    from ``Settings.cpu_parallel_fault_min_bytes``, where torch has more than one thread."""
    return nbytes >= get_settings().cpu_parallel_fault_min_bytes and torch.get_num_threads() > 1


#: Bytes written at the start of each page by `touch_pages` (a cache line): enough elements that
#: torch's ``fill_`` splits them among its threads (its grain size is 32768) from 2 MiB of pages.
_LINE = 64


def touch_pages(out: torch.Tensor) -> None:
    """Fault in the whole pages inside a fresh contiguous CPU tensor on torch's threads: one ``fill_``
    of the first `_LINE` bytes of each page with zeros (a strided view; the rest of the page is left
    as the kernel zeroed it), which torch splits among its threads; the writer that comes next
    overwrites them. Faults are taken in parallel this way, where one ``madvise`` takes them on the
    calling thread (see ``Settings.cpu_parallel_fault_min_bytes``)."""
    ptr, nbytes = out.data_ptr(), out.numel() * out.element_size()
    start, end = _inside(ptr, nbytes, _PAGE)
    pages = (end - start) // _PAGE
    if pages > 0:
        raw = out.detach().reshape(-1).view(torch.uint8)[start - ptr : end - ptr]
        raw.view(pages, _PAGE)[:, :_LINE].fill_(0)


def fault_plan(out: torch.Tensor, ends: np.ndarray) -> list[tuple[int, int, int]]:
    """How a writer of ``out``'s rows, in order, faults the output's pages in as it goes: a list of
    ``(rows, start, size)``: fault in the ``size`` bytes from address ``start`` (0: nothing), then write
    the next ``rows`` rows. ``ends`` (``[B]``): where each row's bytes end in ``out``.

    From ``Settings.cpu_fault_chunks_min_bytes``, each group faults in at least `fault_step`
    bytes (more where a long row spans several; whole pages inside the buffer, by one
    ``madvise(MADV_POPULATE_WRITE)`` each, just before the first row that writes them), so the rows
    are copied into pages the kernel has just zeroed, still in cache, instead of pages faulted in all
    at once long before (whose lines the copy then reads back from memory before writing them);
    smaller outputs are faulted in whole before the first row. Where `fresh_output` would not fault
    the buffer in (below ``cpu_prefault_min_bytes``, no ``madvise``): one group of every row, nothing
    faulted in. A constant number of NumPy operations."""
    rows = int(ends.shape[0])
    settings = get_settings()
    nbytes = int(ends[-1]) if rows else 0
    if nbytes < settings.cpu_prefault_min_bytes or _madvise() is None or not out.is_cpu or faulted_in_parallel(nbytes):
        return [(rows, 0, 0)]  # nothing to fault in, or `fresh_output` has faulted it all in
    ptr = out.data_ptr()
    start, end = _inside(ptr, nbytes, _PAGE)
    if end <= start:
        return [(rows, 0, 0)]
    if nbytes < settings.cpu_fault_chunks_min_bytes:  # the whole buffer, then every row
        return [(rows, start, end - start)]
    step = fault_step(nbytes)
    bounds = np.arange(start, end, step, dtype=np.int64)  # each chunk's first address
    first = np.searchsorted(ends + ptr, bounds, side="right")  # the first row that writes there
    new = np.flatnonzero(np.diff(first, prepend=-1))  # chunks whose first row differs: groups
    begins = bounds[new]
    sizes = np.append(begins[1:], end) - begins
    counts = np.diff(np.append(first[new], rows))
    return [(int(first[0]), 0, 0), *zip(counts.tolist(), begins.tolist(), sizes.tolist(), strict=True)]


def fault_origin(out: torch.Tensor) -> int:
    """The byte of ``out`` from which `fault_plan` counts its groups: its first whole page's (where
    `_inside` starts)."""
    return -out.data_ptr() % _PAGE


def fault_step(nbytes: float) -> int:
    """The bytes a `fault_plan` group of an output of ``nbytes`` faults in at least:
    ``Settings.cpu_fault_chunk_bytes`` in whole pages (at least one), and a whole huge page where
    `fresh_output` advised huge pages (one faults in whole at its first touch)."""
    settings = get_settings()
    step = max(_PAGE, settings.cpu_fault_chunk_bytes // _PAGE * _PAGE)
    if nbytes >= settings.cpu_hugepage_min_bytes and huge_pages_without_stalls():
        step = max(step, _HUGE_PAGE)
    return step


def fault_in(start: int, size: int) -> None:
    """Fault in ``size`` bytes of pages from ``start`` (one group of a `fault_plan`; 0: nothing)."""
    if size:
        madvise = _madvise()
        if madvise is not None:
            madvise(start, size, _MADV_POPULATE_WRITE)


def _inside(ptr: int, nbytes: int, page: int) -> tuple[int, int]:
    """The first and past-the-last address of the whole ``page``-sized pages inside ``[ptr, ptr + nbytes)``."""
    return -(-ptr // page) * page, (ptr + nbytes) // page * page


def numpy_bytes(x: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor's elements as a 1-D NumPy array of bytes (shared, not copied)."""
    if not x.requires_grad and x.dtype in _NUMPY_DTYPES:
        a = x.numpy()
        return (a if a.ndim == 1 else a.reshape(-1)).view(np.uint8)
    return x.detach().reshape(-1).view(torch.uint8).numpy()


@functools.cache
def address_space() -> memoryview:
    """The process's memory as one writable 1-D memoryview of bytes, indexed by address: ``m[a:b]``
    is the bytes from address ``a`` to ``b``. Made once (one ctypes array type, nothing mapped or
    read): slices of it are how the host copies name their pieces (`torch_impl._rowcopy`), with no
    view object per tensor. Nothing checks an address against it: every user checks its ranges
    against the tensors that own them first (`torch_impl._rowcopy.check_ranges`)."""
    return memoryview((ctypes.c_char * sys.maxsize).from_address(0)).cast("B")


def host_checkable(parts: Sequence[JaggedPart]) -> bool:
    """CPU offsets of plain tensors, which NumPy can read in place."""
    return numpy_bridge() and all(type(p.offsets) is torch.Tensor and p.offsets.is_cpu for p in parts)


def host_movable(parts: Sequence[Part]) -> bool:
    """Values NumPy may move: CPU plain tensors, contiguous, and no gradient to carry."""
    grad = torch.is_grad_enabled()
    return all(
        type(p.values) is torch.Tensor
        and p.values.is_cpu
        and not (grad and p.values.requires_grad)
        and p.values.is_contiguous()
        for p in parts
    )


def host_lengths(parts: Sequence[JaggedPart], key: Any, rows: HostRows) -> tuple[np.ndarray, np.ndarray]:
    """`check_offsets` on the host: ``offsets[0] == 0``, non-decreasing, ``offsets[-1] == len(values)``
    for every part (`InvalidJaggedError` otherwise, the same message); returns every row's length and
    its first value row inside its part (int64 ``[B]`` each, concatenation order). ``rows``: the
    call's `HostRows` (the parts' row counts)."""
    # the parts' offsets end to end: one ``cat`` and one NumPy view (a view of each costs ~1 µs)
    flat = parts[0].offsets.numpy() if len(parts) == 1 else torch.cat([p.offsets for p in parts]).numpy()
    starts = flat[:-1]
    lengths = flat[1:] - starts
    if len(parts) > 1:
        lengths, starts = lengths[rows.steps], starts[rows.steps]
    probe = flat[rows.bounds]  # each part's first offsets, then its last ones, which less the sizes are 0
    probe[len(parts) :] -= np.fromiter((p.values.shape[0] for p in parts), dtype=np.int64, count=len(parts))
    if probe.any() or (lengths < 0).any():
        _explain_bad_offsets(parts, key)
    return lengths, starts


def _value_rows(x: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor ``[N, *F]`` as a 1-D NumPy array of ``N`` elements, each one value row's
    bytes (an unsigned integer of its width, or raw bytes), shared."""
    raw = numpy_bytes(x)
    row_bytes = x.element_size() * math.prod(x.shape[1:])
    kind = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(row_bytes)
    return raw.view(kind if kind is not None else np.dtype((np.void, row_bytes)))


def permute_by_host_indices(
    parts: Sequence[JaggedPart],
    lengths: np.ndarray,
    out_offsets: np.ndarray,
    rows: HostRows,
    total: int,
    out_lengths: np.ndarray,
) -> torch.Tensor:
    """Output values ``[N, *F]``: row ``k`` of the parts' rows end to end (``lengths`` ``[B]``) written
    at output row ``perm[k]``, which starts at ``out_offsets[perm[k]]`` (``[B + 1]``; the output
    rows' lengths ``out_lengths = lengths[inv]``); each part's value rows scattered to their
    destinations, ``Settings.cpu_index_chunk`` value rows at a time."""
    assert rows.perm is not None
    first = parts[0].values
    out = fresh_output(first, (total, *first.shape[1:]))
    if total == 0 or (first.element_size() * math.prod(first.shape[1:])) == 0:
        return out
    dest = _value_rows(out)
    chunk = get_settings().cpu_index_chunk
    if total <= chunk:  # one chunk: the parts laid end to end (a copy of at most a chunk), one gather
        assert rows.inv is not None
        src = _value_rows(torch.cat([p.values for p in parts]) if len(parts) > 1 else first)
        starts = np.zeros(lengths.shape[0], dtype=np.int64)
        lengths[:-1].cumsum(out=starts[1:])
        where = (starts[rows.inv] - out_offsets[:-1]).repeat(out_lengths)
        where += np.arange(total, dtype=np.int64)
        np.take(src, where, out=dest)
        return out
    dest_starts = out_offsets[rows.perm]
    row = 0
    for p in parts:
        n, r = p.values.shape[0], p.rows
        if n:
            local = p.offsets.numpy()
            shift = dest_starts[row : row + r] - local[:-1]
            src = _value_rows(p.values)
            if n <= chunk:
                where = shift.repeat(lengths[row : row + r])
                where += np.arange(n, dtype=np.int64)
                _scatter(dest, where, src)
            else:
                for a in range(0, n, chunk):
                    b = min(n, a + chunk)
                    r0 = int(np.searchsorted(local, a, "right")) - 1
                    r1 = int(np.searchsorted(local, b, "left"))
                    counts = np.minimum(local[r0 + 1 : r1 + 1], b) - np.maximum(local[r0:r1], a)
                    where = shift[r0:r1].repeat(counts)
                    where += np.arange(a, b, dtype=np.int64)
                    _scatter(dest, where, src[a:b])
        row += r
    return out


def scatter_rows(parts: Sequence[Part], perm: np.ndarray, total: int) -> torch.Tensor:
    """Output ``[B, *F]`` (``B = total``): row ``k`` of the parts' values laid end to end written at row
    ``perm[k]`` (``[B]``), one NumPy fancy assignment of whole rows per part (each row one element of
    its width, `_value_rows`), on the calling thread."""
    first = parts[0].values
    out = fresh_output(first, (total, *first.shape[1:]))
    if total == 0 or out.numel() == 0:
        return out
    dest, row = _value_rows(out), 0
    for p in parts:
        n = p.values.shape[0]
        if n:
            _scatter(dest, perm[row : row + n], _value_rows(p.values))
        row += n
    return out


def _scatter(dest: np.ndarray, where: np.ndarray, src: np.ndarray) -> None:
    """``dest[where] = src``: one chunk of the NumPy index path."""
    dest[where] = src
