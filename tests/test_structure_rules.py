"""The structure checks shared by both implementations (`ref.structure`), rule by rule, in pure Python
(NumPy for two cases; no torch, no JAX): padding micro-batches, the flags verl tests for truth, the
settings, the ``model_output`` dicts and the partition count. For the mutation session of the module."""

from __future__ import annotations

import re
from collections import UserList

import numpy as np
import pytest

from ref.errors import KeyMismatchError, PartitionMismatchError, UnsupportedSettingError
from ref.structure import (
    PADDING,
    as_flag,
    check_partition,
    check_partition_count,
    check_partitions,
    check_settings,
    drop_padding,
    model_outputs,
)


def test_padding_micro_batches_are_dropped_with_their_outputs() -> None:
    outs = ["a", "b", "c", "d"]
    assert drop_padding(outs, [[1], PADDING, [0], PADDING]) == (["a", "c"], [[1], [0]])
    assert drop_padding(outs, [PADDING, PADDING, PADDING, PADDING]) == ([], [])
    assert drop_padding(("a", "b"), ([0], PADDING)) == (["a"], [[0]])


def test_without_padding_everything_is_passed_through_unchanged() -> None:
    outs, idx = ["a"], [[0]]
    got = drop_padding(outs, idx)
    assert got[0] is outs
    assert got[1] is idx
    for odd in ("ab", b"ab", {"a": PADDING}, None, 3):
        assert drop_padding(outs, odd)[1] is odd


def test_padding_needs_one_partition_per_output() -> None:
    message = "3 partitions (padding included) for 2 micro-batch outputs"
    with pytest.raises(PartitionMismatchError, match=re.escape(message)):
        drop_padding(["a", "b"], [[0], PADDING, [1]])
    with pytest.raises(
        PartitionMismatchError, match=re.escape("2 partitions (padding included) for 3 micro-batch")
    ):
        drop_padding(["a", "b", "c"], [[0], PADDING])
    with pytest.raises(PartitionMismatchError):
        drop_padding({"a": 1, "b": 2}, [[0], PADDING])  # not a sequence of outputs


def test_padding_beside_numpy_partitions() -> None:
    assert drop_padding(["a", "b"], [np.array([0]), PADDING])[0] == ["a"]
    # padding is found by identity: comparing a NumPy partition with == would ask an array for its truth
    idx = [np.array([0, 1]), np.array([2])]
    assert drop_padding(["a", "b"], idx)[1] is idx
    outs, idx = drop_padding(["a", "b", "c"], [np.array([0, 1]), PADDING, np.array([2])])
    assert outs == ["a", "c"]
    assert [p.tolist() for p in idx] == [[0, 1], [2]]


def test_counts_of_many_micro_batches() -> None:
    n = 300  # beyond the small-int cache: counts are compared as numbers
    outs, idx = list(range(n)), [[i] for i in range(n - 1)] + [PADDING]
    assert drop_padding(outs, idx) == (outs[:-1], idx[:-1])
    real = [*idx[:-1], [n - 1]]  # the padding partition is dropped before the count is checked
    assert check_partition_count(real, n) is real
    assert len(model_outputs([{"model_output": {"x": m}} for m in range(n)])) == n


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (False, False), (1, True), (0, False), (np.bool_(True), True), (np.int64(0), False)],
)
def test_flags_are_bools_or_equal_to_1_or_0(value, expected) -> None:
    assert as_flag(value, "f") is expected


@pytest.mark.parametrize("value", [None, "False", "", b"1", 1.0, 0.0, 2, -1, [1], np.array([1, 0]), object()])
def test_anything_else_is_not_a_flag(value) -> None:
    with pytest.raises(
        UnsupportedSettingError, match=re.escape(f"use_dynamic_bsz must be a bool (or 0 or 1), got {value!r}")
    ):
        as_flag(value, "use_dynamic_bsz")


def test_settings() -> None:
    assert check_settings(True, "no_padding", [[0]]) is True
    assert check_settings(0, "no_padding", None) is False
    with pytest.raises(UnsupportedSettingError, match="pad_mode must be one of"):
        check_settings(True, "bogus", [[0]])
    with pytest.raises(UnsupportedSettingError, match="pad_mode must be one of"):
        check_settings(True, ["no_padding"], [[0]])
    with pytest.raises(UnsupportedSettingError, match="indices is None while use_dynamic_bsz is on"):
        check_settings(1, "no_padding", None)


def test_model_outputs_in_every_micro_batch_with_the_same_keys() -> None:
    a, b = {"x": 1, "y": 2}, {"y": 3, "x": 4}
    assert model_outputs([{"model_output": a}, {"model_output": b, "loss": 0}]) == [a, b]
    assert model_outputs([{"loss": 1}, {"loss": 2}]) == []
    assert model_outputs([]) == []


@pytest.mark.parametrize(
    ("output_lst", "error", "message"),
    [
        ({"model_output": {}}, UnsupportedSettingError, "output_lst must be a list of dicts, got dict"),
        ("ab", UnsupportedSettingError, "output_lst must be a list of dicts, got str"),
        (3, UnsupportedSettingError, "output_lst must be a list of dicts, got int"),
        ([{}, []], UnsupportedSettingError, "micro-batch 1: an output must be a dict, got list"),
        (
            [{"model_output": {}}, {"loss": 1}, {"model_output": {}}],
            KeyMismatchError,
            "key 'model_output', micro-batch 1: missing, while micro-batch 0 has it",
        ),
        (
            [{"loss": 1}, {"model_output": {}}, {"loss": 1}],
            KeyMismatchError,
            "key 'model_output', micro-batch 0: missing, while micro-batch 1 has it",
        ),
        (
            [{"model_output": {}}, {"model_output": [1]}],
            UnsupportedSettingError,
            "micro-batch 1: model_output must be a dict, got list",
        ),
        (
            [{"model_output": {"x": 1}}, {"model_output": {"x": 1}}, {"model_output": {}}],
            KeyMismatchError,
            "key 'x', micro-batch 2: missing, while micro-batch 0 has it",
        ),
        (
            [{"model_output": {"x": 1}}, {"model_output": {"x": 1, "z": 2}}],
            KeyMismatchError,
            "key 'z', micro-batch 1: present, while micro-batch 0 lacks it",
        ),
    ],
)
def test_model_outputs_reject(output_lst, error, message) -> None:
    with pytest.raises(error, match=re.escape(message)):
        model_outputs(output_lst)


def test_partition_count() -> None:
    idx = [[0], [1]]
    assert check_partition_count(idx, 2) is idx
    assert check_partition_count([[0], [1], [2]], 0) == [[0], [1], [2]]  # no model_output: any count
    assert check_partition_count(UserList([[0]]), 1) == [[0]]
    with pytest.raises(
        PartitionMismatchError, match=re.escape("3 partitions for 2 micro-batches that carry a model_output")
    ):
        check_partition_count([[0], [1], [2]], 2)
    with pytest.raises(PartitionMismatchError, match=re.escape("1 partitions for 2 micro-batches")):
        check_partition_count([[0]], 2)
    for odd, name in (("ab", "str"), ({0: [0]}, "dict"), ({0}, "set"), (iter([[0]]), "list_iterator")):
        with pytest.raises(PartitionMismatchError, match=f"indices must be a list of partitions, got {name}"):
            check_partition_count(odd, 1)


@pytest.mark.parametrize(
    ("partitions", "message"),
    [
        (3, "partitions must be a list of partitions, got int"),
        (None, "partitions must be a list of partitions, got NoneType"),
        (np.array(3), "partitions must be a list of partitions, got ndarray of shape ()"),
        (iter([[0]]), "partitions must be a list of partitions, got list_iterator"),
        ("01", "partitions must be a list of partitions, got str"),
        ({0: [0]}, "partitions must be a list of partitions, got dict"),
    ],
)
def test_what_is_not_a_list_of_partitions_is_named(partitions, message: str) -> None:
    with pytest.raises(PartitionMismatchError, match=f"^{re.escape(message)}$"):
        check_partitions(partitions)


@pytest.mark.parametrize(
    ("part", "m", "message"),
    [
        (
            np.array(3),
            1,
            "micro-batch 1: a partition must be a 1-D sequence of row indices, got ndarray of shape ()",
        ),
        (
            np.zeros((2, 1)),
            0,
            "micro-batch 0: a partition must be a 1-D sequence of row indices, got ndarray of shape (2, 1)",
        ),
        ({0, 1}, 2, "micro-batch 2: a partition must be a 1-D sequence of row indices, got set"),
        ("01", None, "a partition must be a 1-D sequence of row indices, got str"),
        (b"\x00", None, "a partition must be a 1-D sequence of row indices, got bytes"),
    ],
)
def test_what_is_not_a_partition_is_named_with_its_micro_batch(part, m, message: str) -> None:
    with pytest.raises(PartitionMismatchError, match=f"^{re.escape(message)}$"):
        check_partition(part, m)


@pytest.mark.parametrize("part", [[0, 1], (0,), range(3), [], np.arange(2)])
def test_a_sequence_or_a_1_d_array_is_a_partition(part) -> None:
    check_partition(part, 0)
    check_partitions([part])


def test_the_partition_count_check_checks_each_partition() -> None:
    with pytest.raises(PartitionMismatchError, match="micro-batch 1: a partition must be a 1-D sequence"):
        check_partition_count([[0], np.array(1)], 2)
