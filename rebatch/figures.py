"""The figures the README and ``docs/`` state, each rendered from the measurement it comes from; ``--check``
fails where the committed text and its source disagree, ``--write`` puts the renderings in place (after a
source is regenerated)::

    python -m rebatch.figures --check                      # tests/test_figures.py runs this
    python -m rebatch.figures --write
    python -m rebatch.figures --check --tests-seconds 402  # CI: the README's test command, timed in CI
    python -m rebatch.figures --check-peers .cache/peers/*.json  # CI: docs/peers.md against fresh reports

A `Figure` is a phrase of a page rendered from its sources: the page must hold that phrase exactly once,
numbers included (its anchor is the phrase with every number a wildcard, so a figure edited by hand is
found and reported, and ``--write`` replaces it). A `Page` is a generated page (or part of one) rendered
whole by the code that wrote it. The sources: the trainers' speed table of ``docs/peers.md`` (rendered
from the conformance reports by ``property_tests.conformance --report``, and checked here for its own
arithmetic), ``docs/durations.json`` (the test command's time, measured; CI times it again and checks the
stated range), ``.ci/verl_upstream/expected.txt`` (verl's own outcomes), ``docs/benchmarks.json``,
``docs/versus.json``, ``docs/split.json``, and the checks' costs: ``docs/witness.json``,
``docs/provenance.json``,
``docs/versus-checked.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "COVERED",
    "FIGURES",
    "MEASURED",
    "PAGES",
    "PEERS_COLUMNS",
    "Figure",
    "Page",
    "anchor",
    "check",
    "main",
    "peers_against_reports",
    "speed_rows",
    "write",
]

ROOT = Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


class Figure(NamedTuple):
    """A phrase of ``page`` (a path relative to the repository) rendered from ``sources``."""

    page: str
    sources: tuple[str, ...]
    render: Callable[[Path], str]


class Page(NamedTuple):
    """The part of ``page`` that ``region`` cuts out of it, equal to ``render`` of ``sources``."""

    page: str
    sources: tuple[str, ...]
    region: Callable[[str], str]
    render: Callable[[Path], str]


def anchor(phrase: str) -> re.Pattern[str]:
    """Where ``phrase`` stands in a page whatever its numbers (each a wildcard) and line breaks."""
    parts = NUMBER.split(phrase)
    texts = [r"\s+".join(re.escape(word) for word in part.split(" ")) for part in parts]
    return re.compile(NUMBER.pattern.join(texts))


def _normal(text: str) -> str:
    return " ".join(text.split())


# --- the sources --------------------------------------------------------------------------------------


def _table(text: str, heading: str) -> list[list[str]]:
    """The data rows (cells) of the first table under the ``## heading...`` of a Markdown page."""
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0] if f"## {heading}" in text else ""
    lines = [line for line in section.splitlines() if line.startswith("|")]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    return rows[2:]  # past the header and its rule


def speed_rows(root: Path) -> list[dict[str, Any]]:
    """The rows of ``docs/peers.md``'s speed table: trainer, B, mean length, M, both times, the speed-up
    and whether the results were the same."""
    keys = ("trainer", "B", "mean_length", "M", "theirs_ms", "ours_ms", "speedup", "same")
    kinds: tuple[Callable[[str], Any], ...] = (
        str,
        int,
        int,
        int,
        float,
        float,
        lambda c: float(c.rstrip("x")),
        str,
    )
    return [
        {key: kind(cell) for key, kind, cell in zip(keys, kinds, cells, strict=True)}
        for cells in _table((root / "docs/peers.md").read_text(), "Speed")
    ]


def _durations(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / "docs/durations.json").read_text())
    return data


# --- the figures --------------------------------------------------------------------------------------


def _readme_cost(root: Path) -> str:
    """The README's speed-ups, from docs/peers.md's table: each trainer at its two sizes."""
    by_trainer: dict[str, list[dict[str, Any]]] = {}
    for row in speed_rows(root):
        by_trainer.setdefault(row["trainer"], []).append(row)
    phrases = []
    slower = []
    for i, (trainer, (small, large)) in enumerate(
        (t, sorted(rows, key=lambda r: r["B"])) for t, rows in by_trainer.items()
    ):
        if small["speedup"] < 1 or large["speedup"] < 1:  # said apart: never counted among the faster
            slower.append(f"{small['speedup']:.1f}x {trainer}'s ({large['speedup']:.1f}x)")
        elif i == 0:
            phrases.append(
                f"{small['speedup']:.1f}x {trainer}'s at {small['B']:,} rows in {small['M']} micro-batches "
                f"({large['speedup']:.1f}x at {large['B']:,} rows)"
            )
        else:
            phrases.append(f"{small['speedup']:.1f}x {trainer}'s ({large['speedup']:.1f}x)")
    text = ", ".join(phrases)
    if slower:
        text += "; " + ", ".join(slower) + ": slower than a function that moves no data"
    return text


def _test_time(root: Path) -> str:
    """The time of the README's test command (also in docs/development.md): the stated range, and the
    measurement it holds."""
    tests = _durations(root)["tests"]
    lo, hi = tests["range_minutes"]
    minutes, seconds = divmod(int(tests["seconds"]), 60)
    return f"{lo}-{hi} minutes on {tests['cores']} cores; {minutes} min {seconds} s from a fresh clone"


def _ci_time(root: Path) -> str:
    """docs/development.md's time for the whole of CI, from its recorded runs."""
    ci = _durations(root)["ci"]
    runs = ci["seconds"]
    return (
        f"{math.floor(min(runs) / 60)}-{math.ceil(max(runs) / 60)} minutes on {ci['cores']} cores in the "
        f"last runs: {', '.join(f'{s} s' for s in runs)}"
    )


def _verl_own_tests(root: Path) -> str:
    """How many of verl's own tests run, from the outcomes recorded for .ci/verl_upstream/run.sh."""
    counts: dict[str, int] = {}
    for line in (root / ".ci/verl_upstream/expected.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            for pair in line.split()[1:]:
                kind, n = pair.split("=")
                counts[kind] = counts.get(kind, 0) + int(n)
    said = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    return f"recorded in `.ci/verl_upstream/expected.txt` ({said}, as of verl 0.9.1)"


FIGURES = (
    Figure("README.md", ("docs/peers.md",), _readme_cost),
    Figure("README.md", ("docs/durations.json",), _test_time),
    Figure("docs/development.md", ("docs/durations.json",), _test_time),
    Figure("docs/development.md", ("docs/durations.json",), _ci_time),
    Figure("docs/trainers/verl.md", (".ci/verl_upstream/expected.txt",), _verl_own_tests),
)


# --- the generated pages ------------------------------------------------------------------------------


def _before_versus(text: str) -> str:
    from .bench import versus

    start = text.find(versus.BEGIN)
    return text if start < 0 else text[: start - 1]


def _benchmarks(root: Path) -> str:
    from .bench import run

    return run.markdown(json.loads((root / "docs/benchmarks.json").read_text()))


def _versus_region(text: str) -> str:
    from .bench import versus

    return versus.kept_section(text)


def _versus(root: Path) -> str:
    from .bench import versus

    return versus.section(json.loads((root / "docs/versus.json").read_text()))


def _copy_region(text: str) -> str:
    from .bench import versus

    return versus.kept_copy_section(text)


def _copy(root: Path) -> str:
    from .bench import versus

    runs = (
        json.loads((root / f"docs/benchmarks-{name}.json").read_text()) for name in ("copy", "small-pins")
    )
    return versus.copy_section(*runs)


def _check_cost(check: str, *against: str) -> Page:
    """docs/witness.md's section of a check's cost (`rebatch.bench.checkcost.section`)."""
    from .bench import checkcost

    sources = (f"docs/{check}.json", *against)
    return Page(
        "docs/witness.md",
        sources,
        lambda text: checkcost.kept_section(check, text),
        lambda root: checkcost.section(*(json.loads((root / name).read_text()) for name in sources)),
    )


PAGES = (
    Page("docs/benchmarks.md", ("docs/benchmarks.json",), _before_versus, _benchmarks),
    _check_cost("witness"),
    _check_cost("provenance", "docs/versus-checked.json"),
    Page("docs/benchmarks.md", ("docs/versus.json",), _versus_region, _versus),
    Page(
        "docs/benchmarks.md",
        ("docs/benchmarks-copy.json", "docs/benchmarks-small-pins.json"),
        _copy_region,
        _copy,
    ),
)


# --- checks of a source's own figures -----------------------------------------------------------------


def _peers_arithmetic(root: Path) -> list[str]:
    """Each speed-up of docs/peers.md is its row's trainer ms over rebatch's ms (within the rounding of
    the two times as printed), and every result was the same."""
    problems = []
    rows = speed_rows(root)
    if not rows:
        problems.append("docs/peers.md: no speed table found")
    for r in rows:
        lo = (r["theirs_ms"] - 0.005) / (r["ours_ms"] + 0.005)
        hi = (r["theirs_ms"] + 0.005) / max(r["ours_ms"] - 0.005, 1e-9)
        if not lo - 0.05 <= r["speedup"] <= hi + 0.05:
            problems.append(
                f"docs/peers.md: {r['trainer']} B={r['B']}: {r['speedup']}x is not {r['theirs_ms']} ms / "
                f"{r['ours_ms']} ms"
            )
        if r["same"] != "yes":
            problems.append(f"docs/peers.md: {r['trainer']} B={r['B']}: results not the same ({r['same']})")
    return problems


def _split_table(root: Path) -> list[str]:
    """docs/split.md's table against docs/split.json, row by row (its times to the 3 digits printed)."""
    rows = json.loads((root / "docs/split.json").read_text())
    lines = [line for line in (root / "docs/split.md").read_text().splitlines() if re.match(r"\| \d", line)]
    if len(lines) != len(rows):
        return [f"docs/split.md: {len(lines)} rows, docs/split.json {len(rows)}"]
    problems = []
    for line, r in zip(lines, rows, strict=True):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        want = [
            str(r["rows"]),
            str(r["mean_length"]),
            str(r["jagged_fields"]),
            str(r["partitions"]),
            f"{r['torch_impl_s'] * 1e3:.3g}",
            f"{r['baseline_s'] * 1e3:.3g}",
            f"{r['speedup']:.1f}x",
        ]
        if cells != want:
            problems.append(f"docs/split.md: row {line!r} is not docs/split.json's {want}")
    return problems


#: Of docs/peers.md's tables, the columns a fresh report must reproduce: the differential's trainer, calls
#: drawn, differences and properties (not its torch and Python builds: CI's may be other patch releases);
#: the speed table's trainer, sizes and "same result" (not its times: one run's, and a timed check flakes).
PEERS_COLUMNS = {"Differential": (0, 3, 4, 5), "Speed": (0, 1, 2, 3, 7)}


def peers_against_reports(root: Path, paths: list[str]) -> list[str]:
    """docs/peers.md against the trainers' fresh conformance reports (CI's trainers lane): the columns of
    `PEERS_COLUMNS` the same; the fresh times and speed-ups are printed beside the stated ones."""
    from property_tests.peer_report import load, render

    stated, fresh = (root / "docs/peers.md").read_text(), render(load(paths))
    problems = []
    for heading, columns in PEERS_COLUMNS.items():
        old, new = _table(stated, heading), _table(fresh, heading)
        if not old:
            problems.append(f"docs/peers.md: no table under '## {heading}'")
        if [[r[i] for i in columns] for r in old] != [[r[i] for i in columns] for r in new]:
            problems.append(
                f"docs/peers.md: its '{heading}' table differs from the reports {paths} (regenerate it)"
            )
    for old_row, new_row in zip(_table(stated, "Speed"), _table(fresh, "Speed"), strict=False):
        print(
            f"  {' '.join(old_row[:4])}: stated {old_row[6]}, this run {new_row[6]} ({new_row[4]} / "
            f"{new_row[5]} ms)"
        )
    return problems


def _durations_hold(root: Path, tests_seconds: float | None) -> list[str]:
    """The recorded times of the test command (alone, and CI's main lane) lie in the README's range, and so
    does this CI run's, when given."""
    tests = _durations(root)["tests"]
    lo, hi = tests["range_minutes"]
    measured = [
        ("docs/durations.json", s) for s in (tests["seconds"], *tests.get("ci_main_lane_seconds", ()))
    ]
    if tests_seconds is not None:
        measured.append(("this CI run", tests_seconds))
    return [
        f"the test command took {s:.0f} s in {where}, outside the README's {lo}-{hi} minutes"
        for where, s in measured
        if not lo * 60 <= s <= hi * 60
    ]


# --- check and write ----------------------------------------------------------------------------------


def _located(figure: Figure, root: Path) -> tuple[str, list[re.Match[str]], str]:
    text = (root / figure.page).read_text()
    rendered = figure.render(root)
    return text, list(anchor(rendered).finditer(text)), rendered


#: A measured quantity as the README states one: a number with a unit of time, size, a ratio or a share.
MEASURED = re.compile(r"\d[\d,.]*\s?(?:x|ms|µs|us|s|min|minutes|hours|%|KiB|MiB|GiB|KB|MB|GB)\b")
#: The pages every measured quantity of which must lie in one of its `FIGURES`.
COVERED = ("README.md",)


def _uncovered(root: Path) -> list[str]:
    """Measured quantities of a `COVERED` page that no figure renders (a new figure with no source)."""
    problems = []
    for page in COVERED:
        text = (root / page).read_text()
        spans = [m.span() for f in FIGURES if f.page == page for m in anchor(f.render(root)).finditer(text)]
        for m in MEASURED.finditer(text):
            if not any(a <= m.start() and m.end() <= b for a, b in spans):
                line = text.count("\n", 0, m.start()) + 1
                problems.append(
                    f"{page}:{line}: {m.group(0)!r} is tied to no source (rebatch.figures.FIGURES)"
                )
    return problems


def check(root: Path = ROOT, *, tests_seconds: float | None = None) -> list[str]:
    """Every disagreement between a stated figure and its source ([] when none); with the test command's
    time measured in CI (``tests_seconds``) against the stated range too. docs/peers.md against the
    trainers' reports: `peers_against_reports` (CI's trainers lane)."""
    problems = _uncovered(root)
    for figure in FIGURES:
        _, found, rendered = _located(figure, root)
        if len(found) != 1:
            problems.append(
                f"{figure.page}: {len(found)} places for the figure from {', '.join(figure.sources)}: "
                f"{rendered!r}"
            )
        elif _normal(found[0].group(0)) != rendered:
            problems.append(
                f"{figure.page}: states [{_normal(found[0].group(0))}] where {', '.join(figure.sources)} "
                f"gives [{rendered}]"
            )
    for page in PAGES:
        if page.region((root / page.page).read_text()) != page.render(root):
            problems.append(f"{page.page}: differs from what {', '.join(page.sources)} renders")
    return problems + _peers_arithmetic(root) + _split_table(root) + _durations_hold(root, tests_seconds)


def write(root: Path = ROOT) -> list[str]:
    """Put each figure's and each generated page region's rendering in its place; the pages changed."""
    changed = []
    for figure in FIGURES:
        text, found, rendered = _located(figure, root)
        if len(found) != 1:
            raise SystemExit(
                f"{figure.page}: {len(found)} places for {rendered!r}: put the phrase in by hand once"
            )
        if _normal(found[0].group(0)) != rendered:
            new = text[: found[0].start()] + rendered + text[found[0].end() :]
            (root / figure.page).write_text(new)
            changed.append(figure.page)
    for (
        page
    ) in PAGES:  # each generated region in its place (a region not yet on its page is left to its tool)
        text = (root / page.page).read_text()
        old, new = page.region(text), page.render(root)
        if old and old != new:
            (root / page.page).write_text(text.replace(old, new, 1))
            changed.append(page.page)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rebatch.figures",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--check", action="store_true", help="fail where a stated figure and its source disagree"
    )
    what.add_argument(
        "--write", action="store_true", help="render every figure from its source into its page"
    )
    parser.add_argument(
        "--tests-seconds", type=float, help="with --check: the test command's time measured in CI"
    )
    what.add_argument(
        "--check-peers",
        nargs="+",
        metavar="JSON",
        help="docs/peers.md against the trainers' reports of this run",
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this source tree)")
    args = parser.parse_args(argv)
    if args.write:
        changed = write(args.root)
        print(f"rewrote {', '.join(changed)}" if changed else "every figure already as its source gives it")
        return 0
    if args.check_peers:
        problems = peers_against_reports(args.root, args.check_peers)
    else:
        problems = check(args.root, tests_seconds=args.tests_seconds)
    for problem in problems:
        print(problem)
    print(
        f"{len(problems)} figures differ from their sources"
        if problems
        else "every figure as its source gives it"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
