"""``rebatch report PATH...``: shadow mode's reports of many processes, in one short table.

Each process of a shadow run writes its own report (``REBATCH_REPORT_DIR``: one
``rebatch-TRAINER-HOST-PID.json`` a process, `torch_impl.integrations._shadow.Shadow.stats`); this reads
files and directories of them (``*.json`` in a directory, not recursing) and prints, per trainer and
function, the processes, calls, sampled calls, differences, defects, rebatch's other errors and the
seconds of both functions, then a total line. Exit 1 when any report counts a difference or a defect
(a CI job can gate on it), 0 when all are clean, 2 when there is no report to read or a file is not one.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["load", "main", "table"]

_COUNTS = ("calls", "sampled", "differences", "defects", "errors")


class ReportError(Exception):
    """A path that is not a shadow report (or holds none)."""


def _files(paths: Sequence[str]) -> list[str]:
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(glob.glob(os.path.join(path, "*.json")))
            if not found:
                raise ReportError(f"{path}: a directory without reports (*.json)")
            files += found
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise ReportError(f"{path}: no such file or directory")
    return files


def load(paths: Sequence[str]) -> list[dict[str, Any]]:
    """The reports in ``paths`` (files, or directories of ``*.json``), each with its ``"path"``."""
    reports = []
    for path in _files(paths):
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, ValueError) as err:
            raise ReportError(f"{path}: not readable as JSON ({err})") from None
        if not isinstance(report, dict) or not isinstance(report.get("by_name"), dict):
            raise ReportError(f"{path}: not a rebatch shadow report (no by_name)")
        report["path"] = path
        reports.append(report)
    if not reports:
        raise ReportError("no report given")
    return reports


def _process(report: dict[str, Any]) -> str:
    process = report.get("process") or {}
    return f"{process.get('host', '?')}:{process.get('pid', report['path'])}"


def table(reports: Sequence[dict[str, Any]]) -> tuple[str, bool]:
    """``(the table, clean)``: one row per trainer and function, and a total; ``clean`` is False when a
    report counts a difference or a defect."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for report in reports:
        trainer = f"{report.get('trainer', 'verl')} {report.get('version') or ''}".strip()
        for name, c in report["by_name"].items():
            row = rows.setdefault((trainer, name), {"processes": set(), "trainer_s": 0.0, "rebatch_s": 0.0})
            row["processes"].add(_process(report))
            for f in _COUNTS:
                row[f] = row.get(f, 0) + int(c.get(f, 0))
            row["trainer_s"] += float(c.get("trainer_seconds", c.get("verl_seconds", 0.0)))
            row["rebatch_s"] += float(c.get("rebatch_seconds", 0.0))
    head = ["trainer", "function", "processes", *_COUNTS, "trainer s", "rebatch s"]
    lines = [head]
    total = dict.fromkeys(_COUNTS, 0)
    for (trainer, name), row in sorted(rows.items()):
        for f in _COUNTS:
            total[f] += row[f]
        lines.append(
            [
                trainer,
                name,
                str(len(row["processes"])),
                *(str(row[f]) for f in _COUNTS),
                f"{row['trainer_s']:.3f}",
                f"{row['rebatch_s']:.3f}",
            ]
        )
    processes = {_process(r) for r in reports}
    lines.append(["total", "", str(len(processes)), *(str(total[f]) for f in _COUNTS), "", ""])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)
    clean = total["differences"] == 0 and total["defects"] == 0
    verdict = (
        "clean: no difference, no defect"
        if clean
        else (f"NOT CLEAN: {total['differences']} difference(s), {total['defects']} defect(s)")
    )
    return f"{text}\n{len(reports)} report(s); {verdict}", clean


def main(paths: Sequence[str]) -> int:
    """Print the table of the reports in ``paths``; 1 on a difference or a defect, 0 clean, 2 unusable."""
    import sys

    try:
        text, clean = table(load(paths))
    except ReportError as err:
        print(f"rebatch report: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0 if clean else 1
