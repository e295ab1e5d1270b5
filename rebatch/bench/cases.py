"""The benchmark grid and its inputs: long-tailed row lengths like RL rollouts, with a fixed seed."""

from __future__ import annotations

import itertools
import re
from typing import Any, NamedTuple

import numpy as np
import torch

import torch_impl

__all__ = ["Case", "Inputs", "grid", "make_inputs", "micro_batch_indices", "verl_target_lines", "GRIDS"]


class Case(NamedTuple):
    rows: int  # B
    mean_length: int
    micro_batches: int  # M
    keys: int
    dtype: str
    ndim: int  # 2: [B, (j)]; 3: [B, (j), 5]

    @property
    def name(self) -> str:
        return (
            f"B={self.rows} L={self.mean_length} M={self.micro_batches} keys={self.keys} "
            f"{self.dtype} {self.ndim}-D"
        )

    @property
    def elements(self) -> int:
        """Output elements, all keys (expected value)."""
        return self.rows * self.mean_length * self.keys * (5 if self.ndim == 3 else 1)

    def bytes(self) -> int:
        return self.elements * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


class Inputs(NamedTuple):
    output_lst: list[dict[str, Any]]
    indices: list[list[int]]
    output_bytes: int
    output_elements: int


def lengths_for(case: Case, seed: int = 0) -> np.ndarray:
    """Log-normal lengths (sigma 1: a long tail of a few very long rows), scaled to the mean, >= 1."""
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(0.0, 1.0, size=case.rows)
    return np.maximum(1, np.round(raw / raw.mean() * case.mean_length)).astype(np.int64)


def micro_batch_indices(case: Case, seed: int = 0) -> list[list[int]]:
    """The case's rows, a random permutation cut into M micro-batches of about equal row counts (each
    micro-batch's rows in ascending order)."""
    rng = np.random.default_rng(seed + 1)
    perm = rng.permutation(case.rows)
    bounds = np.linspace(0, case.rows, case.micro_batches + 1).astype(int)
    return [sorted(perm[bounds[m] : bounds[m + 1]].tolist()) for m in range(case.micro_batches)]


def make_inputs(case: Case, device: str = "cpu", seed: int = 0) -> Inputs:
    """``output_lst``/``indices`` for the case: a random permutation cut into M micro-batches of about
    equal row counts, each key's rows split with ``torch_impl.split``."""
    lengths = lengths_for(case, seed)
    indices = micro_batch_indices(case, seed)
    offsets = torch.zeros(case.rows + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.from_numpy(lengths), 0)
    total = int(offsets[-1])
    feature = (5,) if case.ndim == 3 else ()
    outs: list[dict[str, Any]] = [{"model_output": {}, "loss": torch.tensor(0.0)} for _ in indices]
    for k in range(case.keys):
        values = torch.randn((total, *feature), generator=torch.Generator().manual_seed(seed + k)).to(
            getattr(torch, case.dtype)
        )
        whole = torch.nested.nested_tensor_from_jagged(values.to(device), offsets.to(device))
        for o, piece in zip(outs, torch_impl.split(whole, indices), strict=True):
            o["model_output"][f"key{k}"] = piece
        del whole, values
    elements = total * case.keys * (5 if case.ndim == 3 else 1)
    return Inputs(
        outs, indices, elements * torch.empty((), dtype=getattr(torch, case.dtype)).element_size(), elements
    )


def _product(rows, lengths, mbs, keys=(1,), dtypes=("float32",), ndims=(2,)) -> list[Case]:
    return [Case(*c) for c in itertools.product(rows, lengths, mbs, keys, dtypes, ndims)]


LARGE_ELEMENTS = 64_000_000  # the copy-limit target's size: "at least 64M output elements"
#: The JAX reference is timed up to this many output elements (its gather is slow on 2 cores).
JAX_MAX_ELEMENTS = 16 * 2**20
MAX_BYTES = (
    3 * 2**30
)  # output bytes per case on a 24 GiB machine: inputs, output and the baseline's copies fit


def grid(name: str) -> list[Case]:
    """``quick``: a minute; ``standard``: B x L x M for one float32 2-D key, plus the key/dtype/ndim
    variations at every B for L=512, M=16, plus the target cases; ``large``: the full grid's cases of
    at least 64M output elements at M=16; ``full``: the whole factorial grid.
    Cases whose output would exceed ``MAX_BYTES`` are left out."""
    if name == "smoke":  # for the test suite: the harness end to end in seconds
        cases = [Case(8, 16, 2, 1, "float32", 2), Case(64, 16, 4, 2, "bfloat16", 3)]
    elif name == "targets":  # the speed targets against verl's own function (docs/benchmarks.md)
        cases = list(TARGET_CASES)
    elif name == "small":  # the small call alone (its 0.2 ms target on either torch)
        cases = [Case(8, 16, 4, 1, "float32", 2)]
    elif name == "copy":  # the copy limit (time / clone at 16M, 64M and 256M elements) and the small call
        cases = [
            Case(8, 16, 4, 1, "float32", 2),
            *(Case(r, 16384, 16, 1, "float32", 2) for r in (1024, 4096, 16384)),
        ]
    elif name == "quick":
        cases = [*_product((8, 512), (16, 512), (1, 4)), Case(1024, 512, 16, 1, "float32", 2)]
    elif name == "standard":
        cases = _product((8, 64, 512, 4096, 16384), (16, 512, 4096), (1, 4, 16, 64))
        cases += _product((8, 64, 512, 4096, 16384), (512,), (16,), (3,), ("float32", "bfloat16"), (2, 3))
        cases += [Case(1024, 512, 16, 1, "float32", 2), Case(16384, 16, 16, 1, "float32", 2), *TARGET_CASES]
    elif name == "large":  # every case of the full grid with at least 64M output elements, at M=16
        cases = [c for c in grid("full") if c.elements >= LARGE_ELEMENTS and c.micro_batches == 16]
    elif name == "full":
        cases = _product(
            (8, 64, 512, 4096, 16384),
            (16, 512, 4096),
            (1, 4, 16, 64),
            (1, 3),
            ("float32", "bfloat16"),
            (2, 3),
        )
        cases += [Case(1024, 512, 16, 1, "float32", 2)]
    else:
        raise ValueError(f"unknown grid {name!r}: one of {', '.join(GRIDS)}")
    seen: set[Case] = set()
    out = []
    for c in cases:
        if c not in seen and c.micro_batches <= c.rows and c.bytes() <= MAX_BYTES:
            seen.add(c)
            out.append(c)
    return out


GRIDS = ("smoke", "targets", "small", "copy", "quick", "standard", "large", "full")

#: The cases of the speed targets against verl 0.9.1's own function: (case, the least speed-up).
TARGETS_VS_VERL: dict[Case, float] = {
    Case(8, 16, 4, 1, "float32", 2): 3.0,  # a call of 8 rows
    Case(1024, 512, 16, 1, "float32", 2): 5.0,
    Case(1024, 512, 16, 5, "float32", 2): 5.0,
    Case(16384, 16, 16, 1, "float32", 2): 50.0,
}
TARGET_CASES = tuple(TARGETS_VS_VERL)
#: The small call's (B=8) time target on the CPU.
SMALL_CALL_SECONDS = 0.2e-3


def verl_target_lines(against: str, speedups: dict[Case, str], small: float | None) -> list[str]:
    """The lines of the targets against verl's own function (`TARGETS_VS_VERL`): ``speedups[case]``, the
    figure measured there (``"6.3x"``, or several: the least decides), and ``small``, the small call's
    seconds (None: not measured); ``against``: who the baseline is."""
    out = []
    for case, least in TARGETS_VS_VERL.items():
        if case in speedups:
            x = min(float(v) for v in re.findall(r"([0-9.]+)x", speedups[case]))
            out.append(
                f"- At least {least:g}x faster than {against} at B={case.rows}, L={case.mean_length}, "
                f"M={case.micro_batches}, {case.keys} key{'s' if case.keys > 1 else ''}: {speedups[case]}, "
                f"{'**met**' if x >= least else '**missed**'}."
            )
    if small is not None:
        verdict = "**met**" if small < SMALL_CALL_SECONDS else "**missed**"
        out.append(
            f"- The small call under {SMALL_CALL_SECONDS * 1e3:g} ms: {small * 1e3:.3f} ms, {verdict}."
        )
    return out
