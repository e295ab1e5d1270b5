"""`balanced_partitions`: verl's token-budget micro-batch partitioner (pure Python: no JAX, no torch).

Rows are packed into micro-batches by the largest differencing method (Karmarkar-Karp) on verl's
workload estimate ``24576 * len + len**2``; the count of micro-batches starts at
``min(B, ceil(total / max_tokens))`` and grows until every micro-batch fits the budget.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

from .errors import TokenBudgetError

__all__ = [
    "balanced_partitions",
    "check_lengths",
    "fits",
    "initial_count",
    "karmarkar_karp",
    "partition_into",
    "pipeline_order",
    "workload",
]


def workload(length: int) -> int:
    """verl's estimate of a row's compute: ``24576 * len + len**2`` (a 7B dense transformer block)."""
    return 24576 * length + length * length


class _Set:
    """One micro-batch in the making: its items ``(index, value)`` and their sum."""

    __slots__ = ("items", "total")

    def __init__(self, items: list[tuple[int, int]] | None = None) -> None:
        self.items = items or []
        self.total = sum(v for _, v in self.items)

    def key(self) -> tuple[Any, ...]:
        return (self.total, len(self.items), self.items)


class _State:
    """``k`` sets, largest first; states are merged largest-spread first (ties: the larger top set)."""

    __slots__ = ("sets",)

    def __init__(self, sets: list[_Set]) -> None:
        self.sets = sorted(sets, key=_Set.key, reverse=True)

    @property
    def spread(self) -> int:
        return self.sets[0].total - self.sets[-1].total

    def __lt__(self, other: _State) -> bool:  # heapq pops the "smallest": here, the largest spread
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.sets[0].key() > other.sets[0].key()

    def merge(self, other: _State) -> _State:
        """Set ``i`` of this state joins set ``k - 1 - i`` of the other: large with small."""
        k = len(self.sets)
        return _State([_Set(self.sets[i].items + other.sets[k - 1 - i].items) for i in range(k)])


def karmarkar_karp(values: Sequence[int], k: int) -> list[list[int]]:
    """Indices of ``values`` in ``k`` sets of near-equal sums (the largest differencing method).

    Start with one state per value (the value alone in one set, ``k - 1`` empty sets), in ascending
    order of ``(value, index)``; repeatedly merge the two states of largest spread; the last state's
    sets are the partition, largest sum first.
    """
    heap = [
        _State([_Set([(i, v)])] + [_Set() for _ in range(k - 1)])
        for v, i in sorted((v, i) for i, v in enumerate(values))
    ]
    heapq.heapify(heap)
    while len(heap) > 1:
        a = heapq.heappop(heap)
        b = heapq.heappop(heap)
        heapq.heappush(heap, a.merge(b))
    final = heap[0] if heap else _State([_Set() for _ in range(k)])
    return [[i for i, _ in s.items] for s in final.sets]


def check_lengths(lengths: Sequence[int], max_tokens: int) -> list[int]:
    """``lengths`` as ints, each non-negative and within ``max_tokens`` (`TokenBudgetError`)."""
    out = [int(n) for n in lengths]
    if max_tokens <= 0:
        raise TokenBudgetError(f"max_tokens must be positive, got {max_tokens}")
    for i, n in enumerate(out):
        if n < 0:
            raise TokenBudgetError(f"row {i}: length {n} is negative")
        if n > max_tokens:
            raise TokenBudgetError(f"row {i}: length {n} exceeds the token budget of {max_tokens}")
    return out


def initial_count(
    lengths: Sequence[int], max_tokens: int, *, min_num_micro_batches: int | None = None, multiple_of: int | None = None
) -> int:
    """``min(B, ceil(total / max_tokens))``, raised to ``min_num_micro_batches``, rounded up to ``multiple_of``."""
    count = min(len(lengths), math.ceil(sum(lengths) / max_tokens))
    if min_num_micro_batches is not None:
        count = max(count, min_num_micro_batches)
    count = max(count, 1) if lengths else count
    step = multiple_of or 1
    return math.ceil(count / step) * step if count else 0


def partition_into(lengths: Sequence[int], count: int) -> list[list[int]]:
    """``count`` micro-batches by `karmarkar_karp` on `workload`, indices ascending in each."""
    return [sorted(p) for p in karmarkar_karp([workload(n) for n in lengths], count)] if count else []


def fits(lengths: Sequence[int], parts: Sequence[Sequence[int]], max_tokens: int) -> bool:
    return all(sum(lengths[i] for i in p) <= max_tokens for p in parts)


def pipeline_order(lengths: Sequence[int], parts: list[list[int]]) -> list[list[int]]:
    """Heaviest first, then interleaved ``p[::2][::-1] + p[1::2]``: the lightest at both ends."""
    parts = sorted(parts, key=lambda p: sum(workload(lengths[i]) for i in p), reverse=True)
    return parts[::2][::-1] + parts[1::2]


def balanced_partitions(
    lengths: Sequence[int],
    max_tokens: int,
    *,
    min_num_micro_batches: int | None = None,
    multiple_of: int | None = None,
    balance: bool = True,
) -> list[list[int]]:
    """Micro-batches of row indices, each holding at most ``max_tokens`` tokens (verl's semantics).

    ``count = min(B, ceil(sum(lengths) / max_tokens))``, raised to ``min_num_micro_batches`` and rounded
    up to ``multiple_of``; rows are split into ``count`` sets by `karmarkar_karp` on `workload`; while a
    set exceeds the budget, ``count`` grows by ``multiple_of`` (or 1). Indices ascend inside each
    micro-batch. With ``balance``, micro-batches are ordered by workload, heaviest first, then
    interleaved ``p[::2][::-1] + p[1::2]`` so the lightest sit at both ends. Deterministic.
    Raises `TokenBudgetError` for a row longer than ``max_tokens`` or more micro-batches than rows.
    """
    lengths = check_lengths(lengths, max_tokens)
    count = initial_count(lengths, max_tokens, min_num_micro_batches=min_num_micro_batches, multiple_of=multiple_of)
    while True:
        if count > len(lengths):
            raise TokenBudgetError(
                f"{count} micro-batches are needed for the token budget of {max_tokens}, but there are only {len(lengths)} rows"
            )
        parts = partition_into(lengths, count)
        if fits(lengths, parts, max_tokens):
            break
        count += multiple_of or 1
    return pipeline_order(lengths, parts) if balance and parts else parts
