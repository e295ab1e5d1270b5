"""What production adds: verl's call with a TensorDict, gradients, Metric objects, TensorDicts in
take/split, non-contiguous nested tensors, and a constant number of torch operations whatever B is."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
import math
import sys
from collections import Counter
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, TensorDict

import torch_impl
import torch_impl._assemble
import torch_impl._host
import torch_impl._rowcopy
from property_tests.baseline import verl_postprocess_batch_func
from property_tests.compare import assert_same
from property_tests.data import DTYPES, jagged, random_tensor, rows_of
from property_tests.kernels import KERNELS, forced
from property_tests.metric import FakeMetric
from property_tests.opcount import CountOps
from ref import errors


class DatasetPadMode(str, enum.Enum):
    """verl's str Enum, redefined here (rebatch never imports verl)."""

    RIGHT = "right"
    LEFT_RIGHT = "left_right"
    NO_PADDING = "no_padding"


def _outputs(b: int, m: int, *, seed: int = 0, keys: int = 1, mean_len: int = 4):
    rng = np.random.default_rng(seed)
    perm = rng.permutation(b).tolist()
    cuts = np.linspace(0, b, m + 1).astype(int).tolist()
    parts = [perm[cuts[i] : cuts[i + 1]] for i in range(m)]
    outs = []
    for part in parts:
        mo = {}
        for k in range(keys):
            lengths = rng.integers(0, 2 * mean_len, size=len(part)).tolist()
            mo[f"k{k}"] = jagged(random_tensor(rng, (sum(lengths),), "float32"), lengths)
        outs.append({"model_output": mo, "loss": float(rng.random())})
    return outs, parts


def _td(**settings) -> TensorDict:
    td = TensorDict({}, batch_size=[])
    for k, v in settings.items():
        td[k] = NonTensorData(v)
    return td


@pytest.mark.parametrize(
    "data",
    [None, _td(), _td(use_dynamic_bsz=True), _td(pad_mode=DatasetPadMode.NO_PADDING), _td(pad_mode="no_padding")],
    ids=["none", "empty", "dynamic", "enum_pad_mode", "str_pad_mode"],
)
def test_postprocess_batch_func_reads_settings_like_verl(data) -> None:
    outs, parts = _outputs(16, 3)
    assert_same(torch_impl.postprocess_batch_func(outs, parts, data), verl_postprocess_batch_func(outs, parts, data))


def test_postprocess_batch_func_without_dynamic_bsz() -> None:
    outs, _ = _outputs(9, 3)
    data = _td(use_dynamic_bsz=False)
    assert_same(torch_impl.postprocess_batch_func(outs, None, data), verl_postprocess_batch_func(outs, None, data))


def test_enum_pad_mode_for_dense_outputs_in_padded_mode() -> None:
    outs = [{"model_output": {"v": torch.arange(3.0)}}, {"model_output": {"v": torch.arange(3.0, 5.0)}}]
    res = torch_impl.postprocess_batch_func(outs, [[4, 0, 2], [1, 3]], _td(pad_mode=DatasetPadMode.RIGHT))
    assert res["model_output"]["v"].tolist() == [1.0, 3.0, 2.0, 4.0, 0.0]
    with pytest.raises(errors.UnsupportedSettingError, match="pad_mode"):
        torch_impl.postprocess_batch_func(outs, [[4, 0, 2], [1, 3]], _td(pad_mode="middle"))


def test_gradients_reach_every_micro_batch_with_the_right_rows() -> None:
    outs, parts = _outputs(12, 3, mean_len=3)
    leaves = []
    for o in outs:
        v = o["model_output"]["k0"].values().clone().requires_grad_(True)
        leaves.append(v)
        o["model_output"]["k0"] = torch.nested.nested_tensor_from_jagged(v, o["model_output"]["k0"].offsets())
    res = torch_impl.postprocess_batch(outs, parts)["model_output"]["k0"]
    # Weight each original row i by (i + 1): the gradient of a micro-batch row is its original index + 1.
    weights = torch.cat([torch.full((r.shape[0],), float(i + 1)) for i, r in enumerate(rows_of(res))])
    (res.values() * weights).sum().backward()
    for v, o, part in zip(leaves, outs, parts, strict=True):
        lengths = o["model_output"]["k0"].offsets().diff().tolist()
        want = torch.cat(
            [torch.full((n,), float(i + 1)) for i, n in zip(part, lengths, strict=True)] or [torch.zeros(0)]
        )
        assert torch.equal(v.grad, want)


def test_gradients_through_dense_outputs() -> None:
    a = torch.zeros(2, 3, requires_grad=True)
    b = torch.zeros(1, 3, requires_grad=True)
    out = torch_impl.postprocess_batch([{"model_output": {"v": a}}, {"model_output": {"v": b}}], [[2, 0], [1]])
    (out["model_output"]["v"] * torch.arange(3.0)[:, None]).sum().backward()
    assert a.grad[:, 0].tolist() == [2.0, 0.0]
    assert b.grad[:, 0].tolist() == [1.0]


def test_metric_objects_fold_like_verl() -> None:
    outs, parts = _outputs(6, 2)
    outs[0]["metrics"] = {"kl": FakeMetric("mean", 1.0), "lr": 0.1}
    outs[1]["metrics"] = {"kl": FakeMetric("mean", 2.0), "lr": [0.2, 0.3]}
    got = torch_impl.postprocess_batch(outs, parts)["metrics"]
    assert got["kl"].values == [1.0, 2.0]
    assert got["lr"] == [0.1, 0.2, 0.3]
    assert_same(got, verl_postprocess_batch_func(outs, parts, None)["metrics"])


def test_non_contiguous_nested_input() -> None:
    values = torch.arange(10.0)
    holey = torch.nested.nested_tensor_from_jagged(values, torch.tensor([0, 4, 8]), lengths=torch.tensor([2, 3]))
    dense_ok = jagged(torch.tensor([0.0, 1.0, 4.0, 5.0, 6.0]), [2, 3])
    assert_same(torch_impl.restore(holey, [[1, 0]]), torch_impl.restore(dense_ok, [[1, 0]]))


def test_take_and_split_on_a_tensordict() -> None:
    rng = np.random.default_rng(1)
    lengths = [2, 0, 3, 1]
    td = TensorDict(
        {"ids": jagged(random_tensor(rng, (6,), "int64"), lengths), "adv": torch.arange(4.0), "mask": torch.ones(4, 2)},
        batch_size=[4],
    )
    td["tag"] = NonTensorData("rollout")
    parts = [[3, 0], [], [2, 1]]
    pieces = torch_impl.split(td, parts)
    assert [p.batch_size[0] for p in pieces] == [2, 0, 2]
    assert [p.get("tag").data for p in pieces] == ["rollout"] * 3  # a non-tensor field goes with every piece
    for piece, part in zip(pieces, parts, strict=True):
        assert_same(piece["ids"], torch_impl.take(td["ids"], part))
        assert piece["adv"].tolist() == [float(i) for i in part]
    back = torch_impl.restore(torch_impl.concat([p["ids"] for p in pieces]), parts)
    assert_same(back, td["ids"])
    taken = torch_impl.take(td, [2, 2, 0])
    assert taken["adv"].tolist() == [2.0, 2.0, 0.0]
    assert taken.get("tag").data == "rollout"


@pytest.mark.parametrize("with_non_tensor", [False, True])
def test_take_and_split_keep_every_batch_dimension_of_a_tensordict(with_non_tensor: bool) -> None:
    """A TensorDict batched ``[B, T]``: the pieces are ``[R, T]``, as ``td[rows]`` gives."""
    td = TensorDict({"a": torch.arange(24).reshape(3, 2, 4), "b": torch.zeros(3, 2)}, batch_size=[3, 2])
    if with_non_tensor:
        td["tag"] = NonTensorData("rollout")
    taken = torch_impl.take(td, [2, 0])
    assert taken.batch_size == td[torch.tensor([2, 0])].batch_size == torch.Size([2, 2])
    assert torch.equal(taken["a"], td["a"][[2, 0]])
    pieces = torch_impl.split(td, [[2], [0, 1]])
    assert [p.batch_size for p in pieces] == [torch.Size([1, 2]), torch.Size([2, 2])]
    assert torch.equal(pieces[1]["a"], td["a"][:2])


def _count(b: int) -> Counter[str]:
    outs, parts = _outputs(b, 8, seed=b, keys=2)
    for o in outs:
        o["model_output"]["dense"] = torch.zeros(o["model_output"]["k0"].size(0), 3)
    with CountOps() as counter:
        torch_impl.postprocess_batch(outs, parts)
    return counter.ops


@pytest.mark.parametrize(
    ("few_rows", "rows"),
    [(0, (64, 4096)), (128, (8, 128))],  # the host's NumPy paths; the few-rows path (fewer operations)
    ids=["numpy_paths", "few_rows"],
)
def test_operation_count_does_not_grow_with_rows(few_rows: int, rows: tuple[int, int]) -> None:
    with torch_impl.use_settings(cpu_few_rows=few_rows):
        _count(rows[0])  # once first: what a process does once (``numpy_bridge``'s probe) is not counted
        small, large = _count(rows[0]), _count(rows[1])
    assert sum(small.values()) > 0
    assert small == large, f"ops differ: {small - large} vs {large - small}"


@pytest.fixture
def force():
    """``force(path)``: torch_impl takes that data-movement path until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda path: stack.enter_context(forced(path))


@pytest.mark.parametrize("path", list(KERNELS))
def test_every_kernel_gives_every_sample(path, force) -> None:
    """Each data-movement path, forced on, reproduces every named sample bit for bit."""
    from property_tests.convert import torch_postprocess
    from property_tests.samples import postprocess_samples

    force(path)
    for s in postprocess_samples():
        got = torch_postprocess(s.output_lst, s.indices, use_dynamic_bsz=s.use_dynamic_bsz, pad_mode=s.pad_mode)
        assert_same(got, s.expected)


@pytest.mark.parametrize("path", list(KERNELS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool", "complex64"])
def test_every_kernel_on_long_rows_of_each_dtype(path, dtype, force) -> None:
    force(path)
    rng = np.random.default_rng(3)
    outs, parts = _outputs(40, 3, mean_len=60)
    for o in outs:  # a 3-D key of the dtype beside the float32 one
        lengths = o["model_output"]["k0"].offsets().diff().tolist()
        o["model_output"]["x"] = jagged(random_tensor(rng, (sum(lengths), 3), dtype), lengths)
    if path == "element_indices_one_value_per_chunk":
        outs = [{"model_output": {"x": o["model_output"]["x"]}} for o in outs]  # one value per op: keep it short
    assert_same(torch_impl.postprocess_batch(outs, parts), verl_postprocess_batch_func(outs, parts, None))


@pytest.mark.parametrize("path", list(KERNELS))
@pytest.mark.parametrize("lazy", ["conj", "neg"])
def test_every_kernel_resolves_lazy_conjugation_and_negation(path, lazy, force) -> None:
    """Values that are a lazy view (torch's conjugate or negative bit: the bytes in memory are not the
    values) come out as their values on every path: row copies, which move raw bytes, step aside."""
    force(path)
    outs, parts = _outputs(24, 3, mean_len=70)
    rng = np.random.default_rng(5)
    resolved = []
    for o in outs:
        lengths = o["model_output"]["k0"].offsets().diff().tolist()
        base = random_tensor(rng, (sum(lengths),), "complex64")
        view = base.conj() if lazy == "conj" else torch._neg_view(base)
        assert view.is_conj() or view.is_neg()
        o["model_output"] = {"x": jagged(view, lengths)}
        resolved.append({**o, "model_output": {"x": jagged(view.resolve_conj().resolve_neg(), lengths)}})
    want = verl_postprocess_batch_func(resolved, parts, None)
    assert_same(torch_impl.postprocess_batch(outs, parts), want)


class _LargestIndex(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the largest index tensor given to ``index_copy_``, and its number of calls."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.index_copy_.default:
            self.largest = max(self.largest, args[2].numel())
            self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("micro_batches", [1, 4])
@pytest.mark.parametrize("trailing", [(), (3,)])
def test_index_buffer_covers_one_chunk_at_a_time(micro_batches, trailing, device) -> None:
    """Peak memory on the index path: destinations for one chunk at a time, however few micro-batches
    hold the rows: ``Settings.cpu_index_chunk`` value rows on the CPU; elsewhere
    ``Settings.index_chunk_bytes`` of output, rounded up to whole value rows (a value row's bytes
    include its trailing size). Chunks as large as that allows, not needlessly many (on the CPU, a
    key larger than a chunk is moved part by part)."""
    outs, parts = _outputs(256, micro_batches, mean_len=40)
    rng = np.random.default_rng(7)
    for o in outs:
        lengths = o["model_output"]["k0"].offsets().diff().tolist()
        x = jagged(random_tensor(rng, (sum(lengths), *trailing), "float32"), lengths)
        o["model_output"] = {"k0": x.to(device)}
    total = sum(o["model_output"]["k0"].values().shape[0] for o in outs)
    row_bytes = 4 * math.prod(trailing)
    chunk_bytes = total * row_bytes // 16 + 2  # about 16 chunks; not a multiple of a row's bytes
    chunk = -(-chunk_bytes // row_bytes) if device == "meta" else total // 16 + 1
    settings = {"index_chunk_bytes": chunk_bytes} if device == "meta" else {"cpu_index_chunk": chunk}
    real_scatter = torch_impl._host._scatter

    def scatter(dest: np.ndarray, where: np.ndarray, src: np.ndarray) -> None:  # the CPU's NumPy index path
        seen.largest = max(seen.largest, where.size)
        seen.calls += 1
        real_scatter(dest, where, src)

    with (
        torch_impl.use_settings(row_copy_min_elements=math.inf, **settings),
        _LargestIndex() as seen,
        mock.patch.object(torch_impl._host, "_scatter", scatter),
    ):
        got = torch_impl.postprocess_batch(outs, parts)
    if device == "cpu":
        assert_same(got, verl_postprocess_batch_func(outs, parts, None))
    assert seen.largest == chunk, (seen.largest, total)
    sizes = [o["model_output"]["k0"].values().shape[0] for o in outs] if device == "cpu" else [total]
    assert seen.calls == sum(-(-n // chunk) for n in sizes)  # on the CPU part by part
    defaults = torch_impl.get_settings()
    assert (defaults.index_chunk_bytes, defaults.cpu_index_chunk) == (16 * 2**20, 2**14)


def test_row_copies_under_inference_mode(force) -> None:
    force("row_copies")
    outs, parts = _outputs(64, 4, mean_len=50, keys=3)
    want = verl_postprocess_batch_func(outs, parts, None)
    with torch.inference_mode():
        got = torch_impl.postprocess_batch(outs, parts)
    assert_same(got, want)
    assert got["model_output"]["k0"].values().is_inference()


def test_an_error_on_a_later_key_is_raised_after_earlier_keys_were_copied(force) -> None:
    force("row_copies")
    outs, parts = _outputs(64, 4, mean_len=50, keys=2)
    outs[2]["model_output"]["k1"] = outs[2]["model_output"]["k1"].to(torch.float64)
    with pytest.raises(errors.DtypeMismatchError, match="key 'k1', micro-batch 2"):
        torch_impl.postprocess_batch(outs, parts)


def test_long_rows_take_the_row_copy_path_and_match_verl() -> None:
    outs, parts = _outputs(48, 4, mean_len=2048)
    assert_same(torch_impl.postprocess_batch(outs, parts), verl_postprocess_batch_func(outs, parts, None))


def _count_long(b: int) -> Counter[str]:
    outs, parts = _outputs(b, 8, seed=b, mean_len=1500)
    with torch_impl.use_settings(cpu_few_rows=0), CountOps() as counter:  # not the few-rows path at B=64
        torch_impl.postprocess_batch(outs, parts)
    return counter.ops


def test_operation_count_does_not_grow_with_rows_on_the_row_copy_path() -> None:
    small, large = _count_long(64), _count_long(512)
    assert "aten.index_copy_.default" not in small  # the rows moved as byte slices, not by indices
    assert small == large, f"ops differ: {small - large} vs {large - small}"


def test_padding_marker_survives_pickling() -> None:
    import pickle

    from ref import PADDING

    assert pickle.loads(pickle.dumps(PADDING)) is PADDING
    assert torch_impl.PADDING is PADDING


@pytest.mark.parametrize("parts", [[list(range(32))], [list(range(10)), list(range(10, 32))], [list(range(32)), []]])
def test_partitions_already_in_order_are_one_concatenation(monkeypatch, parts) -> None:
    """The identity permutation (one micro-batch in order, or contiguous micro-batches in order) is
    a plain concatenation of each key (on the CPU, one copy a part), nothing moved by index, with
    verl's result."""
    for mover in ("permute_by_rows", "permute_by_host_indices", "permute_by_indices"):
        monkeypatch.setattr(torch_impl._assemble, mover, mock.Mock(side_effect=AssertionError(mover)))
    concat = mock.Mock(wraps=torch_impl._rowcopy.concat_by_copies)
    monkeypatch.setattr(torch_impl._rowcopy, "concat_by_copies", concat)
    rng = np.random.default_rng(0)
    outs = []
    for part in parts:
        mo = {}
        for k in range(2):
            lengths = rng.integers(0, 100, size=len(part)).tolist()
            mo[f"k{k}"] = jagged(random_tensor(rng, (sum(lengths),), "float32"), lengths)
        outs.append({"model_output": mo})
    with torch_impl.use_settings(cpu_few_rows=0):  # the NumPy host path (the few-rows path copies each row)
        got = torch_impl.postprocess_batch_func(outs, parts, None)
    assert concat.call_count == 2
    assert_same(got, verl_postprocess_batch_func(outs, parts, None))


def test_partitions_in_order_carry_gradients_and_dense_outputs_through() -> None:
    """The identity permutation on the other paths: gradients flow to every micro-batch's values
    (``cat``, differentiable) and a dense output is its parts end to end."""
    parts = [list(range(5)), list(range(5, 12))]
    lengths = [[4, 4, 4, 4, 4], [5, 4, 4, 4, 4, 5, 5]]
    values = [torch.randn(sum(n), requires_grad=True) for n in lengths]
    dense = [torch.randn(len(n), 3) for n in lengths]
    outs = [{"model_output": {"lp": jagged(v, n), "d": d}} for v, n, d in zip(values, lengths, dense, strict=True)]
    got = torch_impl.postprocess_batch(outs, parts)["model_output"]
    assert torch.equal(got["d"], torch.cat(dense))
    assert torch.equal(got["lp"].values(), torch.cat(values))
    (got["lp"].values() * torch.arange(51.0)).sum().backward()
    assert torch.equal(torch.cat([v.grad for v in values]), torch.arange(51.0))


def test_row_copies_step_aside_where_torch_cannot_share_memory_with_numpy(monkeypatch, force) -> None:
    """A torch built against another NumPy cannot lend its storage (``Tensor.numpy()`` raises): the
    torch element-index path then moves the rows (and torch checks the offsets), with the same result."""
    from torch_impl import _host

    force("row_copies")
    outs, parts = _outputs(32, 4, mean_len=50)
    want = torch_impl.postprocess_batch(outs, parts)
    monkeypatch.setattr(_host, "numpy_bridge", lambda: False)
    with CountOps() as counter:
        got = torch_impl.postprocess_batch(outs, parts)
    assert "aten.index_copy_.default" in counter.ops
    assert_same(got, want)


def _path_taken(lengths: list[int], trailing: tuple[int, ...], min_elements: float) -> str:
    """The kernel that moved a two-micro-batch batch of rows of ``lengths`` (values ``[n, *trailing]``)."""
    rng = np.random.default_rng(11)
    half = len(lengths) // 2
    parts = [list(range(half, len(lengths))), list(range(half))]  # the halves swapped: a real permutation
    outs = [
        {"model_output": {"x": jagged(random_tensor(rng, (sum(ls), *trailing), "float32"), ls)}}
        for ls in (lengths[half:], lengths[:half])
    ]
    real = torch_impl._assemble.permute_by_rows
    taken: list[str] = []

    def row_copies(*args: Any) -> torch.Tensor:
        taken.append("row_copies")
        return real(*args)

    with (
        torch_impl.use_settings(row_copy_min_elements=min_elements, cpu_few_rows=0),
        mock.patch.object(torch_impl._assemble, "permute_by_rows", row_copies),
    ):
        torch_impl.postprocess_batch(outs, parts)
    return taken[0] if taken else "element_indices"


@pytest.mark.parametrize("trailing", [(), (4,)])
def test_the_row_copy_threshold_counts_elements_per_row(trailing) -> None:
    """Row copies from ``row_copy_min_elements`` elements per row on average (values per row times the
    trailing size), element indices below: the choice is exact at the boundary."""
    rows, inner = 10, math.prod(trailing)
    at = [2 * 64 // inner] * (rows // 2) + [0] * (rows // 2)  # 64 elements per row on average
    below = [*at[: -rows // 2 - 1], at[0] - 1, *at[rows // 2 :]]  # one value fewer
    assert sum(at) * inner == 64 * rows
    assert sum(below) * inner == 64 * rows - inner
    assert _path_taken(at, trailing, 64) == "row_copies"
    assert _path_taken(below, trailing, 64) == "element_indices"


def test_a_torch_without_numpy_is_detected(monkeypatch) -> None:
    """``Tensor.numpy()`` raising (torch built against another NumPy: "Numpy is not available") means no
    NumPy bridge; the check itself, uncached."""
    from torch_impl import _host

    assert _host.numpy_bridge.__wrapped__() is True

    def unavailable(self):
        raise RuntimeError("Numpy is not available")

    monkeypatch.setattr(torch.Tensor, "numpy", unavailable)
    assert _host.numpy_bridge.__wrapped__() is False


@pytest.mark.parametrize("feature", [(), (4,), (2, 3)])
def test_dense_outputs_come_back_jagged_as_verls(feature) -> None:
    """verl's function returns a dense ``[B, S, *F]`` output as the jagged ``[B, (S), *F]``: so does the
    drop-in, whatever the trailing shape."""
    rng = np.random.default_rng(2)
    indices = [[2, 0], [1, 3]]
    outs = [{"model_output": {"v": random_tensor(rng, (2, 5, *feature), "float32")}} for _ in indices]
    got = torch_impl.postprocess_batch_func(outs, indices, None)
    assert got["model_output"]["v"].is_nested
    assert tuple(got["model_output"]["v"].values().shape) == (20, *feature)
    assert_same(got, verl_postprocess_batch_func(outs, indices, None))


def test_zero_width_dense_outputs_come_back_as_empty_rows() -> None:
    """A dense ``[b, 0]`` output (no tokens) comes back as ``B`` empty rows, as verl's."""
    indices = [[2, 0], [1]]  # B = 3: odd, so that no bit trick passes for B + 1
    outs = [{"model_output": {"v": torch.zeros(len(p), 0)}} for p in indices]
    got = torch_impl.postprocess_batch_func(outs, indices, None)["model_output"]["v"]
    assert got.is_nested
    assert got.offsets().tolist() == [0, 0, 0, 0]
    assert_same(got, verl_postprocess_batch_func(outs, indices, None)["model_output"]["v"])


def test_an_unsupported_dtype_is_named_at_micro_batch_0() -> None:
    import warnings

    with warnings.catch_warnings():  # torch: "ComplexHalf support is experimental"
        warnings.simplefilter("ignore", UserWarning)
        outs = [{"model_output": {"v": torch.zeros(2, 3, dtype=torch.complex32)}} for _ in range(2)]
    with pytest.raises(errors.UnsupportedSettingError, match=r"^key 'v', micro-batch 0: dtype complex32 is not"):
        torch_impl.postprocess_batch(outs, [[0, 1], [2, 3]])


def test_postprocess_batch_settings_are_keyword_only() -> None:
    """``use_dynamic_bsz`` and ``pad_mode`` by position would land on the wrong parameter: keyword-only;
    the outputs and the indices may be named."""
    outs, parts = _outputs(6, 2)
    with pytest.raises(TypeError):
        torch_impl.postprocess_batch(outs, parts, True)  # type: ignore[misc]
    assert_same(torch_impl.postprocess_batch(output_lst=outs, indices=parts), torch_impl.postprocess_batch(outs, parts))


@pytest.mark.parametrize("rows", [2, 300])
@pytest.mark.parametrize("change", [-1, 1])
def test_a_later_key_with_other_row_counts_is_refused_without_dynamic_bsz(rows, change) -> None:
    """Without dynamic batching every key's row count is checked against the first key's, fewer rows or
    more, at any size (300: counts past 256 are distinct int objects)."""
    first = [torch.zeros(rows, 2), torch.zeros(rows, 2)]
    later = [torch.zeros(rows, 2), torch.zeros(rows + change, 2)]
    outs = [{"model_output": {"lp": a, "v": b}} for a, b in zip(first, later, strict=True)]
    message = rf"^key 'v', micro-batch 1: {rows + change} rows, but key 'lp' has {rows} there"
    with pytest.raises(errors.ShapeMismatchError, match=message):
        torch_impl.postprocess_batch(outs, None, use_dynamic_bsz=False)
    outs[1]["model_output"]["v"] = torch.zeros(rows, 2)
    assert torch_impl.postprocess_batch(outs, None, use_dynamic_bsz=False)["model_output"]["v"].shape == (2 * rows, 2)


def test_keys_come_back_in_the_first_micro_batchs_order() -> None:
    """verl's dict is filled in the order it first meets each key: the first micro-batch's order, even
    where a later micro-batch lists the same keys in another."""
    outs, parts = _outputs(6, 2, keys=3)
    last = outs[-1]["model_output"]
    outs[-1]["model_output"] = {k: last[k] for k in reversed(list(last))}
    got = torch_impl.postprocess_batch_func(outs, parts, None)
    assert list(got["model_output"]) == ["k0", "k1", "k2"]
    assert_same(got, verl_postprocess_batch_func(outs, parts, None))


def test_indices_are_ignored_without_dynamic_bsz() -> None:
    """Without dynamic batching verl concatenates in micro-batch order and never reads ``indices``: sizes
    that do not match the micro-batches are not an error there."""
    outs, _ = _outputs(9, 3)
    data = _td(use_dynamic_bsz=False)
    other = [[0], [1, 2, 3, 4], [5, 6, 7, 8]]
    assert_same(torch_impl.postprocess_batch_func(outs, other, data), verl_postprocess_batch_func(outs, other, data))
    assert_same(
        torch_impl.postprocess_batch_func(outs, other, data), torch_impl.postprocess_batch_func(outs, None, data)
    )


@pytest.mark.parametrize("n", [3, 300])
def test_take_names_row_indices_past_int64(n) -> None:
    """Rows past int64 (a list, or uint64) are named, never wrapped; the first bad one is named (at 300
    rows too: counts past 256 are distinct int objects)."""
    x = jagged(torch.arange(float(n)), [1] * n)
    with pytest.raises(errors.RowIndexError, match=rf"^position 1: row index {2**64} is out of range for {n} rows"):
        torch_impl.take(x, [0, 2**64])
    with pytest.raises(errors.RowIndexError, match=rf"^position 0: row index {n} is out of range for {n} rows"):
        torch_impl.take(x, [n, 2**64])
    with pytest.raises(errors.RowIndexError, match=rf"^position 0: row index {2**63} is out of range"):
        torch_impl.take(x, torch.tensor([2**63], dtype=torch.uint64))
    with pytest.raises(errors.RowIndexError, match=r"^position 0: row index -1 is out of range"):
        torch_impl.take(x, [-1, 2**64])  # the first bad one, negative, on the same path


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[0, 1]], r"^rows must be 1-D, got shape \(1, 2\)"),
        (torch.tensor(1), r"^rows must be 1-D, got shape \(\)"),
        ([3, 0, 7], r"^position 0: row index 3 is out of range for 3 rows"),
        ([7], r"^position 0: row index 7 is out of range for 3 rows"),
        ([0, 3], r"^position 1: row index 3 is out of range for 3 rows"),
        ([1, 2**64], r"^position 1: row index 18446744073709551616 is out of range for 3 rows"),
        ([True, 2**64], r"^position 0: row index True is not an integer"),
        (["a", 2**64], r"^position 0: row index 'a' is not an integer"),
        (torch.tensor([0.0]), r"^rows must be integers, got dtype torch\.float32"),
        (torch.tensor([0j]), r"^rows must be integers, got dtype torch\.complex64"),
        (torch.tensor([True]), r"^rows must be integers, got dtype torch\.bool"),
    ],
    ids=[
        "2-D",
        "0-D",
        "first_of_two",
        "past_the_end",
        "at_the_end",
        "list_path_valid_first",
        "list_path_bool",
        "list_path_str",
        "float",
        "complex",
        "bool",
    ],
)
def test_take_refuses_rows_it_cannot_take(rows, message) -> None:
    with pytest.raises(errors.RowIndexError, match=message):
        torch_impl.take(torch.zeros(3, 2), rows)


def test_split_cuts_every_piece_at_its_own_bounds() -> None:
    """Three non-empty pieces of a jagged tensor (and of a TensorDict whose batch has a second
    dimension): each is ``take(x, p)``."""
    parts = [[4, 0], [1], [3, 2]]
    for values in (torch.arange(15.0), torch.arange(30.0).reshape(15, 2)):  # with a trailing dimension too
        x = jagged(values, [1, 2, 3, 4, 5])
        for piece, p in zip(torch_impl.split(x, parts), parts, strict=True):
            assert_same(piece, torch_impl.take(x, p))
    td = TensorDict({"a": torch.arange(8.0).reshape(4, 2)}, batch_size=[4, 2])
    pieces = torch_impl.split(td, [[3], [0, 1], [2]])
    assert [p["a"].tolist() for p in pieces] == [[[6.0, 7.0]], [[0.0, 1.0], [2.0, 3.0]], [[4.0, 5.0]]]
    assert torch_impl.take(td, [3, 0])["a"].tolist() == [[6.0, 7.0], [0.0, 1.0]]


def test_concat_key_is_keyword_only() -> None:
    """``key`` (the name in error messages) by position would be taken for a part: keyword-only."""
    x = jagged(torch.arange(3.0), [1, 2])
    with pytest.raises(TypeError):
        torch_impl.concat([x], "lp")  # type: ignore[misc]
    assert_same(torch_impl.concat([x], key="lp"), torch_impl.concat([x]))


@pytest.mark.parametrize("field", ["cpu_prefault_min_bytes", "cpu_hugepage_min_bytes"])
def test_the_page_knobs_refuse_a_negative_size(field) -> None:
    with pytest.raises(ValueError, match=field):
        torch_impl.Settings(**{field: -1})


def test_a_large_fresh_output_is_advised_only_inside_its_own_pages(monkeypatch) -> None:
    """From ``cpu_hugepage_min_bytes`` the whole 2 MiB pages inside the output are advised
    ``MADV_HUGEPAGE`` (14), then its whole 4 KiB pages ``MADV_POPULATE_WRITE`` (23); below it only the
    latter; never a byte outside the buffer. Results are the same with and without the advice."""
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(
        torch_impl._host, "_madvise", lambda: lambda start, size, advice: calls.append((start, size, advice))
    )
    monkeypatch.setattr(torch_impl._host, "huge_pages_without_stalls", lambda: True)
    like = torch.zeros(1, dtype=torch.float32)
    n = 3 * 2**19 + 123  # 6 MiB and a bit: one or two whole 2 MiB pages, wherever it starts
    with torch_impl.use_settings(cpu_prefault_min_bytes=2**20, cpu_hugepage_min_bytes=4 * 2**20):
        out = torch_impl._host.fresh_output(like, (n,))
        small = torch_impl._host.fresh_output(like, (2**19,))
    ptr, end = out.data_ptr(), out.data_ptr() + 4 * n
    (h_start, h_size, h_adv), (p_start, p_size, p_adv), (s_start, s_size, s_adv) = calls
    assert (h_adv, p_adv, s_adv) == (14, 23, 23)
    assert h_start % 2**21 == 0
    assert h_size % 2**21 == 0
    assert h_size >= 2**21
    assert ptr <= h_start
    assert h_start - ptr < 2**21
    assert end - 2**21 < h_start + h_size <= end
    assert p_start % 4096 == 0
    assert ptr <= p_start < ptr + 4096
    assert end - 4096 < p_start + p_size <= end
    assert small.data_ptr() <= s_start
    assert s_start + s_size <= small.data_ptr() + 4 * 2**19

    monkeypatch.undo()
    outs, parts = _outputs(256, 4, mean_len=300)
    with torch_impl.use_settings(cpu_prefault_min_bytes=math.inf, cpu_hugepage_min_bytes=math.inf):
        plain = torch_impl.postprocess_batch(outs, parts)
    with torch_impl.use_settings(cpu_prefault_min_bytes=0, cpu_hugepage_min_bytes=0):
        advised = torch_impl.postprocess_batch(outs, parts)
    assert_same(advised, plain)


@pytest.mark.parametrize("floor", [0, math.inf])
@pytest.mark.parametrize("chunk", [4096, 3 * 4096 + 5, 2**16, 2**30])
@pytest.mark.parametrize("seed", range(4))
def test_the_row_copies_fault_each_page_in_once_before_the_rows_that_write_it(monkeypatch, chunk, seed, floor) -> None:
    """`fault_plan`: its groups cover every row once, in order; every whole page inside the output is
    advised exactly once (``MADV_POPULATE_WRITE``, nothing outside the buffer), before any row writes
    it and just before the first one that does (faulted in as the copies reach them; below
    ``cpu_fault_chunks_min_bytes``, all at once before the first row); long rows, empty rows and a
    single row among them."""
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(
        torch_impl._host, "_madvise", lambda: lambda start, size, advice: calls.append((start, size, advice))
    )
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 3 * 4096, size=int(rng.integers(1, 300)))
    lengths[rng.random(lengths.shape[0]) < 0.05] *= 40  # a few rows many pages long
    lengths[0] += 3 * 4096  # whole pages inside the output, wherever it starts
    ends = np.cumsum(lengths)
    out = torch.empty(int(ends[-1]) + 1, dtype=torch.uint8)[1:]  # starts inside a page
    with torch_impl.use_settings(
        cpu_prefault_min_bytes=0, cpu_fault_chunk_bytes=chunk, cpu_fault_chunks_min_bytes=floor
    ):
        plan = torch_impl._host.fault_plan(out, ends)
        for _, start, size in plan:
            torch_impl._host.fault_in(start, size)
    assert sum(rows for rows, _, _ in plan) == lengths.shape[0]
    assert all(advice == 23 for _, _, advice in calls)
    ptr, nbytes = out.data_ptr(), int(ends[-1])
    first, last = -(-ptr // 4096) * 4096, (ptr + nbytes) // 4096 * 4096
    spans = [(start, start + size) for _, start, size in plan if size]
    assert [(s, s + n) for s, n, _ in calls] == spans
    assert spans[0][0] == first
    assert spans[-1][1] == last
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # each page once, in order
    assert all(s % 4096 == 0 and e % 4096 == 0 and e > s for s, e in spans)
    assert (len(spans) == 1) is (floor == math.inf or chunk >= nbytes)
    faulted, row = first, 0
    for rows, start, size in plan:
        if size:  # just in time: the group's first row writes its first page, the row before does not
            faulted = start + size
            assert ptr + int(ends[row]) > start
            assert row == 0 or ptr + int(ends[row - 1]) <= start
        for r in range(row, row + rows):
            assert min(ptr + int(ends[r]), last) <= faulted  # every whole page the row writes is in
        row += rows


@pytest.mark.parametrize("chunk", [1, 4096, 3 * 4096 + 5, 2**30])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_concatenation_by_copies_is_cat_bit_for_bit(chunk, dtype) -> None:
    """`concat_by_copies`: the values ``torch.cat`` gives (NaN payloads, dtype and shape), in pieces of
    any size (rounded to whole pages), empty parts and a part smaller than a piece among them, faulted
    in by chunks or whole."""
    from torch_impl._parts import JaggedPart
    from torch_impl._rowcopy import concat_by_copies

    rng = np.random.default_rng(chunk)
    values = [random_tensor(rng, (n, 3), dtype) for n in (0, 5000, 1, 0, 7001)]
    parts = [JaggedPart(v, torch.tensor([0, v.shape[0]]), 1) for v in values]
    total = sum(v.shape[0] for v in values)
    for floor in (0, math.inf):  # faulted in by chunks, then whole
        with torch_impl.use_settings(
            cpu_prefault_min_bytes=0, cpu_fault_chunks_min_bytes=floor, cpu_fault_chunk_bytes=chunk
        ):
            got = concat_by_copies(parts, total)
        want = torch.cat(values)
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("floor", [0, math.inf])
def test_a_large_concatenation_is_one_cat_and_a_smaller_one_copies(monkeypatch, floor) -> None:
    """From ``cpu_parallel_concat_min_bytes`` a host concatenation is ``torch.cat`` (torch's threads),
    below it `concat_by_copies` (the calling thread); the same values either way."""
    outs, parts = _outputs(64, 1, mean_len=50)
    parts = [sorted(parts[0])]
    concat = mock.Mock(wraps=torch_impl._rowcopy.concat_by_copies)
    monkeypatch.setattr(torch_impl._rowcopy, "concat_by_copies", concat)
    with torch_impl.use_settings(cpu_parallel_concat_min_bytes=floor, cpu_few_rows=0), CountOps() as counter:
        got = torch_impl.postprocess_batch(outs, parts)
    assert concat.called is (floor != 0)
    assert ("aten.cat.default" in counter.ops) is (floor == 0)
    assert_same(got, verl_postprocess_batch_func(outs, parts, None))


def test_a_fault_group_is_whole_pages_and_a_whole_huge_page_where_huge_pages_are_advised(monkeypatch) -> None:
    with torch_impl.use_settings(cpu_fault_chunk_bytes=3 * 4096 + 5, cpu_hugepage_min_bytes=2**25):
        assert torch_impl._host.fault_step(2**30) == 3 * 4096
        with torch_impl.use_settings(cpu_fault_chunk_bytes=1):
            assert torch_impl._host.fault_step(2**30) == 4096
        monkeypatch.setattr(torch_impl._host, "huge_pages_without_stalls", lambda: True)
        assert torch_impl._host.fault_step(2**30) == 2**21
        assert torch_impl._host.fault_step(2**24) == 3 * 4096  # below the huge-page floor


@pytest.mark.parametrize("trailing", [(), (3,), (2, 5), (0,)])
@pytest.mark.parametrize("dtype", [*DTYPES, "complex64"])
def test_dense_outputs_on_the_host_move_whole_rows_bit_for_bit(monkeypatch, dtype, trailing) -> None:
    """Dense CPU parts NumPy may move: under a permutation, whole rows scattered with NumPy
    (`scatter_rows`), in order by copies; the values of ``cat`` and ``index_copy_`` (torch's dense
    path), NaN payloads, dtype and shape included, for rows of any width (none included)."""
    scatter = mock.Mock(wraps=torch_impl._assemble.scatter_rows)
    monkeypatch.setattr(torch_impl._assemble, "scatter_rows", scatter)
    rng = np.random.default_rng(len(trailing))
    perm = rng.permutation(40).tolist()
    for parts in ([perm[:7], [], perm[7:30], perm[30:]], [list(range(25)), list(range(25, 40))]):
        values = [random_tensor(rng, (len(p), *trailing), dtype) for p in parts]
        outs = [{"model_output": {"d": v}} for v in values]
        with torch_impl.use_settings(cpu_dense_host_min_elements=0):
            got = torch_impl.postprocess_batch(outs, parts)["model_output"]["d"]
        flat = torch.tensor([i for p in parts for i in p])
        whole = torch.cat(values)
        want = whole.new_empty(whole.shape).index_copy_(0, flat, whole)
        assert_same(got, want)
        assert_same(torch_impl.postprocess_batch(outs, parts)["model_output"]["d"], want)  # below the floor: torch's
    assert scatter.call_count == 1  # the first partition on the host; the second is in order


def _pieces_of(rows: np.ndarray, partitions: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The row copies' pieces (`torch_impl._rowcopy._copy_pieces`' ``dest``, ``part_of_piece``,
    ``begin``) of rows of ``rows[i]`` bytes (by original index) in these partitions, in output order."""
    part = np.empty(rows.shape[0], dtype=np.int64)
    begin = np.empty(rows.shape[0], dtype=np.int64)
    for m, p in enumerate(partitions):
        part[p] = m
        begin[p] = np.cumsum(rows[p]) - rows[p]  # each row's first byte inside its part
    return np.concatenate(([0], np.cumsum(rows))), part, begin


def _byte_sources(dest: np.ndarray, part: np.ndarray, begin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each output byte's part and byte there, as pieces copy them."""
    sizes = np.diff(dest)
    return np.repeat(part, sizes), np.repeat(begin - dest[:-1], sizes) + np.arange(dest[-1])


def _joined_one_by_one(
    dest: np.ndarray, part: np.ndarray, begin: np.ndarray, step: int, origin: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`join_runs`' meaning, a piece at a time: a piece joins the run before it where it has the run's
    part, its source starts where the run's last piece's ends, and it starts in the fault group
    (``step`` bytes from byte ``origin``) where the run's first starts."""
    first = [0]
    for k in range(1, part.shape[0]):
        run = first[-1]
        if not (
            part[k] == part[k - 1]
            and begin[k] == begin[k - 1] + dest[k] - dest[k - 1]
            and (dest[k] - origin) // step == (dest[run] - origin) // step
        ):
            first.append(k)
    return np.append(dest[first], dest[-1]), part[first], begin[first]


@pytest.mark.parametrize("step", [1, 7, 64, 2**40])
@pytest.mark.parametrize("seed", range(8))
def test_joined_runs_copy_each_byte_from_where_its_row_does(seed, step) -> None:
    """`join_runs`: the pieces a one-by-one join gives (`_joined_one_by_one`), which write every output
    byte from the byte the rows' own copies take it from; with fewer pieces continuing the one before
    than ``cpu_join_min_neighbours``, the pieces as they are (and from exactly that many, joined).
    Partitions in ascending order (as verl's) or not, empty rows and empty partitions among them, fault
    groups from the output's first byte or a later one."""
    from torch_impl._rowcopy import join_runs

    rng = np.random.default_rng(seed)
    b = int(rng.integers(2, 300))
    perm = rng.permutation(b)
    partitions = np.split(perm, np.sort(rng.integers(0, b + 1, size=int(rng.integers(0, 6)))))
    partitions = [np.sort(p) if rng.random() < 0.75 else p for p in partitions]
    rows = rng.integers(0, 40, size=b) * (rng.random(b) > 0.1)
    dest, part, begin = _pieces_of(rows, partitions)
    origin = int(rng.integers(0, step)) if step < 2**40 else 0
    continuing = int(np.count_nonzero((np.diff(part) == 0) & (np.diff(begin) == np.diff(dest[:-1]))))
    want = _joined_one_by_one(dest, part, begin, step, origin)
    if step == 2**40:  # every continuing piece joins
        assert want[1].shape[0] == b - continuing
    for least in (0, continuing):
        with torch_impl.use_settings(cpu_join_min_neighbours=least):
            got = join_runs(dest, part, begin, step, origin)
        for a, w in zip(got, want, strict=True):
            assert np.array_equal(a, w)
        for a, w in zip(_byte_sources(*got), _byte_sources(dest, part, begin), strict=True):
            assert np.array_equal(a, w)
    with torch_impl.use_settings(cpu_join_min_neighbours=continuing + 1):
        got = join_runs(dest, part, begin, step, origin)
    assert got[0] is dest
    assert got[1] is part
    assert got[2] is begin


@pytest.mark.parametrize(("dtype", "trailing"), [("float32", ()), ("bfloat16", (5,)), ("int8", (2,)), ("int64", (0,))])
@pytest.mark.parametrize("ascending", [True, False])
def test_row_copies_with_runs_joined_are_the_rows_copied_one_by_one(monkeypatch, dtype, trailing, ascending) -> None:
    """Row copies with runs joined: the values of the copies one a row and of verl's function, bit for
    bit; the pieces copied are the rows' own joined one by one (`_joined_one_by_one`) within the fault
    groups `fault_plan` makes (one page each, counted from the output's first whole page; and the
    default 256 KiB), and one a row when joining is off. Partitions ascending (as verl's) or not."""
    rng = np.random.default_rng(len(trailing))
    perm = rng.permutation(600)
    partitions = [perm[a:b].tolist() for a, b in ((0, 150), (150, 300), (300, 301), (301, 600))]
    partitions = [sorted(p) if ascending else p for p in partitions]
    outs, lengths = [], np.zeros(600, dtype=np.int64)
    for p in partitions:
        rows = rng.integers(0, 300, size=len(p))
        lengths[p] = rows
        values = random_tensor(rng, (int(rows.sum()), *trailing), dtype)
        outs.append({"model_output": {"k": jagged(values, rows.tolist())}})
    row_bytes = torch.empty((), dtype=getattr(torch, dtype)).element_size() * math.prod(trailing)
    rows_pieces = _pieces_of(lengths * row_bytes, [np.asarray(p) for p in partitions])
    pieces = mock.Mock(wraps=torch_impl._rowcopy._copy_pieces)
    monkeypatch.setattr(torch_impl._rowcopy, "_copy_pieces", pieces)
    with torch_impl.use_settings(row_copy_min_elements=0, cpu_few_rows=0, cpu_join_min_neighbours=sys.maxsize):
        apart = torch_impl.postprocess_batch(outs, partitions)
    assert pieces.call_args.args[3].shape[0] == 600  # one piece a row
    assert_same(apart, verl_postprocess_batch_func(outs, partitions, None))
    for chunks, step in (({"cpu_fault_chunk_bytes": 4096, "cpu_fault_chunks_min_bytes": 0}, 4096), ({}, 2**18)):
        with torch_impl.use_settings(
            row_copy_min_elements=0, cpu_few_rows=0, cpu_join_min_neighbours=0, cpu_prefault_min_bytes=0, **chunks
        ):
            assert_same(torch_impl.postprocess_batch(outs, partitions), apart)
        out, _, dest, part, begin, _ = pieces.call_args.args
        want = _joined_one_by_one(*rows_pieces, step, -out.data_ptr() % 4096)
        for got, w in zip((dest, part, begin), want, strict=True):
            assert np.array_equal(got, w)
        if ascending and row_bytes:
            assert part.shape[0] < 600


def test_faulting_in_by_chunks_changes_no_byte() -> None:
    outs, parts = _outputs(256, 4, mean_len=3000, keys=2)
    with torch_impl.use_settings(cpu_prefault_min_bytes=math.inf):
        plain = torch_impl.postprocess_batch(outs, parts)
    with torch_impl.use_settings(cpu_prefault_min_bytes=0, cpu_fault_chunk_bytes=4096, cpu_fault_chunks_min_bytes=0):
        chunked = torch_impl.postprocess_batch(outs, parts)
    assert_same(chunked, plain)


@pytest.mark.parametrize(
    ("enabled", "defrag", "advised"),
    [
        ("always [madvise] never", "always defer [defer+madvise] madvise never", False),
        ("always [madvise] never", "always defer defer+madvise [madvise] never", False),
        ("always [madvise] never", "always [defer] defer+madvise madvise never", True),
        ("always [madvise] never", "always defer defer+madvise madvise [never]", True),
        ("[always] madvise never", "always [defer] defer+madvise madvise never", False),
        ("always madvise [never]", "always [defer] defer+madvise madvise never", False),
        (None, None, False),
    ],
)
def test_huge_pages_only_where_the_kernel_never_stalls_for_them(tmp_path, monkeypatch, enabled, defrag, advised):
    """``MADV_HUGEPAGE`` only under THP ``enabled=madvise`` with ``defrag=defer`` or ``never``: the other
    defrag modes compact memory in the faulting thread (seconds, measured), and without the sysfs
    files (not Linux, or no THP) nothing is advised."""
    if enabled is not None:
        (tmp_path / "enabled").write_text(enabled + "\n")
        (tmp_path / "defrag").write_text(defrag + "\n")
    monkeypatch.setattr(torch_impl._host, "_THP", tmp_path)
    torch_impl._host.huge_pages_without_stalls.cache_clear()
    try:
        assert torch_impl._host.huge_pages_without_stalls() is advised
        calls: list[int] = []
        monkeypatch.setattr(torch_impl._host, "_madvise", lambda: lambda start, size, advice: calls.append(advice))
        with torch_impl.use_settings(cpu_prefault_min_bytes=0, cpu_hugepage_min_bytes=0):
            torch_impl._host.fresh_output(torch.zeros(1), (2**21,))
        assert (14 in calls) is advised
        assert calls[-1] == 23
    finally:
        torch_impl._host.huge_pages_without_stalls.cache_clear()


def test_the_address_space_view_reads_and_writes_a_tensor_at_its_address() -> None:
    """`address_space`: bytes ``a`` to ``b`` of it are the memory at those addresses (one view, made once)."""
    from torch_impl._host import address_space

    x = torch.arange(16, dtype=torch.int32)
    memory, ptr = address_space(), x.data_ptr()
    assert address_space() is memory
    assert bytes(memory[ptr : ptr + 64]) == x.numpy().tobytes()
    memory[ptr : ptr + 4] = memory[ptr + 60 : ptr + 64]
    assert x[0].item() == 15


def _ranges() -> tuple[torch.Tensor, list[torch.Tensor], dict[str, np.ndarray]]:
    """Two sources of 40 and 0 bytes and an output of 48: four pieces, each inside its tensors."""
    sources = [torch.zeros(10, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)]
    pieces = {
        "dest_begin": np.array([0, 8, 48, 20]),
        "nbytes": np.array([8, 12, 0, 28]),
        "source_of_piece": np.array([0, 0, 1, 0]),
        "begin": np.array([32, 0, 0, 12]),
    }
    return torch.zeros(12, dtype=torch.int32), sources, pieces


@pytest.mark.parametrize(
    ("field", "k", "value"),
    [
        ("begin", 0, 33),  # past the source's end by one byte
        ("begin", 1, -1),
        ("nbytes", 1, -4),
        ("nbytes", 3, 29),
        ("dest_begin", 3, 21),  # past the output's end by one byte
        ("dest_begin", 0, -8),
        ("source_of_piece", 0, 1),  # a piece of the empty source
    ],
)
def test_host_copies_refuse_a_piece_outside_its_tensors(field, k, value) -> None:
    """`check_ranges`, the guard of the copies by address: every piece inside its source and the
    output, to the byte (each bound met exactly passes); one byte outside raises."""
    from torch_impl._rowcopy import check_ranges

    out, sources, pieces = _ranges()
    check_ranges(out, sources, *pieces.values())  # each piece ends exactly at its tensor's end, or is empty
    pieces[field] = pieces[field].copy()
    pieces[field][k] = value
    with pytest.raises(RuntimeError, match="byte ranges fall outside its tensors"):
        check_ranges(out, sources, *pieces.values())


@pytest.mark.parametrize("few_rows", [0, 128], ids=["row_copies", "few_rows"])
def test_planned_copies_are_made_when_run_and_hold_their_tensors(few_rows: int) -> None:
    """With a ``moves`` list, `assemble` returns outputs whose values come only when the moves run, and
    the moves keep the parts they read alive: the caller may drop every input first (the row copies
    and the few-rows path)."""
    import gc
    import weakref

    from torch_impl._assemble import assemble
    from torch_impl._parts import check_parts
    from torch_impl._permutation import check_permutation

    outs, parts = _outputs(64, 4, keys=2, mean_len=50)
    want = torch_impl.postprocess_batch(outs, parts)["model_output"]
    perm = check_permutation(parts, 64)
    moves: list[Any] = []
    with torch_impl.use_settings(row_copy_min_elements=0, cpu_few_rows=few_rows):
        got = {k: assemble(check_parts([o["model_output"][k] for o in outs], k), perm, k, None, moves) for k in want}
    assert len(moves) == 2
    watch = [weakref.ref(o["model_output"]["k0"]._values) for o in outs]
    del outs
    gc.collect()
    assert all(w() is not None for w in watch)  # held by the moves
    for k in want:
        got[k].values().fill_(0)  # what the moves overwrite
    for move in moves:
        move()
    for k, v in want.items():  # bit for bit (NaN payloads among the values)
        assert torch.equal(got[k].values().view(torch.uint8), v.values().view(torch.uint8))
        assert torch.equal(got[k].offsets(), v.offsets())
    del moves
    gc.collect()
    assert all(w() is None for w in watch)


def _count_few_rows(monkeypatch) -> mock.Mock:
    """A spy on the few-rows assembly, where a call taken whole (`torch_impl._fewrows.few_rows_call`) and
    the general pipeline's `assemble` each call it."""
    few = mock.Mock(wraps=torch_impl._fewrows.assemble_few_rows)
    monkeypatch.setattr(torch_impl._assemble, "assemble_few_rows", few)
    monkeypatch.setattr(torch_impl._fewrows, "assemble_few_rows", few)
    return few


def _few_rows_outputs(rng: np.random.Generator, parts: list[list[int]], dtype: str, trailing: tuple[int, ...]):
    """One jagged key ``x`` per micro-batch of ``parts``: rows of 0 to 6 values (empty rows included)."""
    outs = []
    for part in parts:
        lengths = rng.integers(0, 7, size=len(part)).tolist()
        outs.append({"model_output": {"x": jagged(random_tensor(rng, (sum(lengths), *trailing), dtype), lengths)}})
    return outs


@pytest.mark.parametrize("trailing", [(), (3,), (2, 5), (0,)])
@pytest.mark.parametrize("dtype", [*DTYPES, "complex64"])
def test_the_few_rows_path_gives_the_numpy_paths_result_bit_for_bit(monkeypatch, dtype, trailing) -> None:
    """Below ``cpu_few_rows`` rows a CPU jagged key is assembled with Python-int bookkeeping and a copy
    a row (`torch_impl._fewrows`); its result is the NumPy host path's and verl's, NaN payloads, dtype
    and shape included: permuted, with an empty micro-batch, in order (the identity), one micro-batch."""
    few = _count_few_rows(monkeypatch)
    rng = np.random.default_rng(len(trailing))
    perm = rng.permutation(40).tolist()
    cases = [[perm[:7], [], perm[7:30], perm[30:]], [list(range(25)), list(range(25, 40))], [perm], [[0]]]
    for parts in cases:
        outs = _few_rows_outputs(rng, parts, dtype, trailing)
        with torch_impl.use_settings(cpu_few_rows=0):
            want = torch_impl.postprocess_batch(outs, parts)["model_output"]["x"]
        assert few.call_count == 0
        got = torch_impl.postprocess_batch_func(outs, parts, None)["model_output"]["x"]
        assert few.call_count == 1
        few.reset_mock()
        assert_same(got, want)
        assert_same(got, verl_postprocess_batch_func(outs, parts, None)["model_output"]["x"])


def test_the_few_rows_path_stops_at_its_rows_and_at_the_prefault_floor(monkeypatch) -> None:
    """``cpu_few_rows`` rows take it, one more does not; nor does an output of ``cpu_prefault_min_bytes``
    (its pages are faulted in by the NumPy path), nor values that require grad."""
    few = _count_few_rows(monkeypatch)
    rng = np.random.default_rng(5)
    for rows, taken in ((12, True), (13, False)):
        parts = [rng.permutation(rows).tolist()]
        outs = _few_rows_outputs(rng, parts, "float32", ())
        with torch_impl.use_settings(cpu_few_rows=12):
            got = torch_impl.postprocess_batch(outs, parts)
        assert few.call_count == taken
        few.reset_mock()
        assert_same(got["model_output"], verl_postprocess_batch_func(outs, parts, None)["model_output"])
    outs = [{"model_output": {"x": jagged(torch.zeros(64, 4), [10, 20, 30, 4])}}]  # 1024 bytes
    for floor, taken in ((1025, True), (1024, False), (1023, False), (0, False)):  # under the floor only
        with torch_impl.use_settings(cpu_prefault_min_bytes=floor):
            torch_impl.postprocess_batch(outs, [[3, 1, 0, 2]])
        assert few.call_count == taken, floor
        few.reset_mock()
    values = torch.zeros(64, 4, requires_grad=True)
    torch_impl.postprocess_batch([{"model_output": {"x": jagged(values, [10, 20, 30, 4])}}], [[3, 1, 0, 2]])
    assert few.call_count == 0


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ([1, 2, 3], r"micro-batch 1: offsets\[0\] must be 0, got 1"),
        ([0, 2, 1, 3], r"micro-batch 1: offsets must be non-decreasing, got offsets\[1\] = 2 > offsets\[2\] = 1"),
        ([0, 1, 2], r"micro-batch 1: offsets\[-1\] must equal len\(values\) = 3, got 2"),
    ],
)
def test_the_few_rows_path_rejects_bad_offsets_as_the_numpy_path_does(offsets, message) -> None:
    """The same checks and messages on both host paths (`check_few_offsets`, `host_lengths`), the defect
    in the second micro-batch after a valid first."""
    good = jagged(torch.arange(4.0), [1, 3])
    bad = torch_impl._jagged.njt(torch.arange(3.0), torch.tensor(offsets, dtype=torch.int64))
    outs = [{"model_output": {"lp": good}}, {"model_output": {"lp": bad}}]
    rows = 2 + len(offsets) - 1
    parts = [[0, rows - 1], list(range(1, rows - 1))]
    for few_rows in (0, 128):
        with torch_impl.use_settings(cpu_few_rows=few_rows), pytest.raises(errors.InvalidJaggedError, match=message):
            torch_impl.postprocess_batch(outs, parts)


def test_a_few_rows_copy_past_its_output_is_refused(monkeypatch) -> None:
    """The few-rows path's guard: a defect that left the rows' lengths (which size the output) out of
    step with their spans raises before any byte is written past the output."""
    from torch_impl import _fewrows
    from torch_impl._parts import check_parts

    x = jagged(torch.arange(6.0), [2, 4])
    parts = check_parts([x], "lp")
    real = _fewrows.check_few_offsets

    def short(parts: Any, key: Any) -> Any:
        lengths, offsets = real(parts, key)
        return [n - 1 for n in lengths], offsets  # two value rows fewer than the spans hold

    monkeypatch.setattr(_fewrows, "check_few_offsets", short)
    with pytest.raises(RuntimeError, match="a defect of rebatch"):
        _fewrows.assemble_few_rows(parts, "lp", [1, 0])
    moves: list[Any] = []
    _fewrows.assemble_few_rows(parts, "lp", [1, 0], moves)  # planned: refused when it runs
    with pytest.raises(RuntimeError, match="a defect of rebatch"):
        moves[0]()


def test_touch_pages_writes_one_line_of_zeros_at_each_whole_page_and_nothing_else() -> None:
    """`touch_pages`: the first 64 bytes of every whole page inside the tensor become zeros; every other
    byte, inside the tensor or around it (partial pages at either end included), is left as it was."""
    from torch_impl._host import touch_pages

    base = torch.full((7 * 4096 + 300,), 0xAB, dtype=torch.uint8)
    for begin, end in ((37, 6 * 4096 + 200), (4096 - base.data_ptr() % 4096, 7 * 4096), (5, 4000)):
        base.fill_(0xAB)
        x = base[begin:end]
        touch_pages(x.view(torch.float32) if (end - begin) % 4 == 0 else x)
        want = np.full(base.shape[0], 0xAB, dtype=np.uint8)
        ptr = base.data_ptr()
        first = -(-(ptr + begin) // 4096) * 4096 - ptr
        for page in range(first, end - 4096 + 1, 4096):
            want[page : page + 64] = 0
        assert np.array_equal(base.numpy(), want), (begin, end)


@pytest.mark.parametrize("threads", [2, 1])
def test_large_outputs_fault_in_on_torchs_threads(monkeypatch, threads: int) -> None:
    """From ``cpu_parallel_fault_min_bytes``, where torch has more than one thread, a fresh host output is
    faulted in by `touch_pages` (no ``MADV_POPULATE_WRITE``, no fault plan); with one thread, by the
    advice as below it. The same values on every host path (row copies, NumPy scatters, dense rows)."""
    advice: list[int] = []
    real_madvise = torch_impl._host._madvise()

    def madvise(start: int, size: int, adv: int) -> int:
        advice.append(adv)
        return real_madvise(start, size, adv) if real_madvise is not None else 0

    monkeypatch.setattr(torch_impl._host, "_madvise", lambda: madvise)
    touch = mock.Mock(wraps=torch_impl._host.touch_pages)
    monkeypatch.setattr(torch_impl._host, "touch_pages", touch)
    monkeypatch.setattr(torch_impl._host.torch, "get_num_threads", lambda: threads)
    outs, parts = _outputs(256, 4, mean_len=300)
    for o in outs:
        o["model_output"]["d"] = torch.arange(o["model_output"]["k0"].size(0) * 40.0).reshape(-1, 40)
    plain = torch_impl.postprocess_batch(outs, parts)  # 300 KiB a key: below every floor
    assert touch.call_count == 0
    for path in ("row_copies", "element_indices"):
        with (
            forced(path),
            torch_impl.use_settings(
                cpu_prefault_min_bytes=0, cpu_parallel_fault_min_bytes=0, cpu_dense_host_min_elements=0
            ),
        ):
            got = torch_impl.postprocess_batch(outs, parts)
        assert_same(got, plain)
        assert touch.call_count == (2 if threads > 1 else 0), path  # the jagged key and the dense one
        assert (23 in advice) is (threads == 1)  # MADV_POPULATE_WRITE
        touch.reset_mock()
        advice.clear()


@pytest.mark.parametrize("name", [b[0] for b in torch_impl._settings._BOUNDS])
def test_every_knob_refuses_a_value_below_its_bound_and_a_non_integer_where_it_counts(name: str) -> None:
    from torch_impl._settings import _BOUNDS

    integer, least = next((i, lo) for n, i, lo in _BOUNDS if n == name)
    for low in (least - 1, -1, float("nan")) if not integer else (least - 1, -1):
        with pytest.raises(ValueError, match=rf"^{name} must be >= {least}, got {low}$"):
            torch_impl.Settings(**{name: low})
    torch_impl.Settings(**{name: least})  # the bound itself is allowed
    assert getattr(torch_impl.Settings(**{name: least + 1}), name) == least + 1
    kind = "an integer" if integer else "a number"
    for bad in (True, None, "1", 1.5) if integer else (True, None, "1"):
        with pytest.raises(ValueError, match=rf"^{name} must be {kind}, got {bad!r}$"):
            torch_impl.Settings(**{name: bad})
    if not integer:  # a float bound (``math.inf``: never) is a number
        torch_impl.Settings(**{name: math.inf})


def test_the_bounds_table_names_every_knob_in_the_fields_order() -> None:
    from torch_impl._settings import _BOUNDS

    assert [b[0] for b in _BOUNDS] == [f.name for f in dataclasses.fields(torch_impl.Settings)]
