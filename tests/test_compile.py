"""``torch.compile`` (``fullgraph=False``, backends eager, aot_eager and inductor) runs every data path and
gives the eager result bit for bit (each public operation is one graph break); ``torch.func``
transforms get a clear `UnsupportedSettingError`."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torch_impl
from property_tests.compare import assert_same
from property_tests.kernels import KERNELS, forced
from ref import errors

INDICES = [[0, 2], [1]]


def _inputs(long: int = 300) -> tuple[torch.Tensor, ...]:
    """Two micro-batches' values and offsets (rows of ``long`` elements and more: row copies apply)."""
    g = torch.Generator().manual_seed(0)
    o0 = torch.tensor([0, long, 3 * long])
    o1 = torch.tensor([0, 2 * long])
    return (
        torch.randn(3 * long, generator=g),
        o0,
        torch.randn(2 * long, generator=g),
        o1,
        torch.randn(3, 4, generator=g),
    )


def _step(
    v0: torch.Tensor, o0: torch.Tensor, v1: torch.Tensor, o1: torch.Tensor, d: torch.Tensor
) -> list[Any]:
    """A model step: outputs made inside the graph, put back in order, used inside the graph again."""
    a = torch.nested.nested_tensor_from_jagged(v0 * 2, o0)
    b = torch.nested.nested_tensor_from_jagged(v1 * 2, o1)
    out = torch_impl.postprocess_batch(
        [{"model_output": {"x": a, "d": d[:2] + 1}}, {"model_output": {"x": b, "d": d[2:] + 1}}], INDICES
    )
    c = torch_impl.concat([a, b])
    in_order = torch_impl.restore(c, INDICES)
    taken = torch_impl.take(c, [2, 0])
    pieces = torch_impl.split(c, [[1], [0, 2]])
    plain = torch_impl.postprocess_batch(
        [{"model_output": {"x": a}}, {"model_output": {"x": b}}], None, use_dynamic_bsz=False
    )
    return [
        out["model_output"]["x"].values() + 1,
        out["model_output"]["d"] * 3,
        in_order.values(),
        taken.values(),
        pieces[1].values(),
        plain["model_output"]["x"].values(),
    ]


# torch's own warnings on the way into inductor (nothing of rebatch's)
@pytest.mark.filterwarnings("ignore:NestedTensor does not implement _stable_hash_for_caching:UserWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compiled_step_takes_every_path_and_matches_eager(backend: str) -> None:
    torch.compiler.reset()
    compiled = torch.compile(_step, backend=backend, fullgraph=False)
    x = _inputs()
    for path in KERNELS:
        with forced(path):
            assert_same(compiled(*x), _step(*x))


def _grad_of_postprocess(values: torch.Tensor) -> torch.Tensor:
    a = torch.nested.nested_tensor_from_jagged(values[:5], torch.tensor([0, 2, 5]))
    b = torch.nested.nested_tensor_from_jagged(values[5:] * 2, torch.tensor([0, 3]))
    out = torch_impl.postprocess_batch([{"model_output": {"x": a}}, {"model_output": {"x": b}}], INDICES)
    return out["model_output"]["x"].values().sum()


def test_torch_func_grad_is_refused_clearly() -> None:
    """Dense outputs, so that the call itself meets the transform (torch cannot build a jagged tensor from
    a transformed one at all: that fails before rebatch is called, whatever test ran before)."""

    def f(values: torch.Tensor) -> torch.Tensor:
        outs = [{"model_output": {"x": values[:2]}}, {"model_output": {"x": values[2:]}}]
        return torch_impl.postprocess_batch(outs, INDICES)["model_output"]["x"].sum()

    with pytest.raises(
        errors.UnsupportedSettingError, match=r"postprocess_batch is not supported under a torch\.func"
    ):
        torch.func.grad(f)(torch.arange(3.0))


#: every public entry point of torch_impl (each is `entry`-wrapped), with a valid call on ``x`` ``[3, 2, 4]``
ENTRY_POINTS: dict[str, Any] = {
    "concat": lambda x: torch_impl.concat([x]),
    "restore": lambda x: torch_impl.restore(x, [[1, 0], [2]]),
    "take": lambda x: torch_impl.take(x, [2, 0, 1]),
    "split": lambda x: torch_impl.split(x, [[1], [0, 2]])[0],
    "flatten_partitions": lambda x: torch_impl.flatten_partitions([[1], [0, 2]], 3) + x.sum(),
    "inverse_permutation": lambda x: torch_impl.inverse_permutation([1, 2, 0]) + x.sum(),
    "postprocess_batch": lambda x: torch_impl.postprocess_batch([{"model_output": {"x": x}}], [[1, 0, 2]])[
        "model_output"
    ]["x"],
    "postprocess_batch_func": lambda x: torch_impl.postprocess_batch_func(
        [{"model_output": {"x": x}}], [[1, 0, 2]], None
    )["model_output"]["x"],
}


@pytest.mark.parametrize("op", list(ENTRY_POINTS))
def test_torch_func_vmap_is_refused_clearly(op: str) -> None:
    """Each entry point refuses the transform itself and names itself (not only the function it calls)."""
    f = ENTRY_POINTS[op]
    f(torch.zeros(3, 2, 4))  # a valid call outside the transform
    with pytest.raises(errors.UnsupportedSettingError, match=rf"^{op} is not supported under a torch\.func"):
        torch.func.vmap(f)(torch.zeros(3, 2, 4))


def test_ordinary_autograd_still_reaches_every_micro_batch() -> None:
    values = torch.arange(8.0, requires_grad=True)
    (grad,) = torch.autograd.grad(_grad_of_postprocess(values), values)
    assert grad.tolist() == [1.0] * 5 + [2.0] * 3
