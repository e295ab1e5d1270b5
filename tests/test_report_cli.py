"""``rebatch report``: exit codes that mean one thing each (issue 42, item 4).

0 clean, 1 a difference or a defect, 2 anything that cannot be read as a report: wrong shapes or types,
counts that are negative, non-integer, bool, NaN or huge, an entry that is an int, deep nesting, an
unrelated file named on the command line. A directory scan reads only regular files named as rebatch
names its reports, with a size cap, and says what it skipped (a FIFO does not hang it; a link to
``/dev/zero`` is not read). Every reproduction here fails on b383f49."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rebatch.report import MAX_BYTES, main

ROOT = Path(__file__).resolve().parent.parent


def _name(trainer: str = "areal", pid: int = 1) -> str:
    return f"rebatch-{trainer}-host-20260101T000000Z-0000abcd-{pid}.json"


def _entry(**counts: Any) -> dict[str, Any]:
    return {
        "calls": 1,
        "sampled": 1,
        "differences": 0,
        "defects": 0,
        "errors": 0,
        "trainer_seconds": 0.5,
        "rebatch_seconds": 0.25,
        **counts,
    }


def _report(path: Path, pid: int = 1, mode: str = "shadow", **counts: Any) -> Path:
    path.write_text(
        json.dumps(
            {
                "trainer": "areal",
                "version": "1.0.4",
                "mode": mode,
                "by_name": {"reorder_and_pad_outputs": _entry(**counts)},
                "process": {"pid": pid, "host": "h", "run": "r"},
            }
        )
    )
    return path


def test_clean_and_dirty(tmp_path: Path, capsys) -> None:
    assert main([str(_report(tmp_path / _name(pid=1)))]) == 0
    assert main([str(_report(tmp_path / _name(pid=2), pid=2, defects=1))]) == 1
    assert main([str(tmp_path)]) == 1
    assert "NOT CLEAN: 0 difference(s), 1 defect(s)" in capsys.readouterr().out


BAD = {
    "a string count": '"abc"',
    "null": "null",
    "NaN": "NaN",
    "Infinity": "Infinity",
    "a huge float": "1e400",
    "a float": "1.5",
    "a bool": "true",
    "negative": "-1",
    "huge": str(1 << 64),
}


@pytest.mark.parametrize("value", list(BAD.values()), ids=list(BAD))
def test_a_count_that_is_not_a_count_is_exit_2(tmp_path: Path, capsys, value: str) -> None:
    path = tmp_path / _name()
    entry = json.dumps(_entry()).replace('"calls": 1', f'"calls": {value}')
    path.write_text(f'{{"trainer": "areal", "by_name": {{"f": {entry}}}}}')
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rebatch report: ")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "text",
    [
        '{"by_name": {"f": 7}}',  # an entry that is an int
        '{"by_name": []}',
        '{"by_name": {"f": {"calls": 1, "errors": 0, "trainer_seconds": "x"}}}',
        '{"by_name": {}, "trainer": 3}',
        '{"by_name": {}, "mode": "turbo"}',
        '{"by_name": {}, "process": [1]}',
        "[" * 100_000 + "]" * 100_000,  # nesting deeper than the JSON parser's recursion
        '{"by_name": {"f": ' + "[" * 100_000 + "]" * 100_000 + "}}",
    ],
    ids=[
        "int-entry",
        "list-by-name",
        "string-seconds",
        "int-trainer",
        "bad-mode",
        "list-process",
        "deep",
        "deep-entry",
    ],
)
def test_a_file_of_the_wrong_shape_is_exit_2(tmp_path: Path, capsys, text: str) -> None:
    path = tmp_path / _name()
    path.write_text(text)
    assert main([str(path)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_negative_counts_never_cancel_real_ones(tmp_path: Path) -> None:
    """b383f49: ``differences: -5`` beside ``5`` summed to 0, clean, exit 0."""
    _report(tmp_path / _name(pid=1), pid=1, differences=5)
    _report(tmp_path / _name(pid=2), pid=2, differences=-5)
    assert main([str(tmp_path)]) == 2


def test_an_unrelated_file_named_on_the_command_line_is_exit_2(tmp_path: Path, capsys) -> None:
    assert main([str(ROOT / "README.md")]) == 2
    assert main([str(ROOT / "pyproject.toml")]) == 2
    (tmp_path / "package.json").write_text('{"name": "x", "by_name": {"a": {"b": 1}}}')
    assert main([str(tmp_path / "package.json")]) == 2
    assert main(["/dev/null"]) == 2
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_BYTES + 1))
    assert main([str(big)]) == 2
    assert "over" in capsys.readouterr().err


def test_skips_and_caught_exceptions_are_summed_by_reason(tmp_path: Path, capsys) -> None:
    """The checks' line: every skip and caught exception by reason, summed over the reports; a counter
    that is not a count is exit 2, as in the table."""
    for pid in (1, 2):
        path = _report(tmp_path / _name(pid=pid), pid=pid)
        report = json.loads(path.read_text())
        report["witness"] = {
            "calls_without_witness": pid,
            "skipped_device_offsets": 0,
            "provenance_calls_proven": 3,
        }
        report["caught"] = {"postprocess_batch_func: shadow RuntimeError": 1}
        path.write_text(json.dumps(report))
    assert main([str(tmp_path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("checks"))
    assert line == (
        "checks (all reports): calls_without_witness 3, caught: postprocess_batch_func: shadow RuntimeError "
        "2, provenance_calls_proven 6"
    ), line
    report["witness"] = {"calls_without_witness": -1}
    path.write_text(json.dumps(report))
    assert main([str(tmp_path)]) == 2
    assert "witness['calls_without_witness'] must be a count" in capsys.readouterr().err


def test_on_mode_reports_are_read_and_shown(tmp_path: Path, capsys) -> None:
    _report(tmp_path / _name(pid=1), pid=1, mode="on", rows=8, keys_witnessed=2, sampled=0)
    _report(tmp_path / _name(pid=2), pid=2)
    assert main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-2:] == ["rows", "mode"]
    modes = sorted(line.split()[-1] for line in lines[1:3])
    assert modes == ["on", "shadow"]


#: ``python -m rebatch`` in a process of at most 1 GiB of memory (set inside it: no ``preexec_fn``, whose
#: fork would run this process's fork handlers).
LIMITED = (
    "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
    "sys.argv[0] = 'rebatch'; runpy.run_module('rebatch', run_name='__main__')"
)


def _cli(*paths: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``rebatch report PATHS`` in a process of at most 1 GiB of memory."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", LIMITED, "report", *paths],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.skipif(
    not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="no FIFOs or /dev/zero"
)
def test_a_directory_scan_reads_only_regular_report_files_and_says_what_it_skipped(tmp_path: Path) -> None:
    """A FIFO named like a report (b383f49: hung), a link to /dev/zero (b383f49: read until memory ran
    out), a link to a report, a dump and another JSON file: skipped, said on stderr; the real report read."""
    _report(tmp_path / _name(pid=1), pid=1)
    os.mkfifo(tmp_path / _name(pid=2))
    (tmp_path / _name(pid=3)).symlink_to("/dev/zero")
    (tmp_path / _name(pid=4)).symlink_to(tmp_path / _name(pid=1))
    (tmp_path / "notes.json").write_text("{}")
    (tmp_path / "rebatch-dump-areal-host-20260101T000000Z-0000abcd-1.pt").write_bytes(b"PK")
    done = _cli(str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "1 report(s); clean" in done.stdout
    assert "Traceback" not in done.stderr
    for name, why in (
        (_name(pid=2), "not a regular file"),
        (_name(pid=3), "a symlink"),
        (_name(pid=4), "a symlink"),
        ("notes.json", "not a report's name"),
    ):
        assert f"{name} ({why})" in done.stderr, done.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_a_fifo_or_a_device_named_on_the_command_line_is_exit_2_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.json")
    done = _cli(str(tmp_path / "fifo.json"), "/dev/zero")
    assert done.returncode == 2, done.stderr
    assert "not a regular file" in done.stderr
