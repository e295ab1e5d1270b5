"""Hypothesis strategies for rebatch: jagged batches, partitions, micro-batch outputs, malformed inputs.

Importable for your own tests (``from property_tests.strategies import microbatch_outputs``). Every
strategy is a plural noun, takes keyword-only ``min_``/``max_`` bounds, validates its arguments and
draws a NamedTuple. Sizes are drawn by Hypothesis (so failures shrink toward few, short rows and one
micro-batch); tensor contents are random bits from a drawn seed (so floats include NaNs with payloads).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ref import errors

from .data import DTYPES, from_rows, jagged, offsets_of, random_tensor, rows_of
from .metric import FakeMetric

__all__ = [
    "JaggedBatch",
    "Partitions",
    "MicrobatchOutputs",
    "MalformedInput",
    "TensorDictBatch",
    "DEFECTS",
    "jagged_batches",
    "partitions",
    "microbatch_outputs",
    "malformed_inputs",
    "tensordict_batches",
]


def _check_bounds(name: str, lo: int, hi: int, *, floor: int = 0) -> None:
    if not isinstance(lo, int) or not isinstance(hi, int):
        raise InvalidArgument(f"min_{name} and max_{name} must be integers, got {lo!r} and {hi!r}")
    if lo < floor:
        raise InvalidArgument(f"min_{name} must be at least {floor}, got {lo}")
    if hi < lo:
        raise InvalidArgument(f"max_{name}={hi} must be at least min_{name}={lo}")


def _check_dtypes(dtypes: Sequence[str]) -> None:
    if not dtypes or any(d not in DTYPES for d in dtypes):
        raise InvalidArgument(f"dtypes must be a non-empty subset of {DTYPES}, got {dtypes!r}")


class JaggedBatch(NamedTuple):
    """A jagged batch ``[B, (j), *F]``: ``values`` ``[N, *F]`` and per-row ``lengths``."""

    values: torch.Tensor
    lengths: list[int]

    def njt(self) -> torch.Tensor:
        return jagged(self.values, self.lengths)


@st.composite
def jagged_batches(
    draw: st.DrawFn,
    *,
    min_rows: int = 0,
    max_rows: int = 8,
    min_length: int = 0,
    max_length: int = 6,
    min_feature_dims: int = 0,
    max_feature_dims: int = 2,
    dtypes: Sequence[str] = DTYPES,
    feature_shape: tuple[int, ...] | None = None,
) -> JaggedBatch:
    """Jagged batches of ``min_rows..max_rows`` rows of ``min_length..max_length`` entries each,
    trailing shape of ``min_feature_dims..max_feature_dims`` dimensions (2-D to 4-D jagged) or exactly
    ``feature_shape``, any of ``dtypes``."""
    _check_bounds("rows", min_rows, max_rows)
    _check_bounds("length", min_length, max_length)
    _check_bounds("feature_dims", min_feature_dims, max_feature_dims)
    _check_dtypes(dtypes)
    if feature_shape is not None and not all(isinstance(d, int) and d >= 0 for d in feature_shape):
        raise InvalidArgument(f"feature_shape must be a tuple of non-negative integers, got {feature_shape!r}")
    lengths = draw(st.lists(st.integers(min_length, max_length), min_size=min_rows, max_size=max_rows))
    if feature_shape is None:
        feature = tuple(draw(st.lists(st.integers(1, 3), min_size=min_feature_dims, max_size=max_feature_dims)))
    else:
        feature = tuple(feature_shape)
    dtype = draw(st.sampled_from(list(dtypes)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return JaggedBatch(random_tensor(rng, (sum(lengths), *feature), dtype), lengths)


class Partitions(NamedTuple):
    """``parts[m]`` lists the original row indices of micro-batch ``m``; together a permutation of ``range(num_rows)``."""

    parts: list[list[int]]
    num_rows: int


@st.composite
def partitions(
    draw: st.DrawFn,
    *,
    num_rows: int,
    min_micro_batches: int = 1,
    max_micro_batches: int = 4,
    allow_empty: bool = True,
    shuffle: bool = True,
) -> Partitions:
    """A random permutation of ``range(num_rows)`` (identity if not ``shuffle``) cut into
    ``min_micro_batches..max_micro_batches`` micro-batches (empty ones only if ``allow_empty``)."""
    if not isinstance(num_rows, int) or num_rows < 0:
        raise InvalidArgument(f"num_rows must be a non-negative integer, got {num_rows!r}")
    _check_bounds("micro_batches", min_micro_batches, max_micro_batches)
    if not allow_empty:
        max_micro_batches = min(max_micro_batches, num_rows)
        if max_micro_batches < min_micro_batches:
            raise InvalidArgument(f"{num_rows} rows cannot fill {min_micro_batches} non-empty micro-batches")
    if num_rows == 0 and min_micro_batches == 0:
        count = draw(st.integers(0, max_micro_batches))
    else:
        count = draw(st.integers(max(min_micro_batches, 1), max(max_micro_batches, 1)))
    perm = draw(st.permutations(range(num_rows))) if shuffle else list(range(num_rows))
    if count == 0:
        return Partitions([], num_rows)
    if allow_empty:
        cuts = sorted(draw(st.lists(st.integers(0, num_rows), min_size=count - 1, max_size=count - 1)))
    else:
        cuts = sorted(draw(st.lists(st.integers(1, num_rows - 1), min_size=count - 1, max_size=count - 1, unique=True)))
    bounds = [0, *cuts, num_rows]
    return Partitions([list(perm[bounds[i] : bounds[i + 1]]) for i in range(count)], num_rows)


class MicrobatchOutputs(NamedTuple):
    """A whole valid call: ``output_lst`` and ``indices`` as a trainer hands them over, the settings,
    and ``expected``: each key's output in original order, built independently of any implementation."""

    output_lst: list[dict[str, Any]]
    indices: list[list[int]] | None
    use_dynamic_bsz: bool
    pad_mode: str
    expected: dict[str, torch.Tensor]


def _metrics(draw: st.DrawFn, rng: np.random.Generator) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(["lr", "grad_norm", "clip", "kl"]), unique=True, max_size=3))
    out: dict[str, Any] = {}
    for key in keys:
        kind = draw(st.sampled_from(["scalar", "list", "metric", "tensor"]))
        value = float(rng.standard_normal())
        if kind == "scalar":
            out[key] = value
        elif kind == "list":
            out[key] = [value, float(rng.standard_normal())]
        elif kind == "metric":
            out[key] = FakeMetric(draw(st.sampled_from(["mean", "sum", "max"])), value)
        else:
            out[key] = torch.tensor(value)
    return out


@st.composite
def microbatch_outputs(
    draw: st.DrawFn,
    *,
    min_rows: int = 0,
    max_rows: int = 10,
    min_micro_batches: int = 1,
    max_micro_batches: int = 4,
    min_keys: int = 1,
    max_keys: int = 3,
    max_length: int = 6,
    max_feature_dims: int = 2,
    dtypes: Sequence[str] = DTYPES,
    dense: bool = True,
    losses: bool = True,
    metrics: bool = True,
    use_dynamic_bsz: bool | None = True,
) -> MicrobatchOutputs:
    """Valid ``output_lst``/``indices`` pairs: ``min_keys..max_keys`` keys, each jagged ``[b, (j), *F]``
    (2-D to 4-D) or, if ``dense``, dense ``[b, *S]``, any of ``dtypes``; zero-length rows and empty
    micro-batches included; losses and metrics (lists, scalars, tensors, ``Metric``-like objects).
    ``use_dynamic_bsz=None`` draws the setting; off means contiguous micro-batches and ``indices=None``."""
    _check_bounds("rows", min_rows, max_rows)
    _check_bounds("micro_batches", min_micro_batches, max_micro_batches)
    _check_bounds("keys", min_keys, max_keys)
    _check_dtypes(dtypes)
    dynamic = draw(st.booleans()) if use_dynamic_bsz is None else use_dynamic_bsz
    b = draw(st.integers(min_rows, max_rows))
    parts = draw(
        partitions(
            num_rows=b, min_micro_batches=min_micro_batches, max_micro_batches=max_micro_batches, shuffle=dynamic
        )
    ).parts
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    keys = [f"out{i}" for i in range(draw(st.integers(min_keys, max_keys)))]
    expected: dict[str, torch.Tensor] = {}
    for key in keys:
        dtype = draw(st.sampled_from(list(dtypes)))
        feature = tuple(draw(st.lists(st.integers(1, 3), max_size=max_feature_dims)))
        if dense and draw(st.booleans()):
            expected[key] = random_tensor(rng, (b, *feature), dtype)
        else:
            lengths = draw(st.lists(st.integers(0, max_length), min_size=b, max_size=b))
            expected[key] = jagged(random_tensor(rng, (sum(lengths), *feature), dtype), lengths)
    output_lst: list[dict[str, Any]] = []
    for part in parts:
        o: dict[str, Any] = {}
        if keys:
            o["model_output"] = {k: from_rows([rows_of(expected[k])[i] for i in part], expected[k]) for k in keys}
        if losses and draw(st.booleans()):
            o["loss"] = torch.tensor(float(rng.standard_normal())) if draw(st.booleans()) else float(rng.random())
        if metrics and draw(st.booleans()):
            o["metrics"] = _metrics(draw, rng)
        output_lst.append(o)
    return MicrobatchOutputs(output_lst, parts if dynamic else None, dynamic, "no_padding", expected)


class MalformedInput(NamedTuple):
    """A call with exactly one named defect and the `RebatchError` subclass it must raise."""

    name: str
    error: type[errors.RebatchError]
    output_lst: list[dict[str, Any]]
    indices: Any
    use_dynamic_bsz: bool
    pad_mode: Any


def _mo(o: dict[str, Any]) -> dict[str, Any]:
    return o["model_output"]


def _retype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if x.is_nested:
        return torch.nested.nested_tensor_from_jagged(x.values().to(dtype), offsets_of(x))
    return x.to(dtype)


def _other_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype != torch.float32 else torch.float64


def _reshape_trailing(x: torch.Tensor) -> torch.Tensor:
    if x.is_nested:
        v = x.values()
        return torch.nested.nested_tensor_from_jagged(torch.stack([v, v], dim=-1), offsets_of(x))
    return torch.stack([x, x], dim=-1)


def _relayout(x: torch.Tensor) -> torch.Tensor:
    if x.is_nested:  # jagged -> dense with one entry per row
        return torch.zeros(x.size(0), dtype=x.dtype)
    return jagged(
        x.reshape(x.shape[0], -1)[:, :1].reshape(-1).clone() if x.numel() else x.new_zeros(x.shape[0]), [1] * x.shape[0]
    )


def _bad_offsets(x: torch.Tensor) -> torch.Tensor:
    o = offsets_of(x).clone()
    o[-1] += 1  # offsets[-1] no longer equals len(values)
    return torch.nested.nested_tensor_from_jagged(x.values(), o)


#: name -> (error class, what it needs of the valid call, how to break it). The breakers work in place
#: on a deep copy and draw what they choose.
DEFECTS: dict[str, tuple[type[errors.RebatchError], str]] = {
    "duplicate_index": (errors.NotAPermutationError, "two rows"),
    "negative_index": (errors.NotAPermutationError, "one row"),
    "out_of_range_index": (errors.NotAPermutationError, "one row"),
    "missing_index": (errors.NotAPermutationError, "two rows, a jagged key"),
    "float_index": (errors.NotAPermutationError, "one row"),
    "extra_partition": (errors.PartitionMismatchError, "a key"),
    "moved_index": (errors.PartitionMismatchError, "two micro-batches, a key"),
    "missing_key": (errors.KeyMismatchError, "two micro-batches, a key"),
    "extra_key": (errors.KeyMismatchError, "two micro-batches, a key"),
    "missing_model_output": (errors.KeyMismatchError, "two micro-batches, a key"),
    "dtype": (errors.DtypeMismatchError, "two micro-batches, a key"),
    "device": (errors.DeviceMismatchError, "two micro-batches, a key"),
    "trailing_shape": (errors.ShapeMismatchError, "two micro-batches, a key"),
    "layout": (errors.ShapeMismatchError, "two micro-batches, a key"),
    "bad_offsets": (errors.InvalidJaggedError, "a jagged key with a row"),
    "strided_nested": (errors.InvalidJaggedError, "a jagged key"),
    "unknown_pad_mode": (errors.UnsupportedSettingError, "nothing"),
    "indices_none": (errors.UnsupportedSettingError, "nothing"),
    "jagged_with_padding": (errors.UnsupportedSettingError, "a jagged key"),
}


@st.composite
def malformed_inputs(
    draw: st.DrawFn,
    *,
    min_rows: int = 2,
    max_rows: int = 8,
    min_micro_batches: int = 2,
    max_micro_batches: int = 4,
    defects: Sequence[str] = tuple(DEFECTS),
) -> MalformedInput:
    """A valid dynamic-batch call broken by one defect drawn from ``defects`` (names of `DEFECTS`).

    Each defect needs at least two rows and two micro-batches (the defaults' minimums) so that every
    defect is reachable; ``min_rows`` must be >= 2 and ``min_micro_batches`` >= 2."""
    _check_bounds("rows", min_rows, max_rows, floor=2)
    _check_bounds("micro_batches", min_micro_batches, max_micro_batches, floor=2)
    if not defects or any(d not in DEFECTS for d in defects):
        raise InvalidArgument(f"defects must be a non-empty subset of {tuple(DEFECTS)}, got {defects!r}")
    name = draw(st.sampled_from(list(defects)))
    base = draw(
        microbatch_outputs(
            min_rows=min_rows,
            max_rows=max_rows,
            min_micro_batches=min_micro_batches,
            max_micro_batches=max_micro_batches,
            min_keys=1,
            max_keys=2,
            dense=True,
            dtypes=("float32", "int64", "bfloat16"),
        )
    )
    outs = [dict(o, model_output=dict(o["model_output"])) for o in base.output_lst]
    indices: Any = [list(p) for p in base.indices or []]
    pad_mode: Any = "no_padding"
    keys = list(_mo(outs[0]))
    key = draw(st.sampled_from(keys))
    nonempty = [m for m, p in enumerate(indices) if p]
    b = sum(len(p) for p in indices)

    def pick_position() -> tuple[int, int]:
        m = draw(st.sampled_from(nonempty))
        return m, draw(st.integers(0, len(indices[m]) - 1))

    m_other = draw(st.integers(1, len(outs) - 1))
    if name == "duplicate_index":
        m, j = pick_position()
        others = [i for i in range(b) if i != indices[m][j]]
        indices[m][j] = draw(st.sampled_from(others))
    elif name == "negative_index":
        m, j = pick_position()
        indices[m][j] = -draw(st.integers(1, b))
    elif name == "out_of_range_index":
        m, j = pick_position()
        indices[m][j] = b + draw(st.integers(0, 3))
    elif name == "missing_index":
        # Drop one row that is not the last index from both the partition and every output.
        m = next(m for m, p in enumerate(indices) if any(i != b - 1 for i in p))
        j = next(j for j, i in enumerate(indices[m]) if i != b - 1)
        keep = [r for r in range(len(indices[m])) if r != j]
        del indices[m][j]
        for k in keys:
            x = _mo(outs[m])[k]
            rows = rows_of(x)
            _mo(outs[m])[k] = from_rows([rows[r] for r in keep], x)
    elif name == "float_index":
        m, j = pick_position()
        indices[m][j] = float(indices[m][j])
    elif name == "extra_partition":
        indices.append([])
    elif name == "moved_index":
        m, j = pick_position()
        target = draw(st.sampled_from([t for t in range(len(indices)) if t != m]))
        indices[target].append(indices[m].pop(j))
    elif name == "missing_key":
        del _mo(outs[m_other])[key]
    elif name == "extra_key":
        _mo(outs[m_other])["unexpected"] = _mo(outs[m_other])[key]
    elif name == "missing_model_output":
        del outs[m_other]["model_output"]
    elif name == "dtype":
        x = _mo(outs[m_other])[key]
        _mo(outs[m_other])[key] = _retype(x, _other_dtype(x))
    elif name == "device":
        _mo(outs[m_other])[key] = _mo(outs[m_other])[key].to("meta")
    elif name == "trailing_shape":
        _mo(outs[m_other])[key] = _reshape_trailing(_mo(outs[m_other])[key])
    elif name == "layout":
        _mo(outs[m_other])[key] = _relayout(_mo(outs[m_other])[key])
    elif name in ("bad_offsets", "strided_nested", "jagged_with_padding"):
        # A new jagged key "tokens" (one entry per row) in every micro-batch; then break one of them.
        for o in outs:
            n = _rows(_mo(o)[keys[0]])
            _mo(o)["tokens"] = jagged(torch.zeros(n), [1] * n)
        m = draw(st.sampled_from(nonempty))
        n = _rows(_mo(outs[m])[keys[0]])
        if name == "bad_offsets":
            _mo(outs[m])["tokens"] = _bad_offsets(_mo(outs[m])["tokens"])
        elif name == "strided_nested":
            _mo(outs[m])["tokens"] = strided_nested([torch.zeros(1) for _ in range(n)])
        else:
            pad_mode = draw(st.sampled_from(["right", "left_right"]))
    elif name == "unknown_pad_mode":
        pad_mode = draw(st.sampled_from(["bogus", "NO_PADDING", 0, None]))
    elif name == "indices_none":
        indices = None
    error = DEFECTS[name][0]
    return MalformedInput(name, error, outs, indices, True, pad_mode)


def strided_nested(rows: list[torch.Tensor]) -> torch.Tensor:
    """A nested tensor with torch's older strided layout (not jagged), its prototype warning silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor(rows)


def _rows(x: torch.Tensor) -> int:
    return int(x.size(0))


class TensorDictBatch(NamedTuple):
    """A verl-like batch: jagged ``input_ids`` ``[B, (j)]``, jagged ``top_k`` ``[B, (j), 3]``, dense
    ``advantages`` ``[B]`` and a non-tensor stack ``uid``; ``lengths`` are the rows' token counts."""

    data: Any
    lengths: list[int]


@st.composite
def tensordict_batches(
    draw: st.DrawFn, *, min_rows: int = 0, max_rows: int = 10, min_length: int = 0, max_length: int = 8
) -> TensorDictBatch:
    """TensorDicts of ``min_rows..max_rows`` rows of ``min_length..max_length`` tokens (zero-length rows included)."""
    from tensordict import NonTensorStack, TensorDict

    _check_bounds("rows", min_rows, max_rows)
    _check_bounds("length", min_length, max_length)
    lengths = draw(st.lists(st.integers(min_length, max_length), min_size=min_rows, max_size=max_rows))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n, b = sum(lengths), len(lengths)
    data = TensorDict(
        {
            "input_ids": jagged(random_tensor(rng, (n,), "int64"), lengths),
            "top_k": jagged(random_tensor(rng, (n, 3), "float32"), lengths),
            "advantages": random_tensor(rng, (b,), "float32"),
        },
        batch_size=[b],
    )
    if b:
        data["uid"] = NonTensorStack(*[f"row{i}" for i in range(b)])
    return TensorDictBatch(data, lengths)
