"""Every operation of the table, paired by name: ``ref.NAME`` and ``torch_impl.NAME`` agree bit for bit,
with the hand-checked answer where one is given, and with the plain-Python list model."""

from __future__ import annotations

import pytest
import torch

import ref
import torch_impl
from property_tests.compare import assert_same
from property_tests.convert import result_to_torch, to_ref
from property_tests.data import ListModel
from property_tests.samples import OPERATIONS, OpSample, op_samples

SAMPLES = list(op_samples())


def test_every_operation_exists_in_both() -> None:
    for name in OPERATIONS:
        assert callable(getattr(ref, name)), name
        assert callable(getattr(torch_impl, name)), name
        assert getattr(ref, name).__doc__, name
        assert getattr(torch_impl, name).__doc__, name


def test_every_operation_but_postprocess_has_samples() -> None:
    assert {s.op for s in SAMPLES} == set(OPERATIONS) - {"postprocess_batch"}


@pytest.mark.parametrize("sample", SAMPLES, ids=[f"{s.op}-{s.name}" for s in SAMPLES])
def test_ref_and_torch_agree(sample: OpSample) -> None:
    kwargs = sample.kwargs or {}
    got_torch = getattr(torch_impl, sample.op)(*sample.args, **kwargs)
    got_ref = result_to_torch(getattr(ref, sample.op)(*to_ref(sample.args), **to_ref(kwargs)))
    if sample.op in ("inverse_permutation", "flatten_partitions"):
        got_torch, got_ref = got_torch.to(torch.int64), got_ref.to(torch.int64)
    assert_same(got_torch, got_ref)
    if sample.expected is not None:
        assert_same(got_torch, sample.expected)


@pytest.mark.parametrize(
    "sample", [s for s in SAMPLES if s.op in ("restore", "take", "concat")], ids=lambda s: f"{s.op}-{s.name}"
)
def test_list_model_agrees(sample: OpSample) -> None:
    got = ListModel.rows(getattr(torch_impl, sample.op)(*sample.args))
    if sample.op == "concat":
        want = ListModel.concat([ListModel.rows(p) for p in sample.args[0]])
    elif sample.op == "take":
        want = ListModel.take(ListModel.rows(sample.args[0]), sample.args[1])
    else:
        want = ListModel.restore(ListModel.rows(sample.args[0]), sample.args[1])
    assert ListModel.equal(got, want)


def test_merge_metrics_is_pure() -> None:
    acc = {"a": [1]}
    for impl in (ref, torch_impl):
        out = impl.merge_metrics(acc, {"a": [2], "b": 3})
        assert out == {"a": [1, 2], "b": [3]}
        assert acc == {"a": [1]}


def test_append_to_dict_mutates_in_place_as_verl() -> None:
    """verl's ``append_to_dict(data, new_data, prefix="")``: folds into ``data``, returns None."""
    for impl in (ref, torch_impl):
        acc: dict = {"a": [1]}
        assert impl.append_to_dict(acc, {"a": [2], "b": 3}) is None
        assert acc == {"a": [1, 2], "b": [3]}
        impl.append_to_dict(acc, {"a": (4, 5), "c": [6]}, prefix="x/")
        assert acc == {"a": [1, 2], "b": [3], "x/a": [(4, 5)], "x/c": [6]}
