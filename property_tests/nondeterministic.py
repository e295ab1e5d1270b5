"""The operations torch documents as nondeterministic on CUDA, as data: what
``torch.use_deterministic_algorithms(
True)`` (verl's ``enable_full_determinism`` sets it) refuses on a GPU, and what it swaps for a deterministic
algorithm there.

Source: the docstring of ``torch.use_deterministic_algorithms`` (the torch documentation page
`SOURCE`), its two lists: "will throw a RuntimeError when mode=True" (`REFUSED`) and "will act
deterministically when mode=True" (`SWITCHED`). Each entry names the documented function (checked
against the installed torch's docstring by ``tests/test_deterministic.py``), the ATen operations it
dispatches to, and the documented condition as a predicate of one traced operation (`Op`). On a CPU
the refusals of CUDA never fire; `refusal` lets a trace made with fake CUDA tensors
(`property_tests.fakecuda`) fail on the CPU where a GPU would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

__all__ = ["REFUSED", "SOURCE", "SWITCHED", "Op", "Rule", "refusal", "switch"]

SOURCE = "https://pytorch.org/docs/stable/generated/torch.use_deterministic_algorithms.html"


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
    """A documented entry: the function as the docs name it, its ATen packets, the condition."""

    documented: str
    packets: frozenset[str]
    condition: str
    applies: Callable[[Op], bool]


def _rule(documented: str, packets: str, condition: str, applies: Callable[[Op], bool]) -> Rule:
    return Rule(documented, frozenset(packets.split()), condition, applies)


_cuda: Callable[[Op], bool] = lambda op: op.on_cuda  # noqa: E731
_grad: Callable[[Op], bool] = lambda op: op.on_cuda and op.differentiated  # noqa: E731
_always: Callable[[Op], bool] = lambda op: True  # noqa: E731

#: Refused on CUDA under deterministic mode (a RuntimeError on the GPU).
REFUSED: tuple[Rule, ...] = (
    _rule("torch.nn.AvgPool3d", "avg_pool3d avg_pool3d_backward", "differentiated on CUDA", _grad),
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
    _rule(
        "torch.median",
        "median",
        "with indices, on CUDA",
        lambda op: op.on_cuda and op.name != "aten.median.default",
    ),
    _rule(
        "torch.nn.functional.grid_sample", "grid_sampler_2d grid_sampler_3d", "differentiated on CUDA", _grad
    ),
    _rule(
        "torch.cumsum",
        "cumsum cumsum_",
        "on CUDA, floating point or complex",
        lambda op: op.on_cuda and op.floating,
    ),
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
)


def _first(rules: tuple[Rule, ...], op: Op) -> Rule | None:
    return next((r for r in rules if op.packet in r.packets and r.applies(op)), None)


def refusal(op: Op) -> str | None:
    """Why a GPU under deterministic mode refuses ``op`` (the documented entry and condition), or None."""
    rule = _first(REFUSED, op)
    return None if rule is None else f"{op.name}: {rule.documented} ({rule.condition}) is refused ({SOURCE})"


def switch(op: Op) -> str | None:
    """The documented entry under which a GPU swaps ``op`` for a deterministic algorithm, or None."""
    rule = _first(SWITCHED, op)
    return None if rule is None else rule.documented
