"""Provenance proves what each output carries (docs/spec.md, "Exact provenance"): a slot is right where its
output names a micro-batch whose rows are the slot's, in any slot order; another batch's output, a dynamic
split restored as fixed, a shallow clone's swap and routes swapped before their join raise; what names
nothing stays unproven, never an error."""

from __future__ import annotations

import gc
import itertools
from typing import Any

import pytest
import torch
from tensordict import NonTensorData, TensorDict

import ref
import torch_impl
from property_tests.baseline import verl_postprocess_batch_func
from property_tests.compare import first_difference
from property_tests.convert import outputs_to_ref
from property_tests.splits import ref_splits
from ref.errors import MisalignmentError
from ref.provenance import Carried
from torch_impl._alignment import _provenance

LENGTH = 3  # every row's length in a fixed-length batch


def _batch(b: int = 8, lengths: list[int] | None = None, dynamic: bool = True) -> TensorDict:
    """``b`` rows of ``LENGTH`` tokens (or of ``lengths``), verl's ``use_dynamic_bsz`` set to ``dynamic``."""
    lengths = lengths if lengths is not None else [LENGTH] * b
    offsets = torch.tensor([0, *itertools.accumulate(lengths)])
    ids = torch.nested.nested_tensor_from_jagged(torch.arange(int(offsets[-1])), offsets)
    fields = {"input_ids": ids, "use_dynamic_bsz": NonTensorData(dynamic)}
    return TensorDict(fields, batch_size=[len(lengths)])


def _engine(micro_batches: Any) -> list[dict[str, Any]]:
    """Each micro-batch's outputs as verl's FSDP engine builds them: on its input_ids' offsets."""
    outs = []
    for mb in micro_batches:
        ids = mb["input_ids"]
        lp = torch.nested.nested_tensor_from_jagged(ids.values().to(torch.float32) * 0.5, ids.offsets())
        outs.append({"model_output": {"log_probs": lp}, "loss": torch.tensor(1.0)})
    return outs


def _verls(outs: Any, indices: Any, data: Any) -> None:
    """rebatch's result is verl's, bit for bit."""
    got = torch_impl.postprocess_batch_func(outs, indices, data)
    assert first_difference(got, verl_postprocess_batch_func(outs, indices, data)) is None


def _proven() -> int:
    return torch_impl.provenance_stats()["calls_proven"]


def test_micro_batches_run_in_another_order_with_their_indices_are_proven() -> None:
    """A scheduler's order (NeMo-RL's ``largest_first``): outputs and indices moved together are right."""
    data = _batch()
    mbs, indices = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 2)
    order = list(reversed(range(len(mbs))))
    outs = _engine([mbs[k] for k in order])
    moved = [list(indices[k]) for k in order]
    before = _proven()
    _verls(outs, moved, data)
    assert _proven() == before + 1


def test_a_dynamic_split_restored_as_fixed_raises_in_ref_and_torch() -> None:
    """``max_token_len=`` made a dynamic split; ``data`` says fixed: its rows would join in micro-batch
    order, wrong, so the restore raises (it was counted proven)."""
    data = _batch(dynamic=False)
    mbs, indices = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 2)
    assert [i for p in indices for i in p] != list(range(8))
    outs = _engine(mbs)
    before = _proven()
    with pytest.raises(MisalignmentError, match="not its slot's") as torch_error:
        torch_impl.postprocess_batch_func(outs, None, data)
    assert _proven() == before
    ref_outs = outputs_to_ref(outs)
    for o, p in zip(ref_outs, indices, strict=True):
        o["provenance"] = tuple(p)
    with pytest.raises(MisalignmentError) as ref_error:
        ref.postprocess_batch(ref_outs, None, use_dynamic_bsz=False, provenance=ref_splits(data))
    assert str(ref_error.value) == str(torch_error.value)


@pytest.mark.parametrize("dynamic", [True, False])
def test_a_micro_batch_size_override_restores_right_whatever_data_says(dynamic: bool) -> None:
    """``micro_batch_size=`` returns its chunks' indices: verl's result either way, proven."""
    data = _batch(dynamic=dynamic)
    mbs, indices = torch_impl.prepare_micro_batches(data, micro_batch_size=3)
    assert indices == [[0, 1, 2], [3, 4, 5], [6, 7]]
    before = _proven()
    _verls(_engine(mbs), indices, data)
    assert _proven() == before + 1


def test_a_previous_steps_output_in_this_steps_slot_raises_naming_both_batches() -> None:
    """Two steps of the same shapes: step 1's output in step 2's slot names step 1's batch."""
    first, second = _batch(), _batch()
    old_mbs, _ = torch_impl.prepare_micro_batches(first, max_token_len=LENGTH * 2)
    mbs, indices = torch_impl.prepare_micro_batches(second, max_token_len=LENGTH * 2)
    outs = _engine(mbs)
    outs[1] = _engine(old_mbs[1:2])[0]
    old, new = torch_impl.recorded(first), torch_impl.recorded(second)
    assert isinstance(old, _provenance.Record)
    assert isinstance(new, _provenance.Record)
    with pytest.raises(MisalignmentError) as torch_error:
        torch_impl.postprocess_batch_func(outs, indices, second)
    text = str(torch_error.value)
    assert f"micro-batch 1: this output holds rows of split {old.splits[-1].name} of batch {old.name}" in text
    assert f"while the batch restored is batch {new.name}" in text
    ref_outs = outputs_to_ref(outs)
    for m, (o, p) in enumerate(zip(ref_outs, indices, strict=True)):
        o["provenance"] = tuple(p) if m != 1 else Carried(old.splits[-1].name, tuple(p), old.name)
    with pytest.raises(MisalignmentError) as ref_error:
        ref.postprocess_batch(ref_outs, indices, provenance=ref_splits(second))
    assert str(ref_error.value) == text


def test_a_shallow_clone_finds_the_record() -> None:
    """``data.clone(False)`` holds the same tensors: its input_ids' nested int finds the split, so two
    micro-batches swapped raise and a clean restore is proven."""
    data = _batch()
    mbs, indices = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 2)
    clone = data.clone(False)
    assert clone is not data
    assert torch_impl.recorded(clone) is torch_impl.recorded(data)
    outs = _engine(mbs)
    before = _proven()
    _verls(outs, indices, clone)
    assert _proven() == before + 1
    with pytest.raises(MisalignmentError, match="micro-batch 0: this output holds micro-batch 1's rows"):
        torch_impl.postprocess_batch_func([outs[1], outs[0], *outs[2:]], indices, clone)


def test_the_record_lives_while_the_batch_or_its_input_ids_lives() -> None:
    data = _batch()
    _mbs, _indices = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 2)
    ids = data["input_ids"]
    rebuilt = TensorDict({"input_ids": ids, "use_dynamic_bsz": NonTensorData(True)}, batch_size=[8])
    del data
    gc.collect()
    kept = torch_impl.recorded(rebuilt)
    assert isinstance(kept, _provenance.Record)
    name = kept.name
    del kept, rebuilt, ids
    gc.collect()
    assert name not in _provenance._records
    fresh = _batch()  # new tensors: no record, unproven
    assert torch_impl.recorded(fresh) is _provenance.UNRECORDED


def test_a_batch_rebuilt_from_new_tensors_is_unproven_never_an_error() -> None:
    data = _batch()
    mbs, indices = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 2)
    outs = _engine(mbs)
    rebuilt = _batch()
    before = torch_impl.provenance_stats()["calls_unproven"]
    _verls(outs, indices, rebuilt)
    _verls(outs, indices, None)
    assert torch_impl.provenance_stats()["calls_unproven"] == before + 2


def test_an_engine_on_one_micro_batchs_offsets_for_all_raises_naming_the_switch() -> None:
    """Every same-shape micro-batch's outputs built on micro-batch 0's offsets object: they name micro-batch
    0 in every slot, which the spec says breaks the premise; the error names the switch."""
    data = _batch()
    mbs, indices = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 2)
    shared = mbs[0]["input_ids"].offsets()
    outs = [
        {
            "model_output": {
                "log_probs": torch.nested.nested_tensor_from_jagged(mb["input_ids"].values() * 1.0, shared)
            }
        }
        for mb in mbs
    ]
    with pytest.raises(MisalignmentError, match="REBATCH_WITNESS=off"):
        torch_impl.postprocess_batch_func(outs, indices, data)


def test_static_buffers_across_steps_stay_unproven() -> None:
    """An engine that copies each micro-batch's outputs into static buffers made once on offsets of its own
    carries no identity: every step unproven, never an error, verl's result."""
    buffers: dict[int, torch.Tensor] = {}
    before = torch_impl.provenance_stats()["calls_unproven"]
    for _step in range(3):
        data = _batch()
        mbs, indices = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 2)
        outs = []
        for m, mb in enumerate(mbs):
            rows = int(mb.batch_size[0])
            if m not in buffers:
                offsets = torch.arange(0, rows * LENGTH + 1, LENGTH)
                buffers[m] = torch.nested.nested_tensor_from_jagged(torch.zeros(rows * LENGTH), offsets)
            buffers[m].values().copy_(mb["input_ids"].values().to(torch.float32))
            outs.append({"model_output": {"log_probs": buffers[m]}})
        _verls(outs, indices, data)
    assert torch_impl.provenance_stats()["calls_unproven"] == before + 3


def _routes(micro_batches: Any) -> list[torch.Tensor]:
    """Each micro-batch's recorded routes as verl's Megatron engine keeps them: int16 ``[b, (j), 2, 3]``
    on the micro-batch's tokens (values naming each token)."""
    out = []
    for mb in micro_batches:
        ids = mb["input_ids"]
        values = (ids.values()[:, None, None] + torch.zeros(2, 3, dtype=torch.int64)).to(torch.int16)
        out.append(torch.nested.nested_tensor_from_jagged(values, ids.offsets()))
    return out


def _merged(routes: list[torch.Tensor]) -> torch.Tensor:
    """verl's ``merge_nested_router_maps``: every row unbound and joined into one jagged tensor."""
    rows = [row for r in routes for row in r.unbind()]
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def test_routes_swapped_between_micro_batches_before_the_merge_raise() -> None:
    """Router replay: each micro-batch's routes merged into one jagged tensor (no identity survives) and
    restored by ``restore_dynamic_batch``; the split knew every row's length."""
    data = _batch(lengths=[2, 5, 3, 7, 4, 6, 1, 8])
    mbs, indices = torch_impl.prepare_micro_batches(data, max_token_len=12)
    routes = _routes(mbs)
    before = torch_impl.provenance_stats()
    torch_impl.restore_dynamic_batch(_merged(routes), indices)
    after = torch_impl.provenance_stats()
    assert after["restores_rows_witnessed"] == before["restores_rows_witnessed"] + 1
    assert after["calls_proven"] == before["calls_proven"]
    sizes = [r.size(0) for r in routes]
    m, n = next(
        (m, n)
        for m, n in itertools.combinations(range(len(routes)), 2)
        if sizes[m] == sizes[n] and routes[m].offsets().diff().tolist() != routes[n].offsets().diff().tolist()
    )
    swapped = list(routes)
    swapped[m], swapped[n] = swapped[n], swapped[m]
    with pytest.raises(MisalignmentError, match="key 'data', micro-batch"):
        torch_impl.restore_dynamic_batch(_merged(swapped), indices)
    response = [
        torch.nested.nested_tensor_from_jagged(
            torch.zeros(3 * r.size(0)), torch.arange(0, 3 * r.size(0) + 1, 3)
        )
        for r in routes
    ]
    torch_impl.restore_dynamic_batch(_merged(response), indices)  # other lengths: unbound, never an error


def test_routes_of_equal_lengths_swapped_cannot_be_told() -> None:
    """Micro-batches whose rows have one length: the lengths agree whatever the order, nothing raised."""
    data = _batch()
    mbs, indices = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 2)
    routes = _routes(mbs)
    swapped = [routes[1], routes[0], *routes[2:]]
    torch_impl.restore_dynamic_batch(_merged(swapped), indices)
