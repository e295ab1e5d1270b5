"""The defects of the packed and padded layouts: ``from_packed``, ``from_padded`` and ``to_padded``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ref import errors as E

from ._core import Breaker, Call, Chooser, Defect

__all__ = ["LAYOUTS"]


def _lengths_arg(make: Callable[[list[int], Chooser], Any]) -> Breaker:
    """The call's second argument (its lengths) replaced by ``make(lengths, choose)``."""

    def breaker(call: Call, choose: Chooser) -> Call:
        x, lengths = call.args
        return call._replace(args=(x, make(list(lengths), choose)))

    return breaker


def _one_more(lengths: list[int], choose: Chooser) -> list[int]:
    j = choose.choice(range(len(lengths)))
    return [n + 1 if i == j else n for i, n in enumerate(lengths)]


def _negated(lengths: list[int], choose: Chooser) -> list[int]:
    j = choose.choice([i for i, n in enumerate(lengths) if n > 0])
    return [-n if i == j else n for i, n in enumerate(lengths)]


def _past_the_padding(lengths: list[int], choose: Chooser) -> list[int]:
    j = choose.choice(range(len(lengths)))
    return [3 + choose.integer(1, 4) if i == j else n for i, n in enumerate(lengths)]


def _bad_cu_seqlens(call: Call, choose: Chooser) -> Call:
    (values, _lengths) = call.args
    return call._replace(args=(values,), kwargs={"cu_seqlens": [0, 3, 2, 5]})


def _both_lengths_and_cu_seqlens(call: Call, choose: Chooser) -> Call:
    return call._replace(kwargs={"cu_seqlens": [0, 2, 2, 5]})


def _short_max_len(call: Call, choose: Chooser) -> Call:
    return call._replace(kwargs={"max_len": 1})


def _fractional_pad(call: Call, choose: Chooser) -> Call:
    return call._replace(kwargs={"pad_value": choose.choice([0.5, float("nan"), -2.25])})


def _dense_to_padded(call: Call, choose: Chooser) -> Call:
    return call._replace(args=(torch.zeros(3, 2),))


LAYOUTS: tuple[Defect, ...] = (
    Defect(
        "lengths_not_adding_up",
        "from_packed",
        E.InvalidJaggedError,
        r"the lengths add up to 6, but the values have 5 rows",
        "lengths",
        _lengths_arg(_one_more),
    ),
    Defect(
        "negative_packed_length",
        "from_packed",
        E.InvalidJaggedError,
        r"lengths\[0\] = -2 is negative",
        "a non-empty row",
        _lengths_arg(_negated),
    ),
    Defect(
        "float_lengths",
        "from_packed",
        E.InvalidJaggedError,
        r"lengths must be 1-D integers",
        "lengths",
        _lengths_arg(lambda lengths, choose: torch.tensor(lengths, dtype=torch.float32)),
    ),
    Defect(
        "decreasing_cu_seqlens",
        "from_packed",
        E.InvalidJaggedError,
        r"offsets must be non-decreasing, got offsets\[1\] = 3 > offsets\[2\] = 2",
        "nothing",
        _bad_cu_seqlens,
    ),
    Defect(
        "lengths_and_cu_seqlens",
        "from_packed",
        E.UnsupportedSettingError,
        r"exactly one of lengths and cu_seqlens",
        "nothing",
        _both_lengths_and_cu_seqlens,
    ),
    Defect(
        "length_past_the_padding",
        "from_padded",
        E.InvalidJaggedError,
        r"lengths\[0\] = 4 exceeds the padded length 3",
        "lengths",
        _lengths_arg(_past_the_padding),
    ),
    Defect(
        "a_length_too_few",
        "from_padded",
        E.InvalidJaggedError,
        r"1 lengths for 2 rows",
        "lengths",
        _lengths_arg(lambda lengths, choose: lengths[1:]),
    ),
    Defect(
        "max_len_too_short",
        "to_padded",
        E.ShapeMismatchError,
        r"a row has 2 values, more than max_len = 1",
        "a row of 2 values",
        _short_max_len,
    ),
    Defect(
        "fractional_pad_for_integers",
        "to_padded",
        E.UnsupportedSettingError,
        r"pad_value 0.5 is not an integer, but the values are int32",
        "integer values",
        _fractional_pad,
        base="to_padded_int",
    ),
    Defect(
        "to_padded_of_dense",
        "to_padded",
        E.ShapeMismatchError,
        r"to_padded needs jagged data",
        "nothing",
        _dense_to_padded,
    ),
)
