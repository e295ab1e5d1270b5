"""What the testing kit (`property_tests`) and the command line (`rebatch`) use of ``torch_impl``
beyond the API a trainer calls: building blocks, comparisons, the checks alone, a split's record, the
dumps' format, and two scoped hooks into the pipeline (the kernel each key takes; the host seconds of
each phase); and the private torch parts the kit needs, from the one room that holds them
(`ref._torch_private`, each documented there). Not for trainers: a helper here may change with the
pipeline it observes. Importing it imports nothing more than ``torch_impl``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from ref._torch_private import (
    PICKLE_NAMES_TO_ALLOW,
    PICKLE_NAMES_TORCH_ADMITS,
    FakeTensor,
    FakeTensorMode,
    TorchDispatchMode,
    aten_ops,
    cached_seqlen_bounds,
    install_threaded_process_group,
    kineto_events,
    raw_lengths,
    raw_values,
    tree_leaves,
    tree_map,
    uninstall_threaded_process_group,
    unset_fake_temporarily,
)

from . import _kernels, _postprocess
from ._alignment import named_by, record
from ._compare import assert_same, bits, cached_sizes, first_difference, same_tensor
from ._jagged import njt, seqlens_of
from ._postprocess import check_batch_func
from .integrations._files import DUMP_FORMAT

__all__ = [
    "DUMP_FORMAT",
    "PHASES",
    "PICKLE_NAMES_TORCH_ADMITS",
    "PICKLE_NAMES_TO_ALLOW",
    "FakeTensor",
    "FakeTensorMode",
    "TorchDispatchMode",
    "aten_ops",
    "assert_same",
    "bits",
    "cached_seqlen_bounds",
    "cached_sizes",
    "check_batch_func",
    "first_difference",
    "install_threaded_process_group",
    "kernel_choices",
    "kineto_events",
    "named_by",
    "njt",
    "phase_seconds",
    "raw_lengths",
    "raw_values",
    "record",
    "same_tensor",
    "seqlens_of",
    "tree_leaves",
    "tree_map",
    "uninstall_threaded_process_group",
    "unset_fake_temporarily",
]

#: The phases of a call `phase_seconds` times: its checks (the witness's one read included), its plan,
#: its data moved, its results built.
PHASES = ("check", "plan", "move", "result")


@contextlib.contextmanager
def kernel_choices(observe: Callable[[Any, Any], Any]) -> Iterator[None]:
    """Within the block, ``observe(plan, kernel)`` runs for every key's kernel choice
    (`torch_impl._kernels.choose`) and its return value is the kernel taken (return ``kernel`` to keep
    the choice). Not thread-safe: the hook is the process's for the block."""
    chosen = _kernels.choose

    def hooked(plan: Any) -> Any:
        return observe(plan, chosen(plan))

    _kernels.choose = hooked
    try:
        yield
    finally:
        _kernels.choose = chosen


@contextlib.contextmanager
def phase_seconds() -> Iterator[dict[str, float]]:
    """Within the block, the host seconds the calls spend in each of `PHASES`, summed (filled in when the
    block ends): the plan (each key's `plan_key`), the move (each kernel's run) and the result (each
    result's nested tensor) timed around them, the check the rest of the calls' checks and plans. Not
    thread-safe: the hooks are the process's for the block."""
    spent = dict.fromkeys(("checked_plans", "plan", "move", "result"), 0.0)

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start

        return wrapper

    saved = (_postprocess._checked_plans, _postprocess.plan_key, _postprocess.move, _kernels.result_njt)
    _postprocess._checked_plans = timed("checked_plans", saved[0])
    _postprocess.plan_key = timed("plan", saved[1])
    _postprocess.move = timed("move", saved[2])
    _kernels.result_njt = timed("result", saved[3])
    phases: dict[str, float] = {}
    try:
        yield phases
    finally:
        _postprocess._checked_plans, _postprocess.plan_key, _postprocess.move, _kernels.result_njt = saved
        phases.update(
            check=spent["checked_plans"] - spent["plan"],
            plan=spent["plan"],
            move=spent["move"] - spent["result"],
            result=spent["result"],
        )
