"""The accelerator's plan (`torch_impl._devplan`) on the CPU's values: the plan from the device's offsets
and the plan from the witness's lengths give the host plan's result bit for bit, and every defect the
same error, on drawn batches (``Settings.plan_on_device`` runs them here); each group's plan is one
upload and a fixed chain of operations, whatever B and M (``meta``)."""

from __future__ import annotations

import itertools
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given
from tensordict import NonTensorData, TensorDict

import torch_impl
from property_tests.compare import assert_same
from property_tests.opcount import CountOps
from ref import errors
from torch_impl._devplan import plan_from_host, plan_on_device
from torch_impl._parts import check_parts
from torch_impl._rows import CallRows


class Batch:
    """A drawn call: row lengths, the split, and micro-batch outputs (``keys`` keys on each micro-batch's
    one offsets tensor, as verl's engines build them, and a dense key)."""

    def __init__(self, lengths: list[int], partitions: list[list[int]], keys: int, width: int) -> None:
        self.lengths = lengths
        self.partitions = partitions
        g = torch.Generator(device="cpu").manual_seed(len(lengths) + keys)
        self.outs: list[dict[str, Any]] = []
        for p in partitions:
            offsets = torch.tensor(
                [0, *itertools.accumulate(lengths[i] for i in p)], dtype=torch.int64, device="cpu"
            )
            jagged = {}
            for k in range(keys):
                values = torch.randn(int(offsets[-1]), *([width] if width else []), generator=g, device="cpu")
                jagged[f"k{k}"] = torch.nested.nested_tensor_from_jagged(values, offsets)
            dense = torch.randn(len(p), 2, generator=g, device="cpu")
            self.outs.append({"model_output": {**jagged, "dense": dense}})

    def data(self, witness: list[int] | None) -> TensorDict:
        entries: dict[str, Any] = {"use_dynamic_bsz": NonTensorData(True)}
        if witness is not None:
            offsets = torch.tensor([0, *itertools.accumulate(witness)], dtype=torch.int64, device="cpu")
            ids = torch.zeros(int(offsets[-1]), dtype=torch.int64, device="cpu")
            entries["input_ids"] = torch.nested.nested_tensor_from_jagged(ids, offsets)
        return TensorDict(entries, batch_size=[])


@st.composite
def batches(draw: Any, *, max_rows: int = 24, max_micro_batches: int = 5) -> Batch:
    rows = draw(st.integers(0, max_rows))
    lengths = draw(st.lists(st.integers(0, 6), min_size=rows, max_size=rows))
    order = draw(st.permutations(list(range(rows))))
    m = draw(st.integers(1, max_micro_batches))
    cuts = sorted(draw(st.lists(st.integers(0, rows), min_size=m - 1, max_size=m - 1)))
    bounds = [0, *cuts, rows]
    partitions = [list(order[a:b]) for a, b in itertools.pairwise(bounds)]
    return Batch(lengths, partitions, draw(st.integers(1, 3)), draw(st.sampled_from([0, 3])))


def _call(batch: Batch, witness: list[int] | None, **settings: Any) -> Any:
    with torch_impl.use_settings(**settings):
        return torch_impl.postprocess_batch_func(batch.outs, batch.partitions, batch.data(witness))


def _outcome(batch: Batch, witness: list[int] | None, **settings: Any) -> Any:
    try:
        return _call(batch, witness, **settings)
    except errors.RebatchError as err:
        return type(err), str(err)


@pytest.mark.parametrize("kernel", [None, "element_indices"])
@given(batch=batches())
def test_both_device_plans_give_the_host_plans_result(kernel: str | None, batch: Batch) -> None:
    """Without a witness the plan from the offsets; with one, from its lengths: bit for bit."""
    for witness in (None, batch.lengths):
        want = _call(batch, witness, kernel=kernel)
        assert_same(_call(batch, witness, kernel=kernel, plan_on_device=True), want)


@given(batch=batches(), data=st.data())
def test_a_wrong_witness_raises_the_same_error_from_either_plan(batch: Batch, data: Any) -> None:
    """A witness that disagrees with the outputs (its lengths shuffled, one changed): the same error (or
    none) whether the group was planned from the witness's lengths, from the offsets or on the host."""
    witness = list(data.draw(st.permutations(batch.lengths)))
    if witness and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(witness) - 1))
        witness[i] += data.draw(st.sampled_from([-1, 1])) if witness[i] else 1
    got, want = _outcome(batch, witness, plan_on_device=True), _outcome(batch, witness)
    if isinstance(want, dict):
        assert_same(got, want)
    else:
        assert got == want


def _parts(batch: Batch, key: str = "k0") -> list[Any]:
    return check_parts([o["model_output"][key] for o in batch.outs], key)


def _rows(batch: Batch) -> CallRows:
    perm = torch.tensor([i for p in batch.partitions for i in p], dtype=torch.int64, device="cpu")
    return CallRows([len(p) for p in batch.partitions], perm)


@given(batch=batches())
def test_the_two_device_plans_agree_with_the_lengths(batch: Batch) -> None:
    """Each plan's lengths (the split's order), restored lengths, result offsets and element indices
    (each value's destination) as the lengths give them."""
    parts, rows = _parts(batch), _rows(batch)
    order = [i for p in batch.partitions for i in p]
    split = [batch.lengths[i] for i in order]
    offsets = [0, *itertools.accumulate(batch.lengths)]
    destinations = [offsets[i] + j for i in order for j in range(batch.lengths[i])]
    restored = np.asarray(batch.lengths, dtype=np.int64)
    for plan in (plan_on_device(parts, rows), plan_from_host(parts, rows, restored)):
        assert plan is not None
        assert plan.lengths.tolist() == split
        assert plan.restored.tolist() == batch.lengths
        assert plan.offsets.tolist() == offsets
        if rows.perm is None:  # rows in order (the identity): the parts are laid end to end, no runs
            assert plan.runs is None
            assert destinations == list(range(len(destinations)))
        else:
            assert plan.runs is not None
            assert plan.runs.indices().tolist() == destinations


def test_lengths_that_do_not_fill_the_values_are_not_planned_from() -> None:
    """A witness whose lengths give a micro-batch more or fewer values than it holds: no plan from them
    (indices from them could fall out of range); the witness then judges the device's own plan."""
    batch = Batch([2, 3, 1, 4], [[1, 2], [0, 3]], keys=1, width=0)
    parts, rows = _parts(batch), _rows(batch)
    assert plan_from_host(parts, rows, np.array([3, 2, 1, 4], dtype=np.int64)) is None
    assert plan_from_host(parts, rows, np.array([2, 3, 1, 4], dtype=np.int64)) is not None
    with pytest.raises(errors.MisalignmentError, match="original row 0"):
        _call(batch, [3, 2, 1, 4], plan_on_device=True)


def test_offsets_not_starting_at_zero_raise_where_planned_from_the_witness() -> None:
    """Planned from the witness's lengths, the comparison of the offsets finds a micro-batch whose offsets
    are shifted (every length right): its defect is named, as the offsets' own check names it."""
    batch = Batch([2, 3, 1, 4], [[1, 2], [0, 3]], keys=1, width=0)
    parts, rows = _parts(batch), _rows(batch)
    shifted = parts[1]._replace(offsets=parts[1].offsets + 1)
    plan = plan_from_host([parts[0], shifted], rows, np.array(batch.lengths, dtype=np.int64))
    assert plan is not None
    assert plan.expected is not None
    flat = torch.cat([parts[0].offsets, shifted.offsets])
    assert bool(flat.ne(plan.expected).any())


@pytest.mark.parametrize("micro_batches", [1, 16, 256])
@pytest.mark.parametrize("rows", [8, 1024, 16384])
def test_a_group_plan_is_one_upload_and_a_fixed_chain(rows: int, micro_batches: int) -> None:
    """On ``meta``: the plan from the offsets is 7 operations that launch a kernel (the upload, ``cat``,
    ``diff``, ``index_select``, ``cumsum``, ``index_select``, ``sub``; the element indices are 3 more,
    made when the first key moves), the one from the witness's lengths 1 (the upload), whatever B and M."""
    from property_tests.launches import meta_batch

    outs, indices = meta_batch(rows, micro_batches, keys=1)
    parts = check_parts([o["model_output"]["k0"] for o in outs], "k0")
    perm = torch.tensor([i for p in indices for i in p], dtype=torch.int64, device="cpu")
    call_rows = CallRows([len(p) for p in indices], perm)
    lengths = np.diff(np.asarray([0, *itertools.accumulate(int(p.values.shape[0]) for p in parts)]))
    restored = np.zeros(rows, dtype=np.int64)
    per_row = [
        np.full(len(p), n // max(1, len(p)), dtype=np.int64) for p, n in zip(indices, lengths, strict=True)
    ]
    for p, each in zip(indices, per_row, strict=True):
        restored[p] = each
    planners = (
        (lambda: plan_on_device(parts, call_rows), 7),
        (lambda: plan_from_host(parts, call_rows, restored), 1),
    )
    for plan_fn, launches in planners:
        with CountOps() as counter:
            plan = plan_fn()
        assert plan is not None
        launched = {op: n for op, n in counter.ops.items() if not any(v in op for v in _VIEWS)}
        assert sum(launched.values()) == launches, launched


#: Operations that launch nothing: views and slices of a tensor, a host array taken as a tensor.
_VIEWS = ("slice", "view", "select.int", "alias", "as_strided", "lift_fresh", "detach")


def test_a_read_only_witness_array_is_planned_from_without_a_warning() -> None:
    """The caller's read-only int64 witness (warnings are errors here): planned from as any other."""
    batch = Batch([2, 3, 1, 4], [[1, 2], [0, 3]], keys=1, width=0)
    witness = np.array(batch.lengths, dtype=np.int64)
    witness.flags.writeable = False
    outs = [{"model_output": {"k0": o["model_output"]["k0"]}} for o in batch.outs]
    want = torch_impl.postprocess_batch(outs, batch.partitions, witness=batch.lengths)
    with torch_impl.use_settings(plan_on_device=True):
        assert_same(torch_impl.postprocess_batch(outs, batch.partitions, witness=witness), want)


def test_offsets_compared_with_the_witness_are_not_counted_as_trusted() -> None:
    """On fake CUDA: three keys on one offsets tensor, planned from the witness's lengths (their offsets
    compared), count no trusted offsets; without a witness each key's are counted; the CPU's, checked
    under ``plan_on_device``, are not."""
    from property_tests.fakecuda import FakeCuda, fake_like

    batch = Batch([2, 3, 1, 4], [[1, 2], [0, 3]], keys=3, width=0)
    outs = [
        {"model_output": {k: v for k, v in o["model_output"].items() if k != "dense"}} for o in batch.outs
    ]

    def trusted(witness: list[int] | None, fake: bool) -> int:
        torch_impl.witness_stats(reset=True)
        fc = FakeCuda()
        moved = fake_like(outs, fc) if fake else outs
        with fc if fake else torch_impl.use_settings(plan_on_device=True):
            torch_impl.postprocess_batch(moved, batch.partitions, witness=witness)
        return torch_impl.witness_stats(reset=True).get("skipped_device_offsets", 0)

    assert trusted(batch.lengths, fake=True) == 0
    assert trusted(None, fake=True) == 3
    assert trusted(None, fake=False) == 0


def test_areals_witness_names_the_misalignment_with_cu_seqlens_on_two_devices() -> None:
    """AReaL's ``cu_seqlens``, one micro-batch's on the (fake) device and one on the host: the check's
    error path reads both (moved to one device) and names the micro-batch."""
    import types

    from property_tests.fakecuda import FakeCuda, fake_like
    from torch_impl.integrations import areal

    fc = FakeCuda()
    on_device = fake_like(torch.tensor([0, 2, 5], device="cpu"), fc)
    mb_list = types.SimpleNamespace(mbs=[{"cu_seqlens": on_device}, {"cu_seqlens": torch.tensor([0, 4])}])
    with fc, pytest.raises(errors.MisalignmentError, match="micro-batch 1: its output holds 9 values"):
        areal._check_micro_batches(mb_list, [2, 3, 4], [2, 3, 4], [0, 1, 2], [5, 9])
