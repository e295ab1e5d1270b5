"""Code run around one module's execution: the one import hook shared by `rebatch_startup`'s finder
(activate a trainer right before its top package runs) and the patcher's
(`torch_impl.integrations._patch`: patch a module right after it has run). Imported only when a hook is
needed (never at interpreter start with ``REBATCH`` unset)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["AroundExec", "spec_around"]


class AroundExec:
    """``loader`` wrapped for one execution of module ``name``: ``before(name)`` runs right before its
    code, ``after(name)`` right after; the module and its spec keep the real loader."""

    def __init__(
        self,
        loader: Any,
        name: str,
        before: Callable[[str], None] | None = None,
        after: Callable[[str], None] | None = None,
    ) -> None:
        self._loader = loader
        self._name = name
        self._before = before
        self._after = after

    def __getattr__(self, name: str) -> Any:
        """Every other attribute is the real loader's (``is_package``, ``get_code``, ``get_filename``,
        ``get_resource_reader``...): a spec found only to probe, or run by ``runpy``, serves as the real
        one."""
        if name == "_loader":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader  # the module and its spec keep the real loader
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        if self._before is not None:
            self._before(self._name)  # may raise: the import of the module raises it
        self._loader.exec_module(module)
        if self._after is not None:
            self._after(self._name)


def spec_around(
    me: object,
    fullname: str,
    path: Sequence[str] | None,
    target: ModuleType | None,
    *,
    before: Callable[[str], None] | None = None,
    after: Callable[[str], None] | None = None,
) -> Any:
    """The spec the other finders of ``sys.meta_path`` (all but ``me``) give for ``fullname``, its loader
    wrapped in `AroundExec` (a loader without ``exec_module`` is left as it is); None when none finds it."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if finder is me or find_spec is None:
            continue
        spec = find_spec(fullname, path, target)
        if spec is not None:
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = AroundExec(spec.loader, fullname, before, after)
            return spec
    return None
