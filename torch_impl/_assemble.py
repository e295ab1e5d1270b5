"""`assemble`: one key's checked parts joined, and put in original order, by the path that fits.

Every output element is written exactly once into a fresh output (never an input's storage), and the
number of torch operations is a constant per key (and one per further chunk of 16 MiB of output on
the element-index path), never growing with the number of rows or parts:

- dense parts ``[b_m, *F]``: on the host (CPU, no autograd, from ``Settings.cpu_dense_host_min_elements``)
  by copies or NumPy scatters of whole rows (`torch_impl._host.scatter_rows`), otherwise
  `torch_impl._dense`;
- jagged CPU parts of a few rows (`torch_impl._fewrows`: up to ``Settings.cpu_few_rows``, under
  ``Settings.cpu_prefault_min_bytes``, no autograd): the bookkeeping in Python ints, one copy a row;
- jagged parts without a permutation, or with the identity (`CallRows.in_order`): the values laid
  end to end (on the host, ``memcpy`` of pieces of each part, `torch_impl._rowcopy.concat_by_copies`; otherwise
  one ``cat``), the offsets from all row lengths;
- jagged parts with a permutation: row copies (`torch_impl._rowcopy`: CPU, no autograd, long rows)
  or element indices (`torch_impl._indexcopy`: any device, differentiable), chosen by
  `torch_impl.Settings`.

What the keys of one call share (the permutation on the device, its inverse) is built once per call
(`torch_impl._rows.CallRows`). Under ``torch.compile`` the whole call runs eagerly (a graph break at
the public entry point that calls this, `torch_impl._entry.entry`):
its work is data movement whose sizes are read on the host, which a graph could not hold without a
specialisation per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ._dense import assemble_dense
from ._fewrows import assemble_few_rows, few_rows_apply
from ._host import host_checkable, host_lengths, host_movable, numpy_bridge, permute_by_host_indices, scatter_rows
from ._indexcopy import permute_by_indices
from ._jagged import fresh_njt as njt, zero_prefixed_cumsum
from ._parts import DensePart, JaggedPart, Part, check_offsets
from ._rowcopy import Moves, RowLayout, concat_on_host, long_rows, permute_by_rows, row_copies_apply
from ._rows import CallRows
from ._settings import get_settings
from ._witness import Witness

__all__ = ["assemble"]


def assemble(
    parts: Sequence[Part],
    perm: torch.Tensor | None,
    key: Any = None,
    rows: CallRows | None = None,
    moves: Moves | None = None,
    witness: Witness | None = None,
) -> torch.Tensor:
    """Concatenate ``parts`` (checked by `check_parts`), then put row ``k`` at row ``perm[k]``.

    ``perm``: ``None`` (plain concatenation) or a checked permutation of ``range(B)`` (CPU); ``rows``:
    what the call's keys share (built here when not given; its ``perm`` is ``perm``); ``moves``: where
    the host copies go when the caller runs them later (`torch_impl._rowcopy.Moves`; None: made
    here); ``witness``: the call's alignment witness, handed the restored row lengths each jagged path
    computes (`torch_impl._witness.Witness.observe`; it compares, the call reads its verdict). Jagged
    parts ``[b_m, (j), *F]`` give ``[B, (j), *F]``; dense ``[b_m, *F]`` give ``[B, *F]``.
    """
    if rows is None:
        rows = CallRows([p.rows for p in parts], perm)
    if perm is not None and rows.in_order():
        perm = None  # the concatenation is the result
    device = parts[0].values.device
    if isinstance(parts[0], DensePart):
        if witness is not None:
            witness.left_key()
        dense = [p for p in parts if isinstance(p, DensePart)]
        if device.type == "cpu" and numpy_bridge() and host_movable(dense) and _many(dense):
            return _dense_on_host(dense, perm, rows, moves)
        return assemble_dense(dense, None if perm is None else rows.perm(device))
    jagged = [p for p in parts if isinstance(p, JaggedPart)]
    if device.type == "cpu" and host_checkable(jagged):
        return _assemble_on_host(jagged, perm, key, rows, moves, witness)
    lengths = check_offsets(jagged, key, rows.steps(device))
    if perm is None:
        if witness is not None:
            witness.observe(key, jagged, lengths)
        return njt(torch.cat([p.values for p in jagged]), zero_prefixed_cumsum(lengths))
    total = sum(p.values.shape[0] for p in jagged)
    inv = rows.inverse(device)
    restored = lengths.index_select(0, inv)
    if witness is not None:
        witness.observe(key, jagged, restored)
    out_offsets = zero_prefixed_cumsum(restored)
    if row_copies_apply(jagged, total, perm.numel()):
        return njt(permute_by_rows(jagged, lengths, inv, total), out_offsets)
    return njt(permute_by_indices(jagged, lengths, rows.perm(device), out_offsets), out_offsets)


def _many(dense: Sequence[DensePart]) -> bool:
    """At least ``Settings.cpu_dense_host_min_elements`` elements in all."""
    return sum(p.values.numel() for p in dense) >= get_settings().cpu_dense_host_min_elements


def _dense_on_host(
    dense: Sequence[DensePart], perm: torch.Tensor | None, rows: CallRows, moves: Moves | None
) -> torch.Tensor:
    """`assemble` of CPU dense parts NumPy may move, on the calling thread: laid end to end by copies
    (`concat_on_host`: ``cat`` from ``Settings.cpu_parallel_concat_min_bytes``), or whole rows scattered to their places
    with NumPy (`scatter_rows`), instead of ``cat`` and ``index_copy_``, whose parallel regions wait
    for a descheduled thread on a busy machine (from ``Settings.cpu_dense_host_min_elements``, which
    cites the measurements)."""
    total = sum(p.rows for p in dense)
    if perm is None:
        return concat_on_host(dense, total, moves)
    return scatter_rows(dense, rows.perm(torch.device("cpu")).numpy(), total)


def _assemble_on_host(
    jagged: Sequence[JaggedPart],
    perm: torch.Tensor | None,
    key: Any,
    rows: CallRows,
    moves: Moves | None,
    witness: Witness | None,
) -> torch.Tensor:
    """`assemble` of CPU jagged parts with the bookkeeping on the host: in Python ints for a few rows
    (`torch_impl._fewrows`), otherwise in NumPy (`torch_impl._host`): the same checks, offsets and
    values; the values moved by copies a row, by NumPy scatters (no gradient to carry) or by the
    differentiable element-index path."""
    if few_rows_apply(jagged, sum(rows.rows)) and host_movable(jagged):
        return assemble_few_rows(jagged, key, None if perm is None else rows.inverse_list(), moves, witness)
    host = rows.host()
    lengths, starts = host_lengths(jagged, key, host)
    out_offsets = torch.empty(lengths.shape[0] + 1, dtype=torch.int64)
    offsets = out_offsets.numpy()
    offsets[0] = 0
    if perm is None:
        lengths.cumsum(out=offsets[1:])
        if witness is not None:
            witness.observe(key, jagged, lengths, offsets=offsets)
        if host_movable(jagged):  # below a floor, no parallel region to stall on a busy machine
            return njt(concat_on_host(jagged, int(offsets[-1]), moves), out_offsets)
        return njt(torch.cat([p.values for p in jagged]), out_offsets)
    assert host.inv is not None
    out_lengths = lengths[host.inv]
    out_lengths.cumsum(out=offsets[1:])
    if witness is not None:
        witness.observe(key, jagged, out_lengths, offsets=offsets)
    total = int(offsets[-1])
    if host_movable(jagged):  # with `host_checkable` above: `row_copies_apply` but the rows' length
        if long_rows(jagged, total, perm.numel()):
            layout = RowLayout(host.part_of_row, starts)
            moved = permute_by_rows(jagged, torch.from_numpy(lengths), torch.from_numpy(host.inv), total, layout, moves)
            return njt(moved, out_offsets)
        return njt(permute_by_host_indices(jagged, lengths, offsets, host, total, out_lengths), out_offsets)
    device = jagged[0].values.device
    return njt(permute_by_indices(jagged, torch.from_numpy(lengths), rows.perm(device), out_offsets), out_offsets)
