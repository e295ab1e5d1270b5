"""The element-index path: every value's destination computed on the device, written by ``index_copy_``.

Works on any device, without host-device synchronisation (sizes are host-known), and is
differentiable. The destinations are built for at most ``Settings.index_bytes_fraction`` of the
output's bytes at a time, so the index buffer stays a small fraction of the output whatever the number
of micro-batches; a chunk may start or end inside a row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ._jagged import runs_to_indices
from ._parts import JaggedPart
from ._settings import get_settings

__all__ = ["index_chunk", "permute_by_indices"]


def index_chunk(total: int, values: torch.Tensor) -> int:
    """Values per destination buffer: int64 indices of at most ``index_bytes_fraction`` of the output's
    bytes (``total`` rows of ``values[0]``'s size), and at least ``index_min_chunk``."""
    s = get_settings()
    row_bytes = values.element_size() * math.prod(values.shape[1:])
    return max(s.index_min_chunk, int(total * row_bytes * s.index_bytes_fraction) // 8)


def permute_by_indices(
    parts: Sequence[JaggedPart], lengths: torch.Tensor, perm: torch.Tensor, out_offsets: torch.Tensor, total: int
) -> torch.Tensor:
    """Output values ``[N, *F]``: row ``k`` of the concatenation (``lengths`` ``[B]``) written at output
    row ``perm[k]``, which starts at ``out_offsets[perm[k]]``."""
    first = parts[0].values
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
    return out_values
