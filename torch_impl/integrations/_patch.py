"""The one way rebatch is put into a trainer: a table of (module, name, replacement), swapped everywhere.

A trainer binds its functions at import (``from ..utils import postprocess_batch_func``), so replacing
a name in its defining module alone changes none of the modules that already bound it. `Patcher.install`
replaces each name of the table in its defining module (so every module imported later binds rebatch's)
and, by identity, in every loaded module of the trainer's package that bound the original. A name of
the form ``"Class.method"`` is replaced on the class itself (every instance and subclass sees it).
`Patcher.uninstall` puts every original back where it was replaced. Both are idempotent and
thread-safe; the trainer is imported only when `install` runs.

Each trainer's module (`torch_impl.integrations.verl`, ``.areal``, ``.skyrl``) is that table plus its
adapter functions.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Patcher", "Table"]

#: ``(defining module, name) -> replacement``; a name ``"Class.attr"`` is an attribute of a class there.
Table = Mapping[tuple[str, str], Any]


class Patcher:
    """Installs a trainer's `Table` into the loaded modules of ``package`` (``"verl"``, ``"areal"``, ...).

    ``table(*args, **kwargs)`` builds the table when `install` is called with those arguments (so the
    replacements, and the trainer's modules, are only touched then).
    """

    def __init__(self, package: str, table: Callable[..., Table]) -> None:
        self.package = package
        self._table = table
        self._lock = threading.Lock()
        #: (owner: a module name or a class, attribute, original) for every replacement made, to undo them.
        self._replaced: list[tuple[str | type, str, Any]] = []

    def installed(self) -> bool:
        """True between `install` and `uninstall`."""
        return bool(self._replaced)

    def places(self) -> list[str]:
        """Every place replaced now, as ``"module.name"`` or ``"module.Class.attr"``."""
        with self._lock:
            return [_place(owner, attr) for owner, attr, _ in self._replaced]

    def install(self, *args: Any, **kwargs: Any) -> list[str]:
        """Replace every name of the table (built with these arguments); returns the places replaced.
        Idempotent: a second call changes nothing and returns the places of the first."""
        with self._lock:
            if not self._replaced:
                self._install(self._table(*args, **kwargs))
            return [_place(owner, attr) for owner, attr, _ in self._replaced]

    def _install(self, table: Table) -> None:
        swap: dict[int, tuple[Any, Any]] = {}  # id(original) -> (original, replacement)
        for (module_name, name), mine in table.items():
            module = importlib.import_module(module_name)
            if "." in name:
                owner_path, attr = name.rsplit(".", 1)
                owner: Any = module
                for part in owner_path.split("."):
                    owner = getattr(owner, part)
                original = vars(owner)[attr]  # the class's own entry (a staticmethod stays one)
                setattr(owner, attr, mine)
                self._replaced.append((owner, attr, original))
            else:
                original = getattr(module, name)
                swap[id(original)] = (original, mine)
        prefix = self.package + "."
        for module_name, module in list(sys.modules.items()):
            if module is None or not (module_name == self.package or module_name.startswith(prefix)):
                continue
            namespace = vars(module)
            for attr, value in list(namespace.items()):
                theirs, mine = swap.get(id(value), (None, None))
                if theirs is not None and value is theirs:
                    namespace[attr] = mine
                    self._replaced.append((module_name, attr, value))

    def uninstall(self) -> None:
        """Put every original back wherever `install` replaced it. Idempotent."""
        with self._lock:
            while self._replaced:
                owner, attr, original = self._replaced.pop()
                if isinstance(owner, str):
                    module = sys.modules.get(owner)
                    if module is not None:
                        setattr(module, attr, original)
                else:
                    setattr(owner, attr, original)


def _place(owner: str | type, attr: str) -> str:
    if isinstance(owner, str):
        return f"{owner}.{attr}"
    return f"{owner.__module__}.{owner.__qualname__}.{attr}"
