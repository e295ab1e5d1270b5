"""The side-by-side harness's tables (`rebatch.bench.versus`): a run's rows as Markdown, and the issue's
targets each met or missed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from property_tests.markdown import table

__all__ = ["markdown", "ms", "row_line", "targets", "verl_targets"]


def ms(s: float) -> str:
    return f"{s * 1e3:.3g}"


def _ratios(s: dict[str, float]) -> tuple[float, float]:
    """``baseline / today`` and ``today / clone``: the paired medians where the run has them."""
    if "speedup" in s and "vs_clone" in s:
        return s["speedup"], s["vs_clone"]
    return s["baseline"] / s["today"], s["today"] / s["clone"]


def row_line(row: dict[str, Any]) -> str:
    q = row["quiet"]
    text = f"{row['name']}: {ms(q['baseline'])} / {ms(q['today'])} ms = {_ratios(q)[0]:.2f}x"
    if "contended" in row:
        text += f", contended {_ratios(row['contended'])[0]:.2f}x"
    return text


def markdown(results: dict[str, Any]) -> list[str]:
    contended = any("contended" in r for r in results["rows"])
    head = ["case", *COLUMNS, *([f"contended: {COLUMNS[0]}", *COLUMNS[1:]] if contended else [])]
    rows = [
        [r["name"], *_cells(r["quiet"]), *(_cells(r["contended"]) if "contended" in r else [])]
        for r in results["rows"]
    ]
    return [*table(head, rows), "", *targets(results)]


#: A run's columns, quiet (and again contended).
COLUMNS = ("baseline ms", "today ms", "clone ms", "baseline / today", "today / clone")


def _cells(s: dict[str, float]) -> list[str]:
    speedup, clone = _ratios(s)
    return [ms(s["baseline"]), ms(s["today"]), ms(s["clone"]), f"{speedup:.2f}x", f"{clone:.2f}"]


# Complex by design: one verdict for each of the targets.
def targets(results: dict[str, Any]) -> list[str]:  # noqa: C901
    """Issue 25's items 2 and 3, each with its figure from ``results``, met / missed."""

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    def pick(rows: int, length: int, mbs: int, keys: int) -> dict[str, Any] | None:
        for r in results["rows"]:
            c = r["case"]
            if (c["rows"], c["mean_length"], c["micro_batches"], c["keys"], c["dtype"], c["ndim"]) == (
                rows,
                length,
                mbs,
                keys,
                "float32",
                2,
            ):
                return r
        return None

    def both(r: dict[str, Any], fig: Callable[[dict[str, float]], float], fmt: str) -> str:
        text = "quiet " + fmt.format(fig(r["quiet"]))
        if "contended" in r:
            text += ", contended " + fmt.format(fig(r["contended"]))
        return text

    def worst(r: dict[str, Any], fig: Callable[[dict[str, float]], float], low: bool = True) -> float:
        vals = [fig(r[k]) for k in ("quiet", "contended") if k in r]
        return min(vals) if low else max(vals)

    if results["commit"].startswith("verl"):
        return verl_targets(results, pick)
    out = []
    small = pick(8, 16, 4, 1)
    if small:
        ms = small["quiet"]["today"] * 1e3
        out.append(
            f"- Fixed cost at B=8, L=16, M=4, one key, at most 0.2 ms quiet: {ms:.3f} ms "
            f"(the commit's {small['quiet']['baseline'] * 1e3:.3f} ms), {verdict(ms <= 0.2)}"
            + (
                "; a turn's first call, just after the other worker's turn: "
                f"{small['quiet']['today_first'] * 1e3:.3f} ms (the commit's "
                f"{small['quiet']['baseline_first'] * 1e3:.3f} ms)."
                if "today_first" in small["quiet"]
                else "."
            )
        )
    speed = lambda s: _ratios(s)[0]  # noqa: E731
    for args, want in (((1024, 512, 64, 5), 2.0), ((1024, 512, 16, 1), 1.5)):
        r = pick(*args)
        if r:
            x = worst(r, speed)
            out.append(
                f"- At least {want}x faster than the commit at B={args[0]}, L={args[1]}, M={args[2]}, "
                f"{args[3]} key{'s' if args[3] > 1 else ''}: {both(r, speed, '{:.2f}x')}, "
                f"{verdict(x >= want)}."
            )
    rows = results["rows"]
    if rows:
        slow = min(rows, key=lambda r: worst(r, speed))
        x = worst(slow, speed)
        out.append(
            f"- Never slower than the commit ({len(rows)} cases, quiet"
            f"{' and contended' if any('contended' in r for r in rows) else ''}): slowest {x:.2f}x "
            f"({slow['name']}), {verdict(x >= 1.0)}."
        )
    from .cases import LARGE_ELEMENTS

    large = [r for r in rows if r["elements"] >= LARGE_ELEMENTS]
    if large:
        clone = lambda s: _ratios(s)[1]  # noqa: E731
        far = max(large, key=lambda r: worst(r, clone, low=False))
        x = worst(far, clone, low=False)
        out.append(
            f"- Within 1.5x of a same-bytes clone at >= 64M output elements ({len(large)} cases; "
            f"worst {far['name']}): {both(far, clone, '{:.2f}x')}, {verdict(x <= 1.5)}."
        )
    return out


def verl_targets(results: dict[str, Any], pick: Callable[..., Any]) -> list[str]:
    """The speed targets against verl's own function (`rebatch.bench.cases.TARGETS_VS_VERL`) and the
    small call's time, each with its figure from ``results``."""
    from .cases import TARGETS_VS_VERL, verl_target_lines

    found = {c: r for c in TARGETS_VS_VERL if (r := pick(c.rows, c.mean_length, c.micro_batches, c.keys))}
    speedups = {
        c: ", ".join(f"{k} {_ratios(r[k])[0]:.2f}x" for k in ("quiet", "contended") if k in r)
        for c, r in found.items()
    }
    small = next((r["quiet"]["today"] for c, r in found.items() if c.rows == 8), None)
    return verl_target_lines(f"{results['commit']}'s own function", speedups, small)
