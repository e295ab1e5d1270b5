"""The validation of one key's outputs in `torch_impl` (``torch_impl/_parts.py``), rule by rule: what
`unpack` accepts and how it reads a jagged tensor, the order and words of `check_parts`' checks, and the
jagged invariants of `check_offsets` with the part they name. Imports torch only (no JAX), for the
mutation session of the module."""

from __future__ import annotations

import re
import warnings
from contextlib import nullcontext
from typing import Any
from unittest import mock

import pytest
import torch

import torch_impl._parts
from property_tests.samples import HOLE_DEFECTS, holed_tensor
from ref._torch_private import (
    DisableTorchFunctionSubclass,
    ragged_size,
    raw_offsets,
    raw_values,
    set_raw_offsets,
)
from ref.errors import (
    DeviceMismatchError,
    DtypeMismatchError,
    InvalidJaggedError,
    ShapeMismatchError,
    UnsupportedSettingError,
)
from torch_impl._parts import DensePart, JaggedPart, check_offsets, check_parts, unpack


def njt(lengths: list[int], feature: tuple[int, ...] = (), dtype=torch.float32) -> torch.Tensor:
    n = sum(lengths)
    values = torch.arange(n * (feature[0] if feature else 1), dtype=dtype).reshape(n, *feature)
    offsets = torch.tensor([0, *itertools_accumulate(lengths)], dtype=torch.int64)
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def itertools_accumulate(xs: list[int]) -> list[int]:
    out, s = [], 0
    for x in xs:
        s += x
        out.append(s)
    return out


def jp(offsets: list[int], n: int, feature: tuple[int, ...] = ()) -> JaggedPart:
    return JaggedPart(torch.zeros(n, *feature), torch.tensor(offsets, dtype=torch.int64), len(offsets) - 1)


def test_unpack_a_jagged_tensor() -> None:
    x = njt([2, 0, 3], feature=(2,))
    p = unpack(x)
    assert isinstance(p, JaggedPart)
    assert isinstance(p, JaggedPart)
    assert p.rows == 3
    assert p.offsets.tolist() == [0, 2, 2, 5]
    assert p.offsets.dtype == torch.int64
    assert tuple(p.values.shape[1:]) == (2,)
    assert torch.equal(p.values, torch.arange(10, dtype=torch.float32).reshape(5, 2))


def test_a_jagged_part_keeps_the_given_tensors_nested_int() -> None:
    """``ragged`` (what exact provenance reads) is the given tensor's nested int, also where holes are
    packed into a copy of its own, and None for a part made of buffers."""
    plain = njt([2, 0, 3])
    holed = torch.nested.narrow(
        torch.arange(6.0).reshape(2, 3), 1, torch.tensor([0, 1]), torch.tensor([2, 1]), layout=torch.jagged
    )
    empty = torch.nested.nested_tensor_from_jagged(
        torch.zeros(0), torch.zeros(1, dtype=torch.int64), lengths=torch.zeros(0, dtype=torch.int64)
    )
    for x in (plain, holed, empty):
        part = unpack(x)
        assert isinstance(part, JaggedPart)
        assert part.ragged is ragged_size(x)
    assert jp([0, 1], 1).ragged is None


def test_unpack_int32_offsets_as_int64() -> None:
    x = torch.nested.nested_tensor_from_jagged(torch.ones(3), torch.tensor([0, 1, 3], dtype=torch.int32))
    p = unpack(x)
    assert p.offsets.dtype == torch.int64
    assert p.offsets.tolist() == [0, 1, 3]


def test_unpack_a_jagged_tensor_with_holes_packs_it() -> None:
    values = torch.arange(6.0)
    x = torch.nested.narrow(
        values.reshape(2, 3), 1, torch.tensor([0, 1]), torch.tensor([2, 1]), layout=torch.jagged
    )
    p = unpack(x)
    assert p.rows == 2
    assert p.offsets.tolist() == [0, 2, 3]
    assert p.values.tolist() == [0.0, 1.0, 4.0]


def test_unpack_keeps_the_gradient_path() -> None:
    values = torch.arange(4.0, requires_grad=True)
    # made by an operation: the wrapper holds the autograd history, its values buffer none
    x = torch.nested.nested_tensor_from_jagged(values, torch.tensor([0, 1, 4])) * 2
    p = unpack(x)
    p.values.sum().backward()
    assert values.grad is not None
    assert values.grad.tolist() == [2.0] * 4


def test_unpack_a_dense_tensor() -> None:
    x = torch.zeros(4, 3, dtype=torch.int16)
    p = unpack(x)
    assert isinstance(p, DensePart)
    assert isinstance(p, DensePart)
    assert p.rows == 4
    assert tuple(p.values.shape[1:]) == (3,)
    assert p.values is x
    assert unpack(torch.zeros(0)).rows == 0


@pytest.mark.parametrize(
    ("x", "kwargs", "error", "message"),
    [
        ([1, 2], {}, ShapeMismatchError, "key 'k', micro-batch 2: an output must be a tensor, got list"),
        (
            torch.tensor(1.0),
            {},
            ShapeMismatchError,
            "micro-batch 2: a dense output needs a leading batch dimension, got a scalar",
        ),
        (
            torch.nested.nested_tensor([torch.zeros(2)], layout=torch.jagged),
            {"allow_jagged": False},
            UnsupportedSettingError,
            "jagged outputs need pad_mode 'no_padding', got a jagged tensor",
        ),
    ],
    ids=["not-a-tensor", "scalar", "jagged-not-allowed"],
)
def test_unpack_rejects(x, kwargs, error, message) -> None:
    with pytest.raises(error, match=re.escape(message)):
        unpack(x, "k", 2, **kwargs)


def test_unpack_rejects_a_strided_nested_tensor() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: the strided layout is a prototype
        x = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(
        InvalidJaggedError, match=re.escape("a nested tensor must use the jagged layout, got torch.strided")
    ):
        unpack(x)


def test_unpack_rejects_a_ragged_dimension_other_than_1() -> None:
    x = torch.nested.nested_tensor_from_jagged(torch.zeros(2, 5), torch.tensor([0, 2, 5]), jagged_dim=2)
    with pytest.raises(
        InvalidJaggedError, match=re.escape("micro-batch 0: the ragged dimension must be 1, got 2")
    ):
        unpack(x, None, 0)


def test_unpack_rejects_floating_offsets() -> None:
    x = torch.nested.nested_tensor_from_jagged(torch.zeros(3), torch.tensor([0, 1, 3]))
    set_raw_offsets(x, torch.tensor([0.0, 1.0, 3.0]))
    with pytest.raises(
        InvalidJaggedError, match=re.escape("offsets must be 1-D integers, got torch.float32[3]")
    ):
        unpack(x)
    set_raw_offsets(x, torch.tensor([False, True]))
    with pytest.raises(InvalidJaggedError, match=re.escape("got torch.bool[2]")):
        unpack(x)
    set_raw_offsets(x, torch.tensor([[0, 1, 3]]))
    with pytest.raises(InvalidJaggedError, match=re.escape("got torch.int64[1, 3]")):
        unpack(x)
    set_raw_offsets(x, torch.tensor(3))
    with pytest.raises(InvalidJaggedError, match=re.escape("got torch.int64[]")):
        unpack(x)


def test_check_parts_agree_with_the_first() -> None:
    out = check_parts([torch.zeros(2, 3), torch.ones(1, 3), torch.ones(0, 3)], "k")
    assert [p.rows for p in out] == [2, 1, 0]
    assert check_parts([]) == []


@pytest.mark.parametrize(
    ("parts", "error", "message"),
    [
        (
            [torch.zeros(2), njt([1])],
            ShapeMismatchError,
            "key 'k', micro-batch 1: layout jagged differs from micro-batch 0's dense",
        ),
        (
            [njt([1]), njt([1]), torch.zeros(2)],
            ShapeMismatchError,
            "micro-batch 2: layout dense differs from micro-batch 0's jagged",
        ),
        (
            [torch.zeros(2), torch.zeros(2, dtype=torch.float64)],
            DtypeMismatchError,
            "micro-batch 1: dtype torch.float64 differs from micro-batch 0's torch.float32",
        ),
        (
            [torch.zeros(2), torch.zeros(2, device="meta")],
            DeviceMismatchError,
            "micro-batch 1: device meta differs from micro-batch 0's cpu",
        ),
        (
            [torch.zeros(2, 3), torch.zeros(2, 4)],
            ShapeMismatchError,
            "micro-batch 1: trailing shape (4,) differs from micro-batch 0's (3,)",
        ),
        (
            [njt([1], feature=(2,)), njt([1], feature=(3,))],
            ShapeMismatchError,
            "micro-batch 1: trailing shape (3,) differs from micro-batch 0's (2,)",
        ),
        (
            [torch.zeros(2, 3), torch.zeros(2)],
            ShapeMismatchError,
            "micro-batch 1: trailing shape () differs from micro-batch 0's (3,)",
        ),  # shorter, not only larger
        # the order of the checks: dtype before device before trailing shape
        (
            [torch.zeros(2, 3), torch.zeros(2, 4, dtype=torch.float64, device="meta")],
            DtypeMismatchError,
            "dtype",
        ),
        ([torch.zeros(2, 3), torch.zeros(2, 4, device="meta")], DeviceMismatchError, "device"),
        ([torch.zeros(2, 3), njt([1], dtype=torch.float64)], ShapeMismatchError, "layout"),
    ],
)
def test_check_parts_names_the_first_difference(parts, error, message) -> None:
    with pytest.raises(error, match=re.escape(message)):
        check_parts(parts, "k")


def test_check_parts_passes_allow_jagged_on() -> None:
    with pytest.raises(UnsupportedSettingError):
        check_parts([njt([1])], allow_jagged=False)


@pytest.mark.parametrize(
    "lengths_per_part",
    [[[2, 0, 3]], [[1], [2, 3]], [[], [4, 1], []], [[0, 0], [5], [1, 1, 1]], [[], []], [[3], []]],
)
def test_check_offsets_gives_every_row_length(lengths_per_part) -> None:
    parts = [unpack(njt(ls)) if ls else jp([0], 0) for ls in lengths_per_part]
    got = check_offsets(parts)
    assert got.tolist() == [n for ls in lengths_per_part for n in ls]
    assert got.dtype == torch.int64


def test_check_offsets_of_no_parts() -> None:
    got = check_offsets([])
    assert got.tolist() == []
    assert got.dtype == torch.int64


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([jp([1, 2], 2)], "key 'k', micro-batch 0: offsets[0] must be 0, got 1"),
        ([jp([0, 2], 2), jp([1, 2], 2)], "micro-batch 1: offsets[0] must be 0, got 1"),
        (
            [jp([0, 300], 300), jp([1, 2], 2)],
            "micro-batch 1: offsets[0] must be 0, got 1",
        ),  # ends compared by value
        (
            [jp([0, 3, 2, 4], 4)],
            "micro-batch 0: offsets must be non-decreasing, got offsets[1] = 3 > offsets[2] = 2",
        ),
        (
            [jp([0, 3, 2, 4, 1], 1)],
            "offsets must be non-decreasing, got offsets[1] = 3 > offsets[2] = 2",
        ),  # the first
        (
            [jp([0, 0, 3, 2, 4], 4)],
            "offsets must be non-decreasing, got offsets[2] = 3 > offsets[3] = 2",
        ),  # not the empty row
        ([jp([1, 2], 3)], "micro-batch 0: offsets[0] must be 0, got 1"),  # both ends wrong
        ([jp([0, 1], 1), jp([0, 1, 1], 0)], "micro-batch 1: offsets[-1] must equal len(values) = 0, got 1"),
        ([jp([0, 0], 0), jp([0, 5], 0)], "micro-batch 1: offsets[-1] must equal len(values) = 0, got 5"),
        ([jp([-1, 2], 2)], "micro-batch 0: offsets[0] must be 0, got -1"),  # only the first offset wrong
        ([jp([-1, 1], 2)], "micro-batch 0: offsets[0] must be 0, got -1"),  # both ends below
        ([jp([1, 5], 3)], "micro-batch 0: offsets[0] must be 0, got 1"),  # both ends above
        (
            [jp([0, 1], 1), jp([0, 2, 1, 3], 3)],
            "micro-batch 1: offsets must be non-decreasing, got offsets[1] = 2 > offsets[2] = 1",
        ),
        ([jp([0, 2], 3)], "micro-batch 0: offsets[-1] must equal len(values) = 3, got 2"),
        (
            [jp([0, 2], 3, (5,))],
            "micro-batch 0: offsets[-1] must equal len(values) = 3, got 2",
        ),  # len, not width
        ([jp([0, 1], 1), jp([0, 4], 3)], "micro-batch 1: offsets[-1] must equal len(values) = 3, got 4"),
        ([jp([0, 1], 1), jp([0], 2)], "micro-batch 1: offsets[-1] must equal len(values) = 2, got 0"),
        (
            [jp([0, 1], 1), jp([0, 1], 1), jp([0, 2], 1)],
            "micro-batch 2: offsets[-1] must equal len(values) = 1, got 2",
        ),
    ],
)
def test_check_offsets_names_the_broken_invariant(parts, message) -> None:
    with pytest.raises(InvalidJaggedError, match=re.escape(message)):
        check_offsets(parts, "k")


def test_check_offsets_catches_a_decrease_that_ends_right() -> None:
    # ends and starts are right; only a negative step inside the part is wrong
    with pytest.raises(InvalidJaggedError, match="non-decreasing"):
        check_offsets([jp([0, 1], 1), jp([0, 3, 1, 3], 3)])


def test_a_zero_row_tensor_with_lengths_unpacks_to_no_rows() -> None:
    empty = torch.nested.nested_tensor_from_jagged(
        torch.zeros(0, 2), torch.zeros(1, dtype=torch.int64), lengths=torch.zeros(0, dtype=torch.int64)
    )
    part = unpack(empty, "k", 0)
    assert isinstance(part, JaggedPart)
    assert part.rows == 0
    assert part.offsets.tolist() == [0]
    assert tuple(part.values.shape) == (0, 2)


@pytest.mark.parametrize(("offsets", "lengths", "message"), HOLE_DEFECTS)
def test_holes_name_the_row_that_breaks_them(offsets, lengths, message) -> None:
    holed = holed_tensor(offsets, lengths)
    with pytest.raises(InvalidJaggedError, match=re.escape(f"key 'k', micro-batch 0: {message}")):
        unpack(holed, "k", 0)


def test_holes_allow_empty_rows() -> None:
    holed = torch.nested.nested_tensor_from_jagged(
        torch.arange(10.0), torch.tensor([0, 4, 8, 10]), lengths=torch.tensor([3, 0, 2])
    )
    part = unpack(holed, "k", 0)
    assert isinstance(part, JaggedPart)
    assert part.offsets.tolist() == [0, 3, 3, 5]
    assert part.values.tolist() == [0.0, 1.0, 2.0, 8.0, 9.0]


def test_a_one_row_tensor_with_lengths_keeps_its_row() -> None:
    holed = torch.nested.nested_tensor_from_jagged(
        torch.arange(6.0), torch.tensor([1, 6]), lengths=torch.tensor([3])
    )
    part = unpack(holed, "k", 0)
    assert isinstance(part, JaggedPart)
    assert part.rows == 1
    assert part.values.tolist() == [1.0, 2.0, 3.0]


def test_a_zero_row_tensor_over_values_unpacks_to_no_values() -> None:
    """No rows, but values behind them (a view into a larger buffer): the part has no values either."""
    empty = torch.nested.nested_tensor_from_jagged(
        torch.arange(4.0), torch.zeros(1, dtype=torch.int64), lengths=torch.zeros(0, dtype=torch.int64)
    )
    part = unpack(empty, "k", 0)
    assert isinstance(part, JaggedPart)
    assert (part.rows, tuple(part.values.shape), part.offsets.tolist()) == (0, (0,), [0])


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float32, torch.bool])
def test_lengths_must_be_integers(dtype) -> None:
    holed = torch.nested.nested_tensor_from_jagged(
        torch.arange(4.0), torch.tensor([0, 2]), lengths=torch.tensor([2]).to(dtype)
    )
    with pytest.raises(
        InvalidJaggedError, match=re.escape(f"lengths must be 1-D integers, one per row (1), got {dtype}")
    ):
        unpack(holed, "k", 0)


def test_lengths_must_be_one_dimensional() -> None:
    holed = torch.nested.nested_tensor_from_jagged(
        torch.arange(4.0), torch.tensor([0, 2, 4]), lengths=torch.tensor([[2], [1]])
    )
    with pytest.raises(InvalidJaggedError, match=re.escape("one per row (2), got torch.int64[2, 1]")):
        unpack(holed, "k", 0)


def test_holes_over_rows_of_several_values() -> None:
    """Bounds are counted in rows of ``values`` (``len(values)``), not in its trailing size."""
    holed = torch.nested.nested_tensor_from_jagged(
        torch.arange(30.0).reshape(10, 3), torch.tensor([0, 4, 8]), lengths=torch.tensor([3, 2])
    )
    part = unpack(holed, "k", 0)
    assert isinstance(part, JaggedPart)
    assert part.offsets.tolist() == [0, 3, 5]
    assert part.values[:, 0].tolist() == [0.0, 3.0, 6.0, 12.0, 15.0]


def test_holes_in_hundreds_of_rows() -> None:
    rows = 300  # more rows than CPython's shared small ints: counts compared by value
    holed = torch.nested.nested_tensor_from_jagged(
        torch.arange(2.0 * rows),
        torch.arange(0, 2 * rows + 1, 2),
        lengths=torch.ones(rows, dtype=torch.int64),
    )
    part = unpack(holed, "k", 0)
    assert isinstance(part, JaggedPart)
    assert part.rows == rows
    assert part.values.tolist() == [2.0 * i for i in range(rows)]


def test_the_setting_of_the_checks_is_keyword_only() -> None:
    x = njt([1, 2])
    with pytest.raises(TypeError):
        unpack(x, "k", 0, False)  # type: ignore[misc]
    with pytest.raises(TypeError):
        check_parts([x], "k", False)  # type: ignore[misc]
    assert unpack(x=x, key="k", micro_batch=0, allow_jagged=True).rows == 2
    assert check_parts(parts=[x], key="k", allow_jagged=True)[0].rows == 2


def _odd_parts() -> dict[str, Any]:
    """One part of each kind the C-level common case (`torch_impl._parts._plain_jagged`) must leave to
    the per-part loop, by name (each differs from a plain float32 ``[(j)]`` part in one way)."""
    offsets = torch.tensor([0, 1, 3])
    grad = torch.nested.nested_tensor_from_jagged(torch.arange(3.0, requires_grad=True), offsets) * 2
    int32 = torch.nested.nested_tensor_from_jagged(torch.arange(3.0), offsets.to(torch.int32))
    complex_values = torch.complex(torch.arange(3.0), torch.ones(3))
    floating = torch.nested.nested_tensor_from_jagged(torch.zeros(3), offsets.clone())
    set_raw_offsets(floating, torch.tensor([0.0, 1.0, 3.0]))
    return {
        "dense": torch.zeros(2),
        "not_a_tensor": [1, 2],
        "holes": holed_tensor([0, 4, 9], [2, 3]),
        "grad": grad,
        "int32_offsets": int32,
        "float_offsets": floating,
        "conjugate": torch.nested.nested_tensor_from_jagged(complex_values.conj(), offsets),
        "negative": torch.nested.nested_tensor_from_jagged(complex_values.conj().imag, offsets),
        "float64": njt([1, 2], dtype=torch.float64),
        "meta": torch.nested.nested_tensor_from_jagged(torch.zeros(3, device="meta"), offsets.to("meta")),
        "feature": njt([1, 2], feature=(2,)),
        "ragged_dim_2": torch.nested.nested_tensor_from_jagged(
            torch.zeros(2, 5), torch.tensor([0, 2, 5]), jagged_dim=2
        ),
    }


def _outcome(parts: list[Any], *, loop: bool, allow_jagged: bool = True) -> Any:
    """`check_parts`' result as comparable data (each part's kind, buffers and rows), or its error."""
    patch = (
        mock.patch.object(torch_impl._parts, "_plain_jagged", return_value=None) if loop else nullcontext()
    )
    try:
        with patch:
            got = check_parts(parts, "k", allow_jagged=allow_jagged)
    except Exception as e:  # the same class and words from both
        return type(e), str(e)
    return [
        (type(p), p.rows, p.values.dtype, p.values.device, tuple(p.values.shape), p.values.requires_grad)
        + (p.values.is_conj(), p.values.is_neg())
        + ((p.offsets.dtype, tuple(p.offsets.shape), id(p.ragged)) if isinstance(p, JaggedPart) else ())
        + (() if p.values.device.type == "meta" else (p.values.tolist(),))
        + (() if not isinstance(p, JaggedPart) or p.offsets.device.type == "meta" else (p.offsets.tolist(),))
        for p in got
    ]


@pytest.mark.parametrize("odd", list(_odd_parts()))
@pytest.mark.parametrize("at", [0, 4, 8])
def test_many_parts_check_as_the_loop_checks_them_one_by_one(odd, at) -> None:
    """From ``_MAPPED_MIN_PARTS`` parts, where every part is a plain jagged tensor agreeing with the
    first, the C-level common case gives the loop's parts (the same buffers); anything else, at any
    position, goes to the loop: the same parts, converted, or the same error in the same words."""
    assert torch_impl._parts._MAPPED_MIN_PARTS <= 9
    plain = [njt([i % 3, 2, 0]) for i in range(9)]
    with DisableTorchFunctionSubclass():
        fast = torch_impl._parts._plain_jagged(plain)
    assert fast is not None  # taken, and the buffers as they are
    assert all(
        a.values is raw_values(x)
        and a.offsets is raw_offsets(x)
        and a.rows == 3
        and a.ragged is ragged_size(x)
        for a, x in zip(fast, plain, strict=True)
    )
    assert _outcome(plain, loop=False) == _outcome(plain, loop=True)
    parts = [*plain[:at], _odd_parts()[odd], *plain[at + 1 :]]
    if odd not in ("dense", "not_a_tensor"):
        with DisableTorchFunctionSubclass():
            assert torch_impl._parts._plain_jagged(parts) is None
    assert _outcome(parts, loop=False) == _outcome(parts, loop=True)
    assert _outcome(plain, loop=False, allow_jagged=False) == _outcome(plain, loop=True, allow_jagged=False)


def test_many_parts_of_one_odd_kind_check_as_the_loop_checks_them() -> None:
    """Nine parts all of a kind the common case leaves alone (holes, a gradient, int32 offsets,
    trailing features, another device...) or all agreeing dense: the loop's parts, or its error."""
    for name in _odd_parts():
        parts = [_odd_parts()[name] for _ in range(9)]
        assert _outcome(parts, loop=False) == _outcome(parts, loop=True), name


def test_many_parts_with_trailing_features_check_them() -> None:
    """The common case over ``[(j), F]`` parts: their features must agree, as the loop requires."""
    parts = [njt([1, 2], feature=(2,)) for _ in range(9)]
    assert _outcome(parts, loop=False) == _outcome(parts, loop=True)
    for at in (0, 5, 8):
        odd = [*parts[:at], njt([1, 2], feature=(3,)), *parts[at + 1 :]]
        assert _outcome(odd, loop=False) == _outcome(odd, loop=True)
        assert _outcome(odd, loop=True)[0] is ShapeMismatchError
