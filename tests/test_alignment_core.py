"""The alignment core is the one place of each alignment rule (issue 70), read from the syntax trees.

`torch_impl._alignment` holds the witness's comparison, the split record and its lookup, the provenance
judge and the reading of a flat position (``docs/architecture.md``, "The alignment core"). These tests
read every module of ``torch_impl/`` and fail on a copy of any of them outside the core, whatever its
name: a comparison of row lengths against a witness, a registry of splits, a class of split records, a
judge's error words, a flat position searched by bisection. Each detector is also run on a planted copy,
so a detector that finds nothing cannot pass unnoticed.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "torch_impl"
CORE = PACKAGE / "_alignment"

#: Names that hold a witness's lengths, in any spelling a copy would use.
WITNESS_NAMES = ("witness", "want", "expected")
#: The core's error words and rules: calling one outside the core is judging outside it.
CORE_ONLY_CALLS = {"misalignment", "stray_output", "other_batch", "check_indices", "witness_binds"}
#: The bisections that find which micro-batch holds a flat position (`ref.structure.locate`'s own:
#: the last end at or before it); ``bisect_left``, the first boundary at or after a value, asks another
#: question (AReaL's packed outputs: does a micro-batch end on a row's end).
LOCATING = {"bisect", "bisect_right"}
#: What a registry of splits is built on.
REGISTRIES = {"WeakKeyDictionary", "WeakValueDictionary", "ref", "finalize"}


def _outside_core() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if CORE not in p.parents)


def _names(node: ast.AST) -> Iterator[str]:
    """Every identifier and attribute name in ``node``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr


def _mentions_witness(node: ast.AST) -> bool:
    return any(any(w in name.lower() for w in WITNESS_NAMES) for name in _names(node))


def _called(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def findings(source: str) -> list[str]:
    """What a module's source holds of the core's rules, each as ``"line: what"``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
            if _mentions_witness(node):
                found.append(f"{line}: a comparison against a witness")
        elif isinstance(node, ast.Call):
            name = _called(node)
            if name in ("ne", "eq") and _mentions_witness(node):
                found.append(f"{line}: a comparison against a witness")
            elif name in CORE_ONLY_CALLS:
                found.append(f"{line}: the core's {name}")
            elif name in REGISTRIES and "weakref" in ast.unparse(node.func):
                found.append(f"{line}: a registry (weakref.{name})")
            elif name in LOCATING:
                found.append(f"{line}: a flat position searched by bisection ({name})")
        elif isinstance(node, ast.ClassDef) and "split" in node.name.lower():
            found.append(f"{line}: a class of split records ({node.name})")
        elif isinstance(node, ast.FunctionDef) and ("locate" in node.name or node.name.startswith("judge")):
            found.append(f"{line}: a definition of the core's {node.name}")
    return found


def test_every_rule_lives_in_the_core_alone() -> None:
    """No module of ``torch_impl`` outside `torch_impl._alignment` compares lengths against a witness,
    keeps split records, judges, or locates a flat position."""
    found = {
        str(p.relative_to(ROOT)): findings(p.read_text()) for p in _outside_core() if findings(p.read_text())
    }
    assert not found, found


def test_the_core_defines_each_rule_once() -> None:
    """Inside the core: one split record class, one witness comparison for host lengths, one judge of
    outputs and one of handouts, and the flat position read through `ref.structure.locate`."""
    defined: dict[str, list[str]] = {}
    for path in sorted(CORE.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef | ast.FunctionDef):
                continue
            defined.setdefault(node.name, []).append(path.name)
            if isinstance(node, ast.ClassDef) and node.name != "_Unrecorded":  # (a batch no split recorded)
                for method in node.body:
                    if isinstance(method, ast.FunctionDef):
                        defined.setdefault(method.name, []).append(path.name)
    for name in ("Split", "RowWitness", "Witness", "judge", "judge_handout", "check_restore", "record"):
        assert len(defined.get(name, [])) == 1, (name, defined.get(name))
    assert "locate" not in defined  # `ref.structure.locate`, shared with ref
    compare = (CORE / "_compare.py").read_text()
    assert "from ref.structure import locate, misalignment, witness_binds" in compare


#: The integrations that check alignment, each importing the core.
CHECKING = (
    "integrations/areal.py",
    "integrations/skyrl.py",
    "integrations/miles/_restore.py",
    "integrations/miles/_split.py",
    "integrations/miles/_witness.py",
    "_postprocess.py",
    "_prepare.py",
)


@pytest.mark.parametrize("module", CHECKING)
def test_every_integration_that_checks_alignment_imports_the_core(module: str) -> None:
    tree = ast.parse((PACKAGE / module).read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module is not None
    }
    assert "_alignment" in imported, (module, sorted(imported))


#: Copies a new maintainer might write, under other names: each must be found.
PLANTED = {
    "a comparison against a witness, on the host": """
        def lengths_ok(values, rows):
            got = [len(v) for v in values]
            want = [rows[i] for i in range(len(got))]
            return got == want
    """,
    "a comparison against a witness, on a device": """
        def flag(offsets, witness_lengths):
            return offsets.diff().ne(witness_lengths).any()
    """,
    "a registry (weakref.WeakKeyDictionary)": """
        import weakref
        _handed = weakref.WeakKeyDictionary()
    """,
    "a class of split records (HandoutSplit)": """
        class HandoutSplit:
            rows: list
    """,
    "a flat position searched by bisection (bisect_right)": """
        from bisect import bisect_right
        def where_is(j, ends):
            return bisect_right(ends, j)
    """,
    "a definition of the core's _locate_row": """
        def _locate_row(j, sizes):
            return j, 0
    """,
    "the core's misalignment": """
        from ref.structure import misalignment
        def fail(key):
            raise misalignment(key, 0, 0, 0, 1, 2)
    """,
}


@pytest.mark.parametrize("what", sorted(PLANTED))
def test_a_planted_copy_is_found(what: str) -> None:
    found = findings(textwrap.dedent(PLANTED[what]))
    assert any(what.split(", on ")[0] in f for f in found), found
