"""Bad inputs as data (OpInfo's ``error_inputs_func``): each named case, the operation it calls, the
`RebatchError` subclass both implementations must raise, and a pattern its message must match.

Inputs are built in torch; the reference gets them through ``ref.interop`` inside the call (so a
conversion that rejects bad data counts as the reference rejecting it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from ref import errors

from .data import jagged
from .strategies import strided_nested

__all__ = ["ErrorCase", "error_cases"]


class ErrorCase(NamedTuple):
    name: str
    op: str
    build: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]
    error: type[errors.RebatchError]
    pattern: str


def _lp(*lengths: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return jagged(torch.arange(sum(lengths)).to(dtype), list(lengths))


def _call(
    *parts: dict[str, torch.Tensor] | None, indices: Any = ((1, 2), (0,)), **kwargs: Any
) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    """A ``postprocess_batch`` call whose micro-batch ``m`` has model_output ``parts[m]``."""

    def build() -> tuple[tuple[Any, ...], dict[str, Any]]:
        outs = [{"model_output": p} if p is not None else {"loss": 1.0} for p in parts]
        idx = [list(p) for p in indices] if isinstance(indices, tuple) else indices
        return (outs, idx), kwargs

    return build


def _padding() -> Any:
    from ref import PADDING

    return PADDING


def _bad_offsets() -> torch.Tensor:
    return torch.nested.nested_tensor_from_jagged(torch.zeros(3), torch.tensor([0, 3, 2]))


def _holed(lengths: list[int]) -> torch.Tensor:
    """Two rows at offsets 0 and 4 of 10 values, with ``lengths`` (a non-contiguous nested tensor)."""
    return torch.nested.nested_tensor_from_jagged(
        torch.arange(10.0), torch.tensor([0, 4, 8]), lengths=torch.tensor(lengths)
    )


def _with_metrics(metrics: Any) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    """A valid one-micro-batch call whose output carries ``metrics`` (a value that is not a dict)."""
    return lambda: (([{"model_output": {"lp": _lp(1, 1)}, "metrics": metrics}], [[1, 0]]), {})


def _ok(**extra: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Two valid micro-batches (2 rows, then 1 row) of key 'lp', plus ``extra`` keys in micro-batch 1."""
    return {"lp": _lp(2, 0)}, {"lp": _lp(1), **extra}


def error_cases() -> list[ErrorCase]:
    e = errors
    mb0, mb1 = _ok()
    return [
        # -- indices that are not a permutation of range(B)
        ErrorCase(
            "duplicate_index",
            "postprocess_batch",
            _call(mb0, mb1, indices=((1, 2), (1,))),
            e.NotAPermutationError,
            r"micro-batch 1, position 0: index 1 duplicates micro-batch 0, position 0",
        ),
        ErrorCase(
            "negative_index",
            "postprocess_batch",
            _call(mb0, mb1, indices=((1, 2), (-1,))),
            e.NotAPermutationError,
            r"micro-batch 1, position 0: index -1 is negative",
        ),
        ErrorCase(
            "out_of_range_index",
            "postprocess_batch",
            _call(mb0, mb1, indices=((1, 3), (0,))),
            e.NotAPermutationError,
            r"micro-batch 0, position 1: index 3 is out of range for 3 rows",
        ),
        ErrorCase(
            "float_index",
            "postprocess_batch",
            _call(mb0, mb1, indices=((1.0, 2), (0,))),
            e.NotAPermutationError,
            r"micro-batch 0, position 0: index 1\.0 is not an integer",
        ),
        ErrorCase(
            "index_past_int64",
            "postprocess_batch",
            _call(mb0, mb1, indices=((1, 2**70), (0,))),
            e.NotAPermutationError,
            r"micro-batch 0, position 1: index 1180591620717411303424 is out of range for 3 rows",
        ),
        ErrorCase(
            "uint64_index_not_wrapped",
            "postprocess_batch",
            _call(mb0, mb1, indices=[[1, 2], np.array([2**64 - 1], dtype=np.uint64)]),
            e.NotAPermutationError,
            r"micro-batch 1, position 0: index 18446744073709551615 is out of range for 3 rows",
        ),
        ErrorCase(
            "float_index_after_a_tensor_partition",
            "postprocess_batch",
            _call(mb0, mb1, indices=[np.array([1, 2]), [0.0]]),
            e.NotAPermutationError,
            r"micro-batch 1, position 0: index 0\.0 is not an integer",
        ),
        ErrorCase(
            "missing_index",
            "flatten_partitions",
            lambda: (([[2], [0]], 3), {}),
            e.NotAPermutationError,
            r"index 1 is missing",
        ),
        ErrorCase(
            "inverse_of_duplicate",
            "inverse_permutation",
            lambda: (([0, 0, 1],), {}),
            e.NotAPermutationError,
            r"index 0 duplicates",
        ),
        ErrorCase(
            "restore_negative",
            "restore",
            lambda: ((_lp(1, 2), [[-1], [0]]), {}),
            e.NotAPermutationError,
            r"index -1 is negative",
        ),
        ErrorCase(
            "split_duplicate",
            "split",
            lambda: ((_lp(1, 2), [[1], [1]]), {}),
            e.NotAPermutationError,
            r"index 1 duplicates",
        ),
        # -- partitions that do not match the micro-batches
        ErrorCase(
            "too_many_partitions",
            "postprocess_batch",
            _call(mb0, mb1, indices=((1, 2), (0,), ())),
            e.PartitionMismatchError,
            r"3 partitions for 2 micro-batches",
        ),
        ErrorCase(
            "row_count",
            "postprocess_batch",
            _call(mb0, mb1, indices=((1,), (0, 2))),
            e.PartitionMismatchError,
            r"key 'lp', micro-batch 0: 2 rows, but its partition has 1 indices",
        ),
        ErrorCase(
            "padding_without_its_output",
            "postprocess_batch",
            lambda: (([{"model_output": _ok()[0]}], [[1, 0], _padding()]), {}),
            e.PartitionMismatchError,
            r"2 partitions \(padding included\) for 1 micro-batch outputs",
        ),
        # -- outputs that disagree
        ErrorCase(
            "missing_key",
            "postprocess_batch",
            _call({"lp": _lp(2, 0), "v": torch.zeros(2)}, {"lp": _lp(1)}),
            e.KeyMismatchError,
            r"key 'v', micro-batch 1: missing",
        ),
        ErrorCase(
            "extra_key",
            "postprocess_batch",
            _call(mb0, {"lp": _lp(1), "v": torch.zeros(1)}),
            e.KeyMismatchError,
            r"key 'v', micro-batch 1: present",
        ),
        ErrorCase(
            "missing_model_output",
            "postprocess_batch",
            _call(mb0, None),
            e.KeyMismatchError,
            r"key 'model_output', micro-batch 1: missing",
        ),
        ErrorCase(
            "dtype",
            "postprocess_batch",
            _call(mb0, {"lp": _lp(1, dtype=torch.float64)}),
            e.DtypeMismatchError,
            r"key 'lp', micro-batch 1: dtype .*float64 differs from micro-batch 0's .*float32",
        ),
        ErrorCase(
            "device",
            "postprocess_batch",
            _call(mb0, {"lp": _lp(1).to("meta")}),
            e.DeviceMismatchError,
            r"key 'lp', micro-batch 1: device .* differs from micro-batch 0's",
        ),
        ErrorCase(
            "trailing_shape",
            "postprocess_batch",
            _call(mb0, {"lp": jagged(torch.zeros(1, 2), [1])}),
            e.ShapeMismatchError,
            r"key 'lp', micro-batch 1: trailing shape \(2,\) differs from micro-batch 0's \(\)",
        ),
        ErrorCase(
            "layout",
            "postprocess_batch",
            _call(mb0, {"lp": torch.zeros(1)}),
            e.ShapeMismatchError,
            r"key 'lp', micro-batch 1: layout dense differs from micro-batch 0's jagged",
        ),
        ErrorCase(
            "scalar_output",
            "postprocess_batch",
            _call({"v": torch.tensor(1.0)}, {"v": torch.tensor(2.0)}),
            e.ShapeMismatchError,
            r"key 'v', micro-batch 0: a dense output needs a leading batch dimension",
        ),
        ErrorCase(
            "concat_dtypes",
            "concat",
            lambda: (([_lp(1), _lp(2, dtype=torch.int32)],), {}),
            e.DtypeMismatchError,
            r"micro-batch 1: dtype",
        ),
        # -- invalid jagged data
        ErrorCase(
            "decreasing_offsets",
            "postprocess_batch",
            _call(mb0, {"lp": _bad_offsets()}, indices=((1, 2), (0, 3))),
            e.InvalidJaggedError,
            r"offsets must be non-decreasing, got offsets\[1\] = 3 > offsets\[2\] = 2",
        ),
        ErrorCase(
            "lengths_past_the_values",
            "postprocess_batch",
            _call({"lp": _holed([4, 7])}, indices=((1, 0),)),
            e.InvalidJaggedError,
            r"key 'lp', micro-batch 0: row 1 runs past the values: offsets\[1\] \+ lengths\[1\] = 4 \+ 7 > len\(values\) = 10",
        ),
        ErrorCase(
            "negative_lengths",
            "postprocess_batch",
            _call(mb0, {"lp": _holed([-1, 2])}, indices=((1, 2), (0, 3))),
            e.InvalidJaggedError,
            r"key 'lp', micro-batch 1: lengths\[0\] = -1 is negative",
        ),
        ErrorCase(
            "strided_nested",
            "postprocess_batch",
            _call(mb0, {"lp": strided_nested([torch.zeros(1)])}),
            e.InvalidJaggedError,
            r"jagged layout",
        ),
        ErrorCase(
            "restore_bad_offsets",
            "restore",
            lambda: ((_bad_offsets(), [[1], [0]]), {}),
            e.InvalidJaggedError,
            r"non-decreasing",
        ),
        # -- unsupported settings
        ErrorCase(
            "unknown_pad_mode",
            "postprocess_batch",
            _call(mb0, mb1, pad_mode="left"),
            e.UnsupportedSettingError,
            r"pad_mode must be one of .* got 'left'",
        ),
        ErrorCase(
            "indices_none",
            "postprocess_batch",
            _call(mb0, mb1, indices=None),
            e.UnsupportedSettingError,
            r"indices is None while use_dynamic_bsz is on",
        ),
        ErrorCase(
            "jagged_with_padding",
            "postprocess_batch",
            _call(mb0, mb1, pad_mode="right"),
            e.UnsupportedSettingError,
            r"key 'lp', micro-batch 0: jagged outputs need pad_mode 'no_padding'",
        ),
        ErrorCase(
            "output_not_a_dict",
            "postprocess_batch",
            lambda: (([["model_output"]], [[0]]), {}),
            e.UnsupportedSettingError,
            r"micro-batch 0: an output must be a dict",
        ),
        ErrorCase(
            "metrics_none",
            "postprocess_batch",
            _with_metrics(None),
            e.UnsupportedSettingError,
            r"key 'metrics', micro-batch 0: metrics must be a dict, got NoneType",
        ),
        ErrorCase(
            "metrics_a_list",
            "postprocess_batch",
            _with_metrics([1.0]),
            e.UnsupportedSettingError,
            r"key 'metrics', micro-batch 0: metrics must be a dict, got list",
        ),
        ErrorCase(
            "metrics_a_tensor",
            "postprocess_batch",
            _with_metrics(torch.ones(2)),
            e.UnsupportedSettingError,
            r"key 'metrics', micro-batch 0: metrics must be a dict, got Tensor",
        ),
        ErrorCase("concat_nothing", "concat", lambda: (([],), {}), e.UnsupportedSettingError, r"at least one part"),
        # -- the token budget
        ErrorCase(
            "row_over_budget",
            "balanced_partitions",
            lambda: (([3, 9, 2], 8), {}),
            e.TokenBudgetError,
            r"row 1: length 9 exceeds the token budget of 8",
        ),
        ErrorCase(
            "more_micro_batches_than_rows",
            "balanced_partitions",
            lambda: (([3, 2], 8), {"min_num_micro_batches": 3}),
            e.TokenBudgetError,
            r"3 micro-batches are needed .* only 2 rows",
        ),
        # -- take
        ErrorCase(
            "take_negative_row",
            "take",
            lambda: ((_lp(1, 2), [0, -1]), {}),
            e.RowIndexError,
            r"position 1: row index -1 is out of range for 2 rows",
        ),
        ErrorCase(
            "take_out_of_range",
            "take",
            lambda: ((torch.zeros(3), [3]), {}),
            e.RowIndexError,
            r"row index 3 is out of range for 3 rows",
        ),
    ]
