"""Every dtype of `ref.dtypes.SUPPORTED_DTYPES` that torch has moves bit for bit, dense and jagged, on every
kernel path, through both entry points and the other operations, in both implementations (issue 42, item 5).

torch has no CPU indexing kernels for ``uint16``/``uint32``/``uint64`` and several float8 variants: those move
as
the integers of their bits (`torch_impl._bits`); before, they raised a bare ``NotImplementedError``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ref
import torch_impl
from property_tests.compare import assert_same, bits
from property_tests.convert import ref_postprocess, result_to_torch, to_ref
from property_tests.data import jagged, rows_of
from property_tests.kernels import KERNELS, forced
from ref.dtypes import SUPPORTED_DTYPES

#: Every supported dtype this torch has, by name.
TORCH_DTYPES = sorted(n for n in SUPPORTED_DTYPES if isinstance(getattr(torch, n, None), torch.dtype))
PATHS = [None, *sorted(KERNELS)]


def _indexable(name: str) -> bool:
    """Whether torch has a CPU ``index_copy_`` for dtype ``name``."""
    x = torch.zeros(3 * torch.empty((), dtype=getattr(torch, name)).element_size(), dtype=torch.uint8)
    x = x.view(getattr(torch, name))
    try:
        x.new_empty(3).index_copy_(0, torch.tensor([2, 0, 1]), x)
    except NotImplementedError:
        return False
    return True


#: The ones torch cannot index on the CPU (each raised ``NotImplementedError`` before).
BITS = [n for n in TORCH_DTYPES if not _indexable(n)]


def _random(shape: tuple[int, ...], dtype: str, seed: int = 0) -> torch.Tensor:
    """Random bits of ``dtype`` (every pattern, NaN payloads included; bools 0 or 1)."""
    tdtype = getattr(torch, dtype)
    count = int(np.prod(shape))
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return torch.from_numpy(rng.integers(0, 2, count, dtype=np.uint8)).to(torch.bool).reshape(shape)
    size = torch.empty((), dtype=tdtype).element_size()
    return (
        torch.from_numpy(rng.integers(0, 256, count * size, dtype=np.uint8))
        .view(tdtype)
        .reshape(shape)
        .clone()
    )


def _rows(t: torch.Tensor, index: list[int]) -> torch.Tensor:
    """``t[index]``, through the integers of its bits (torch 2.9 cannot index some of these dtypes on the
    CPU)."""
    if t.dtype == torch.bool or t.element_size() not in (1, 2, 4, 8):
        return t[index]  # bool and complex128 have CPU indexing kernels
    signed = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(signed)[index].view(t.dtype)


def _call(
    dtype: str, trailing: tuple[int, ...] = ()
) -> tuple[list[dict[str, Any]], list[list[int]], dict[str, Any]]:
    """Two micro-batches (3 rows, then 2) of a dense and a jagged key, the partitions, and the expected
    rows."""
    dense = _random((5, *trailing), dtype)
    lengths = [2, 0, 3, 4, 1]
    values = _random((sum(lengths), *trailing), dtype, seed=1)
    whole = jagged(values, lengths)
    perm = [3, 0, 4, 1, 2]
    rows = rows_of(whole)
    outs = [
        {"model_output": {"d": dense[:3], "j": jagged(torch.cat([rows[k] for k in range(3)]), lengths[:3])}},
        {
            "model_output": {
                "d": dense[3:],
                "j": jagged(torch.cat([rows[k] for k in range(3, 5)]), lengths[3:]),
            }
        },
    ]
    inv = [perm.index(i) for i in range(5)]
    expected = {
        "d": _rows(dense, inv),
        "j": jagged(torch.cat([rows[k] for k in inv]), [lengths[k] for k in inv]),
    }
    return outs, [perm[:3], perm[3:]], expected


def test_the_dtypes_moved_as_bits_are_those_torch_cannot_index_on_the_cpu() -> None:
    from torch_impl._bits import MOVED_AS_BITS

    assert sorted(str(d).removeprefix("torch.") for d in MOVED_AS_BITS) == BITS
    assert {"uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"} <= set(BITS)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_postprocess_moves_every_supported_dtype_exactly_on_every_path(dtype: str, path: str | None) -> None:
    for trailing in ((), (2,)):
        outs, indices, expected = _call(dtype, trailing)
        if path is None:
            got = torch_impl.postprocess_batch(outs, indices)["model_output"]
        else:
            with forced(path):
                got = torch_impl.postprocess_batch(outs, indices)["model_output"]
        assert_same(got, expected)


@pytest.mark.parametrize("dtype", BITS)
def test_the_dense_host_path_and_verl_drop_in_move_them_exactly(dtype: str) -> None:
    outs, indices, expected = _call(dtype)
    with torch_impl.use_settings(cpu_dense_host_min_elements=0):
        assert_same(torch_impl.postprocess_batch(outs, indices)["model_output"]["d"], expected["d"])
    with torch_impl.use_settings(cpu_dense_host_min_elements=10**9):
        assert_same(torch_impl.postprocess_batch(outs, indices)["model_output"]["d"], expected["d"])
    # verl's drop-in: a dense [B] output stays dense, a dense [B, S] one becomes [B, (S)]
    got = torch_impl.postprocess_batch_func(outs, indices, {"use_dynamic_bsz": True})["model_output"]
    assert_same(got["d"], expected["d"])
    assert_same(got["j"], expected["j"])
    wide_outs, _, wide = _call(dtype, (3,))
    got = torch_impl.postprocess_batch_func(wide_outs, indices, None)["model_output"]
    assert torch.equal(bits(got["d"].values()), bits(wide["d"].reshape(-1)))


@pytest.mark.parametrize("dtype", BITS)
def test_ref_moves_them_exactly_and_agrees(dtype: str) -> None:
    outs, indices, expected = _call(dtype, (2,))
    got = ref_postprocess(outs, indices)["model_output"]
    assert_same(got, expected)


@pytest.mark.parametrize("dtype", BITS)
def test_the_other_operations_move_them_exactly_in_both(dtype: str) -> None:
    _, indices, expected = _call(dtype)
    nt, dense = expected["j"], expected["d"]
    perm = [i for p in indices for i in p]
    for x in (nt, dense):
        taken = torch_impl.take(x, perm)
        assert_same(torch_impl.restore(taken, indices), x)
        assert_same(result_to_torch(ref.restore(to_ref(taken), indices)), x)
        assert_same(result_to_torch(ref.take(to_ref(x), perm)), taken)
        assert_same(torch_impl.concat(torch_impl.split(x, indices)), taken)
    # a pad of 1 (float8_e8m0fnu has no 0: torch writes NaN, JAX 2**-127, which is left open)
    padded = torch_impl.to_padded(nt, pad_value=1)
    assert_same(result_to_torch(ref.to_padded(to_ref(nt), pad_value=1)), padded)
    lengths = [r.shape[0] for r in rows_of(nt)]
    assert_same(torch_impl.from_padded(padded, lengths), nt)
    assert_same(result_to_torch(ref.from_padded(to_ref(padded), lengths)), nt)


def test_a_bits_moved_float8_with_a_gradient_is_refused_typed() -> None:
    """A view as integers carries no gradient: refused, never silently detached."""
    outs, indices, _ = _call("float8_e4m3fn")
    outs[1]["model_output"]["d"] = outs[1]["model_output"]["d"].clone().requires_grad_(True)
    with pytest.raises(
        ref.UnsupportedSettingError, match=r"key 'd', micro-batch 1: dtype float8_e4m3fn requires a gradient"
    ):
        torch_impl.postprocess_batch(outs, indices)
    with torch.no_grad():
        torch_impl.postprocess_batch(outs, indices)  # nothing to carry
