"""What a GPU would refuse fails on the CPU: torch's documented nondeterministic operations as data
(`property_tests.nondeterministic`, each entry checked against the installed torch's own docstring for
the releases it states, one test an entry), and the fake-CUDA trace
(`property_tests.fakecuda`) shown to catch each defect a kernel could bring: a device read, a host index
tensor meeting device data, an operation refused under deterministic mode. Also: with a non-CPU default
device (``torch.set_default_device("meta")``, as a trainer may set ``"cuda"``) every call gives its result on
the inputs' device, the CPU's bit for bit, and every factory call of ``torch_impl`` names its device."""

from __future__ import annotations

import ast
import pathlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import torch_impl
from property_tests.compare import first_difference
from property_tests.device_calls import CALLS, tensors_of
from property_tests.fakecuda import FakeCuda, MixedDevices, Refused, fake_like
from property_tests.kernels import KERNELS, forced
from property_tests.nondeterministic import INSTALLED, REFUSED, SWITCHED, Op, Rule, refusal, release, switch
from ref._torch_private import tree_map
from torch_impl import _kernels


@pytest.fixture
def deterministic() -> Iterator[None]:
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(was)


#: The kit's lists by the name each test gives them.
LISTS: dict[str, tuple[Rule, ...]] = {"refused": REFUSED, "switched": SWITCHED}
#: Each list's name in `property_tests.nondeterministic`.
KIT_NAMES = {"refused": "REFUSED", "switched": "SWITCHED"}
#: The sentences of torch's docstring that open each list: the operations swapped for deterministic ones;
#: those that throw; (torch <= 2.12) the cuBLAS ones that throw without a deterministic workspace.
SWITCHED_HEAD = re.compile(r"will act\s+deterministically\s+when\s+``mode=True``")
REFUSED_HEAD = re.compile(r"will throw a\s+:class:`RuntimeError`\s+when\s+``mode=True``")
CUBLAS_HEAD = re.compile(r"will be raised from these operations")
#: A line of prose at the docstring's own indentation: where a list ends.
PROSE = re.compile(r"\n {0,4}[^\s*-]")
#: A list item's documented name: ``* :func:`torch.cumsum` when ...``.
ITEM = re.compile(r"^\s*\* :\w+:`([\w.]+)`", re.MULTILINE)
#: The installed torch's release, as a fact's message asks to record it.
RELEASE = "{}.{}".format(*INSTALLED)


def _items(doc: str, head: re.Pattern[str]) -> set[str]:
    """The names of the list that follows ``head`` in ``doc`` (none where ``doc`` lacks it)."""
    found = head.search(doc)
    if found is None:
        return set()
    rest = doc[found.end() :]
    rest = rest[rest.index("\n") :]
    end = PROSE.search(rest)
    return set(ITEM.findall(rest[: end.start() if end else len(rest)]))


def documented(doc: str) -> dict[str, set[str]]:
    """The names each list of a ``use_deterministic_algorithms`` docstring gives, by `LISTS`' names."""
    return {
        "refused": _items(doc, REFUSED_HEAD) | _items(doc, CUBLAS_HEAD),
        "switched": _items(doc, SWITCHED_HEAD),
    }


#: The installed torch's lists.
DOCUMENTED = documented(torch.use_deterministic_algorithms.__doc__ or "")


def moved(kind: str, rule: Rule, listed_now: bool) -> str:
    """What moved, on the installed torch, of ``rule`` of the list ``kind``, and what to record."""
    kit = KIT_NAMES[kind]
    if listed_now and rule.until is not None and release(rule.until) <= INSTALLED:
        what, record = "still documents", f"record the release it left {kit} later than {rule.until}"
    elif listed_now:
        what, record = "documents", f"record {RELEASE} as the release it entered {kit} (since={RELEASE!r})"
    elif rule.since is not None and release(rule.since) >= INSTALLED:
        what, record = "does not yet document", f"record its entry into {kit} later than {RELEASE}"
    else:
        what, record = "no longer documents", f"record {RELEASE} as the release it left {kit} (until="
        record += f"{RELEASE!r})"
    kit_says = f"the kit: {rule.releases}"
    return f"torch {torch.__version__} {what} {rule.documented} as {kind} ({kit_says}): {record}"


@pytest.mark.parametrize(
    ("kind", "rule"),
    [pytest.param(kind, rule, id=f"{kind}-{rule.documented}") for kind in LISTS for rule in LISTS[kind]],
)
def test_each_entry_is_documented_in_the_releases_it_states(kind: str, rule: Rule) -> None:
    """The installed torch's docstring lists the entry exactly where the kit says this release does: a new
    torch release fails the test of each entry that moved, saying what to record."""
    listed_now = rule.documented in DOCUMENTED[kind]
    assert listed_now == rule.documented_in(INSTALLED), moved(kind, rule, listed_now)


def test_every_refusal_torch_documents_is_an_entry() -> None:
    """`REFUSED` is complete: every operation the installed torch documents as refused is an entry
    (`SWITCHED` holds only the swaps a trace reports)."""
    new = sorted(DOCUMENTED["refused"] - {rule.documented for rule in REFUSED})
    assert not new, (
        f"torch {torch.__version__} documents {', '.join(new)} as refused and the kit has no entry for it: "
        f"add one to REFUSED with since={RELEASE!r}"
    )


def test_the_docstrings_lists_are_read() -> None:
    """The docstring's lists are found (a reworded heading would leave them empty and every entry moved)."""
    assert {"torch.histc", "torch.Tensor.resize_"} <= DOCUMENTED["refused"]
    assert {"torch.gather", "torch.Tensor.index_copy"} <= DOCUMENTED["switched"]
    assert not DOCUMENTED["refused"] & {"torch.gather", "torch.nn.Conv1d"}


def _cuda_op(name: str, dtype: torch.dtype) -> Op:
    """``name`` (``aten.cumsum.default``) of one fake CUDA tensor of ``dtype``."""
    tensor = fake_like(torch.ones(4, dtype=dtype), FakeCuda())
    return Op(name, [tensor], (tensor, 0), {})


def test_a_moved_entry_is_read_for_the_release_given() -> None:
    """A floating cumsum on CUDA: refused up to torch 2.13, swapped for a deterministic one from 2.14; an
    integer one neither; a histogram refused on every release."""
    cumsum = _cuda_op("aten.cumsum.default", torch.float32)
    for version in ("2.9.1", "2.13.0", "2.13"):
        assert refusal(cumsum, version) is not None, version
        assert switch(cumsum, version) is None, version
    assert refusal(cumsum, "2.14.1") is None
    assert switch(cumsum, "2.14.1+cu130") == "torch.cumsum"
    assert switch(cumsum, (2, 15)) == "torch.cumsum"
    for version in ("2.9.1", "2.13.0", "2.14.1"):
        assert refusal(_cuda_op("aten.cumsum.default", torch.int64), version) is None
        assert refusal(_cuda_op("aten.histc.default", torch.float32), version) is not None
    assert release("2.14.1+cu130") == (2, 14)


def test_a_trace_answers_for_the_installed_release() -> None:
    """A floating cumsum on fake CUDA is recorded refused, or swapped, as the installed torch documents it."""
    fc = FakeCuda()
    values = fake_like(torch.ones(4), fc)
    with fc:
        values.cumsum(0)
    trace = fc.trace()
    refused_now = "torch.cumsum" in DOCUMENTED["refused"]
    assert bool(trace.refused) == refused_now
    assert ("torch.cumsum" in trace.switched) == (not refused_now)


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
        out = original(plan)
        out.float().histc(bins=4)  # the defect: a histogram, refused on CUDA by every torch release
        return out

    _traced()  # the kernel as it is: nothing refused
    _with_kernel(monkeypatch, refused)
    with pytest.raises(Refused, match=r"aten.histc.default: torch.histc .* is refused"):
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
