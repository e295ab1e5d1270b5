"""The imports among ``property_tests``' modules point one way: no cycle, lazy imports inside functions
included.

Parsed with `ast` (nothing is imported): ``from .x import y`` is an edge to ``x`` (and to ``x.y`` when that is
a
module), ``from . import x`` an edge to ``x``, ``import property_tests.x`` an edge to ``x``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

#: Independent of torch's release and of the trainers: run once, in CI's main lane (the pins lane deselects
#: it, .ci/lanes.sh)
pytestmark = pytest.mark.main_lane_only

KIT = Path(__file__).resolve().parent.parent / "property_tests"


#: The project's packages (issue 58: no import circle in any of them, nor among them).
PACKAGES = ("ref", "torch_impl", "rebatch_startup", "property_tests", "rebatch")


def _modules(packages: tuple[str, ...] = ("property_tests",)) -> dict[str, tuple[Path, bool]]:
    """Every module of ``packages`` by dotted name: its file and whether it is a package's ``__init__``."""
    mods: dict[str, tuple[Path, bool]] = {}
    for package in packages:
        for path in sorted((KIT.parent / package).rglob("*.py")):
            parts = list(path.relative_to(KIT.parent).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            mods[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return mods


def import_graph(packages: tuple[str, ...] = ("property_tests",)) -> dict[str, set[str]]:
    """``{module: the modules of ``packages`` it imports}``, at the top or inside functions."""
    mods = _modules(packages)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in mods.items():
        package = name if is_package else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join([*base, node.module] if node.module else base)
                else:
                    source = node.module or ""
                submodules = [
                    f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in mods
                ]
                names_only = len(submodules) < len(
                    node.names
                )  # some names are attributes of ``source`` itself
                targets = submodules + ([source] if names_only or node.module else [])
            else:
                continue
            edges |= {t for t in targets if t in mods and t != name}
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_checker_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_kit_imports_point_one_way() -> None:
    graph = import_graph()
    assert "property_tests.defects._core" in graph  # the walk saw the subpackage
    assert "property_tests.candidates" in graph
    assert find_cycle(graph) is None, f"an import cycle among property_tests' modules: {find_cycle(graph)}"


def test_no_module_of_the_project_is_in_an_import_cycle() -> None:
    """Across every package of the project, lazy imports inside functions included (issue 58: the
    witness's switch and provenance, the benchmark's worker protocol and its side-by-side, each once
    in a circle)."""
    graph = import_graph(PACKAGES)
    assert {"torch_impl._alignment._switch", "rebatch.bench.workers", "ref.structure"} <= set(graph)
    assert find_cycle(graph) is None, f"an import cycle: {find_cycle(graph)}"


def test_the_runner_is_the_top() -> None:
    """The command line (`conformance`) imports the trainers' reports; they never import it back."""
    graph = import_graph()
    assert {"property_tests.peers", "property_tests.peer_report"} <= graph["property_tests.conformance"]
    for name in ("property_tests.peers", "property_tests.peer_report", "property_tests.candidates"):
        assert "property_tests.conformance" not in graph[name], name
    assert not graph["property_tests.candidates"] & {"property_tests.peers", "property_tests.peer_report"}
    assert "property_tests.peer_report" not in graph["property_tests.peers"]


def test_the_families_of_defects_do_not_import_the_table() -> None:
    graph = import_graph()
    families = [m for m in graph if m.startswith("property_tests.defects._")]
    assert len(families) >= 8, families
    assert set(families) - {"property_tests.defects._core"} <= graph["property_tests.defects"]
    for name in families:
        assert "property_tests.defects" not in graph[name], name


def test_the_kit_and_the_tool_import_torch_impl_public_names_only() -> None:
    """`property_tests` and `rebatch` import ``torch_impl``'s public modules and names only (its testing
    namespace, `torch_impl.testing`, where they need helpers); the mutation kit, which mutates private
    modules, is the one exception (issue 58), and the device path's side-by-side harness, whose workers
    run an older commit's code too, takes that commit's own record of a split where it had no
    `torch_impl.testing` (its one private import)."""
    exempt = {"property_tests.mutants"}
    older_code = {("rebatch.bench.devicepath", "torch_impl._provenance")}
    found = []
    for name, (path, _) in _modules(("property_tests", "rebatch")).items():
        if name in exempt:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
                names: list[str] = []
            elif isinstance(node, ast.ImportFrom) and not node.level:
                modules = [node.module or ""]
                names = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                if not module.startswith("torch_impl"):
                    continue
                private = [p for p in module.split(".") if p.startswith("_")]
                private += [n for n in names if n.startswith("_")]
                if private and (name, module) not in older_code:
                    found.append(f"{name}: {module} {names}")
    assert not found, found
