"""Checks that one key's outputs can be put together, and the jagged invariants for nested tensors.

Each output is unpacked once into a `Part` (its values buffer, offsets and row count), with torch's
per-call ``__torch_function__`` handling of nested tensors switched off for the unpacking: attribute
reads on a nested tensor otherwise cost tens of microseconds each, which adds up over many micro-batches.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Sequence
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple

import numpy as np
import torch

# The jagged nested tensor class and its own attributes: the one room of torch's private parts.
from ref._torch_private import (
    JAGGED_BUFFERS,
    JAGGED_FLAGS,
    DisableTorchFunctionSubclass,
    NestedTensor,
    ragged_idx,
    ragged_size,
    raw_lengths,
    raw_offsets,
    raw_values,
)
from ref.dtypes import NO_GRADIENT, SUPPORTED_DTYPES, check_dtype
from ref.errors import (
    DeviceMismatchError,
    DtypeMismatchError,
    InvalidJaggedError,
    ShapeMismatchError,
    UnsupportedSettingError,
    where,
)

from ._tally import skipped

__all__ = [
    "DensePart",
    "JaggedPart",
    "NestedTensor",
    "Part",
    "check_dtypes",
    "check_offsets",
    "check_parts",
    "explain_bad_offsets",
    "numpy_bridge",
    "row_steps",
    "unpack",
]


@functools.cache
def numpy_bridge() -> bool:
    """Whether this torch can share CPU storage with NumPy (it cannot when built against another NumPy
    ABI: then ``Tensor.numpy()`` raises, and the host paths are not used)."""
    try:
        torch.zeros(1, device="cpu").numpy()
    except (RuntimeError, ImportError, TypeError):  # "Numpy is not available"
        return False
    return True


# probed at import, outside any mode a caller may enter later (a fake tensor has no NumPy view)
numpy_bridge()


class JaggedPart(NamedTuple):
    """One micro-batch's jagged output for one key: ``values`` ``[N, *F]`` (the packed rows, no lazy
    conjugate or negative bit), ``offsets`` int64 ``[b + 1]``, ``rows`` ``b``, ``ragged`` the nested
    tensor's ragged size (its nested int, which exact provenance reads: `torch_impl._alignment`) or None."""

    values: torch.Tensor
    offsets: torch.Tensor
    rows: int
    ragged: Any = None


class DensePart(NamedTuple):
    """One micro-batch's dense output for one key: ``values`` ``[b, *F]`` itself, ``rows`` ``b``."""

    values: torch.Tensor
    rows: int


#: One micro-batch's output for one key; ``isinstance(p, JaggedPart)`` narrows it.
Part = JaggedPart | DensePart


def unpack(x: Any, key: Any = None, micro_batch: int | None = None, *, allow_jagged: bool = True) -> Part:
    """``x`` as a `Part`: a jagged nested tensor (ragged dimension 1; made contiguous if it has holes)
    or a dense tensor with a batch dimension. Raises `InvalidJaggedError`, `UnsupportedSettingError`
    or `ShapeMismatchError` for anything else, and applies the one dtype rule (`check_dtypes`)."""
    with DisableTorchFunctionSubclass():
        part = _unpack(x, key, micro_batch, allow_jagged)
    check_dtypes([part], key, micro_batch)
    return part


def _unpack(x: Any, key: Any, micro_batch: int | None, allow_jagged: bool) -> Part:
    """`unpack`, with torch's ``__torch_function__`` handling of subclasses already switched off."""
    if not isinstance(x, torch.Tensor):
        raise ShapeMismatchError(
            f"{where(key, micro_batch)}an output must be a tensor, got {type(x).__name__}"
        )
    if isinstance(x, NestedTensor):
        if ragged_idx(x) != 1:
            raise InvalidJaggedError(
                f"{where(key, micro_batch)}the ragged dimension must be 1, got {ragged_idx(x)}"
            )
        if not allow_jagged:
            raise UnsupportedSettingError(
                f"{where(key, micro_batch)}jagged outputs need pad_mode 'no_padding', got a jagged tensor"
            )
        ragged = ragged_size(x)  # the given tensor's (a holed one's contiguous copy has its own)
        if raw_lengths(x) is not None:
            holed = _without_holes(x, where(key, micro_batch))
            if isinstance(holed, JaggedPart):
                return holed
            x = holed
        # A nested tensor that requires grad keeps its autograd history on the wrapper: read its
        # values through values(), which is differentiable; otherwise the buffer itself is exact.
        values = x.values() if x.requires_grad else raw_values(x)
        offsets = raw_offsets(x)
        if offsets.dtype != torch.int64 or offsets.dim() != 1:
            if offsets.dim() != 1 or offsets.dtype.is_floating_point or offsets.dtype == torch.bool:
                raise InvalidJaggedError(
                    f"{where(key, micro_batch)}offsets must be 1-D integers, got "
                    f"{offsets.dtype}{list(offsets.shape)}"
                )
            offsets = offsets.to(torch.int64)
        return JaggedPart(_resolved(values), offsets, int(offsets.shape[0]) - 1, ragged)
    if x.is_nested:
        raise InvalidJaggedError(
            f"{where(key, micro_batch)}a nested tensor must use the jagged layout, got {x.layout}"
        )
    if x.dim() == 0:
        raise ShapeMismatchError(
            f"{where(key, micro_batch)}a dense output needs a leading batch dimension, got a scalar"
        )
    return DensePart(_resolved(x), int(x.shape[0]))


def _resolved(values: torch.Tensor) -> torch.Tensor:
    """``values`` with torch's lazy conjugate and negative bits applied (a copy, only where one is set):
    every kernel then moves values whose bytes are their values (a chunk of a negative view otherwise
    keeps a NaN's sign that the whole view's copy flips)."""
    if values.is_conj() or values.is_neg():
        return values.resolve_conj().resolve_neg()
    return values


def _without_holes(x: Any, at: str) -> Any:
    """A jagged nested tensor with ``lengths`` (row ``i`` is ``values[offsets[i]:offsets[i] + lengths[i]]``,
    holes allowed) made contiguous, its lengths checked first: 1-D integers, one per row and, where they live
    on the CPU (elsewhere trusted, counted: ``skipped_device_offsets``), none negative, no row starting before
    or running past the values (`InvalidJaggedError`).
    With no rows, the empty `JaggedPart` itself (torch cannot make such a tensor contiguous)."""
    lengths, offsets, values = raw_lengths(x), raw_offsets(x), raw_values(x)
    rows = int(offsets.shape[0]) - 1
    if (
        lengths.dim() != 1
        or int(lengths.shape[0]) != rows
        or lengths.dtype.is_floating_point
        or lengths.dtype.is_complex
        or lengths.dtype == torch.bool
    ):
        raise InvalidJaggedError(
            f"{at}lengths must be 1-D integers, one per row ({rows}), got "
            f"{lengths.dtype}{list(lengths.shape)}"
        )
    if rows > 0 and (lengths.device.type != "cpu" or offsets.device.type != "cpu"):
        skipped("skipped_device_offsets")  # trusted off the CPU, and counted (`_tally.SKIPS`)
    elif rows > 0:
        n = int(values.shape[0])
        starts = offsets[:-1].to(torch.int64)
        lens = lengths.to(torch.int64)
        bad = (lens < 0) | (starts < 0) | (starts + lens > n)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            o, n_i = int(starts[i]), int(lens[i])
            if n_i < 0:
                what = f"lengths[{i}] = {n_i} is negative"
            elif o < 0:
                what = f"offsets[{i}] = {o} is negative"
            else:
                what = (
                    f"row {i} runs past the values: offsets[{i}] + lengths[{i}] = {o} + {n_i} "
                    f"> len(values) = {n}"
                )
            raise InvalidJaggedError(at + what)
    if rows == 0:
        source = x.values() if x.requires_grad else values
        empty_offsets = torch.zeros(1, dtype=torch.int64, device=offsets.device)
        return JaggedPart(source[:0], empty_offsets, 0, ragged_size(x))
    return x.contiguous()


def check_parts(parts: Sequence[Any], key: Any = None, *, allow_jagged: bool = True) -> list[Part]:
    """``parts`` unpacked and checked to agree with ``parts[0]`` (same order of checks as ``ref``).

    For each micro-batch ``m``: `unpack`; then, against micro-batch 0: layout (`ShapeMismatchError`),
    dtype (`DtypeMismatchError`), device (`DeviceMismatchError`), trailing shape (`ShapeMismatchError`);
    then the one dtype rule (`check_dtypes`).
    """
    with DisableTorchFunctionSubclass():  # once for all parts (see the module's docstring)
        out = _check_unpacked(parts, key, allow_jagged)
    if out:
        check_dtypes(out, key)
    return out


#: The torch dtypes of the one dtype rule (`ref.dtypes.check_dtype`) it accepts, with a gradient or not.
_FREE = frozenset(
    d for n in SUPPORTED_DTYPES - NO_GRADIENT if isinstance(d := getattr(torch, n, None), torch.dtype)
)


def check_dtypes(parts: Sequence[Part], key: Any = None, first: int | None = 0) -> None:
    """`ref.dtypes.check_dtype`, the one dtype rule of both implementations, for ``parts`` that agree
    (``first``: the micro-batch of ``parts[0]``): their dtype, and each part's gradient (where enabled)."""
    dtype = parts[0].values.dtype
    if dtype not in _FREE:  # the rule decides; at most one read of each part's ``requires_grad``
        m = (
            next((i for i, p in enumerate(parts) if p.values.requires_grad), None)
            if torch.is_grad_enabled()
            else None
        )
        grad_at = None if m is None else where(key, None if first is None else first + m)
        check_dtype(dtype, at=where(key, first), grad_at=grad_at)


def _check_unpacked(parts: Sequence[Any], key: Any, allow_jagged: bool) -> list[Part]:
    if allow_jagged and len(parts) >= _MAPPED_MIN_PARTS:
        plain = _plain_jagged(parts)
        if plain is not None:
            return plain
    out: list[Part] = []
    first: Part | None = None
    for m, x in enumerate(parts):
        p = _unpack(x, key, m, allow_jagged)
        v = p.values
        if first is None:
            first = p
            part_type = type(p)
            dtype = v.dtype
            device = v.device
            ndim = v.dim()
            trailing = v.shape[1:]
        elif (  # cheapest reads first: a 1-D values tensor has no trailing shape to compare
            type(p) is not part_type
            or v.dtype != dtype
            or v.device != device
            or v.dim() != ndim
            or (ndim > 1 and v.shape[1:] != trailing)
        ):
            at = where(key, m)
            if type(p) is not type(first):
                kind, kind0 = ("jagged" if isinstance(q, JaggedPart) else "dense" for q in (p, first))
                raise ShapeMismatchError(f"{at}layout {kind} differs from micro-batch 0's {kind0}")
            if p.values.dtype != first.values.dtype:
                raise DtypeMismatchError(
                    f"{at}dtype {p.values.dtype} differs from micro-batch 0's {first.values.dtype}"
                )
            if p.values.device != first.values.device:
                raise DeviceMismatchError(
                    f"{at}device {p.values.device} differs from micro-batch 0's {first.values.device}"
                )
            got, want = (tuple(q.values.shape[1:]) for q in (p, first))
            raise ShapeMismatchError(f"{at}trailing shape {got} differs from micro-batch 0's {want}")
        out.append(p)
    return out


#: Parts from which `_plain_jagged` goes first (docs/kernels.md, "Host bookkeeping").
_MAPPED_MIN_PARTS = 8
#: What `_plain_jagged` reads of each part (one C-level call a part for each group)
_AS_IS, _BUFFERS = JAGGED_FLAGS, JAGGED_BUFFERS
_KIND, _INDEX_KIND = attrgetter("dtype", "ndim", "device"), attrgetter("dtype", "ndim")
_TAKEN = (1, None, False)  # `_AS_IS` of a part taken as it is: ragged dimension 1, no holes, no gradient


def _plain_jagged(parts: Sequence[Any]) -> list[Part] | None:
    """The common case of `_check_unpacked`, in C-level loops over the parts (``map`` of attribute
    reads; from ``_MAPPED_MIN_PARTS`` parts): every part a jagged nested tensor that `_unpack` takes as
    it is (ragged dimension 1, no holes, nothing to differentiate, 1-D int64 offsets, values without a
    lazy conjugate or negative bit) and agreeing with the first (dtype, dimensions, device, trailing
    shape). Their `JaggedPart`s, the loop's result; None where any of this does not hold (the loop
    then raises for the first defect, or converts)."""
    if set(map(type, parts)) != {NestedTensor} or set(map(_AS_IS, parts)) != {
        _TAKEN
    }:  # none: {} != {NestedTensor}
        return None
    values, offsets, sizes = zip(*map(_BUFFERS, parts), strict=True)
    kinds = set(map(_KIND, values))
    if len(kinds) != 1 or set(map(_INDEX_KIND, offsets)) != {(torch.int64, 1)}:
        return None
    dtype, ndim, _ = kinds.pop()
    if ndim > 1 and len({v.shape[1:] for v in values}) != 1:
        return None
    # a conjugate bit only on complex values (``conj`` of a real tensor is the tensor); a negative
    # bit on any (the imaginary part of a conjugate view)
    if (dtype.is_complex and any(map(torch.Tensor.is_conj, values))) or any(map(torch.Tensor.is_neg, values)):
        return None
    rows = [n - 1 for n in map(torch.Tensor.numel, offsets)]
    # ``tuple.__new__`` makes each `JaggedPart` without the named tuple's Python ``__new__`` (0.7 µs a part)
    ragged = map(itemgetter(1), sizes)
    return list(
        map(tuple.__new__, itertools.repeat(JaggedPart), zip(values, offsets, rows, ragged, strict=True))
    )


def check_offsets(
    parts: Sequence[JaggedPart], key: Any = None, steps: torch.Tensor | None = None
) -> torch.Tensor:
    """The one validator of the jagged invariants on the torch side; returns all row lengths ``[B]``.

    ``offsets[0] == 0``, non-decreasing, ``offsets[-1] == len(values)`` (`InvalidJaggedError`; 1-D
    integer offsets are checked by `unpack`). Reading offsets costs a host-device synchronisation on
    an accelerator, so they are checked where they live on the CPU (there with NumPy on the tensors'
    own memory, a fraction of torch's dispatch cost); on an accelerator they are trusted (torch builds
    them), each such call counted (``skipped_device_offsets``, `torch_impl.witness_stats`). A constant number
    of operations, whatever the numbers of rows and parts: all offsets are
    laid end to end (``[B + M]``) and differenced once; the steps that cross from one part to the next
    are left out (on the device by one ``index_select`` with ``steps``, `row_steps` of the parts' row
    counts, built here when not given: a call shares it between keys).
    """
    if not parts:
        return torch.zeros(0, dtype=torch.int64, device="cpu")
    device = parts[0].offsets.device
    flat = (
        torch.cat([p.offsets for p in parts]) if len(parts) > 1 else parts[0].offsets
    )  # (M NumPy reads cost more)
    if device.type == "cpu" and numpy_bridge() and all(type(p.offsets) is torch.Tensor for p in parts):
        return torch.from_numpy(_host_lengths(parts, key, flat.numpy()))
    rows = [p.rows for p in parts]
    lengths = flat.diff()
    if len(parts) > 1:
        lengths = lengths.index_select(0, row_steps(rows, device) if steps is None else steps)
    if device.type == "cpu":
        firsts = list(itertools.accumulate((r + 1 for r in rows[:-1]), initial=0))
        ends = torch.tensor([f + r for f, r in zip(firsts, rows, strict=True)] + firsts, device="cpu")
        bounds = torch.tensor([p.values.shape[0] for p in parts] + [0] * len(parts), device="cpu")
        if bool((flat.index_select(0, ends) != bounds).any()) or bool((lengths < 0).any()):
            explain_bad_offsets(parts, key)
    else:  # trusted off the CPU, and counted (`_tally.SKIPS`)
        skipped("skipped_device_offsets")
    return lengths


def _host_lengths(parts: Sequence[JaggedPart], key: Any, flat: np.ndarray) -> np.ndarray:
    """`check_offsets` of CPU parts on their offsets laid end to end (``flat``, a NumPy view)."""
    if flat.shape[0] <= _FEW_OFFSETS:
        return _few_lengths(parts, key, flat.tolist())
    rows = [p.rows for p in parts]
    ends = list(itertools.accumulate(r + 1 for r in rows))  # past each part's last offset in ``flat``
    bounds = np.array([e - r - 1 for e, r in zip(ends, rows, strict=True)] + [e - 1 for e in ends])
    lengths = flat[1:] - flat[:-1]
    if len(parts) > 1:  # the steps from one part's last offset to the next part's first left out
        keep = np.ones(lengths.shape[0], dtype=bool)
        keep[bounds[len(parts) : -1]] = False
        lengths = lengths[keep]
    probe = flat[bounds]  # each part's first offset (0), then its last (its number of value rows)
    probe[len(parts) :] -= np.array([p.values.shape[0] for p in parts])
    if probe.any() or (lengths < 0).any():
        explain_bad_offsets(parts, key)
    return lengths


#: Up to this many offsets `_host_lengths` reads them as Python ints (a dozen NumPy calls cost more).
_FEW_OFFSETS = 64


def _few_lengths(parts: Sequence[JaggedPart], key: Any, flat: list[int]) -> np.ndarray:
    """`_host_lengths` of a few offsets, as Python ints: each part's first offset 0, its last its number
    of value rows, the lengths between them never negative."""
    lengths: list[int] = []
    for p, end in zip(parts, itertools.accumulate(p.rows + 1 for p in parts), strict=True):
        o = flat[end - p.rows - 1 : end]
        if o[0] != 0 or o[-1] != p.values.shape[0] or any(map(operator.gt, o[:-1], o[1:])):
            explain_bad_offsets(parts, key)
        lengths += map(operator.sub, o[1:], o[:-1])
    return np.array(lengths, dtype=np.int64)


def row_steps(rows: Sequence[int], device: torch.device) -> torch.Tensor:
    """int64 ``[sum(rows)]``: row ``r`` (counted over all parts) of part ``m`` is step ``r + m`` of the
    parts' offsets laid end to end: a running sum of 1 per row and 1 more where each part after the
    first begins (trailing empty parts land past the end). Seven operations."""
    begins = torch.tensor(list(itertools.accumulate(rows[:-1])), dtype=torch.int64, device="cpu")
    begins = begins.to(device, non_blocking=True)  # an upload that waits for nothing (a blocking one syncs)
    step_of_row = torch.ones(sum(rows) + 1, dtype=torch.int64, device=device)
    step_of_row[:1].fill_(0)
    step_of_row.index_add_(0, begins, torch.ones_like(begins))
    return step_of_row.cumsum_(0)[:-1]


def explain_bad_offsets(parts: Sequence[JaggedPart], key: Any) -> None:
    """Raise `InvalidJaggedError` for the first part whose offsets break an invariant (error path only)."""
    for m, p in enumerate(parts):
        at, o, n = where(key, m), p.offsets, p.values.shape[0]
        if int(o[0]) != 0:
            raise InvalidJaggedError(f"{at}offsets[0] must be 0, got {int(o[0])}")
        steps = o.diff()
        if bool((steps < 0).any()):
            i = int((steps < 0).nonzero()[0, 0])
            raise InvalidJaggedError(
                f"{at}offsets must be non-decreasing, got offsets[{i}] = {int(o[i])} > offsets[{i + 1}] = "
                f"{int(o[i + 1])}"
            )
        if int(o[-1]) != n:
            raise InvalidJaggedError(f"{at}offsets[-1] must equal len(values) = {n}, got {int(o[-1])}")
