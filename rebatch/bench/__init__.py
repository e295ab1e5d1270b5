"""rebatch's benchmarks: torch_impl against the per-row baseline, the copy limit and the JAX reference.

`BENCHMARKS` is the one table of them: ``rebatch bench NAME [ARGS...]`` runs ``rebatch.bench.MODULE``'s
``main([*args, *ARGS])`` (also ``python -m rebatch.bench.MODULE ARGS...``). This module imports nothing
else, so that the command's help lists them without importing torch."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["BENCHMARKS", "Benchmark"]


class Benchmark(NamedTuple):
    """A benchmark of ``rebatch bench``: its module's ``main(argv)`` runs it."""

    module: str  # rebatch.bench.<module>
    help: str  # one line for ``rebatch bench --help``
    args: tuple[str, ...] = ()  # given to ``main`` before the command line's own
    needs: tuple[str, ...] = ()  # the optional packages it imports (``rebatch[test]``)


#: Every benchmark by its name in ``rebatch bench NAME``.
BENCHMARKS: dict[str, Benchmark] = {
    "grid": Benchmark(
        "run",
        "the benchmark grid: JSON, a Markdown table and a plot (rebatch bench alone)",
        needs=("matplotlib",),
    ),
    "versus": Benchmark(
        "versus", "today's drop-in against an older commit or verl's own function, side by side"
    ),
    "checkcost": Benchmark(
        "versus",
        "what the alignment witness (--provenance: exact provenance) costs, paired",
        args=("--witness",),
    ),
    "crossover": Benchmark(
        "crossover", "each registered kernel forced, timed side by side (Settings' thresholds)"
    ),
    "cuda-check": Benchmark(
        "cuda_check", "the CUDA path: bit-exact, no synchronisation, bandwidth against a copy"
    ),
    "devicepath": Benchmark("devicepath", "the device path, today's code beside an older commit's"),
    "gpu-model": Benchmark("gpu_model", "rebatch beside each trainer's own function on a GPU, as a model"),
    "launches": Benchmark(
        "launches", "operations per call on the device path and the device time they model"
    ),
    "shadow": Benchmark("shadow", "what verl's shadow mode costs (needs verl)"),
    "split": Benchmark("split", "torch_impl.split against a per-partition index_select baseline"),
}
