"""verl's token-budget micro-batch partitioner (0.9.1's rule, and 0.8.0's and 0.9.0's with ``one_pass``) (pure
Python: no JAX, no torch; shared by `ref` and
`torch_impl`).

Rows (or groups of ``force_group_size`` consecutive rows, kept together) are packed into micro-batches
by the largest differencing method (Karmarkar-Karp) on verl's workload estimate
``24576 * len + len**2``. The number of micro-batches starts at ``min(groups, ceil(total / budget))``,
is raised to a minimum, synchronised over data-parallel ranks (the largest), rounded up to a multiple,
and then grows until every micro-batch fits the budget. With balancing, micro-batches are ordered by
``(workload, first index)``, heaviest first, and interleaved so the lightest sit at both ends.

The names ``karmarkar_karp``, ``get_seqlen_balanced_partitions``, ``get_group_balanced_partitions`` and
the rule of ``rearrange_micro_batches`` (`plan_micro_batches`) are verl's, with verl's results, order
included; where verl fails an ``assert`` (or raises ``ValueError``), these raise a `RebatchError`
subclass. Data-parallel synchronisation is a parameter (`CountSync`), so this module stays pure.
"""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Hashable, Sequence
from typing import Any, Protocol

from .errors import TokenBudgetError, UnsupportedSettingError
from .structure import PADDING, as_integer

__all__ = [
    "CountSync",
    "balanced_partitions",
    "check_counts",
    "check_rows",
    "fixed_partitions",
    "get_group_balanced_partitions",
    "get_seqlen_balanced_partitions",
    "karmarkar_karp",
    "pipeline_order",
    "plan_micro_batches",
    "workload",
]


def workload(length: int) -> int:
    """verl's estimate of a row's compute: ``24576 * len + len**2`` (a 7B dense transformer block)."""
    return 24576 * length + length * length


class _Set:
    """One partition in the making: its items ``(index, value)`` in insertion order, and their sum.
    Sets compare by ``key``, ``(sum, number of items, items)``, as verl's. A set is never changed once
    made (`joined` makes a new one), so states share them."""

    __slots__ = ("items", "key", "total")

    def __init__(self, items: list[tuple[int, int]] | None = None) -> None:
        self.items = items or []
        self.total = sum(v for _, v in self.items)
        self.key = (self.total, len(self.items), self.items)

    def joined(self, other: _Set) -> _Set:
        """This set's items, then ``other``'s: ``_Set(self.items + other.items)`` (a side with no items
        gives the other set itself)."""
        if not other.items:
            return self
        if not self.items:
            return other
        return _Set(self.items + other.items)


class _State:
    """``k`` sets, largest first; states are merged largest-spread first (ties: the larger top set)."""

    __slots__ = ("sets",)

    def __init__(self, sets: list[_Set]) -> None:
        self.sets = sorted(sets, key=_KEY, reverse=True)

    @property
    def spread(self) -> int:
        return self.sets[0].total - self.sets[-1].total

    def __lt__(self, other: _State) -> bool:  # heapq pops the "smallest": here, the largest spread
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.sets[0].key > other.sets[0].key

    def merge(self, other: _State) -> _State:
        """Set ``i`` of this state joins set ``k - 1 - i`` of the other: large with small."""
        k = len(self.sets)
        return _State([self.sets[i].joined(other.sets[k - 1 - i]) for i in range(k)])


_KEY = operator.attrgetter("key")


def karmarkar_karp(
    seqlen_list: Sequence[int], k_partitions: int, equal_size: bool = False
) -> list[list[int]]:
    """Indices of ``seqlen_list`` in ``k_partitions`` sets of near-equal sums (largest differencing), as verl.

    Start from one state per value (the value alone in one set, the other sets empty), or with
    ``equal_size`` one state per run of ``k`` consecutive values in ascending order (one value per
    set), values taken in ascending order of ``(value, index)``; repeatedly merge the two states of
    largest spread; the last state's sets are the partition, largest sum first, each in insertion order.
    """
    k = k_partitions
    ordered = sorted((v, i) for i, v in enumerate(seqlen_list))
    if equal_size:
        if len(ordered) % k:
            raise UnsupportedSettingError(f"equal_size needs a multiple of {k} items, got {len(ordered)}")
        groups = [ordered[a : a + k] for a in range(0, len(ordered), k)]
    else:
        groups = [[vi] for vi in ordered]
    empty = _Set()  # every empty set of the starting states (a set is never changed)
    heap = [_State([_Set([(i, v)]) for v, i in g] + [empty] * (k - len(g))) for g in groups]
    heapq.heapify(heap)  # distinct states never compare equal, so the pop order is the same as verl's pushes
    while len(heap) > 1:
        a = heapq.heappop(heap)
        b = heapq.heappop(heap)
        heapq.heappush(heap, a.merge(b))
    final = heap[0] if heap else _State([empty] * k)
    return [[i for i, _ in s.items] for s in final.sets]


def get_seqlen_balanced_partitions(
    seqlen_list: Sequence[int], k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """verl's: `karmarkar_karp`, each partition's indices sorted ascending (partitions kept in its order).

    ``out == [sorted(p) for p in karmarkar_karp(seqlen_list, k_partitions, equal_size)]``; raises
    `UnsupportedSettingError` for fewer items than partitions (or, with ``equal_size``, a count that
    does not divide) and `TokenBudgetError` if a partition comes out empty.
    """
    if k_partitions < 1 or len(seqlen_list) < k_partitions:
        raise UnsupportedSettingError(
            f"k_partitions must be between 1 and the number of items ({len(seqlen_list)}), got {k_partitions}"
        )
    parts = [sorted(p) for p in karmarkar_karp(seqlen_list, k_partitions, equal_size)]
    for i, p in enumerate(parts):
        if not p:
            raise TokenBudgetError(f"partition {i} of {k_partitions} is empty")
    return parts


def get_group_balanced_partitions(
    seqlen_list: Sequence[int], uid_list: Sequence[Hashable], k_partitions: int
) -> list[list[int]]:
    """verl's: ``k_partitions`` partitions of rows keeping runs of equal consecutive ``uid`` together.

    Each run of equal consecutive uids is a group whose workload is the sum of its rows' `workload`;
    groups are split by `get_seqlen_balanced_partitions` with ``equal_size=True``; each partition lists
    its rows ascending. Raises `UnsupportedSettingError` for lists of different lengths or fewer groups
    than partitions.
    """
    if len(seqlen_list) != len(uid_list):
        raise UnsupportedSettingError(
            f"seqlen_list and uid_list must have the same length, got {len(seqlen_list)} and {len(uid_list)}"
        )
    groups: list[list[int]] = []
    for i, uid in enumerate(uid_list):
        if groups and uid == uid_list[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    if len(groups) < k_partitions:
        raise UnsupportedSettingError(
            f"{len(groups)} uid groups for {k_partitions} partitions: need at least as many"
        )
    loads = [sum(workload(int(seqlen_list[i])) for i in g) for g in groups]
    parts = get_seqlen_balanced_partitions(loads, k_partitions, equal_size=True)
    return [sorted(i for g in p for i in groups[g]) for p in parts]


class CountSync(Protocol):
    """The data-parallel agreement `plan_micro_batches` needs: element-wise MAX and MIN over the ranks."""

    def max(self, values: list[int]) -> list[int]: ...

    def min(self, values: list[int]) -> list[int]: ...


def pipeline_order(lengths: Sequence[int], parts: list[list[int]]) -> list[list[int]]:
    """verl's order: by ``(workload, first index)``, heaviest first, then interleaved
    ``p[::2][::-1] + p[1::2]`` (the lightest at both ends)."""
    parts = sorted(
        parts, key=lambda p: (sum(workload(lengths[i]) for i in p), p[0] if p else 0), reverse=True
    )
    return parts[::2][::-1] + parts[1::2]


def check_rows(
    lengths: Sequence[int], max_token_len: int, *, force_group_size: int = 1, max_seq_len: int | None = None
) -> None:
    """What `plan_micro_batches` refuses before any planning (`TokenBudgetError`): a budget or group size
    below 1, a negative length, a row longer than the budget (or, given ``max_seq_len``, a dense batch
    wider than it, as verl checks), a batch not divisible into groups of ``force_group_size`` rows; a
    budget or group size that is not an integer (`UnsupportedSettingError`, `ref.structure.as_integer`)."""
    max_token_len = as_integer(max_token_len, "max_token_len")
    force_group_size = as_integer(force_group_size, "force_group_size")
    if max_token_len <= 0:
        raise TokenBudgetError(f"max_token_len must be positive, got {max_token_len}")
    if force_group_size < 1:
        raise TokenBudgetError(f"force_group_size must be at least 1, got {force_group_size}")
    for i, n in enumerate(lengths):
        if n < 0:
            raise TokenBudgetError(f"row {i}: length {n} is negative")
    for i, n in enumerate(lengths):
        if n > max_token_len:
            raise TokenBudgetError(f"row {i}: length {n} exceeds the token budget of {max_token_len}")
    if (
        max_seq_len is not None and max_seq_len > max_token_len
    ):  # a dense batch's padded width, as verl checks
        raise TokenBudgetError(f"the padded width {max_seq_len} exceeds the token budget of {max_token_len}")
    if len(lengths) % force_group_size:
        raise TokenBudgetError(
            f"batch size {len(lengths)} must be divisible by force_group_size {force_group_size}"
        )


def check_counts(
    max_token_len: Any,
    *,
    force_group_size: Any = 1,
    min_num_micro_batch: Any = None,
    num_batches_divided_by: Any = None,
) -> tuple[int, int, int | None, int | None]:
    """The integer settings of `plan_micro_batches` as ints, None kept (`ref.structure.as_integer`:
    `UnsupportedSettingError` naming the first that is not an integer)."""
    budget = as_integer(max_token_len, "max_token_len")
    group = as_integer(force_group_size, "force_group_size")
    least = None if min_num_micro_batch is None else as_integer(min_num_micro_batch, "min_num_micro_batch")
    multiple = (
        None
        if num_batches_divided_by is None
        else as_integer(num_batches_divided_by, "num_batches_divided_by")
    )
    return budget, group, least, multiple


# Complex by design: verl's split, step by step, read as one function.
def plan_micro_batches(  # noqa: C901
    lengths: Sequence[int],
    max_token_len: int,
    *,
    num_batches_divided_by: int | None = None,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
    max_seq_len: int | None = None,
    sync: CountSync | None = None,
    pad_to_count: bool = False,
    one_pass: bool = False,
) -> list[Any]:
    """The micro-batches of verl 0.9.1's ``rearrange_micro_batches`` (same partitions, same order), or
    with ``one_pass`` those of verl 0.8.0's and 0.9.0's.

    ``lengths``: tokens per row; ``max_seq_len``: the longest row as verl measures it (the padded width
    of a dense batch; default ``max(lengths)``); ``sync``: the data-parallel group's agreement, or None.

    1. ``max_seq_len <= max_token_len`` and ``B % force_group_size == 0`` (`TokenBudgetError`; with
       ``sync``, a failure on any rank is raised on every rank);
    2. ``count = min(groups, ceil(total / max_token_len))``, raised to ``min_num_micro_batch`` (and to
       1 when there are rows), the largest over the ranks, rounded up to ``num_batches_divided_by``;
    3. no group longer than the budget and ``count <= groups``, on every rank (`TokenBudgetError`);
    4. groups split by `get_seqlen_balanced_partitions` on the groups' workloads; while a micro-batch
       on any rank holds more than ``max_token_len`` tokens, ``count`` grows by ``num_batches_divided_by``
       (or 1), checked again by 3;
    5. groups expanded to their rows; with ``use_dynamic_bsz_balance``, `pipeline_order`.

    ``pad_to_count``: a rank with fewer groups than the agreed count is not an error (3): it gets each
    group alone, then `PADDING` for each micro-batch it lacks (a padding micro-batch), while still
    taking part in every agreement. Every rank makes the same ``sync`` calls whatever its data.

    ``one_pass`` (verl 0.8.0 and 0.9.0, before verl PR #7553): 4 runs once, with the count of 2: a
    micro-batch may hold more than ``max_token_len`` tokens, and 3 checks only ``count <= groups`` (a
    forced group longer than the budget is not refused; a row longer than it is, by 1).
    """
    max_token_len, fgs, min_num_micro_batch, num_batches_divided_by = check_counts(
        max_token_len,
        force_group_size=force_group_size,
        min_num_micro_batch=min_num_micro_batch,
        num_batches_divided_by=num_batches_divided_by,
    )
    force_group_size = fgs
    if num_batches_divided_by is not None and num_batches_divided_by < 1:
        raise UnsupportedSettingError(
            f"num_batches_divided_by must be at least 1, got {num_batches_divided_by}"
        )
    lengths = [int(n) for n in lengths]
    b = len(lengths)
    problem: TokenBudgetError | None = None
    try:
        check_rows(lengths, max_token_len, force_group_size=fgs, max_seq_len=max_seq_len)
    except TokenBudgetError as err:
        problem = err
    num_groups = b // max(fgs, 1)
    count = min(num_groups, math.ceil(sum(lengths) / max_token_len)) if problem is None else 0
    if min_num_micro_batch is not None:
        count = max(min_num_micro_batch, count)
    count = max(count, 1) if b else count
    if sync is not None:  # the count and any rank's fatal problem, agreed in one collective
        count, failed = sync.max([count, int(problem is not None)])
        if failed and problem is None:
            problem = TokenBudgetError(
                "another rank of the data-parallel group rejected its batch (its error names the row)"
            )
    if problem is not None:
        raise problem
    step = num_batches_divided_by or 1
    if num_batches_divided_by is not None:
        count = math.ceil(count / num_batches_divided_by) * num_batches_divided_by
    group_tokens = [sum(lengths[g * fgs : (g + 1) * fgs]) for g in range(num_groups)]
    group_loads = [sum(workload(n) for n in lengths[g * fgs : (g + 1) * fgs]) for g in range(num_groups)]
    longest_group, fewest_groups = max(group_tokens, default=0), num_groups
    if sync is not None:  # verl's fatal constraints, agreed before any rank raises
        longest_group, neg = sync.max([longest_group, -num_groups])
        fewest_groups = -neg
    if longest_group > max_token_len and not one_pass:
        raise TokenBudgetError(  # verl's words, so that what matches verl's message matches this one
            "A forced group exceeds max_token_len and cannot be split. "
            f"Got max_group_token_len={longest_group} and max_token_len={max_token_len}."
        )
    parts: list[Any] = []
    while True:
        if count > fewest_groups and not pad_to_count:
            who = "a rank of the data-parallel group has" if sync is not None else "there are"
            what = "rows" if fgs == 1 else f"groups of force_group_size={fgs} rows"
            if one_pass:  # verl 0.8.0 and 0.9.0: ``assert num_micro_batches <= num_groups``
                raise TokenBudgetError(f"{count} micro-batches, but {who} only {fewest_groups} {what}")
            raise TokenBudgetError(
                "Cannot satisfy max_token_len while keeping forced groups atomic and using the same "
                f"micro-batch count across DP ranks: {count} micro-batches are needed for the token budget "
                f"of {max_token_len}, but {who} only {fewest_groups} {what}"
            )
        if count > num_groups or count == 0:  # every group alone (each fits, unless one_pass), then padding
            parts = [[g] for g in range(num_groups)] + [PADDING] * (count - num_groups)
            fits = True
        else:
            parts = get_seqlen_balanced_partitions(group_loads, count, equal_size=False)
            fits = one_pass or all(sum(group_tokens[g] for g in p) <= max_token_len for p in parts)
        if sync is not None and not one_pass:
            (fits_everywhere,) = sync.min([int(fits)])
            fits = bool(fits_everywhere)
        if fits:
            break
        count += step
    if any(p is PADDING for p in parts):
        return [p if p is PADDING else list(range(p[0] * fgs, (p[0] + 1) * fgs)) for p in parts]
    rows = [[r for g in p for r in range(g * fgs, (g + 1) * fgs)] for p in parts]
    return pipeline_order(lengths, rows) if use_dynamic_bsz_balance and rows else rows


def balanced_partitions(
    lengths: Sequence[int],
    max_tokens: int,
    *,
    min_num_micro_batches: int | None = None,
    multiple_of: int | None = None,
    balance: bool = True,
    force_group_size: int = 1,
) -> list[list[int]]:
    """Micro-batches of row indices, each holding at most ``max_tokens`` tokens: verl's
    ``rearrange_micro_batches`` on one rank (`plan_micro_batches` without synchronisation).

    ``count = min(groups, ceil(sum(lengths) / max_tokens))``, raised to ``min_num_micro_batches`` and
    rounded up to ``multiple_of``; groups of ``force_group_size`` consecutive rows are split into
    ``count`` sets by `karmarkar_karp` on `workload`; while a set exceeds the budget, ``count`` grows by
    ``multiple_of`` (or 1). Indices ascend inside each micro-batch. With ``balance``, `pipeline_order`.
    Deterministic. Raises `TokenBudgetError` for a row (or forced group) longer than ``max_tokens``,
    or more micro-batches than groups; `UnsupportedSettingError` for a budget, count or group size that
    is not an integer.
    """
    max_tokens = as_integer(max_tokens, "max_tokens")
    force_group_size = as_integer(force_group_size, "force_group_size")
    if min_num_micro_batches is not None:
        min_num_micro_batches = as_integer(min_num_micro_batches, "min_num_micro_batches")
    if multiple_of is not None:
        multiple_of = as_integer(multiple_of, "multiple_of")
    parts: list[list[int]] = plan_micro_batches(
        lengths,
        max_tokens,
        num_batches_divided_by=multiple_of,
        min_num_micro_batch=min_num_micro_batches,
        use_dynamic_bsz_balance=balance,
        force_group_size=force_group_size,
    )
    return parts


def fixed_partitions(rows: int, micro_batch_size: int) -> list[list[int]]:
    """The micro-batches of a fixed-size split: consecutive chunks of ``micro_batch_size`` rows.

    The last chunk is shorter where the size does not divide the batch. Raises `UnsupportedSettingError`
    for a size below 1, or a row count or size that is not an integer (`ref.structure.as_integer`).

    >>> rows, size = 5, 2
    >>> fixed_partitions(rows, size) == [list(range(i, min(i + size, rows))) for i in range(0, rows, size)]
    True
    >>> fixed_partitions(rows, size)
    [[0, 1], [2, 3], [4]]
    """
    rows = as_integer(rows, "rows")
    micro_batch_size = as_integer(micro_batch_size, "micro_batch_size")
    if micro_batch_size <= 0:
        raise UnsupportedSettingError(f"micro_batch_size must be positive, got {micro_batch_size}")
    if rows < 0:
        raise UnsupportedSettingError(f"rows must not be negative, got {rows}")
    starts = range(0, rows, micro_batch_size)
    return [list(range(start, min(start + micro_batch_size, rows))) for start in starts]
