"""The packed and padded layouts (``ref``'s `from_packed`, `to_packed`, `to_padded`, `from_padded`).

Each conversion is checked first (the lengths by `ref.structure.check_lengths`, shared with ``ref``;
jagged inputs by `check_parts` and `check_offsets`), then moves the data with a constant number of torch
operations whatever the number of rows: one ``index_copy_`` (into a pad-filled output) or one
``index_select`` with element indices built from host-known sizes (`Runs`). Results are
fresh storage and differentiable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ref.errors import InvalidJaggedError, ShapeMismatchError, UnsupportedSettingError
from ref.structure import check_lengths, check_max_len, check_pad_value

from ._bits import as_bits, from_bits
from ._devplan import upload
from ._entry import entry
from ._jagged import Runs, host_offsets, njt, seqlens_of, zero_prefixed_cumsum
from ._parts import DensePart, JaggedPart, check_offsets, check_parts

__all__ = ["from_packed", "from_padded", "host_lengths", "scatter_padded", "to_packed", "to_padded"]


def host_lengths(lengths: Any, name: str, **rule: Any) -> list[int]:
    """``lengths`` (a sequence, or a tensor: read once on the host, a synchronisation on an accelerator)
    checked by `check_lengths` with ``rule``; `UnsupportedSettingError` on ``meta``, which holds no values."""
    if isinstance(lengths, torch.Tensor):
        if lengths.device.type == "meta":
            raise UnsupportedSettingError(
                f"{name} needs lengths the host can read, got lengths on the meta device"
            )
        lengths = lengths.detach().cpu()
    return check_lengths(lengths, **rule)


def scatter_padded(
    values: torch.Tensor,
    lengths: torch.Tensor | np.ndarray,
    rows: torch.Tensor | np.ndarray,
    b: int,
    max_len: int,
    pad_value: Any,
) -> torch.Tensor:
    """``[b, max_len, *F]`` filled with ``pad_value``, where source row ``k`` (``lengths[k]`` values of
    ``values`` ``[N, *F]``, laid end to end) is written at the start of output row ``rows[k]``. Checked by
    the caller: ``rows`` distinct in ``range(b)``, every length at most ``max_len``. ``lengths`` and
    ``rows`` as int64 NumPy arrays (known on the host): the element indices planned there and uploaded
    once; as tensors: planned on ``values``' device."""
    trailing = tuple(values.shape[1:])
    out = values.new_full((b * max_len, *trailing), pad_value)
    n = int(values.shape[0])
    if n:
        if isinstance(lengths, np.ndarray) and isinstance(rows, np.ndarray):
            indices = _host_runs(rows * max_len, lengths, n, values.device)[1]
        else:
            assert isinstance(lengths, torch.Tensor)
            assert isinstance(rows, torch.Tensor)
            indices = Runs.of(rows * max_len, zero_prefixed_cumsum(lengths)[:-1], n).indices()
        as_bits(out).index_copy_(0, indices, as_bits(values))  # a view: writes `out`
    return out.view(b, max_len, *trailing)


def _host_runs(
    starts: np.ndarray, lengths: np.ndarray, total: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[s + j for s, n in zip(starts, lengths) for j in range(n)]``, int64 ``[total]`` on ``device``,
    from host arrays: their runs computed on the host and uploaded once, with the rows' offsets ``[B + 1]``
    (returned first: the first ``B + 1`` of the one buffer uploaded); three launches more."""
    offsets = host_offsets(lengths)
    host = np.concatenate([offsets, *Runs.on_host(starts, offsets[:-1], total)])
    both = upload(host, device)
    count = lengths.shape[0]
    runs = Runs(both[count + 1 : 2 * count + 1], both[2 * count + 1 :], total)
    return both[: count + 1], runs.indices()


def _jagged_part(x: Any, name: str) -> JaggedPart:
    (part,) = check_parts([x])
    if not isinstance(part, JaggedPart):
        raise ShapeMismatchError(
            f"{name} needs jagged data [B, (j), *F], got a dense tensor of shape {tuple(part.values.shape)}"
        )
    return part


def _offsets_tensor(cu_seqlens: Any, device: torch.device) -> torch.Tensor:
    offsets = (
        cu_seqlens if isinstance(cu_seqlens, torch.Tensor) else torch.as_tensor(cu_seqlens, device="cpu")
    )
    if (
        offsets.dim() != 1
        or offsets.shape[0] < 1
        or offsets.dtype.is_floating_point
        or offsets.dtype.is_complex
        or offsets.dtype == torch.bool
    ):
        raise InvalidJaggedError(f"cu_seqlens must be 1-D integers, got {offsets.dtype}{list(offsets.shape)}")
    return offsets.to(device, torch.int64, non_blocking=offsets.is_cpu)  # an upload waits for nothing


@entry
def from_packed(values: torch.Tensor, lengths: Any = None, *, cu_seqlens: Any = None) -> torch.Tensor:
    """Packed rows as a jagged nested tensor ``[B, (j), *F]``: ``values`` ``[N, *F]`` cut by ``lengths``
    ``[B]`` (a sequence or a tensor) or by ``cu_seqlens`` ``[B + 1]`` (checked as offsets).
    ``ref.from_packed``'s
    meaning; the values are copied."""
    if (lengths is None) == (cu_seqlens is None):
        raise UnsupportedSettingError("from_packed needs exactly one of lengths and cu_seqlens")
    if not isinstance(values, torch.Tensor) or values.is_nested or values.dim() < 1:
        shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise ShapeMismatchError(f"packed values need a leading dimension, got shape {shape}")
    (part,) = check_parts([values])
    device = part.values.device
    if cu_seqlens is not None:
        where = cu_seqlens.device if isinstance(cu_seqlens, torch.Tensor) else torch.device("cpu")
        given = _offsets_tensor(cu_seqlens, where)  # checked (and its sizes read) where it is given
        offsets = given.to(device, non_blocking=given.is_cpu)  # a download blocks: its values are read
        checked = check_offsets([JaggedPart(part.values, given, int(given.shape[0]) - 1)])
        seqlens = seqlens_of(checked)  # None where the offsets were given on a device (unread)
    else:
        host = host_lengths(lengths, "from_packed", total=int(part.values.shape[0]))
        offsets = zero_prefixed_cumsum(
            torch.tensor(host, dtype=torch.int64, device="cpu").to(device, non_blocking=True)
        )
        seqlens = seqlens_of(host)
    return njt(part.values.clone(), offsets, None, seqlens)


@entry
def to_packed(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A jagged nested tensor ``[B, (j), *F]`` as packed ``(values [N, *F], lengths [B] int64)`` (the values
    copied). ``ref.to_packed``'s meaning."""
    part = _jagged_part(x, "to_packed")
    lengths = check_offsets([part])
    return part.values.clone(), lengths


@entry
def to_padded(
    x: torch.Tensor, *, pad_value: bool | int | float = 0, max_len: int | None = None
) -> torch.Tensor:
    """A jagged nested tensor ``[B, (j), *F]`` right-padded to ``[B, max_len, *F]`` with ``pad_value``
    (``max_len``: the longest row by default). ``ref.to_padded``'s meaning.

    The longest row is read on the host (a synchronisation on an accelerator) to size the result or to
    check ``max_len``; on ``meta`` ``max_len`` is required and trusted."""
    part = _jagged_part(x, "to_padded")
    check_pad_value(pad_value, part.values.dtype)
    lengths = check_offsets([part])
    b = part.rows
    longest: int | None = None
    if part.values.device.type != "meta":
        longest = int(lengths.max()) if b else 0
    if max_len is None:
        if longest is None:
            raise UnsupportedSettingError(
                "to_padded on the meta device needs max_len (the rows cannot be read)"
            )
        max_len = longest
    max_len = check_max_len(max_len, longest)
    rows = torch.arange(b, dtype=torch.int64, device=part.values.device)
    return scatter_padded(part.values, lengths, rows, b, max_len, pad_value)


@entry
def from_padded(x: torch.Tensor, lengths: Any) -> torch.Tensor:
    """Dense ``[B, S, *F]`` rows cut to ``lengths`` ``[B]`` (each at most ``S``) as a jagged nested tensor
    ``[B, (j), *F]``. ``ref.from_padded``'s meaning."""
    (part,) = check_parts([x])
    if not isinstance(part, DensePart) or part.values.dim() < 2:
        got = "jagged data" if isinstance(part, JaggedPart) else f"shape {tuple(part.values.shape)}"
        raise ShapeMismatchError(f"from_padded needs dense data [B, S, *F], got {got}")
    dense = part.values
    b, s = int(dense.shape[0]), int(dense.shape[1])
    host = host_lengths(lengths, "from_padded", rows=b, limit=s)
    total = sum(host)
    starts = np.arange(b, dtype=np.int64) * s
    offsets, indices = _host_runs(starts, np.asarray(host, dtype=np.int64), total, dense.device)
    flat = dense.reshape(b * s, *dense.shape[2:])
    values = from_bits(as_bits(flat).index_select(0, indices), dense.dtype)
    return njt(values, offsets, None, seqlens_of(host))
