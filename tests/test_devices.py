"""Off the CPU the data is never read on the host: every path runs on the ``meta`` device (shapes, no
data) and gives the shapes the CPU gives; what would need data says so. Also: results never share
storage with the inputs, and a zero-row micro-batch whose nested tensor has ``lengths`` works."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torch_impl
from property_tests.baseline import verl_postprocess_batch_func
from property_tests.compare import assert_same
from property_tests.data import jagged
from property_tests.kernels import ANYWHERE, KERNELS, forced
from ref import errors

INDICES = [[2, 0], [1], []]


def _outputs(device: str, feature: tuple[int, ...]) -> list[dict[str, Any]]:
    """Three micro-batches (2 rows, 1 row, none) of a jagged key (long and short rows) and a dense key."""
    g = torch.Generator().manual_seed(0)
    out = []
    for lengths in ([300, 2], [5], []):
        values = torch.randn(sum(lengths), *feature, generator=g)
        dense = torch.randn(len(lengths), 4, generator=g)
        out.append(
            {"model_output": {"x": jagged(values, lengths).to(device), "d": dense.to(device)}, "loss": 1.0}
        )
    return out


def _shapes(t: torch.Tensor) -> tuple[Any, ...]:
    if t.is_nested:
        return (t.device.type, t.size(0), tuple(t.values().shape), tuple(t.offsets().shape), t.dtype)
    return (t.device.type, tuple(t.shape), t.dtype)


def _all_ops(outs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    xs = [o["model_output"]["x"] for o in outs]
    whole = torch_impl.concat(xs)
    return {
        **{f"post_{k}": v for k, v in torch_impl.postprocess_batch(outs, INDICES)["model_output"].items()},
        **{
            f"plain_{k}": v
            for k, v in torch_impl.postprocess_batch(outs, None, use_dynamic_bsz=False)[
                "model_output"
            ].items()
        },
        "concat": whole,
        "restore": torch_impl.restore(whole, INDICES),
        "take_permutation": torch_impl.take(whole, [1, 2, 0]),
        "take_dense": torch_impl.take(torch.cat([o["model_output"]["d"] for o in outs]), [1, 1]),
    }


@pytest.mark.parametrize("feature", [(), (3,)], ids=["2d", "3d"])
@pytest.mark.parametrize("path", list(KERNELS))
def test_every_path_on_meta_gives_the_cpu_shapes(path: str, feature: tuple[int, ...]) -> None:
    if path not in ANYWHERE:  # a host kernel forced on meta: refused, no other kernel in its place
        with (
            forced(path),
            pytest.raises(errors.UnsupportedSettingError, match="cannot move this key on meta"),
        ):
            _all_ops(_outputs("meta", feature))
        return
    with forced(path):
        on_meta = _all_ops(_outputs("meta", feature))
        on_cpu = _all_ops(_outputs("cpu", feature))
    assert {k: _shapes(v)[1:] for k, v in on_meta.items()} == {k: _shapes(v)[1:] for k, v in on_cpu.items()}
    assert all(v.device.type == "meta" for v in on_meta.values())


def test_what_needs_data_says_so_on_meta() -> None:
    whole = torch_impl.concat([o["model_output"]["x"] for o in _outputs("meta", ())])
    with pytest.raises(errors.UnsupportedSettingError, match=r"not a permutation .* meta device"):
        torch_impl.take(whole, [0, 0])
    with pytest.raises(errors.UnsupportedSettingError, match="split on the meta device"):
        torch_impl.split(whole, [[0], [1, 2]])


@pytest.mark.parametrize("path", list(KERNELS))
@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_results_never_share_storage_with_the_inputs(path: str, dynamic: bool, micro_batches: int) -> None:
    outs = _outputs("cpu", ())[:micro_batches]
    indices = [[1, 0], [2]][:micro_batches] if micro_batches == 2 else [[1, 0]]
    with forced(path):
        result = torch_impl.postprocess_batch(outs, indices if dynamic else None, use_dynamic_bsz=dynamic)
    inputs = {t.untyped_storage().data_ptr() for o in outs for t in _buffers(o["model_output"])}
    for key, value in result["model_output"].items():
        assert not inputs & {t.untyped_storage().data_ptr() for t in _buffers({key: value})}, key
    if micro_batches == 1:  # verl returns a copy too
        single = torch_impl.concat([outs[0]["model_output"]["x"]])
        assert single.values().data_ptr() != outs[0]["model_output"]["x"].values().data_ptr()


def _buffers(mo: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [t for v in mo.values() for t in ((v.values(), v.offsets()) if v.is_nested else (v,))]


def test_zero_row_micro_batch_with_lengths_gives_verls_rows() -> None:
    empty = torch.nested.nested_tensor_from_jagged(
        torch.zeros(0), torch.zeros(1, dtype=torch.int64), lengths=torch.zeros(0, dtype=torch.int64)
    )
    holed = torch.nested.nested_tensor_from_jagged(
        torch.arange(10.0), torch.tensor([0, 4, 8]), lengths=torch.tensor([3, 2])
    )
    outs = [
        {"model_output": {"x": holed}},
        {"model_output": {"x": empty}},
        {"model_output": {"x": jagged(torch.ones(2), [2])}},
    ]
    indices = [[2, 0], [], [1]]
    got = torch_impl.postprocess_batch(outs, indices)
    assert_same(got["model_output"], verl_postprocess_batch_func(outs, indices, None)["model_output"])
    assert [r.tolist() for r in got["model_output"]["x"].unbind()] == [
        [4.0, 5.0],
        [1.0, 1.0],
        [0.0, 1.0, 2.0],
    ]


def test_rows_on_the_device_are_never_read_on_the_host() -> None:
    """Row indices held on the device are checked there or not at all, never read back: a dense take
    with ``meta`` rows gives ``meta`` rows of the right shape."""
    x = torch.zeros(4, 3, device="meta")
    got = torch_impl.take(x, torch.tensor([2, 0, 1, 3], device="meta"))
    assert got.device.type == "meta"
    assert tuple(got.shape) == (4, 3)
    nested = torch.nested.nested_tensor_from_jagged(
        torch.zeros(6, device="meta"), torch.tensor([0, 1, 3, 6], device="meta")
    )
    with pytest.raises(errors.UnsupportedSettingError, match=r"not a permutation .* meta device"):
        torch_impl.take(nested, torch.tensor([2, 0, 1], device="meta"))  # not read on the host to find out
