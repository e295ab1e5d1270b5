"""What a GPU would refuse fails on the CPU: torch's documented nondeterministic operations as data
(`property_tests.nondeterministic`, checked against torch's own docstring), and the fake-CUDA trace
(`property_tests.fakecuda`) shown to catch each defect a kernel could bring: a device read, a host index
tensor meeting device data, an operation refused under deterministic mode. Also: with a non-CPU default
device (``torch.set_default_device("meta")``, as a trainer may set ``"cuda"``) every call gives its result on
the inputs' device, the CPU's bit for bit, and every factory call of ``torch_impl`` names its device."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import torch_impl
from property_tests.compare import first_difference
from property_tests.device_calls import CALLS, tensors_of
from property_tests.fakecuda import FakeCuda, MixedDevices, Refused, fake_like
from property_tests.kernels import KERNELS, forced
from property_tests.nondeterministic import REFUSED, SWITCHED
from ref._torch_private import tree_map
from torch_impl import _kernels


@pytest.fixture
def deterministic() -> Iterator[None]:
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(was)


def test_the_lists_are_torchs_documented_ones() -> None:
    """Every entry names a function the installed torch's ``use_deterministic_algorithms`` documents."""
    doc = torch.use_deterministic_algorithms.__doc__ or ""
    switched, refused = doc.split("operations will throw a")
    switched = switched.split("act\n    deterministically")[1]
    for rule in REFUSED:
        assert f"`{rule.documented}`" in refused.split("In addition")[0], rule.documented
    for rule in SWITCHED:
        assert f"`{rule.documented}`" in switched, rule.documented


def _with_kernel(monkeypatch: pytest.MonkeyPatch, run: Callable[[Any], torch.Tensor]) -> None:
    """``element_indices`` replaced by ``run`` (a defective kernel) in the registry."""
    original = torch_impl.KERNELS["element_indices"]
    monkeypatch.setitem(_kernels.KERNELS, "element_indices", original._replace(run=run))


def _traced(name: str = "verl.postprocess_batch_func") -> FakeCuda:
    fc = FakeCuda()
    call, _ = CALLS[name](lambda x: fake_like(x, fc), 16)
    with fc:
        call()
    return fc


def test_a_device_read_in_a_kernel_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = torch_impl.KERNELS["element_indices"].run

    def reads(plan: Any) -> torch.Tensor:
        out = original(plan)
        int(out.sum().item())  # the defect: a synchronisation on a GPU
        return out

    assert _traced().trace().syncs == 0
    _with_kernel(monkeypatch, reads)
    trace = _traced().trace()
    assert trace.syncs == 1
    assert "aten._local_scalar_dense.default" in trace.reads[0]


def test_a_host_index_tensor_in_a_kernel_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = torch_impl.KERNELS["element_indices"].run

    def host_index(plan: Any) -> torch.Tensor:
        out = original(plan)
        return out.index_select(0, torch.arange(out.shape[0], device="cpu"))  # the defect: a host index

    _with_kernel(monkeypatch, host_index)
    with pytest.raises(MixedDevices, match=r"aten.index_select.default mixes host and device tensors"):
        _traced()


def test_an_operation_refused_under_deterministic_mode_is_caught(
    monkeypatch: pytest.MonkeyPatch, deterministic: None
) -> None:
    original = torch_impl.KERNELS["element_indices"].run

    def refused(plan: Any) -> torch.Tensor:
        return original(plan).cumsum(0)  # the defect: a floating-point cumsum, refused on CUDA

    _traced()  # the kernel as it is: nothing refused
    _with_kernel(monkeypatch, refused)
    with pytest.raises(Refused, match=r"aten.cumsum.default: torch.cumsum .* is refused"):
        _traced()
    torch.use_deterministic_algorithms(False)
    assert _traced().trace().refused  # recorded, not raised, with the mode off


def _on_meta(x: Any) -> Any:
    return tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, x)


@pytest.mark.parametrize("inputs", ["cpu", "meta"])
@pytest.mark.parametrize("name", list(CALLS))
def test_a_non_cpu_default_device_changes_nothing(name: str, inputs: str) -> None:
    """With ``torch.set_default_device("meta")``, each call gives what it gives without, on its inputs'
    device (the CPU's results bit for bit); what needs data on ``meta`` refuses it either way."""
    move = (lambda x: x) if inputs == "cpu" else _on_meta

    call, _ = CALLS[name](move, 16)

    def run(default: str | None) -> Any:
        torch.set_default_device(default)
        try:
            return call()
        except torch_impl.errors.UnsupportedSettingError as err:
            return type(err)
        finally:
            torch.set_default_device(None)

    want, got = run(None), run("meta")
    if isinstance(want, type):
        assert got is want
        return
    for a, b in zip(tensors_of(got), tensors_of(want), strict=True):
        assert a.device == b.device
        if inputs == "cpu":
            assert first_difference(a, b) is None


@pytest.mark.parametrize("path", list(KERNELS))
def test_every_kernel_with_a_non_cpu_default_device(path: str) -> None:
    call, _ = CALLS["verl.postprocess_batch_func+witness"](lambda x: x, 16)
    with forced(path):
        want = call()
        torch.set_default_device("meta")
        try:
            got = call()
        finally:
            torch.set_default_device(None)
    for a, b in zip(tensors_of(got), tensors_of(want), strict=True):
        assert first_difference(a, b) is None


_FACTORIES = {
    "tensor",
    "as_tensor",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "randn",
    "rand",
    "empty_strided",
}


def test_every_factory_call_in_torch_impl_names_its_device() -> None:
    """``torch.zeros(...)`` and the like without ``device=`` allocate on the default device."""
    root = pathlib.Path(torch_impl.__file__).parent
    unnamed = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in _FACTORIES
                and isinstance(func.value, ast.Name)
                and func.value.id == "torch"
                and not any(k.arg == "device" for k in node.keywords)
            ):
                unnamed.append(f"{path.relative_to(root)}:{node.lineno}: torch.{func.attr}")
    assert unnamed == []


def test_a_failed_conversion_is_not_taken_for_a_bad_index() -> None:
    """Under a fake-tensor mode the host buffer cannot be read: that failure is re-raised as it is, not
    reported as an index out of int64's range (nor a bare ``next()``'s StopIteration)."""
    from ref._torch_private import FakeTensorMode

    assert torch_impl.flatten_partitions([[1, 0]], 2).tolist() == [1, 0]  # outside the mode: as ever
    with FakeTensorMode(), pytest.raises(RuntimeError) as caught:
        torch_impl.flatten_partitions([[1, 0]], 2)
    assert not isinstance(caught.value, torch_impl.errors.RebatchError)
    with pytest.raises(torch_impl.errors.NotAPermutationError, match="index 18446744073709551615"):
        torch_impl.flatten_partitions([[0, 2**64 - 1]], 2)
