"""CI's pins lane runs every test that reaches verl (``.ci/pins_tests.py``), read from the syntax trees.

The pins lane runs, on verl's pins, the tests that reach verl and the torch-sensitive ones
(``.ci/torch_tests.txt``); the rest runs in the main lane only, where verl is not installed, so a test
that needs verl and is not listed would be skipped everywhere. This reads every test module's syntax tree
for a use of verl (an import, the kit's trainer import or its verl oracle; code a subprocess runs is
reached through the oracle's requirement, which the list reads too) and fails on one the list leaves
out; a planted module shows the reading finds each form.
"""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.main_lane_only

ROOT = Path(__file__).resolve().parents[1]
#: The kit's ways to reach a trainer, each taking its name first.
TRAINER_IMPORTS = {"import_trainer_module", "trainer_module_or_none"}


def _pins_tests() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pins_tests", ROOT / ".ci" / "pins_tests.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def uses_verl(source: str) -> bool:
    """Whether a test module's source reaches verl, by its syntax tree."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "verl" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "verl":
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "property_tests.verl_oracle":
            return True
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            first = node.args[0] if node.args else None
            if name in TRAINER_IMPORTS and isinstance(first, ast.Constant) and first.value == "verl":
                return True
    return False


def test_every_test_module_that_reaches_verl_runs_in_the_pins_lane() -> None:
    listed = set(_pins_tests().pins_tests(ROOT))
    reaching = {
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "tests").glob("test_*.py"))
        if uses_verl(p.read_text())
    }
    assert reaching, "no test module reaches verl: the reading is broken"
    assert reaching <= listed, sorted(reaching - listed)


#: A test module reaching verl in each form the reading knows (none of them by the list's own words).
PLANTED = {
    "import": "import verl.utils.seqlen_balancing as sb\n",
    "from": "from verl.protocol import DataProto\n",
    "kit": "from property_tests import trainer_import\nm = trainer_import.import_trainer_module('verl')\n",
}


@pytest.mark.parametrize("form", sorted(PLANTED))
def test_a_planted_use_of_verl_is_read(form: str, tmp_path: Path) -> None:
    assert uses_verl(textwrap.dedent(PLANTED[form]))
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_planted.py").write_text(PLANTED[form])
    listed = _pins_tests().pins_tests(tmp_path)
    assert listed == ["tests/test_planted.py"], (form, listed)


def test_the_torch_list_names_only_what_exists() -> None:
    """Every path of ``.ci/torch_tests.txt`` (which both the pins and the torch lane run) is a file here."""
    for line in (ROOT / ".ci" / "torch_tests.txt").read_text().splitlines():
        if not line.strip() or line.startswith(("#", "--")):
            continue
        path = line.split("::")[0]
        assert (ROOT / path).is_file(), line
