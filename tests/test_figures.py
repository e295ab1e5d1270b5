"""Every figure the README and docs/ state against the measurement it comes from (`rebatch.figures`): a
figure edited by hand, or a source regenerated without its pages, fails here."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from rebatch import figures
from rebatch_startup.trainers import names

#: Independent of torch's release and of the trainers: run once, in CI's main lane (the pins lane deselects
#: it, .ci/lanes.sh)
pytestmark = pytest.mark.main_lane_only

ROOT = Path(__file__).resolve().parent.parent
VERSUS = [r for r in figures.REGIONS if "docs/versus.json" in r.sources]


def _copy(tmp_path: Path) -> Path:
    """The pages and sources `rebatch.figures` reads, copied under ``tmp_path``."""
    names: set[str] = set()
    for item in (*figures.FIGURES, *figures.REGIONS):
        names |= {item.page, *item.sources}
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def _check(root: Path, **kwargs: object) -> list[str]:
    """`figures.check` but for the side-by-side section of docs/benchmarks.md (its own test below)."""
    return [p for p in figures.check(root, **kwargs) if "docs/versus.json" not in p]  # type: ignore[arg-type]


def test_every_figure_is_its_sources() -> None:
    assert _check(ROOT) == []


def test_the_side_by_side_section_is_versus_json() -> None:
    load = figures.loader(ROOT)
    for region in VERSUS:
        text = (ROOT / region.page).read_text()
        found = [text[a:b] for a, b in figures.spans(text, region.name)]
        assert found, region.name
        assert all(f == region.render(load) for f in found), region.name


def test_a_figure_edited_by_hand_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    readme = root / "README.md"
    first = figures.FIGURES[0].render(root).split(" ", 1)[0]  # verl's speed-up at 1,024 rows, as stated
    readme.write_text(readme.read_text().replace(f"{first} verl", "14.0x verl", 1))
    problems = _check(root)
    assert len(problems) == 1
    assert problems[0].startswith("README.md: states [14.0x verl")


def test_a_regenerated_source_is_rendered_into_the_readme(tmp_path: Path) -> None:
    """A new speed table in docs/peers.md: the README is stale until ``--write``, then states it."""
    root = _copy(tmp_path)
    peers = root / "docs/peers.md"
    stated = figures.FIGURES[0].render(root)
    row = next(line for line in peers.read_text().splitlines() if line.startswith("| verl 0.9.1 | 1024 |"))
    cells = row.split(" | ")
    cells[4], cells[5], cells[6] = "20.00", "2.00", "10.0x"  # trainer ms, rebatch ms, speed-up
    peers.write_text(peers.read_text().replace(row, " | ".join(cells)))
    assert [p.split(" where ")[0] for p in _check(root)] == [f"README.md: states [{stated}]"]
    assert figures.write(root) == ["README.md"]
    assert _check(root) == []
    assert "10.0x verl 0.9.1's at 1,024 rows" in (root / "README.md").read_text()


def test_a_speed_up_that_is_not_its_times_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    peers = root / "docs/peers.md"
    text = peers.read_text()
    row = re.search(r"\| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|", text)  # the speed table's first row
    assert row is not None
    theirs, ours, speedup = row.groups()
    wrong = f"{float(speedup) + 2:.1f}"
    peers.write_text(text.replace(row.group(0), f"| {theirs} | {ours} | {wrong}x |", 1))
    assert any(f"{wrong}x is not {theirs} ms / {ours} ms" in p for p in _check(root))


def test_the_test_time_is_checked_against_ci_and_the_record(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    lo, hi = json.loads((root / "docs/durations.json").read_text())["tests"]["range_minutes"]
    assert _check(root, tests_seconds=(lo + hi) * 30) == []
    assert _check(root, tests_seconds=hi * 60 + 1) == [
        f"the test command took {hi * 60 + 1} s in this CI run, outside the README's {lo}-{hi} minutes"
    ]
    durations = json.loads((root / "docs/durations.json").read_text())
    durations["tests"]["seconds"] = hi * 60 + 100
    (root / "docs/durations.json").write_text(json.dumps(durations))
    assert any(f"{hi * 60 + 100} s in docs/durations.json" in p for p in _check(root))


def test_a_generated_page_edited_by_hand_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    page = root / "docs/benchmarks.md"
    text = page.read_text()
    page.write_text(text.replace("**met**", "**missed**", 1))
    assert _check(root) == [
        "docs/benchmarks.md: the region 'benchmarks-targets' differs from what docs/benchmarks.json renders"
    ]
    split = root / "docs/split.md"
    split.write_text(split.read_text().replace("x |", "0x |", 1))
    assert "docs/split.md: the region 'split' differs from what docs/split.json renders" in _check(root)


def _prose(text: str, page: str) -> str:
    """``text`` (``page``'s) with every region emptied: what the page says in its own words."""
    for region in figures.REGIONS:
        if region.page == page:
            for start, end in reversed(figures.spans(text, region.name)):
                text = text[:start] + text[end:]
    return text


def test_every_region_is_regenerated_from_its_json_alone(tmp_path: Path) -> None:
    """Every region emptied, ``--write`` fills each page back byte for byte from the committed JSON."""
    root = _copy(tmp_path)
    pages = sorted({r.page for r in figures.REGIONS})
    for page in pages:
        (root / page).write_text(_prose((root / page).read_text(), page))
    assert sorted(figures.write(root)) == pages
    for page in pages:
        assert (root / page).read_text() == (ROOT / page).read_text()
    assert _check(root) == []


def test_a_new_run_changes_its_tables_not_the_prose(tmp_path: Path) -> None:
    """A bench's JSON regenerated (here a figure of the witness's cost, and of the benchmark grid, changed
    in copies): ``--check`` fails until ``--write`` renders the tables anew; the prose stays as it was."""
    root = _copy(tmp_path)
    witness = json.loads((root / "docs/witness.json").read_text())
    witness["rows"][0]["check"]["cost_ms"] = 0.5
    witness["rounds"] = 7
    (root / "docs/witness.json").write_text(json.dumps(witness))
    bench = json.loads((root / "docs/benchmarks.json").read_text())
    bench["rows"][0]["seconds"]["torch_impl"] = 0.123
    (root / "docs/benchmarks.json").write_text(json.dumps(bench))
    before = {page: (root / page).read_text() for page in ("docs/witness.md", "docs/benchmarks.md")}
    assert _check(root) == [
        "docs/benchmarks.md: the region 'benchmarks-grid' differs from what docs/benchmarks.json renders",
        "docs/witness.md: the region 'witness-cost' differs from what docs/witness.json renders",
    ]
    assert figures.write(root) == ["docs/benchmarks.md", "docs/witness.md"]
    assert _check(root) == []
    after = {page: (root / page).read_text() for page in before}
    assert "| +0.5000 | 1.000x, -0.0001 ms | within 0.02 ms: NOT met |" in after["docs/witness.md"]
    assert "today a610a76, 7 rounds" in after["docs/witness.md"]
    assert "| 8 | 16 | 1 | 1 | float32 | 2-D | 123 |" in after["docs/benchmarks.md"]
    for page, text in before.items():
        assert after[page] != text
        assert _prose(after[page], page) == _prose(text, page)


def test_a_region_needs_both_markers(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    split = root / "docs/split.md"
    split.write_text(split.read_text().replace("<!-- /split -->\n", ""))
    assert _check(root) == [
        "docs/split.md: the region 'split' opened at "
        f"{split.read_text().index('<!-- split:')} is not closed before the next"
    ]
    split.write_text(
        split.read_text().replace("<!-- split: rendered by python -m rebatch.figures", "<!-- gone")
    )
    assert _check(root) == ["docs/split.md: no region 'split' (its markers: <!-- split -->)"]


def test_the_anchor_finds_a_figure_whatever_its_numbers() -> None:
    found = figures.anchor("7.6x verl at 1,024 rows").search("was 14.0x verl\nat 16,384 rows.")
    assert found is not None
    assert found.group(0) == "14.0x verl\nat 16,384 rows"


def test_a_new_measured_figure_in_the_readme_needs_a_source(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    readme = root / "README.md"
    readme.write_text(
        readme.read_text().replace("## Switch it off", "It starts in 3.5 ms.\n\n## Switch it off")
    )
    assert [p.split(":", 2)[2] for p in _check(root)] == [
        " '3.5 ms' is tied to no source (rebatch.figures.FIGURES)"
    ]


def _reports_like_the_page(tmp_path: Path) -> list[dict[str, object]]:
    """Trainers' reports holding what docs/peers.md states (its outcomes aside), one JSON file each."""
    text = (ROOT / "docs/peers.md").read_text()
    reports = []
    for label, torch_v, python_v, cases, differences, props in figures._table(text, "Differential"):
        speed = [
            {**{k: r[k] for k in ("B", "mean_length", "M", "theirs_ms", "ours_ms", "speedup")}, "same": None}
            for r in figures.speed_rows(ROOT)
            if r["trainer"] == label
        ]
        reports.append(
            {
                "name": label.split()[0].lower(),
                "label": label,
                "torch": torch_v,
                "python": python_v,
                "differential": {"cases": int(cases), "differences": [{}] * int(differences)},
                "properties": {p.split(":")[0]: None for p in props.split(", ")},
                "defects": [],
                "speed": speed,
            }
        )
    return reports


def _saved(tmp_path: Path, reports: list[dict[str, object]]) -> list[str]:
    paths = []
    for r in reports:
        path = tmp_path / f"{r['name']}.json"
        path.write_text(json.dumps(r))
        paths.append(str(path))
    return paths


def test_peers_md_against_ci_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CI's trainers lane checks docs/peers.md's calls drawn, differences, properties, sizes and verdicts
    against its fresh reports (not the times: printed beside the stated ones)."""
    reports = _reports_like_the_page(tmp_path)
    assert [r["name"] for r in reports] == list(names())  # every declared trainer, in the registry's order
    assert figures.peers_against_reports(ROOT, _saved(tmp_path, reports)) == []
    first = figures.speed_rows(ROOT)[0]["speedup"]
    assert f"stated {first:.1f}x, this run {first:.1f}x" in capsys.readouterr().out  # shown, not checked
    reports[1]["differential"] = {"cases": 400, "differences": []}
    problems = figures.peers_against_reports(ROOT, _saved(tmp_path, reports))
    assert problems == [
        f"docs/peers.md: its 'Differential' table differs from the reports {_saved(tmp_path, reports)} "
        "(regenerate it)"
    ]
    reports = _reports_like_the_page(tmp_path)
    reports[2]["speed"][0]["same"] = "row 3 differs"  # type: ignore[index]
    assert len(figures.peers_against_reports(ROOT, _saved(tmp_path, reports))) == 1
