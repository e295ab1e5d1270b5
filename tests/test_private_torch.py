"""Every private torch API rebatch uses, listed in ``docs/architecture.md`` ("Private torch APIs") and each
checked here for what rebatch relies on, on every torch of CI (torch 2.13 here; torch 2.9.1 in verl's pins
environment, which runs this file too): a torch release that changes one fails here, not in a trainer.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
#: A private torch name in code (a module or function under ``torch._`` or ``torch.nested._internal``).
_PRIVATE = re.compile(r"torch\.(?:_[A-Za-z]\w*|nested\._internal)(?:\.\w+)*")
#: A private attribute of a jagged nested tensor read by rebatch.
_ATTRIBUTE = re.compile(r"\._(values|offsets|lengths|ragged_idx|max_seqlen|min_seqlen|metadata_cache)\b")


def _doc_section() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## Private torch APIs")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def _uses() -> dict[str, set[str]]:
    """Each private name used in torch_impl/, rebatch/ and rebatch_startup/ code -> the files using it."""
    found: dict[str, set[str]] = {}
    for package in ("torch_impl", "rebatch", "rebatch_startup"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line in path.read_text().splitlines():
                code = line.split("#", 1)[0]
                names = [m.group(0) for m in _PRIVATE.finditer(line)]  # a pickle name may sit in a string
                names += [f"NestedTensor._{m.group(1)}" for m in _ATTRIBUTE.finditer(code)]
                for name in names:
                    found.setdefault(name, set()).add(rel)
    return found


def test_every_private_torch_api_used_is_listed_in_the_architecture() -> None:
    section = _doc_section()
    missing = {name: sorted(files) for name, files in _uses().items() if f"`{name}`" not in section}
    assert not missing, f"private torch APIs used but not in docs/architecture.md: {missing}"


def _jagged(lengths: list[int], *, holes: bool = False) -> torch.Tensor:
    values = torch.arange(float(sum(lengths) + 2))
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    if holes:
        return torch.nested.nested_tensor_from_jagged(values, offsets, lengths=torch.tensor(lengths))
    return torch.nested.nested_tensor_from_jagged(values[: sum(lengths)], offsets)


def test_nested_tensor_class_and_attributes() -> None:
    """``torch.nested._internal.nested_tensor.NestedTensor``: the class of every jagged tensor, whose
    ``_values``, ``_offsets``, ``_lengths`` and ``_ragged_idx`` are what the public accessors return."""
    from torch.nested._internal.nested_tensor import NestedTensor

    from torch_impl._parts import NestedTensor as Ours

    assert Ours is NestedTensor
    for x in (
        _jagged([2, 0, 3]),
        torch.nested.as_nested_tensor([torch.ones(2), torch.ones(1)], layout=torch.jagged),
    ):
        assert type(x) is NestedTensor
        assert x._ragged_idx == 1
        assert x._lengths is None
        assert x._values is x.values() or torch.equal(x._values, x.values())
        assert torch.equal(x._offsets, x.offsets())
    holed = _jagged([2, 1], holes=True)
    assert holed._lengths is not None
    assert torch.equal(holed._lengths, holed.lengths())
    assert (
        torch.nested.nested_tensor_from_jagged(torch.ones(3, 2, 4), torch.tensor([0, 1, 3]))._ragged_idx == 1
    )


def test_disable_torch_function_subclass_keeps_what_is_read() -> None:
    """``torch._C.DisableTorchFunctionSubclass``: a context manager under which a jagged tensor's
    attributes read the same (only without the subclass's per-read dispatch)."""
    x = _jagged([2, 0, 3])
    with torch._C.DisableTorchFunctionSubclass():
        inside = (x._values, x._offsets, x._ragged_idx, x.requires_grad, x.dtype, x.device)
    assert inside == (x._values, x._offsets, x._ragged_idx, x.requires_grad, x.dtype, x.device)


def test_functorch_level_tells_a_transform_apart() -> None:
    """``torch._C._functorch.maybe_current_level``: None outside a ``torch.func`` transform, a level
    inside one (what `torch_impl._entry.check_no_functorch` refuses)."""
    assert torch._C._functorch.maybe_current_level() is None
    levels: list[object] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        levels.append(torch._C._functorch.maybe_current_level())
        return x.sum()

    torch.func.grad(f)(torch.ones(2))
    torch.func.vmap(f)(torch.ones(2, 2))
    assert len(levels) == 2
    assert all(level is not None for level in levels)


def test_the_internal_nested_view_is_the_public_constructors() -> None:
    """``torch.nested._internal.nested_tensor.nested_view_from_values_offsets_lengths``: present (the
    fallback, the public constructor, is never needed on CI's torches) and the same view."""
    from torch_impl import _jagged

    assert _jagged._nested_view is not None
    values, offsets = torch.arange(5.0), torch.tensor([0, 2, 2, 5])
    ours = _jagged.njt(values, offsets)
    theirs = torch.nested.nested_tensor_from_jagged(values, offsets)
    assert ours.values().data_ptr() == values.data_ptr()
    assert [r.tolist() for r in ours.unbind()] == [r.tolist() for r in theirs.unbind()]
    assert type(ours) is type(theirs)


@pytest.mark.parametrize(
    "name", sorted(n for n in importlib.import_module("rebatch.check").DUMP_GLOBALS if n.startswith("torch."))
)
def test_every_torch_name_of_the_dump_allowlist_exists(name: str) -> None:
    """The torch names `rebatch.check` allows in a dump (pickle names: private modules among them) exist on
    this torch; `rebatch.check` skips one a release lacks, so a missing one would silently refuse dumps."""
    module, _, attr = name.rpartition(".")
    assert hasattr(importlib.import_module(module), attr)
