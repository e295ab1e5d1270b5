"""Per session: mutants in all, skipped as equivalent (inside annotations), run, killed, surviving, not run.

python .ci/mutation/score.py [SESSION ...]      (default: every session of .ci/mutation/*.toml)
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

STATE = Path(".cache/mutation")


def score(db: Path) -> tuple[int, int, int, int, int]:
    with sqlite3.connect(db) as c:
        total = c.execute("SELECT count(*) FROM mutation_specs").fetchone()[0]
        rows = dict(
            c.execute(
                "SELECT coalesce(test_outcome, worker_outcome), count(*) FROM work_results GROUP BY 1"
            ).fetchall()
        )
    return (
        total,
        rows.get("SKIPPED", 0),
        rows.get("KILLED", 0),
        rows.get("SURVIVED", 0),
        rows.get("INCOMPETENT", 0),
    )


def main(names: list[str]) -> int:
    names = names or sorted(p.stem for p in Path(".ci/mutation").glob("*.toml"))
    dbs = [STATE / f"{n}.sqlite" for n in names]
    print(
        "| session | mutants | in annotations (skipped) | run | killed | surviving | incompetent | not run |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for db in dbs:
        if not db.exists():
            print(f"| `{db.stem}` | - | - | 0 | - | - | - | all (not initialised) |")
            continue
        total, skipped, killed, survived, incompetent = score(db)
        run = killed + survived + incompetent
        print(
            f"| `{db.stem}` | {total} | {skipped} | {run} | {killed} | {survived} | {incompetent} "
            f"| {total - skipped - run} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
