"""Peak extra memory of a call: the process's resident-set high-water mark over the call, minus its
resident set before it (Linux ``/proc``; on CUDA, the allocator's peak)."""

from __future__ import annotations

import gc
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["peak_extra_bytes"]

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int:
    match = re.search(rf"{field}:\s+(\d+) kB", _STATUS.read_text())
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return int(match.group(1))


def peak_extra_bytes(fn: Callable[[], Any], device: str = "cpu") -> int | None:
    """Bytes the call needs at its peak beyond what was resident before it (its result included).

    None where it cannot be measured (no ``/proc``)."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        result = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        del result
        return peak - before
    if not _CLEAR.exists():
        return None
    before = _status_kib("VmRSS")
    _CLEAR.write_text("5")  # reset the high-water mark to the current resident set
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    return (peak - before) * 1024
