"""Nothing silent: every handler of ``Exception`` (or ``BaseException``, or a bare ``except:``, or
``contextlib.suppress`` of one) in ``torch_impl/``, ``rebatch_startup/`` and ``rebatch/`` re-raises (a
``raise`` in its body) or is listed in `RECORDED` with where what it caught goes (counted, logged once,
reported). A new one that does neither fails here, and so does an entry no longer in the code."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torch_impl", "rebatch_startup", "rebatch")
_BROAD = {"Exception", "BaseException"}

#: (file, enclosing function) -> where what its broad handler catches goes, for those that do not re-raise.
RECORDED: dict[tuple[str, str], str] = {
    ("torch_impl/_compare.py", "_same"): "a comparison that raises is a difference, its error in the message",
    (
        "torch_impl/_distributed.py",
        "broadcast_from_last_stage",
    ): "handed to raise_first_failure: raised on every rank",
    ("torch_impl/_distributed.py", "gather_batch"): "handed to agree(): raised on every rank",
    (
        "torch_impl/integrations/_shadow.py",
        "_keys",
    ): "said in the defect's ERROR line (its keys unreadable: ...)",
    ("torch_impl/integrations/_shadow.py", "Shadow._guarded"): "counted (errors, caught), a WARNING once",
    ("torch_impl/integrations/_shadow.py", "Shadow.wrap.shadowed"): "Shadow._before: counted, logged once",
    ("torch_impl/integrations/_counts.py", "Counts._count"): "counted (caught: rows of NAME), a WARNING once",
    ("torch_impl/integrations/_counts.py", "Counts.write_report"): "counted (caught: report), a WARNING once",
    ("torch_impl/integrations/_files.py", "_final_reports"): "a WARNING, once a report, at exit",
    (
        "rebatch_startup/__init__.py",
        "startup",
    ): "one line on stderr a trainer (at start: nothing to raise from)",
    ("rebatch/check.py", "_dump_check"): "the report's candidate_error, printed, and agree false",
    ("rebatch/bench/run.py", "verl_function"): "verl reported absent in the benchmark's results",
    ("rebatch/bench/cuda_check.py", "main"): "a FAIL line, the section's error in --out, the run's exit 1",
}


def _broad(node: ast.expr | None) -> bool:
    if node is None:  # a bare ``except:``
        return True
    names = node.elts if isinstance(node, ast.Tuple) else [node]
    return any(isinstance(n, ast.Name) and n.id in _BROAD for n in names)


def _handlers(path: Path) -> list[tuple[str, int, bool]]:
    """``(enclosing function, line, re-raises)`` of each broad handler in ``path``."""
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = (*scope, child.name)
            where = ".".join(scope) or "<module>"
            if isinstance(child, ast.ExceptHandler) and _broad(child.type):
                raises = any(isinstance(n, ast.Raise) for stmt in child.body for n in ast.walk(stmt))
                found.append((where, child.lineno, raises))
            elif isinstance(child, ast.With):  # ``with contextlib.suppress(Exception):`` re-raises nothing
                for item in child.items:
                    call = item.context_expr
                    if (
                        isinstance(call, ast.Call)
                        and getattr(call.func, "attr", getattr(call.func, "id", "")) == "suppress"
                        and any(_broad(a) for a in call.args)
                    ):
                        found.append((where, child.lineno, False))
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), ())
    return found


def test_every_broad_handler_reraises_or_records_what_it_caught() -> None:
    silent: list[str] = []
    listed: set[tuple[str, str]] = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for scope, line, raises in _handlers(path):
                if raises:
                    continue
                if (rel, scope) in RECORDED:
                    listed.add((rel, scope))
                else:
                    silent.append(f"{rel}:{line} in {scope}")
    assert not silent, f"broad handlers that neither re-raise nor are listed in RECORDED: {silent}"
    assert listed == set(RECORDED), f"listed but no longer in the code: {set(RECORDED) - listed}"


def test_the_scan_finds_a_new_silent_handler(tmp_path: Path) -> None:
    """The scan itself: a handler that turns an error into a default is found; one that re-raises is not."""
    source = tmp_path / "m.py"
    source.write_text(
        "import contextlib\ndef rows(x):\n    try:\n        return len(x)\n    except Exception:\n        "
        "return 0\ndef typed(x):\n    try:\n        return len(x)\n    except (TypeError, BaseException) as "
        "err:\n        raise ValueError(x) from err\nclass C:\n    def quiet(self):\n        with "
        "contextlib.suppress(Exception):\n            pass\n"
    )
    assert _handlers(source) == [("rows", 5, False), ("typed", 10, True), ("C.quiet", 14, False)]


def test_a_row_count_that_fails_is_counted_and_said_once(records: list[logging.LogRecord]) -> None:
    """``on`` mode's rows of a call whose rule raises: 0 rows, and the error counted under ``caught`` and
    logged once as a WARNING (before: silently 0)."""
    from torch_impl.integrations._counts import Counts

    counts = Counts("verl", None)
    counted = counts.wrap("f", lambda x: x, rows=lambda x: len(x))
    for _ in range(3):
        assert counted(7) == 7
    stats = counts.stats()
    assert (stats["calls"], stats["rows"], stats["caught"]) == (3, 0, {"rows of f": 3})
    assert [r.getMessage() for r in records] == [
        "rebatch: verl: cannot count the rows of a call of f: TypeError: object of type 'int' has no len()"
    ]
