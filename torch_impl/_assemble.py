"""The one data-movement kernel: micro-batch parts written once each into the output, in any row order.

Every output element is written exactly once into an uninitialised output, and the number of torch
operations depends on the number of parts, never on the number of rows. Two ways, chosen by shape:

- element indices (any device, differentiable): per value, its destination, computed on the parts'
  device from host-known sizes (no host-device synchronisation), then one ``index_copy_`` per part;
- row copies (CPU, long rows, no autograd): one contiguous copy per row, shared among the CPU
  threads (`torch_impl._rowcopy`). No index buffer: peak memory is the output.

On the index path the destinations are built for at most `index_chunk` values at a time, so the index
buffer stays a small fraction of the output's bytes whatever the number of micro-batches.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import torch

from ._parts import Part, check_offsets
from ._permutation import invert
from ._rowcopy import copy_rows

#: Mean elements per row (values per row times trailing size) from which CPU row copies beat indices.
ROW_COPY_MIN_ELEMENTS = 384
#: The index path's destinations never exceed this fraction of the output's bytes ...
INDEX_BYTES_FRACTION = 1 / 16
#: ... or this many values, whichever is larger (a constant: small outputs take one chunk per part).
INDEX_MIN_CHUNK = 2**16

__all__ = ["assemble", "gather_jagged", "njt", "runs_to_indices", "zero_prefixed_cumsum"]


def njt(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """A jagged nested tensor ``[B, (j), *F]`` over ``values`` ``[N, *F]`` and ``offsets`` ``[B + 1]``."""
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def runs_to_indices(starts: torch.Tensor, lengths: torch.Tensor, total: int) -> torch.Tensor:
    """Runs laid end to end, as one index per element: ``[s + j for s, n in zip(starts, lengths) for j in range(n)]``.

    ``starts``, ``lengths``: int64 ``[R]``; ``total == sum(lengths)`` (host-known). Built as the running
    sum of steps (1 inside a run, a jump at each run's first element; zero-length runs telescope away),
    so it costs one fill, one ``index_add_`` of ``R`` jumps and one in-place ``cumsum``.
    """
    ends = starts + lengths
    previous_ends = torch.cat([ends.new_ones(1), ends[:-1]])  # 1 folds the running sum's -1 into run 0
    positions = zero_prefixed_cumsum(lengths)[:-1]
    steps = torch.ones(total + 1, dtype=torch.int64, device=starts.device)  # + 1: trailing empty runs land here
    steps.index_add_(0, positions, starts - previous_ends)
    return steps[:-1].cumsum_(0)


def zero_prefixed_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """``[0, l0, l0 + l1, ...]``: offsets from lengths."""
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


def assemble(
    parts: Sequence[Part], perm: torch.Tensor | None, key: Any = None, pending: list[Future[None]] | None = None
) -> torch.Tensor:
    """Concatenate ``parts`` (checked by `check_parts`), then put row ``k`` at row ``perm[k]``.

    ``pending``: where row copies may be left running (see `torch_impl._rowcopy.copy_rows`); the
    result must not be read before they finish. None: the result is complete on return.

    ``perm``: ``None`` (plain concatenation) or a checked permutation of ``range(B)`` (any device).
    Jagged parts ``[b_m, (j), *F]`` give ``[B, (j), *F]``; dense ``[b_m, *F]`` give ``[B, *F]``.
    """
    first = parts[0].values
    device = first.device
    if perm is not None:
        perm = perm.to(device, non_blocking=True)
    if not parts[0].jagged:
        if perm is None:
            return torch.cat([p.values for p in parts]) if len(parts) > 1 else first
        out = first.new_empty((perm.numel(), *first.shape[1:]))
        start = 0
        for p in parts:
            out.index_copy_(0, perm[start : start + p.rows], p.values)
            start += p.rows
        return out

    lengths = check_offsets(parts, key)
    total = sum(p.values.shape[0] for p in parts)
    if perm is None:  # each part's offsets shifted by the values of the parts before it
        bases = itertools.accumulate((p.values.shape[0] for p in parts[:-1]), initial=0)
        out_offsets = torch.cat([parts[0].offsets[:1]] + [p.offsets[1:] + b for p, b in zip(parts, bases, strict=True)])
        return njt(torch.cat([p.values for p in parts]) if len(parts) > 1 else first, out_offsets)

    inv = invert(perm)
    out_lengths = lengths.index_select(0, inv)
    out_offsets = zero_prefixed_cumsum(out_lengths)
    if _row_copies_pay(parts, total, perm.numel()):
        return njt(copy_rows(parts, lengths, inv, out_offsets, total, pending), out_offsets)
    # Row k of the concatenation goes to output row perm[k], which starts at out_offsets[perm[k]]. The
    # destination of every value is built one chunk of a part's values at a time (rows cut at the
    # chunk's edges), so the index buffer stays a bounded fraction of the output.
    dest_starts = out_offsets[:-1].index_select(0, perm)
    out_values = first.new_empty((total, *first.shape[1:]))
    chunk = index_chunk(total, first)
    row = 0
    for p in parts:
        n = p.values.shape[0]
        starts, lens = dest_starts[row : row + p.rows], lengths[row : row + p.rows]
        if n <= chunk:
            out_values.index_copy_(0, runs_to_indices(starts, lens, n), p.values)
        else:
            src_starts = p.offsets[:-1]
            src_ends = p.offsets[1:]
            for a in range(0, n, chunk):
                b = min(a + chunk, n)
                # each row's run clipped to the values [a, b) of this part
                skip = (a - src_starts).clamp_(min=0)
                clipped = (torch.clamp(src_ends, max=b) - torch.clamp(src_starts, min=a)).clamp_(min=0)
                out_values.index_copy_(0, runs_to_indices(starts + skip, clipped, b - a), p.values[a:b])
        row += p.rows
    return njt(out_values, out_offsets)


def index_chunk(total: int, values: torch.Tensor) -> int:
    """Values per destination buffer: int64 indices of at most `INDEX_BYTES_FRACTION` of the output's
    bytes (``total`` rows of ``values[0]``'s size), and at least `INDEX_MIN_CHUNK`."""
    row_bytes = values.element_size() * math.prod(values.shape[1:])
    return max(INDEX_MIN_CHUNK, int(total * row_bytes * INDEX_BYTES_FRACTION) // 8)


def _row_copies_pay(parts: Sequence[Part], total: int, rows: int) -> bool:
    """Row copies: on the CPU, without autograd, contiguous values, rows long enough to amortise a view each."""
    first = parts[0].values
    if (
        first.device.type != "cpu"
        or rows == 0
        or (torch.is_grad_enabled() and any(p.values.requires_grad for p in parts))
        or not all(p.values.is_contiguous() for p in parts)
    ):
        return False
    row_elements = total * math.prod(first.shape[1:]) / rows
    return row_elements >= ROW_COPY_MIN_ELEMENTS


def gather_jagged(x: Part, rows: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """``[rows_of(x)[i] for i in rows]`` as one jagged tensor: a single gather of the values.

    ``x``: a jagged `Part`; ``rows``: int64 ``[R]`` in ``range(B)`` on ``x``'s device. ``total``: the
    number of values of the result when known (a permutation keeps ``N``); otherwise it is read from
    the device (a synchronisation on an accelerator).
    """
    lengths = check_offsets([x])
    new_lengths = lengths.index_select(0, rows)
    new_offsets = zero_prefixed_cumsum(new_lengths)
    if total is None:
        total = int(new_offsets[-1])
    src = runs_to_indices(x.offsets[:-1].index_select(0, rows), new_lengths, total)
    return njt(x.values.index_select(0, src), new_offsets)
