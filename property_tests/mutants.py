"""Proof the property suite can fail: seeded defects of torch_impl, each of which must be caught.

``python -m property_tests.mutants`` patches torch_impl with one defect at a time, runs the
differential properties (torch_impl against the original rows, ref and the verl baseline) and reports
each defect as caught or survived; it exits non-zero if any survives.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

import ref.metrics as metrics_mod
import torch_impl
import torch_impl._kernels as kernels_mod
import torch_impl._ops as ops_mod
import torch_impl._postprocess as post_mod
from torch_impl._jagged import njt

from .data import offsets_of
from .properties import DIFFERENTIAL, PROPERTIES, pass_or_fail

__all__ = ["MUTANTS", "run_mutant", "main"]


def _patch_assemble(wrap: Callable[[torch.Tensor], torch.Tensor]) -> contextlib.AbstractContextManager[Any]:
    """Every key's result, of every call and operation, passed through ``wrap``."""
    real = kernels_mod.move

    def mutated(*args: Any, **kwargs: Any) -> torch.Tensor:
        return wrap(real(*args, **kwargs))

    stack = contextlib.ExitStack()
    for module in (post_mod, kernels_mod):
        stack.enter_context(mock.patch.object(module, "move", mutated))
    return stack


def _rows_swapped(out: torch.Tensor) -> torch.Tensor:
    """Rows 0 and 1 of the result exchanged."""
    if out.size(0) < 2:
        return out
    order = torch.arange(out.size(0))
    order[[0, 1]] = order[[1, 0]]
    if out.is_nested:
        return torch_impl_take(out, order)
    return out[order]


def torch_impl_take(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    return torch_impl.take(x, order)


def _row_dropped(out: torch.Tensor) -> torch.Tensor:
    """The last row of the result left out."""
    if out.size(0) < 1:
        return out
    return torch_impl_take(out, torch.arange(out.size(0) - 1)) if out.is_nested else out[:-1]


def _dtype_cast(out: torch.Tensor) -> torch.Tensor:
    """Floating results silently promoted to float64 (as a careless ``torch.cat`` of mixed parts would)."""
    if not out.dtype.is_floating_point or out.dtype == torch.float64:
        return out
    if out.is_nested:
        return njt(out.values().to(torch.float64), offsets_of(out))
    return out.to(torch.float64)


@contextlib.contextmanager
def _offsets_off_by_one() -> Iterator[None]:
    """The first row boundary of every jagged result moved one value to the right."""
    real = kernels_mod.result_njt

    def mutated(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        if offsets.numel() >= 3 and int(offsets[1]) < int(offsets[-1]):
            offsets = offsets.clone()
            offsets[1] += 1
            offsets[1:] = torch.cummax(offsets[1:], 0).values
        return real(values, offsets)

    with mock.patch.object(kernels_mod, "result_njt", mutated):
        yield


@contextlib.contextmanager
def _inverse_not_inverted() -> Iterator[None]:
    """The permutation used where its inverse is needed (rows placed by ``inv`` instead of ``perm``)."""
    real = post_mod.check_permutation

    def mutated(partitions: Any, num_rows: int) -> torch.Tensor:
        perm = real(partitions, num_rows)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        return inv

    with (
        mock.patch.object(post_mod, "check_permutation", mutated),
        mock.patch.object(ops_mod, "check_permutation", mutated),
    ):
        yield


@contextlib.contextmanager
def _metrics_appended() -> Iterator[None]:
    """A list of metric values appended as one item instead of extending the key's list."""

    def mutated(acc: dict[str, Any], new: Any, prefix: str = "") -> None:
        for key, value in new.items():
            if key not in acc:
                acc[key] = value.init_list() if hasattr(value, "init_list") else []
            acc[key].append(value)

    with mock.patch.object(metrics_mod, "append_to_dict", mutated):
        yield


@contextlib.contextmanager
def _in_concatenation_order(name: str) -> Iterator[None]:
    """Kernel ``name`` moves the rows in micro-batch order (the permutation ignored), and is forced on
    every key it serves (so every property exercises it; as ``concat``, it runs wherever it serves);
    the offsets are still right, so only the values are misplaced."""
    kernel = torch_impl.KERNELS[name]
    concat = torch_impl.KERNELS["concat"]
    with (
        mock.patch.dict(kernels_mod.KERNELS, {name: kernel._replace(run=concat.run, applies=concat.applies)}),
        torch_impl.use_settings(kernel=name),
    ):
        yield


MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
    "two_rows_swapped": lambda: _patch_assemble(_rows_swapped),
    "offsets_off_by_one": _offsets_off_by_one,
    "dropped_row": lambda: _patch_assemble(_row_dropped),
    "dtype_cast": lambda: _patch_assemble(_dtype_cast),
    "inverse_not_inverted": _inverse_not_inverted,
    "metrics_appended_not_extended": _metrics_appended,
    # every permuting kernel of the registry, ignoring the permutation
    **{
        f"{name}_in_concatenation_order": functools.partial(_in_concatenation_order, name)
        for name, kernel in torch_impl.KERNELS.items()
        if kernel.permutes
    },
}


def run_mutant(name: str, *, max_examples: int = 200) -> tuple[bool, str]:
    """Run the differential properties under mutant ``name``; (caught, by which property / why not)."""
    for prop_name in DIFFERENTIAL:
        prop = PROPERTIES[prop_name]
        test = pass_or_fail(prop, max_examples=max_examples)
        with MUTANTS[name]():
            try:
                test()
            except AssertionError as err:
                return True, f"{prop_name}: {str(err).splitlines()[0][:120]}"
            except Exception as err:
                return (
                    True,
                    f"{prop_name}: {type(err).__name__}: "
                    f"{str(err).splitlines()[0][:120] if str(err) else ''}",
                )
    return False, f"survived {len(DIFFERENTIAL)} properties x {max_examples} examples"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m property_tests.mutants", description=__doc__)
    parser.add_argument("--max-examples", type=int, default=200)
    args = parser.parse_args(argv)
    survived = []
    for name in MUTANTS:
        start = time.perf_counter()
        caught, how = run_mutant(name, max_examples=args.max_examples)
        print(
            f"{'caught  ' if caught else 'SURVIVED'} {name:<32} {time.perf_counter() - start:5.1f}s  {how}",
            flush=True,
        )
        if not caught:
            survived.append(name)
    print(f"{len(MUTANTS) - len(survived)} of {len(MUTANTS)} mutants caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
