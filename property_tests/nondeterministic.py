"""The operations torch documents as nondeterministic on CUDA, as data: what
``torch.use_deterministic_algorithms(
True)`` (verl's ``enable_full_determinism`` sets it) refuses on a GPU, and what it swaps for a deterministic
algorithm there, release by release.

Source: the docstring of ``torch.use_deterministic_algorithms`` (the torch documentation page
`SOURCE`), its lists: "will throw a RuntimeError when mode=True" and, up to torch 2.12, the cuBLAS
operations that throw without ``CUBLAS_WORKSPACE_CONFIG`` (`REFUSED`), and "will act deterministically
when mode=True" (`SWITCHED`). Each entry names the documented function, the ATen operations it
dispatches to, the documented condition as a predicate of one traced operation (`Op`), and the torch
releases whose docstring lists it (`Rule.since`, `Rule.until`: major.minor, None open), checked against
the installed torch's docstring by ``tests/test_deterministic.py``, one test an entry. `refusal` and
`switch` answer for the installed torch's release (or the one given). On a CPU the refusals of CUDA never
fire; `refusal` lets a trace made with fake CUDA tensors (`property_tests.fakecuda`) fail on the CPU where
a GPU would.

The releases recorded were read from the docstrings of torch 2.9.1, 2.13.0 and 2.14.1 (`CHECKED`); an
entry that changed between two of them (2.10 to 2.12 unread) is recorded at the later one.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

__all__ = [
    "CHECKED",
    "CUBLAS_DETERMINISTIC",
    "INSTALLED",
    "REFUSED",
    "SOURCE",
    "SWITCHED",
    "Op",
    "Rule",
    "listed",
    "refusal",
    "release",
    "switch",
]

SOURCE = "https://pytorch.org/docs/stable/generated/torch.use_deterministic_algorithms.html"
#: The torch releases whose docstrings the releases of each entry were read from.
CHECKED = ("2.9.1", "2.13.0", "2.14.1")
#: The values of ``CUBLAS_WORKSPACE_CONFIG`` under which cuBLAS is deterministic (torch up to 2.12).
CUBLAS_DETERMINISTIC = frozenset({":4096:8", ":16:8"})


def release(version: str) -> tuple[int, int]:
    """``(2, 14)`` of ``"2.14.1+cu130"`` or ``"2.14"``: the release a docstring belongs to (major.minor)."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


#: The installed torch's release.
INSTALLED = release(torch.__version__)


class Op(NamedTuple):
    """One traced operation: its ATen name (``aten.cumsum.default``), its tensor arguments, its keyword
    and positional arguments."""

    name: str
    tensors: list[torch.Tensor]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    @property
    def packet(self) -> str:
        """``cumsum`` of ``aten.cumsum.out``."""
        return self.name.split(".")[1] if self.name.startswith("aten.") else self.name

    @property
    def on_cuda(self) -> bool:
        return any(t.device.type == "cuda" for t in self.tensors)

    @property
    def differentiated(self) -> bool:
        return any(t.requires_grad for t in self.tensors)

    @property
    def floating(self) -> bool:
        first = self.tensors[0] if self.tensors else None
        dtype = self.kwargs.get("dtype") or (first.dtype if first is not None else None)
        return dtype is not None and (dtype.is_floating_point or dtype.is_complex)

    def arg(self, name: str, position: int, default: Any = None) -> Any:
        if name in self.kwargs:
            return self.kwargs[name]
        return self.args[position] if len(self.args) > position else default


class Rule(NamedTuple):
    """A documented entry: the function as the docs name it, its ATen packets, the condition, and the
    releases that document it: from ``since`` (None: every release the kit knows) up to, not including,
    ``until`` (None: still documented), each ``"major.minor"``."""

    documented: str
    packets: frozenset[str]
    condition: str
    applies: Callable[[Op], bool]
    since: str | None = None
    until: str | None = None

    def documented_in(self, version: str | tuple[int, int] = INSTALLED) -> bool:
        """Whether torch's docstring of ``version`` (``"2.14.1"``, ``(2, 14)``) lists this entry."""
        at = release(version) if isinstance(version, str) else version
        after_start = self.since is None or at >= release(self.since)
        before_end = self.until is None or at < release(self.until)
        return after_start and before_end

    @property
    def releases(self) -> str:
        """The releases that document it, in words: ``"torch < 2.14"``, ``"torch >= 2.14"``, ``"every
        torch"``."""
        bounds = [f">= {self.since}"] if self.since else []
        bounds += [f"< {self.until}"] if self.until else []
        return f"torch {', '.join(bounds)}" if bounds else "every torch"


def _rule(
    documented: str,
    packets: str,
    condition: str,
    applies: Callable[[Op], bool],
    *,
    since: str | None = None,
    until: str | None = None,
) -> Rule:
    return Rule(documented, frozenset(packets.split()), condition, applies, since, until)


_cuda: Callable[[Op], bool] = lambda op: op.on_cuda  # noqa: E731
_grad: Callable[[Op], bool] = lambda op: op.on_cuda and op.differentiated  # noqa: E731
_always: Callable[[Op], bool] = lambda op: True  # noqa: E731
_floating: Callable[[Op], bool] = lambda op: op.on_cuda and op.floating  # noqa: E731


def _cublas(op: Op) -> bool:
    """On CUDA, ``CUBLAS_WORKSPACE_CONFIG`` unset or other than `CUBLAS_DETERMINISTIC` (read at the call)."""
    return op.on_cuda and os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in CUBLAS_DETERMINISTIC


#: The first release (major.minor) that no longer lists an entry that left a list, or lists a new one.
_CUMSUM_SWITCHED = "2.14"
_MAX_POOL3D_SWITCHED = "2.13"
_KTHVALUE_DETERMINISTIC = "2.13"
_CUBLAS_CHECK_REMOVED = "2.13"
_EMBEDDING_LISTED = "2.14"
_MAX_POOL3D = "max_pool3d_with_indices max_pool3d_with_indices_backward"
_CUMSUM = "cumsum cumsum_"
_CUMSUM_CONDITION = "on CUDA, floating point or complex"
_CUBLAS_CONDITION = "on CUDA, CUBLAS_WORKSPACE_CONFIG neither :4096:8 nor :16:8"

#: Refused on CUDA under deterministic mode (a RuntimeError on the GPU).
REFUSED: tuple[Rule, ...] = (
    _rule("torch.nn.AvgPool3d", "avg_pool3d avg_pool3d_backward", "differentiated on CUDA", _grad),
    _rule("torch.nn.MaxPool3d", _MAX_POOL3D, "differentiated on CUDA", _grad, until=_MAX_POOL3D_SWITCHED),
    _rule(
        "torch.nn.AdaptiveAvgPool2d",
        "_adaptive_avg_pool2d _adaptive_avg_pool2d_backward",
        "differentiated",
        _grad,
    ),
    _rule(
        "torch.nn.AdaptiveAvgPool3d",
        "_adaptive_avg_pool3d _adaptive_avg_pool3d_backward",
        "differentiated",
        _grad,
    ),
    _rule(
        "torch.nn.AdaptiveMaxPool2d",
        "adaptive_max_pool2d adaptive_max_pool2d_backward",
        "differentiated",
        _grad,
    ),
    _rule(
        "torch.nn.FractionalMaxPool2d", "fractional_max_pool2d fractional_max_pool2d_backward", "diff.", _grad
    ),
    _rule(
        "torch.nn.FractionalMaxPool3d", "fractional_max_pool3d fractional_max_pool3d_backward", "diff.", _grad
    ),
    _rule("torch.nn.MaxUnpool1d", "max_unpool1d", "always", _always),
    _rule("torch.nn.MaxUnpool2d", "max_unpool2d", "always", _always),
    _rule("torch.nn.MaxUnpool3d", "max_unpool3d", "always", _always),
    _rule(
        "torch.nn.functional.interpolate",
        "upsample_linear1d upsample_bilinear2d upsample_bicubic2d upsample_trilinear3d "
        "upsample_linear1d_backward upsample_bilinear2d_backward upsample_bicubic2d_backward "
        "upsample_trilinear3d_backward",
        "differentiated on CUDA (linear, bilinear, bicubic, trilinear)",
        _grad,
    ),
    _rule("torch.nn.ReflectionPad1d", "reflection_pad1d reflection_pad1d_backward", "differentiated", _grad),
    _rule("torch.nn.ReflectionPad2d", "reflection_pad2d reflection_pad2d_backward", "differentiated", _grad),
    _rule("torch.nn.ReflectionPad3d", "reflection_pad3d reflection_pad3d_backward", "differentiated", _grad),
    _rule("torch.nn.NLLLoss", "nll_loss nll_loss_forward nll_loss2d nll_loss2d_forward", "on CUDA", _cuda),
    _rule("torch.nn.CTCLoss", "_ctc_loss _ctc_loss_backward", "differentiated on CUDA", _grad),
    _rule(
        "torch.nn.EmbeddingBag",
        "_embedding_bag _embedding_bag_backward",
        "differentiated on CUDA with mode='max'",
        lambda op: _grad(op) and op.arg("mode", 4, 0) in (2, "max"),
    ),
    _rule(
        "torch.Tensor.put_",
        "put_ put",
        "accumulate=False, or accumulate=True on CUDA",
        lambda op: not op.arg("accumulate", 3, False) or op.on_cuda,
    ),
    _rule("torch.histc", "histc", "on CUDA", _cuda),
    _rule(
        "torch.bincount",
        "bincount",
        "on CUDA with weights",
        lambda op: op.on_cuda and op.arg("weights", 1) is not None,
    ),
    _rule("torch.kthvalue", "kthvalue", "on CUDA", _cuda, until=_KTHVALUE_DETERMINISTIC),
    _rule(
        "torch.median",
        "median",
        "with indices, on CUDA",
        lambda op: op.on_cuda and op.name != "aten.median.default",
    ),
    _rule(
        "torch.nn.functional.grid_sample", "grid_sampler_2d grid_sampler_3d", "differentiated on CUDA", _grad
    ),
    _rule("torch.cumsum", _CUMSUM, _CUMSUM_CONDITION, _floating, until=_CUMSUM_SWITCHED),
    _rule(
        "torch.Tensor.scatter_reduce",
        "scatter_reduce scatter_reduce_",
        "reduce='prod' on CUDA",
        lambda op: op.on_cuda and op.arg("reduce", 3) == "prod",
    ),
    _rule(
        "torch.Tensor.resize_",
        "resize_",
        "on a quantized tensor",
        lambda op: any(t.is_quantized for t in op.tensors if not t.is_nested),
    ),
    # the cuBLAS operations its own paragraph lists (a RuntimeError without a deterministic workspace)
    _rule("torch.mm", "mm", _CUBLAS_CONDITION, _cublas, until=_CUBLAS_CHECK_REMOVED),
    _rule("torch.mv", "mv", _CUBLAS_CONDITION, _cublas, until=_CUBLAS_CHECK_REMOVED),
    _rule("torch.bmm", "bmm", _CUBLAS_CONDITION, _cublas, until=_CUBLAS_CHECK_REMOVED),
)

#: Swapped for a deterministic algorithm on CUDA under deterministic mode (allowed; possibly slower).
SWITCHED: tuple[Rule, ...] = (
    _rule("torch.Tensor.index_put", "index_put index_put_ _index_put_impl_", "accumulate=False", _cuda),
    _rule("torch.Tensor.scatter_add_", "scatter_add scatter_add_", "on CUDA", _cuda),
    _rule("torch.gather", "gather", "on CUDA, requires grad", _grad),
    _rule("torch.index_add", "index_add index_add_", "on CUDA", _cuda),
    _rule("torch.index_select", "index_select", "differentiated on CUDA", _grad),
    _rule("torch.repeat_interleave", "repeat_interleave", "differentiated on CUDA", _grad),
    _rule("torch.Tensor.index_copy", "index_copy index_copy_", "on CPU or CUDA", _always),
    _rule("torch.Tensor.scatter", "scatter scatter_", "src a tensor, on CUDA", _cuda),
    _rule(
        "torch.Tensor.scatter_reduce",
        "scatter_reduce scatter_reduce_",
        "reduce='sum' or 'mean' on CUDA",
        lambda op: op.on_cuda and op.arg("reduce", 3) in ("sum", "mean"),
    ),
    _rule("torch.nn.MaxPool3d", _MAX_POOL3D, "differentiated on CUDA", _grad, since=_MAX_POOL3D_SWITCHED),
    _rule("torch.cumsum", _CUMSUM, _CUMSUM_CONDITION, _floating, since=_CUMSUM_SWITCHED),
    _rule(
        "torch.nn.Embedding",
        "embedding embedding_backward embedding_dense_backward",
        "differentiated on CUDA",
        _grad,
        since=_EMBEDDING_LISTED,
    ),
)


def listed(rules: tuple[Rule, ...], version: str | tuple[int, int] = INSTALLED) -> tuple[Rule, ...]:
    """The entries of ``rules`` (`REFUSED` or `SWITCHED`) that torch's docstring of ``version`` lists."""
    return tuple(r for r in rules if r.documented_in(version))


#: The two lists by the name `_index` caches them under.
_LISTS = {"refused": REFUSED, "switched": SWITCHED}


@functools.cache
def _index(kind: str, at: tuple[int, int]) -> dict[str, tuple[Rule, ...]]:
    """The entries of the list ``kind`` that release ``at`` documents, by ATen packet, in list order (a
    traced call looks each of its operations up)."""
    index: dict[str, list[Rule]] = {}
    for rule in listed(_LISTS[kind], at):
        for packet in rule.packets:
            index.setdefault(packet, []).append(rule)
    return {packet: tuple(rules) for packet, rules in index.items()}


def _first(kind: str, op: Op, version: str | tuple[int, int]) -> Rule | None:
    at = release(version) if isinstance(version, str) else version
    return next((r for r in _index(kind, at).get(op.packet, ()) if r.applies(op)), None)


def refusal(op: Op, version: str | tuple[int, int] = INSTALLED) -> str | None:
    """Why a GPU under deterministic mode refuses ``op`` (the documented entry and condition) on torch
    ``version`` (the installed one by default), or None."""
    rule = _first("refused", op, version)
    return None if rule is None else f"{op.name}: {rule.documented} ({rule.condition}) is refused ({SOURCE})"


def switch(op: Op, version: str | tuple[int, int] = INSTALLED) -> str | None:
    """The documented entry under which a GPU swaps ``op`` for a deterministic algorithm on torch
    ``version`` (the installed one by default), or None."""
    rule = _first("switched", op, version)
    return None if rule is None else rule.documented
