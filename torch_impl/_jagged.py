"""Jagged building blocks: a nested tensor over values and offsets, offsets from lengths, runs as indices
(`Runs`),
and rows gathered by index. No checks here beyond `check_offsets` on the gathered input.

Every jagged tensor handed out carries what the trainers' own carry (built from a list of rows): its
shortest and longest row cached (`Seqlens`), so that ``to_padded_tensor()`` without an output size pads
to the longest row, not to the number of values. They are host facts: on the CPU read from the lengths,
off it taken from what the call already holds on the host (never a read of the device for them alone)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from ref._torch_private import DisableTorchFunctionSubclass, metadata_cache, nested_view, nested_with_cache

from ._bits import as_bits, from_bits
from ._parts import JaggedPart, check_offsets, numpy_bridge

__all__ = [
    "Gather",
    "Runs",
    "cached_seqlens",
    "gather_values",
    "host_offsets",
    "njt",
    "plan_gather",
    "result_njt",
    "seqlens_of",
    "size_cache",
    "zero_prefixed_cumsum",
]

#: ``(shortest, longest)`` row of a jagged tensor, as host ints; None where unknown (or no rows).
Seqlens = tuple[int, int] | None


#: Up to this many rows, Python's ``min`` and ``max`` over a list beat two NumPy reductions.
_FEW = 64


def seqlens_of(lengths: Any) -> Seqlens:
    """`Seqlens` of row ``lengths`` held on the host (a NumPy array, a CPU tensor or a sequence of
    ints); None off the CPU (never read there) or without rows."""
    if isinstance(lengths, torch.Tensor) and (lengths.device.type != "cpu" or not numpy_bridge()):
        return None if lengths.device.type != "cpu" else seqlens_of(lengths.tolist())
    host = np.asarray(lengths)
    if host.size <= _FEW:
        few = host.tolist()
        return (min(few), max(few)) if few else None
    return int(host.min()), int(host.max())


def cached_seqlens(tensors: Any) -> Seqlens:
    """`Seqlens` of all rows of jagged ``tensors`` together, from the sizes each caches (host ints);
    None unless every one caches both."""
    caches = [metadata_cache(t) for t in tensors]
    if not caches or not all(isinstance(c.get(k), torch.Tensor) for c in caches for k in _SIZES):
        return None
    return min(c["min_seqlen"].shape[0] for c in caches), max(c["max_seqlen"].shape[0] for c in caches)


#: The names under which a nested tensor caches its `Seqlens`: each size as the length of an empty
#: ``[n, 0]`` host tensor, as torch caches them (no data, nothing on a device).
_SIZES = ("min_seqlen", "max_seqlen")
_CPU = torch.device("cpu")  # where the size tensors live (each result its own, as torch makes them)


#: What ``torch.nested.nested_tensor_from_jagged`` calls after its ``is_fx_tracing()`` probe (None in a
#: torch without it: `njt` then calls the public function, warning and all).
_nested_view = nested_view


def njt(
    values: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor | None = None, seqlens: Seqlens = None
) -> torch.Tensor:
    """A jagged nested tensor ``[B, (j), *F]`` over ``values`` ``[N, *F]`` and ``offsets`` ``[B + 1]``
    (with ``lengths`` ``[B]``: rows with holes), a view of ``values``, ``seqlens`` cached: what
    ``torch.nested.nested_tensor_from_jagged`` calls after its ``is_fx_tracing()`` probe, which logs a
    warning on stderr the first time a process calls it (no logger or setting of the process changed)."""
    lo, hi = seqlens if seqlens is not None else (None, None)
    if _nested_view is None:  # pragma: no cover
        return torch.nested.nested_tensor_from_jagged(values, offsets, lengths, min_seqlen=lo, max_seqlen=hi)
    return _nested_view(values, offsets, lengths, min_seqlen=lo, max_seqlen=hi)


def size_cache(seqlens: Seqlens) -> dict[str, torch.Tensor]:
    """A nested tensor's cache of ``seqlens``: each size as the length of an empty ``[n, 0]`` host tensor,
    as torch caches them (no data; results of one group share one: `torch_impl._kernels.move`)."""
    if seqlens is None:
        return {}
    return {k: torch.empty(n, 0, device=_CPU) for k, n in zip(_SIZES, seqlens, strict=True)}


def result_njt(
    values: torch.Tensor,
    offsets: torch.Tensor,
    seqlens: Seqlens = None,
    cache: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """`njt` over ``values`` just made (a result's own storage), ``seqlens`` cached (``cache``: their
    `size_cache`, where made already), built directly where no gradient can flow (the same nested
    tensor, not recorded as a view, which only autograd reads: about 20 µs instead of 90,
    ``docs/kernels.md``); with a gradient to carry, or a tensor subclass, `njt` itself."""
    if type(values) is torch.Tensor and not (values.requires_grad and torch.is_grad_enabled()):
        sizes = dict(cache) if cache is not None else size_cache(seqlens)
        with DisableTorchFunctionSubclass():  # its constructor's reads of itself: 38% of it on torch 2.9.1
            return nested_with_cache(values, offsets, sizes)
    return njt(values, offsets, None, seqlens)


def host_offsets(lengths: Any) -> np.ndarray:
    """`zero_prefixed_cumsum` of host lengths (a NumPy array or a sequence of ints), in NumPy (int64
    ``[B + 1]``)."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def zero_prefixed_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """``[0, l0, l0 + l1, ...]``: offsets from lengths (int64, on ``lengths``' device)."""
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


class Runs(NamedTuple):
    """Runs of consecutive indices laid end to end, as the running sum of their steps.

    Element ``e`` of run ``r`` (``positions[r] <= e < positions[r + 1]``, the last run ending at
    ``total``) stands for index ``e + shift[r]``. The running sum steps by 1 inside a run and by
    ``jumps[r] + 1`` at the run's first element (``jumps[r] = shift[r] - shift[r - 1]``, and ``jumps[0]
    = shift[0] - 1``); zero-length runs share a first element and their jumps telescope away.
    ``positions``, ``jumps``: int64 ``[R]``; ``total``: the number of elements (host-known).
    """

    positions: torch.Tensor
    jumps: torch.Tensor
    total: int

    @classmethod
    def on_host(cls, starts: np.ndarray, positions: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
        """`of` in NumPy (int64 arrays on the host): ``(positions, jumps)``, no torch operation."""
        shift = starts - positions
        jumps = shift.copy()
        jumps[:1] -= 1
        jumps[1:] -= shift[:-1]
        return positions, jumps

    @classmethod
    def of(cls, starts: torch.Tensor, positions: torch.Tensor, total: int) -> Runs:
        """Run ``r`` covering elements from ``positions[r]`` (non-decreasing, ``positions[0] == 0``) and
        standing for indices from ``starts[r]``. Four operations."""
        shift = starts - positions
        return cls(positions, shift - F.pad(shift[:-1], (1, 0), value=1), total)

    def indices(self, begin: int = 0, end: int | None = None) -> torch.Tensor:
        """int64 ``[end - begin]``: the index of every element in ``[begin, end)`` (default: all).

        A constant number of operations (5 for all elements, 6 for the first of several slices, 8 for a later
        one): one fill, one
        ``index_add_`` of the ``R`` jumps (runs that begin before ``begin`` land on its first element,
        where their jumps sum to the shift in force there; runs that begin at or after ``end`` land on
        one spare slot past the end), one in-place ``cumsum``.
        """
        end = self.total if end is None else end
        n = end - begin
        steps = torch.ones(n + 1, dtype=torch.int64, device=self.jumps.device)  # + 1: the spare slot
        positions = self.positions
        if begin:
            steps[:1].fill_(begin + 1)
            positions = (positions - begin).clamp_(0, n)
        elif end < self.total:
            positions = positions.clamp(max=n)
        steps.index_add_(0, positions, self.jumps)
        return steps[:-1].cumsum_(0)


class Gather(NamedTuple):
    """Rows of a jagged tensor planned for a gather (`plan_gather`): the result's ``offsets`` ``[R + 1]``
    (int64, the tensor's device), each result value's source ``indices`` ``[total]``, ``total`` (its
    number of values), ``seqlens`` (its cached sizes) and ``sizes`` (their `size_cache`, which the results
    on the plan share), and ``host``: ``offsets`` as a NumPy array where they are on the CPU (None
    elsewhere, never read there for this)."""

    offsets: torch.Tensor
    indices: torch.Tensor
    total: int
    seqlens: Seqlens
    sizes: dict[str, torch.Tensor]
    host: np.ndarray | None


def plan_gather(
    x: JaggedPart, rows: torch.Tensor, total: int | None = None, seqlens: Seqlens = None, key: Any = None
) -> Gather:
    """The plan of ``[rows_of(x)[i] for i in rows]``, ``x``'s offsets checked (`check_offsets`); tensors
    on the same offsets share it (`gather_values` moves each one's values).

    ``rows``: int64 ``[R]`` in ``range(B)`` on ``x``'s device. ``total``: the number of values of the
    result when known (a permutation keeps ``N``, and ``seqlens``, `x`'s cached sizes, where it has them);
    otherwise it is read from the device (a synchronisation on an accelerator), with the result's
    shortest and longest row in the same read. ``key``: the field's name, which an error names.
    """
    lengths = check_offsets([x], key)
    new_lengths = lengths.index_select(0, rows)
    new_offsets = zero_prefixed_cumsum(new_lengths)
    host = None
    if new_lengths.device.type == "cpu":
        seqlens = seqlens_of(new_lengths)
        host = new_offsets.numpy() if numpy_bridge() else None
    elif total is None and new_lengths.numel():  # one read for the total and the cached sizes
        total, lo, hi = torch.stack([new_offsets[-1], *torch.aminmax(new_lengths)]).tolist()
        seqlens = lo, hi
    if total is None:
        total = int(new_offsets[-1])
    src = Runs.of(x.offsets[:-1].index_select(0, rows), new_offsets[:-1], total).indices()
    return Gather(new_offsets, src, total, seqlens, size_cache(seqlens), host)


def gather_values(values: torch.Tensor, plan: Gather) -> torch.Tensor:
    """``values`` ``[N, *F]`` gathered by ``plan`` into fresh ``[plan.total, *F]``: one ``index_select``
    (of the bits, for a dtype torch cannot index: `torch_impl._bits`)."""
    return from_bits(as_bits(values).index_select(0, plan.indices), values.dtype)
