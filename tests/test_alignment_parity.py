"""The same situation, the same verdict: verl's drop-in and miles' give one error class for each defect.

Issue 70: both drop-ins read their call into the alignment core's form, so a split rebatch recorded and
then restored wrongly raises the same `ref.errors.RebatchError` subclass in either trainer. Each case is
built twice, once in each trainer's form, from one batch of rows of distinct lengths.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import NonTensorData, TensorDict

import torch_impl
from ref.errors import MisalignmentError, NotAPermutationError, PartitionMismatchError, RebatchError
from torch_impl.integrations import miles

#: Each row's tokens (verl's ``input_ids``; miles' ``response_lengths``).
LENGTHS = [3, 2, 4, 1, 5, 2]
#: The token budget of the split: four micro-batches, rows out of order, their row counts a palindrome
#: (2, 1, 1, 2), so swapped micro-batches still hold as many rows as their slots.
BUDGET = 5


def _split() -> list[list[int]]:
    """The split both trainers restore: rebatch's token-budget split of the batch."""
    _, indices = torch_impl.prepare_micro_batches(_verl_batch(dynamic=True), max_token_len=BUDGET)
    return [list(p) for p in indices]


def _verl_batch(dynamic: bool) -> TensorDict:
    offsets = torch.tensor([0, *itertools.accumulate(LENGTHS)])
    ids = torch.nested.nested_tensor_from_jagged(torch.arange(int(offsets[-1])), offsets)
    fields = {"input_ids": ids, "use_dynamic_bsz": NonTensorData(dynamic)}
    return TensorDict(fields, batch_size=[len(LENGTHS)])


def _verl_outputs(micro_batches: Any, short: bool = False) -> list[dict[str, Any]]:
    """Each micro-batch's log-probs on its ``input_ids``' offsets (the first a row short where asked)."""
    outs = []
    for m, mb in enumerate(micro_batches):
        ids = mb["input_ids"]
        values, offsets = ids.values().to(torch.float32), ids.offsets()
        if short and m == 0:
            offsets = offsets[:-1]
            values = values[: int(offsets[-1])]
        lp = torch.nested.nested_tensor_from_jagged(values, offsets)
        outs.append({"model_output": {"log_probs": lp}})
    return outs


def verl_call(case: str) -> Callable[[], Any]:
    """verl's drop-in on a split `torch_impl.prepare_micro_batches` recorded, made wrong by ``case``."""
    data = _verl_batch(dynamic=case != "dynamic split restored as fixed")
    micro_batches, indices = torch_impl.prepare_micro_batches(data, max_token_len=BUDGET)
    assert len(indices) > 1
    outs = _verl_outputs(micro_batches, short=case == "an output one row short")
    given: Any = [list(p) for p in indices]
    if case == "micro-batches swapped":
        outs = list(reversed(outs))
    elif case == "dynamic split restored as fixed":
        given = None
    elif case == "a duplicate index":
        given[1][0] = given[0][0]
    return lambda: torch_impl.postprocess_batch_func(outs, given, data)


class _Iterator:
    """The attributes of miles' ``DataIterator`` its restore reads."""

    def __init__(self, indices: list[list[int]]) -> None:
        self.rollout_data = {"response_lengths": list(LENGTHS), "total_lengths": [n + 3 for n in LENGTHS]}
        self.micro_batch_size = None
        self.micro_batch_indices = indices
        self.offset = 0


def miles_call(case: str) -> Callable[[], Any]:
    """miles' drop-in on a split recorded as its ``get_data_iterator`` records one, made wrong by ``case``."""
    parts = _split()
    it = _Iterator([list(p) for p in parts])
    miles.INTEGRATION.records[(miles.DATA, "get_data_iterator")](lambda: ([it], [len(parts)]))()
    assert miles.recorded_split(it) is not None
    store = [{"log_probs": [torch.zeros(LENGTHS[i]) for i in p]} for p in parts]
    dynamic = case != "dynamic split restored as fixed"
    if case == "micro-batches swapped":
        store = list(reversed(store))
    elif case == "an output one row short":
        store[0] = {"log_probs": store[0]["log_probs"][:-1]}
    elif case == "a duplicate index":
        it.micro_batch_indices[1][0] = it.micro_batch_indices[0][0]
    args = types.SimpleNamespace(use_dynamic_batch_size=dynamic, qkv_format="thd")
    return lambda: miles.aggregate_forward_results(store, it, args)


#: Each case and the class both trainers raise.
CASES = {
    "dynamic split restored as fixed": MisalignmentError,
    "micro-batches swapped": MisalignmentError,
    "an output one row short": PartitionMismatchError,
    "a duplicate index": NotAPermutationError,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_verl_and_miles_raise_the_same_class(case: str) -> None:
    raised: dict[str, type[RebatchError]] = {}
    for trainer, call in (("verl", verl_call(case)), ("miles", miles_call(case))):
        with pytest.raises(RebatchError) as error:
            call()
        raised[trainer] = type(error.value)
    assert raised == {"verl": CASES[case], "miles": CASES[case]}


def test_each_call_is_right_before_its_defect() -> None:
    """The cases' common calls, made right, pass in both trainers (so each raise is the defect's)."""
    data = _verl_batch(dynamic=True)
    micro_batches, indices = torch_impl.prepare_micro_batches(data, max_token_len=BUDGET)
    torch_impl.postprocess_batch_func(_verl_outputs(micro_batches), [list(p) for p in indices], data)
    parts = _split()
    assert [len(p) for p in parts] == [2, 1, 1, 2]
    it = _Iterator(parts)
    store = [{"log_probs": [torch.zeros(LENGTHS[i]) for i in p]} for p in parts]
    args = types.SimpleNamespace(use_dynamic_batch_size=True, qkv_format="thd")
    restored = miles.aggregate_forward_results(store, it, args)
    assert [int(v.shape[0]) for v in restored["log_probs"]] == LENGTHS
