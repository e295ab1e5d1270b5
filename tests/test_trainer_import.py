"""One way to import a trainer (issue 68): `property_tests.trainer_import` imports a trainer's module with the
warnings the trainer emits while it is imported held back (verl 0.9.1's engine package warns, and the
suite runs with warnings as errors), and a warning a call into it raises later still surfaces; nothing
else in the kit (``property_tests/``) or the tool (``rebatch/``) imports a trainer declared in
`rebatch_startup.trainers` (an ``import``, a ``from ... import``, an ``importlib.import_module`` or
``__import__`` of a constant name), checked on the syntax trees."""

from __future__ import annotations

import ast
import importlib
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from property_tests import trainer_import
from property_tests.trainer_import import import_trainer_module, is_trainer_module, trainer_module_or_none
from rebatch_startup.trainers import names

ROOT = Path(__file__).resolve().parent.parent
#: Where trainers are imported through the helper only.
PACKAGES = ("property_tests", "rebatch")
#: The helper, the one module that imports a trainer's module itself.
HELPER = Path(trainer_import.__file__).resolve()

_STAND_IN = """
import warnings

warnings.warn("an optional engine of the stand-in trainer is not available", UserWarning)


def call():
    warnings.warn("a call into the stand-in trainer warns", UserWarning)
    return 42
"""


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A stand-in trainer that warns while it is imported: a package of a name of its own on ``sys.path``,
    declared a trainer for the test (its name among `rebatch_startup.trainers`' names); ``pkg.engine``,
    the module that warns, is the name yielded. Its modules are taken out of ``sys.modules`` afterwards."""
    package = f"rebatch_stand_in_{uuid.uuid4().hex}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "engine.py").write_text(_STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(trainer_import, "names", lambda: (*names(), package))
    importlib.invalidate_caches()
    try:
        yield f"{package}.engine"
    finally:
        for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
            del sys.modules[name]


def test_a_plain_import_of_a_trainer_that_warns_fails_under_warnings_as_errors(stand_in: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="optional engine"):
            importlib.import_module(stand_in)


def test_the_helper_imports_it_and_holds_back_its_import_time_warnings(stand_in: str) -> None:
    assert is_trainer_module(stand_in)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        module = import_trainer_module(stand_in)
    assert isinstance(module, ModuleType)
    assert module.__name__ == stand_in
    assert seen == []
    # the filters are back as they were: a warning of a later call into the trainer surfaces
    with pytest.raises(UserWarning, match="a call into the stand-in trainer"):
        module.call()


def test_the_helper_or_none_gives_the_module_or_none(stand_in: str) -> None:
    module = trainer_module_or_none(stand_in)
    assert module is not None
    assert module.call.__module__ == stand_in
    assert trainer_module_or_none(f"{stand_in.partition('.')[0]}.absent") is None


def test_another_module_is_imported_plainly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dotted name that is not a trainer's (a candidate's own module) keeps its import-time warnings."""
    package = f"rebatch_not_a_trainer_{uuid.uuid4().hex}"
    (tmp_path / f"{package}.py").write_text(_STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert not is_trainer_module(package)
    try:
        with pytest.raises(UserWarning, match="optional engine"):
            import_trainer_module(package)
    finally:
        sys.modules.pop(package, None)


def test_every_declared_trainer_is_one() -> None:
    for name in names():
        assert is_trainer_module(name)
        assert is_trainer_module(f"{name}.some.module")
        assert not is_trainer_module(f"{name}_other.module")
    assert not is_trainer_module("torch_impl.integrations.verl")


# -- the repository's rule: trainers imported through the helper only --------------------------------------


def trainer_imports(source: str, filename: str = "<source>") -> list[str]:
    """Each import of a declared trainer's module in ``source`` (``line: what``): ``import T...``,
    ``from T... import``, ``importlib.import_module("T...")`` or ``__import__("T...")`` (a constant name),
    ``T`` a trainer's top package. Relative imports are the project's own."""
    trainers = set(names())
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""] if not node.level else []
        elif isinstance(node, ast.Call) and _is_import_call(node.func):
            first = node.args[0] if node.args else None
            constant = isinstance(first, ast.Constant) and isinstance(first.value, str)
            modules = [first.value] if constant else []
        else:
            continue
        found += [f"{filename}:{node.lineno}: {m}" for m in modules if m.partition(".")[0] in trainers]
    return found


def _is_import_call(func: ast.expr) -> bool:
    """``importlib.import_module``, ``import_module`` (imported by name) or ``__import__``."""
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


@pytest.mark.main_lane_only
def test_the_scan_finds_each_form_of_a_trainer_import() -> None:
    source = (
        "import os\n"
        "import verl.workers.engine.utils as engine_utils\n"
        "from areal.api import cli_args\n"
        "def f():\n"
        "    import importlib\n"
        "    importlib.import_module('skyrl.backends.skyrl_train.training_batch')\n"
        "    __import__('miles')\n"
        "    from .trainers import verl\n"  # the kit's own module: not a trainer
        "    from torch_impl.integrations import verl\n"  # rebatch's integration: not a trainer
        "    import verlx\n"  # another package
        "    importlib.import_module(MODULE)\n"  # not a constant: the scan cannot tell
    )
    found = trainer_imports(source)
    assert [f.partition(": ")[2] for f in found] == [
        "verl.workers.engine.utils",
        "areal.api",
        "skyrl.backends.skyrl_train.training_batch",
        "miles",
    ], found


@pytest.mark.main_lane_only
def test_the_kit_and_the_tool_import_trainers_through_the_helper_only() -> None:
    files = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    assert HELPER in files
    found = []
    for path in files:
        if path == HELPER:
            continue
        found += trainer_imports(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, (
        "a trainer imported outside property_tests.trainer_import (import it with "
        f"import_trainer_module / trainer_module_or_none): {found}"
    )
