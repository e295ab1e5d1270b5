"""Hypothesis strategies for rebatch: jagged batches, partitions, micro-batch outputs, malformed inputs.

Importable for your own tests (``from property_tests.strategies import microbatch_outputs``). Every
strategy is a plural noun, takes keyword-only ``min_``/``max_`` bounds, validates its arguments and
draws a NamedTuple. Sizes are drawn by Hypothesis (so failures shrink toward few, short rows and one
micro-batch); tensor contents are random bits from a drawn seed (so floats include NaNs with payloads).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from hypothesis import assume, strategies as st
from hypothesis.errors import InvalidArgument

from ref import errors

from .data import DTYPES, from_rows, jagged, random_tensor, rows_of
from .defects import (
    Defect,
    LyingPartition,
    apply,
    postprocess_call,
    postprocess_defects,
    strided_nested,
)
from .metric import FakeMetric

__all__ = [
    "JaggedBatch",
    "Partitions",
    "MicrobatchOutputs",
    "MalformedInput",
    "TensorDictBatch",
    "DEFECTS",
    "Drawing",
    "strided_nested",
    "jagged_batches",
    "partitions",
    "microbatch_outputs",
    "malformed_inputs",
    "tensordict_batches",
    "VerlStep",
    "verl_step",
    "verl_steps",
    "PER_TOKEN_KEYS",
    "HostileIndices",
    "HostileData",
    "LyingPartition",
    "hostile_indices",
    "hostile_data",
    "fixed_length_steps",
    "equal_length_steps",
    "MISALIGNMENTS",
    "Misaligned",
    "misalignments",
]


#: Past this many rows, row lengths and permutations come from a drawn seed rather than one draw each
#: (so batches of thousands of rows stay within Hypothesis's data budget; small ones still shrink).
SEEDED_ROWS = 64


def _lengths(draw: st.DrawFn, rng: np.random.Generator, count: int, lo: int, hi: int) -> list[int]:
    if count <= SEEDED_ROWS:
        return draw(st.lists(st.integers(lo, hi), min_size=count, max_size=count))
    return rng.integers(lo, hi + 1, size=count).tolist()


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
        raise InvalidArgument(
            f"feature_shape must be a tuple of non-negative integers, got {feature_shape!r}"
        )
    lengths = draw(st.lists(st.integers(min_length, max_length), min_size=min_rows, max_size=max_rows))
    if feature_shape is None:
        feature = tuple(
            draw(st.lists(st.integers(1, 3), min_size=min_feature_dims, max_size=max_feature_dims))
        )
    else:
        feature = tuple(feature_shape)
    dtype = draw(st.sampled_from(list(dtypes)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return JaggedBatch(random_tensor(rng, (sum(lengths), *feature), dtype), lengths)


class Partitions(NamedTuple):
    """``parts[m]`` lists the original row indices of micro-batch ``m``; together a permutation of
    ``range(num_rows)``."""

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
    if not shuffle:
        perm = list(range(num_rows))
    elif num_rows <= SEEDED_ROWS:
        perm = draw(st.permutations(range(num_rows)))
    else:  # a permutation of thousands of rows would overrun Hypothesis's data budget: seeded
        perm = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(num_rows).tolist()
    if count == 0:
        return Partitions([], num_rows)
    if allow_empty:
        cuts = sorted(draw(st.lists(st.integers(0, num_rows), min_size=count - 1, max_size=count - 1)))
    else:
        cuts = sorted(
            draw(st.lists(st.integers(1, num_rows - 1), min_size=count - 1, max_size=count - 1, unique=True))
        )
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
        kind = draw(st.sampled_from(["scalar", "list", "tuple", "metric", "tensor", "vector"]))
        value = float(rng.standard_normal())
        if kind == "scalar":
            out[key] = value
        elif kind == "list":
            out[key] = [value, float(rng.standard_normal())]
        elif kind == "tuple":  # appended whole, unlike a list (verl's rule)
            out[key] = (value, float(rng.standard_normal()))
        elif kind == "vector":
            out[key] = torch.tensor([value, float(rng.standard_normal())])
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
            num_rows=b,
            min_micro_batches=min_micro_batches,
            max_micro_batches=max_micro_batches,
            shuffle=dynamic,
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
            lengths = _lengths(draw, rng, b, 0, max_length)
            expected[key] = jagged(random_tensor(rng, (sum(lengths), *feature), dtype), lengths)
    output_lst: list[dict[str, Any]] = []
    rows = {k: rows_of(expected[k]) for k in keys}
    for part in parts:
        o: dict[str, Any] = {}
        if keys:
            o["model_output"] = {k: from_rows([rows[k][i] for i in part], expected[k]) for k in keys}
        if losses and draw(st.booleans()):
            o["loss"] = (
                torch.tensor(float(rng.standard_normal())) if draw(st.booleans()) else float(rng.random())
            )
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
    use_dynamic_bsz: Any
    pad_mode: Any
    #: the alignment witness the call carries (the alignment family's defects give one), or None
    witness: Any = None
    #: the split's provenance the call carries (a `property_tests.defects.SplitProvenance`: the provenance
    #: family's defects give one), or None
    provenance: Any = None


#: The defects of ``postprocess_batch`` in `property_tests.defects.TABLE`, by name (each a `Defect`:
#: its error class, message pattern, what it needs, and its breaker).
DEFECTS: dict[str, Defect] = postprocess_defects()


class Drawing:
    """The `property_tests.defects.Chooser` that draws every choice (so Hypothesis explores and shrinks
    it)."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def choice(self, options: Sequence[Any]) -> Any:
        """One of ``options``; where there are none, the drawn valid call does not fit the breaker (a
        defect wanting a row after micro-batch 0 where micro-batch 0 holds every row) and the example is
        rejected, not failed."""
        candidates = list(options)
        assume(len(candidates) > 0)
        return self.draw(st.sampled_from(candidates))

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))


def _defect_names(defects: Sequence[str]) -> list[str]:
    if isinstance(defects, str) or not defects or any(d not in DEFECTS for d in defects):
        raise InvalidArgument(
            f"defects must be a non-empty sequence of names of {tuple(DEFECTS)}, got {defects!r}"
        )
    return list(dict.fromkeys(defects))


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
    """A valid dynamic-batch call (`microbatch_outputs`) broken by one defect drawn from ``defects``
    (names of `DEFECTS`), its breaker drawing every choice it makes.

    Each defect needs at least two rows and two micro-batches (the defaults' minimums) so that every
    defect is reachable; ``min_rows`` must be >= 2 and ``min_micro_batches`` >= 2. A drawn call the defect
    does not fit (a row after micro-batch 0, where micro-batch 0 holds every row) is rejected
    (`Drawing`). Batches of thousands of rows are fine (``max_rows=5000``): rows past the first 64 take
    their sizes from a drawn seed."""
    _check_bounds("rows", min_rows, max_rows, floor=2)
    _check_bounds("micro_batches", min_micro_batches, max_micro_batches, floor=2)
    names = _defect_names(defects)
    defect = DEFECTS[draw(st.sampled_from(names))]
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
    call = apply(defect, postprocess_call(base.output_lst, base.indices), Drawing(draw))
    output_lst, indices = call.args
    return MalformedInput(
        defect.name,
        defect.error,
        output_lst,
        indices,
        call.kwargs.get("use_dynamic_bsz", True),
        call.kwargs.get("pad_mode", "no_padding"),
        call.kwargs.get("witness"),
        call.kwargs.get("provenance"),
    )


class TensorDictBatch(NamedTuple):
    """A verl-like batch: jagged ``input_ids`` ``[B, (j)]``, jagged ``top_k`` ``[B, (j), 3]``, dense
    ``advantages`` ``[B]`` and a non-tensor stack ``uid``; ``lengths`` are the rows' token counts."""

    data: Any
    lengths: list[int]


@st.composite
def tensordict_batches(
    draw: st.DrawFn, *, min_rows: int = 0, max_rows: int = 10, min_length: int = 0, max_length: int = 8
) -> TensorDictBatch:
    """TensorDicts of ``min_rows..max_rows`` rows of ``min_length..max_length`` tokens (zero-length rows
    included)."""
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


#: The per-token keys of a `VerlStep` (the witness binds them); its other keys are never bound.
PER_TOKEN_KEYS = ("log_probs", "entropy", "values_4d")


class VerlStep(NamedTuple):
    """A verl-style step: ``data`` (``input_ids`` ``[B, (j)]`` and the settings), ``output_lst`` and
    ``indices`` (None with fixed-size micro-batches) as verl's engines make them from
    `torch_impl.prepare_micro_batches`'s split, and ``lengths`` (each row's token count, original
    order: the alignment witness)."""

    data: Any
    output_lst: list[dict[str, Any]]
    indices: list[list[int]] | None
    lengths: list[int]


def verl_step(
    lengths: Sequence[int], *, budget: int | None = None, micro_batch_size: int | None = None
) -> VerlStep:
    """The `VerlStep` of rows ``lengths`` long, split by the token ``budget`` (dynamic batch size) or in
    chunks of ``micro_batch_size`` rows (exactly one of the two), as `verl_steps` draws them."""
    from tensordict import NonTensorData, TensorDict

    import torch_impl

    from .data import jagged

    b = len(lengths)
    ids = jagged(torch.arange(sum(lengths), dtype=torch.int64), list(lengths))
    data = TensorDict({"input_ids": ids}, batch_size=[b])
    data["use_dynamic_bsz"] = NonTensorData(budget is not None)
    if budget is not None:
        micro, indices = torch_impl.prepare_micro_batches(data, max_token_len=budget)
    else:  # verl's fixed-size mode hands the restore no indices (the override's chunks are not used)
        micro, _chunks = torch_impl.prepare_micro_batches(data, micro_batch_size=micro_batch_size)
        indices = None
    output_lst = []
    for mb in micro:
        x = mb["input_ids"]
        offsets = x.offsets()
        tok = x.values()
        n = int(x.size(0))
        response = [(length + 1) // 2 for length in offsets.diff().tolist()]
        mo = {
            "log_probs": torch.nested.nested_tensor_from_jagged(tok.to(torch.float32) * -0.5, offsets),
            "entropy": torch.nested.nested_tensor_from_jagged(tok.to(torch.bfloat16), offsets.clone()),
            "values_4d": torch.nested.nested_tensor_from_jagged(
                (tok[:, None, None] + torch.arange(6).reshape(2, 3)).to(torch.int16), offsets
            ),
            "values": torch.full((n, 3), 0.25),
            "response_mask_sum": jagged(torch.ones(sum(response)), response),
        }
        output_lst.append({"model_output": mo, "loss": torch.tensor(float(n))})
    return VerlStep(data, output_lst, indices, list(lengths))


@st.composite
def verl_steps(
    draw: st.DrawFn,
    *,
    min_rows: int = 1,
    max_rows: int = 12,
    max_length: int = 9,
    dynamic: bool | None = None,
) -> VerlStep:
    """Steps as verl 0.9.1's engines build them (`verl_step`): each micro-batch's per-token outputs on its
    own ``input_ids.offsets()`` (``log_probs`` float32 on the offsets tensor itself, ``entropy`` bfloat16
    on a copy of it, ``values_4d`` int16 ``[b, (j), 2, 3]``), a dense ``values`` ``[b, 3]`` and
    ``response_mask_sum`` jagged over other lengths (``(len + 1) // 2`` a row, as a response-only field's);
    split by a drawn token budget (``dynamic``, its partitions in verl's order) or in fixed-size chunks
    (``dynamic=False``; None: either)."""
    _check_bounds("rows", min_rows, max_rows, floor=1)
    lengths = draw(st.lists(st.integers(0, max_length), min_size=min_rows, max_size=max_rows))
    b = len(lengths)
    if dynamic if dynamic is not None else draw(st.booleans()):
        longest = max(max(lengths), 1)
        return verl_step(lengths, budget=draw(st.integers(longest, longest * 3)))
    return verl_step(
        lengths, micro_batch_size=draw(st.sampled_from([d for d in range(1, b + 1) if b % d == 0]))
    )


class HostileIndices(NamedTuple):
    """A valid dynamic-batch call whose ``indices`` hold one hostile partition (a type or object rebatch
    must refuse, typed, in both implementations), and the `RebatchError` subclass it must raise."""

    name: str
    error: type[errors.RebatchError]
    output_lst: list[dict[str, Any]]
    indices: list[Any]


def _hostile_partition(draw: st.DrawFn, part: list[int]) -> tuple[str, type[errors.RebatchError], Any]:
    """One partition replaced by a hostile form of it: (name, error class, the partition)."""
    kind = draw(st.sampled_from(["meta", "object_non_integer", "strings", "long_double", "lying_len"]))
    if kind == "meta":
        return kind, errors.UnsupportedSettingError, torch.tensor(part, dtype=torch.int64, device="meta")
    if kind == "object_non_integer":
        entries: list[Any] = list(part)
        entries[draw(st.integers(0, len(part) - 1))] = draw(st.sampled_from(["1", None, 1.5, (1,), b"x"]))
        array = np.empty(len(entries), dtype=object)
        for j, e in enumerate(entries):  # one by one: a tuple entry stays one entry
            array[j] = e
        return kind, errors.NotAPermutationError, array
    if kind == "strings":
        return kind, errors.NotAPermutationError, np.array([str(i) for i in part])
    if kind == "long_double":
        return kind, errors.NotAPermutationError, np.array(part, dtype=np.longdouble)
    claimed = draw(st.sampled_from([0, len(part) + 1, 10**9, 2**62]))
    return kind, errors.PartitionMismatchError, LyingPartition(part, claimed)


@st.composite
def hostile_indices(
    draw: st.DrawFn,
    *,
    min_rows: int = 2,
    max_rows: int = 8,
    min_micro_batches: int = 1,
    max_micro_batches: int = 4,
) -> HostileIndices:
    """A valid dynamic-batch call (`microbatch_outputs`, every partition non-empty) with one partition
    replaced by a hostile type: on torch's ``meta`` device (`UnsupportedSettingError`), a NumPy object
    array with an entry that is not an integer, a string or long-double array (`NotAPermutationError`), or
    a sequence whose ``len()`` lies, 10**9 rows included (`PartitionMismatchError`, nothing allocated by
    it)."""
    _check_bounds("rows", min_rows, max_rows, floor=1)
    _check_bounds("micro_batches", min_micro_batches, max_micro_batches, floor=1)
    base = draw(
        microbatch_outputs(
            min_rows=max(min_rows, max_micro_batches),
            max_rows=max(max_rows, max_micro_batches),
            min_micro_batches=min_micro_batches,
            max_micro_batches=max_micro_batches,
            min_keys=1,
            max_keys=2,
            dense=True,
            use_dynamic_bsz=True,
            dtypes=("float32", "int64"),
        )
    )
    indices: list[Any] = [list(p) for p in base.indices or ()]  # dynamic: always given
    choices = [m for m, p in enumerate(indices) if p]
    m = draw(st.sampled_from(choices))
    name, error, part = _hostile_partition(draw, indices[m])
    indices[m] = part
    return HostileIndices(name, error, base.output_lst, indices)


class HostileData(NamedTuple):
    """A ``data`` argument of verl's ``postprocess_batch_func`` that is not a TensorDict, a mapping or
    None."""

    name: str
    error: type[errors.RebatchError]
    data: Any


@st.composite
def hostile_data(draw: st.DrawFn, *, min_size: int = 0, max_size: int = 4) -> HostileData:
    """A ``data`` of a type verl's drop-in refuses (`UnsupportedSettingError`): a number, a string or
    bytes, a list or tuple (of ``min_size`` to ``max_size`` entries), a set, or a plain object."""
    _check_bounds("size", min_size, max_size)
    items = st.lists(st.integers(), min_size=min_size, max_size=max_size)
    data = draw(
        st.one_of(
            st.integers(),
            st.floats(allow_nan=True),
            st.text(max_size=max_size),
            st.binary(max_size=max_size),
            items,
            items.map(tuple),
            items.map(set),
            st.just(object()),
        )
    )
    return HostileData(type(data).__name__, errors.UnsupportedSettingError, data)


@st.composite
def fixed_length_steps(
    draw: st.DrawFn,
    *,
    min_rows: int = 2,
    max_rows: int = 12,
    max_length: int = 6,
    dynamic: bool | None = None,
) -> VerlStep:
    """`verl_step`\\ s whose rows all have one drawn length (fixed-length data: SFT packed or truncated to one
    length, reward-model batches), where no row length tells two rows apart; split into at least two
    micro-batches, by a token budget (``dynamic``) or in fixed-size chunks (``dynamic=False``; None:
    either)."""
    _check_bounds("rows", min_rows, max_rows, floor=2)
    b = draw(st.integers(min_rows, max_rows))
    length = draw(st.integers(1, max(max_length, 1)))
    if dynamic if dynamic is not None else draw(st.booleans()):
        return verl_step([length] * b, budget=length * draw(st.integers(1, b // 2)))
    return verl_step(
        [length] * b, micro_batch_size=draw(st.sampled_from([d for d in range(1, b) if b % d == 0]))
    )


@st.composite
def equal_length_steps(
    draw: st.DrawFn, *, min_rows: int = 2, max_rows: int = 12, max_length: int = 6
) -> VerlStep:
    """`verl_step`\\ s whose rows take at most two drawn lengths (many rows share one: responses truncated at
    the cap), split by a token budget into micro-batches."""
    _check_bounds("rows", min_rows, max_rows, floor=2)
    two = draw(st.lists(st.integers(1, max(max_length, 1)), min_size=2, max_size=2))
    lengths = draw(st.lists(st.sampled_from(two), min_size=min_rows, max_size=max_rows))
    return verl_step(lengths, budget=max(two) * draw(st.integers(1, max(1, len(lengths) // 2))))


#: The well-formed misalignments exact provenance catches whatever the row lengths (`misalignments`).
MISALIGNMENTS = (
    "swapped_micro_batches",
    "rows_transposed_across_micro_batches",
    "another_steps_indices",
    "inverse_for_forward",
    "dense_key_rows",
)


class Misaligned(NamedTuple):
    """A clean `VerlStep` (its ``data`` recorded by rebatch's split) and the same call misaligned by the
    named misalignment of `MISALIGNMENTS`: ``output_lst`` and ``indices`` as the restore gets them."""

    name: str
    step: VerlStep
    output_lst: list[dict[str, Any]]
    indices: list[list[int]] | None


def _cut(flat: list[int], sizes: list[int]) -> list[list[int]]:
    bounds = list(itertools.accumulate(sizes, initial=0))
    return [flat[bounds[q] : bounds[q + 1]] for q in range(len(sizes))]


@st.composite
def misalignments(draw: st.DrawFn, *, steps: st.SearchStrategy[VerlStep] | None = None) -> Misaligned:
    """A step (default: `fixed_length_steps`) and one named misalignment of it that moves at least one row:
    two micro-batches of one row count swapped in ``output_lst``; one row of two micro-batches transposed
    in the indices; another step's indices (these rotated, cut into the same sizes); the inverse given for
    the forward permutation; two rows of one micro-batch transposed in the indices (a dense key's rows
    restored to each other's). Only the swap applies to fixed-size chunks (no indices)."""
    step = draw(steps if steps is not None else fixed_length_steps())
    outs = list(step.output_lst)
    sizes = [int(o["model_output"]["log_probs"].size(0)) for o in outs]
    if step.indices is None:
        names = ["swapped_micro_batches"]
        flat: list[int] = list(range(sum(sizes)))
    else:
        names = list(MISALIGNMENTS)
        flat = [int(i) for p in step.indices for i in p]
    pairs = [(m, n) for m, n in itertools.combinations(range(len(sizes)), 2) if sizes[m] == sizes[n] > 0]
    if not pairs:
        names = [n for n in names if n != "swapped_micro_batches"]
    inverse = [0] * len(flat)
    for k, i in enumerate(flat):
        inverse[i] = k
    if inverse == flat:
        names = [n for n in names if n != "inverse_for_forward"]
    if not any(s >= 2 for s in sizes):
        names = [n for n in names if n != "dense_key_rows"]
    if sum(1 for s in sizes if s) < 2:
        names = [n for n in names if n != "rows_transposed_across_micro_batches"]
    assume(names)
    name = draw(st.sampled_from(names))
    indices = None if step.indices is None else [list(p) for p in step.indices]
    if name == "swapped_micro_batches":
        m, n = draw(st.sampled_from(pairs))
        outs[m], outs[n] = outs[n], outs[m]
    elif name == "rows_transposed_across_micro_batches":
        filled = [q for q, s in enumerate(sizes) if s]
        m, n = draw(st.sampled_from(list(itertools.combinations(filled, 2))))
        a, b = draw(st.integers(0, sizes[m] - 1)), draw(st.integers(0, sizes[n] - 1))
        assert indices is not None
        indices[m][a], indices[n][b] = indices[n][b], indices[m][a]
    elif name == "another_steps_indices":
        shift = draw(st.integers(1, len(flat) - 1))
        indices = _cut(flat[shift:] + flat[:shift], sizes)
    elif name == "inverse_for_forward":
        indices = _cut(inverse, sizes)
    else:
        m = draw(st.sampled_from([q for q, s in enumerate(sizes) if s >= 2]))
        a, b = draw(st.lists(st.integers(0, sizes[m] - 1), min_size=2, max_size=2, unique=True))
        assert indices is not None
        indices[m][a], indices[m][b] = indices[m][b], indices[m][a]
    return Misaligned(name, step, outs, indices)
