"""The few-rows path's checks and guards (`torch_impl._fewrows`) at the cases the rest of the suite
leaves out (found by a hand mutation of the module, `docs/mutation.md`): a call whose only micro-batch
has bad offsets (no valid micro-batch to send the check to `_explain_bad_offsets`, which reads them
all), and a span reversed by one byte. (The prefault floor's boundary: `tests/test_torch_impl.py::
test_the_few_rows_path_stops_at_its_rows_and_at_the_prefault_floor`.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torch_impl
import torch_impl._assemble
from property_tests.data import jagged
from ref import errors


@pytest.mark.parametrize(
    ("values", "offsets", "message"),
    [
        (torch.arange(10.0)[3:6], [1, 2, 3], r"micro-batch 0: offsets\[0\] must be 0, got 1"),
        (torch.arange(10.0)[3:6], [-1, 1, 3], r"micro-batch 0: offsets\[0\] must be 0, got -1"),
        (torch.arange(10.0)[3:6], [0, 1, 2], r"micro-batch 0: offsets\[-1\] must equal len\(values\) = 3, got 2"),
        (torch.arange(10.0)[3:6], [0, 1, 4], r"micro-batch 0: offsets\[-1\] must equal len\(values\) = 3, got 4"),
        (
            torch.arange(20.0).view(10, 2)[3:6],
            [0, 1, 2],
            r"micro-batch 0: offsets\[-1\] must equal len\(values\) = 3, got 2",
        ),
        (torch.zeros(0, 0), [0, 1], r"micro-batch 0: offsets\[-1\] must equal len\(values\) = 0, got 1"),
    ],
    ids=["first_1", "first_minus_1", "last_short", "last_long", "last_equals_trailing_dim", "a_row_of_no_values"],
)
def test_the_few_rows_path_rejects_bad_offsets_in_a_calls_only_micro_batch(values, offsets, message) -> None:
    """`check_few_offsets` raises for each broken invariant of the only micro-batch as the NumPy path
    does. A missed check reads nothing outside a tensor: the values are views inside a larger one, and
    the empty values (whose address is 0) have rows of no bytes, which copy nothing."""
    bad = torch_impl._jagged.njt(values, torch.tensor(offsets, dtype=torch.int64))
    outs = [{"model_output": {"lp": bad}}]
    parts = [list(range(len(offsets) - 1))]
    for few_rows in (0, 128):
        with torch_impl.use_settings(cpu_few_rows=few_rows), pytest.raises(errors.InvalidJaggedError, match=message):
            torch_impl.postprocess_batch(outs, parts)


def test_a_few_rows_copy_of_a_reversed_span_is_refused(monkeypatch) -> None:
    """The few-rows path's guard: a defect that reversed a row's span, by a single byte (uint8 values),
    raises instead of copying nothing and moving the next row's destination back."""
    from torch_impl import _fewrows
    from torch_impl._parts import check_parts

    parts = check_parts([jagged(torch.arange(6, dtype=torch.uint8), [3, 0, 3])], "lp")

    def reversed_span(parts: Any, key: Any) -> Any:
        return [3, 0, 4], [[0, 3, 2, 6]]  # spans of 3, -1 and 4 bytes, all inside the values

    monkeypatch.setattr(_fewrows, "check_few_offsets", reversed_span)
    with pytest.raises(RuntimeError, match="a defect of rebatch"):
        _fewrows.assemble_few_rows(parts, "lp", None)
    moves: list[Any] = []
    _fewrows.assemble_few_rows(parts, "lp", None, moves)  # planned: refused when it runs
    with pytest.raises(RuntimeError, match="a defect of rebatch"):
        moves[0]()
