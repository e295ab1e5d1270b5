"""The CUDA path without a GPU: every drop-in and public call traced on fake CUDA tensors
(`property_tests.fakecuda`), with what each trainer keeps on the host left there. A call reads no device
data beyond its documented reads, never meets a host tensor with a device one, chooses the kernel the
``meta`` device (the other non-CPU device) chooses, and puts its results on the inputs' device; each
kernel of the registry, forced, does the same."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torch_impl
from property_tests.device_calls import CALLS, host_batch, tensors_of
from property_tests.fakecuda import FakeCuda, Trace, fake_like
from property_tests.kernels import ANYWHERE, KERNELS, forced
from ref.errors import UnsupportedSettingError
from torch_impl._jagged import cached_seqlens
from torch_impl.testing import kernel_choices, tree_leaves, tree_map

#: The host-device synchronisations each call makes by design (all others: none).
DOCUMENTED_SYNCS = {
    "verl.postprocess_batch_func+witness": 1,  # the alignment witness's verdict (docs/witness.md)
    "verl.postprocess_batch_func+witness,5 keys": 1,  # every key's flag read at once
    "areal.reorder_and_pad_outputs": 1,  # the witness: each micro-batch's cu_seqlens against the lengths
    "torch_impl.to_padded": 1,  # the longest row sizes the result (its docstring)
    "torch_impl.split": 1,  # each micro-batch's number of values sizes its piece
    "torch_impl.split+TensorDict": 2,  # the same, once an offsets tensor (an equal copy is read apart)
}
#: The registry's kernels that apply off the CPU.
DEVICE_KERNELS = {"concat", "element_indices", "index_rows"}


def fake_trace(name: str, b: int) -> tuple[Any, Trace, str]:
    fc = FakeCuda()
    call, where = CALLS[name](lambda x: fake_like(x, fc), b)
    with fc:
        result = call()
    return result, fc.trace(), where


def meta_kernels(name: str, b: int) -> list[str] | None:
    """The kernels chosen on ``meta``; None for a call that needs data, which ``meta`` refuses."""
    fc = FakeCuda()  # its kernel record only: the call runs on ``meta``
    call, _ = CALLS[name](
        lambda x: tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, x), b
    )
    try:
        with kernel_choices(fc.record_kernel):
            call()
    except torch_impl.errors.UnsupportedSettingError as err:
        if "meta" not in str(err):
            raise
        return None
    return fc.kernels


@pytest.mark.parametrize("b", [8, 1024])
@pytest.mark.parametrize("name", list(CALLS))
def test_every_call_on_fake_cuda(name: str, b: int) -> None:
    result, trace, where = fake_trace(name, b)
    assert trace.mixed == []
    assert trace.syncs == DOCUMENTED_SYNCS.get(name, 0), trace.reads
    devices = {t.device.type for t in tensors_of(result)}
    assert devices <= {"cuda" if where == "in" else where}, devices
    assert set(trace.kernels) <= DEVICE_KERNELS
    assert trace.kernels == (meta_kernels(name, b) or trace.kernels)
    if where == "in":
        assert trace.launches, "the call launched nothing on the device"


@pytest.mark.parametrize("name", list(CALLS))
def test_deterministic_mode_refuses_nothing(name: str) -> None:
    """Under ``torch.use_deterministic_algorithms(True)`` (verl's ``enable_full_determinism``): on fake
    CUDA no traced operation is on torch's refused list, and on the CPU the call runs for real."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        _, trace, _ = fake_trace(name, 64)
        call, _ = CALLS[name](lambda x: x, 64)
        call()
    finally:
        torch.use_deterministic_algorithms(was)
    assert trace.refused == []


@pytest.mark.parametrize("drop_in", [False, True])
@pytest.mark.parametrize("path", list(KERNELS))
def test_every_kernel_on_fake_cuda(path: str, drop_in: bool) -> None:
    """Each kernel of the registry forced: no read beyond the witness's, no mixed devices, nothing
    refused under deterministic mode, the CPU's shapes, on the device."""
    kernel = torch_impl.KERNELS[KERNELS[path]["kernel"]]
    name = "verl.postprocess_batch_func+witness" if drop_in else "verl.postprocess_batch_func"
    if not kernel.permutes and not drop_in:
        name = "torch_impl.concat"  # the parts laid end to end: where a non-permuting kernel serves
    if path not in ANYWHERE:  # a host kernel forced on device keys raises, typed: it never steps aside
        with forced(path), pytest.raises(UnsupportedSettingError, match="kernel"):
            fake_trace(name, 64)
        return
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with forced(path):
            result, trace, _ = fake_trace(name, 64)
            call, _ = CALLS[name](lambda x: x, 64)
            expected = call()
    finally:
        torch.use_deterministic_algorithms(was)
    assert (trace.syncs, trace.mixed, trace.refused) == (DOCUMENTED_SYNCS.get(name, 0), [], [])
    got, want = tensors_of(result), tensors_of(expected)
    assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in want]
    assert {t.device.type for t in got} == {"cuda"}
    if kernel.name in DEVICE_KERNELS and (kernel.permutes or not drop_in):
        assert kernel.name in trace.kernels
    assert set(trace.kernels) <= DEVICE_KERNELS


def test_the_outputs_and_the_host_data_stay_where_the_trainer_put_them() -> None:
    """verl's ``data`` (the witness) on the host, the outputs on the device: one read, the witness's
    lengths carried to the device inside the plan's one upload (`torch_impl._devplan.plan_from_host`: no
    host-to-device copy more than without it) rather than the outputs to the host."""
    _, trace, _ = fake_trace("verl.postprocess_batch_func+witness", 16)
    _, plain, _ = fake_trace("verl.postprocess_batch_func", 16)
    assert trace.ops.count("aten._to_copy.default") == plain.ops.count("aten._to_copy.default")
    assert trace.syncs == 1
    assert host_batch(16)[0][0][0] == 15  # rows in reverse order: the permutation is not the identity


def test_a_device_result_caches_the_judged_witness_sizes() -> None:
    """Off the CPU a result's cached sizes (what ``to_padded_tensor()`` pads to) come from the host witness
    once the witness has judged the call (no device read), as the CPU's come from its lengths; without a
    witness there is nothing on the host to take them from (docs/kernels.md)."""
    for name in ("verl.postprocess_batch_func+witness", "verl.postprocess_batch_func+witness,5 keys"):
        result, trace, _ = fake_trace(name, 64)
        call, _ = CALLS[name](lambda x: x, 64)
        got = [cached_seqlens([t]) for t in _nested(result)]
        want = [cached_seqlens([t]) for t in _nested(call())]
        assert got == want
        assert None not in got
        assert trace.syncs == DOCUMENTED_SYNCS[name]
    result, _, _ = fake_trace("verl.postprocess_batch_func", 64)
    assert None in [cached_seqlens([t]) for t in _nested(result)]  # an output that caches none: none to carry


def _nested(result: Any) -> list[torch.Tensor]:
    """The nested tensors of a call's result, in order."""
    leaves = tree_leaves(dict(result) if isinstance(result, dict) else result)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.is_nested]
