"""Every bad setting is typed: a count that is not an integer raises `UnsupportedSettingError` naming the
setting and its value (ref and torch_impl alike, never a bare ``int()`` error or a truncated budget), and
a witness field that is absent or unreadable leaves the alignment check unproven and counted, in every
trainer's drop-in."""

from __future__ import annotations

import argparse
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, TensorDict

import ref
import torch_impl
from property_tests.data import jagged
from ref.errors import UnsupportedSettingError
from torch_impl.integrations import areal, miles, skyrl

#: Values that are not an integer, and how a message shows them.
NOT_INTEGERS = [("x", "'x'"), (8.5, "8.5"), (True, "True"), (np.bool_(False), "np.False_")]
#: The witness's counters of a call left unproven.
UNPROVEN = ("calls_without_witness", "skipped_unreadable_witness")


def _batch(**settings: Any) -> TensorDict:
    """Four rows of 2, 3, 1 and 2 tokens, with ``settings`` as verl's non-tensor entries."""
    ids = jagged(torch.arange(8), [2, 3, 1, 2])
    fields: dict[str, Any] = {"input_ids": ids}
    fields.update({k: NonTensorData(v) for k, v in settings.items()})
    return TensorDict(fields, batch_size=[4])


@pytest.mark.parametrize(("value", "shown"), NOT_INTEGERS)
@pytest.mark.parametrize(
    ("setting", "settings"),
    [
        ("max_token_len_per_gpu", {"use_dynamic_bsz": True}),
        ("sp_size", {"use_dynamic_bsz": True, "max_token_len_per_gpu": 8}),
        ("micro_batch_size_per_gpu", {"use_dynamic_bsz": False}),
        ("force_group_size", {"use_dynamic_bsz": True, "max_token_len_per_gpu": 8}),
    ],
)
def test_a_setting_of_data_that_is_not_an_integer(
    setting: str, settings: dict[str, Any], value: Any, shown: str
) -> None:
    data = _batch(**settings, **{setting: value})
    with pytest.raises(UnsupportedSettingError, match=rf"^{setting} must be an integer, got {shown}$"):
        torch_impl.prepare_micro_batches(data)


@pytest.mark.parametrize(("value", "shown"), NOT_INTEGERS)
@pytest.mark.parametrize("keyword", ["max_token_len", "micro_batch_size"])
def test_an_override_that_is_not_an_integer(keyword: str, value: Any, shown: str) -> None:
    with pytest.raises(UnsupportedSettingError, match=rf"^{keyword} must be an integer, got {shown}$"):
        torch_impl.prepare_micro_batches(_batch(), **{keyword: value})


@pytest.mark.parametrize(("value", "shown"), NOT_INTEGERS)
def test_a_budget_of_rearrange_that_is_not_an_integer(value: Any, shown: str) -> None:
    with pytest.raises(UnsupportedSettingError, match=rf"^max_token_len must be an integer, got {shown}$"):
        torch_impl.rearrange_micro_batches(_batch(), value)


@pytest.mark.parametrize("impl", [ref, torch_impl], ids=["ref", "torch_impl"])
@pytest.mark.parametrize(("value", "shown"), NOT_INTEGERS)
def test_the_shared_partitioners_refuse_alike(impl: Any, value: Any, shown: str) -> None:
    with pytest.raises(UnsupportedSettingError, match=rf"^max_tokens must be an integer, got {shown}$"):
        impl.balanced_partitions([3, 2], value)
    with pytest.raises(UnsupportedSettingError, match=rf"^multiple_of must be an integer, got {shown}$"):
        impl.balanced_partitions([3, 2], 8, multiple_of=value)
    with pytest.raises(UnsupportedSettingError, match=rf"^micro_batch_size must be an integer, got {shown}$"):
        impl.fixed_partitions(3, value)


def test_a_budget_with_a_fraction_is_never_truncated() -> None:
    """``8.5`` was ``int(8.5) == 8`` (a silently different split); integral values stay accepted."""
    data = _batch(use_dynamic_bsz=True, max_token_len_per_gpu=8.5)
    with pytest.raises(UnsupportedSettingError, match=r"8\.5"):
        torch_impl.prepare_micro_batches(data)
    want = torch_impl.prepare_micro_batches(_batch(use_dynamic_bsz=True, max_token_len_per_gpu=4))[1]
    for integral in (4.0, np.int32(4), torch.tensor(4)):
        data = _batch(use_dynamic_bsz=True, max_token_len_per_gpu=integral)
        assert torch_impl.prepare_micro_batches(data)[1] == want


def _counted(call: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    """``call()``'s result and what it added to the witness's counters of unproven calls."""
    before = torch_impl.witness_stats()
    got = call()
    after = torch_impl.witness_stats()
    return got, {k: after[k] - before[k] for k in UNPROVEN}


def _unproven(call: Callable[[], Any]) -> Any:
    """``call()``'s result, asserting it was counted once as unproven and witnessed nothing."""
    before = torch_impl.witness_stats()["keys_witnessed"]
    got, counted = _counted(call)
    assert sum(counted.values()) == 1, counted
    assert torch_impl.witness_stats()["keys_witnessed"] == before
    return got


BAD_FIELDS = [None, "x", [2, "3"], 7, 1.5, object()]


@pytest.mark.parametrize("field", [*BAD_FIELDS, torch.zeros(2, 3)], ids=repr)
def test_verl_unproven_without_a_readable_input_ids(field: Any) -> None:
    outs = [
        {"model_output": {"lp": jagged(torch.arange(3.0), [1, 2])}},
        {"model_output": {"lp": jagged(torch.arange(4.0), [4])}},
    ]
    data = {"input_ids": field, "use_dynamic_bsz": True}
    got = _unproven(lambda: torch_impl.postprocess_batch_func(outs, [[2, 0], [1]], data))
    assert got["model_output"]["lp"].offsets().tolist() == [0, 2, 6, 7]


@pytest.mark.parametrize("field", [*BAD_FIELDS, torch.tensor([0.0, 1.0, 3.0])], ids=repr)
def test_areal_unproven_without_readable_cu_seqlens(field: Any) -> None:
    mb_list = types.SimpleNamespace(
        forward_indices=[1, 0], backward_indices=[1, 0], mbs=[{"cu_seqlens": field}]
    )
    got = _unproven(lambda: areal.reorder_and_pad_outputs([torch.arange(3.0)], [1, 2], mb_list))
    assert got.tolist() == [[2.0, 0.0], [0.0, 1.0]]


class _Batch(dict[str, Any]):
    batch_size = 2


@pytest.mark.parametrize("field", [*BAD_FIELDS, torch.zeros(2)], ids=repr)
def test_skyrl_unproven_without_a_readable_mask(field: Any) -> None:
    it = types.SimpleNamespace(
        _microbatches=[[1], [0]],
        _num_padding_microbatches=0,
        _token_counts=[1, 1],
        data=_Batch(response_mask=field),
    )
    got = _unproven(lambda: skyrl.reorder_and_combine_items(it, [[{"lp": [1.0]}], [{"lp": [2.0, 3.0]}]]))
    assert got == [{"lp": [2.0, 3.0]}, {"lp": [1.0]}]


def _miles_iterator(rollout: dict[str, Any]) -> Any:
    return types.SimpleNamespace(rollout_data=rollout, micro_batch_indices=[[1], [0]])


def _miles_outputs() -> list[dict[str, Any]]:
    return [{"lp": [torch.zeros(2)]}, {"lp": [torch.zeros(3)]}]


@pytest.mark.parametrize("field", BAD_FIELDS, ids=repr)
def test_miles_unproven_without_readable_response_lengths(field: Any) -> None:
    it = _miles_iterator({"response_lengths": field})
    args = argparse.Namespace(use_dynamic_batch_size=True, qkv_format="thd")
    got = _unproven(lambda: miles.aggregate_forward_results(_miles_outputs(), it, args))
    assert [len(v) for v in got["lp"]] == [3, 2]


@pytest.mark.parametrize("field", [[None, None], None, "ab", [3.5, 4]], ids=repr)
def test_miles_unproven_without_readable_context_parallel_lengths(
    monkeypatch: pytest.MonkeyPatch, field: Any
) -> None:
    """Under context parallelism with ``qkv_format="bshd"``, ``max_seq_lens`` of None entries (which miles'
    own join never reads) was a ``TypeError``; ``total_lengths`` likewise."""
    state = types.SimpleNamespace(cp=types.SimpleNamespace(size=2))
    monkeypatch.setitem(sys.modules, miles.PARALLEL, types.SimpleNamespace(_parallel_state=state))
    args = argparse.Namespace(use_dynamic_batch_size=True, qkv_format="bshd")
    for rollout in (
        {"response_lengths": [3, 2], "total_lengths": [5, 4], "max_seq_lens": field},
        {"response_lengths": [3, 2], "total_lengths": field, "max_seq_lens": [5, 5]},
    ):
        it = _miles_iterator(rollout)
        got = _unproven(lambda it=it: miles.aggregate_forward_results(_miles_outputs(), it, args))
        assert [len(v) for v in got["lp"]] == [3, 2]
