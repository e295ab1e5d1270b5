"""The tuning knobs of ``torch_impl``, in one immutable object, with a scoped override.

The current `Settings` live in a `contextvars.ContextVar`: `use_settings` changes them for the calling
thread (or asyncio task) only, inside its ``with`` block, and restores them on exit, even on an
exception. Nothing process-wide is ever changed; a new thread starts from the defaults.

The knobs choose between data-movement paths that give identical results (see ``docs/kernels.md``);
they trade speed and peak memory, never correctness. Each default cites the measurement behind it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

__all__ = ["Settings", "get_settings", "use_settings"]


@dataclasses.dataclass(frozen=True)
class Settings:
    """How ``torch_impl`` moves data (identical results whatever the values)."""

    #: Mean elements per row (values per row times the trailing size) from which CPU row copies (one
    #: contiguous copy per row, on the calling thread) are used instead of element indices. Measured on
    #: 2 cores, B=1024, M=16, float32, fresh heap pages each call, with row copies as NumPy byte slices
    #: (`python -m rebatch.bench.crossover --lengths 16 32 64 128 256 512 1024`, torch 2.13): quiet,
    #: indices/rows 0.94 at 32 elements, 1.04 at 64, 1.11-1.15 from 128; with two busy processes,
    #: 0.97 at 32, 1.21 at 64. Row copies never go parallel, so they also hold under contention,
    #: where the element-index kernels (OpenMP) collapsed at large outputs (0.13x the per-row baseline
    #: at B=4096, L=512, M=1, when this was 1024). 0 forces row copies wherever they apply;
    #: ``math.inf`` never.
    row_copy_min_elements: float = 64
    #: Output bytes each chunk of the element-index path covers (rounded up to whole value rows): its
    #: destinations (int64, one per value row) are built for one chunk at a time, so the index
    #: buffer's peak is ``8 * ceil(index_chunk_bytes / row_bytes)`` bytes (32 MiB for float32 values,
    #: 64 MiB for bfloat16, less for a trailing shape), and each further chunk costs 10 operations. 16
    #: MiB keeps a call's operations at a constant per key up to 16 MiB of output a key, and at most
    #: 10 more per further 16 MiB (the launch bound, `tests/test_launch_bound.py`); chunk size made no
    #: measurable difference to CPU time from 1 MiB up (`docs/kernels.md`).
    index_chunk_bytes: int = 16 * 2**20
    #: On the CPU, value rows per chunk of the element-index path instead (every chunk's kernels then
    #: stay below torch's OpenMP grain size, 32768, and run on the calling thread: no parallel region
    #: to collapse under contention, and a small index buffer that stays in cache). Measured on 2
    #: busy cores (`docs/kernels.md`): 2**14 beat one chunk per key of 16 MiB at every size tried.
    #: Without a gradient the same chunks bound the NumPy scatters' destinations (`torch_impl._host`).
    cpu_index_chunk: int = 2**14
    #: Output bytes from which a CPU output's pages are faulted in by one ``madvise`` before the host
    #: paths (row copies, NumPy scatters) write it, instead of one page fault per 4 KiB as they touch
    #: it. Measured on 2 cores (Linux 6.18, fresh heap pages each call): writing 2 MiB into a fresh
    #: buffer 1.08-1.18 ms, after the advice 0.82-0.85 ms. ``math.inf``: never.
    cpu_prefault_min_bytes: float = 2**20
    #: Bytes faulted in at a time by the host copies (row copies, `concat_by_copies`) of an output of at
    #: least ``cpu_fault_chunks_min_bytes`` (`torch_impl._host.fault_plan`; rounded down to whole pages,
    #: at least one), just before the rows that write them. Measured on 2 cores (Linux
    #: 6.18, fresh pages each call, whole calls, paired against one ``madvise`` of the whole output):
    #: 64 MiB (B=4096, L=4096, M=16) 1.10x faster with 256 KiB, 1.09x with 1 MiB, 1.03x with 4 MiB;
    #: 256 MiB 1.09x; 3 keys of 40 MiB 1.07x.
    cpu_fault_chunk_bytes: int = 2**18
    #: Output bytes from which the row copies fault the output in by chunks (smaller outputs: one
    #: ``madvise`` of the whole). Measured as above with 256 KiB chunks: 2 MiB (B=1024, L=512, M=64, 5
    #: keys) 0.97x (slower), 8 MiB 1.02x, 32 MiB 1.11x.
    cpu_fault_chunks_min_bytes: float = 8 * 2**20
    #: Output elements from which CPU dense parts NumPy may move are assembled on the host (by copies,
    #: or NumPy scatters of whole rows) instead of torch's ``cat`` and ``index_copy_``, which split
    #: their work among torch's threads from 32768 elements (its grain size) and then wait for a
    #: descheduled thread on a busy machine. Measured on 2 cores, whole calls, paired (torch / host,
    #: quiet and with one busy process per core): [8, 16] in 4 micro-batches 0.088 / 0.150 ms; [16384]
    #: in 16 1.30 / 1.56 ms (below the grain: torch serial); [1024, 512] in 16 1.94 / 1.19 ms quiet,
    #: 7.71 / 1.05 ms busy; [64, 4096] in 4 1.10 / 0.75 quiet, 39.4 / 0.73 busy; [4096, 4096] in 16
    #: 58.8 / 37.9 quiet, 137 / 54 busy. ``math.inf``: never.
    cpu_dense_host_min_elements: float = 32768
    #: Output bytes from which a concatenation on the host (no permutation, or the identity) is one
    #: ``torch.cat``, whose copy torch splits among its threads, instead of ``memcpy`` of pieces on the
    #: calling thread (`torch_impl._rowcopy.concat_by_copies`). Measured on 2 cores (one micro-batch in
    #: order, fresh pages each call, paired; "contended": one busy process per core), ``cat`` against
    #: the copies: 8 MiB quiet 1.23x faster, contended 1.65x slower (its parallel region waits for a
    #: descheduled thread; at 1 MiB busy ``cat`` took 7.7 ms, 0.78 quiet); 32 MiB 1.39x faster / 1.46x slower; 64 MiB
    #: 1.43x / 1.22x faster; 256 MiB 1.32x / 1.03x faster. ``math.inf``: never.
    cpu_parallel_concat_min_bytes: float = 64 * 2**20
    #: Output bytes from which the whole 2 MiB pages of such a CPU output are advised
    #: ``MADV_HUGEPAGE`` before they are faulted in, where the kernel then never stalls for them
    #: (`torch_impl._host.huge_pages_without_stalls`: THP ``enabled=madvise``, ``defrag=defer`` or
    #: ``never``). Measured on 2 cores (Linux 6.18, fresh pages each call, `fresh_output` alone): 32
    #: MiB 13.6 ms with 4 KiB pages, 3.1 ms with huge pages; 64 MiB 18.0 / 9.3 ms; 256 MiB 91 / 39
    #: ms (8 MiB: 1.64 / 1.50 ms); but under ``defrag=madvise`` (that machine's, the kernel's default)
    #: the first advised output waited 1.0-3.9 s for memory compaction, so it is not advised there.
    #: 32 MiB: glibc's largest mmap threshold, so the advice lands on the output's own mapping,
    #: unmapped with it, never on heap pages reused later (unless the process raised
    #: ``M_MMAP_THRESHOLD`` itself). ``math.inf``: never.
    cpu_hugepage_min_bytes: float = 32 * 2**20
    #: Output bytes from which a fresh CPU output of the host paths has its pages faulted in on torch's
    #: threads (`torch_impl._host.touch_pages`: a parallel ``fill_`` of one cache line a page) instead
    #: of one ``madvise`` (or a fault plan, `torch_impl._host.fault_plan`) on the calling thread, where
    #: torch has more than one thread. Measured on 2 cores (Linux 6.18, fresh pages each call, whole
    #: calls, paired, float32, M=16, the fault plan's time over the touch's): quiet, 8 MiB 1.06x, 16
    #: MiB 1.09x, 32 MiB 1.15x, 64 MiB 1.15x, 128 MiB 1.08x, 256 MiB 1.22x, three bfloat16 keys
    #: of 84 MiB 1.13x; with one busy process per core, noise in repeated runs: 32 MiB 0.66-1.11x, 64
    #: MiB 0.88-1.07x, 128 MiB 0.90x, 256 MiB 0.93-1.12x, three keys of 84 MiB 1.14x. Five 2 MiB keys
    #: (B=1024, L=512, M=64; two cache lines a page, so that the ``fill_`` splits): 0.89x quiet, 0.47x
    #: busy (whole calls, paired, nine rounds each). From 64 MiB,
    #: where ``cpu_parallel_concat_min_bytes`` already trusts torch's threads under contention.
    #: ``math.inf``: never.
    cpu_parallel_fault_min_bytes: float = 64 * 2**20
    #: Rows (B) up to which a CPU jagged key movable by the host and under ``cpu_prefault_min_bytes``
    #: is assembled with its bookkeeping in Python ints and one copy by address a row
    #: (`torch_impl._fewrows`) instead of NumPy operations (about forty a key, a few microseconds
    #: each whatever their size). Its Python work grows with the rows; measured on 2 cores, torch 2.13,
    #: one float32 key, whole calls, the NumPy paths' time over its own (`python -m
    #: rebatch.bench.crossover --few-rows --batches 8 16 32 64 128 192 256 --lengths 16 512`): mean
    #: length 16, M=4: 1.74x at B=8, 1.40-1.50x at 16-64, 1.19x at 128, 1.09x at 192, 1.00x at
    #: 256; mean length 512, M=4: 1.40x at 8, 1.28x at 64, 1.19x at 128, 1.10x at 256; mean length
    #: 16, M=16: 1.28x at 16, 1.12x at 128, 1.04x at 256. 0: never.
    cpu_few_rows: int = 128
    #: Output rows that continue the row before them in its micro-batch's values (neighbours in both)
    #: from which the row copies copy each run of such rows as one ``memcpy``
    #: (`torch_impl._rowcopy.join_runs`: a dozen NumPy operations a key, which that many fewer copies
    #: must pay for; micro-batches of ascending indices, as the grid's). Measured on 2 cores, torch 2.13,
    #: one float32 key, mean length 512, whole calls (`python -m rebatch.bench.crossover --join
    #: --batches 1024 4096 16384 --counts 2 4 8 16 64 --min-time 3`, two runs), the time one copy a row
    #: over the time joined, by neighbours: 16-67 (B=1024, M=16 and 64) 0.95-0.98x, 59 0.96-1.02x,
    #: 137 0.98-1.04x, 238 (B=16384, M=64) 1.00-1.01x, 257 1.01x, 271 1.02-1.04x, 509-522
    #: 1.02-1.07x, 959-2047 1.02-1.05x, 4094-8120 (M=4 and 2) 1.11-1.16x. ``sys.maxsize``: never.
    cpu_join_min_neighbours: int = 256

    def __post_init__(self) -> None:
        for name, integer, least in _BOUNDS:  # in the fields' order: the first bad one is named
            value: float = getattr(self, name)  # an int or a float (``math.inf``) once checked here
            if isinstance(value, bool) or not isinstance(value, int if integer else numbers.Real):
                raise ValueError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
            if not value >= least:
                raise ValueError(f"{name} must be >= {least}, got {value}")


#: Each knob's bound, checked by `Settings.__post_init__`: (field, an integer?, least value).
_BOUNDS: tuple[tuple[str, bool, int], ...] = (
    ("row_copy_min_elements", False, 0),
    ("index_chunk_bytes", True, 1),
    ("cpu_index_chunk", True, 1),
    ("cpu_prefault_min_bytes", False, 0),
    ("cpu_fault_chunk_bytes", True, 1),
    ("cpu_fault_chunks_min_bytes", False, 0),
    ("cpu_dense_host_min_elements", False, 0),
    ("cpu_parallel_concat_min_bytes", False, 0),
    ("cpu_hugepage_min_bytes", False, 0),
    ("cpu_parallel_fault_min_bytes", False, 0),
    ("cpu_few_rows", True, 0),
    ("cpu_join_min_neighbours", True, 0),
)


_current: ContextVar[Settings] = ContextVar("torch_impl_settings", default=Settings())  # noqa: B039 (frozen)


def get_settings() -> Settings:
    """The settings in force for the calling thread (or task)."""
    return _current.get()


@contextlib.contextmanager
def use_settings(**changes: Any) -> Iterator[Settings]:
    """Within the block, the calling thread's settings with ``changes`` applied (names of `Settings`)::

    with torch_impl.use_settings(row_copy_min_elements=math.inf):  # element indices only
        torch_impl.postprocess_batch_func(output_lst, indices, data)
    """
    token = _current.set(dataclasses.replace(_current.get(), **changes))
    try:
        yield _current.get()
    finally:
        _current.reset(token)
