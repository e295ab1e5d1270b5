"""The benchmarks' two timers of a call, each written once.

- `median_seconds`: one function alone, by ``torch.utils.benchmark`` (its ``blocked_autorange``, which
  synchronises CUDA): the benchmarks' single-function timings (`rebatch.bench.run`'s JAX reference,
  `rebatch.bench.split`, `rebatch.bench.shadow`, `rebatch.bench.cuda_check`, ``rebatch check``).
- `timed_alone`: one call, after the C heap's free pages go back to the kernel (imports no torch on the
  CPU): the calls that functions or workers alternate call by call or turn by turn
  (`rebatch.bench.run.median_times`, `rebatch.bench.versus`' and `rebatch.bench.checkcost`'s workers),
  where each call's own time is the figure and a library's blocks of calls would hide the alternation.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

__all__ = ["MIN_RUN_TIME", "SLOW_CALL_SECONDS", "median_seconds", "timed_alone"]

#: ``median_seconds``' default: measure for at least this many seconds (torch.utils.benchmark's own).
MIN_RUN_TIME = 0.2
#: A call this slow (seconds) is timed once (``median_seconds(once_over=SLOW_CALL_SECONDS)``).
SLOW_CALL_SECONDS = 1.0


#: The logger torch.utils.benchmark's import warns on where torch was built for CUDA and none is here
#: ("No CUDA runtime is found"): a line on stderr that is not ours to print.
_QUIET_AT_IMPORT = "torch.utils.cpp_extension"


def _benchmark() -> Any:
    """``torch.utils.benchmark``, imported with its import-time CUDA-runtime warning held back (the
    logger's level restored after: nothing else in the process changes)."""
    logger = logging.getLogger(_QUIET_AT_IMPORT)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils import benchmark
    finally:
        logger.setLevel(level)
    return benchmark


def median_seconds(
    fn: Callable[[], Any],
    *,
    min_run_time: float = MIN_RUN_TIME,
    once_over: float = math.inf,
    threads: int | None = None,
) -> float:
    """Median seconds per call of ``fn()``: one call timed first (after the library's two warm-up calls), then
    ``torch.utils.benchmark.Timer.blocked_autorange(min_run_time)``. That first call is the figure where
    ``min_run_time`` is 0 or it took longer than ``once_over`` seconds (a slow call, once is enough).
    ``threads``: torch's threads meanwhile (default: as many as now; the library's own default is 1)."""
    import torch

    benchmark = _benchmark()
    timer = benchmark.Timer(
        stmt="fn()",
        globals={"fn": fn},
        num_threads=torch.get_num_threads() if threads is None else threads,
    )
    once = float(timer.timeit(1).median)
    if min_run_time == 0 or once > once_over:
        return once
    return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def timed_alone(fn: Callable[[], Any], device: str = "cpu") -> float:
    """Seconds of one call of ``fn`` (synchronised on a CUDA ``device``). Before it (untimed), on the CPU,
    the C heap's free pages go back to the kernel, so every call's fresh buffers are mapped afresh, as a
    training step's are, instead of landing by chance on pages that the previous call freed."""
    from .memory import release_free_memory

    if device == "cpu":
        release_free_memory()
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
    return time.perf_counter() - start
