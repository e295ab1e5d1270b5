"""The trainer contract: what an integration (`verl`, `areal`, `skyrl`) declares, and the one
``install``/``uninstall``/``stats``/``mode``/``installed``/``replacements`` every trainer shares.

A trainer's module declares one `Integration`: the trainer's name, its supported releases
(`_patch.Versions`), its table (``table(release) -> [Replaced, ...]``: for each name rebatch puts in the
trainer's place, the trainer's module and name, rebatch's function and its adapters: the check shadow
mode runs on unsampled calls, the saver of a step in rebatch's dump format, the keys a misaligned call
misaligns, the rows of a call), and where the trainer starts its workers (``carry``: a function giving
their environment, wrapped by a lazy install to pass rebatch's variables on). The module's public
functions are that object's bound methods (``install = INTEGRATION.install``), so every trainer has the
same signature and the same result, `Installed`.

An install builds the `_patch.Patcher`'s table from the rows for its mode: ``on``, rebatch's function
counted (`_counts.Counts`: calls, rows, keys witnessed, errors per name, ``report=`` written as a file),
saving its first call's inputs (``dump=``) where its row has a saver; ``shadow``, a `_patch.Wrap` that
puts the trainer's own function in charge with rebatch's in its shadow (`_shadow.Shadow.wrap`). The
counters of the last install are kept after `uninstall` (``kept``) for `stats`. One lock (a
`rebatch_startup.ForkSafeLock`: a forked child finds it free) guards the state.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from rebatch_startup import ForkSafeLock

from ._counts import Counts, Rows
from ._files import ProcessFile, save_dump
from ._patch import Patcher, Versions, Wrap
from ._shadow import Shadow

__all__ = ["MODES", "Installed", "Integration", "Replaced", "carrying"]

#: The values of ``install(mode=...)``.
MODES = ("on", "shadow")


class Replaced(NamedTuple):
    """One row of a trainer's table: rebatch's ``ours`` in place of ``module.name`` (``"Class.method"``:
    a method, replaced on the class), with its adapters (each called with the call's arguments)."""

    module: str
    name: str
    ours: Callable[..., Any]
    #: The checks of ``ours`` without moving data (shadow mode, unsampled calls); None: nothing runs there.
    check: Callable[..., Any] | None = None
    #: The call's inputs by name, as rebatch's dump format holds them (`_files.save_dump`); None: no dump.
    dumped: Callable[..., Mapping[str, Any]] | None = None
    #: The keys a misaligned call misaligns (named by shadow mode's log line).
    keys_of: Callable[..., Any] | None = None
    #: The rows of a call (host-side facts only), counted by an ``on`` install.
    rows: Rows | None = None
    #: The function fills its arguments (verl's ``append_to_dict``): shadow mode compares them too.
    mutates: bool = False

    @property
    def short(self) -> str:
        """The name counters and log lines use (``"Class.method"`` -> ``"method"``)."""
        return self.name.rsplit(".", 1)[-1]


class Installed(NamedTuple):
    """What `Integration.install` did (the same for every trainer)."""

    #: ``"verl"``, ``"areal"`` or ``"skyrl"``.
    trainer: str
    #: The trainer's version read from its metadata (None: no metadata).
    version: str | None
    #: The supported release whose table applies (the newest one for another version with ``force``).
    row: str
    #: ``"on"`` or ``"shadow"``.
    mode: str
    #: Every place replaced now, as ``"module.name"`` or ``"module.Class.attr"`` (a lazy install adds
    #: the others as their modules are imported).
    places: tuple[str, ...]


class Integration:
    """The install state of ``trainer`` (the distribution and top package name), declared once per trainer.

    ``table(release)`` is the trainer's table for a release of ``versions``; ``label`` the trainer's name in
    log lines (``"AReaL"``); ``carry`` the ``(module, name)`` of the function giving the environment of the
    processes the trainer starts (wrapped by a lazy install); ``describe(version, row, how)``, when given,
    the INFO line `install` logs (``how``: ``"replaces"`` or ``"shadows"``), else one naming the table.
    """

    def __init__(
        self,
        trainer: str,
        versions: Versions[Any],
        table: Callable[[str], Sequence[Replaced]],
        *,
        label: str,
        carry: tuple[str, str] | None = None,
        describe: Callable[[str | None, str, str], str] | None = None,
    ) -> None:
        self.trainer = trainer
        self.versions = versions
        self.table = table
        self.label = label
        self.carry = carry
        self.describe = describe or self._describe
        self.patcher = Patcher(trainer, self._patch_table)
        self.lock = ForkSafeLock()
        #: The counters of the last install (`Shadow` or `Counts`; kept after `uninstall`, for `stats`).
        self.kept: Shadow | Counts | None = None
        #: ``(version read, row used, mode)`` of the install in force, else None.
        self.release: tuple[str | None, str, str] | None = None
        #: The witness's ``(on, unbound)`` before the install in force changed it (``witness=``/``unbound=``).
        self.witness_before: tuple[bool, frozenset[Any]] | None = None

    def _describe(self, version: str | None, row: str, how: str) -> str:
        names = ", ".join(f"{r.module}.{r.name}" for r in self.table(row))
        return f"rebatch: {self.trainer} {version}: rebatch {how} {self.label}'s {names}"

    def _row_of(self, version: str | None) -> str:
        """The release whose table applies to ``version`` (default: the installed one; another: the newest)."""
        if version is None:
            version = self.versions.installed()
        return version if version in self.versions.rows else self.versions.fallback

    def replacements(self, version: str | None = None) -> dict[tuple[str, str], Any]:
        """``(trainer module, name) -> rebatch's function`` that an ``on`` install puts in the trainer's
        place on release ``version`` (default: the installed one; a release not supported: the newest
        one's), before counting: the same objects every call."""
        return {(r.module, r.name): r.ours for r in self.table(self._row_of(version))}

    def row(self, name: str, version: str | None = None) -> Replaced:
        """The table's row of ``name`` (its last part: ``"method"`` for ``"Class.method"``) on release
        ``version`` (as `replacements`): its function and adapters."""
        return next(r for r in self.table(self._row_of(version)) if name in (r.name, r.short))

    def dump(self, name: str, path: str, *args: Any, **kwargs: Any) -> None:
        """Save a call of ``name`` (its arguments ``args``, ``kwargs``) to ``path`` in rebatch's one dump
        format (`_files.save_dump`), read by ``rebatch check --dump``."""
        r = self.row(name)
        if r.dumped is None:
            raise ValueError(f"{self.trainer}'s {r.name} has no dump")
        inputs = r.dumped(*args, **kwargs)
        version = self.versions.installed()
        save_dump(path, trainer=self.trainer, version=version, function=f"{r.module}.{r.name}", inputs=inputs)

    def _dump_to(self, name: str, where: ProcessFile, *args: Any, **kwargs: Any) -> None:
        self.dump(name, where.now(), *args, **kwargs)

    def _patch_table(
        self, dump: str | None, shadow: Shadow | None, counts: Counts | None, row: str, carry: bool
    ) -> dict[tuple[str, str], Any]:
        """The patcher's table for an install: shadowed (``shadow``) or counted (``counts``), saving the
        first call (``dump``); with ``carry`` also the trainer's environment function, wrapped."""
        table: dict[tuple[str, str], Any] = {}
        saved = threading.Event()  # on mode: the first call of any name with a saver is dumped
        for r in self.table(row):
            where = ProcessFile(dump) if dump and r.dumped is not None else None  # a forked child: its own file
            save = None if where is None else functools.partial(self._dump_to, r.name, where)
            if shadow is not None:
                table[r.module, r.name] = _shadowed(shadow, r, save)
            else:
                ours = r.ours if save is None else _saving_first(r.ours, save, saved)
                table[r.module, r.name] = ours if counts is None else counts.wrap(r.short, ours, r.rows)
        if carry and self.carry is not None:
            table[self.carry] = Wrap(carrying)
        return table

    def install(
        self,
        dump: str | None = None,
        *,
        mode: str = "on",
        sample: float = 0.05,
        on_defect: str = "log",
        report: str | None = None,
        lazy: bool = False,
        force: bool = False,
        witness: bool | None = None,
        unbound: Iterable[str] | None = None,
    ) -> Installed:
        """Replace the trainer's names (the table of its module) with rebatch's, in their modules and in
        every loaded module of the trainer that bound them; returns `Installed` (also logged as one INFO
        line on the ``"rebatch"`` logger). Idempotent: a second call, whatever its arguments, changes
        nothing (the witness's switch included) and returns the install in force; `uninstall` undoes it.

        The installed trainer must be a release of its module's `VERSIONS` (read from its metadata, the
        trainer not imported): another raises `ref.errors.UnsupportedSettingError`, replacing nothing,
        unless ``force=True`` (then the newest release's table, with a warning logged).

        ``dump``: a file to save a step to in rebatch's dump format, for ``rebatch check --dump FILE``:
        the first call's inputs (``on``; a forked child writes its own file), or the first step where
        rebatch and the trainer differ or rebatch finds a defect (``shadow``).

        ``mode="shadow"``: the trainer's functions stay in charge, rebatch's shadow them
        (`torch_impl.integrations._shadow`): ``sample`` the fraction of calls compared (the first, then
        every ``round(1 / sample)``-th), ``on_defect`` ``"log"`` (an ERROR on the ``rebatch.shadow``
        logger) or ``"raise"`` (rebatch's `ref.errors.RebatchError`, stopping the run), ``report`` a JSON
        file of `stats` rewritten at each sampled call. In ``on`` mode ``report`` is the file of its
        counters (`torch_impl.integrations._counts`: calls, rows, keys witnessed, errors); ``sample`` and
        ``on_defect`` are shadow mode's only.

        ``lazy=True`` (the form `rebatch_startup` uses, from ``REBATCH``): nothing of the trainer is
        imported; names of modules already loaded are replaced now, the others as their modules finish
        importing, and the function giving the trainer's workers their environment (``carry``) is
        wrapped to pass rebatch's variables on.

        ``witness=False``: switch the alignment witness off for the process (`torch_impl.set_witness`;
        default: as ``REBATCH_WITNESS`` says, on); ``unbound``: keys it leaves unbound (a custom loss
        whose rows are not the batch's rows). Both only on a fresh install, and put back by `uninstall`.
        """
        if mode not in MODES:
            from ref.errors import UnsupportedSettingError

            raise UnsupportedSettingError(f"mode must be 'on' or 'shadow', got {mode!r}")
        with self.lock:
            if self.patcher.installed() and self.release is not None:
                return Installed(self.trainer, *self.release, tuple(self.patcher.places()))
            version = self.versions.installed()
            row, _ = self.versions.pick(version, force=force)
            shadow = None
            counts = None
            if mode == "shadow":
                shadow = Shadow(sample, on_defect, report, trainer=self.trainer, version=version)
            else:
                counts = Counts(self.trainer, version, report)
            witness_before = None
            if witness is not None or unbound is not None:
                from .._witness import set_witness

                witness_before = set_witness(witness, unbound=unbound)  # checks ``witness`` first
            try:
                put = self.patcher.install_as_imported if lazy else self.patcher.install
                places = put(dump, shadow, counts, row, lazy)
            except BaseException:
                if witness_before is not None:
                    set_witness(witness_before[0], unbound=witness_before[1])  # nothing installed: as it was
                raise
            self.witness_before = witness_before
            self.kept = shadow or counts
            self.release = (version, row, mode)
            how = "shadows" if shadow is not None else "replaces"
            logging.getLogger("rebatch").info(self.describe(version, row, how))
            return Installed(self.trainer, version, row, mode, tuple(places))

    def uninstall(self) -> None:
        """Put the trainer's originals back wherever `install` replaced them, and the alignment witness's
        switch as it was before `install` changed it. Idempotent."""
        with self.lock:
            self.patcher.uninstall()
            if self.witness_before is not None:
                from .._witness import set_witness

                set_witness(self.witness_before[0], unbound=self.witness_before[1])
                self.witness_before = None
            self.release = None

    def installed(self) -> bool:
        """True between `install` and `uninstall`."""
        return self.patcher.installed()

    def mode(self) -> str | None:
        """``"on"`` or ``"shadow"`` while installed, else None."""
        release = self.release
        return release[2] if release is not None and self.patcher.installed() else None

    def stats(self, json_path: str | None = None) -> dict[str, Any]:
        """The counters of the last install (kept after `uninstall`), written as JSON to ``json_path`` when
        given; all zero without an install. Shadow mode's: ``calls``, ``sampled``, ``differences``,
        ``defects``, ``errors`` (rebatch's other exceptions), ``trainer_seconds`` (also as
        ``<trainer>_seconds``, e.g. ``verl_seconds``), ``rebatch_seconds`` (totals over every name),
        ``by_name`` (the same per replaced name), ``messages`` (the first 100 logged lines), ``witness``,
        ``trainer``, ``version``, ``mode``, ``sample``, ``on_defect`` and ``process``. An ``on``
        install's (``mode`` ``"on"``): ``calls``, ``rows``, ``keys_witnessed`` and ``errors`` per name
        (`_counts.Counts`)."""
        kept = self.kept
        if kept is None:
            kept = Shadow(0.0, "log", None, trainer=self.trainer, version=self.versions.installed())
        return kept.stats(json_path)


def _shadowed(shadow: Shadow, r: Replaced, save: Callable[..., None] | None) -> Wrap:
    """The table value of a shadow install: the trainer's own function (found at install) wrapped by
    ``shadow`` with ``r``'s function and check in its shadow, ``save`` (a call's arguments) the first
    differing or misaligned step."""
    return Wrap(
        lambda theirs: shadow.wrap(
            r.short, theirs, r.ours, check=r.check, on_first_difference=save, keys_of=r.keys_of, mutates=r.mutates
        )
    )


def _saving_first(ours: Callable[..., Any], save: Callable[..., None], saved: threading.Event) -> Callable[..., Any]:
    """``ours``, saving the first call's arguments (of the install: ``saved``) with ``save``."""

    @functools.wraps(ours)
    def saving(*args: Any, **kwargs: Any) -> Any:
        if not saved.is_set():
            saved.set()
            save(*args, **kwargs)
        return ours(*args, **kwargs)

    return saving


def carrying(environment: Callable[..., dict[str, str]]) -> Callable[..., dict[str, str]]:
    """The trainer's function giving its workers' environment (AReaL's ``get_env_vars``, SkyRL's
    ``prepare_runtime_environment``: a plain driver export does not reach Ray actors), plus rebatch's
    variables set here (`rebatch_startup.carried`) that it does not set itself, so that every worker
    activates as this process did."""
    import rebatch_startup

    @functools.wraps(environment)
    def carrying(*args: Any, **kwargs: Any) -> dict[str, str]:
        env = environment(*args, **kwargs)
        return {**{k: v for k, v in rebatch_startup.carried().items() if k not in env}, **env}

    return carrying
