"""A trainer's module imported with the warnings the trainer emits while it is imported held back.

The one way the testing kit (`property_tests`) and the command line (`rebatch`) import a trainer declared
in `rebatch_startup.trainers` (``TRAINERS``: verl, AReaL, SkyRL, miles): a trainer may warn while it is
imported (verl 0.9.1's engine package: "torchtitan engine is not available"), and the test suite runs
with warnings as errors, so a plain import fails in whichever test imports the trainer first (issue 68).
Only the import is quiet: a warning a call into the trainer raises afterwards surfaces as any other.

- `import_trainer_module(name)`: the module ``name``, imported (ImportError where it is not installed);
- `trainer_module_or_none(name)`: the same, or None where it cannot be imported;
- `is_trainer_module(name)`: whether ``name``'s top package is a declared trainer's.

A dotted name that may name a trainer's module or another one (a candidate ``module:function``) goes
through `import_trainer_module` too: another module is imported plainly, its warnings untouched.
``tests/test_trainer_import.py`` fails on a trainer imported anywhere else in the kit or the tool.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

from rebatch_startup.trainers import names

__all__ = ["import_trainer_module", "is_trainer_module", "trainer_module_or_none"]


def is_trainer_module(name: str) -> bool:
    """Whether the module ``name`` (dotted) belongs to a trainer declared in `rebatch_startup.trainers`."""
    return name.partition(".")[0] in names()


def import_trainer_module(name: str) -> ModuleType:
    """The module ``name`` imported; where it is a trainer's, the warnings emitted while it is imported
    are held back (only those: the filters are restored once the import returns).

    ImportError (or whatever the module raises while it is imported) where it cannot be imported."""
    if not is_trainer_module(name):
        return importlib.import_module(name)
    with warnings.catch_warnings():  # the trainer's own import-time warnings (verl's engines) are not ours
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


def trainer_module_or_none(name: str) -> ModuleType | None:
    """The module ``name`` as `import_trainer_module` imports it, or None where it cannot be imported
    (ImportError: the trainer, or one of what it imports, is not installed)."""
    try:
        return import_trainer_module(name)
    except ImportError:
        return None
