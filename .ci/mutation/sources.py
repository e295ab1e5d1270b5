"""Keep a session's database in step with its sources, module by module.

    python .ci/mutation/sources.py SESSION.toml SESSION.sqlite      (run by .ci/mutation/run)

cosmic-ray stores each mutant by module, line and column, so results are only valid for the sources they
were measured on. ``SESSION.sqlite.sum`` records a hash of each module. When some modules change, the
session is initialised afresh and the results of the modules that did not change are carried over (a
mutant is the same mutant when its module, operator, arguments and occurrence are): only the changed
modules are measured again. A database without per-module hashes is measured afresh.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import tomllib

MUTANT = ("module_path", "operator_name", "operator_args", "occurrence")
RESULT = ("worker_outcome", "output", "test_outcome", "diff")


def module_sums(paths: list[str]) -> dict[str, str]:
    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest()[:16] for p in paths}


def read_sums(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    pairs = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return {p[0]: p[1] for p in pairs if len(p) == 2}  # the older one-hash format has no pairs


def write_sums(path: Path, sums: dict[str, str]) -> None:
    path.write_text("".join(f"{p} {h}\n" for p, h in sorted(sums.items())))


def carry_over(old: Path, new: Path, modules: set[str]) -> int:
    """Copy into ``new`` the results ``old`` holds for mutants of ``modules``; returns how many."""
    src, dst = sqlite3.connect(old), sqlite3.connect(new)
    cols = ", ".join(f"m.{c}" for c in MUTANT) + ", " + ", ".join(f"w.{c}" for c in RESULT)
    rows = src.execute(
        f"SELECT {cols} FROM work_results w JOIN mutation_specs m ON w.job_id = m.job_id"
    ).fetchall()
    where = " AND ".join(f"{c} IS ?" for c in MUTANT)
    n = 0
    for row in rows:
        if row[0] not in modules:
            continue
        found = dst.execute(f"SELECT job_id FROM mutation_specs WHERE {where}", row[: len(MUTANT)]).fetchone()
        if found:
            dst.execute(
                f"INSERT OR REPLACE INTO work_results (job_id, {', '.join(RESULT)}) VALUES (?, ?, ?, ?, ?)",
                (found[0], *row[len(MUTANT) :]),
            )
            n += 1
    dst.commit()
    return n


def main(cfg: str, db_name: str) -> None:
    db, sum_path = Path(db_name), Path(db_name + ".sum")
    modules = tomllib.loads(Path(cfg).read_text())["cosmic-ray"]["module-path"]
    now, before = module_sums(modules), read_sums(sum_path)
    if db.exists() and now == before:
        return
    fresh = db.with_suffix(".new.sqlite")
    fresh.unlink(missing_ok=True)
    subprocess.run(["cosmic-ray", "init", cfg, str(fresh)], check=True)
    if db.exists():
        kept = {p for p in modules if before.get(p) == now[p]}
        changed = sorted(set(modules) - kept)
        n = carry_over(db, fresh, kept)
        print(f"   changed since the last run: {', '.join(changed)} (measured afresh); {n} results kept")
    os.replace(fresh, db)
    write_sums(sum_path, now)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
