"""One dtype rule (`ref.dtypes.check_dtype`), for every public function of both implementations.

Every public data-moving function of ``ref`` and ``torch_impl`` accepts and refuses the same dtypes with
the same class (each supported dtype and dtypes both frameworks have but rebatch refuses: the sub-byte
integers); and a float8 part that requires a gradient is refused (`UnsupportedSettingError`) by every
public function of ``torch_impl`` and every drop-in, never moved with its gradient silently dropped.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import ref
import torch_impl
from ref.dtypes import SUPPORTED_DTYPES
from ref.errors import RebatchError, UnsupportedSettingError
from torch_impl.integrations import areal

#: Dtypes rebatch refuses that both frameworks can hold (sub-byte integers).
REFUSED = ("int4", "uint4", "int2", "uint2")
PARTITIONS = [[3, 0, 4], [1, 2]]
LENGTHS = [2, 0, 3, 1, 1]


def _both(name: str) -> bool:
    t = getattr(torch, name, None)
    return isinstance(t, torch.dtype) and getattr(jnp, name, None) is not None


DTYPES = sorted(n for n in {*SUPPORTED_DTYPES, *REFUSED} if _both(n))


def _dense(impl: str, name: str) -> Any:
    """``[7, 2]`` zeros of dtype ``name`` (7 = sum(LENGTHS): a packed batch too)."""
    if impl == "torch":
        return torch.zeros(7, 2, dtype=getattr(torch, name))
    return jnp.zeros((7, 2), dtype=name)


def _jagged(impl: str, x: Any) -> Any:
    """The jagged rows of ``LENGTHS`` over ``x``, built without rebatch's checks."""
    offsets = np.cumsum([0, *LENGTHS])
    if impl == "torch":
        return torch.nested.nested_tensor_from_jagged(x, torch.from_numpy(offsets))
    return ref.Jagged(x, jnp.asarray(offsets, dtype=jnp.int32))


#: Every public data-moving function, on a dense batch ``x`` and its jagged form ``nt`` (one module).
OPS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "concat": lambda m, x, nt: m.concat([x[:3], x[3:]]),
    "concat_jagged": lambda m, x, nt: m.concat([nt, nt]),
    "restore": lambda m, x, nt: m.restore(x[:5], PARTITIONS),
    "restore_jagged": lambda m, x, nt: m.restore(nt, PARTITIONS),
    "take": lambda m, x, nt: m.take(x, [4, 0]),
    "take_jagged": lambda m, x, nt: m.take(nt, [4, 0]),
    "split": lambda m, x, nt: m.split(x[:5], PARTITIONS),
    "split_jagged": lambda m, x, nt: m.split(nt, PARTITIONS),
    "from_packed": lambda m, x, nt: m.from_packed(x, LENGTHS),
    "from_padded": lambda m, x, nt: m.from_padded(x[:5], [1, 2, 0, 2, 1]),
    "to_padded": lambda m, x, nt: m.to_padded(nt),
    "to_packed": lambda m, x, nt: m.to_packed(nt),
    "postprocess_batch": lambda m, x, nt: m.postprocess_batch(
        [{"model_output": {"d": x[:3]}}, {"model_output": {"d": x[3:5]}}], PARTITIONS
    ),
}


def _outcome(fn: Callable[[], Any]) -> type[Exception] | None:
    try:
        fn()
    except RebatchError as err:
        return type(err)
    return None


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_both_implementations_accept_and_refuse_the_same_dtypes(dtype: str, op: str) -> None:
    x = _dense("torch", dtype)
    theirs = _outcome(lambda: OPS[op](torch_impl, x, _jagged("torch", x)))
    with jax.enable_x64(True):
        y = _dense("ref", dtype)
        mine = _outcome(lambda: OPS[op](ref, y, _jagged("ref", y)))
    assert theirs is mine
    assert mine is (None if dtype in SUPPORTED_DTYPES else UnsupportedSettingError)


def _float8_with_grad() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.zeros(7, 2, dtype=torch.float8_e4m3fn).requires_grad_()
    return x, torch.nested.nested_tensor_from_jagged(
        x.detach(), torch.tensor(np.cumsum([0, *LENGTHS]))
    ).requires_grad_()


#: The drop-ins, on the same parts.
DROP_INS: dict[str, Callable[[Any, Any], Any]] = {
    "postprocess_batch_func": lambda x, nt: torch_impl.postprocess_batch_func(
        [{"model_output": {"k": nt}}, {"model_output": {"k": nt}}], [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]], None
    ),
    "restore_dynamic_batch": lambda x, nt: torch_impl.restore_dynamic_batch(x[:5], PARTITIONS),
    "areal": lambda x, nt: areal.reorder_and_pad_outputs(
        [x[:3], x[3:]],
        [1, 2, 2, 2],
        types.SimpleNamespace(forward_indices=[1, 0, 3, 2], backward_indices=[1, 0, 3, 2]),
    ),
}


@pytest.mark.parametrize("op", sorted(OPS) + sorted(DROP_INS))
def test_every_public_function_refuses_float8_that_requires_a_gradient(op: str) -> None:
    """Before: ``concat`` then ``restore`` returned rows without ``grad_fn`` (the gradient dropped)."""
    x, nt = _float8_with_grad()
    call = (lambda: OPS[op](torch_impl, x, nt)) if op in OPS else (lambda: DROP_INS[op](x, nt))
    with pytest.raises(UnsupportedSettingError, match="dtype float8_e4m3fn requires a gradient"):
        call()
    with torch.no_grad():  # nothing to carry: moved
        call()
    from ref.dtypes import NO_GRADIENT

    assert "float8_e4m3fn" in NO_GRADIENT


def test_concat_then_restore_of_float8_rows_requiring_grad_is_refused() -> None:
    """The finding: four float8_e4m3fn rows requiring grad through ``concat`` then ``restore``."""
    rows = [torch.zeros(1, 3, dtype=torch.float8_e4m3fn).requires_grad_() for _ in range(4)]
    with pytest.raises(
        UnsupportedSettingError, match="micro-batch 0: dtype float8_e4m3fn requires a gradient"
    ):
        torch_impl.restore(torch_impl.concat(rows), [[2, 0, 3, 1]])
