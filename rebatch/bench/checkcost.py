"""What the restore's alignment checks cost on the CPU, paired call by call in one run.

The alignment witness: verl's drop-in with ``data`` holding the batch's ``input_ids`` (the witness read and
checked) against the same call with the same ``data`` less its ``input_ids``. Exact provenance
(``--provenance``): that witnessed call with ``data`` recorded by a split (every output proven) against the
same call with ``data`` unrecorded. One worker (`rebatch.bench.versus`' ``pair``) alternates the two calls
``n`` times a round, each pair in a shuffled order, each call timed alone after the C heap's free pages are
returned, the calling thread on one core (the rounds take the cores in turn); the figures are the medians
of the pairs' ratios and differences, which a slower phase of a shared machine moves both calls of alike.
The same rounds time a null pair, the call without against itself: its figures are the band this
harness's noise moves in.

    python -m rebatch.bench.versus --witness [--provenance] [--rounds 31] [--out docs/provenance.json]
                                   [--docs docs/witness.md]

The JSON's table (`checks_markdown`) and run are a region of ``docs/witness.md``, filled by
`rebatch.figures`; what the figures mean is the page's prose.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from property_tests.markdown import table

from .tables import ms
from .workers import ROOT, Worker, describe

__all__ = [
    "TARGETS",
    "checks_cost",
    "checks_markdown",
    "paired",
    "targets",
    "witness_grid",
]

#: Each check's cost targets: case name -> (at most this many ms more, at most this ratio). Issue 38's
#: for the witness, issue 49's for exact provenance.
TARGETS: dict[str, dict[str, tuple[float | None, float | None]]] = {
    "witness": {
        "B=8 L=16 M=4 keys=1 float32 2-D": (0.02, None),
        "B=1024 L=512 M=16 keys=1 float32 2-D": (None, 1.05),
    },
    "provenance": {
        "B=8 L=16 M=4 keys=1 float32 2-D": (0.02, 1.03),
        "B=1024 L=512 M=16 keys=1 float32 2-D": (0.02, 1.03),
    },
}
#: Each round's pairs last about this long (at most `_MOST_PAIRS`).
_ROUND_S, _MOST_PAIRS = 0.04, 100


def witness_grid() -> list[Any]:
    """The cases of the checks' cost targets: the small call and B=1024 M=16, each with one key and with
    five, and B=1024 in 64 micro-batches."""
    from .cases import Case

    return [
        Case(8, 16, 4, 1, "float32", 2),
        Case(1024, 512, 16, 1, "float32", 2),
        Case(1024, 512, 16, 5, "float32", 2),
        Case(1024, 512, 64, 5, "float32", 2),
    ]


def paired(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """``(without, with)`` seconds of each pair as the figures: each call's median (``without``, ``with``,
    ms), the median of the pairs' ratios (``ratio``) and of their differences (``cost_ms``)."""
    return {
        "without": 1e3 * statistics.median(a for a, _ in pairs),
        "with": 1e3 * statistics.median(b for _, b in pairs),
        "ratio": statistics.median(b / a for a, b in pairs),
        "cost_ms": 1e3 * statistics.median(b - a for a, b in pairs),
        "pairs": len(pairs),
    }


def checks_cost(
    cases: list[Any], *, rounds: int = 31, log: Any = None, provenance: bool = False
) -> dict[str, Any]:
    """Each case's figures (`paired`) for the check (the witness, or with ``provenance`` exact provenance)
    and for the null pair, over ``rounds`` rounds of one worker."""
    from .contention import cores

    check = "provenance" if provenance else "witness"
    without, with_ = ("witnessed", "provenanced") if provenance else ("unwitnessed", "witnessed")
    worker = Worker(ROOT)
    rows, torch_version = [], None
    try:
        for i, case in enumerate(cases):
            reply = worker.ask(cmd="setup", case=list(case), witness=not provenance, provenance=provenance)
            torch_version = reply["torch"]
            if reply["digest"] != reply["witnessed_digest"]:
                raise AssertionError(f"{case.name}: the checked call's result differs from the plain call's")
            n = max(1, min(_MOST_PAIRS, int(_ROUND_S / max(reply["first"], 1e-6))))
            pinned = cores()
            runs: dict[str, list[tuple[float, float]]] = {"check": [], "null": []}
            for r in range(rounds):
                pin = {"core": pinned[r % len(pinned)]} if pinned else {}
                for name, fns in (("check", [without, with_]), ("null", [without, without])):
                    a, b = worker.ask(cmd="pair", fns=fns, n=n, seed=1000 * i + r, **pin)["times"]
                    runs[name] += zip(a, b, strict=True)
            row = {
                "case": case._asdict(),
                "name": case.name,
                "check": paired(runs["check"]),
                "null": paired(runs["null"]),
            }
            rows.append(row)
            if log is not None:
                print(f"{case.name}: {_line(row)}", file=log, flush=True)
    finally:
        worker.close()
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return {
        "check": check,
        "today": describe(),
        "torch": torch_version,
        "date": date,
        "rounds": rounds,
        "rows": rows,
    }


def _line(row: dict[str, Any]) -> str:
    c, z = row["check"], row["null"]
    return (
        f"without {ms(c['without'] / 1e3)} ms, with {ms(c['with'] / 1e3)} ms: {c['ratio']:.3f}x, "
        f"{c['cost_ms']:+.4f} ms paired (null pair {z['ratio']:.3f}x, {z['cost_ms']:+.4f} ms)"
    )


def targets(results: dict[str, Any]) -> dict[str, bool]:
    """Each target case's verdict: its paired cost within each of its bounds (`TARGETS`)."""
    bounds = TARGETS[results["check"]]
    return {
        r["name"]: all(
            bound is None or figure <= bound
            for figure, bound in zip(
                (r["check"]["cost_ms"], r["check"]["ratio"]), bounds[r["name"]], strict=True
            )
        )
        for r in results["rows"]
        if r["name"] in bounds
    }


def _target(bounds: tuple[float | None, float | None]) -> str:
    ms, ratio = bounds
    return " and ".join(
        [*([f"{ms} ms"] if ms is not None else []), *([f"{ratio - 1:.0%}"] if ratio is not None else [])]
    )


def checks_markdown(results: dict[str, Any]) -> list[str]:
    """The figures as a Markdown table, each target case's verdict in its last column."""
    verdicts = targets(results)
    bounds = TARGETS[results["check"]]
    rows = []
    for r in results["rows"]:
        c, z, name = r["check"], r["null"], r["name"]
        target = (
            f"within {_target(bounds[name])}: {'met' if verdicts[name] else 'NOT met'}"
            if name in verdicts
            else ""
        )
        rows.append(
            [
                name,
                ms(c["without"] / 1e3),
                ms(c["with"] / 1e3),
                f"{c['ratio']:.3f}x",
                f"{c['cost_ms']:+.4f}",
                f"{z['ratio']:.3f}x, {z['cost_ms']:+.4f} ms",
                target,
            ]
        )
    head = ["case", "without (ms)", "with (ms)", "with / without (paired)", "cost (ms, paired)", "null pair"]
    return table([*head, "target"], rows)
