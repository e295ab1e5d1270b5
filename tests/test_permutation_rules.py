"""The permutation check of `torch_impl` (``torch_impl/_permutation.py``), rule by rule: every accepted
form of a partition, every rejected one with the place its message names, and the inverse. Imports
torch only (no JAX), so the mutation session of the module runs it in a couple of seconds per mutant."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from ref.errors import NotAPermutationError, PartitionMismatchError
from torch_impl import _permutation
from torch_impl._permutation import (
    check_permutation,
    flatten_partitions,
    inverse_permutation,
    invert,
    is_identity,
)


def _flat(parts, n):
    return flatten_partitions(parts, n).tolist()


@pytest.mark.parametrize(
    "parts",
    [
        [[2, 0], [1, 3]],
        [torch.tensor([2, 0]), torch.tensor([1, 3])],
        [np.array([2, 0]), [1, 3]],
        [[2, 0], torch.tensor([1, 3], dtype=torch.int32)],
        [(2, 0), range(1, 4, 2)],
        [[np.int64(2), 0], [1, 3]],
        [[2], torch.tensor([], dtype=torch.float32), [0, 1, 3]],
    ],
    ids=[
        "lists",
        "tensors",
        "numpy-and-list",
        "list-and-int32",
        "tuple-and-range",
        "numpy-scalar",
        "empty-float",
    ],
)
def test_every_partition_form_flattens_in_order(parts) -> None:
    flat = [i for p in parts for i in (p.tolist() if hasattr(p, "tolist") else p)]
    out = flatten_partitions(parts, 4)
    assert out.dtype == torch.int64
    assert out.device.type == "cpu"
    assert out.tolist() == flat


def test_no_rows_and_no_partitions() -> None:
    assert _flat([], 0) == []
    assert _flat([[]], 0) == []
    assert _flat([torch.tensor([], dtype=torch.int64)], 0) == []


def test_a_single_row() -> None:
    assert _flat([[0]], 1) == [0]
    assert _flat([torch.tensor([0])], 1) == [0]


@pytest.mark.parametrize(
    ("parts", "n", "message"),
    [
        ([[0, 1.0]], 2, "micro-batch 0, position 1: index 1.0 is not an integer"),
        ([[0], [1, True]], 2, "micro-batch 1, position 1: index True is not an integer"),
        ([[0], [], [2, 1, "3"]], 4, "micro-batch 2, position 2: index '3' is not an integer"),
        ([torch.tensor([0.0, 1.0])], 2, "micro-batch 0: indices must be integers, got dtype torch.float32"),
        ([[0], torch.tensor([True])], 2, "micro-batch 1: indices must be integers, got dtype torch.bool"),
        ([torch.tensor([0j])], 1, "micro-batch 0: indices must be integers, got dtype torch.complex64"),
        ([[0, 2**63]], 2, "micro-batch 0, position 1: index 9223372036854775808 is out of range for 2 rows"),
        # int64's own bounds are not out of int64: the first index beyond them is named, above or below
        (
            [[2**62, 2**63 - 1], [-(2**63), 2**63]],
            2,
            "micro-batch 1, position 1: index 9223372036854775808 is out of",
        ),
        (
            [[-5, -(2**63)], [-(2**63) - 1]],
            2,
            "micro-batch 1, position 0: index -9223372036854775809 is negative",
        ),
        (
            [[1, 0], [-1]],
            3,
            "micro-batch 1, position 0: index -1 is negative (negative indices are not wrapped)",
        ),
        ([[1, 0], [2, 3]], 3, "micro-batch 1, position 1: index 3 is out of range for 3 rows"),
        ([[0, 3]], 3, "micro-batch 0, position 1: index 3 is out of range for 3 rows"),
        ([[0]], 0, "micro-batch 0, position 0: index 0 is out of range for 0 rows"),
        (
            [[1, 5], [0, -7]],
            3,
            "micro-batch 0, position 1: index 5 is out of range for 3 rows",
        ),  # the first bad one
        ([[0], [1, 2], [3, 2]], 4, "micro-batch 2, position 1: index 2 duplicates micro-batch 1, position 1"),
        ([[0, 0]], 2, "micro-batch 0, position 1: index 0 duplicates micro-batch 0, position 0"),
        (
            [[0], [1], [2], [4, 3, 3]],
            5,
            "micro-batch 3, position 2: index 3 duplicates micro-batch 3, position 1",
        ),
        ([[0], [1, 2], [3], [4], [9]], 5, "micro-batch 4, position 0: index 9 is out of range for 5 rows"),
        ([[1], [2, 1], [2]], 3, "micro-batch 1, position 1: index 1 duplicates micro-batch 0, position 0"),
        ([[1, 2]], 3, "index 0 is missing: the partitions hold 2 indices for 3 rows"),
        ([[0, 1]], 3, "index 2 is missing: the partitions hold 2 indices for 3 rows"),
        ([[]], 1, "index 0 is missing: the partitions hold 0 indices for 1 rows"),
        ([torch.tensor([2, 0])], 4, "index 1 is missing: the partitions hold 2 indices for 4 rows"),
    ],
)
def test_what_is_not_a_permutation_is_named(parts, n, message) -> None:
    with pytest.raises(NotAPermutationError, match=re.escape(message)):
        flatten_partitions(parts, n)


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        (
            [torch.tensor([[0, 1]])],
            "micro-batch 0: a partition must be a 1-D sequence of row indices, got Tensor of shape (1, 2)",
        ),
        (
            [[0], np.array(1)],
            "micro-batch 1: a partition must be a 1-D sequence of row indices, got ndarray of shape ()",
        ),
        ([[0], "1"], "micro-batch 1: a partition must be a 1-D sequence of row indices, got str"),
        ([b"\x00"], "micro-batch 0: a partition must be a 1-D sequence of row indices, got bytes"),
        ([[0], 1], "micro-batch 1: a partition must be a 1-D sequence of row indices, got int"),
        ([{0, 1}], "micro-batch 0: a partition must be a 1-D sequence of row indices, got set"),
        (3, "partitions must be a list of partitions, got int"),
        (None, "partitions must be a list of partitions, got NoneType"),
        (np.array(3), "partitions must be a list of partitions, got ndarray of shape ()"),
        (iter([[0, 1]]), "partitions must be a list of partitions, got list_iterator"),
        ({0: [0, 1]}, "partitions must be a list of partitions, got dict"),
    ],
)
def test_what_is_not_a_partition_is_named(parts, message) -> None:
    with pytest.raises(PartitionMismatchError, match=re.escape(message)):
        flatten_partitions(parts, 2)


def test_a_0_d_integer_entry_counts_as_its_value_and_a_1_d_one_is_not_an_integer() -> None:
    """Iterating a tensor gives 0-d tensors (verl indexes with them); a one-element 1-D one is a sequence."""
    parts = [list(torch.tensor([2, 0])), [np.array(1), np.int64(3)]]
    assert flatten_partitions(parts, 4).tolist() == [2, 0, 1, 3]
    for entry in (torch.tensor([1]), np.array([1])):
        with pytest.raises(
            NotAPermutationError, match=re.escape(f"position 1: index {entry!r} is not an integer")
        ):
            flatten_partitions([[0, entry]], 2)


def test_the_same_rules_for_mixed_lists_and_tensors() -> None:
    with pytest.raises(
        NotAPermutationError, match=re.escape("micro-batch 1, position 0: index 5 is out of range")
    ):
        flatten_partitions([torch.tensor([0]), [5]], 2)
    with pytest.raises(NotAPermutationError, match=re.escape("index 1.5 is not an integer")):
        flatten_partitions([torch.tensor([0]), [1.5]], 2)
    with pytest.raises(NotAPermutationError, match="duplicates micro-batch 0, position 0"):
        flatten_partitions([torch.tensor([0]), [0]], 2)


def test_a_tensor_partition_keeps_no_autograd_or_device_link() -> None:
    src = torch.tensor([1, 0])
    out = flatten_partitions([src], 2)
    out[0] = 7  # the result is not a view the caller's tensor would see change
    assert src.tolist() == [1, 0]


def test_check_is_the_flatten() -> None:
    assert check_permutation([[1], [0]], 2).tolist() == [1, 0]


@pytest.mark.parametrize("perm", [[2, 0, 1], [0], [], [3, 1, 0, 2]])
def test_inverse_permutation(perm) -> None:
    inv = inverse_permutation(torch.tensor(perm, dtype=torch.int64)).tolist()
    assert inv == [perm.index(i) for i in range(len(perm))]
    assert inverse_permutation(perm).tolist() == inv
    assert invert(torch.tensor(perm, dtype=torch.int64)).tolist() == inv


@pytest.mark.parametrize("bridge", [True, False])
@pytest.mark.parametrize(
    ("perm", "identity"),
    [
        ([], True),
        ([0], True),
        ([0, 1, 2, 3, 4], True),
        (list(range(200)), True),
        ([1, 0, 2, 3, 4], False),
        ([0, 1, 2, 4, 3], False),
        ([0, 2, 1, 3, 4], False),  # first and last in place, the middle not
        ([0, *range(100, 0, -1), 101], False),
    ],
)
def test_is_identity_is_perm_equals_range(monkeypatch, bridge, perm, identity) -> None:
    monkeypatch.setattr(_permutation, "numpy_bridge", lambda: bridge)
    assert is_identity(torch.tensor(perm, dtype=torch.int64)) is identity
    assert identity == (perm == list(range(len(perm))))


def test_inverse_permutation_is_int64_and_checked() -> None:
    assert inverse_permutation(torch.tensor([1, 0], dtype=torch.int32)).dtype == torch.int64
    with pytest.raises(NotAPermutationError, match="duplicates"):
        inverse_permutation([1, 1])
    with pytest.raises(NotAPermutationError, match="out of range for 2 rows"):
        inverse_permutation([0, 2])


def test_many_rows_are_checked_as_few() -> None:
    n = 5000
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    assert flatten_partitions([perm[:1234], perm[1234:]], n).tolist() == perm.tolist()
    dup = perm.clone()
    dup[4000] = dup[10]
    with pytest.raises(
        NotAPermutationError,
        match=f"micro-batch 1, position {4000 - 1234}: index .* duplicates micro-batch 0, position 10",
    ):
        flatten_partitions([dup[:1234], dup[1234:]], n)


def test_the_earliest_repeat_is_named_among_many_equal_indices() -> None:
    """Many copies of one index: the first repeat is position 1 (the sort must keep equal indices in
    their order: an unstable sort names position 0 as repeating itself)."""
    with pytest.raises(
        NotAPermutationError, match=re.escape("position 1: index 0 duplicates micro-batch 0, position 0")
    ):
        flatten_partitions([[0] * 50], 50)
    with pytest.raises(
        NotAPermutationError,
        match=re.escape("micro-batch 1, position 0: index 3 duplicates micro-batch 0, position 3"),
    ):
        flatten_partitions([list(range(40)), [3] * 60], 100)


def test_plain_int_lists_are_the_same_bytes_only_for_the_same_lists_of_ints() -> None:
    """`plain_int_lists`: the bytes a recorded split's indices are compared by. Equal lists of plain ints
    give equal bytes, however their ints are shared or made (marshal's format 2 writes no back
    references); a float, a bool, a NumPy integer or array, an ``IntEnum``, a tuple or a list subclass in
    their place never gives the split's bytes, though ``==`` holds for most of them."""
    import enum

    import numpy as np

    from torch_impl._permutation import plain_int_lists, plain_int_lists_of

    class Row(enum.IntEnum):
        TWO = 2

    class Lists(list):  # type: ignore[type-arg]
        pass

    big = 2**40
    split = [[2, 0, big], [1]]
    recorded = plain_int_lists_of(split)
    assert recorded is not None
    shared = [[2, 0, big], [1]]
    rebuilt = [[int("2"), int("0"), int(str(big))], [int("1")]]  # other objects, other counts of references
    kept = [rebuilt[0][2]] * 100  # noqa: F841  # one of them referenced a hundred times more
    assert plain_int_lists(shared) == plain_int_lists(rebuilt) == recorded
    for other in (
        [[2.0, 0, big], [1]],
        [[2, 0, big], [True]],
        [[2, False, big], [1]],
        [[np.int64(2), 0, big], [1]],
        [[Row.TWO, 0, big], [1]],
        [(2, 0, big), [1]],
        [Lists([2, 0, big]), [1]],
        [[2, 0, big], [1], []],
        [[2, 0], [big, 1]],
    ):
        assert plain_int_lists(other) != recorded, other
    assert plain_int_lists([np.array([2, 0, big]), [1]]) != recorded  # written as its buffer
    assert plain_int_lists([[2, 0, big], [torch.tensor(1)]]) is None  # nothing marshal writes
    assert plain_int_lists(((2, 0, big), (1,))) is None
    assert plain_int_lists_of([[2.0], [1]]) is None
    assert plain_int_lists_of([[True], [0]]) is None
