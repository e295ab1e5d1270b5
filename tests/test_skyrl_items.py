"""SkyRL's items path witnessed (docs/spec.md, "The alignment witness"; docs/witness.md): SkyRL 0.4.0's
``TokenBasedBatchIterator.reorder_and_combine_items(batches)`` gets per-sample items whose per-token lists
keep each row's valid length (its workers keep ``log_probs[i, -valid_len:]``, ``valid_len`` the row's
``response_mask`` sum). rebatch's drop-in checks each restored item against the iterator's batch: items
restored as the wrong rows raise `MisalignmentError` naming the key, the micro-batch, the position, the
original row and both lengths, where SkyRL returns them silently.

Stand-in iterators here (the attributes SkyRL's method reads); the tests against SkyRL's own class, over
a real ``TrainingInputBatch`` split by its real packer, run in SkyRL's environment (``.ci/peers.sh``:
``REBATCH_REQUIRE_PEER=skyrl`` makes a skip fail there).
"""

from __future__ import annotations

import itertools
import os
import re
import types
from typing import Any

import pytest
import torch

import torch_impl
from ref.errors import MisalignmentError, PartitionMismatchError
from ref.structure import misalignment_text
from torch_impl.integrations import skyrl

REQUIRE_ENV = "REBATCH_REQUIRE_PEER"
#: each row's valid length (response tokens): rows 0..5
VALID = [3, 1, 4, 2, 5, 0]
#: the micro-batches the iterator made (lists of original rows)
PARTS = [[4, 1], [0, 3], [2, 5]]


class _Iterator:
    """The attributes SkyRL's ``reorder_and_combine_items`` reads, over a batch with ``response_mask``
    left-padded as SkyRL builds it (``[0] * pad + [1] * valid``)."""

    def __init__(
        self, parts: list[list[int]], valid: list[int], padding: int = 0, mask: str = "response_mask"
    ):
        width = max(valid, default=0) + 1
        m = torch.zeros(len(valid), width, dtype=torch.int64)
        for i, n in enumerate(valid):
            m[i, width - n :] = 1
        self._microbatches = parts
        self._num_padding_microbatches = padding
        self._token_counts = [n + 2 for n in valid]  # prompt tokens too: not the items' lengths
        self.data = types.SimpleNamespace(
            batch_size=len(valid), get={mask: m if mask == "response_mask" else m.float() * 0.5}.get
        )


def _items(parts: list[list[int]], valid: list[int]) -> list[list[dict[str, Any]]]:
    """Each micro-batch's items as SkyRL's worker builds them: ``logprobs`` and ``elementwise_loss`` of the
    row's valid length (values naming the row, to see where each went), and a per-sample scalar."""
    return [
        [
            {
                "logprobs": [float(i) + k / 10 for k in range(valid[i])],
                "elementwise_loss": [-float(i)] * valid[i],
                "row": i,
            }
            for i in p
        ]
        for p in parts
    ]


def _message(key: str, m: int, j: int, row: int, got: int, want: int) -> str:
    return re.escape(misalignment_text(key, m, j, row, got, want))


def test_aligned_items_restored_and_witnessed() -> None:
    it = _Iterator(PARTS, VALID)
    got = skyrl.reorder_and_combine_items(it, _items(PARTS, VALID))
    assert [x["row"] for x in got] == list(range(6))
    assert [len(x["logprobs"]) for x in got] == VALID
    skyrl.check_reorder_and_combine_items(it, _items(PARTS, VALID))
    assert skyrl.item_witness(it.data) == VALID


@pytest.mark.parametrize("check", [False, True], ids=["restore", "shadow-check"])
def test_two_micro_batches_swapped_raise_misalignment(check: bool) -> None:
    it = _Iterator(PARTS, VALID)
    items = _items(PARTS, VALID)
    items[0], items[1] = items[1], items[0]  # micro-batch 1's items restored as rows 4, 1
    fn = skyrl.check_reorder_and_combine_items if check else skyrl.reorder_and_combine_items
    # original row 0 (micro-batch 1, position 0) gets row 4's 5 values; the witness gives it 3
    with pytest.raises(MisalignmentError, match=_message("logprobs", 1, 0, 0, 5, 3)):
        fn(it, items)


def test_two_rows_swapped_inside_a_micro_batch_raise_misalignment() -> None:
    it = _Iterator(PARTS, VALID)
    items = _items(PARTS, VALID)
    items[2].reverse()  # micro-batch 2 = rows [2, 5]: items of 5 then 2
    with pytest.raises(MisalignmentError, match=_message("logprobs", 2, 0, 2, 0, 4)):
        skyrl.reorder_and_combine_items(it, items)


def test_wrong_partitions_of_the_same_sizes_raise_misalignment() -> None:
    it = _Iterator([[1, 4], [0, 3], [2, 5]], VALID)  # another step's partitions: rows 4 and 1 swapped
    with pytest.raises(MisalignmentError, match=_message("logprobs", 0, 0, 1, 5, 1)):
        skyrl.reorder_and_combine_items(it, _items(PARTS, VALID))


def test_loss_mask_is_the_witness_without_a_response_mask() -> None:
    it = _Iterator(PARTS, VALID, mask="loss_mask")
    assert skyrl.item_witness(it.data) == VALID
    items = _items(PARTS, VALID)
    items[0], items[1] = items[1], items[0]
    with pytest.raises(MisalignmentError, match=_message("logprobs", 1, 0, 0, 5, 3)):
        skyrl.reorder_and_combine_items(it, items)


def test_switched_off_unbound_and_unbindable_keys_are_not_checked() -> None:
    it = _Iterator(PARTS, VALID)
    swapped = _items(PARTS, VALID)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    previous = torch_impl.set_witness(False)
    try:
        assert [x["row"] for x in skyrl.reorder_and_combine_items(it, swapped)] == [4, 3, 2, 1, 0, 5]
    finally:
        torch_impl.set_witness(previous[0], unbound=previous[1])
    previous = torch_impl.set_witness(unbound=["logprobs"])
    try:  # the next per-token key, elementwise_loss, is still bound
        with pytest.raises(MisalignmentError, match=_message("elementwise_loss", 1, 0, 0, 5, 3)):
            skyrl.reorder_and_combine_items(it, swapped)
        torch_impl.set_witness(unbound=["logprobs", "elementwise_loss"])
        skyrl.reorder_and_combine_items(it, swapped)  # "row" is a scalar: never bound
    finally:
        torch_impl.set_witness(previous[0], unbound=previous[1])
    # lists over other lengths (another total) are never bound; items without lists ({}) neither
    other = [[{"top2": [0.0, 1.0]} for _ in p] for p in [PARTS[1], PARTS[0], PARTS[2]]]
    assert len(skyrl.reorder_and_combine_items(it, other)) == 6
    assert skyrl.reorder_and_combine_items(it, [[{}] * len(p) for p in PARTS]) == [{}] * 6
    # no mask in the batch: no witness
    it.data.get = {}.get
    assert skyrl.item_witness(it.data) is None
    assert len(skyrl.reorder_and_combine_items(it, swapped)) == 6


def test_megatron_padding_rows_left_out_as_skyrl_leaves_them() -> None:
    """SkyRL's Megatron worker pads every micro-batch to the widest's rows and returns an empty item
    for each padding row (its masks are zero), after the real ones; SkyRL's zip leaves them out."""
    parts = [[4, 1, 0], [3], [2, 5]]
    it = _Iterator(parts, VALID, padding=1)
    items = _items(parts, VALID)
    padded = [mb + [{"logprobs": [], "elementwise_loss": []}] * (3 - len(mb)) for mb in items]
    padded.append([{"logprobs": [], "elementwise_loss": []}] * 3)  # the padding micro-batch
    assert [x["row"] for x in skyrl.reorder_and_combine_items(it, padded)] == list(range(6))
    padded[1][1] = {"logprobs": [0.5], "row": 9}  # a padding row with values: not Megatron's
    with pytest.raises(
        PartitionMismatchError, match="micro-batch 1: 3 items, but its partition has 1 indices"
    ):
        skyrl.reorder_and_combine_items(it, padded)


# -- SkyRL's own class (its environment) --------------------------------------------------------------


def _need_skyrl() -> Any:
    try:
        from skyrl.backends.skyrl_train.workers import worker_utils
    except ImportError as err:
        why = f"SkyRL 0.4.0 is not installed here ({err}); CI runs these in its environment (.ci/peers.sh)"
        if "skyrl" in os.environ.get(REQUIRE_ENV, "").split(","):
            pytest.fail(why)
        pytest.skip(why)
    return worker_utils


def _real_iterator(worker_utils: Any) -> tuple[Any, list[int]]:
    """SkyRL's iterator over a ``TrainingInputBatch`` as its trainer builds one (left-padded prompts and
    responses, ``response_mask`` over the response), split by its real packer at 12 tokens."""
    from skyrl.backends.skyrl_train.training_batch import TrainingInputBatch

    prompts, responses = [4, 2, 5, 3, 1, 6, 2, 3], [3, 1, 4, 2, 5, 0, 6, 2]
    b, s, a = len(prompts), 12, max(responses)
    attention = torch.zeros(b, s, dtype=torch.int64)
    response = torch.zeros(b, a, dtype=torch.int64)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        attention[i, s - p - r :] = 1
        response[i, a - r :] = 1
    data = TrainingInputBatch(
        {
            "sequences": torch.arange(b * s).reshape(b, s),
            "attention_mask": attention,
            "response_mask": response,
        }
    )
    data.metadata = {"response_length": a}
    it = worker_utils.TokenBasedBatchIterator(data, max_tokens_per_microbatch=12)
    assert [sorted(p) for p in it._microbatches] != [[i] for i in range(b)]  # packed several to a micro-batch
    return it, responses


def _worker_items(it: Any) -> list[list[dict[str, Any]]]:
    """The items as SkyRL's ``_forward_backward_micro`` builds them from each micro-batch it yields:
    ``logprobs[i, -valid_len:]`` with ``valid_len = response_mask.sum(dim=1)``."""
    out = []
    for mb in it:
        lp = mb["sequences"][:, -mb["response_mask"].shape[1] :].float() / 7
        valid = mb["response_mask"].sum(dim=1).int().tolist()
        out.append([{"logprobs": lp[i, -n:].tolist() if n > 0 else []} for i, n in enumerate(valid)])
    return out


def test_skyrl_real_iterator_items_witnessed_and_skyrl_silent() -> None:
    worker_utils = _need_skyrl()
    theirs = vars(worker_utils.TokenBasedBatchIterator)["reorder_and_combine_items"]
    it, responses = _real_iterator(worker_utils)
    items = _worker_items(it)
    assert skyrl.reorder_and_combine_items(it, items) == theirs(it, items)
    assert [len(x["logprobs"]) for x in skyrl.reorder_and_combine_items(it, items)] == responses
    sizes = [len(p) for p in it._microbatches]
    m, n = next((m, n) for m, n in itertools.combinations(range(len(sizes)), 2) if sizes[m] == sizes[n])
    swapped = list(items)
    swapped[m], swapped[n] = swapped[n], swapped[m]
    theirs(it, swapped)  # SkyRL: silent, the rows restored as the wrong ones
    with pytest.raises(MisalignmentError, match=r"key 'logprobs', micro-batch \d+, position \d+: \d+ values"):
        skyrl.reorder_and_combine_items(it, swapped)


def test_skyrl_installed_on_and_shadow_see_the_swap() -> None:
    worker_utils = _need_skyrl()
    it, _ = _real_iterator(worker_utils)
    items = _worker_items(it)
    sizes = [len(p) for p in it._microbatches]
    m, n = next((m, n) for m, n in itertools.combinations(range(len(sizes)), 2) if sizes[m] == sizes[n])
    swapped = list(items)
    swapped[m], swapped[n] = swapped[n], swapped[m]
    theirs = vars(worker_utils.TokenBasedBatchIterator)["reorder_and_combine_items"]
    want, aligned = theirs(it, swapped), theirs(it, items)
    try:
        skyrl.install()
        assert it.reorder_and_combine_items(items) == aligned
        with pytest.raises(MisalignmentError):
            it.reorder_and_combine_items(swapped)
    finally:
        skyrl.uninstall()
    try:
        skyrl.install(mode="shadow", sample=1.0, on_defect="log")
        assert it.reorder_and_combine_items(swapped) == want  # SkyRL's result returned
        stats = skyrl.stats()["by_name"]["reorder_and_combine_items"]
        assert stats["defects"] == 1
    finally:
        skyrl.uninstall()
