"""Forget the survivors of a cosmic-ray session, so that the next ``exec`` tests them again (after a new
test was written to kill them).  ``bash .ci/mutation/run --retry-survivors SESSION`` calls this.

    python .ci/mutation/retry_survivors.py SESSION.sqlite
"""

from __future__ import annotations

import sqlite3
import sys


def main(session: str) -> int:
    with sqlite3.connect(session) as db:
        n = db.execute("DELETE FROM work_results WHERE test_outcome = 'SURVIVED'").rowcount
    print(f"   {n} survivors to test again")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
