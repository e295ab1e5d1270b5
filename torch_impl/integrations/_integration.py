"""One trainer's install state, written once for every integration (`verl`, `areal`, `skyrl`).

An `Integration` holds what ``install()``, ``uninstall()``, ``stats()``, ``mode()`` and ``installed()``
of a trainer's module share: the mode check, the version gate (`_patch.Versions`), the `Shadow` of the
last shadow install (kept after `uninstall` for `stats`), the alignment witness's switch an install
changed (``witness=``, ``unbound=``: put back by `uninstall`), the `_patch.Patcher` and one lock (a
`rebatch_startup.ForkSafeLock`: a forked child finds it free). Each
trainer's module keeps only its table (``replacements(dump, shadow, row, carry)``), its adapters, the
line `install` logs and the rows of a call of each name (``rows``). `shadowing` is the table value every
trainer's shadow install puts in place of a trainer's function. An ``on`` install counts the calls of
rebatch's functions it puts in place (`_counts.Counts`: calls, rows, keys witnessed, errors per name,
``report=`` written as a file), here, for every trainer.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rebatch_startup import ForkSafeLock

from ._counts import Counts, Rows
from ._files import ProcessFile
from ._patch import Patcher, Table, Versions, Wrap
from ._shadow import Shadow

__all__ = ["MODES", "Integration", "shadowing"]

#: The values of ``install(mode=...)``.
MODES = ("on", "shadow")


def shadowing(
    shadow: Shadow,
    name: str,
    ours: Callable[..., Any],
    *,
    check: Callable[..., Any] | None = None,
    save: Callable[..., Any] | None = None,
    dump: str | None = None,
    keys_of: Callable[..., Any] | None = None,
    mutates: bool = False,
) -> Wrap:
    """The table value of a shadow install: the trainer's own function (found at install) wrapped by
    ``shadow`` (`Shadow.wrap`) with rebatch's ``ours`` and ``check`` in its shadow; ``save(dump, *args,
    **kwargs)`` saves the first differing or misaligned step when ``dump`` (a path) is given."""
    # a forked child dumps to its own file (`_files.ProcessFile`)
    first = functools.partial(_save_to, save, ProcessFile(dump)) if save is not None and dump else None
    return Wrap(
        lambda theirs: shadow.wrap(
            name, theirs, ours, check=check, on_first_difference=first, keys_of=keys_of, mutates=mutates
        )
    )


def _save_to(save: Callable[..., Any], where: ProcessFile, *args: Any, **kwargs: Any) -> None:
    save(where.now(), *args, **kwargs)


class Integration:
    """The install state of ``trainer`` (``"verl"``, the distribution and package name).

    ``replacements(dump, shadow, row, carry)`` builds the trainer's table (`_patch.Table`) for release
    ``row`` of ``versions``; ``carry`` is True for a lazy install (the one `rebatch_startup` makes from
    the environment), which also passes rebatch's variables on to the processes the trainer starts.
    ``describe(version, row, how)`` is the INFO line `install` logs (``how``: "replaces" or "shadows").
    ``rows``: for a replaced name (its last part: ``"Class.method"`` counts as ``"method"``), the rows
    of a call from its arguments (host-side facts only), counted by an ``on`` install.
    """

    def __init__(
        self,
        trainer: str,
        replacements: Callable[..., Table],
        versions: Versions[Any],
        describe: Callable[[str | None, str, str], str],
        rows: Mapping[str, Rows] | None = None,
    ) -> None:
        self.trainer = trainer
        self.replacements = replacements
        self.patcher = Patcher(trainer, self._table)
        self.versions = versions
        self.describe = describe
        self.rows = dict(rows or {})
        #: The last shadow install's counters (kept after `uninstall`, for `stats`).
        self.shadow: Shadow | None = None
        #: The last ``on`` install's counters (kept after `uninstall`, for `stats`).
        self.counts: Counts | None = None
        #: ``(version read, row used)`` of the install in force, else None.
        self.release: tuple[str | None, str] | None = None
        self._mode: str | None = None
        #: The witness's ``(on, unbound)`` before the install in force changed it (``witness=``/``unbound=``).
        self._witness_before: tuple[bool, frozenset[Any]] | None = None
        self._last: str | None = None  # the mode of the last install (whose counters `stats` gives)
        self._counting: Counts | None = None  # the counters `_table` wraps rebatch's functions with
        self.lock = ForkSafeLock()

    def _table(self, *args: Any) -> Table:
        """The trainer's table; in an ``on`` install each of rebatch's functions in it (not a `Wrap`:
        those wrap the trainer's own) counted (`Counts.wrap`)."""
        table = self.replacements(*args)
        counts = self._counting
        if counts is None:
            return table
        out: dict[tuple[str, str], Any] = {}
        for (module, name), mine in table.items():
            short = name.rsplit(".", 1)[-1]
            out[module, name] = mine if isinstance(mine, Wrap) else counts.wrap(short, mine, self.rows.get(short))
        return out

    def install(
        self,
        dump: str | None,
        *,
        mode: str,
        lazy: bool,
        force: bool,
        witness: bool | None = None,
        unbound: Iterable[str] | None = None,
        **shadow_options: Any,
    ) -> list[str]:
        """Replace the trainer's names (the trainer's ``install`` docstring, whose signature holds the
        defaults); ``shadow_options`` (``sample``, ``on_defect``, ``report``) go to `Shadow` in shadow
        mode (in ``on`` mode ``report`` goes to its counters, `Counts`); ``witness`` and ``unbound``, when given, set the alignment witness's process-wide switch
        (`torch_impl.set_witness`) for as long as the install is in force (`uninstall` puts it back).
        Returns the places replaced. Idempotent: a second call, whatever its arguments, changes nothing
        (the witness's switch included) and returns them again."""
        if mode not in MODES:
            from ref.errors import UnsupportedSettingError

            raise UnsupportedSettingError(f"mode must be 'on' or 'shadow', got {mode!r}")
        with self.lock:
            if self.patcher.installed():
                return self.patcher.places()
            version = self.versions.installed()
            row, _ = self.versions.pick(version, force=force)
            shadow = None
            counts = None
            if mode == "shadow":
                shadow = Shadow(**shadow_options, trainer=self.trainer, version=version)
            else:
                counts = Counts(self.trainer, version, shadow_options.get("report"))
            witness_before = None
            if witness is not None or unbound is not None:
                from .._witness import set_witness

                witness_before = set_witness(witness, unbound=unbound)  # checks ``witness`` first
            self._counting = counts
            try:
                if lazy:
                    places = self.patcher.install_as_imported(dump, shadow, row, True)
                else:
                    places = self.patcher.install(dump, shadow, row, False)
            except BaseException:
                if witness_before is not None:
                    set_witness(witness_before[0], unbound=witness_before[1])  # nothing installed: as it was
                raise
            finally:
                self._counting = None
            self._witness_before = witness_before
            if shadow is not None:
                self.shadow = shadow
            else:
                self.counts = counts
            self._last = mode
            self._mode = mode
            self.release = (version, row)
            logging.getLogger("rebatch").info(
                self.describe(version, row, "shadows" if shadow is not None else "replaces")
            )
            return places

    def uninstall(self) -> None:
        """Put the trainer's originals back wherever `install` replaced them, and the witness's switch as
        it was before `install` changed it. Idempotent."""
        with self.lock:
            self.patcher.uninstall()
            if self._witness_before is not None:
                from .._witness import set_witness

                set_witness(self._witness_before[0], unbound=self._witness_before[1])
                self._witness_before = None
            self._mode = None
            self.release = None

    def installed(self) -> bool:
        """True between `install` and `uninstall`."""
        return self.patcher.installed()

    def mode(self) -> str | None:
        """``"on"`` or ``"shadow"`` while installed, else None."""
        return self._mode if self.patcher.installed() else None

    def stats(self, json_path: str | None = None) -> dict[str, Any]:
        """The counters of the last install: its shadow's (`Shadow.stats`) or, ``on``, its calls
        (`Counts.stats`), written as JSON to ``json_path`` when given; all zero without an install."""
        if self._last == "on" and self.counts is not None:
            return self.counts.stats(json_path)
        shadow = self.shadow
        if shadow is None:
            shadow = Shadow(0.0, "log", None, trainer=self.trainer, version=self.versions.installed())
        return shadow.stats(json_path)
