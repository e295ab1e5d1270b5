"""``rebatch report PATH...``: the reports of many processes (shadow and ``on`` mode), in one short table.

Each process of a run writes its own report (``REBATCH_REPORT_DIR``: one
``rebatch-TRAINER-HOST-RUN-PID.json`` a process, `rebatch_startup._names.REPORT_NAME`; shadow mode's
`torch_impl.integrations._shadow.Shadow.stats`, ``on`` mode's `torch_impl.integrations._counts.Counts.stats`);
this reads files and directories of them and prints, per trainer, function and mode, the processes,
calls, sampled calls, differences, defects, rebatch's other errors, the seconds of both functions and
the rows, then a total line and one line of what the checks did, summed over the reports: the alignment
witness's and provenance's counters, every check skipped by reason, every exception caught (not raised)
by reason (each non-zero count).

A report is untrusted input: each is validated (`validate`) before anything is summed: an object whose
``by_name`` maps names to counters that are integers in ``[0, 2**63)`` (never a bool, a float, NaN or
a string: a negative count cannot cancel a real one), seconds that are finite and not negative, no
deeper than a report is. A directory is scanned without recursing, and only its regular files named as
rebatch names its reports are read (a symlink, a FIFO, a device, another name are skipped and said on
stderr); every file is read with a bounded read (`MAX_BYTES`), without blocking on a FIFO.

Exit codes (each means one thing): 0 every report clean; 1 a report counts a difference or a defect (a
CI job can gate on it); 2 anything that cannot be read as a report (no report found, a path that is not
one, a file that is not valid JSON or not a report's shape).
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from collections.abc import Sequence
from typing import Any

from rebatch_startup._names import REPORT_NAME

__all__ = ["MAX_BYTES", "ReportError", "load", "main", "table", "validate"]

_COUNTS = ("calls", "sampled", "differences", "defects", "errors")
#: Counters a report may hold besides `_COUNTS` (``on`` mode's), each an integer too.
_OTHER_COUNTS = ("rows", "keys_witnessed")
#: The most bytes `load` reads of one file.
MAX_BYTES = 16 << 20
_MAX_COUNT = 1 << 63


class ReportError(Exception):
    """A path that is not a report (or holds none): exit code 2."""


def _files(paths: Sequence[str]) -> list[str]:
    """The files to read: each file named, and each directory's files named as reports; what a scan
    skipped is said on stderr."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found, skipped = [], []
            with os.scandir(path) as entries:
                for entry in sorted(entries, key=lambda e: e.name):
                    if not REPORT_NAME.fullmatch(entry.name):
                        skipped.append(f"{entry.name} (not a report's name)")
                    elif entry.is_symlink():
                        skipped.append(f"{entry.name} (a symlink)")
                    elif not entry.is_file(follow_symlinks=False):
                        skipped.append(f"{entry.name} (not a regular file)")
                    else:
                        found.append(entry.path)
            if skipped:
                more = f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""
                print(f"rebatch report: {path}: skipped {', '.join(skipped[:10])}{more}", file=sys.stderr)
            if not found:
                raise ReportError(f"{path}: a directory without reports (rebatch-TRAINER-HOST-RUN-PID.json)")
            files += found
        elif os.path.exists(path):
            files.append(path)
        else:
            raise ReportError(f"{path}: no such file or directory")
    return files


def _read(path: str, *, follow: bool) -> bytes:
    """At most `MAX_BYTES` of regular file ``path`` (a FIFO or device refused without blocking; a
    symlink refused unless ``follow``)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise ReportError(f"{path}: cannot open ({err.strerror or err})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReportError(f"{path}: not a regular file")
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_BYTES:
            raise ReportError(f"{path}: over {MAX_BYTES} bytes: not a report")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a report holds")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _parse(path: str, raw: bytes) -> Any:
    try:
        return json.loads(raw, parse_constant=_constant, parse_float=_finite)
    except RecursionError:
        raise ReportError(f"{path}: nested too deep: not a report") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ReportError(f"{path}: not readable as JSON ({err})") from None


def _count(path: str, where: str, value: Any) -> int:
    if type(value) is not int or not 0 <= value < _MAX_COUNT:
        raise ReportError(f"{path}: {where} must be a count (an integer >= 0), got {value!r:.40}")
    return value


def _seconds(path: str, where: str, value: Any) -> float:
    if type(value) not in (int, float) or not 0 <= value < math.inf:
        raise ReportError(f"{path}: {where} must be seconds (a finite number >= 0), got {value!r:.40}")
    return float(value)


def validate(report: Any, path: str) -> dict[str, Any]:
    """``report`` (parsed JSON) checked as a report, reduced to what `table` reads: ``trainer``,
    ``version``, ``mode``, ``process`` and ``by_name`` (each name's counts and seconds); `ReportError`
    naming the path and the first wrong field otherwise."""
    if not isinstance(report, dict) or not isinstance(report.get("by_name"), dict):
        raise ReportError(f"{path}: not a rebatch report (an object with by_name)")
    trainer = report.get("trainer", "verl")
    version = report.get("version")
    mode = report.get("mode", "shadow")
    if not isinstance(trainer, str) or not isinstance(version, str | None) or mode not in ("shadow", "on"):
        raise ReportError(f"{path}: trainer, version or mode is not a report's (mode: shadow or on)")
    process = report.get("process", {})
    if not isinstance(process, dict):
        raise ReportError(f"{path}: process must be an object")
    pid, host, run = process.get("pid", path), process.get("host", "?"), process.get("run", "")
    if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in (pid, host, run)):
        raise ReportError(f"{path}: process.pid, host and run must be strings or integers")
    by_name: dict[str, dict[str, float]] = {}
    for name, c in report["by_name"].items():
        if not isinstance(c, dict):
            raise ReportError(
                f"{path}: by_name[{name!r}] must be an object of counts, got {type(c).__name__}"
            )
        counts: dict[str, float] = {}
        for f in ("calls", "errors"):
            counts[f] = _count(path, f"by_name[{name!r}].{f}", c.get(f))
        for f in (*_COUNTS[1:4], *_OTHER_COUNTS):
            counts[f] = _count(path, f"by_name[{name!r}].{f}", c.get(f, 0))
        trainer_s = c.get("trainer_seconds", c.get("verl_seconds", 0.0))
        counts["trainer_s"] = _seconds(path, f"by_name[{name!r}].trainer_seconds", trainer_s)
        counts["rebatch_s"] = _seconds(
            path, f"by_name[{name!r}].rebatch_seconds", c.get("rebatch_seconds", 0.0)
        )
        by_name[str(name)] = counts
    return {
        "path": path,
        "trainer": trainer,
        "version": version,
        "mode": mode,
        "process": f"{host}:{run}:{pid}",
        "by_name": by_name,
        "checks": _checks(report, path),
    }


def _checks(report: dict[str, Any], path: str) -> dict[str, int]:
    """What the process's checks did beyond the table's columns, each a count: the witness's and
    provenance's counters and every skip by reason (``witness``: `torch_impl.witness_stats`), and each
    exception caught and not raised, by reason (``caught``); absent ones are none."""
    checks: dict[str, int] = {}
    for field, prefix in (("witness", ""), ("caught", "caught: ")):
        counters = report.get(field, {})
        if not isinstance(counters, dict):
            raise ReportError(f"{path}: {field} must be an object of counts, got {type(counters).__name__}")
        for name, value in counters.items():
            checks[f"{prefix}{name}"] = _count(path, f"{field}[{str(name)[:60]!r}]", value)
    return checks


def load(paths: Sequence[str]) -> list[dict[str, Any]]:
    """The reports in ``paths`` (files, or directories of reports), each validated (`validate`)."""
    named = set(paths)
    reports = [validate(_parse(path, _read(path, follow=path in named)), path) for path in _files(paths)]
    if not reports:
        raise ReportError("no report given")
    return reports


def table(reports: Sequence[dict[str, Any]]) -> tuple[str, bool]:
    """``(the table, clean)``: one row per trainer, function and mode, and a total; ``clean`` is False
    when a report counts a difference or a defect. ``reports``: as `load` gives them."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for report in reports:
        trainer = f"{report['trainer']} {report['version'] or ''}".strip()
        for name, c in report["by_name"].items():
            row = rows.setdefault((trainer, name, report["mode"]), {"processes": set()})
            row["processes"].add(report["process"])
            for f, v in c.items():
                row[f] = row.get(f, 0) + v
    head = ["trainer", "function", "processes", *_COUNTS, "trainer s", "rebatch s", "rows", "mode"]
    lines = [head]
    total = dict.fromkeys(_COUNTS, 0)
    for (trainer, name, mode), row in sorted(rows.items()):
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
                str(row["rows"]),
                mode,
            ]
        )
    processes = {r["process"] for r in reports}
    lines.append(["total", "", str(len(processes)), *(str(total[f]) for f in _COUNTS), "", "", "", ""])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )
    clean = total["differences"] == 0 and total["defects"] == 0
    verdict = (
        "clean: no difference, no defect"
        if clean
        else (f"NOT CLEAN: {total['differences']} difference(s), {total['defects']} defect(s)")
    )
    checks: dict[str, int] = {}
    for report in reports:
        for name, n in report["checks"].items():
            checks[name] = checks.get(name, 0) + n
    said = ", ".join(f"{name} {n}" for name, n in sorted(checks.items()) if n)
    return (
        f"{text}\nchecks (all reports): {said or 'none counted'}\n{len(reports)} report(s); {verdict}",
        clean,
    )


def main(paths: Sequence[str]) -> int:
    """Print the table of the reports in ``paths``; 1 on a difference or a defect, 0 clean, 2 anything
    that is not a report."""
    try:
        text, clean = table(load(paths))
    except ReportError as err:
        print(f"rebatch report: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0 if clean else 1
