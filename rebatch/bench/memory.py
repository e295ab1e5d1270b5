"""Peak extra memory of a call, two ways.

- `peak_tensor_bytes`: the most bytes of tensors allocated during the call and alive at once (its
  result included), from the allocator's own records: the profiler's memory events on the CPU, the
  caching allocator's peak on CUDA. Exact and independent of what the C heap does with freed memory.
- `peak_rss_bytes` (CPU, Linux): the process's resident-set high-water mark over the call minus its
  resident set before it, after handing the C heap's free pages back to the kernel. What the
  operating system sees; includes Python objects and allocator slack, so it reads a little higher.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

__all__ = ["peak_tensor_bytes", "peak_rss_bytes", "release_free_memory"]

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def peak_tensor_bytes(fn: Callable[[], Any], device: str = "cpu") -> int:
    """The peak of live tensor bytes allocated by the call (the allocations it frees again included)."""
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
    # imported here, not with the module: an older commit's worker (`rebatch.bench.versus`) imports this
    # module for `release_free_memory` beside that commit's torch_impl, which may not have it
    from torch_impl.testing import kineto_events

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    del result
    events = sorted(
        (e for e in kineto_events(prof) if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    live = peak = 0
    for e in events:  # allocations count positive, frees negative
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def _status_kib(field: str) -> int:
    match = re.search(rf"{field}:\s+(\d+) kB", _STATUS.read_text())
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return int(match.group(1))


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the kernel (glibc ``malloc_trim``), so memory the call
    allocates shows in the resident set instead of being served, unseen, from freed pages."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the reading may be lower than the truth
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_rss_bytes(fn: Callable[[], Any], device: str = "cpu") -> int | None:
    """Resident-set bytes the call needs at its peak beyond those before it (its result included).

    None where it cannot be measured (an accelerator, or no ``/proc``)."""
    if device != "cpu" or not _CLEAR.exists():
        return None
    gc.collect()
    release_free_memory()
    before = _status_kib("VmRSS")
    _CLEAR.write_text("5")  # reset the high-water mark to the current resident set
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    return (peak - before) * 1024
