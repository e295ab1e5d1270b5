"""The figures the README and ``docs/`` state, each rendered from the measurement it comes from; ``--check``
fails where the committed text and its source disagree, ``--write`` puts the renderings in place (after a
source is regenerated)::

    python -m rebatch.figures --check                      # tests/test_figures.py runs this
    python -m rebatch.figures --write
    python -m rebatch.figures --check --tests-seconds 402  # CI: the README's test command, timed in CI
    python -m rebatch.figures --check-peers .cache/peers/*.json  # CI: docs/peers.md against fresh reports

A `Figure` is a phrase of a page rendered from its sources: the page must hold that phrase exactly once,
numbers included (its anchor is the phrase with every number a wildcard, so a figure edited by hand is
found and reported, and ``--write`` replaces it). A `Region` is the text between a page's markers
``<!-- name -->`` and ``<!-- /name -->``: a bench's table, its targets' verdicts, or a figure of its run
within a sentence, rendered from the bench's JSON; the prose around it (how the bench measures, what its
columns mean) is written in the page itself. The benches write their JSON only, and this fills their
regions (``--write``). The sources: the trainers' speed table of ``docs/peers.md`` (rendered from the
conformance reports by ``property_tests.conformance --report``, and checked here for its own arithmetic),
``docs/durations.json`` (the test command's time, measured; CI times it again and checks the stated
range), ``.ci/verl_upstream/expected.txt`` (verl's own outcomes), ``docs/benchmarks.json``,
``docs/versus.json``, ``docs/benchmarks-copy.json``, ``docs/benchmarks-small-pins.json``,
``docs/split.json``, and the checks' costs: ``docs/witness.json``, ``docs/provenance.json``,
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
    "PEERS_COLUMNS",
    "REGIONS",
    "Figure",
    "Load",
    "Region",
    "anchor",
    "check",
    "fill",
    "loader",
    "main",
    "peers_against_reports",
    "spans",
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


#: The parsed JSON of a source, by its name (a path relative to the repository).
Load = Callable[[str], Any]


class Region(NamedTuple):
    """The text of ``page`` between each ``<!-- name -->`` (or ``<!-- name: a note -->``) and the
    ``<!-- /name -->`` after it, equal to ``render`` of the parsed JSON of ``sources``: a block of lines (its
    markers each on a line of its own) or a phrase within a line. A bench's tables and figures are regions;
    the prose around them is the page's own, written in the Markdown. (A source that is a module: an
    assumption of a bench that its JSON does not hold, a constant of its code.)"""

    page: str
    name: str
    sources: tuple[str, ...]
    render: Callable[[Load], str]


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


def _ci_lanes(root: Path) -> str:
    """docs/development.md's time of each of CI's lanes, from the last recorded run."""
    lanes = _durations(root)["ci"]["lanes"]
    said = ", ".join(f"{name} {seconds} s" for name, seconds in lanes.items())
    return f"each lane's time in the last run: {said}"


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


def _versus_heading(root: Path) -> str:
    """docs/benchmarks.md's heading of the side-by-side run against verl's own function."""
    commit = json.loads((root / "docs/versus.json").read_text())["commit"]
    return f"Against {commit}'s own function, side by side"


FIGURES = (
    Figure("README.md", ("docs/peers.md",), _readme_cost),
    Figure("README.md", ("docs/durations.json",), _test_time),
    Figure("docs/development.md", ("docs/durations.json",), _test_time),
    Figure("docs/development.md", ("docs/durations.json",), _ci_time),
    Figure("docs/development.md", ("docs/durations.json",), _ci_lanes),
    Figure("docs/trainers/verl.md", (".ci/verl_upstream/expected.txt",), _verl_own_tests),
    Figure("docs/benchmarks.md", ("docs/versus.json",), _versus_heading),
)


# --- the generated regions -----------------------------------------------------------------------------


def _lines(*lines: str) -> str:
    """A block region's text: its lines, each marker on a line of its own."""
    return "\n" + "\n".join(lines) + "\n"


def _benchmarks_run(load: Load) -> str:
    b = load("docs/benchmarks.json")
    return f"{b['machine']}; device {b['device']}; torch {b['torch']}; grid `{b['grid']}`; {b['date']}"


def _benchmarks_targets(load: Load) -> str:
    from .bench import tables

    return _lines(*tables.grid_targets(load("docs/benchmarks.json")))


def _restore_size(load: Load) -> str:
    row = load("docs/benchmarks.json").get("restore_side_by_side")
    return "" if row is None else f"{row['rows']}, N = {row['elements']}, M = {row['micro_batches']}"


def _restore(load: Load) -> str:
    from .bench import tables

    row = load("docs/benchmarks.json").get("restore_side_by_side")
    return _lines(*tables.restore_table(row)) if row else "\n"


def _grid(load: Load) -> str:
    from .bench import tables

    return _lines(*tables.grid_table(load("docs/benchmarks.json")))


def _launches(load: Load) -> str:
    from .bench import launches

    rows = load("docs/benchmarks.json").get("launches")
    return _lines(*launches.markdown(rows)) if rows else "\n"


def _jax_elements(load: Load) -> str:
    """The output size up to which the benchmark grid times the JAX reference, in M elements (a constant
    of the harness, not in its JSON)."""
    from .bench.cases import JAX_MAX_ELEMENTS

    return f"{JAX_MAX_ELEMENTS // 2**20}"


def _launches_assumption(which: str) -> Callable[[Load], str]:
    """An assumption of the launch table's model (a constant of `rebatch.bench.launches`, not in the JSON):
    each row's values, one operation's launch in µs, the bandwidth in TB/s."""

    def render(load: Load) -> str:
        from .bench import launches

        return {
            "length": str(launches.MEAN_LENGTH),
            "launch": f"{launches.LAUNCH_SECONDS * 1e6:g}",
            "bandwidth": f"{launches.BANDWIDTH / 1e12:g}",
        }[which]

    return render


def _run(run: dict[str, Any]) -> str:
    """A side-by-side run as its page introduces it: its date, today's commit and its command."""
    return f"{run['date']}, today {run['today']}:\n`{run['command']}`"


def _versus_run(load: Load) -> str:
    v = load("docs/versus.json")
    return (
        f"`{v.get('command', 'python -m rebatch.bench.versus')}` ({v['date']}, torch {v['torch']}, CPU; "
        f"today is {v.get('today', 'this checkout')})"
    )


def _versus(name: str) -> Callable[[Load], str]:
    """The tables and the targets' verdicts of a side-by-side run (`rebatch.bench.tables.markdown`)."""

    def render(load: Load) -> str:
        from .bench import tables

        return _lines(*tables.markdown(load(name)))

    return render


def _copy(load: Load) -> str:
    from .bench import tables

    run = load("docs/benchmarks-copy.json")
    return _lines(f"Torch {run['torch']}, {_run(run)}", "", *tables.markdown(run))


def _check_cost(check: str) -> Callable[[Load], str]:
    """A check's cost (a ``--witness`` or ``--witness --provenance`` run of `rebatch.bench.versus`): the
    run and its table (`rebatch.bench.checkcost.checks_markdown`)."""

    def render(load: Load) -> str:
        from .bench import checkcost

        results = load(f"docs/{check}.json")
        pairs = [r["check"]["pairs"] for r in results["rows"]]
        return _lines(
            f"Torch {results['torch']}, {results['date']}, today {results['today']}, {results['rounds']} "
            f"rounds ({min(pairs)} to {max(pairs)} pairs a case): `{results['command']}`",
            "",
            *checkcost.checks_markdown(results),
        )

    return render


def _checked_run(load: Load) -> str:
    v = load("docs/versus-checked.json")
    return f"torch {v['torch']}, {v['date']}, today {v['today']}: `{v['command']}`"


def _split(load: Load) -> str:
    from property_tests.markdown import table

    rows = load("docs/split.json")
    head = ["B", "mean len", "jagged fields", "partitions", "torch_impl ms", "baseline ms", "speed-up"]
    cells = [
        [
            r["rows"],
            r["mean_length"],
            r["jagged_fields"],
            r["partitions"],
            f"{r['torch_impl_s'] * 1e3:.3g}",
            f"{r['baseline_s'] * 1e3:.3g}",
            f"{r['speedup']:.1f}x",
        ]
        for r in rows
    ]
    return _lines(*table(head, cells))


def _field(name: str, key: str) -> Callable[[Load], str]:
    """A region holding one field of a source, as Python prints it."""
    return lambda load: str(load(name)[key])


_BENCH, _VERSUS, _CHECKED = "docs/benchmarks.json", "docs/versus.json", "docs/versus-checked.json"
_COPY, _SMALL = "docs/benchmarks-copy.json", "docs/benchmarks-small-pins.json"
_LAUNCHES = "rebatch/bench/launches.py"
#: Every region of the pages, each with its sources: the benches' tables and figures.
REGIONS = (
    Region("docs/benchmarks.md", "benchmarks-run", (_BENCH,), _benchmarks_run),
    Region("docs/benchmarks.md", "benchmarks-verl", (_BENCH,), _field(_BENCH, "verl")),
    Region("docs/benchmarks.md", "benchmarks-busy", (_BENCH,), _field(_BENCH, "busy_processes")),
    Region("docs/benchmarks.md", "jax-elements", ("rebatch/bench/cases.py",), _jax_elements),
    Region("docs/benchmarks.md", "benchmarks-targets", (_BENCH,), _benchmarks_targets),
    Region("docs/benchmarks.md", "restore-size", (_BENCH,), _restore_size),
    Region("docs/benchmarks.md", "restore", (_BENCH,), _restore),
    Region("docs/benchmarks.md", "benchmarks-grid", (_BENCH,), _grid),
    *(
        Region("docs/benchmarks.md", f"launches-{which}", (_LAUNCHES,), _launches_assumption(which))
        for which in ("length", "launch", "bandwidth")
    ),
    Region("docs/benchmarks.md", "launches", (_BENCH,), _launches),
    Region("docs/benchmarks.md", "versus-run", (_VERSUS,), _versus_run),
    Region("docs/benchmarks.md", "versus-commit", (_VERSUS,), _field(_VERSUS, "commit")),
    Region("docs/benchmarks.md", "versus-pinned", (_VERSUS,), _field(_VERSUS, "pinned")),
    Region("docs/benchmarks.md", "versus-busy", (_VERSUS,), _field(_VERSUS, "busy_processes")),
    Region("docs/benchmarks.md", "versus", (_VERSUS,), _versus(_VERSUS)),
    Region("docs/benchmarks.md", "copy-commit", (_COPY,), _field(_COPY, "commit")),
    Region("docs/benchmarks.md", "copy-limit", (_COPY,), _copy),
    Region("docs/benchmarks.md", "small-call-torch", (_SMALL,), _field(_SMALL, "torch")),
    Region("docs/benchmarks.md", "small-call-run", (_SMALL,), lambda load: _run(load(_SMALL))),
    Region("docs/benchmarks.md", "small-call", (_SMALL,), _versus(_SMALL)),
    Region("docs/witness.md", "provenance-cost", ("docs/provenance.json",), _check_cost("provenance")),
    Region("docs/witness.md", "checked-commit", (_CHECKED,), _field(_CHECKED, "commit")),
    Region("docs/witness.md", "checked-run", (_CHECKED,), _checked_run),
    Region("docs/witness.md", "checked", (_CHECKED,), _versus(_CHECKED)),
    Region("docs/witness.md", "witness-cost", ("docs/witness.json",), _check_cost("witness")),
    Region("docs/split.md", "split", ("docs/split.json",), _split),
)


def spans(text: str, name: str) -> list[tuple[int, int]]:
    """Where each region ``name`` of a page's ``text`` lies: from the end of its opening marker
    (``<!-- name -->``, or ``<!-- name: a note -->``) to the start of its closing one (``<!-- /name -->``);
    ValueError where a marker has no partner."""
    opening = re.compile(rf"<!-- {re.escape(name)}(?:: [^\n]*?)? -->")
    closing = f"<!-- /{name} -->"
    found = []
    for m in opening.finditer(text):
        end = text.find(closing, m.end())
        if end < 0 or opening.search(text, m.end(), end):
            raise ValueError(f"the region '{name}' opened at {m.start()} is not closed before the next")
        found.append((m.end(), end))
    if text.count(closing) != len(found):
        raise ValueError(
            f"{text.count(closing)} closing markers of the region '{name}', {len(found)} opening"
        )
    return found


def loader(root: Path, given: dict[str, Any] | None = None) -> Load:
    """Each source's parsed JSON (read once) from ``root``, but those ``given`` (a name -> its data)."""
    given = dict(given or {})

    def load(name: str) -> Any:
        if name not in given:
            given[name] = json.loads((root / name).read_text())
        return given[name]

    return load


def fill(text: str, page: str, load: Load) -> str:
    """``text`` (``page``'s) with each of its regions (`REGIONS`) as its sources render it; the prose
    around them as it was."""
    for region in REGIONS:
        if region.page == page:
            rendered = region.render(load)
            for start, end in reversed(spans(text, region.name)):
                text = text[:start] + rendered + text[end:]
    return text


def _regions_differ(root: Path) -> list[str]:
    problems = []
    load = loader(root)
    for region in REGIONS:
        text = (root / region.page).read_text()
        try:
            found = spans(text, region.name)
        except ValueError as e:
            problems.append(f"{region.page}: {e}")
            continue
        rendered = region.render(load)
        if not found:
            problems.append(f"{region.page}: no region '{region.name}' (its markers: <!-- {region.name} -->)")
        elif any(text[a:b] != rendered for a, b in found):
            sources = ", ".join(region.sources)
            problems.append(f"{region.page}: the region '{region.name}' differs from what {sources} renders")
    return problems


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
                f"docs/peers.md: {r['trainer']} B={r['B']}: {r['speedup']}x is not {r['theirs_ms']:.2f} ms / "
                f"{r['ours_ms']:.2f} ms"  # the times as the page prints them
            )
        if r["same"] != "yes":
            problems.append(f"docs/peers.md: {r['trainer']} B={r['B']}: results not the same ({r['same']})")
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
    problems += _regions_differ(root)
    return problems + _peers_arithmetic(root) + _durations_hold(root, tests_seconds)


def write(root: Path = ROOT, pages: tuple[str, ...] | None = None) -> list[str]:
    """Put each figure's and each region's rendering in its place (of ``pages`` only, when given); the
    pages changed."""
    changed = []
    for figure in FIGURES:
        if pages is not None and figure.page not in pages:
            continue
        text, found, rendered = _located(figure, root)
        if len(found) != 1:
            raise SystemExit(
                f"{figure.page}: {len(found)} places for {rendered!r}: put the phrase in by hand once"
            )
        if _normal(found[0].group(0)) != rendered:
            new = text[: found[0].start()] + rendered + text[found[0].end() :]
            (root / figure.page).write_text(new)
            changed.append(figure.page)
    load = loader(root)
    for page in dict.fromkeys(r.page for r in REGIONS if pages is None or r.page in pages):
        text = (root / page).read_text()
        new = fill(text, page, load)
        if new != text:
            (root / page).write_text(new)
            changed.append(page)
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
