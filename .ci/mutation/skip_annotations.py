"""cosmic-ray filter: mark as SKIPPED every mutant that lies wholly inside a type annotation.

Every module of ``ref/`` and ``torch_impl/`` starts with ``from __future__ import annotations``, so an
annotation is a string the program never evaluates: ``int | None`` mutated to ``int // None`` (a dozen
mutants per ``|``) is an equivalent mutant by construction. A module without that import is left alone.

    python .ci/mutation/skip_annotations.py SESSION.sqlite      (run by .ci/mutation/run after init)
"""

from __future__ import annotations

import ast
import sys
from functools import lru_cache
from pathlib import Path

from cosmic_ray.work_db import use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult

Span = tuple[tuple[int, int], tuple[int, int]]


@lru_cache
def annotation_spans(path: Path) -> list[Span]:
    """(start, end) of each annotation of the module, as (1-based line, 0-based column)."""
    tree = ast.parse(path.read_text())
    future = any(
        isinstance(n, ast.ImportFrom)
        and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    )
    if not future:
        return []
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            found.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
    return [((a.lineno, a.col_offset), (a.end_lineno or a.lineno, a.end_col_offset or 0)) for a in found]


def inside(start: tuple[int, int], end: tuple[int, int], spans: list[Span]) -> bool:
    return any(s <= start and end <= e for s, e in spans)


def main(session: str) -> int:
    skipped = 0
    with use_db(session) as db:
        for item in db.pending_work_items:
            if all(
                inside(tuple(m.start_pos), tuple(m.end_pos), annotation_spans(Path(m.module_path)))
                for m in item.mutations
            ):
                db.set_result(
                    item.job_id,
                    WorkResult(
                        output=None, test_outcome=None, diff=None, worker_outcome=WorkerOutcome.SKIPPED
                    ),
                )
                skipped += 1
    print(f"   {skipped} mutants inside annotations skipped (equivalent: annotations are never evaluated)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
