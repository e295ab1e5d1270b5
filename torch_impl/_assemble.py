"""The one data-movement kernel: micro-batch parts written once each into the output, in any row order.

Every output element is written exactly once (``index_copy_`` of each part into an uninitialised
output), and the number of torch operations depends on the number of parts, never on the number of
rows. The index arithmetic happens on the parts' device from host-known sizes, so no host-device
synchronisation is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ._parts import Part, check_offsets

__all__ = ["assemble", "gather_jagged", "njt", "zero_prefixed_cumsum"]


def njt(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """A jagged nested tensor ``[B, (j), *F]`` over ``values`` ``[N, *F]`` and ``offsets`` ``[B + 1]``."""
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def zero_prefixed_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """``[0, l0, l0 + l1, ...]``: offsets from lengths."""
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


def assemble(parts: Sequence[Part], perm: torch.Tensor | None, key: Any = None) -> torch.Tensor:
    """Concatenate ``parts`` (checked by `check_parts`), then put row ``k`` at row ``perm[k]``.

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
    bases = [0]
    for p in parts[:-1]:
        bases.append(bases[-1] + p.values.shape[0])
    total = bases[-1] + parts[-1].values.shape[0]
    if perm is None:
        out_offsets = torch.cat([parts[0].offsets[:1]] + [p.offsets[1:] + b for p, b in zip(parts, bases, strict=True)])
        return njt(torch.cat([p.values for p in parts]) if len(parts) > 1 else first, out_offsets)

    # Row k of the concatenation starts at src_start[k] and goes to output row perm[k], which starts
    # at out_offsets[perm[k]]; every value of row k moves by the same shift.
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=device)
    out_offsets = zero_prefixed_cumsum(lengths[inv])
    src_start = torch.cat([p.offsets[:-1] + b for p, b in zip(parts, bases, strict=True)])
    shift = out_offsets[:-1][perm] - src_start
    dest = torch.repeat_interleave(shift, lengths, output_size=total)
    dest += torch.arange(total, device=device)
    out_values = first.new_empty((total, *first.shape[1:]))
    for p, b in zip(parts, bases, strict=True):
        out_values.index_copy_(0, dest[b : b + p.values.shape[0]], p.values)
    return njt(out_values, out_offsets)


def gather_jagged(x: Part, rows: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """``[rows_of(x)[i] for i in rows]`` as one jagged tensor: a single gather of the values.

    ``x``: a jagged `Part`; ``rows``: int64 ``[R]`` in ``range(B)`` on ``x``'s device. ``total``: the
    number of values of the result when known (a permutation keeps ``N``); otherwise it is read from
    the device (a synchronisation on an accelerator).
    """
    lengths = check_offsets([x])
    new_lengths = lengths[rows]
    new_offsets = zero_prefixed_cumsum(new_lengths)
    if total is None:
        total = int(new_offsets[-1])
    src = torch.repeat_interleave(x.offsets[:-1][rows] - new_offsets[:-1], new_lengths, output_size=total)
    src += torch.arange(total, device=x.values.device)
    return njt(x.values.index_select(0, src), new_offsets)
