"""The benches' tables, rendered from their JSON into docs/ by `rebatch.figures`: the side-by-side
harness's (`rebatch.bench.versus`) and the benchmark grid's (`rebatch.bench.run`), a run's rows as
Markdown and the issues' targets each met or missed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from property_tests.markdown import table

__all__ = [
    "GRID_COLUMNS",
    "grid_table",
    "grid_targets",
    "grid_verl_targets",
    "markdown",
    "memory_allowance",
    "ms",
    "restore_table",
    "row_line",
    "targets",
    "verl_targets",
]


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


# --- the benchmark grid's (`rebatch.bench.run`) ---------------------------------------------------------


def _fmt_ms(s: float | None) -> str:
    return "" if s is None else f"{s * 1e3:.3g}"


def _fmt_mib(b: int | None) -> str:
    return "" if b is None else f"{b / 2**20:.1f}"


PER_ROW_BYTES = 128  # the O(B) of the memory target: a dozen int64 arrays of one entry per row
CONSTANT_BYTES = 2**20  # the index path's floor of 2**16 destinations (512 KiB), and slack


def memory_allowance(row: dict[str, Any]) -> float:
    """The memory target for one case: 1.2x the output's bytes plus O(B)."""
    return 1.2 * row["output_bytes"] + PER_ROW_BYTES * row["case"]["rows"] + CONSTANT_BYTES


def grid_targets(results: dict[str, Any]) -> list[str]:
    """The issue's targets, each with the measured figure from ``results`` and met / missed / not in grid."""
    from .cases import LARGE_ELEMENTS

    rows = results["rows"]

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    def pick(**case: Any) -> list[dict[str, Any]]:
        return [r for r in rows if all(r["case"][k] == v for k, v in case.items())]

    out = grid_verl_targets(rows)
    mid = pick(rows=1024, mean_length=512, micro_batches=16, keys=1, dtype="float32", ndim=2)
    if mid:
        x = mid[0]["speedup_vs_baseline"]
        out.append(
            "- At least 5x faster than the per-row baseline at B=1024, L=512, M=16, float32, 1 key: "
            f"{x:.1f}x, {verdict(x >= 5)}."
        )
        verl_q = mid[0].get("speedup_vs_verl")
        verl_c = mid[0].get("contended", {}).get("speedup_vs_verl")
        if verl_q is None:
            out.append(
                "- Against verl's own `postprocess_batch_func`: verl was not importable in this run (absent)."
            )
        else:
            out.append(
                f"- At least 5x faster than verl's own function there, quiet: {verl_q:.1f}x, "
                f"{verdict(verl_q >= 5)}."
            )
        if verl_c is not None:
            out.append(
                "- At least 3x faster than verl's own function there, one busy process per core: "
                f"{verl_c:.1f}x, {verdict(verl_c >= 3)}."
            )
    short = pick(rows=16384, mean_length=16)
    if short:
        x = min(r["speedup_vs_baseline"] for r in short)
        out.append(
            f"- At least 20x faster at B=16384, L=16 ({len(short)} cases): slowest {x:.1f}x, "
            f"{verdict(x >= 20)}."
        )
    worst = min(rows, key=lambda r: r["speedup_vs_baseline"])
    x = worst["speedup_vs_baseline"]
    out.append(
        f"- Never slower than the baseline ({len(rows)} cases): slowest {x:.2f}x ({worst['name']}), "
        f"{verdict(x > 1)}."
    )
    contended = [r for r in rows if "contended" in r]
    if contended:
        worst = min(contended, key=lambda r: r["contended"]["speedup_vs_baseline"])
        x = worst["contended"]["speedup_vs_baseline"]
        out.append(
            f"- Never slower than the baseline with one busy process per core ({len(contended)} cases): "
            f"slowest {x:.2f}x ({worst['name']}), {verdict(x > 1)}."
        )
    large = [r for r in rows if r["output_elements"] >= LARGE_ELEMENTS]
    if large:
        far = [r for r in large if r["ratio_to_copy_limit"] > 1.5]
        x = max(r["ratio_to_copy_limit"] for r in large)
        detail = "; ".join(f"{r['name']}: {r['ratio_to_copy_limit']:.2f}x" for r in far)
        out.append(
            f"- Within 1.5x of the copy limit at >= 64M output elements ({len(large)} cases): worst "
            f"{x:.2f}x, "
            f"{verdict(not far)}" + (f" (over 1.5x: {detail})." if far else ".")
        )
    over = [r for r in rows if r["peak_extra_bytes"]["torch_impl"] > memory_allowance(r)]
    x = max((r["peak_extra_over_output"] for r in rows if r["output_bytes"] >= 2**20), default=float("nan"))
    detail = "; ".join(
        f"{r['name']}: {_fmt_mib(r['peak_extra_bytes']['torch_impl'])} MiB for {_fmt_mib(r['output_bytes'])} "
        "MiB"
        for r in over
    )
    out.append(
        f"- Peak extra memory at most 1.2x the output's bytes plus O(B) (here {PER_ROW_BYTES} bytes per row "
        f"plus {CONSTANT_BYTES // 2**20} MiB) in all {len(rows)} cases: largest ratio {x:.2f}x the output "
        f"(outputs of at least 1 MiB), {verdict(not over)}" + (f" (over: {detail})." if over else ".")
    )
    return out


def grid_verl_targets(rows: list[dict[str, Any]]) -> list[str]:
    """The targets against verl's own function (`cases.TARGETS_VS_VERL`), the small call's time and
    peak memory against verl's, for the cases of ``rows`` that hold them."""
    from .cases import TARGETS_VS_VERL, verl_target_lines

    found = {
        c: r for c in TARGETS_VS_VERL for r in rows if r["case"] == c._asdict() and "speedup_vs_verl" in r
    }
    if not found:
        return []
    small = next((r["seconds"]["torch_impl"] for c, r in found.items() if c.rows == 8), None)
    out = verl_target_lines(
        "verl's own function", {c: f"{r['speedup_vs_verl']:.1f}x" for c, r in found.items()}, small
    )
    for c, r in found.items():
        peak = r["peak_extra_bytes"]
        if "verl" in peak:
            ok = "**met**" if peak["torch_impl"] <= peak["verl"] else "**missed**"
            out.append(
                f"- Peak memory at most verl's at {c.name}: {_fmt_mib(peak['torch_impl'])} MiB against "
                f"{_fmt_mib(peak['verl'])} MiB, {ok}."
            )
    return out


def _pair(row: dict[str, Any], name: str, fmt: str) -> str:
    """``quiet / contended`` for one ratio of a row (a side left blank where it was not measured)."""
    quiet = row.get(name)
    busy = row.get("contended", {}).get(name)
    return " / ".join("" if v is None else fmt.format(v) for v in (quiet, busy))


#: The benchmark grid's columns (`grid_table`), one a `_grid_cells` cell.
GRID_COLUMNS = (
    "B",
    "mean len",
    "M",
    "keys",
    "dtype",
    "jagged",
    "torch_impl ms",
    "baseline ms",
    "verl ms",
    "copy ms",
    "JAX ms",
    "speed-up vs baseline (quiet / contended)",
    "vs verl (quiet / contended)",
    "x copy (quiet / contended)",
    "torch_impl peak MiB",
    "baseline peak MiB",
    "output MiB",
    "peak / output",
    "torch_impl RSS MiB",
    "baseline RSS MiB",
)


def _grid_cells(r: dict[str, Any]) -> list[str]:
    """One case's row of the grid table (`GRID_COLUMNS`)."""
    c, s, p = r["case"], r["seconds"], r["peak_extra_bytes"]
    rss = r.get("peak_rss_bytes") or {}
    return [
        *(str(c[k]) for k in ("rows", "mean_length", "micro_batches", "keys", "dtype")),
        f"{c['ndim']}-D",
        *(
            _fmt_ms(s.get(k))
            for k in ("torch_impl", "per_row_baseline", "verl", "copy_limit", "jax_reference_jit")
        ),
        _pair(r, "speedup_vs_baseline", "{:.1f}x"),
        _pair(r, "speedup_vs_verl", "{:.1f}x"),
        _pair(r, "ratio_to_copy_limit", "{:.2f}"),
        _fmt_mib(p["torch_impl"]),
        _fmt_mib(p["per_row_baseline"]),
        _fmt_mib(r["output_bytes"]),
        f"{r.get('peak_extra_over_output', float('nan')):.2f}",
        _fmt_mib(rss.get("torch_impl")),
        _fmt_mib(rss.get("per_row_baseline")),
    ]


def grid_table(results: dict[str, Any]) -> list[str]:
    """The run's cases as a Markdown table (`GRID_COLUMNS`)."""
    return table(GRID_COLUMNS, [_grid_cells(r) for r in results["rows"]])


def restore_table(row: dict[str, Any]) -> list[str]:
    """The side-by-side row of `restore_side_by_side` as a Markdown table, its target's verdict last."""
    s = row["seconds"]
    verdict = "met" if row["jit_over_torch"] <= 2.0 else "NOT met"
    return table(
        ["torch_impl.restore ms", "jit(ref.restore) ms", "jit / torch", "within 2x"],
        [
            [
                _fmt_ms(s["torch_impl_restore"]),
                _fmt_ms(s["jax_ref_restore_jit"]),
                f"{row['jit_over_torch']:.2f}",
                verdict,
            ]
        ],
    )
