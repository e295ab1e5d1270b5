"""Few rows on the host: a small CPU call's jagged bookkeeping in Python ints, each row one copy by address.

A call of a few rows (B=8 in 4 micro-batches: a unit test, an evaluation step, a single prompt's
group) is bound by the number of operations, not bytes: each NumPy operation of the host path
(`torch_impl._host`) costs one to a few microseconds whatever its size, and that path makes about
forty per key (the offsets read through a ``cat``, the checks, the row lengths, the inverse, the
output offsets, the destinations of every value row, the scatter). Below ``Settings.cpu_few_rows``
rows, and below ``Settings.cpu_prefault_min_bytes`` of output (no page faulting to plan), this does
the same work on Python ints: each part's offsets are read as a list (``Tensor.tolist``, a fraction of
a microsecond for a few rows), checked (`check_few_offsets`: the checks of
`torch_impl._parts.check_offsets`, raising through the same `_explain_bad_offsets`), and each output
row is one slice assignment between two slices of `torch_impl._host.address_space` at the rows'
addresses (a ``memcpy`` of whole value rows: bytes as bytes, every dtype bit for bit). The operations
grow with the rows, which is why this stops at a few: the crossover is measured in
``Settings.cpu_few_rows``. Like the row copies, the copies can be planned
(`torch_impl._rowcopy.Moves`): a call checks every key before any key's copies run.

A whole call of this kind (`few_rows_call`: every key jagged, plain and few-rowed, verl's lists of
Python ints as partitions) skips the general checks' machinery too: it takes the call only where every
one of those checks would pass, reads each part as `torch_impl._parts.check_parts` would, and assembles
each key with `assemble_few_rows`, which checks the offsets; anything else (a padding micro-batch, a
dense or differentiable output, a TensorDict, an index that is not a Python int, any defect) goes to the
general pipeline, which gives the same result or raises for it. Measured, B=8, mean length 16, M=4,
one key (2 cores, torch 2.13): `rebatch.bench.versus`'s fixed cost 0.148 ms against 0.235 through the
general pipeline, the same quiet hour (3c468db6's 0.82-0.88 ms in both runs); in-process, a
prototype's checks of the four parts took 30 µs of its 114-125, torch's nested tensor 45.

Every range copied lies inside its tensors. A row's source is the span between two consecutive
offsets of its part, both checked (they start at 0, never decrease and end at the part's number of
value rows, and the values are contiguous: `torch_impl._host.host_movable`), so it lies inside the
part's values; the destinations follow one another from the output's start, and each copy is
refused (`RuntimeError`, a defect of this package, never of the input) before it would write past
the output's end: the guard the row copies' `torch_impl._rowcopy.check_ranges` is to them, one
comparison a row.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Collection, Sequence
from typing import Any

import torch

from ref.dtypes import SUPPORTED_DTYPES

from ._bridge import numpy_bridge
from ._host import address_space
from ._jagged import fresh_njt
from ._parts import _NJT, JaggedPart, _explain_bad_offsets
from ._rowcopy import Moves
from ._settings import get_settings
from ._witness import Witness

__all__ = ["assemble_few_rows", "check_few_offsets", "few_rows_apply", "few_rows_call"]

#: The torch dtypes `ref.dtypes.check_dtype` accepts (by name).
_SUPPORTED = frozenset(
    d for d in (getattr(torch, name, None) for name in SUPPORTED_DTYPES) if isinstance(d, torch.dtype)
)


def few_rows_call(
    output_lst: Any, indices: Any, witness: Any = None, unbound: Collection[Any] = ()
) -> dict[Any, torch.Tensor] | None:
    """``postprocess_batch(output_lst, indices)["model_output"]`` (dynamic batch size on, no padding)
    for the plain common case of a few rows, or None where the call is anything else (the general
    pipeline then runs).

    Taken only where every check of the general pipeline before the offsets passes: a list of dicts
    whose ``model_output`` dicts have the same keys in the same order (at least one) and whose
    ``metrics``, where present, are dicts; one list of Python ints (no bool) per micro-batch, together
    ``range(B)`` in some order, at most ``Settings.cpu_few_rows``; for each key, plain jagged nested
    tensors on the CPU as `torch_impl._parts.check_parts` takes them as they are (ragged dimension 1,
    no holes, nothing to differentiate, int64 1-D offsets, plain contiguous values without a lazy
    conjugate or negative bit), one row per index of its micro-batch, of one supported dtype and
    trailing shape, under ``Settings.cpu_prefault_min_bytes`` in all (`few_rows_apply`). Then each
    key is `assemble_few_rows` (its offsets checked there, in key order, as the general pipeline
    checks them: the same error for the same defect), and every copy made after every key is planned.
    The caller folds the losses and metrics (the metrics are dicts, as its check wants them). With a
    ``witness`` (not None), it is checked (`torch_impl._witness.Witness`) after every key is planned
    and before any copy runs."""
    if type(output_lst) is not list or type(indices) is not list or not output_lst or not numpy_bridge():
        return None
    if len(indices) != len(output_lst):
        return None
    outs = []
    for o in output_lst:
        mo = o.get("model_output") if type(o) is dict else None
        if type(mo) is not dict or ("metrics" in o and type(o["metrics"]) is not dict):
            return None
        outs.append(mo)
    keys = list(outs[0])
    if not keys or any(list(mo) != keys for mo in outs[1:]):
        return None
    if any(type(p) is not list for p in indices):
        return None
    sizes = list(map(len, indices))
    n = sum(sizes)
    if n > get_settings().cpu_few_rows:  # before the indices are gathered: a large call leaves at once
        return None
    flat: list[Any] = list(itertools.chain.from_iterable(indices))
    # (no rows: no type either, refused too)
    if set(map(type, flat)) != {int} or sorted(flat) != list(range(n)):
        return None
    checked = []
    grad = torch.is_grad_enabled()
    with torch._C.DisableTorchFunctionSubclass():  # attributes of the nested tensors, not their handlers
        for key in keys:
            parts = []
            for mo, size in zip(outs, sizes, strict=True):
                x = mo[key]
                if type(x) is not _NJT or x._ragged_idx != 1 or x._lengths is not None or x.requires_grad:
                    return None
                v, off = x._values, x._offsets
                if (
                    type(v) is not torch.Tensor
                    or type(off) is not torch.Tensor
                    or not (v.is_cpu and off.is_cpu)
                    or off.dtype != torch.int64
                    or off.dim() != 1
                    or off.shape[0] != size + 1
                    or (grad and v.requires_grad)
                    or not v.is_contiguous()
                    or v.is_neg()
                    or v.is_conj()
                ):
                    return None
                parts.append(tuple.__new__(JaggedPart, (v, off, size)))
            first = parts[0].values
            if first.dtype not in _SUPPORTED or any(
                p.values.dtype != first.dtype or p.values.shape[1:] != first.shape[1:] for p in parts[1:]
            ):
                return None
            if not few_rows_apply(parts, n):
                return None
            checked.append((key, parts))
    inv = [0] * n
    for k, i in enumerate(flat):
        inv[i] = k
    moves: Moves = []
    seen = None if witness is None else Witness(witness, n, flat, sizes, unbound)
    model_output = {key: assemble_few_rows(parts, key, inv, moves, seen) for key, parts in checked}
    if seen is not None:
        seen.verdict()
    for move in moves:
        move()
    return model_output


def few_rows_apply(parts: Sequence[JaggedPart], rows: int) -> bool:
    """At most ``Settings.cpu_few_rows`` rows and under ``Settings.cpu_prefault_min_bytes`` of values
    (the output's size), for parts the host paths may read and move (the caller has checked that)."""
    settings = get_settings()
    if rows > settings.cpu_few_rows:
        return False
    nbytes = sum(p.values.numel() for p in parts) * parts[0].values.element_size()
    return nbytes < settings.cpu_prefault_min_bytes


def check_few_offsets(parts: Sequence[JaggedPart], key: Any) -> tuple[list[int], list[list[int]]]:
    """`torch_impl._parts.check_offsets` on Python ints: every part's ``offsets[0] == 0``, non-decreasing,
    ``offsets[-1] == len(values)`` (`InvalidJaggedError` otherwise, the same message). Returns every
    row's length (concatenation order) and each part's offsets as a list."""
    offsets = [p.offsets.tolist() for p in parts]
    lengths: list[int] = []
    for p, o in zip(parts, offsets, strict=True):
        if o[0] != 0 or o[-1] != p.values.shape[0]:
            _explain_bad_offsets(parts, key)
        lengths += map(operator.sub, o[1:], o)
    if lengths and min(lengths) < 0:
        _explain_bad_offsets(parts, key)
    return lengths, offsets


def assemble_few_rows(
    parts: Sequence[JaggedPart],
    key: Any,
    inv: list[int] | None,
    moves: Moves | None = None,
    witness: Witness | None = None,
) -> torch.Tensor:
    """The jagged result ``[B, (j), *F]`` of ``parts`` (CPU, movable by the host, `few_rows_apply`):
    ``[rows[k] for k in inv]``, where ``rows`` are the parts' rows end to end and ``inv`` the inverse
    permutation (None: the rows in their order), checked first (`check_few_offsets`). ``moves``: see
    `torch_impl._rowcopy.Moves` (None: the copies are made before returning); ``witness``: the call's
    alignment witness, handed the restored row lengths (`torch_impl._witness.Witness.observe`)."""
    lengths, offsets = check_few_offsets(parts, key)
    first = parts[0].values
    row_bytes = first.element_size() * math.prod(first.shape[1:])
    spans: list[tuple[int, int]] = []  # each row's first and past-the-last byte (concatenation order)
    for p, o in zip(parts, offsets, strict=True):
        base = p.values.data_ptr()
        at = [base + i * row_bytes for i in o]
        spans += itertools.pairwise(at)
    if inv is not None:
        lengths = [lengths[k] for k in inv]
        spans = [spans[k] for k in inv]
    if witness is not None:
        witness.observe(key, parts, lengths)
    out_offsets = list(itertools.accumulate(lengths, initial=0))
    out = first.new_empty((out_offsets[-1], *first.shape[1:]))
    if row_bytes:
        copy = functools.partial(_copy_spans, out, spans, tuple(p.values for p in parts))
        if moves is None:
            copy()
        else:
            moves.append(copy)
    offsets_out = torch.empty(len(out_offsets), dtype=torch.int64)
    offsets_out.numpy()[:] = out_offsets  # NumPy converts Python ints in a fraction of torch.tensor's time
    return fresh_njt(out, offsets_out)


def _copy_spans(out: torch.Tensor, spans: list[tuple[int, int]], owners: tuple[torch.Tensor, ...]) -> None:
    """Each span's bytes (``(first, past the last)`` addresses, all inside ``owners``, which this holds
    until it has run), one after the other from ``out``'s first byte, each refused before it would pass
    ``out``'s last (`RuntimeError`: a defect of this package)."""
    memory, dest = address_space(), out.data_ptr()
    end = dest + out.numel() * out.element_size()
    for begin, stop in spans:
        size = stop - begin
        if size < 0 or dest + size > end:
            raise RuntimeError("rebatch: a few-rows copy would fall outside its output (a defect of rebatch)")
        memory[dest : dest + size] = memory[begin:stop]
        dest += size
