"""`KeyPlan`: one checked key's plan, everything its kernel needs, computed once and before any data moves.

A call is check, plan, move (`torch_impl._postprocess`). A jagged key's plan: its row lengths (its
offsets checked by `check_offsets`, the spec's step 5), the same in original order (through the call's
one inverse), the result's offsets and value rows; NumPy on the CPU, torch operations elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ._devplan import plan_from_host, plan_on_device
from ._jagged import Runs, Seqlens, cached_seqlens, host_offsets, seqlens_of, zero_prefixed_cumsum
from ._parts import DensePart, Part, check_offsets, numpy_bridge
from ._rows import CallRows
from ._settings import get_settings
from ._tally import skipped

__all__ = ["KeyPlan", "plan_key"]


class KeyPlan(NamedTuple):
    """One key planned: ``parts`` (checked), ``rows`` (the call's), a jagged key's ``lengths`` ``[B]``,
    ``restored`` ``[B]`` (original order) and result ``offsets`` ``[B + 1]`` (int64, the parts' device;
    None for a dense key); ``total``: the result's leading size (value rows, or rows of a dense key);
    ``seqlens``: the result's cached sizes (`torch_impl._jagged.Seqlens`); ``arrays``: ``(lengths, restored,
    offsets)`` as the NumPy arrays they were computed in, where planned on the host (the host kernels and
    the witness read these, not a second view of the tensors); ``group``: a jagged key's offsets
    tensors (their ids, part by part): keys of one group share their plan, its result offsets and what
    the kernels derive from them (`CallRows.once`); ``runs``: where the group was planned on an
    accelerator with a permutation, its move's element runs (`torch_impl._devplan`); ``expected``: where it
    was planned from lengths the host knew (the alignment witness's), its parts' offsets as those give
    them, on their device, for the witness to compare with theirs."""

    key: Any
    parts: Sequence[Part]
    rows: CallRows
    lengths: torch.Tensor | None
    restored: torch.Tensor | None
    offsets: torch.Tensor | None
    total: int
    seqlens: Seqlens = None
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    group: tuple[int, ...] | None = None
    runs: Runs | None = None
    expected: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.parts[0].values.device


def plan_key(
    parts: Sequence[Part],
    key: Any,
    rows: CallRows,
    sources: Sequence[Any] = (),
    groups: dict[tuple[int, ...], KeyPlan] | None = None,
    known: Callable[[Any, int], np.ndarray | None] | None = None,
) -> KeyPlan:
    """The plan of one key's checked ``parts`` (at least one), its offsets checked here; off the CPU the
    result's cached sizes are those ``sources`` (the parts as given) all cache, if they do. ``groups``:
    the call's plans so far by their parts' offsets tensors: a jagged key on the same offsets tensors as
    an earlier key (verl's engines build every per-token key of a micro-batch on its ``input_ids``'
    offsets) takes that key's plan, already checked, with no operation. ``known(key, total)``: the
    restored lengths the host already knows for a jagged key of ``total`` values, or None (the
    alignment witness's, where it binds the key): off the CPU such a group is planned on the host."""
    if isinstance(parts[0], DensePart):
        return KeyPlan(key, parts, rows, None, None, None, sum(rows.rows))
    group = tuple([id(p.offsets) for p in parts])  # type: ignore[union-attr]  # jagged parts
    shared = groups.get(group) if groups is not None else None
    if shared is None:
        plan = _plan_jagged(parts, key, rows, sources, known)._replace(group=group)
        if groups is not None:
            groups[group] = plan
        return plan
    if not _fill_alike(parts, shared.parts):  # values that do not fill the offsets as the group's do
        return _plan_jagged(parts, key, rows, sources)  # (a defect, trusted off the CPU): planned alone
    if shared.arrays is not None:  # planned on the host: its sizes are the lengths'
        return shared._replace(key=key, parts=parts)
    if shared.device.type != "cpu" and shared.expected is None:  # (compared with the witness's: checked)
        skipped("skipped_device_offsets")  # this key's offsets trusted too, and counted (`check_offsets`)
    return shared._replace(key=key, parts=parts, seqlens=_own_seqlens(shared, sources))


def _fill_alike(parts: Sequence[Part], group: Sequence[Part]) -> bool:
    """Whether each micro-batch's values have as many rows as the group's first key's."""
    return all(p.values.shape[0] == q.values.shape[0] for p, q in zip(parts, group, strict=True))


def _own_seqlens(shared: KeyPlan, sources: Sequence[Any]) -> Seqlens:
    """A key's own cached sizes on its group's plan: where the group's lengths are on the CPU (read
    there), theirs; off it, the ones this key's parts as given cache (`cached_seqlens`), as planned alone."""
    if shared.lengths is not None and shared.lengths.is_cpu:
        return shared.seqlens
    return cached_seqlens(sources)


def _plan_jagged(
    parts: Sequence[Part],
    key: Any,
    rows: CallRows,
    sources: Sequence[Any],
    known: Callable[[Any, int], np.ndarray | None] | None = None,
) -> KeyPlan:
    """`plan_key` of a jagged key: its lengths (its offsets checked), restored lengths and result offsets,
    on the host with NumPy where its offsets are there; off the CPU from the lengths the host knows,
    where it knows them and they fill the values, else on the device from its offsets."""
    total = sum(p.values.shape[0] for p in parts)
    if parts[0].offsets.device.type != "cpu" or get_settings().plan_on_device:  # type: ignore[union-attr]
        # the tests' plan (`Settings.plan_on_device`) on the CPU: its offsets checked still
        if parts[0].offsets.device.type == "cpu":  # type: ignore[union-attr]
            check_offsets(parts, key)  # type: ignore[arg-type]  # jagged parts
        restored = known(key, total) if known is not None else None
        if restored is not None:
            from_host = plan_from_host(parts, rows, restored)  # type: ignore[arg-type]  # jagged parts
            if from_host is not None:
                sizes = seqlens_of(restored)
                runs, expected = from_host.runs, from_host.expected
                return KeyPlan(key, parts, rows, *from_host[:3], total, sizes, runs=runs, expected=expected)
        on_device = plan_on_device(parts, rows)  # type: ignore[arg-type]  # jagged parts
        lengths = on_device.lengths  # where it is on the CPU (the tests' plan), its sizes are read there
        sizes = seqlens_of(lengths) if lengths.is_cpu else cached_seqlens(sources)
        return KeyPlan(key, parts, rows, *on_device[:3], total, sizes, runs=on_device.runs)
    lengths = check_offsets(parts, key)  # type: ignore[arg-type]  # jagged parts
    if lengths.is_cpu and numpy_bridge():
        host = lengths.numpy()
        restored = host if rows.perm is None else host[rows.host()[1]]
        offsets = host_offsets(restored)
        tensors = torch.from_numpy(restored), torch.from_numpy(offsets)
        return KeyPlan(
            key, parts, rows, lengths, *tensors, total, seqlens_of(host), (host, restored, offsets)
        )
    restored_t = lengths if rows.perm is None else lengths.index_select(0, rows.inverse())
    return KeyPlan(
        key, parts, rows, lengths, restored_t, zero_prefixed_cumsum(restored_t), total, seqlens_of(lengths)
    )
