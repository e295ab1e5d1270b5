"""The defects of the other operations: ``flatten_partitions``, ``inverse_permutation``, ``restore``,
``split``, ``concat``, ``balanced_partitions``, ``fixed_partitions`` and ``take``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ref import errors as E

from ._core import (
    Breaker,
    Call,
    Chooser,
    Defect,
    made_decreasing,
    one_index,
    positions_of,
    retyped,
    row_count,
)

__all__ = ["OPERATIONS"]


def _delete_index(call: Call, choose: Chooser) -> Call:
    parts = call.args[0]
    m, j = choose.choice(positions_of(parts))
    del parts[m][j]
    return call


def _repeat_in_perm(call: Call, choose: Chooser) -> Call:
    perm = call.args[0]
    j = choose.choice(range(1, len(perm)))
    perm[j] = perm[choose.choice(range(j))]
    return call


def _first_arg(change: Callable[[torch.Tensor], torch.Tensor]) -> Breaker:
    def breaker(call: Call, choose: Chooser) -> Call:
        return call._replace(args=(change(call.args[0]), *call.args[1:]))

    return breaker


def _concat_dtype(call: Call, choose: Chooser) -> Call:
    parts = call.args[0]
    m = choose.choice(range(1, len(parts)))
    parts[m] = retyped(parts[m], torch.int32)
    return call


def _concat_nothing(call: Call, choose: Chooser) -> Call:
    return call._replace(args=([],))


def _row_over_budget(call: Call, choose: Chooser) -> Call:
    lengths, budget = call.args
    i = choose.choice(range(len(lengths)))
    lengths[i] = budget + choose.integer(1, 10)
    return call


def _too_few_rows(call: Call, choose: Chooser) -> Call:
    call.kwargs["min_num_micro_batches"] = len(call.args[0]) + choose.integer(1, 3)
    return call


def _not_an_integer(position: int, options: list[object]) -> Breaker:
    """The breaker that puts a value that is not an integer (one of ``options``) in argument
    ``position``."""

    def breaker(call: Call, choose: Chooser) -> Call:
        args = list(call.args)
        args[position] = choose.choice(options)
        return call._replace(args=tuple(args))

    return breaker


def _count_not_an_integer(call: Call, choose: Chooser) -> Call:
    call.kwargs["min_num_micro_batches"] = choose.choice([1.5, "2", True])
    return call


def _take_index(make: Callable[[int, Chooser], int]) -> Breaker:
    def breaker(call: Call, choose: Chooser) -> Call:
        x, idx = call.args
        j = choose.choice(range(len(idx)))
        idx[j] = make(row_count(x), choose)
        return call

    return breaker


OPERATIONS: tuple[Defect, ...] = (
    Defect(
        "missing_index",
        "flatten_partitions",
        E.NotAPermutationError,
        r"index 1 is missing",
        "one index",
        _delete_index,
    ),
    Defect(
        "inverse_of_duplicate",
        "inverse_permutation",
        E.NotAPermutationError,
        r"index 0 duplicates",
        "two indices",
        _repeat_in_perm,
    ),
    Defect(
        "restore_negative",
        "restore",
        E.NotAPermutationError,
        r"index -1 is negative",
        "one row",
        one_index(1, lambda call, choose, m, j: -choose.integer(1, 3)),
    ),
    Defect(
        "split_duplicate",
        "split",
        E.NotAPermutationError,
        r"index 1 duplicates",
        "two rows",
        one_index(
            1,
            lambda call, choose, m, j: choose.choice(
                [i for p in call.args[1] for i in p if i != call.args[1][m][j]]
            ),
        ),
        script=(1, 0),
    ),
    Defect(
        "restore_bad_offsets",
        "restore",
        E.InvalidJaggedError,
        r"non-decreasing",
        "two rows",
        _first_arg(made_decreasing),
    ),
    Defect(
        "concat_dtypes", "concat", E.DtypeMismatchError, r"micro-batch 1: dtype", "two parts", _concat_dtype
    ),
    Defect(
        "concat_nothing",
        "concat",
        E.UnsupportedSettingError,
        r"at least one part",
        "nothing",
        _concat_nothing,
    ),
    Defect(
        "row_over_budget",
        "balanced_partitions",
        E.TokenBudgetError,
        r"row 1: length 9 exceeds the token budget of 8",
        "one row",
        _row_over_budget,
        script=(1, 0),
    ),
    Defect(
        "more_micro_batches_than_rows",
        "balanced_partitions",
        E.TokenBudgetError,
        r"3 micro-batches are needed .* only 2 rows",
        "nothing",
        _too_few_rows,
    ),
    Defect(
        "budget_not_an_integer",
        "balanced_partitions",
        E.UnsupportedSettingError,
        r"max_tokens must be an integer, got 8\.5",
        "nothing",
        _not_an_integer(1, [8.5, "8", True, None]),
    ),
    Defect(
        "micro_batch_count_not_an_integer",
        "balanced_partitions",
        E.UnsupportedSettingError,
        r"min_num_micro_batches must be an integer, got 1\.5",
        "nothing",
        _count_not_an_integer,
    ),
    Defect(
        "micro_batch_size_not_an_integer",
        "fixed_partitions",
        E.UnsupportedSettingError,
        r"micro_batch_size must be an integer, got '2'",
        "nothing",
        _not_an_integer(1, ["2", 1.5, True, None]),
    ),
    Defect(
        "take_negative_row",
        "take",
        E.RowIndexError,
        r"position 1: row index -1 is out of range for 2 rows",
        "one row",
        _take_index(lambda n, choose: -choose.integer(1, n + 2)),
        script=(1, 0),
    ),
    Defect(
        "take_out_of_range",
        "take",
        E.RowIndexError,
        r"row index 3 is out of range for 3 rows",
        "one row",
        _take_index(lambda n, choose: n + choose.integer(0, 3)),
        base="take_dense",
    ),
)
