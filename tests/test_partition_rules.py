"""verl 0.9.1's partitioner (`ref.partition`), rule by rule, in pure Python: no torch, no JAX, so the
mutation session of ``ref/partition.py`` runs it in about a second per mutant.

The Karmarkar-Karp results are verl's own (its ``karmarkar_karp`` run on these inputs, order of the sets
and of the items in each set included); the rest are the rules of the docstrings, each checked on a
case where a wrong rule gives a different answer.
"""

from __future__ import annotations

import math

import pytest

from ref.errors import TokenBudgetError, UnsupportedSettingError
from ref.partition import (
    balanced_partitions,
    check_rows,
    get_group_balanced_partitions,
    get_seqlen_balanced_partitions,
    karmarkar_karp,
    pipeline_order,
    plan_micro_batches,
    workload,
)
from ref.structure import PADDING

#: (values, k, equal_size, verl's karmarkar_karp result)
VERL_KARMARKAR_KARP = [
    ([5, 5, 5, 5], 2, False, [[3, 0], [2, 1]]),
    ([1, 1, 1, 1, 1, 1], 3, True, [[5, 0], [4, 1], [3, 2]]),
    ([0, 0, 0], 2, False, [[1, 0], [2]]),
    ([9, 1, 1, 1], 2, False, [[0], [3, 2, 1]]),
    ([3, 3, 2, 2, 2], 2, False, [[2, 0, 3], [1, 4]]),
    ([8, 7, 6, 5, 4], 3, False, [[4, 1], [3, 2], [0]]),
    ([1, 2, 3, 4, 5, 6], 2, True, [[1, 4, 3], [0, 5, 2]]),
    ([4, 4, 1, 1], 2, True, [[1, 2], [0, 3]]),
    ([10], 1, False, [[0]]),
    ([2, 1], 2, False, [[0], [1]]),
    ([0, 0, 0, 0], 2, True, [[3, 0], [2, 1]]),
    ([7, 7, 7, 1, 1, 1], 3, True, [[2, 3], [1, 4], [0, 5]]),
    ([6, 0, 4, 2, 0, 4, 0, 3], 2, True, [[2, 0, 6, 1], [7, 5, 3, 4]]),
    ([0, 3, 1, 0, 1, 6, 0, 4, 0], 2, False, [[2, 1, 7], [5, 4, 8, 6, 3, 0]]),
    ([17, 2, 1, 0, 2, 17], 2, False, [[2, 0, 1], [5, 4, 3]]),
    ([4, 1, 0, 6], 2, True, [[3, 2], [0, 1]]),
    ([4, 3, 4, 13], 4, False, [[3], [2], [0], [1]]),
    ([3, 2, 7, 6, 1, 4, 4, 2], 3, False, [[1, 5, 6], [0, 3, 4], [2, 7]]),
    ([0, 4, 1, 2, 3, 0, 6, 2, 4], 3, True, [[6, 3, 0], [8, 7, 2], [1, 4, 5]]),
    ([2, 3, 18, 0, 0, 2, 6, 0], 3, False, [[2], [1, 5, 0], [6, 7, 4, 3]]),
    ([0, 3, 1, 0, 0, 6, 1, 1], 4, True, [[5, 0], [1, 3], [6, 2], [7, 4]]),
    ([29, 0, 3, 4, 1, 3, 4, 6, 2], 3, False, [[0], [6, 3, 2, 4], [7, 5, 8, 1]]),
    ([0, 1, 6, 0, 15, 1, 2, 1, 4], 2, False, [[2, 8, 6, 7, 5, 1], [4, 3, 0]]),
    ([2, 1, 22, 4, 6, 0, 14, 24], 4, True, [[7, 5], [2, 1], [6, 0], [4, 3]]),
    ([3, 3, 3, 1, 1, 1, 2, 0, 0], 3, False, [[4, 3, 0], [6, 1], [5, 2, 8, 7]]),
    ([2, 0, 2, 4, 1], 4, False, [[3], [2], [0], [4, 1]]),
    ([2, 0, 3, 3, 3, 0], 3, True, [[0, 2], [5, 3], [1, 4]]),
    ([1, 4, 0, 4, 6, 0], 4, False, [[4], [3], [1], [0, 5, 2]]),
    ([4, 25, 24, 6, 7, 6, 1, 4], 4, False, [[1], [2], [4, 7, 0], [5, 3, 6]]),
    ([0, 0, 3, 1, 4, 2, 14, 6, 2, 1], 3, False, [[6], [4, 2, 5, 3], [7, 8, 9, 1, 0]]),
    ([1, 1, 4, 4], 2, True, [[3, 0], [2, 1]]),
    ([6, 1, 1, 13], 3, False, [[3], [0], [2, 1]]),
]


def test_workload_is_verls_estimate() -> None:
    assert [workload(n) for n in (0, 1, 1000, 4096)] == [0, 24_577, 25_576_000, 117_440_512]


@pytest.mark.parametrize(("values", "k", "equal_size", "expected"), VERL_KARMARKAR_KARP)
def test_karmarkar_karp_gives_verls_sets_in_verls_order(values, k, equal_size, expected) -> None:
    assert karmarkar_karp(values, k, equal_size) == expected
    assert get_seqlen_balanced_partitions(values, k, equal_size) == [sorted(p) for p in expected]


def test_karmarkar_karp_sets_are_not_of_equal_size_unless_asked() -> None:
    assert karmarkar_karp([3, 1, 1], 2) == [[0], [2, 1]]
    assert karmarkar_karp([9, 1, 1, 1], 2) == [[0], [3, 2, 1]]


def test_karmarkar_karp_of_nothing_is_k_empty_sets() -> None:
    assert karmarkar_karp([], 3) == [[], [], []]


@pytest.mark.parametrize(
    ("values", "k", "equal_size"),
    [
        ([1, 2, 3], 0, False),
        ([1, 2], 3, False),
        ([], 1, False),
        ([1, 2, 3], 2, True),
        ([1, 2, 3, 4, 5], 2, True),
    ],
)
def test_seqlen_partitions_reject_impossible_counts(values, k, equal_size) -> None:
    with pytest.raises(UnsupportedSettingError):
        get_seqlen_balanced_partitions(values, k, equal_size)


def test_seqlen_partitions_accept_exactly_as_many_items_as_partitions() -> None:
    assert get_seqlen_balanced_partitions([3, 1], 2, False) == [[0], [1]]
    assert get_seqlen_balanced_partitions([5], 1, True) == [[0]]


def test_group_partitions_keep_runs_of_equal_uids_together() -> None:
    # runs: rows [0, 1] (uid a), [2] (uid b), [3, 4, 5] (uid a again: a new run), [6] (uid c)
    lengths = [5, 1, 9, 1, 1, 1, 4]
    uids = ["a", "a", "b", "a", "a", "a", "c"]
    loads = [workload(5) + workload(1), workload(9), 3 * workload(1), workload(4)]
    groups = [[0, 1], [2], [3, 4, 5], [6]]
    expected = [
        sorted(r for g in p for r in groups[g]) for p in get_seqlen_balanced_partitions(loads, 2, True)
    ]
    assert get_group_balanced_partitions(lengths, uids, 2) == expected == [[2, 3, 4, 5], [0, 1, 6]]
    assert get_group_balanced_partitions(lengths, uids, 4) == [[2], [0, 1], [6], [3, 4, 5]]


def test_group_partitions_hold_equally_many_groups() -> None:
    # one heavy group: balancing the sums alone would leave it alone against the three light ones
    assert get_group_balanced_partitions([50, 1, 1, 1], ["a", "b", "c", "d"], 2) == [[0, 1], [2, 3]]


def test_group_runs_are_runs_of_equal_uids_not_of_the_same_object() -> None:
    a, b = 1000, int("1000")  # equal, and (beyond the small-int cache) two objects
    assert a == b
    assert get_group_balanced_partitions([3, 3, 1, 1], [a, b, 7, 7], 2) == [[0, 1], [2, 3]]


def test_group_partitions_of_many_rows() -> None:
    n = 300  # lengths beyond the small-int cache compare equal as numbers
    parts = get_group_balanced_partitions([1] * n, [i // 2 for i in range(n)], 2)
    assert [len(p) for p in parts] == [n // 2, n // 2]
    assert sorted(parts[0] + parts[1]) == list(range(n))


def test_group_partitions_reject_mismatched_lists_and_too_few_groups() -> None:
    with pytest.raises(UnsupportedSettingError, match="same length"):
        get_group_balanced_partitions([1, 2, 3], ["a", "b"], 1)
    with pytest.raises(UnsupportedSettingError, match="same length"):
        get_group_balanced_partitions([1, 2], ["a", "b", "c"], 1)
    with pytest.raises(UnsupportedSettingError, match="2 uid groups for 3 partitions"):
        get_group_balanced_partitions([1, 2, 3], ["a", "a", "b"], 3)
    assert get_group_balanced_partitions([1, 2, 3], ["a", "b", "c"], 3) == [[2], [1], [0]]


def test_pipeline_order_sorts_by_workload_then_first_index() -> None:
    # loads: [0] -> 1, [1, 2] -> 2 (ties with [3, 4] on load; the larger first index is "heavier")
    lengths = [1, 1, 1, 1, 1]
    assert pipeline_order(lengths, [[0], [1, 2], [3, 4]]) == [[0], [3, 4], [1, 2]]
    assert pipeline_order([1, 1, 1], [[], [2], [0, 1]]) == [[], [0, 1], [2]]
    assert pipeline_order([], []) == []
    # an empty micro-batch counts as first index 0: it ties with [0] of no tokens, and the sort is stable
    assert pipeline_order([0], [[0], []]) == [[0], []]
    assert pipeline_order([0], [[], [0]]) == [[], [0]]


def _rows(parts):
    return sorted(i for p in parts for i in p)


def test_plan_count_is_the_budget_count_of_groups() -> None:
    lengths = [3, 3, 3, 3, 3, 3]  # 18 tokens
    assert len(plan_micro_batches(lengths, 9)) == 2  # ceil(18 / 9): exact division does not add one
    assert len(plan_micro_batches(lengths, 10)) == 2  # ceil(18 / 10)
    assert len(plan_micro_batches(lengths, 18)) == 1
    assert len(plan_micro_batches(lengths, 100, min_num_micro_batch=4)) == 4
    assert len(plan_micro_batches(lengths, 9, min_num_micro_batch=1)) == 2  # a minimum below the count
    assert len(plan_micro_batches(lengths, 9, num_batches_divided_by=3)) == 3
    assert len(plan_micro_batches(lengths, 9, num_batches_divided_by=2)) == 2
    assert len(plan_micro_batches([0, 0, 0], 5)) == 1  # rows of no tokens still make one micro-batch
    assert plan_micro_batches([], 5) == []


def test_plan_grows_by_the_multiple_until_everything_fits() -> None:
    lengths = [7, 7, 7, 1, 1, 1]  # 24 tokens, budget 12: 2 micro-batches cannot keep 7 + 7 apart
    assert len(plan_micro_batches(lengths, 12)) == 3
    assert len(plan_micro_batches(lengths, 12, num_batches_divided_by=2)) == 4
    parts = plan_micro_batches(lengths, 12, num_batches_divided_by=2)
    assert all(sum(lengths[i] for i in p) <= 12 for p in parts)
    assert _rows(parts) == list(range(6))


def test_plan_rejects_rows_and_settings_outside_the_budget() -> None:
    with pytest.raises(TokenBudgetError, match="max_token_len must be positive"):
        plan_micro_batches([1], 0)
    with pytest.raises(TokenBudgetError, match="max_token_len must be positive, got -4"):
        plan_micro_batches([1], -4)
    with pytest.raises(TokenBudgetError, match="force_group_size must be at least 1"):
        plan_micro_batches([1], 5, force_group_size=0)
    with pytest.raises(TokenBudgetError, match="row 1: length -1 is negative"):
        plan_micro_batches([1, -1, 9], 5)
    with pytest.raises(TokenBudgetError, match="row 2: length -1 is negative"):
        plan_micro_batches([1, 0, -1], 5)  # the first negative row is named, not the first empty one
    with pytest.raises(TokenBudgetError, match="row 2: length 9 exceeds the token budget of 5"):
        plan_micro_batches([1, 1, 9], 5)
    with pytest.raises(TokenBudgetError, match="row 1: length 9 exceeds"):
        plan_micro_batches([5, 9], 5)  # the row over the budget is named, not a row at it
    with pytest.raises(TokenBudgetError, match="padded width 6 exceeds"):
        plan_micro_batches([1, 1], 5, max_seq_len=6)
    with pytest.raises(TokenBudgetError, match="batch size 3 must be divisible by force_group_size 2"):
        plan_micro_batches([1, 1, 1], 5, force_group_size=2)
    with pytest.raises(TokenBudgetError, match="only 2 rows"):
        plan_micro_batches([1, 1], 5, min_num_micro_batch=3)
    with pytest.raises(TokenBudgetError, match="only 2 groups of force_group_size=2 rows"):
        plan_micro_batches([1, 1, 1, 1], 5, force_group_size=2, min_num_micro_batch=3)
    with pytest.raises(TokenBudgetError, match="max_group_token_len=6 and max_token_len=5"):
        plan_micro_batches([3, 3, 1, 1], 5, force_group_size=2)
    # at the budget is inside it
    assert plan_micro_batches([5], 5) == [[0]]
    assert plan_micro_batches([1, 1], 1, use_dynamic_bsz_balance=False) == [[1], [0]]  # the smallest budget
    assert plan_micro_batches([2, 3], 5, force_group_size=2, max_seq_len=5) == [[0, 1]]


@pytest.mark.parametrize("multiple", [0, -2])
def test_plan_rejects_a_multiple_below_one(multiple) -> None:
    """0 divided by zero (a ZeroDivisionError, not a RebatchError); a negative multiple made the count
    shrink while looking for one that fits."""
    with pytest.raises(
        UnsupportedSettingError, match=f"num_batches_divided_by must be at least 1, got {multiple}"
    ):
        plan_micro_batches([2, 2, 2], 3, num_batches_divided_by=multiple)
    with pytest.raises(UnsupportedSettingError):
        balanced_partitions([2, 2, 2], 3, multiple_of=multiple)


def test_plan_accepts_a_multiple_of_one() -> None:
    """1, the smallest valid multiple, plans as no multiple at all."""
    assert plan_micro_batches([2, 2, 2], 3, num_batches_divided_by=1) == plan_micro_batches([2, 2, 2], 3)
    assert balanced_partitions([2, 2, 2], 3, multiple_of=1) == balanced_partitions([2, 2, 2], 3)


def test_plan_keeps_forced_groups_whole_and_balances_their_workloads() -> None:
    lengths = [4, 4, 1, 1, 3, 3, 2, 2]  # groups of 2: 8, 2, 6, 4 tokens
    parts = plan_micro_batches(lengths, 10, force_group_size=2, use_dynamic_bsz_balance=False)
    loads = [sum(workload(n) for n in lengths[2 * g : 2 * g + 2]) for g in range(4)]
    groups = get_seqlen_balanced_partitions(loads, 2, equal_size=False)
    assert (
        parts == [[r for g in p for r in (2 * g, 2 * g + 1)] for p in groups] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    )
    assert plan_micro_batches(lengths, 10, force_group_size=2) == pipeline_order(lengths, parts)


def test_plan_balance_orders_the_micro_batches() -> None:
    lengths = [1, 2, 3, 4]
    plain = plan_micro_batches(lengths, 100, min_num_micro_batch=4, use_dynamic_bsz_balance=False)
    assert plain == [[3], [2], [1], [0]]
    assert plan_micro_batches(lengths, 100, min_num_micro_batch=4) == [[1], [3], [2], [0]]
    assert balanced_partitions(lengths, 100, min_num_micro_batches=4, balance=False) == plain
    assert balanced_partitions(lengths, 100, min_num_micro_batches=3, multiple_of=2) == [[1], [3], [2], [0]]
    assert balanced_partitions([4, 4, 1, 1], 9, force_group_size=2) == [[0, 1], [2, 3]]


class FakeRanks:
    """The agreement of `plan_micro_batches` with other ranks simulated: each reduction joins this
    rank's values with the other ranks' scripted ones (MAX / MIN), and every call is recorded."""

    def __init__(self, others_max: list[list[int]], others_min: list[list[int]] | None = None) -> None:
        self.others_max = others_max
        self.others_min = others_min or []
        self.calls: list[tuple[str, list[int]]] = []

    def max(self, values: list[int]) -> list[int]:
        self.calls.append(("max", list(values)))
        other = self.others_max.pop(0)
        return [max(a, b) for a, b in zip(values, other, strict=True)]

    def min(self, values: list[int]) -> list[int]:
        self.calls.append(("min", list(values)))
        other = self.others_min.pop(0) if self.others_min else [1]
        return [min(a, b) for a, b in zip(values, other, strict=True)]


def test_plan_takes_the_largest_count_over_the_ranks() -> None:
    sync = FakeRanks([[3, 0], [0, -100]])
    parts = plan_micro_batches([2, 2, 2, 2, 2, 2], 100, sync=sync)
    assert len(parts) == 3
    assert sync.calls == [("max", [1, 0]), ("max", [2, -6]), ("min", [1])]


def test_plan_fails_on_every_rank_when_one_rank_fails() -> None:
    with pytest.raises(TokenBudgetError, match="another rank of the data-parallel group rejected its batch"):
        plan_micro_batches([1, 1], 10, sync=FakeRanks([[1, 1]]))
    # this rank's own problem is named, whatever the other ranks say
    with pytest.raises(TokenBudgetError, match="row 0: length 11"):
        plan_micro_batches([11, 1], 10, sync=FakeRanks([[1, 1]]))


def test_plan_applies_the_other_ranks_group_constraints() -> None:
    assert plan_micro_batches([1, 1], 10, sync=FakeRanks([[0, 0], [10, -2]])) == [[0, 1]]  # at the budget
    # 11 tokens in some rank's group: over the budget there, so over it here
    with pytest.raises(TokenBudgetError, match="max_group_token_len=11"):
        plan_micro_batches([1, 1], 10, sync=FakeRanks([[0, 0], [11, -2]]))
    with pytest.raises(TokenBudgetError, match="a rank of the data-parallel group has only 1 rows"):
        plan_micro_batches([1, 1], 10, sync=FakeRanks([[2, 0], [0, -1]]))


def test_plan_grows_while_any_rank_overflows() -> None:
    # here one micro-batch fits; another rank says it does not: the count grows to 2 on both
    sync = FakeRanks([[0, 0], [0, -4]], others_min=[[0], [1]])
    parts = plan_micro_batches([1, 1, 1, 1], 10, sync=sync)
    assert len(parts) == 2
    assert [c[0] for c in sync.calls] == ["max", "max", "min", "min"]


def test_plan_pads_a_rank_with_fewer_groups_than_the_count() -> None:
    parts = plan_micro_batches([1, 2], 10, min_num_micro_batch=4, pad_to_count=True)
    assert parts == [[0], [1], PADDING, PADDING]
    parts = plan_micro_batches([1, 2, 3, 4], 10, force_group_size=2, min_num_micro_batch=3, pad_to_count=True)
    assert parts == [[0, 1], [2, 3], PADDING]
    # a rank without rows: count 0 here, the others' count agreed; every micro-batch is padding
    assert plan_micro_batches([], 10, pad_to_count=True, sync=FakeRanks([[2, 0], [0, 0]])) == [
        PADDING,
        PADDING,
    ]
    # enough groups: no padding, the ordinary balanced plan
    assert plan_micro_batches([1, 2], 10, min_num_micro_batch=2, pad_to_count=True) == [[1], [0]]


def test_plan_count_never_exceeds_what_the_rules_need() -> None:
    # count = min(groups, ceil(total / budget)): 5 rows of 9 tokens, budget 10 -> 5 micro-batches, not 6
    assert len(plan_micro_batches([9] * 5, 10)) == min(5, math.ceil(45 / 10))


def test_the_planning_settings_are_keyword_only() -> None:
    """A setting passed by position would land on the wrong parameter: they are keyword-only."""
    with pytest.raises(TypeError):
        plan_micro_batches([1, 1], 5, 2)  # type: ignore[misc]
    with pytest.raises(TypeError):
        balanced_partitions([1, 1], 5, 2)  # type: ignore[misc]
    with pytest.raises(TypeError):
        check_rows([1, 1], 5, 2)  # type: ignore[misc]


def test_check_rows_defaults_to_groups_of_one_row() -> None:
    """Without ``force_group_size`` any batch size is accepted (groups of one row)."""
    check_rows([1, 2, 3], 5)
    with pytest.raises(TokenBudgetError, match="batch size 3 must be divisible by force_group_size 2"):
        check_rows([1, 2, 3], 5, force_group_size=2)
