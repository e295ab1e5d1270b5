"""The element-index path: every value's destination computed on the device, written by ``index_copy_``.

Works on any device, without host-device synchronisation (sizes are host-known), and is
differentiable (``index_copy_``'s backward is a gather: each value receives exactly its gradient).
Off the CPU all micro-batches are moved together: their values concatenated (one ``cat``), then
one ``index_copy_`` per chunk of ``Settings.index_chunk_bytes`` (16 MiB) of output, so the number of
operations is a constant per key, whatever the numbers of rows and micro-batches. On the CPU a chunk
is at most ``CPU_CHUNK_ROWS`` value rows (each kernel below torch's OpenMP grain size, on the
calling thread); a key of one chunk is moved the same way, a larger one part by part. A chunk may
start or end inside a row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from ._bits import as_bits, from_bits
from ._jagged import Runs, host_offsets, zero_prefixed_cumsum
from ._plan import KeyPlan
from ._settings import get_settings

__all__ = ["CPU_CHUNK_ROWS", "index_chunk", "permute_by_indices", "permute_rows"]

T = TypeVar("T")

#: On the CPU, the most value rows a chunk covers: each chunk's torch kernels then stay below torch's
#: OpenMP grain size (32768 elements for a 1-D key) and run on the calling thread, and the index
#: buffer (128 KiB) stays in cache (``docs/kernels.md``, "Settings").
CPU_CHUNK_ROWS = 2**14


def index_chunk(values: torch.Tensor, as_on_device: bool = False) -> int:
    """Value rows per destination buffer: as many as cover ``Settings.index_chunk_bytes`` of output
    (rows of ``values[0]``'s size), rounded up, at least 1; on the CPU at most `CPU_CHUNK_ROWS`, unless
    ``as_on_device`` (a key planned as on an accelerator: ``Settings.plan_on_device``)."""
    row_bytes = values.element_size() * math.prod(values.shape[1:])
    rows = max(1, -(-get_settings().index_chunk_bytes // max(1, row_bytes)))
    return min(rows, CPU_CHUNK_ROWS) if values.device.type == "cpu" and not as_on_device else rows


def permute_rows(plan: KeyPlan) -> torch.Tensor:
    """A dense key's result ``[B, *F]``: one ``cat`` of two or more parts, then one ``index_copy_`` with
    the permutation (its backward gives each part exactly its rows' gradient)."""
    values = plan.parts[0].values if len(plan.parts) == 1 else torch.cat([p.values for p in plan.parts])
    bits = as_bits(values)
    return from_bits(
        bits.new_empty(bits.shape).index_copy_(0, plan.rows.perm_on(plan.device), bits), values.dtype
    )


def permute_by_indices(plan: KeyPlan) -> torch.Tensor:
    """A jagged key's result values ``[N, *F]``: row ``k`` of the parts' rows end to end written at
    output row ``perm[k]``, which starts at ``offsets[perm[k]]`` (the plan's lengths and offsets).

    All parts together (one ``cat``) where the key fits in one chunk, and always off the CPU: 15
    operations for one chunk, 26 for two, 9 more per further chunk. On the CPU a larger key is moved
    part by part (no ``cat``: no second pass over the values, and each chunk's bookkeeping covers
    only its part's rows), each part in chunks. A dtype torch cannot index moves as its bits
    (`torch_impl._bits`).
    """
    parts: Sequence[Any] = plan.parts
    first, total, lengths = parts[0].values, plan.total, plan.lengths
    assert lengths is not None
    assert plan.offsets is not None
    chunk = index_chunk(first, as_on_device=plan.runs is not None)
    out = as_bits(first).new_empty((total, *first.shape[1:]))
    if plan.runs is not None or first.device.type != "cpu" or total <= chunk:
        values = first if len(parts) == 1 else torch.cat([p.values for p in parts])
        runs = _group_runs(plan)
        if total <= chunk:  # one chunk: its element indices made once for the group's keys
            out.index_copy_(0, _per_group(plan, "indices", runs.indices), as_bits(values))
        else:  # several: made chunk by chunk for each key (a group's would all be held at once)
            _copy_in_chunks(out, as_bits(values), runs, chunk)
        return from_bits(out, first.dtype)
    dest_starts = _per_group(plan, "dest_starts", lambda: _dest_starts(plan))
    row = 0
    for p in parts:
        runs = Runs.of(dest_starts[row : row + p.rows], p.offsets[:-1], p.values.shape[0])
        _copy_in_chunks(out, as_bits(p.values), runs, chunk)
        row += p.rows
    return from_bits(out, first.dtype)


def _group_runs(plan: KeyPlan) -> Runs:
    """The element runs of ``plan``'s move, all parts laid end to end: the group's own where it was
    planned on an accelerator (`torch_impl._devplan`), else made once for the group, with NumPy where it
    was planned on the host."""
    if plan.runs is not None:
        return plan.runs
    return _per_group(plan, "runs", lambda: _runs_of(plan))


def _runs_of(plan: KeyPlan) -> Runs:
    """`_group_runs` of a key planned on the CPU: from its host arrays where it has them (no torch
    operation), else from its lengths and destinations."""
    assert plan.lengths is not None
    if plan.arrays is None:
        return Runs.of(_dest_starts(plan), sources_of(plan.lengths), plan.total)
    lengths, _, offsets = plan.arrays
    sources = host_offsets(lengths)[:-1]
    positions, jumps = Runs.on_host(offsets[plan.rows.host()[0]], sources, plan.total)
    return Runs(torch.from_numpy(positions), torch.from_numpy(jumps), plan.total)


def _dest_starts(plan: KeyPlan) -> torch.Tensor:
    """Each split row's first value in the result ``[B]`` (its restored row's offset)."""
    assert plan.offsets is not None
    return plan.offsets.index_select(0, plan.rows.perm_on(plan.device))


def _per_group(plan: KeyPlan, what: str, make: Callable[[], T]) -> T:
    """``make()``, made once a call for ``plan``'s group (`KeyPlan.group`; a key of none: made here)."""
    if plan.group is None:
        return make()
    return plan.rows.once((what, plan.group), plan.device, make)


def sources_of(lengths: torch.Tensor) -> torch.Tensor:
    """Each row's first value among the parts' values laid end to end (``[B]``, from the lengths)."""
    return zero_prefixed_cumsum(lengths)[:-1]


def _copy_in_chunks(out: torch.Tensor, values: torch.Tensor, runs: Runs, chunk: int) -> None:
    """``out[runs.indices()] = values`` (``[n, *F]``), ``chunk`` value rows at a time."""
    n = values.shape[0]
    if n <= chunk:
        out.index_copy_(0, runs.indices(), values)
        return
    for a, piece in zip(range(0, n, chunk), torch.split(values, chunk), strict=True):
        out.index_copy_(0, runs.indices(a, a + piece.shape[0]), piece)
