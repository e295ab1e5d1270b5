"""The element-index path: every value's destination computed on the device, written by ``index_copy_``.

Works on any device, without host-device synchronisation (sizes are host-known), and is
differentiable (``index_copy_``'s backward is a gather: each value receives exactly its gradient).
All micro-batches are moved together: their values concatenated (one ``cat``), then one
``index_copy_`` per chunk of ``Settings.index_chunk_bytes`` of output, so the number of operations
is a constant per key, whatever the numbers of rows and micro-batches. A chunk may start or end
inside a row.
"""

from __future__ import annotations

import math

import torch

from ._jagged import Runs, zero_prefixed_cumsum
from ._settings import get_settings

__all__ = ["index_chunk", "permute_by_indices"]


def index_chunk(values: torch.Tensor) -> int:
    """Values per destination buffer: as many as cover ``Settings.index_chunk_bytes`` of output (rows
    of ``values[0]``'s size), rounded up, at least 1."""
    row_bytes = values.element_size() * math.prod(values.shape[1:])
    return max(1, -(-get_settings().index_chunk_bytes // max(1, row_bytes)))


def permute_by_indices(
    values: torch.Tensor, lengths: torch.Tensor, perm: torch.Tensor, out_offsets: torch.Tensor
) -> torch.Tensor:
    """Output values ``[N, *F]``: row ``k`` of ``values`` ``[N, *F]`` (rows of ``lengths`` ``[B]``, end
    to end) written at output row ``perm[k]`` ``[B]``, which starts at ``out_offsets[perm[k]]``
    (``out_offsets`` ``[B + 1]``). 15 operations for one chunk; two chunks 26, and 9 more per further chunk."""
    total = values.shape[0]
    runs = Runs.of(out_offsets.index_select(0, perm), zero_prefixed_cumsum(lengths)[:-1], total)
    out = values.new_empty(values.shape)
    chunk = index_chunk(values)
    if total <= chunk:
        return out.index_copy_(0, runs.indices(), values)
    for a, piece in zip(range(0, total, chunk), torch.split(values, chunk), strict=True):
        out.index_copy_(0, runs.indices(a, a + piece.shape[0]), piece)
    return out
