"""A host kernel's result (`torch_impl._hostcopy._output`, issue 48 item 3) is an ordinary CPU tensor
for every use a trainer makes of it, each use compared with the same on a tensor from ``torch.empty``
(``docs/kernels.md``, "The result's memory": a NumPy array's memory was measured and retired); the one
difference, that its storage cannot grow, is stated there."""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import torch_impl
from property_tests.compare import assert_same, bits

ROWS, LENGTH = 64, 2**14 + 1  # 4 MiB of float32 values: a chunked host_scatter too


def _result(kernel: str) -> torch.Tensor:
    """A jagged key restored by a host kernel (4 MiB of values)."""
    values = torch.arange(ROWS * LENGTH, dtype=torch.float32)
    whole = torch_impl.from_packed(values, [LENGTH] * ROWS)
    parts = [[r for r in range(ROWS) if r % 2 == m] for m in (0, 1)]
    outs = [{"model_output": {"lp": piece}} for piece in torch_impl.split(whole, parts)]
    with torch_impl.use_settings(kernel=kernel):
        return torch_impl.postprocess_batch_func(outs, parts, None)["model_output"]["lp"]


@pytest.fixture(params=["host_rows_copy", "host_scatter"])
def result(request: Any) -> torch.Tensor:
    return _result(request.param)


def _ordinary(x: torch.Tensor) -> torch.Tensor:
    """The same values in a tensor from ``torch.empty``."""
    out = torch.empty(x.shape, dtype=x.dtype, device="cpu")
    out.copy_(x)
    return out


def _saved(x: torch.Tensor) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(x, buffer)
    buffer.seek(0)
    return torch.load(buffer)


def _shared(x: torch.Tensor) -> torch.Tensor:
    x.share_memory_()
    assert x.is_shared()
    return x


def _grad(x: torch.Tensor) -> torch.Tensor:
    leaf = x.detach().requires_grad_()
    (leaf * 2.0).sum().backward()
    assert leaf.grad is not None
    return leaf.grad


def _to_jax(x: torch.Tensor) -> torch.Tensor:
    import jax.dlpack

    return torch.from_numpy(np.asarray(jax.dlpack.from_dlpack(x)).copy())


def _pinned(x: torch.Tensor) -> Any:
    try:
        return x.pin_memory()
    except RuntimeError as err:  # a CPU-only build pins nothing: the same error for every tensor
        return type(err).__name__


USES: dict[str, Callable[[torch.Tensor], Any]] = {
    "pickle": lambda x: pickle.loads(pickle.dumps(x)),
    "torch.save": _saved,
    "share_memory_": _shared,
    "autograd": _grad,
    "dlpack_to_jax": _to_jax,
    "pin_memory": _pinned,
    "to_meta": lambda x: (x.to("meta").shape, x.to("meta").dtype),
    "to_float64": lambda x: x.to(torch.float64),
    "view_and_index": lambda x: x.view(ROWS, LENGTH)[::3, 1:].contiguous(),
}


@pytest.mark.parametrize("use", list(USES))
def test_every_use_sees_an_ordinary_tensor(result: torch.Tensor, use: str) -> None:
    values = result.values()
    got, want = USES[use](values), USES[use](_ordinary(values))
    if isinstance(got, torch.Tensor):
        assert_same(got, want)
    else:
        assert got == want


def test_the_nested_result_pickles_and_saves(result: torch.Tensor) -> None:
    """As the trainer's own nested tensor of the same rows does (torch 2.9.1's ``torch.load`` refuses
    both where ``torch._dynamo`` is not yet imported: the same outcome)."""
    own = torch.nested.as_nested_tensor(list(result.unbind()), layout=torch.jagged)
    assert_same(pickle.loads(pickle.dumps(result)), result)
    try:
        got: Any = _saved(result)
    except pickle.UnpicklingError as err:
        got = str(err)
    try:
        want: Any = _saved(own)
    except pickle.UnpicklingError as err:
        want = str(err)
    if isinstance(got, str) or isinstance(want, str):
        assert got == want
    else:
        assert_same(got, result)


def test_its_storage_cannot_grow_the_stated_difference(result: torch.Tensor) -> None:
    """``resize_`` past its size raises for the result, where a ``torch.empty`` tensor grows: the host
    kernels write it through ``Tensor.numpy()``, which marks a storage as one that cannot grow (so it was
    at e2eb2d4 too); ``docs/kernels.md``, "The result's memory", states it."""
    values, n = result.values(), result.values().numel()
    ordinary = _ordinary(values)
    ordinary.resize_(n * 2)
    with pytest.raises(RuntimeError, match="not resizable"):
        values.resize_(n * 2)
    assert torch.equal(bits(result.values()), bits(ordinary[:n]))  # the result itself is untouched
