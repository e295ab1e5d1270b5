"""A group's plan on its accelerator: ten kernel launches a call, one upload, no read of the device.

Every key of a group (`torch_impl._plan.KeyPlan.group`: keys on the same offsets tensors, as verl's
engines build every per-token key of a micro-batch) shares this plan. What depends only on the row
counts and the permutation, which the host knows, is laid out on the host as index arrays and uploaded
in one buffer (pinned where the device is a GPU, non-blocking). What depends on the offsets, which live
on the device, is computed there from them by a fixed chain of operations, whatever the numbers of rows
``B`` and micro-batches ``M``:

1. the upload of the host's buffer;
2. ``flat``: the parts' offsets laid end to end, then two zeros (``[B + M + 2]``, one ``cat``);
3. ``steps = flat.diff()``: row ``r`` of micro-batch ``m`` (rows counted over all micro-batches, in
   the split's order) has length ``steps[r + m]``; ``steps[B + M]`` is 0;
4. one ``index_select`` of ``steps``: two rows ``[2, B + 2]``, the restored lengths (original order)
   between zeros, ``[0, l[inv[0]], ..., l[inv[B - 1]], 0]``, and the split's lengths after two zeros,
   ``[0, 0, l[0], ..., l[B - 1]]``;
5. one ``cumsum`` along the rows: the result's offsets ``[0, ...]`` (row 0, its first ``B + 1``) and
   each split row's first value among the parts' values laid end to end, after a spare 0 (row 1);
6. with a permutation, the element runs of the move (`torch_impl._jagged.Runs`): one ``index_select``
   of the result's offsets gives each split row's first destination and the end of the split row
   before it, and one ``sub`` writes their difference into the uploaded buffer after its ``-1`` (the
   runs' first jump, at element 0); the element indices from them take three more launches (one
   fill, one ``index_add_``, one ``cumsum_``), made once for the group when the first key moves.

The offsets are trusted there (a check would read the device) and counted, as `check_offsets` counts
them (``skipped_device_offsets``). The result's offsets are row 0 of step 5's ``[2, B + 2]``
tensor: a view at its start, computed by the same ``cumsum`` torch's own would be.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from ._jagged import Runs, host_offsets
from ._parts import JaggedPart
from ._rows import CallRows
from ._tally import skipped

__all__ = ["DevicePlan", "plan_from_host", "plan_on_device", "upload"]

#: The two zeros laid after the parts' offsets: their step is a length of 0 for the rows' padding.
_ZEROS = 2
#: The first jump of a move's runs (`Runs`: ``jumps[0] = shift[0] - 1``), held in the uploaded buffer.
_FIRST_JUMP = -1


class DevicePlan(NamedTuple):
    """A group planned for its device: ``lengths`` ``[B]`` (the split's order), ``restored`` ``[B]``
    (original order), ``offsets`` ``[B + 1]`` (the result's, on the device), ``runs`` (the move's element
    runs; None without a permutation, where the parts are laid end to end); ``expected``: planned from
    lengths the host knows (`plan_from_host`), the parts' offsets laid end to end as those lengths give
    them ``[B + M]``, on the device (the alignment witness compares the parts' own with them)."""

    lengths: torch.Tensor
    restored: torch.Tensor
    offsets: torch.Tensor
    runs: Runs | None
    expected: torch.Tensor | None = None


def upload(host: np.ndarray, device: torch.device) -> torch.Tensor:
    """``host`` (int64) on ``device``: one copy that waits for nothing, from pinned memory where the device
    is a GPU (a copy from pageable memory may block the host until the device is idle)."""
    staged = torch.from_numpy(host)
    if device.type == "cuda" and torch.cuda.is_available():
        staged = staged.pin_memory()
    return staged.to(device, non_blocking=True, copy=True)  # a buffer of its own, on the CPU too


def _host_layout(rows: CallRows) -> tuple[np.ndarray, int, int]:
    """The host's half of the plan, one int64 array: the two zeros appended to the offsets, the
    ``index_select`` of step 4 (``[2 * (B + 2)]``), and with a permutation the ``index_select`` of step 6
    (``[2 * B]``) and the runs' jumps (``[B + 1]``, the first `_FIRST_JUMP`, the rest written on the
    device). Returns it, where step 6's index begins, and where the jumps begin."""
    sizes = rows.rows
    count = sum(sizes)
    micro_batch = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    step_of_row = np.arange(count, dtype=np.int64) + micro_batch  # row r of micro-batch m: step r + m
    zero_step = count + len(sizes)  # the step between the two appended zeros
    zero = np.array([zero_step], dtype=np.int64)
    restored_steps = step_of_row if rows.perm is None else step_of_row[rows.host()[1]]
    pieces = [np.zeros(_ZEROS, dtype=np.int64), zero, restored_steps, zero, zero, zero, step_of_row]
    selects = sum(p.shape[0] for p in pieces)
    if rows.perm is not None:
        perm = rows.host()[0]
        # where the split row before each ends (before the first: offset 0)
        previous_ends = np.concatenate([np.zeros(1, dtype=np.int64), perm + 1])[:count]
        pieces += [perm, previous_ends]
        pieces += [np.array([_FIRST_JUMP], dtype=np.int64), np.zeros(count, dtype=np.int64)]
    return np.concatenate(pieces), selects, selects + 2 * count


def plan_on_device(parts: Sequence[JaggedPart], rows: CallRows) -> DevicePlan:
    """`DevicePlan` of a group's checked ``parts`` (on one accelerator), from their offsets (trusted,
    counted) and the call's ``rows``."""
    device = parts[0].offsets.device
    host, runs_index_at, jumps_at = rows.once(
        "device layout", torch.device("cpu"), lambda: _host_layout(rows)
    )
    buffer = upload(host, device)  # each group its own: its jumps are written into it
    if device.type != "cpu":  # trusted there, and counted (the CPU's were checked: `Settings.plan_on_device`)
        skipped("skipped_device_offsets")
    count = sum(rows.rows)
    width = count + 2
    flat = torch.cat([*(p.offsets for p in parts), buffer[:_ZEROS]])
    steps = flat.diff()
    both = steps.index_select(0, buffer[_ZEROS:runs_index_at]).view(2, width)
    sums = both.cumsum(1)
    offsets = sums[0, : count + 1]
    lengths, restored = both[1, 2:], both[0, 1 : count + 1]
    if rows.perm is None:
        return DevicePlan(lengths, restored, offsets, None)
    firsts_and_ends = offsets.index_select(0, buffer[runs_index_at:jumps_at])
    jumps = buffer[jumps_at:]
    torch.sub(firsts_and_ends[:count], firsts_and_ends[count:], out=jumps[1:])
    total = sum(p.values.shape[0] for p in parts)
    return DevicePlan(lengths, restored, offsets, Runs(sums[1, : count + 1], jumps, total))


def plan_from_host(parts: Sequence[JaggedPart], rows: CallRows, restored: np.ndarray) -> DevicePlan | None:
    """`DevicePlan` of a group's checked ``parts`` (on one accelerator) whose rows the host already knows
    to have the lengths ``restored`` (int64 ``[B]``, original order: the alignment witness's), computed on
    the host and uploaded in one buffer: then the device only moves data (three launches for the
    group's element indices), and compares the parts' offsets with ``expected`` once (the witness's
    flag). None where those lengths do not fill each micro-batch's values exactly (a misalignment the
    witness then finds on the device's own plan): planned from them, the move could index out of range.
    """
    if not restored.flags.writeable:  # a caller's read-only array: torch takes only writable memory
        restored = restored.copy()
    sizes = rows.rows
    lengths = restored if rows.perm is None else restored[rows.host()[0]]
    ends = host_offsets(lengths)  # each split row's end among all values
    firsts = host_offsets(sizes)  # each micro-batch's first row
    fills = ends[firsts[1:]] - ends[firsts[:-1]]
    if fills.tolist() != [p.values.shape[0] for p in parts]:
        return None
    micro_batch = np.repeat(np.arange(len(sizes), dtype=np.int64), np.asarray(sizes) + 1)
    rows_at = np.arange(lengths.shape[0] + len(sizes), dtype=np.int64) - micro_batch  # each offset's row
    expected = ends[rows_at] - ends[firsts[micro_batch]]
    offsets = host_offsets(restored)
    pieces = [offsets, expected]
    if rows.perm is not None:
        pieces += Runs.on_host(offsets[rows.host()[0]], ends[:-1], int(ends[-1]))
    buffer = upload(np.concatenate(pieces), parts[0].offsets.device)
    count = restored.shape[0]
    on_device = buffer[: count + 1]
    flat = buffer[count + 1 : 2 * count + 1 + len(sizes)]
    runs = None
    if rows.perm is not None:
        start = 2 * count + 1 + len(sizes)
        total = int(ends[-1])
        runs = Runs(buffer[start : start + count], buffer[start + count :], total)
    as_tensors = torch.from_numpy(lengths), torch.from_numpy(restored)
    return DevicePlan(*as_tensors, on_device, runs, flat)
