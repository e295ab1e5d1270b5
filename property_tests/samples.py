"""Named deterministic samples (OpInfo's ``sample_inputs``): small calls with hand-checked answers.

Each `PostprocessSample` is a whole ``postprocess_batch`` call built in torch with its expected result;
`op_samples` yields inputs for every paired operation. Tests run both implementations on each.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from torch_impl.testing import njt

from .data import from_rows, jagged, rows_of
from .metric import FakeMetric

__all__ = [
    "PostprocessSample",
    "OpSample",
    "postprocess_samples",
    "op_samples",
    "OPERATIONS",
    "HOLE_DEFECTS",
    "holed_tensor",
]

#: The operations that ``ref`` and ``torch_impl`` both define, paired by name.
OPERATIONS = (
    "concat",
    "take",
    "inverse_permutation",
    "flatten_partitions",
    "restore",
    "split",
    "merge_metrics",
    "postprocess_batch",
    "balanced_partitions",
    "fixed_partitions",
    "from_packed",
    "to_packed",
    "to_padded",
    "from_padded",
)

#: Nested tensors with holes (`holed_tensor` of ``offsets`` and ``lengths``) that break a rule, and the
#: message both readers give (``torch_impl``'s unpacking, ``ref.interop.from_torch``) after
#: ``key 'k', micro-batch 0: ``.
HOLE_DEFECTS: list[tuple[list[int], list[int], str]] = [
    ([0, 4, 8], [3, -1], "lengths[1] = -1 is negative"),
    ([-1, 4, 8], [0, 2], "offsets[0] = -1 is negative"),  # an empty row that starts before the values
    ([0, 4, 8], [3, 7], "row 1 runs past the values: offsets[1] + lengths[1] = 4 + 7 > len(values) = 10"),
    ([-1, 4, 8], [-1, 2], "lengths[0] = -1 is negative"),  # two faults in one row
    ([0, 4, 8], [-1, -2], "lengths[0] = -1 is negative"),  # the first of two bad rows
    ([0, 4], [-1], "lengths[0] = -1 is negative"),  # a single row is checked too
    ([0, 4], [11], "row 0 runs past the values: offsets[0] + lengths[0] = 0 + 11 > len(values) = 10"),
    ([-1, 4, 8], [12, 2], "offsets[0] = -1 is negative"),  # before the values and past them
]


def holed_tensor(offsets: list[int], lengths: list[int]) -> torch.Tensor:
    """The nested tensor of a `HOLE_DEFECTS` row: rows of ``torch.arange(10.0)`` at ``offsets``, ``lengths``
    long."""
    return njt(torch.arange(10.0), torch.tensor(offsets), torch.tensor(lengths))


class PostprocessSample(NamedTuple):
    name: str
    output_lst: list[dict[str, Any]]
    indices: list[Any] | None  # partitions (lists of ints), or `PADDING`
    use_dynamic_bsz: bool
    pad_mode: str
    expected: dict[str, Any]


def _ramp(n: int, *feature: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[n, *feature]`` holding 0, 1, 2, ... (distinct values make misplaced rows visible)."""
    count = n
    for f in feature:
        count *= f
    return torch.arange(count).to(dtype).reshape(n, *feature)


def _split_rows(whole: torch.Tensor, parts: list[list[int]]) -> list[torch.Tensor]:
    rows = rows_of(whole)
    return [from_rows([rows[i] for i in p], whole) for p in parts]


def _call(
    name: str,
    whole: dict[str, torch.Tensor],
    parts: list[list[int]],
    *,
    dynamic: bool = True,
    pad_mode: str = "no_padding",
    extras: list[dict[str, Any]] | None = None,
    expected_extra: dict[str, Any] | None = None,
) -> PostprocessSample:
    """A sample whose micro-batch ``m`` holds rows ``parts[m]`` of each ``whole[key]``."""
    outs: list[dict[str, Any]] = []
    split = {k: _split_rows(v, parts) for k, v in whole.items()}
    for m in range(len(parts)):
        o: dict[str, Any] = {"model_output": {k: split[k][m] for k in whole}} if whole else {}
        o.update((extras or [{}] * len(parts))[m])
        outs.append(o)
    expected = {"model_output": dict(whole), "loss": [], "metrics": {}}
    expected.update(expected_extra or {})
    return PostprocessSample(name, outs, parts if dynamic else None, dynamic, pad_mode, expected)


def postprocess_samples() -> list[PostprocessSample]:
    """The named samples: empty output list, zero-length rows, zero-row micro-batch, one micro-batch,
    batch of one, reversed permutation, 3-D and 4-D jagged, dense ``[b]`` and ``[b, S]``, and more."""
    lp = jagged(_ramp(10), [3, 0, 2, 4, 1])  # log-probs [5, (j)] with a zero-length row
    m1, m2 = FakeMetric("mean", 1.0), FakeMetric("mean", 2.0)
    return [
        PostprocessSample(
            "empty_output_list", [], [], True, "no_padding", {"model_output": {}, "loss": [], "metrics": {}}
        ),
        _call("empty_batch", {"lp": jagged(_ramp(0), [])}, [[], []]),
        _call("zero_length_rows", {"lp": jagged(_ramp(2), [0, 2, 0])}, [[2, 0], [1]]),
        _call("zero_row_micro_batch", {"lp": lp}, [[4, 1], [], [0, 3, 2]]),
        _call("one_micro_batch", {"lp": lp}, [[3, 1, 4, 0, 2]]),
        _call("batch_of_one", {"lp": jagged(_ramp(3), [3])}, [[0]]),
        _call("reversed_permutation", {"lp": lp}, [[4, 3], [2, 1, 0]]),
        _call("identity_permutation", {"lp": lp}, [[0, 1], [2, 3, 4]]),
        _call("jagged_3d", {"topk": jagged(_ramp(10, 5), [3, 0, 2, 4, 1])}, [[1, 4], [0, 2, 3]]),
        _call("jagged_4d", {"attn": jagged(_ramp(10, 2, 3), [3, 0, 2, 4, 1])}, [[2], [4, 0, 1, 3]]),
        _call("dense_1d", {"value": _ramp(5)}, [[3, 0], [4, 2, 1]]),
        _call("dense_2d", {"padded": _ramp(5, 7)}, [[3, 0], [4, 2, 1]]),
        _call(
            "several_keys_and_dtypes",
            {
                "lp": lp,
                "entropy": jagged(_ramp(10, dtype=torch.bfloat16), [3, 0, 2, 4, 1]),
                "ids": jagged(_ramp(10, dtype=torch.int64), [3, 0, 2, 4, 1]),
                "value": _ramp(5, dtype=torch.float64),
            },
            [[4, 1], [0, 3, 2]],
        ),
        _call("no_dynamic_bsz", {"lp": lp}, [[0, 1], [2, 3, 4]], dynamic=False),
        _call("dense_with_right_padding", {"padded": _ramp(5, 7)}, [[3, 0], [4, 2, 1]], pad_mode="right"),
        _call(
            "losses_and_metrics",
            {"lp": lp},
            [[4, 1], [0, 3, 2]],
            extras=[
                {"loss": 0.5, "metrics": {"lr": 1e-3, "clip": [0.1, 0.2], "kl": m1}},
                {"loss": 0.25, "metrics": {"lr": 1e-3, "clip": [0.3], "kl": m2, "new": 7}},
            ],
            expected_extra={
                "loss": [0.5, 0.25],
                "metrics": {
                    "lr": [1e-3, 1e-3],
                    "clip": [0.1, 0.2, 0.3],
                    "kl": _metric("mean", [1.0, 2.0]),
                    "new": [7],
                },
            },
        ),
        _with_padding(lp),
        _call(
            "metrics_without_outputs",
            {},
            [[1, 0]],
            extras=[{"metrics": {"a": 1}, "loss": 2.0}],
            expected_extra={"loss": [2.0], "metrics": {"a": [1]}},
        ),
    ]


def _with_padding(lp: torch.Tensor) -> PostprocessSample:
    """A padding micro-batch (partition PADDING) between two real ones: its rows, loss and metrics vanish."""
    from ref import PADDING

    real = _call(
        "padding_micro_batch",
        {"lp": lp},
        [[4, 1], [0, 3, 2]],
        extras=[{"loss": 1.0, "metrics": {"n": 1}}, {"loss": 3.0, "metrics": {"n": 3}}],
        expected_extra={"loss": [1.0, 3.0], "metrics": {"n": [1, 3]}},
    )
    filler = {
        "model_output": {"lp": jagged(_ramp(7) + 100, [7])},
        "loss": 2.0,
        "metrics": {"n": 2, "pad": True},
    }
    outs = [real.output_lst[0], filler, real.output_lst[1]]
    first, last = real.indices or ([], [])
    return real._replace(output_lst=outs, indices=[first, PADDING, last])


def _padded(rows: list[torch.Tensor], max_len: int, pad: float) -> torch.Tensor:
    """``[B, max_len]``: each row right-padded with ``pad`` (built row by row, the meaning itself)."""
    return torch.stack([torch.cat([r, torch.full((max_len - len(r),), pad, dtype=r.dtype)]) for r in rows])


def _metric(aggregation: str, values: list[Any]) -> FakeMetric:
    m = FakeMetric(aggregation)
    m.extend(values)
    return m


class OpSample(NamedTuple):
    """Inputs (torch-built) for one operation; ``expected`` in torch, when known by hand."""

    op: str
    name: str
    args: tuple[Any, ...]
    expected: Any = None
    kwargs: dict[str, Any] | None = None


def op_samples() -> Iterator[OpSample]:
    """Inputs for every operation of `OPERATIONS` but ``postprocess_batch`` (see `postprocess_samples`)."""
    x = jagged(_ramp(10), [3, 0, 2, 4, 1])
    x3 = jagged(_ramp(10, 2), [3, 0, 2, 4, 1])
    d = _ramp(5, 3, dtype=torch.float64)
    rows = rows_of(x)
    yield OpSample("concat", "jagged", ([x, jagged(_ramp(3), [0, 3])],))
    yield OpSample("concat", "dense", ([d, d[:2]],))
    yield OpSample("concat", "one_part", ([x3],))
    yield OpSample(
        "take", "jagged_permutation", (x, [4, 2, 0, 1, 3]), from_rows([rows[i] for i in [4, 2, 0, 1, 3]], x)
    )
    yield OpSample("take", "jagged_repeat", (x, [1, 1, 3]), from_rows([rows[1], rows[1], rows[3]], x))
    yield OpSample("take", "jagged_3d_empty", (x3, []))
    yield OpSample("take", "dense", (d, [2, 0]), d[[2, 0]])
    yield OpSample("inverse_permutation", "reversed", ([4, 3, 2, 1, 0],), torch.tensor([4, 3, 2, 1, 0]))
    yield OpSample("inverse_permutation", "cycle", ([1, 2, 0],), torch.tensor([2, 0, 1]))
    yield OpSample("inverse_permutation", "empty", ([],), torch.zeros(0, dtype=torch.int64))
    yield OpSample("flatten_partitions", "three", ([[2], [], [0, 1]], 3), torch.tensor([2, 0, 1]))
    yield OpSample("restore", "jagged", (x, [[4, 1], [0, 3, 2]]))
    yield OpSample("restore", "jagged_3d", (x3, [[2], [0, 4, 1, 3]]))
    yield OpSample("restore", "dense", (d, [[1, 0], [4, 3, 2]]))
    yield OpSample("split", "jagged", (x, [[4, 1], [], [0, 3, 2]]))
    yield OpSample("split", "dense", (d, [[1, 0], [4, 3, 2]]))
    yield OpSample("from_packed", "lengths", (_ramp(10), [3, 0, 2, 4, 1]), x)
    yield OpSample("from_packed", "tensor_lengths_3d", (_ramp(10, 2), torch.tensor([3, 0, 2, 4, 1])), x3)
    yield OpSample(
        "from_packed", "cu_seqlens", (_ramp(10),), x, {"cu_seqlens": torch.tensor([0, 3, 3, 5, 9, 10])}
    )
    yield OpSample("from_packed", "no_rows", (_ramp(0, 2), []))
    yield OpSample("to_packed", "jagged", (x,), (_ramp(10), torch.tensor([3, 0, 2, 4, 1])))
    yield OpSample("to_packed", "jagged_3d", (x3,))
    yield OpSample("to_padded", "zeros", (x,), _padded(rows, 4, 0.0))
    yield OpSample(
        "to_padded",
        "nan_pad_longer",
        (x,),
        _padded(rows, 6, float("nan")),
        {"pad_value": float("nan"), "max_len": 6},
    )
    yield OpSample("to_padded", "jagged_3d", (x3,), None, {"pad_value": -1})
    yield OpSample(
        "to_padded",
        "int_bool",
        (jagged(torch.tensor([True, False, True]), [2, 0, 1]),),
        None,
        {"pad_value": True},
    )
    yield OpSample("from_padded", "rows", (_padded(rows, 4, 7.0), [3, 0, 2, 4, 1]), x)
    yield OpSample(
        "from_padded", "tensor_lengths_3d", (torch.arange(30.0).reshape(3, 5, 2), torch.tensor([5, 0, 2]))
    )
    yield OpSample("from_padded", "no_columns", (torch.zeros(2, 0, 3, dtype=torch.float64), [0, 0]))
    yield OpSample("balanced_partitions", "long_tail", ([5, 1, 9, 3, 3, 12, 0, 7, 2], 16))
    yield OpSample("balanced_partitions", "all_in_one", ([1, 2, 3], 100), [[0, 1, 2]])
    yield OpSample("balanced_partitions", "empty", ([], 8), [])
    yield OpSample("fixed_partitions", "uneven", (5, 2), [[0, 1], [2, 3], [4]])
    yield OpSample("fixed_partitions", "one_chunk", (3, 8), [[0, 1, 2]])
    yield OpSample("fixed_partitions", "empty", (0, 4), [])
    yield OpSample(
        "merge_metrics",
        "lists_scalars_metrics",
        ({"a": [1], "m": _metric("max", [1.0])}, {"a": [2, 3], "b": 4, "m": FakeMetric("max", 5.0)}),
        {"a": [1, 2, 3], "m": _metric("max", [1.0, 5.0]), "b": [4]},
    )
