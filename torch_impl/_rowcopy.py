"""The row-copy path (CPU, no autograd, long rows): each output row one contiguous copy, no index buffer.

The rows are views of the parts' values (one C++ split per micro-batch, without autograd's view
tracking: nothing here is differentiated) put in output order, then copied back to back into the
fresh output by one ``torch.cat(rows, out=...)`` on the calling thread. Peak memory is the output.
No threads of its own, no process-wide setting touched: what torch's own ``cat`` does with its
intra-op threads is torch's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

from ._parts import JaggedPart
from ._settings import get_settings

__all__ = ["permute_by_rows", "row_copies_apply"]


def row_copies_apply(parts: Sequence[JaggedPart], total: int, rows: int) -> bool:
    """Row copies: CPU plain tensors, no autograd, contiguous values, rows long enough to amortise a view
    each (``Settings.row_copy_min_elements``)."""
    first = parts[0].values
    if (
        rows == 0
        or first.device.type != "cpu"
        or (torch.is_grad_enabled() and any(p.values.requires_grad for p in parts))
        or not all(type(p.values) is torch.Tensor and p.values.is_contiguous() for p in parts)
    ):
        return False
    return total * math.prod(first.shape[1:]) >= get_settings().row_copy_min_elements * rows


def permute_by_rows(parts: Sequence[JaggedPart], lengths: torch.Tensor, inv: torch.Tensor, total: int) -> torch.Tensor:
    """Output values ``[N, *F]``: ``[rows[k] for k in inv]`` laid end to end, where ``rows`` are the
    parts' rows in concatenation order (``lengths`` ``[B]``: their lengths in rows of ``values``) and
    ``inv`` ``[B]`` is the inverse permutation."""
    first = parts[0].values
    inner = math.prod(first.shape[1:])
    out = first.new_empty((total, *first.shape[1:]))
    sizes = (lengths * inner).tolist()  # every row's element count, all parts at once
    bounds = list(itertools.accumulate((p.rows for p in parts), initial=0))
    rows = tuple(
        itertools.chain.from_iterable(
            torch.unsafe_split_with_sizes(p.values.view(-1), sizes[a:b])
            for p, a, b in zip(parts, bounds[:-1], bounds[1:], strict=True)
        )
    )
    torch.cat([rows[k] for k in inv.tolist()], out=out.view(-1))
    return out
