"""The defects of ``postprocess_batch``'s ``indices`` as a permutation: a duplicate, negative, out-of-range,
float, nested or oversized index, a dropped row, and hostile partition types (on the meta device, a NumPy
object array with a non-integer entry, a sequence whose ``len()`` lies)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ref import errors as E

from ..data import from_rows, rows_of
from ._core import (
    POSTPROCESS,
    Breaker,
    Call,
    Chooser,
    Defect,
    keys_of,
    model_output_of,
    one_index,
    positions_of,
)

__all__ = ["PERMUTATION", "LyingPartition"]


class LyingPartition(Sequence[int]):
    """A sequence whose ``len()`` claims ``claimed`` entries while iterating it gives ``entries`` (a
    partition of 10**9 claimed rows must cost nothing before it is refused)."""

    def __init__(self, entries: Sequence[int], claimed: int) -> None:
        self.entries = list(entries)
        self.claimed = claimed

    def __len__(self) -> int:
        return self.claimed

    def __getitem__(self, i: Any) -> Any:
        return self.entries[i]

    def __repr__(self) -> str:
        return f"LyingPartition({self.entries!r}, claimed={self.claimed})"


def _meta_partition(call: Call, choose: Chooser) -> Call:
    """One partition as an int64 tensor on torch's meta device (no values to check)."""
    import torch

    indices = call.args[1]
    m = choose.choice(range(len(indices)))
    indices[m] = torch.tensor([int(i) for i in indices[m]], dtype=torch.int64, device="meta")
    return call


def _object_array_partition(call: Call, choose: Chooser) -> Call:
    """One partition as a NumPy object array whose chosen entry is the string of its index."""
    import numpy as np

    indices = call.args[1]
    m, j = choose.choice(positions_of(indices))
    array = np.empty(len(indices[m]), dtype=object)
    for k, i in enumerate(indices[m]):
        array[k] = str(i) if k == j else int(i)
    indices[m] = array
    return call


def _lying_partition(call: Call, choose: Chooser) -> Call:
    """One partition whose ``len()`` claims 10**9 entries (or one more than it holds)."""
    indices = call.args[1]
    m = choose.choice(range(len(indices)))
    indices[m] = LyingPartition(indices[m], choose.choice([10**9, len(indices[m]) + 1]))
    return call


def _bad_index(make: Callable[[Call, Chooser, int, int], Any]) -> Breaker:
    """One position of ``indices`` replaced by ``make(call, choose, m, j)``."""
    return one_index(1, make)


def _uint64_partition(call: Call, choose: Chooser) -> Call:
    """One partition as a uint64 array whose chosen entry is ``2**64 - 1`` (it must not wrap to -1)."""
    import numpy as np

    indices = call.args[1]
    m, j = choose.choice(positions_of(indices))
    row = [int(i) for i in indices[m]]
    row[j] = 2**64 - 1
    indices[m] = np.array(row, dtype=np.uint64)
    return call


def _float_after_an_array(call: Call, choose: Chooser) -> Call:
    """Micro-batch 0's partition as an integer array, then a float index in a later micro-batch."""
    import numpy as np

    indices = call.args[1]
    m, j = choose.choice([(m, j) for m, j in positions_of(indices) if m > 0])
    indices[m][j] = float(indices[m][j])
    indices[0] = np.array(indices[0], dtype=np.int64)
    return call


def _num_rows(call: Call) -> int:
    return sum(len(p) for p in call.args[1])


def _duplicate(call: Call, choose: Chooser, m: int, j: int) -> Any:
    indices = call.args[1]
    return choose.choice([i for p in indices for i in p if i != indices[m][j]])


def _dropped_row(call: Call, choose: Chooser) -> Call:
    """One row (not the last index) left out of its partition and of every key's output."""
    indices = call.args[1]
    b = _num_rows(call)
    m, j = choose.choice([(m, j) for m, j in positions_of(indices) if indices[m][j] != b - 1])
    del indices[m][j]
    for k in keys_of(call):
        rows = rows_of(model_output_of(call, m)[k])
        model_output_of(call, m)[k] = from_rows(
            [r for n, r in enumerate(rows) if n != j], model_output_of(call, m)[k]
        )
    return call


PERMUTATION: tuple[Defect, ...] = (
    Defect(
        "duplicate_index",
        POSTPROCESS,
        E.NotAPermutationError,
        r"micro-batch 1, position 0: index 1 duplicates micro-batch 0, position 0",
        "two rows",
        _bad_index(_duplicate),
        script=(2, 0),
    ),
    Defect(
        "negative_index",
        POSTPROCESS,
        E.NotAPermutationError,
        r"micro-batch 1, position 0: index -1 is negative",
        "one row",
        _bad_index(lambda call, choose, m, j: -choose.integer(1, max(_num_rows(call), 1))),
        script=(2, 0),
    ),
    Defect(
        "out_of_range_index",
        POSTPROCESS,
        E.NotAPermutationError,
        r"micro-batch 0, position 1: index 3 is out of range for 3 rows",
        "one row",
        _bad_index(lambda call, choose, m, j: _num_rows(call) + choose.integer(0, 3)),
        script=(1, 0),
    ),
    Defect(
        "float_index",
        POSTPROCESS,
        E.NotAPermutationError,
        r"micro-batch 0, position 0: index 1\.0 is not an integer",
        "one row",
        _bad_index(lambda call, choose, m, j: float(call.args[1][m][j])),
    ),
    Defect(
        "nested_index",
        POSTPROCESS,
        E.NotAPermutationError,
        r"micro-batch 0, position 0: index \[1\] is not an integer",
        "one row",
        _bad_index(lambda call, choose, m, j: [call.args[1][m][j]]),
    ),
    Defect(
        "index_past_int64",
        POSTPROCESS,
        E.NotAPermutationError,
        r"micro-batch 0, position 1: index 1180591620717411303424 is out of range for 3 rows",
        "one row",
        _bad_index(lambda call, choose, m, j: 2**70),
        script=(1,),
    ),
    Defect(
        "uint64_index_not_wrapped",
        POSTPROCESS,
        E.NotAPermutationError,
        r"micro-batch 1, position 0: index 18446744073709551615 is out of range for 3 rows",
        "one row",
        _uint64_partition,
        script=(2,),
    ),
    Defect(
        "float_index_after_an_array_partition",
        POSTPROCESS,
        E.NotAPermutationError,
        r"micro-batch 1, position 0: index 0\.0 is not an integer",
        "two micro-batches, a row in a later one",
        _float_after_an_array,
    ),
    Defect(
        "meta_device_partition",
        POSTPROCESS,
        E.UnsupportedSettingError,
        r"micro-batch 0: the indices are on the meta device, which holds no values to check",
        "a micro-batch",
        _meta_partition,
    ),
    Defect(
        "object_array_non_integer_index",
        POSTPROCESS,
        E.NotAPermutationError,
        r"micro-batch 0, position 1: index '2' is not an integer",
        "one row",
        _object_array_partition,
        script=(1,),
    ),
    Defect(
        "partition_len_lies",
        POSTPROCESS,
        E.PartitionMismatchError,
        r"micro-batch 0: a partition's len\(\) is 1000000000, but iterating it gives 2 indices",
        "a micro-batch",
        _lying_partition,
    ),
    Defect(
        "dropped_row",
        POSTPROCESS,
        E.NotAPermutationError,
        r"micro-batch 0, position 0: index 2 is out of range for 2 rows",
        "two rows",
        _dropped_row,
    ),
)
