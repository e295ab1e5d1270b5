"""The copy paths (CPU, no autograd): row copies (long rows: each output row one contiguous copy, no
index buffer; neighbours in both their part and the output one copy together, `join_runs`) and a
concatenation by copies of each part (`concat_by_copies`).

Every piece's byte ranges (a row, or a piece of a part) are computed at once with NumPy as addresses
(each tensor's ``data_ptr()`` plus byte offsets), checked inside the tensors they name
(`check_ranges`), and each piece is then copied by one slice assignment between two slices of one
memoryview of the whole address space (`torch_impl._host.address_space`; a ``memcpy``), on the
calling thread. No array or view object is made per row or per part: measured at B=1024, float32,
527 values a row on average (2 MiB), 2 cores, torch 2.13, NumPy 2: a NumPy view per row and one
``numpy.concatenate`` 1.07-1.29 ms, memoryview slice assignments 0.79-0.90 ms, a plain copy of the
same bytes 0.20 ms (torch's ``unsafe_split_with_sizes`` and ``cat``, per an earlier measurement,
3.3x the NumPy views); then, whole calls, paired, a NumPy byte view per part (``Tensor.numpy()``,
1.5-3.6 µs each) against the addresses: B=1024, L=512, M=64, 5 keys 1.13x slower, M=16 one key
1.02x, B=8, L=512, M=4 and B=4096, L=4096, M=16 0.99-1.0x (noise). Bytes are moved as bytes, so
every dtype (bfloat16 and float8, which NumPy lacks, included) comes out bit for bit. The output's
pages are faulted in as the rows reach them (`torch_impl._host.fault_plan`: by chunks of
``Settings.cpu_fault_chunk_bytes`` in large outputs, so each row lands in pages just zeroed, still
in cache). Peak memory is the output. No threads of its own, no process-wide setting touched.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch

from . import _host
from ._host import address_space, fault_in, fault_origin, fault_plan, fault_step, fresh_output
from ._parts import JaggedPart, Part
from ._settings import get_settings

__all__ = [
    "Moves",
    "RowLayout",
    "check_ranges",
    "concat_by_copies",
    "concat_on_host",
    "join_runs",
    "long_rows",
    "permute_by_rows",
    "row_copies_apply",
    "row_layout",
]


#: Copies planned but not yet made: each a call that writes its output's bytes. A function given a
#: ``moves`` list appends its copies there and returns an output whose values are written only once
#: the caller has run them; None: the copies are made before returning. `torch_impl._postprocess`
#: plans every key (checks, outputs, nested tensors, addresses), then runs every copy, so no key's
#: bookkeeping runs in caches the previous key's copies have just filled (the nested tensor alone:
#: 27 µs warm, 112-142 µs after a 10 MiB copy). Measured, whole calls, paired, 2 cores, torch 2.13,
#: each key's copies made at once against after all keys: B=1024, L=512, 5 keys, M=64 1.07x
#: slower, M=16 1.07x; one key 1.02x.
Moves = list[Callable[[], None]]


def row_copies_apply(parts: Sequence[JaggedPart], total: int, rows: int) -> bool:
    """Row copies: values NumPy may move (`torch_impl._host.host_movable`: CPU plain tensors,
    contiguous, no gradient to carry; `unpack` has resolved any lazy conjugate or negative bit), through
    a torch that shares storage with NumPy, in rows long enough to amortise a copy each (`long_rows`)."""
    return _host.numpy_bridge() and _host.host_movable(parts) and long_rows(parts, total, rows)


def long_rows(parts: Sequence[JaggedPart], total: int, rows: int) -> bool:
    """``rows`` rows of ``total`` value rows in all hold at least ``Settings.row_copy_min_elements``
    elements on average (values per row times the trailing size)."""
    return rows > 0 and total * math.prod(parts[0].values.shape[1:]) >= get_settings().row_copy_min_elements * rows


class RowLayout(NamedTuple):
    """Where each row of the parts (concatenation order) lives: ``part_of_row`` (``[B]``: its part)
    and ``starts`` (``[B]``: its first value row inside that part)."""

    part_of_row: np.ndarray
    starts: np.ndarray


def row_layout(parts: Sequence[JaggedPart], lengths: np.ndarray) -> RowLayout:
    """The `RowLayout` of ``parts`` from every row's length (``[B]``), in a constant number of NumPy
    operations (the host path reads it off the offsets instead, `torch_impl._host.host_lengths`)."""
    counts = np.fromiter((p.rows for p in parts), dtype=np.int64, count=len(parts))
    sizes = np.fromiter((p.values.shape[0] for p in parts), dtype=np.int64, count=len(parts))
    # each row's start in the parts laid end to end, less its part's start: its start inside its part
    starts = np.zeros(lengths.shape[0], dtype=np.int64)
    lengths[:-1].cumsum(out=starts[1:])
    part_starts = np.zeros(len(parts), dtype=np.int64)
    sizes[:-1].cumsum(out=part_starts[1:])
    part_of_row = np.arange(len(parts), dtype=np.int64).repeat(counts)
    return RowLayout(part_of_row, starts - part_starts[part_of_row])


def permute_by_rows(
    parts: Sequence[JaggedPart],
    lengths: torch.Tensor,
    inv: torch.Tensor,
    total: int,
    layout: RowLayout | None = None,
    moves: Moves | None = None,
) -> torch.Tensor:
    """Output values ``[N, *F]``: ``[rows[k] for k in inv]`` laid end to end, where ``rows`` are the
    parts' rows in concatenation order (``lengths`` ``[B]``: their lengths in rows of ``values``) and
    ``inv`` ``[B]`` is the inverse permutation; ``layout``: the parts' `RowLayout` where the caller has
    it. Every output row's part, its byte range there and its byte range in the output are computed at
    once with NumPy (a constant number of operations); then each row is one ``memcpy`` by address
    (`_copy_pieces`; rows that follow one another in both their part and the output, one ``memcpy``
    together: `join_runs`), the output's pages faulted in group by group just before the rows that
    write them (`torch_impl._host.fault_plan`). ``moves``: see `Moves`."""
    first = parts[0].values
    out = fresh_output(first, (total, *first.shape[1:]), populate=False)
    row_bytes = first.element_size() * math.prod(first.shape[1:])
    lens, order = lengths.numpy(), inv.numpy()
    where = row_layout(parts, lens) if layout is None else layout
    dest = np.zeros(lens.shape[0] + 1, dtype=np.int64)  # each output row's first byte, then the end
    np.multiply(lens[order], row_bytes, out=dest[1:]).cumsum(out=dest[1:])
    src_begin = where.starts[order] * row_bytes
    step, origin = fault_step(int(dest[-1])), fault_origin(out)  # `fault_plan`'s groups
    dest, part_of_piece, src_begin = join_runs(dest, where.part_of_row[order], src_begin, step, origin)
    _copy_pieces(out, parts, dest, part_of_piece, src_begin, moves)
    return out


def join_runs(
    dest: np.ndarray, part_of_piece: np.ndarray, begin: np.ndarray, step: int, origin: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces as `_copy_pieces` takes them (``dest`` ``[K + 1]``, ``part_of_piece`` and ``begin``
    ``[K]``), each run of pieces that follow one another both in their part and in the output joined
    into one piece while they start in the same fault group as the run's first: the groups of
    `torch_impl._host.fault_plan`, ``step`` bytes each from byte ``origin`` of the output (its first
    whole page), so a joined piece spans at most a group and its last row, and the output's pages are
    still faulted in a group at a time just before the pieces that write them. Two rows of one
    micro-batch that are neighbours in the original order are neighbours in its values too where its
    indices ascend (as verl's do); where the micro-batches are random subsets of M, about one row in M
    continues the one before it. Joined only where at least ``Settings.cpu_join_min_neighbours``
    pieces continue the piece before them in its part (the joining's own dozen NumPy operations cost
    about what that many copies save); the pieces as they are otherwise. A constant number of NumPy
    operations."""
    if part_of_piece.shape[0] < 2:
        return dest, part_of_piece, begin
    starts = dest[:-1]
    # the piece has the part of the piece before it, and its source starts where that one's ends
    joins = (np.diff(part_of_piece) == 0) & (np.diff(begin) == np.diff(starts))
    if np.count_nonzero(joins) < get_settings().cpu_join_min_neighbours:
        return dest, part_of_piece, begin
    joins &= np.diff((starts - origin) // step) == 0  # and it starts in the same fault group
    first = np.flatnonzero(np.concatenate(([True], ~joins)))  # each joined piece's first piece
    return np.append(starts[first], dest[-1]), part_of_piece[first], begin[first]


def concat_on_host(parts: Sequence[Part], total: int, moves: Moves | None = None) -> torch.Tensor:
    """Output values ``[N, *F]`` (``N = total``): the values of parts NumPy may move laid end to end,
    by `concat_by_copies` below ``Settings.cpu_parallel_concat_min_bytes``, by ``torch.cat`` (its
    copy split among torch's threads) from there. ``moves``: see `Moves` (``cat`` copies at once)."""
    nbytes = sum(p.values.numel() for p in parts) * parts[0].values.element_size()
    if nbytes >= get_settings().cpu_parallel_concat_min_bytes:
        return torch.cat([p.values for p in parts])
    return concat_by_copies(parts, total, moves)


def concat_by_copies(parts: Sequence[Part], total: int, moves: Moves | None = None) -> torch.Tensor:
    """Output values ``[N, *F]``: the parts' values laid end to end (``torch.cat``'s result), by
    ``memcpy`` of pieces of at most `torch_impl._host.fault_step` bytes (where the output is faulted
    in by chunks, `torch_impl._host.fault_plan`, each lands in pages just faulted in), on the calling
    thread. ``torch.cat`` splits a copy of 32768 elements or more among torch's threads, whose
    parallel region then waits for any thread the machine has descheduled (measured, 2 cores each
    running another process: B=512, L=512, one micro-batch 7.7 ms instead of 0.78 quiet). ``moves``:
    see `Moves`."""
    first = parts[0].values
    out = fresh_output(first, (total, *first.shape[1:]), populate=False)
    sizes = np.fromiter((p.values.numel() * p.values.element_size() for p in parts), dtype=np.int64, count=len(parts))
    step = fault_step(int(sizes.sum()))  # pieces of at most a fault group: the faults follow them
    counts = -(-sizes // step)
    part_of_piece = np.arange(len(parts), dtype=np.int64).repeat(counts)
    first_piece = np.zeros(len(parts), dtype=np.int64)
    counts[:-1].cumsum(out=first_piece[1:])
    begin = (np.arange(part_of_piece.shape[0], dtype=np.int64) - first_piece[part_of_piece]) * step
    nbytes = np.minimum(sizes[part_of_piece] - begin, step)
    dest = np.zeros(nbytes.shape[0] + 1, dtype=np.int64)
    nbytes.cumsum(out=dest[1:])
    _copy_pieces(out, parts, dest, part_of_piece, begin, moves)
    return out


def check_ranges(
    out: torch.Tensor,
    sources: Sequence[torch.Tensor],
    dest_begin: np.ndarray,
    nbytes: np.ndarray,
    source_of_piece: np.ndarray,
    begin: np.ndarray,
) -> None:
    """Every piece ``k`` (``nbytes[k]`` bytes from byte ``begin[k]`` of ``sources[source_of_piece[k]]``
    to byte ``dest_begin[k]`` of ``out``; each ``[K]``) lies inside the bytes of the tensors it names:
    the guard of the copies by address (`torch_impl._host.address_space`), which check nothing
    themselves. A constant number of NumPy operations; a `RuntimeError` (a defect of this package,
    never of the input, which is checked before) instead of a write outside a tensor."""
    if not nbytes.shape[0]:
        return
    sizes = np.fromiter(map(torch.Tensor.numel, sources), dtype=np.int64, count=len(sources))
    sizes *= sources[0].element_size()
    # every one of these is >= 0 for a piece inside its tensors; their bitwise or is then >= 0 too,
    # and negative as soon as one is (its sign bit): one reduction for all five conditions
    room = sizes[source_of_piece] - begin - nbytes  # what is left of the source after the piece
    room |= out.numel() * out.element_size() - dest_begin - nbytes  # ... and of the output
    room |= begin
    room |= nbytes
    room |= dest_begin
    if int(room.min()) < 0:
        raise RuntimeError("rebatch: a host copy's byte ranges fall outside its tensors (a defect of rebatch)")


def _copy_pieces(
    out: torch.Tensor,
    parts: Sequence[Part],
    dest: np.ndarray,
    part_of_piece: np.ndarray,
    begin: np.ndarray,
    moves: Moves | None,
) -> None:
    """Write piece ``k`` (``dest[k + 1] - dest[k]`` bytes from byte ``begin[k]`` of part
    ``part_of_piece[k]``'s values) at bytes ``dest[k]`` to ``dest[k + 1]`` of ``out`` (``dest``:
    ``[K + 1]``; the others ``[K]``), one slice assignment each between slices of
    `torch_impl._host.address_space` at the pieces' addresses (a ``memcpy``; no view object per part
    or piece), every range checked inside its tensor first (`check_ranges`), the output's pages
    faulted in as the pieces reach them (`torch_impl._host.fault_plan`): now, or appended to
    ``moves``."""
    values = [p.values for p in parts]
    nbytes = np.diff(dest)
    check_ranges(out, values, dest[:-1], nbytes, part_of_piece, begin)
    addresses = np.fromiter(map(torch.Tensor.data_ptr, values), dtype=np.int64, count=len(values))
    src = addresses[part_of_piece] + begin
    target = (dest + out.data_ptr()).tolist()  # each piece's destination, then the end of the last
    copies = zip(target[:-1], target[1:], src.tolist(), (src + nbytes).tolist(), strict=True)
    move = _Copies(fault_plan(out, dest[1:]), copies, (out, *values))
    if moves is None:
        move()
    else:
        moves.append(move)


class _Copies:
    """Copies by address, made when called: ``copies`` yields each piece's (destination, its end,
    source, its end) addresses, ``plan`` says which output pages to fault in before which pieces
    (`torch_impl._host.fault_plan`), and ``owners`` holds the tensors behind the addresses until the
    copies are made (the caller may drop its own references first)."""

    __slots__ = ("copies", "owners", "plan")

    def __init__(
        self,
        plan: list[tuple[int, int, int]],
        copies: Iterator[tuple[int, int, int, int]],
        owners: tuple[torch.Tensor, ...],
    ) -> None:
        self.plan, self.copies, self.owners = plan, copies, owners

    def __call__(self) -> None:
        memory, copies = address_space(), self.copies
        for pieces, start, size in self.plan:
            fault_in(start, size)
            for a, b, c, e in itertools.islice(copies, pieces):
                memory[a:b] = memory[c:e]
        for a, b, c, e in copies:  # none left (the plan counts every piece); a short plan faults, never skips
            memory[a:b] = memory[c:e]
