"""The one way rebatch is put into a trainer: a table of (module, name, replacement), swapped everywhere.

A trainer binds its functions at import (``from ..utils import postprocess_batch_func``), so `Patcher.install`
replaces each name of the table in its defining module (so every module imported later binds rebatch's)
and, by identity, in every loaded module of the trainer's package that bound the original; a name
``"Class.method"`` is replaced on the class. `Patcher.uninstall` puts every original back. Both are
idempotent, thread-safe and fork-safe (`rebatch_startup.ForkSafeLock`); the trainer is imported only when
`install` runs. ``install(lazy=True)`` imports nothing: loaded modules are patched at once, each other one
right after it executes (an import hook, gone once all are patched or at `uninstall`): the form for a
plugin loaded while the trainer is half-imported. A table value may be a `Wrap`: ``factory(original)``
put in the original's place. `Versions` reads a trainer's release from its metadata (the trainer not
imported) and gives its row, or refuses another release unless forced.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, Generic, TypeVar

from rebatch_startup.forksafe import ForkSafeLock

__all__ = ["Patcher", "Table", "Versions", "Wrap"]

R = TypeVar("R")

#: ``(defining module, name) -> replacement``; a name ``"Class.attr"`` is an attribute of a class there.
Table = Mapping[tuple[str, str], Any]


class Wrap:
    """A table value built from the original: `Patcher` puts ``factory(original)`` in its place."""

    def __init__(self, factory: Callable[[Any], Any]) -> None:
        self.factory = factory


class Versions(Generic[R]):
    """The versions of ``distribution`` (``"verl"``) an integration supports, each with its row ``R``.
    `installed` reads the installed one from its metadata (nothing of the trainer imported: it works while
    the trainer is half-imported); `pick` gives a version's row, and for another raises
    `ref.errors.UnsupportedSettingError` naming it and the supported ones, unless ``force``: then the row
    of ``fallback`` (the newest), with a warning on the ``"rebatch"`` logger."""

    def __init__(self, distribution: str, rows: Mapping[str, R], *, fallback: str) -> None:
        if fallback not in rows:
            raise ValueError(f"the fallback {fallback!r} is not one of the rows {sorted(rows)}")
        self.distribution = distribution
        self.rows = dict(rows)
        self.fallback = fallback

    def installed(self) -> str | None:
        """The installed version of the distribution, or None when it has no metadata here."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def pick(self, version: str | None, *, force: bool = False) -> tuple[str, R]:
        """``(the version whose row applies, its row)`` for ``version`` (None: not installed, or unknown)."""
        if version in self.rows:
            return version, self.rows[version]
        from ref.errors import UnsupportedSettingError

        found = (
            f"{self.distribution} {version}"
            if version
            else f"{self.distribution} (version unknown: no metadata)"
        )
        supported = ", ".join(self.rows)
        if not force:
            raise UnsupportedSettingError(
                f"{found} is not supported by rebatch (supported: {supported}); install(force=True) uses "
                f"{self.distribution} {self.fallback}'s replacements anyway"
            )
        using = f"{self.distribution} {self.fallback}'s replacements"
        logging.getLogger("rebatch").warning(
            f"rebatch: {found} is not supported (supported: {supported}); force=True: using {using}"
        )
        return self.fallback, self.rows[self.fallback]


def _built(mine: Any, original: Any) -> Any:
    return mine.factory(original) if isinstance(mine, Wrap) else mine


class Patcher:
    """Installs a trainer's `Table` into the loaded modules of ``package`` (``"verl"``, ``"areal"``, ...);
    ``table(*args)`` builds it when `install` is called with those arguments (only then)."""

    def __init__(self, package: str, table: Callable[..., Table]) -> None:
        self.package = package
        self._table = table
        self.lock = ForkSafeLock()  # a forked child finds it free (held across imports)
        #: (owner: a module name or a class, attribute, original) for every replacement made, to undo them.
        self._replaced: list[tuple[str | type, str, Any]] = []
        #: id(replacement) -> (replacement, original) of every module-level replacement, to find the
        #: modules imported after the install that bound a replacement.
        self._made: dict[int, tuple[Any, Any]] = {}
        #: module name -> its table entries, waiting for the module to be imported (a lazy `install`).
        self._pending: dict[str, dict[tuple[str, str], Any]] = {}
        self._finder: _AfterImport | None = None

    def installed(self) -> bool:
        """True between `install` and `uninstall`."""
        return bool(self._replaced or self._pending)

    def places(self) -> list[str]:
        """Every place replaced now, as ``"module.name"`` or ``"module.Class.attr"``."""
        with self.lock:
            return [_place(owner, attr) for owner, attr, _ in self._replaced]

    def install(self, *args: Any, lazy: bool = False) -> list[str]:
        """Replace every name of the table (built with these arguments); returns the places replaced now.
        Idempotent: a second call changes nothing and returns the places of the first. ``lazy``: without
        importing the trainer, the names of loaded modules now, each other one as soon as its module has
        executed (`installed` is True from this call on)."""
        with self.lock:
            if not self.installed():
                now: dict[tuple[str, str], Any] = {}
                for (module_name, name), mine in self._table(*args).items():
                    if lazy and not _loaded(module_name):
                        self._pending.setdefault(module_name, {})[module_name, name] = mine
                        continue
                    if not lazy:
                        importlib.import_module(module_name)
                    now[module_name, name] = mine
                self._swap(now)
                if self._pending:
                    self._finder = _AfterImport(self._pending, self._imported)
                    sys.meta_path.insert(0, self._finder)
            return self.places()

    def _imported(self, module_name: str) -> None:
        """The hook: ``module_name`` has just executed; replace its names."""
        with self.lock:
            entries = self._pending.pop(module_name, None)
            if entries:
                self._swap(entries)
            if not self._pending:
                self._drop_finder()

    def _drop_finder(self) -> None:
        if self._finder is not None:
            with contextlib.suppress(ValueError):  # removed by someone else
                sys.meta_path.remove(self._finder)
            self._finder = None

    def _swap(self, table: Table) -> None:
        """Replace every name of ``table`` (its modules loaded) in its module and, by identity, in the
        package's loaded modules."""
        swap: dict[int, tuple[Any, Any]] = {}  # id(original) -> (original, replacement)
        for (module_name, name), mine in table.items():
            module = sys.modules[module_name]
            if "." in name:
                owner_path, attr = name.rsplit(".", 1)
                owner: Any = module
                for part in owner_path.split("."):
                    owner = getattr(owner, part)
                original = vars(owner)[attr]  # the class's own entry (a staticmethod stays one)
                setattr(owner, attr, _built(mine, original))
                self._replaced.append((owner, attr, original))
            else:
                original = getattr(module, name)
                swap[id(original)] = (original, _built(mine, original))
        for module_name, namespace in self._namespaces():
            for attr, value in list(namespace.items()):
                theirs, mine = swap.get(id(value), (None, None))
                if theirs is not None and value is theirs:
                    namespace[attr] = mine
                    self._replaced.append((module_name, attr, value))
        self._made.update({id(mine): (mine, theirs) for theirs, mine in swap.values()})

    def _namespaces(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(name, namespace)`` of every loaded module of the package."""
        prefix = self.package + "."
        for module_name, module in list(sys.modules.items()):
            if module is not None and (module_name == self.package or module_name.startswith(prefix)):
                yield module_name, vars(module)

    def uninstall(self) -> None:
        """Put every original back wherever `install` replaced it, and in every module of the package
        imported since that bound a replacement. Idempotent."""
        with self.lock:
            self._pending.clear()
            self._drop_finder()
            for _, namespace in self._namespaces():
                for attr, value in list(namespace.items()):
                    mine, theirs = self._made.get(id(value), (None, None))
                    if mine is not None and value is mine:
                        namespace[attr] = theirs
            self._made.clear()
            while self._replaced:
                owner, attr, original = self._replaced.pop()
                if isinstance(owner, str):
                    loaded = sys.modules.get(owner)
                    if loaded is not None:
                        setattr(loaded, attr, original)
                else:
                    setattr(owner, attr, original)


def _loaded(module_name: str) -> bool:
    """True when ``module_name`` has been imported and is not executing now."""
    module = sys.modules.get(module_name)
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the modules of ``pending`` with the other finders and calls ``then(name)`` once each has
    executed (`rebatch_startup._hooks.spec_around`: its loader wrapped for that one execution; the
    module keeps its own loader)."""

    def __init__(self, pending: Mapping[str, Any], then: Callable[[str], None]) -> None:
        self._pending = pending
        self._then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._pending:
            return None
        from rebatch_startup._hooks import spec_around

        spec: importlib.machinery.ModuleSpec | None = spec_around(
            self, fullname, path, target, after=self._then
        )
        return spec


def _place(owner: str | type, attr: str) -> str:
    if isinstance(owner, str):
        return f"{owner}.{attr}"
    return f"{owner.__module__}.{owner.__qualname__}.{attr}"
