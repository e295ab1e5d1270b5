"""The kernel registry: every way ``torch_impl`` moves a planned key's data, and the choice between them.

A `Kernel` takes a `KeyPlan` (it validates nothing) and returns the result's fresh values: ``[N, *F]``
for a jagged key, ``[B, *F]`` for a dense one. `choose` takes the one `Settings.kernel` names where it
serves the key (raising where it does not apply), else the first of the registry that serves it, applies
and is preferred.
The tests iterate `KERNELS`: a kernel is tested by being registered (``docs/kernels.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from ref.errors import UnsupportedSettingError, where

from ._hostcopy import copy_rows, host_movable, scatter_rows, scatter_values
from ._indexcopy import permute_by_indices, permute_rows
from ._jagged import result_njt, size_cache
from ._parts import Part
from ._plan import KeyPlan, plan_key
from ._rows import CallRows
from ._settings import get_settings

__all__ = ["KERNELS", "Kernel", "assemble", "choose", "move"]


class Kernel(NamedTuple):
    """One way to move a key: ``layouts`` (``"jagged"``, ``"dense"``), ``permutes`` (True: rows put in
    original order; False: parts laid end to end, for keys already in order), ``applies`` (where it
    can run), ``preferred`` (where the registry picks it), ``run`` (the move itself), ``chunked``
    (its work split by the `Settings` chunk sizes, which the tests force small)."""

    name: str
    layouts: frozenset[str]
    permutes: bool
    applies: Callable[[KeyPlan], bool]
    preferred: Callable[[KeyPlan], bool]
    run: Callable[[KeyPlan], torch.Tensor]
    chunked: bool = False


_always: Callable[[KeyPlan], bool] = lambda plan: True  # noqa: E731


def _concat(plan: KeyPlan) -> torch.Tensor:
    """``torch.cat`` of the parts' values: one operation, any device, differentiable."""
    return torch.cat([p.values for p in plan.parts])


def _on_host(plan: KeyPlan) -> bool:
    return (
        plan.device.type == "cpu"
        and host_movable(plan.parts)
        and (plan.lengths is None or plan.arrays is not None)
    )


def _elements(plan: KeyPlan) -> int:
    return sum(p.values.numel() for p in plan.parts)


def _many_elements(plan: KeyPlan) -> bool:
    return _elements(plan) >= get_settings().cpu_dense_host_min_elements


def _long_rows(plan: KeyPlan) -> bool:  # at least ``Settings.cpu_row_copy_min_elements`` elements a row
    return _elements(plan) >= get_settings().cpu_row_copy_min_elements * max(1, sum(plan.rows.rows))


_JAGGED, _DENSE, _BOTH = frozenset({"jagged"}), frozenset({"dense"}), frozenset({"jagged", "dense"})

#: Every kernel, in the order `choose` prefers them (the last of each kind applies everywhere).
KERNELS: dict[str, Kernel] = {
    k.name: k
    for k in (
        Kernel("concat", _BOTH, False, _always, _always, _concat),
        Kernel("host_rows_copy", _JAGGED, True, _on_host, _long_rows, copy_rows),
        Kernel("host_scatter", _JAGGED, True, _on_host, _always, scatter_values, chunked=True),
        Kernel("element_indices", _JAGGED, True, _always, _always, permute_by_indices, chunked=True),
        Kernel("host_rows", _DENSE, True, _on_host, _many_elements, scatter_rows),
        Kernel("index_rows", _DENSE, True, _always, _always, permute_rows),
    )
}


def _serves(kernel: Kernel, plan: KeyPlan) -> bool:
    return ("dense" if plan.lengths is None else "jagged") in kernel.layouts and kernel.permutes == (
        plan.rows.perm is not None
    )


def choose(plan: KeyPlan) -> Kernel:
    """The kernel that moves ``plan``'s key: the one ``Settings.kernel`` names where it serves the key
    (`UnsupportedSettingError` where it does not apply), otherwise the first of the registry that serves
    it, applies and is preferred."""
    forced = get_settings().kernel
    if forced is not None:
        kernel = KERNELS.get(forced)
        if kernel is None:
            raise UnsupportedSettingError(
                f"Settings.kernel: no kernel named {forced!r} (known: {sorted(KERNELS)})"
            )
        if _serves(kernel, plan):
            if not kernel.applies(plan):
                why = f"{where(plan.key)}Settings.kernel {forced!r} cannot move this key on {plan.device}"
                raise UnsupportedSettingError(f"{why} (no other kernel runs in its place)")
            return kernel
    return next(k for k in KERNELS.values() if _serves(k, plan) and k.preferred(plan) and k.applies(plan))


def move(plan: KeyPlan) -> torch.Tensor:
    """``plan``'s key put together: ``[B, (j), *F]`` (a nested tensor over the kernel's fresh values and
    the plan's offsets) or ``[B, *F]``."""
    values = choose(plan).run(plan)
    if plan.offsets is None:
        return values
    made = ("sizes", plan.group, plan.seqlens)  # once a group (and sizes): its keys' results share them
    sizes = plan.rows.once(made, _HOST, lambda: size_cache(plan.seqlens))
    return result_njt(values, plan.offsets, plan.seqlens, sizes)


_HOST = torch.device("cpu")  # where a result's cached sizes live


def assemble(
    parts: Sequence[Part], perm: torch.Tensor | None, key: Any = None, sources: Sequence[Any] = ()
) -> torch.Tensor:
    """One key's checked ``parts`` planned and moved (no witness): the concatenation, with row ``k`` put
    at row ``perm[k]`` where ``perm`` (a checked permutation of ``range(B)``, CPU) is given; ``sources``:
    the parts as given (`plan_key`)."""
    return move(plan_key(parts, key, CallRows([p.rows for p in parts], perm), sources))
