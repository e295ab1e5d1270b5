"""The packed and padded layouts in torch_impl: a constant number of operations, gradients, the device
rules (sizes from the host; nothing read on ``meta``), fresh storage (the pairing with ``ref`` is in
``tests/test_ops.py``, the round trips in the property suite, the bad inputs in the table of defects)."""

from __future__ import annotations

import pytest
import torch

import torch_impl
from property_tests.compare import assert_same
from property_tests.data import jagged
from property_tests.opcount import CountOps
from ref import errors


def _batch(b: int, width: int = 2) -> torch.Tensor:
    lengths = [(i * 7) % 5 for i in range(b)]
    return jagged(torch.arange(sum(lengths) * width, dtype=torch.float32).reshape(-1, width), lengths)


def _ops(fn) -> int:
    with CountOps() as c:
        fn()
    return sum(c.ops.values())


@pytest.mark.parametrize(
    "call",
    [
        lambda x: torch_impl.to_padded(x),
        lambda x: torch_impl.to_packed(x),
        lambda x: torch_impl.from_packed(x.values(), x.offsets().diff().tolist()),
        lambda x: torch_impl.from_padded(torch.zeros(x.size(0), 5, 2), x.offsets().diff().tolist()),
    ],
    ids=["to_padded", "to_packed", "from_packed", "from_padded"],
)
def test_operations_do_not_grow_with_rows(call) -> None:
    small, large = _batch(8), _batch(2048)
    assert _ops(lambda: call(small)) == _ops(lambda: call(large))


def test_results_are_fresh_storage() -> None:
    x = _batch(6)
    values, _ = torch_impl.to_packed(x)
    assert values.data_ptr() != x.values().data_ptr()
    y = torch_impl.from_packed(x.values(), x.offsets().diff().tolist())
    assert y.values().data_ptr() != x.values().data_ptr()


def test_gradients_reach_the_right_values() -> None:
    values = torch.arange(10.0, dtype=torch.float64, requires_grad=True)
    x = torch_impl.from_packed(values, [3, 0, 2, 4, 1])
    padded = torch_impl.to_padded(x, pad_value=-1.0)
    weights = torch.arange(padded.numel(), dtype=torch.float64).reshape(padded.shape)
    (padded * weights).sum().backward()
    # value t of row i sits at padded[i, t - start_i], i.e. weight i * 4 + (t - start_i)
    starts, lengths = [0, 3, 3, 5, 9], [3, 0, 2, 4, 1]
    want = [float(i * 4 + j) for i, (s, n) in enumerate(zip(starts, lengths, strict=True)) for j in range(n)]
    assert_same(values.grad, torch.tensor(want, dtype=torch.float64))
    back = torch_impl.from_padded(padded.detach().requires_grad_(), lengths)
    back.values().sum().backward()


def test_on_meta_nothing_is_read() -> None:
    x = _batch(5).to("meta")
    assert torch_impl.to_padded(x, max_len=7).shape == (5, 7, 2)
    with pytest.raises(errors.UnsupportedSettingError, match="needs max_len"):
        torch_impl.to_padded(x)
    dense = torch.zeros(3, 4, 2, device="meta")
    y = torch_impl.from_padded(dense, [1, 4, 0])
    assert y.device.type == "meta"
    assert y.values().shape == (5, 2)
    with pytest.raises(errors.UnsupportedSettingError, match="lengths the host can read"):
        torch_impl.from_padded(dense, torch.tensor([1, 4, 0], device="meta"))


def test_cu_seqlens_are_offsets() -> None:
    x = torch_impl.from_packed(torch.arange(5.0), cu_seqlens=torch.tensor([0, 2, 2, 5], dtype=torch.int32))
    assert x.offsets().dtype == torch.int64
    assert x.offsets().tolist() == [0, 2, 2, 5]
    with pytest.raises(errors.InvalidJaggedError, match="cu_seqlens must be 1-D integers"):
        torch_impl.from_packed(torch.arange(5.0), cu_seqlens=torch.tensor([[0, 5]]))
    with pytest.raises(errors.InvalidJaggedError, match=r"offsets\[-1\] must equal len\(values\) = 5, got 4"):
        torch_impl.from_packed(torch.arange(5.0), cu_seqlens=[0, 2, 4])


def test_lengths_rule_in_both_forms() -> None:
    with pytest.raises(errors.InvalidJaggedError, match=r"lengths\[1\] = True is not an integer"):
        torch_impl.from_packed(torch.arange(2.0), [1, True])
    with pytest.raises(errors.InvalidJaggedError, match="lengths must be 1-D integers"):
        torch_impl.from_packed(torch.arange(2.0), torch.tensor([[1, 1]]))
    with pytest.raises(errors.ShapeMismatchError, match="from_padded needs dense data"):
        torch_impl.from_padded(torch.zeros(3), [1, 1, 1])
    with pytest.raises(errors.UnsupportedSettingError, match="max_len must be a non-negative int"):
        torch_impl.to_padded(_batch(3), max_len=-1)
