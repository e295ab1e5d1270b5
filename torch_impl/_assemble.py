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

from ._parts import jagged_parts

__all__ = ["assemble", "gather_jagged", "njt"]


def njt(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """A jagged nested tensor ``[B, (j), *F]`` over ``values`` ``[N, *F]`` and ``offsets`` ``[B + 1]``."""
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def _zero_prefixed_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


def assemble(parts: Sequence[torch.Tensor], perm: torch.Tensor | None, key: Any = None) -> torch.Tensor:
    """Concatenate ``parts`` (checked by `check_parts`), then put row ``k`` at row ``perm[k]``.

    ``perm``: ``None`` (plain concatenation) or a checked permutation of ``range(B)`` (any device).
    Jagged parts ``[b_m, (j), *F]`` give ``[B, (j), *F]``; dense ``[b_m, *F]`` give ``[B, *F]``.
    """
    first = parts[0]
    device = first.device
    if perm is not None:
        perm = perm.to(device, non_blocking=True)
    if not first.is_nested:
        if perm is None:
            return torch.cat(list(parts)) if len(parts) > 1 else parts[0]
        out = first.new_empty((perm.numel(), *first.shape[1:]))
        start = 0
        for p in parts:
            out.index_copy_(0, perm[start : start + p.shape[0]], p)
            start += p.shape[0]
        return out

    values, offsets, lengths = jagged_parts(parts, key)
    bases = [0]
    for v in values[:-1]:
        bases.append(bases[-1] + v.shape[0])
    total = bases[-1] + values[-1].shape[0]
    if perm is None:
        out_offsets = torch.cat([offsets[0][:1] * 0] + [o[1:] + b for o, b in zip(offsets, bases, strict=True)])
        return njt(torch.cat(values) if len(values) > 1 else values[0], out_offsets)

    # Row k of the concatenation starts at src_start[k] and goes to output row perm[k], which starts
    # at out_offsets[perm[k]]; every value of row k moves by the same shift.
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=device)
    out_offsets = _zero_prefixed_cumsum(lengths[inv])
    src_start = torch.cat([o[:-1] + b for o, b in zip(offsets, bases, strict=True)])
    shift = out_offsets[:-1][perm] - src_start
    dest = torch.repeat_interleave(shift, lengths, output_size=total)
    dest += torch.arange(total, device=device)
    out_values = values[0].new_empty((total, *values[0].shape[1:]))
    for v, b in zip(values, bases, strict=True):
        out_values.index_copy_(0, dest[b : b + v.shape[0]], v)
    return njt(out_values, out_offsets)


def gather_jagged(x: torch.Tensor, rows: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """``[x.unbind()[i] for i in rows]`` as one jagged tensor: a single gather of the values.

    ``x``: jagged ``[B, (j), *F]`` (checked); ``rows``: int64 ``[R]`` in ``range(B)`` on ``x``'s device.
    ``total``: the number of values of the result when known (a permutation keeps ``N``); otherwise it
    is read from the device (a synchronisation on an accelerator).
    """
    (values,), (offsets,), lengths = jagged_parts([x])
    new_lengths = lengths[rows]
    new_offsets = _zero_prefixed_cumsum(new_lengths)
    if total is None:
        total = int(new_offsets[-1])
    src = torch.repeat_interleave(offsets[:-1][rows] - new_offsets[:-1], new_lengths, output_size=total)
    src += torch.arange(total, device=values.device)
    return njt(values.index_select(0, src), new_offsets)
