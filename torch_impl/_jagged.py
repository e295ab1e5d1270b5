"""Jagged building blocks: a nested tensor over values and offsets, offsets from lengths, runs as indices,
and rows gathered by index. No checks here beyond `check_offsets` on the gathered input."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._parts import JaggedPart, check_offsets

__all__ = ["gather_jagged", "njt", "runs_to_indices", "zero_prefixed_cumsum"]


def _internal_nested_view() -> Callable[..., torch.Tensor] | None:
    """What ``torch.nested.nested_tensor_from_jagged`` calls after its ``is_fx_tracing()`` probe (None in a
    torch without it: `njt` then calls the public function, warning and all)."""
    try:
        from torch.nested._internal.nested_tensor import nested_view_from_values_offsets_lengths
    except ImportError:  # pragma: no cover
        return None
    return nested_view_from_values_offsets_lengths


_nested_view = _internal_nested_view()


def njt(values: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """A jagged nested tensor ``[B, (j), *F]`` over ``values`` ``[N, *F]`` and ``offsets`` ``[B + 1]``
    (with ``lengths`` ``[B]``: rows with holes), a view of ``values``.

    ``torch.nested.nested_tensor_from_jagged(values, offsets, lengths)``, without writing to the log:
    that function first asks ``torch.fx``'s ``is_fx_tracing()`` (to refuse ``fx.symbolic_trace``),
    which logs a warning ("is_fx_tracing will return true for both ...", torch 2.9.1 and 2.13 alike)
    the first time anything in the process calls it, through torch's own handler on stderr. This calls
    what that function calls next, with the same arguments, and falls back to it where torch has no
    such function; no logger, filter or torch setting of the process is changed.
    """
    if _nested_view is None:  # pragma: no cover
        return torch.nested.nested_tensor_from_jagged(values, offsets, lengths)
    return _nested_view(values, offsets, lengths)


def zero_prefixed_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """``[0, l0, l0 + l1, ...]``: offsets from lengths (int64, on ``lengths``' device)."""
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


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


def gather_jagged(x: JaggedPart, rows: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """``[rows_of(x)[i] for i in rows]`` as one jagged tensor: a single gather of the values.

    ``x``: a jagged part; ``rows``: int64 ``[R]`` in ``range(B)`` on ``x``'s device. ``total``: the
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
