"""Shadow mode never stops a run for rebatch's own fault, for every trainer (no trainer installed).

A fault is injected into rebatch's side only (each row of the trainer's own table keeps its module and
name; its function and check raise), the trainer's side is a stand-in module: ``on_defect="raise"``
raises a defect (`_shadow.DEFECTS`) and nothing else; any other exception of rebatch's is counted, logged
once as a WARNING on ``rebatch.shadow``, and the trainer's result is returned.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from typing import Any

import pytest

from ref import errors
from torch_impl.integrations import TRAINERS
from torch_impl.integrations._shadow import DEFECTS


class _Theirs:
    """The trainer's side: a function (or a method) returning a marker object."""

    result = object()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.result


def _install_with_fault(monkeypatch: pytest.MonkeyPatch, trainer: str, fault: BaseException) -> list[Any]:
    """The trainer's table with ``fault`` raised by rebatch's function and check; stand-in modules of the
    trainer (its originals) at each row's place. Returns the patched callables, one per row."""
    integration = importlib.import_module(f"torch_impl.integrations.{trainer}").INTEGRATION
    release = integration.versions.fallback  # the newest release it supports
    monkeypatch.setattr(integration.versions, "installed", lambda: release)
    rows = integration.table(release)

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise fault

    faulty = [r._replace(ours=boom, check=boom) for r in rows]
    monkeypatch.setattr(integration, "table", lambda row: faulty)
    for module_name, name in integration.records:  # what an install wraps to record: stand-ins too
        recorded = types.ModuleType(module_name)
        setattr(recorded, name, lambda *a, **k: None)
        monkeypatch.setitem(sys.modules, module_name, recorded)
    owners: list[tuple[Any, str]] = []
    for r in faulty:
        module = sys.modules.get(r.module)
        if module is None or not getattr(module, "__rebatch_test__", False):
            module = types.ModuleType(r.module)
            module.__rebatch_test__ = True  # type: ignore[attr-defined]
            monkeypatch.setitem(sys.modules, r.module, module)
        if "." in r.name:  # "Class.method": a stand-in class
            cls_name, attr = r.name.split(".")
            cls = getattr(module, cls_name, None) or type(cls_name, (), {})
            setattr(cls, attr, lambda self, *a, **k: _Theirs.result)
            setattr(module, cls_name, cls)
            owners.append((cls, attr))
        else:
            setattr(module, r.name, _Theirs())
            owners.append((module, r.name))
    integration.install(mode="shadow", sample=1.0, on_defect="raise")
    out = []
    for owner, attr in owners:
        fn = getattr(owner, attr)
        out.append(fn.__get__(owner()) if isinstance(owner, type) else fn)
    return out


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
@pytest.mark.parametrize(
    "fault",
    [errors.UnsupportedSettingError("no_such_kernel"), RuntimeError("a bug of rebatch's"), KeyError("k")],
    ids=["setting", "runtime", "key"],
)
def test_rebatchs_own_error_is_counted_logged_once_and_the_trainers_result_returned(
    monkeypatch: pytest.MonkeyPatch, records: list[logging.LogRecord], trainer: str, fault: Exception
) -> None:
    integration = importlib.import_module(f"torch_impl.integrations.{trainer}")
    try:
        patched = _install_with_fault(monkeypatch, trainer, fault)
        for fn in patched:
            for _ in range(3):  # sampled (rebatch's function) and again: never raised, one WARNING a name
                assert fn() is _Theirs.result
        stats = integration.stats()
    finally:
        integration.uninstall()
    assert stats["errors"] == 3 * len(patched)
    assert stats["defects"] == 0
    assert stats["calls"] == 3 * len(patched)
    warned = [r for r in records if r.levelno == logging.WARNING]
    assert len(warned) == len(patched), [r.getMessage() for r in records]
    assert all(type(fault).__name__ in r.getMessage() for r in warned)
    assert not [r for r in records if r.levelno > logging.WARNING]


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
@pytest.mark.parametrize("defect", DEFECTS)
def test_a_defect_is_raised_with_on_defect_raise(
    monkeypatch: pytest.MonkeyPatch, trainer: str, defect: type
) -> None:
    integration = importlib.import_module(f"torch_impl.integrations.{trainer}")
    try:
        patched = _install_with_fault(monkeypatch, trainer, defect("micro-batch 1: index 1 repeated"))
        with pytest.raises(defect):
            patched[0]()
        assert integration.stats()["defects"] == 1
    finally:
        integration.uninstall()
