"""`assemble`: one key's checked parts joined, and put in original order, by the path that fits.

Every output element is written exactly once into a fresh output (never an input's storage), and the
number of torch operations depends on the number of parts, never on the number of rows:

- dense parts ``[b_m, *F]``: `torch_impl._dense`;
- jagged parts without a permutation: one ``cat`` of the values, the offsets shifted;
- jagged parts with a permutation: row copies (`torch_impl._rowcopy`: CPU, no autograd, long rows)
  or element indices (`torch_impl._indexcopy`: any device, differentiable), chosen by
  `torch_impl.Settings`.

Under ``torch.compile`` the whole call runs eagerly (a graph break): its work is data movement whose
sizes are read on the host, which a graph could not hold without a specialisation per batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from ._dense import assemble_dense
from ._indexcopy import permute_by_indices
from ._jagged import njt, zero_prefixed_cumsum
from ._parts import DensePart, JaggedPart, Part, check_offsets
from ._permutation import invert
from ._rowcopy import permute_by_rows, row_copies_apply

__all__ = ["assemble"]


@torch.compiler.disable
def assemble(parts: Sequence[Part], perm: torch.Tensor | None, key: Any = None) -> torch.Tensor:
    """Concatenate ``parts`` (checked by `check_parts`), then put row ``k`` at row ``perm[k]``.

    ``perm``: ``None`` (plain concatenation) or a checked permutation of ``range(B)`` (any device).
    Jagged parts ``[b_m, (j), *F]`` give ``[B, (j), *F]``; dense ``[b_m, *F]`` give ``[B, *F]``.
    """
    device = parts[0].values.device
    if perm is not None:
        perm = perm.to(device, non_blocking=True)
    if isinstance(parts[0], DensePart):
        return assemble_dense([p for p in parts if isinstance(p, DensePart)], perm)
    jagged = [p for p in parts if isinstance(p, JaggedPart)]
    lengths = check_offsets(jagged, key)
    if perm is None:
        return _concat_jagged(jagged)
    total = sum(p.values.shape[0] for p in jagged)
    inv = invert(perm)
    out_offsets = zero_prefixed_cumsum(lengths.index_select(0, inv))
    if row_copies_apply(jagged, total, perm.numel()):
        return njt(permute_by_rows(jagged, lengths, inv, total), out_offsets)
    return njt(permute_by_indices(jagged, lengths, perm, out_offsets, total), out_offsets)


def _concat_jagged(parts: Sequence[JaggedPart]) -> torch.Tensor:
    """The parts' rows in micro-batch order: each part's offsets shifted by the values before it."""
    bases = itertools.accumulate((p.values.shape[0] for p in parts[:-1]), initial=0)
    offsets = torch.cat([parts[0].offsets[:1]] + [p.offsets[1:] + b for p, b in zip(parts, bases, strict=True)])
    return njt(torch.cat([p.values for p in parts]), offsets)
