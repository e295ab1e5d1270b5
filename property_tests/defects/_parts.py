"""The defects of ``postprocess_batch`` per key and micro-batch (layout, dtype, device, trailing shape, row
counts, padding of jagged keys), the jagged invariants (offsets, lengths with holes) and ``metrics``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ref import errors as E
from torch_impl.testing import njt

from ..data import from_rows, jagged, offsets_of, rows_of
from ._core import (
    POSTPROCESS,
    TWO_MICRO_BATCHES,
    Breaker,
    Call,
    Chooser,
    Defect,
    _with_offsets,
    keys_of,
    made_decreasing,
    model_output_of,
    positions_of,
    retyped,
    row_count,
    strided_nested,
)

__all__ = ["PARTS"]


def _nonempty(call: Call, key: str) -> list[int]:
    return [m for m in range(len(call.args[0])) if row_count(model_output_of(call, m)[key]) > 0]


def _add_key(call: Call, name: str, *, dense: bool) -> str:
    """A new key ``name`` in every micro-batch (one zero entry per row), valid with the rest."""
    first = keys_of(call)[0]
    for m in range(len(call.args[0])):
        n = row_count(model_output_of(call, m)[first])
        model_output_of(call, m)[name] = torch.zeros(n) if dense else jagged(torch.zeros(n), [1] * n)
    return name


def _jagged_key(call: Call, choose: Chooser) -> str:
    """A jagged key of the call (one is added, ``tokens``, if it has none)."""
    keys = [k for k in keys_of(call) if model_output_of(call, 0)[k].is_nested]
    return choose.choice(keys) if keys else _add_key(call, "tokens", dense=False)


def _later_key(call: Call, choose: Chooser) -> str:
    """A key other than the first (``extra``, dense, is added if the call has one key)."""
    keys = keys_of(call)[1:]
    return choose.choice(keys) if keys else _add_key(call, "extra", dense=True)


def _other_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype != torch.float32 else torch.float64


def _drop_last_row(x: torch.Tensor) -> torch.Tensor:
    rows = rows_of(x)
    return from_rows(rows[:-1], x)


def _in_later_micro_batch(change: Callable[[torch.Tensor], torch.Tensor]) -> Breaker:
    """``change`` applied to one key's output in one micro-batch ``m >= 1``."""

    def breaker(call: Call, choose: Chooser) -> Call:
        key = choose.choice(keys_of(call))
        m = choose.choice(range(1, len(call.args[0])))
        model_output_of(call, m)[key] = change(model_output_of(call, m)[key])
        return call

    return breaker


def _reshape_trailing(x: torch.Tensor) -> torch.Tensor:
    if x.is_nested:
        v = x.values()
        return njt(torch.stack([v, v], dim=-1), offsets_of(x))
    return torch.stack([x, x], dim=-1)


def _relayout(x: torch.Tensor) -> torch.Tensor:
    if x.is_nested:  # jagged -> dense with one entry per row
        return torch.zeros(x.size(0), dtype=x.dtype)
    first = x.reshape(x.shape[0], -1)[:, :1].reshape(-1).clone() if x.numel() else x.new_zeros(x.shape[0])
    return jagged(first, [1] * x.shape[0])


def _scalar_output(call: Call, choose: Chooser) -> Call:
    key = choose.choice(keys_of(call))
    m = choose.choice(range(len(call.args[0])))
    model_output_of(call, m)[key] = torch.zeros((), dtype=model_output_of(call, m)[key].dtype)
    return call


def _in_jagged_key(change: Callable[[torch.Tensor], torch.Tensor]) -> Breaker:
    """``change`` applied to a jagged key's output in one micro-batch with rows (a key is added if none)."""

    def breaker(call: Call, choose: Chooser) -> Call:
        key = _jagged_key(call, choose)
        m = choose.choice(_nonempty(call, key))
        model_output_of(call, m)[key] = change(model_output_of(call, m)[key])
        return call

    return breaker


def _last_offset(x: torch.Tensor) -> torch.Tensor:
    o = offsets_of(x.contiguous()).clone()
    o[-1] += 1  # offsets[-1] no longer equals len(values)
    return _with_offsets(x.contiguous(), o)


def _strided(x: torch.Tensor) -> torch.Tensor:
    return strided_nested([r.clone() for r in rows_of(x)])


def _jagged_with_padding(call: Call, choose: Chooser) -> Call:
    _jagged_key(call, choose)
    call.kwargs["pad_mode"] = choose.choice(["right", "left_right"])
    return call


def _moved_index(call: Call, choose: Chooser) -> Call:
    indices = call.args[1]
    m, j = choose.choice(positions_of(indices))
    target = choose.choice([t for t in range(len(indices)) if t != m])
    indices[target].append(indices[m].pop(j))
    return call


def _later_key_row_count(*, dynamic: bool) -> Breaker:
    """A key after the first loses its last row in one micro-batch (its partition, and the first key,
    keep theirs); without dynamic batching, the call is made a plain concatenation first."""

    def breaker(call: Call, choose: Chooser) -> Call:
        key = _later_key(call, choose)
        m = choose.choice(_nonempty(call, key))
        model_output_of(call, m)[key] = _drop_last_row(model_output_of(call, m)[key])
        if not dynamic:
            call.kwargs["use_dynamic_bsz"] = False
            return call._replace(args=(call.args[0], None))
        return call

    return breaker


def _holed_lengths(make_lengths: Callable[[int], list[int]]) -> Breaker:
    """One jagged key of one micro-batch with rows as a nested tensor with holes (``lengths``), rows
    4 values apart in ``4 * n + 2`` values, lengths ``make_lengths(n)`` (broken: past the values or
    negative)."""

    def breaker(call: Call, choose: Chooser) -> Call:
        key = _jagged_key(call, choose)
        m = choose.choice(_nonempty(call, key))
        x = model_output_of(call, m)[key]
        n = row_count(x)
        values = torch.arange(4 * n + 2, dtype=x.dtype)
        offsets = torch.arange(0, 4 * n + 1, 4, dtype=torch.int64)
        model_output_of(call, m)[key] = njt(values, offsets, torch.tensor(make_lengths(n), dtype=torch.int64))
        return call

    return breaker


def _metrics_not_a_dict(call: Call, choose: Chooser) -> Call:
    outs = call.args[0]
    outs[choose.choice(range(len(outs)))]["metrics"] = choose.choice([None, [1.0], torch.ones(2)])
    return call


PARTS: tuple[Defect, ...] = (
    Defect(
        "layout",
        POSTPROCESS,
        E.ShapeMismatchError,
        r"key 'lp', micro-batch 1: layout dense differs from micro-batch 0's jagged",
        TWO_MICRO_BATCHES,
        _in_later_micro_batch(_relayout),
    ),
    Defect(
        "dtype",
        POSTPROCESS,
        E.DtypeMismatchError,
        r"key 'lp', micro-batch 1: dtype .*float64 differs from micro-batch 0's .*float32",
        TWO_MICRO_BATCHES,
        _in_later_micro_batch(lambda x: retyped(x, _other_dtype(x))),
    ),
    Defect(
        "device",
        POSTPROCESS,
        E.DeviceMismatchError,
        r"key 'lp', micro-batch 1: device .* differs from micro-batch 0's",
        TWO_MICRO_BATCHES,
        _in_later_micro_batch(lambda x: x.to("meta")),
    ),
    Defect(
        "trailing_shape",
        POSTPROCESS,
        E.ShapeMismatchError,
        r"key 'lp', micro-batch 1: trailing shape \(2,\) differs from micro-batch 0's \(\)",
        TWO_MICRO_BATCHES,
        _in_later_micro_batch(_reshape_trailing),
    ),
    Defect(
        "scalar_output",
        POSTPROCESS,
        E.ShapeMismatchError,
        r"key 'v', micro-batch 0: a dense output needs a leading batch dimension",
        "a key",
        _scalar_output,
        script=(1, 0),
    ),
    Defect(
        "strided_nested",
        POSTPROCESS,
        E.InvalidJaggedError,
        r"jagged layout",
        "a jagged key with a row (added if none)",
        _in_jagged_key(_strided),
        script=(0, 1),
    ),
    Defect(
        "jagged_with_padding",
        POSTPROCESS,
        E.UnsupportedSettingError,
        r"key 'lp', micro-batch 0: jagged outputs need pad_mode 'no_padding'",
        "a jagged key (added if none)",
        _jagged_with_padding,
    ),
    Defect(
        "row_count",
        POSTPROCESS,
        E.PartitionMismatchError,
        r"key 'lp', micro-batch 0: 2 rows, but its partition has 1 indices",
        TWO_MICRO_BATCHES,
        _moved_index,
        script=(1, 0),
    ),
    Defect(
        "later_key_row_count",
        POSTPROCESS,
        E.PartitionMismatchError,
        r"key 'v', micro-batch 0: 1 rows, but its partition has 2 indices",
        "a second key (added if none), a row",
        _later_key_row_count(dynamic=True),
    ),
    Defect(
        "later_key_row_count_without_dynamic_bsz",
        POSTPROCESS,
        E.ShapeMismatchError,
        r"key 'v', micro-batch 0: 1 rows, but key 'lp' has 2 there",
        "a second key (added if none), a row",
        _later_key_row_count(dynamic=False),
    ),
    # -- jagged invariants
    Defect(
        "decreasing_offsets",
        POSTPROCESS,
        E.InvalidJaggedError,
        r"offsets must be non-decreasing, got offsets\[1\] = 3 > offsets\[2\] = 2",
        "a jagged key with a row (added if none)",
        _in_jagged_key(made_decreasing),
    ),
    Defect(
        "bad_offsets",
        POSTPROCESS,
        E.InvalidJaggedError,
        r"micro-batch 0: offsets\[-1\] must equal len\(values\) = 2, got 3",
        "a jagged key with a row (added if none)",
        _in_jagged_key(_last_offset),
    ),
    Defect(
        "lengths_past_the_values",
        POSTPROCESS,
        E.InvalidJaggedError,
        # a regex, kept whole
        r"key 'lp', micro-batch 0: row 1 runs past the values: offsets\[1\] \+ lengths\[1\] = 4 \+ 7 > len\(values\) = 10",  # noqa: E501
        "a jagged key with a row (added if none)",
        _holed_lengths(lambda n: [2] * (n - 1) + [7]),
    ),
    Defect(
        "negative_lengths",
        POSTPROCESS,
        E.InvalidJaggedError,
        r"key 'lp', micro-batch 0: lengths\[0\] = -1 is negative",
        "a jagged key with a row (added if none)",
        _holed_lengths(lambda n: [-1] + [2] * (n - 1)),
    ),
    # -- metrics
    Defect(
        "metrics_not_a_dict",
        POSTPROCESS,
        E.UnsupportedSettingError,
        r"key 'metrics', micro-batch 0: metrics must be a dict, got NoneType",
        "nothing",
        _metrics_not_a_dict,
    ),
)
