"""Exact provenance (docs/spec.md, "Exact provenance"): rebatch's split vouches for the restore, whatever the
row lengths. Fixed-length batches (every row one length, where the alignment witness is blind) through verl's
drop-in: every named misalignment raises; clean calls (outputs moved to another device or dtype and back,
several threads, verl-like fresh offsets, a split that was not rebatch's) never do."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import warnings
import weakref
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from tensordict import NonTensorData, TensorDict

import ref
import torch_impl
from property_tests.baseline import verl_postprocess_batch_func
from property_tests.compare import first_difference
from property_tests.splits import ref_splits
from property_tests.strategies import (
    Misaligned,
    VerlStep,
    equal_length_steps,
    fixed_length_steps,
    misalignments,
)
from ref.errors import MisalignmentError, NotAPermutationError
from torch_impl._alignment import _provenance
from torch_impl._postprocess import check_batch_func


def _batch(b: int = 16, length: int = 10, *, dynamic: bool = True) -> TensorDict:
    ids = torch.nested.nested_tensor_from_jagged(
        torch.arange(b * length), torch.arange(0, b * length + 1, length)
    )
    settings = {"use_dynamic_bsz": NonTensorData(dynamic), "max_token_len_per_gpu": NonTensorData(4 * length)}
    if not dynamic:
        settings["micro_batch_size_per_gpu"] = NonTensorData(4)
    return TensorDict({"input_ids": ids, **settings}, batch_size=[b])


def _engine(micro_batches: Any, move: Any = None) -> list[dict[str, Any]]:
    """Each micro-batch's outputs as verl's FSDP engine builds them: on its (moved) input_ids' offsets."""
    outs = []
    for mb in micro_batches:
        moved = move(mb) if move is not None else mb
        ids = moved["input_ids"]
        lp = torch.nested.nested_tensor_from_jagged(ids.values().to(torch.float32) * 2, ids.offsets())
        score = torch.full((int(mb.batch_size[0]),), 1.0, device=ids.values().device)
        outs.append({"model_output": {"log_probs": lp, "score": score}, "loss": torch.tensor(1.0)})
    return outs


def _split(dynamic: bool = True) -> tuple[TensorDict, Any, Any]:
    data = _batch(dynamic=dynamic)
    mbs, indices = torch_impl.prepare_micro_batches(data)
    return data, mbs, indices


def _expected(outs: Any, indices: Any, data: Any) -> Any:
    with _witness_off():
        return torch_impl.postprocess_batch(outs, indices, use_dynamic_bsz=indices is not None)


class _witness_off:
    def __enter__(self) -> None:
        self.before = torch_impl.set_witness(False)

    def __exit__(self, *exc: object) -> None:
        torch_impl.set_witness(self.before[0], unbound=self.before[1])


def test_a_clean_fixed_length_call_is_proven_and_bit_identical() -> None:
    data, mbs, indices = _split()
    outs = _engine(mbs)
    before = torch_impl.provenance_stats()
    result = torch_impl.postprocess_batch_func(outs, indices, data)
    after = torch_impl.provenance_stats()
    assert after["calls_proven"] == before["calls_proven"] + 1
    assert after["keys_proven"] == before["keys_proven"] + 2 * len(outs)
    plain = _expected(outs, indices, data)["model_output"]
    assert first_difference(result["model_output"]["score"], plain["score"]) is None


@pytest.mark.parametrize(
    "move",
    [
        lambda mb: mb.to(torch.float64),
        lambda mb: mb.apply(lambda t: t.detach().clone()),
        lambda mb: mb.to("meta"),
    ],
    ids=["dtype", "detach-clone", "meta"],
)
def test_outputs_built_on_a_moved_micro_batch_are_proven(move: Any) -> None:
    data, mbs, indices = _split()
    moved = [move(mb) for mb in mbs]
    rec = torch_impl.recorded(data)
    assert isinstance(rec, _provenance.Record)
    for m, mb in enumerate(moved):
        assert rec.tags[id(_provenance._ragged(mb["input_ids"]))][1] == m  # the nested int survives the move
    outs = _engine(mbs, move)
    before = torch_impl.provenance_stats()["calls_proven"]
    torch_impl.postprocess_batch_func(outs, indices, data)
    assert torch_impl.provenance_stats()["calls_proven"] == before + 1


def test_swapped_micro_batches_of_identical_lengths_raise() -> None:
    data, mbs, indices = _split()
    outs = _engine(mbs)
    outs[0], outs[2] = outs[2], outs[0]
    with pytest.raises(
        MisalignmentError, match=r"key 'log_probs', micro-batch 0: this output holds micro-batch 2's"
    ):
        torch_impl.postprocess_batch_func(outs, indices, data)
    with pytest.raises(MisalignmentError, match="micro-batch 2's rows"):
        check_batch_func(outs, indices, data)


def test_fixed_size_micro_batches_swapped_raise() -> None:
    data, mbs, indices = _split(dynamic=False)
    assert indices is None
    outs = _engine(mbs)
    torch_impl.postprocess_batch_func(outs, None, data)
    outs[1], outs[3] = outs[3], outs[1]
    with pytest.raises(MisalignmentError, match="micro-batch 1: this output holds micro-batch 3's rows"):
        torch_impl.postprocess_batch_func(outs, None, data)


def _flat(indices: Any) -> list[int]:
    return [int(i) for p in indices for i in p]


def _cut(flat: list[int], like: Any) -> list[list[int]]:
    out, at = [], 0
    for p in like:
        out.append(flat[at : at + len(p)])
        at += len(p)
    return out


def _transposed(indices: Any) -> list[list[int]]:
    bad = [list(p) for p in indices]
    bad[0][0], bad[1][-1] = bad[1][-1], bad[0][0]
    return bad


def _inverse(indices: Any) -> list[list[int]]:
    flat = _flat(indices)
    inv = [0] * len(flat)
    for k, i in enumerate(flat):
        inv[i] = k
    return _cut(inv, indices)


def _another_partition(indices: Any) -> list[list[int]]:
    flat = _flat(indices)
    return _cut(flat[3:] + flat[:3], indices)


@pytest.mark.parametrize(
    "wrong", [_transposed, _inverse, _another_partition], ids=["transposed", "inverse", "another"]
)
def test_indices_that_are_not_the_splits_raise(wrong: Any) -> None:
    data, mbs, indices = _split()
    outs = _engine(mbs)
    bad = wrong(indices)
    assert bad != [list(p) for p in indices]
    with pytest.raises(MisalignmentError, match="by the split's provenance, not its slot's"):
        torch_impl.postprocess_batch_func(outs, bad, data)


def test_another_steps_indices_raise() -> None:
    data, mbs, indices = _split()
    other = _batch()
    other["input_ids"] = torch.nested.nested_tensor_from_jagged(
        torch.arange(160), torch.tensor([0, *range(4, 150, 10), 160])
    )  # other lengths: another partition of the same rows
    _, other_indices = torch_impl.prepare_micro_batches(other)
    assert other_indices is not None
    assert indices is not None
    assert [list(p) for p in other_indices] != [list(p) for p in indices]
    with pytest.raises(MisalignmentError, match="by the split's provenance, not its slot's"):
        torch_impl.postprocess_batch_func(_engine(mbs), other_indices, data)


def test_the_splits_indices_vouch_for_the_permutation_and_a_defect_still_comes_first(monkeypatch) -> None:
    """The split's own indices (their bytes the recorded permutation's) are a permutation without another
    check; any other indices are checked as ever: a duplicate is `NotAPermutationError` before provenance
    says they are not the split's."""
    from torch_impl import _permutation

    data, mbs, indices = _split()
    outs = _engine(mbs)
    checked: list[int] = []
    valid = _permutation._valid
    monkeypatch.setattr(_permutation, "_valid", lambda perm, n: checked.append(n) or valid(perm, n))
    torch_impl.postprocess_batch_func(outs, indices, data)
    assert checked == []
    with pytest.raises(MisalignmentError, match="by the split's provenance, not its slot's"):
        torch_impl.postprocess_batch_func(outs, _transposed(indices), data)
    assert checked == [16]
    dup = [list(p) for p in indices]
    dup[0][0] = dup[1][0]
    with pytest.raises(NotAPermutationError, match="duplicates"):
        torch_impl.postprocess_batch_func(outs, dup, data)


def test_a_split_whose_indices_are_not_a_permutation_is_left_unrecorded() -> None:
    """An observed split (shadow mode: a trainer's own) that hands out an index twice vouches for nothing."""
    data = _batch()
    mbs, indices = torch_impl.prepare_micro_batches(data)
    assert isinstance(torch_impl.recorded(data), _provenance.Record)
    other = _batch()
    dup = [list(p) for p in indices]
    dup[0][0] = dup[1][0]
    _provenance.observe_split((mbs, dup), other)
    assert torch_impl.recorded(other) is _provenance.UNRECORDED
    for odd in ([[float(i) for i in p] for p in indices], [[2**63 + i for i in p] for p in indices]):
        _provenance.observe_split((mbs, odd), other)  # never raises into the trainer's split
        assert torch_impl.recorded(other) is _provenance.UNRECORDED
    _provenance.observe_split((mbs, indices), other)  # the control: the same split with its own indices
    assert isinstance(torch_impl.recorded(other), _provenance.Record)


def test_a_stray_on_any_jagged_key_raises_naming_that_key() -> None:
    """Each jagged key of each output is judged: output 1's second key built on micro-batch 0's offsets
    raises for that key, though its first key is its own."""
    data, mbs, indices = _split()
    outs = _engine(mbs)
    for o, mb in zip(outs, mbs, strict=True):
        o["model_output"]["entropy"] = torch.nested.nested_tensor_from_jagged(
            mb["input_ids"].values().float(), mb["input_ids"].offsets()
        )
    before = torch_impl.provenance_stats()["keys_proven"]
    torch_impl.postprocess_batch_func(outs, indices, data)
    assert torch_impl.provenance_stats()["keys_proven"] == before + 3 * len(outs)
    first = mbs[0]["input_ids"]
    outs[1]["model_output"]["entropy"] = torch.nested.nested_tensor_from_jagged(
        first.values().float(), first.offsets()
    )
    with pytest.raises(
        MisalignmentError, match="key 'entropy', micro-batch 1: this output holds micro-batch 0's"
    ):
        torch_impl.postprocess_batch_func(outs, indices, data)


def test_outputs_proven_by_one_key_and_unproven_outputs_are_counted() -> None:
    """An output proven by one jagged key (another built on fresh offsets) is proven; an output carrying
    no recorded nested int leaves the call partly proven, never an error."""
    data, mbs, indices = _split()
    outs = _engine(mbs)
    for o in outs:  # a second jagged key on fresh offsets of the same lengths: no recorded nested int
        lp = o["model_output"]["log_probs"]
        o["model_output"]["entropy"] = torch.nested.nested_tensor_from_jagged(
            lp.values().clone(), lp.offsets().clone()
        )
    before = torch_impl.provenance_stats()
    torch_impl.postprocess_batch_func(outs, indices, data)
    after = torch_impl.provenance_stats()
    assert after["calls_proven"] == before["calls_proven"] + 1
    assert after["keys_proven"] == before["keys_proven"] + 3 * len(outs)
    fresh = outs[1]["model_output"]["log_probs"]
    outs[1]["model_output"]["log_probs"] = torch.nested.nested_tensor_from_jagged(
        fresh.values(), fresh.offsets().clone()
    )
    torch_impl.postprocess_batch_func(outs, indices, data)
    last = torch_impl.provenance_stats()
    assert last["calls_partly_proven"] == after["calls_partly_proven"] + 1
    assert last["keys_unproven"] == after["keys_unproven"] + 3
    assert last["keys_proven"] == after["keys_proven"] + 3 * (len(outs) - 1)


def test_restore_dynamic_batch_given_indices_that_are_not_the_latest_splits() -> None:
    _data, _mbs, indices = _split()
    x = torch.arange(16.0)
    torch_impl.restore_dynamic_batch(x, indices)
    with pytest.raises(MisalignmentError, match="the indices are not the split's"):
        torch_impl.restore_dynamic_batch(x, _inverse(indices))
    dup = [list(p) for p in indices]
    dup[0][0] = dup[0][1]
    with pytest.raises(NotAPermutationError):  # a structural defect first
        torch_impl.restore_dynamic_batch(x, dup)
    torch_impl.restore_dynamic_batch(torch.arange(3.0), [[2, 0], [1]])  # other sizes: unproven, no error


def test_a_split_that_was_not_rebatchs_and_fresh_offsets_stay_unproven() -> None:
    data = _batch()
    indices = [[0, 5, 10, 15], [1, 6, 11, 12], [2, 7, 8, 13], [3, 4, 9, 14]]
    mbs = torch_impl.split(data, indices)  # the split's operation, not a split that records
    before = torch_impl.provenance_stats()
    torch_impl.postprocess_batch_func(_engine(mbs), indices, data)
    assert torch_impl.provenance_stats()["calls_unproven"] == before["calls_unproven"] + 1
    data, mbs, indices = _split()
    fresh = []  # Megatron: fresh offsets per key (a new nested int)
    for o in _engine(mbs):
        lp = o["model_output"]["log_probs"]
        o["model_output"]["log_probs"] = torch.nested.nested_tensor_from_jagged(
            lp.values(), lp.offsets().clone()
        )
        fresh.append(o)
    before = torch_impl.provenance_stats()
    torch_impl.postprocess_batch_func(fresh, indices, data)
    assert torch_impl.provenance_stats()["calls_unproven"] == before["calls_unproven"] + 1


def test_the_record_keeps_no_batch_alive() -> None:
    data, mbs, _indices = _split()
    alive = weakref.ref(data)
    key = id(data)
    name = _provenance._by_batch[key]
    assert name in _provenance._records
    del data, mbs
    gc.collect()
    assert alive() is None
    assert key not in _provenance._by_batch
    assert name not in _provenance._records


def test_several_threads_each_proven_with_their_own_split() -> None:
    errors: list[BaseException] = []

    def step() -> None:
        try:
            for _ in range(10):
                data, mbs, indices = _split()
                torch_impl.postprocess_batch_func(_engine(mbs), indices, data)
                torch_impl.restore_dynamic_batch(torch.arange(16.0), indices)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=step) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_ref_and_torch_agree_on_the_words() -> None:
    """Outputs swapped, given the split's names (torch's records in ref's form): the same words."""
    data = _batch(4, 3)
    data["max_token_len_per_gpu"] = NonTensorData(6)
    mbs, torch_indices = torch_impl.prepare_micro_batches(data)
    torch_outs = _engine(mbs)
    with pytest.raises(MisalignmentError) as torch_error:
        torch_impl.postprocess_batch_func(torch_outs[::-1], torch_indices, data)
    splits = ref_splits(data)
    x = ref.Jagged.from_rows([[1.0] * 3] * 4)
    parts = ref.split(x, [list(r) for r in splits[0].rows])
    outs = [
        {"model_output": {"log_probs": p}, "provenance": r}
        for p, r in zip(parts, splits[0].rows, strict=True)
    ]
    with pytest.raises(MisalignmentError) as ref_error:
        ref.postprocess_batch(outs[::-1], torch_indices, provenance=splits)
    assert str(ref_error.value) == str(torch_error.value)
    assert "this output holds micro-batch 1's rows of split" in str(torch_error.value)


PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(st.one_of(fixed_length_steps(), equal_length_steps()))
def test_clean_fixed_and_equal_length_steps_pass_and_match_verl(step: VerlStep) -> None:
    """0 false positives: the clean call is proven and is verl's algorithm's result."""
    before = torch_impl.provenance_stats()["calls_proven"]
    result = torch_impl.postprocess_batch_func(step.output_lst, step.indices, step.data)
    assert torch_impl.provenance_stats()["calls_proven"] == before + 1
    assert (
        first_difference(result, verl_postprocess_batch_func(step.output_lst, step.indices, step.data))
        is None
    )
    check_batch_func(step.output_lst, step.indices, step.data)


@PROPERTY
@given(misalignments(steps=st.one_of(fixed_length_steps(), equal_length_steps())))
def test_every_named_misalignment_raises_whatever_the_lengths(case: Misaligned) -> None:
    """0 silent: each named misalignment, on batches where lengths cannot tell, through the drop-in and
    shadow mode's check."""
    for fn in (torch_impl.postprocess_batch_func, check_batch_func):
        with pytest.raises(
            MisalignmentError, match=r"by the split's provenance|the indices are not the split's"
        ):
            fn(case.output_lst, case.indices, case.step.data)


@PROPERTY
@given(fixed_length_steps(dynamic=True), st.sampled_from([torch.float64, torch.bfloat16]))
def test_outputs_moved_to_another_dtype_and_back_stay_proven(step: VerlStep, dtype: torch.dtype) -> None:
    moved = [
        {**o, "model_output": {k: v.to(dtype).to(v.dtype) for k, v in o["model_output"].items()}}
        for o in step.output_lst
    ]
    before = torch_impl.provenance_stats()["calls_proven"]
    torch_impl.postprocess_batch_func(moved, step.indices, step.data)
    assert torch_impl.provenance_stats()["calls_proven"] == before + 1


def test_verls_own_split_feeding_rebatchs_restore_is_unproven_never_an_error() -> None:
    """verl 0.9.1's ``rearrange_micro_batches`` (pins environment) splits; rebatch's restore gets its
    micro-batches' outputs and indices: no record, so unproven (counted), and verl's result."""
    from property_tests.verl_oracle import verl_or_skip

    verl = verl_or_skip()
    data = _batch()
    mbs, indices = verl.seqlen_balancing.rearrange_micro_batches(data, 40)
    outs = _engine(mbs)
    before = torch_impl.provenance_stats()["calls_unproven"]
    result = torch_impl.postprocess_batch_func(outs, indices, data)
    assert torch_impl.provenance_stats()["calls_unproven"] == before + 1
    theirs = verl.engine_utils.postprocess_batch_func(
        [{**o, "model_output": {"log_probs": o["model_output"]["log_probs"]}} for o in outs], indices, data
    )
    assert first_difference(result["model_output"]["log_probs"], theirs["model_output"]["log_probs"]) is None


def test_a_forked_child_checks_with_its_parents_records() -> None:
    """The records and the lock survive a fork (`rebatch_startup.renew_at_fork`): the child's swapped call
    raises, its clean one passes, while a parent's thread held the lock at the fork."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    data, mbs, indices = _split()
    outs = _engine(mbs)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with _provenance._lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(30)
    try:
        with (
            warnings.catch_warnings()
        ):  # JAX (imported by earlier tests) warns of any fork; this child runs no JAX
            warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
            pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if both calls behave
            code = 1
            try:
                torch_impl.postprocess_batch_func(outs, indices, data)
                try:
                    torch_impl.postprocess_batch_func(outs[::-1], indices, data)
                except MisalignmentError:
                    code = 0
            finally:
                os._exit(code)
    finally:
        release.set()
        t.join()
    deadline = time.monotonic() + 60  # a child that hangs (a lock never freed) fails the test, never hangs it
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung (a lock held at the fork was never renewed)")
    assert os.waitstatus_to_exitcode(done[1]) == 0
