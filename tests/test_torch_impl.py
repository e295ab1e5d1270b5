"""What production adds: verl's call with a TensorDict, gradients, Metric objects, TensorDicts in
take/split, non-contiguous nested tensors, and a constant number of torch operations whatever B is."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
from collections import Counter
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, TensorDict

import torch_impl
import torch_impl._hostcopy
import torch_impl._indexcopy
import torch_impl._kernels
import torch_impl._parts
import torch_impl._permutation
import torch_impl._plan
from property_tests.baseline import verl_postprocess_batch_func
from property_tests.compare import assert_same
from property_tests.data import DTYPES, jagged, random_tensor, rows_of
from property_tests.kernels import KERNELS, forced
from property_tests.metric import FakeMetric
from property_tests.opcount import CountOps
from ref import errors
from ref._torch_private import TorchDispatchMode, neg_view


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
    [
        None,
        _td(),
        _td(use_dynamic_bsz=True),
        _td(pad_mode=DatasetPadMode.NO_PADDING),
        _td(pad_mode="no_padding"),
    ],
    ids=["none", "empty", "dynamic", "enum_pad_mode", "str_pad_mode"],
)
def test_postprocess_batch_func_reads_settings_like_verl(data) -> None:
    outs, parts = _outputs(16, 3)
    assert_same(
        torch_impl.postprocess_batch_func(outs, parts, data), verl_postprocess_batch_func(outs, parts, data)
    )


@pytest.mark.parametrize(
    "value", [True, 0, "no_padding", DatasetPadMode.RIGHT, torch.tensor(1), [1, 2], None]
)
def test_a_setting_is_read_as_its_non_tensor_datas_data(value) -> None:
    """A ``NonTensorData`` setting is read as its field is stored (not through tensorclass's slow attribute
    hook): the very object ``.data`` gives, whatever it holds."""
    from torch_impl._postprocess import read_setting

    data = _td(k=value)
    assert read_setting(data, "k", "default") is data.get("k").data


@pytest.mark.filterwarnings(
    "ignore:os.fork:RuntimeWarning"
)  # multiprocessing's resource tracker, with JAX loaded
@pytest.mark.parametrize("value", [False, 0, "no_padding"])
def test_a_setting_of_a_shared_tensordict_is_its_value_not_its_wrapper(value) -> None:
    """In shared memory a ``NonTensorData`` keeps a multiprocessing wrapper (a ``False`` in one is truthy):
    the setting is the value ``.data`` unwraps, as verl reads it."""
    from torch_impl._postprocess import read_setting

    data = _td(k=value).share_memory_()
    got, want = read_setting(data, "k", "default"), data.get("k").data
    assert got == want == value  # tensordict 0.10 unwraps a shared False as 0: as verl reads it
    assert type(got) is type(want)


def test_postprocess_batch_func_without_dynamic_bsz() -> None:
    outs, _ = _outputs(9, 3)
    data = _td(use_dynamic_bsz=False)
    assert_same(
        torch_impl.postprocess_batch_func(outs, None, data), verl_postprocess_batch_func(outs, None, data)
    )


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
    out = torch_impl.postprocess_batch(
        [{"model_output": {"v": a}}, {"model_output": {"v": b}}], [[2, 0], [1]]
    )
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
    holey = torch.nested.nested_tensor_from_jagged(
        values, torch.tensor([0, 4, 8]), lengths=torch.tensor([2, 3])
    )
    dense_ok = jagged(torch.tensor([0.0, 1.0, 4.0, 5.0, 6.0]), [2, 3])
    assert_same(torch_impl.restore(holey, [[1, 0]]), torch_impl.restore(dense_ok, [[1, 0]]))


def test_take_and_split_on_a_tensordict() -> None:
    rng = np.random.default_rng(1)
    lengths = [2, 0, 3, 1]
    td = TensorDict(
        {
            "ids": jagged(random_tensor(rng, (6,), "int64"), lengths),
            "adv": torch.arange(4.0),
            "mask": torch.ones(4, 2),
        },
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


@pytest.mark.parametrize("rows", [(64, 4096), (8, 128)])
def test_operation_count_does_not_grow_with_rows(rows: tuple[int, int]) -> None:
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
        got = torch_postprocess(
            s.output_lst, s.indices, use_dynamic_bsz=s.use_dynamic_bsz, pad_mode=s.pad_mode
        )
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
        outs = [
            {"model_output": {"x": o["model_output"]["x"]}} for o in outs
        ]  # one value per op: keep it short
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
        view = base.conj() if lazy == "conj" else neg_view(base)
        assert view.is_conj() or view.is_neg()
        o["model_output"] = {"x": jagged(view, lengths)}
        resolved.append({**o, "model_output": {"x": jagged(view.resolve_conj().resolve_neg(), lengths)}})
    want = verl_postprocess_batch_func(resolved, parts, None)
    assert_same(torch_impl.postprocess_batch(outs, parts), want)


class _LargestIndex(TorchDispatchMode):
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
    hold the rows: ``Settings.index_chunk_bytes`` of output (on the CPU at most
    ``CPU_CHUNK_ROWS`` value rows), rounded up to whole value rows (a value row's bytes
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
    settings = {"index_chunk_bytes": chunk_bytes if device == "meta" else chunk * row_bytes}
    real_scatter = torch_impl._hostcopy._scatter

    def scatter(dest: np.ndarray, where: np.ndarray, src: np.ndarray) -> None:  # the CPU's NumPy index path
        seen.largest = max(seen.largest, where.size)
        seen.calls += 1
        real_scatter(dest, where, src)

    with (
        torch_impl.use_settings(**settings),
        _LargestIndex() as seen,
        mock.patch.object(torch_impl._hostcopy, "_scatter", scatter),
    ):
        got = torch_impl.postprocess_batch(outs, parts)
    if device == "cpu":
        assert_same(got, verl_postprocess_batch_func(outs, parts, None))
    assert seen.largest == chunk, (seen.largest, total)
    sizes = [o["model_output"]["k0"].values().shape[0] for o in outs] if device == "cpu" else [total]
    assert seen.calls == sum(-(-n // chunk) for n in sizes)  # on the CPU part by part
    defaults = torch_impl.get_settings()
    assert (defaults.index_chunk_bytes, torch_impl._indexcopy.CPU_CHUNK_ROWS) == (16 * 2**20, 2**14)


def test_the_host_kernel_under_inference_mode(force) -> None:
    force("host_scatter")
    outs, parts = _outputs(64, 4, mean_len=50, keys=3)
    want = verl_postprocess_batch_func(outs, parts, None)
    with torch.inference_mode():
        got = torch_impl.postprocess_batch(outs, parts)
    assert_same(got, want)
    assert got["model_output"]["k0"].values().is_inference()


def test_an_error_on_a_later_key_is_raised_before_any_key_moves(force) -> None:
    force("host_scatter")
    outs, parts = _outputs(64, 4, mean_len=50, keys=2)
    outs[2]["model_output"]["k1"] = outs[2]["model_output"]["k1"].to(torch.float64)
    with pytest.raises(errors.DtypeMismatchError, match="key 'k1', micro-batch 2"):
        torch_impl.postprocess_batch(outs, parts)


def test_long_rows_match_verl() -> None:
    outs, parts = _outputs(48, 4, mean_len=2048)
    assert_same(torch_impl.postprocess_batch(outs, parts), verl_postprocess_batch_func(outs, parts, None))


def _count_long(b: int) -> Counter[str]:
    outs, parts = _outputs(b, 8, seed=b, mean_len=1500)
    with CountOps() as counter:
        torch_impl.postprocess_batch(outs, parts)
    return counter.ops


def test_operation_count_does_not_grow_with_rows_of_long_rows() -> None:
    small, large = _count_long(64), _count_long(512)
    assert "aten.index_copy_.default" not in small  # the rows moved by NumPy on the host, not torch's indices
    assert small == large, f"ops differ: {small - large} vs {large - small}"


def test_padding_marker_survives_pickling() -> None:
    import pickle

    from ref import PADDING

    assert pickle.loads(pickle.dumps(PADDING)) is PADDING
    assert torch_impl.PADDING is PADDING


@pytest.mark.parametrize(
    "parts", [[list(range(32))], [list(range(10)), list(range(10, 32))], [list(range(32)), []]]
)
def test_partitions_already_in_order_are_one_concatenation(monkeypatch, parts) -> None:
    """The identity permutation (one micro-batch in order, or contiguous micro-batches in order) is
    a plain concatenation of each key (the ``concat`` kernel), no permuting kernel run, with verl's
    result."""
    for name, kernel in torch_impl.KERNELS.items():
        run = (
            mock.Mock(wraps=kernel.run)
            if not kernel.permutes
            else mock.Mock(side_effect=AssertionError(name))
        )
        monkeypatch.setitem(torch_impl.KERNELS, name, kernel._replace(run=run))
    concat = torch_impl.KERNELS["concat"].run
    rng = np.random.default_rng(0)
    outs = []
    for part in parts:
        mo = {}
        for k in range(2):
            lengths = rng.integers(0, 100, size=len(part)).tolist()
            mo[f"k{k}"] = jagged(random_tensor(rng, (sum(lengths),), "float32"), lengths)
        outs.append({"model_output": mo})
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
    outs = [
        {"model_output": {"lp": jagged(v, n), "d": d}} for v, n, d in zip(values, lengths, dense, strict=True)
    ]
    got = torch_impl.postprocess_batch(outs, parts)["model_output"]
    assert torch.equal(got["d"], torch.cat(dense))
    assert torch.equal(got["lp"].values(), torch.cat(values))
    (got["lp"].values() * torch.arange(51.0)).sum().backward()
    assert torch.equal(torch.cat([v.grad for v in values]), torch.arange(51.0))


def test_the_host_kernels_step_aside_where_torch_cannot_share_memory_with_numpy(monkeypatch) -> None:
    """A torch built against another NumPy cannot lend its storage (``Tensor.numpy()`` raises): the
    torch element-index kernel then moves the rows (and torch checks the offsets), with the same result;
    a host kernel forced there raises instead."""
    outs, parts = _outputs(32, 4, mean_len=50)
    with torch_impl.use_settings(kernel="host_scatter"):
        want = torch_impl.postprocess_batch(outs, parts)
    for module in (torch_impl._hostcopy, torch_impl._parts, torch_impl._plan, torch_impl._permutation):
        monkeypatch.setattr(module, "numpy_bridge", lambda: False)
    with CountOps() as counter:
        got = torch_impl.postprocess_batch(outs, parts)
    assert "aten.index_copy_.default" in counter.ops
    assert_same(got, want)
    with (
        torch_impl.use_settings(kernel="host_scatter"),
        pytest.raises(errors.UnsupportedSettingError, match="cannot move"),
    ):
        torch_impl.postprocess_batch(outs, parts)


def test_a_torch_without_numpy_is_detected(monkeypatch) -> None:
    """``Tensor.numpy()`` raising (torch built against another NumPy: "Numpy is not available") means no
    NumPy bridge; the check itself, uncached."""
    from torch_impl import _parts as _bridge

    assert _bridge.numpy_bridge.__wrapped__() is True

    def unavailable(self):
        raise RuntimeError("Numpy is not available")

    monkeypatch.setattr(torch.Tensor, "numpy", unavailable)
    assert _bridge.numpy_bridge.__wrapped__() is False


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
    with pytest.raises(
        errors.UnsupportedSettingError, match=r"^key 'v', micro-batch 0: dtype complex32 is not"
    ):
        torch_impl.postprocess_batch(outs, [[0, 1], [2, 3]])


def test_postprocess_batch_settings_are_keyword_only() -> None:
    """``use_dynamic_bsz`` and ``pad_mode`` by position would land on the wrong parameter: keyword-only;
    the outputs and the indices may be named."""
    outs, parts = _outputs(6, 2)
    with pytest.raises(TypeError):
        torch_impl.postprocess_batch(outs, parts, True)  # type: ignore[misc]
    assert_same(
        torch_impl.postprocess_batch(output_lst=outs, indices=parts),
        torch_impl.postprocess_batch(outs, parts),
    )


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
    assert torch_impl.postprocess_batch(outs, None, use_dynamic_bsz=False)["model_output"]["v"].shape == (
        2 * rows,
        2,
    )


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
    assert_same(
        torch_impl.postprocess_batch_func(outs, other, data), verl_postprocess_batch_func(outs, other, data)
    )
    assert_same(
        torch_impl.postprocess_batch_func(outs, other, data),
        torch_impl.postprocess_batch_func(outs, None, data),
    )


@pytest.mark.parametrize("n", [3, 300])
def test_take_names_row_indices_past_int64(n) -> None:
    """Rows past int64 (a list, or uint64) are named, never wrapped; the first bad one is named (at 300
    rows too: counts past 256 are distinct int objects)."""
    x = jagged(torch.arange(float(n)), [1] * n)
    with pytest.raises(
        errors.RowIndexError, match=rf"^position 1: row index {2**64} is out of range for {n} rows"
    ):
        torch_impl.take(x, [0, 2**64])
    with pytest.raises(
        errors.RowIndexError, match=rf"^position 0: row index {n} is out of range for {n} rows"
    ):
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


@pytest.mark.parametrize("trailing", [(), (3,), (2, 5), (0,)])
@pytest.mark.parametrize("dtype", [*DTYPES, "complex64"])
def test_dense_outputs_on_the_host_move_whole_rows_bit_for_bit(monkeypatch, dtype, trailing) -> None:
    """Dense CPU parts NumPy may move: under a permutation, whole rows scattered with NumPy
    (the ``host_rows`` kernel), in order by ``cat``; the values of ``cat`` and ``index_copy_`` (torch's dense
    path), NaN payloads, dtype and shape included, for rows of any width (none included)."""
    scatter = mock.Mock(wraps=torch_impl.KERNELS["host_rows"].run)
    monkeypatch.setitem(
        torch_impl.KERNELS, "host_rows", torch_impl.KERNELS["host_rows"]._replace(run=scatter)
    )
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
        assert_same(
            torch_impl.postprocess_batch(outs, parts)["model_output"]["d"], want
        )  # below the floor: torch's
    assert scatter.call_count == 1  # the first partition on the host; the second is in order


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


def test_the_bounds_table_names_every_numeric_knob_in_the_fields_order() -> None:
    from torch_impl._settings import _BOUNDS

    fields = [f.name for f in dataclasses.fields(torch_impl.Settings)]
    assert [b[0] for b in _BOUNDS] == fields[2:]  # after kernel and plan_on_device


def test_the_kernel_knob_takes_a_name_and_refuses_an_unknown_one() -> None:
    """``Settings.kernel``: a kernel's name (or None); a name no kernel has is refused at the first key."""
    with pytest.raises(ValueError, match=r"^kernel must be a kernel's name or None, got 3$"):
        torch_impl.Settings(kernel=3)  # type: ignore[arg-type]
    outs, parts = _outputs(8, 2)
    with (
        torch_impl.use_settings(kernel="row_copies"),
        pytest.raises(errors.UnsupportedSettingError, match="row_copies"),
    ):
        torch_impl.postprocess_batch(outs, parts)


def _chosen(outs: list[dict[str, Any]], parts: Any) -> list[str]:
    """The kernels `torch_impl.postprocess_batch` ran for ``outs``, by key."""
    taken: list[str] = []
    real = torch_impl._kernels.choose

    def spy(plan: Any) -> Any:
        kernel = real(plan)
        taken.append(kernel.name)
        return kernel

    with mock.patch.object(torch_impl._kernels, "choose", spy):
        torch_impl.postprocess_batch(outs, parts)
    return taken


def test_the_registry_chooses_by_device_autograd_layout_and_size() -> None:
    """By default: a CPU jagged key with nothing to differentiate by NumPy (``host_scatter``), one to
    differentiate by torch's indices; a dense key by NumPy from ``cpu_dense_host_min_elements``
    elements, by torch below; keys already in order by one ``cat``; off the CPU torch only."""
    rng = np.random.default_rng(3)
    parts = [[2, 0], [1, 3]]
    lengths = [[3, 1], [2, 0]]

    def outs(grad: bool = False, dense: int = 4, device: str = "cpu") -> list[dict[str, Any]]:
        return [
            {
                "model_output": {
                    "j": jagged(random_tensor(rng, (sum(n),), "float32").requires_grad_(grad), n).to(device),
                    "d": torch.zeros(len(n), dense, device=device),
                }
            }
            for n in lengths
        ]

    assert _chosen(outs(), parts) == ["host_scatter", "index_rows"]
    assert _chosen(outs(dense=2**13), parts) == ["host_scatter", "host_rows"]
    assert _chosen(outs(grad=True), parts) == ["element_indices", "index_rows"]
    assert _chosen(outs(device="meta"), parts) == ["element_indices", "index_rows"]
    assert _chosen(outs(), [[0, 1], [2, 3]]) == ["concat", "concat"]
    with torch.no_grad():
        assert _chosen(outs(grad=True), parts)[0] == "host_scatter"
