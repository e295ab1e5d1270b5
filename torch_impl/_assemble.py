"""`assemble`: one key's checked parts joined, and put in original order, by the path that fits.

Every output element is written exactly once into a fresh output (never an input's storage), and the
number of torch operations is a constant per key (and one per further chunk of 16 MiB of output on
the element-index path), never growing with the number of rows or parts:

- dense parts ``[b_m, *F]``: `torch_impl._dense`;
- jagged parts without a permutation: one ``cat`` of the values, the offsets from all row lengths;
- jagged parts with a permutation: row copies (`torch_impl._rowcopy`: CPU, no autograd, long rows)
  or element indices (`torch_impl._indexcopy`: any device, differentiable), chosen by
  `torch_impl.Settings`.

What the keys of one call share (the permutation on the device, its inverse) is built once per call
(`torch_impl._rows.CallRows`). Under ``torch.compile`` the whole call runs eagerly (a graph break):
its work is data movement whose sizes are read on the host, which a graph could not hold without a
specialisation per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ._dense import assemble_dense
from ._indexcopy import permute_by_indices
from ._jagged import njt, zero_prefixed_cumsum
from ._parts import DensePart, JaggedPart, Part, check_offsets
from ._rowcopy import permute_by_rows, row_copies_apply
from ._rows import CallRows

__all__ = ["assemble"]


@torch.compiler.disable
def assemble(
    parts: Sequence[Part], perm: torch.Tensor | None, key: Any = None, rows: CallRows | None = None
) -> torch.Tensor:
    """Concatenate ``parts`` (checked by `check_parts`), then put row ``k`` at row ``perm[k]``.

    ``perm``: ``None`` (plain concatenation) or a checked permutation of ``range(B)`` (CPU); ``rows``:
    what the call's keys share (built here when not given; its ``perm`` is ``perm``). Jagged parts
    ``[b_m, (j), *F]`` give ``[B, (j), *F]``; dense ``[b_m, *F]`` give ``[B, *F]``.
    """
    if rows is None:
        rows = CallRows([p.rows for p in parts], perm)
    device = parts[0].values.device
    if isinstance(parts[0], DensePart):
        dense = [p for p in parts if isinstance(p, DensePart)]
        return assemble_dense(dense, None if perm is None else rows.perm(device))
    jagged = [p for p in parts if isinstance(p, JaggedPart)]
    lengths = check_offsets(jagged, key, rows.steps(device))
    if perm is None:
        return njt(torch.cat([p.values for p in jagged]), zero_prefixed_cumsum(lengths))
    total = sum(p.values.shape[0] for p in jagged)
    inv = rows.inverse(device)
    out_offsets = zero_prefixed_cumsum(lengths.index_select(0, inv))
    if row_copies_apply(jagged, total, perm.numel()):
        return njt(permute_by_rows(jagged, lengths, inv, total), out_offsets)
    return njt(permute_by_indices(jagged, lengths, rows.perm(device), out_offsets), out_offsets)
