"""The trainer contract: what an integration (`verl`, `areal`, `skyrl`) declares, and the one
``install``/``uninstall``/``stats``/``mode``/``installed``/``replacements`` of every trainer.

A trainer's module declares one `Integration`: its supported releases (`_patch.Versions`), its table
(``table(release) -> [Replaced, ...]``: the trainer's module and name, rebatch's function and its
adapters), and ``carry``, the function giving the environment of the processes the trainer starts. Its
public functions are that object's bound methods (``install = INTEGRATION.install``): one signature and
one result, `Installed`, for every trainer. An install builds the `_patch.Patcher`'s table for its mode:
``on``, rebatch's function counted (`_counts.Counts`) and its first call dumped (``dump=``); ``shadow``,
the trainer's own function in charge with rebatch's in its shadow (`_shadow.Shadow.wrap`).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from rebatch_startup.forksafe import ForkSafeLock
from ref.errors import UnsupportedSettingError

from ._counts import Counts, Rows
from ._files import ProcessFile, save_dump
from ._patch import Patcher, Versions, Wrap
from ._shadow import Shadow

__all__ = ["MODES", "Installed", "Integration", "NotReplayable", "Replaced", "carrying"]

#: The values of ``install(mode=...)``.
MODES = ("on", "shadow")


class Replaced(NamedTuple):
    """One row of a trainer's table: rebatch's ``ours`` in place of ``module.name`` (``"Class.method"``: on
    the class), with its adapters, each called with a call's arguments: ``check`` (``ours``'s checks
    without moving data: shadow mode's unsampled calls), ``dumped`` (the call's inputs by name, as the dump
    format holds them), ``keys_of`` (the keys a misaligned call misaligns), ``rows`` (the call's rows, host
    facts only: ``on`` mode's counters); ``mutates``: ``ours`` fills its arguments (verl's
    ``append_to_dict``), which shadow mode compares too."""

    module: str
    name: str
    ours: Callable[..., Any]
    check: Callable[..., Any] | None = None
    dumped: Callable[..., Mapping[str, Any]] | None = None
    keys_of: Callable[..., Any] | None = None
    rows: Rows | None = None
    mutates: bool = False
    #: ``observe(result, *args, **kwargs)``: after the trainer's own function returned ``result`` in shadow
    #: mode (a split's micro-batches and indices, recorded for the restore's provenance); never raises.
    observe: Callable[..., None] | None = None

    @property
    def short(self) -> str:
        """The name counters and log lines use (``"Class.method"`` -> ``"method"``)."""
        return self.name.rsplit(".", 1)[-1]


class NotReplayable(ValueError):
    """A dump's inputs that its integration's ``replay`` cannot make a call of (``rebatch check`` names
    the file)."""


class Installed(NamedTuple):
    """What `Integration.install` did, for every trainer: the ``trainer``, its ``version`` read from its
    metadata (None: none), the supported release whose table applies (``row``: the newest for another
    version with ``force``), the ``mode`` and every place replaced now (``places``: ``"module.name"`` or
    ``"module.Class.attr"``; a lazy install replaces the others as their modules are imported)."""

    trainer: str
    version: str | None
    row: str
    mode: str
    places: tuple[str, ...]


class Integration:
    """The declaration and install state of ``trainer`` (its distribution and top package): ``table(release)``
    its table for a release of ``versions``; ``label`` its name in log lines (``"AReaL"``); ``carry`` the
    ``(module, name)`` of its workers' environment function, wrapped by ``carrier`` in a lazy install
    (default `carrying`); ``describe(version, row, how)`` the INFO line `install` logs (``how``:
    ``"replaces"`` or ``"shadows"``; default: one naming the table); ``replay(function, inputs)`` a call
    of the drop-in on a dump's inputs (``rebatch check``); ``records`` the trainer's functions wrapped in
    every install to record what its split made (miles' ``get_data_iterator``)."""

    def __init__(
        self,
        trainer: str,
        versions: Versions[Any],
        table: Callable[[str], Sequence[Replaced]],
        *,
        label: str,
        carry: tuple[str, str] | None = None,
        describe: Callable[[str | None, str, str], str] | None = None,
        replay: Callable[[str, Mapping[str, Any]], Callable[[], Any]] | None = None,
        carrier: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
        records: Mapping[tuple[str, str], Callable[[Callable[..., Any]], Callable[..., Any]]] | None = None,
    ) -> None:
        self.trainer = trainer
        self.versions = versions
        self.table = table
        self.label = label
        self.carry = carry
        self.describe = describe or self._describe
        #: ``replay(function, inputs)``: a call of rebatch's drop-in on a dump's inputs (``rebatch check``),
        #: `NotReplayable` where they are not a call of ``function``; None: the dump is verl's format, a
        #: ``postprocess_batch_func`` call ``rebatch check`` runs itself.
        self.replay = replay
        #: how ``carry`` is wrapped (default `carrying`: its result, a dict of variables, gets rebatch's)
        self.carrier = carrier or carrying
        #: ``(module, name) -> wrapper``: the trainer's functions wrapped in every install, ``on`` and
        #: ``shadow`` alike, to record what its split made (neither counted nor shadowed: the trainer's
        #: own function runs once, unchanged)
        self.records = dict(records or {})
        self.patcher = Patcher(trainer, self._patch_table)
        self.lock = (
            self.patcher.lock
        )  # one lock (a forked child finds it free: `rebatch_startup.ForkSafeLock`)
        #: The counters of the last install (`Shadow` or `Counts`; kept after `uninstall`, for `stats`).
        self.kept: Shadow | Counts | None = None
        #: ``(version read, row used, mode)`` of the install in force, else None.
        self.release: tuple[str | None, str, str] | None = None

    def _describe(self, version: str | None, row: str, how: str) -> str:
        names = ", ".join(f"{r.module}.{r.name}" for r in self.table(row))
        return f"rebatch: {self.trainer} {version}: rebatch {how} {self.label}'s {names}"

    def _row_of(self, version: str | None) -> str:
        """The release whose table applies to ``version`` (default: the installed one; another: the
        newest)."""
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
            raise UnsupportedSettingError(f"{self.trainer}'s {r.name} has no dump format")
        inputs, version = r.dumped(*args, **kwargs), self.versions.installed()
        save_dump(path, trainer=self.trainer, version=version, function=f"{r.module}.{r.name}", inputs=inputs)

    def _dump_to(self, name: str, where: ProcessFile, *args: Any, **kwargs: Any) -> None:
        self.dump(name, where.now(), *args, **kwargs)

    def _patch_table(
        self, dump: str | None, kept: Shadow | Counts, row: str, carry: bool
    ) -> dict[tuple[str, str], Any]:
        """The patcher's table for an install: shadowed or counted (``kept``), saving the first call
        (``dump``); with ``carry`` also the trainer's environment function, wrapped."""
        table: dict[tuple[str, str], Any] = {}
        saved = threading.Event()  # on mode: the first call of any name with a saver is dumped
        for r in self.table(row):
            where = (
                ProcessFile(dump) if dump and r.dumped is not None else None
            )  # a forked child: its own file
            save = None if where is None else functools.partial(self._dump_to, r.name, where)
            if isinstance(kept, Shadow):
                table[r.module, r.name] = _shadowed(kept, r, save)
            else:
                ours = r.ours if save is None else _saving_first(r.ours, save, saved)
                table[r.module, r.name] = kept.wrap(r.short, ours, r.rows)
        for place, recorder in self.records.items():
            table[place] = Wrap(recorder)
        if carry and self.carry is not None:
            table[self.carry] = Wrap(self.carrier)
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
        """Replace the trainer's names (its module's table) with rebatch's, in their modules and in every
        loaded module of the trainer that bound them; returns `Installed` (and logs one INFO line on the
        ``"rebatch"`` logger). Idempotent: a second call, whatever its arguments, changes nothing (the
        witness's switch included) and returns the install in force; `uninstall` undoes it. The trainer's
        release (read from its metadata) must be one of its module's `VERSIONS`: another raises
        `ref.errors.UnsupportedSettingError`, replacing nothing, unless ``force=True`` (the newest
        release's table, with a warning logged).

        ``dump``: a file for ``rebatch check --dump FILE``, in rebatch's dump format: the first call's
        inputs (``on``), or the first step where rebatch and the trainer differ or rebatch finds a defect
        (``shadow``); a forked child writes its own. ``mode="shadow"``: the trainer's functions stay in
        charge, rebatch's shadow them (`_shadow`): ``sample`` the fraction of calls compared (the first,
        then every ``round(1 / sample)``-th), ``on_defect`` ``"log"`` (an ERROR on ``rebatch.shadow``) or
        ``"raise"`` (a defect, `_shadow.DEFECTS`, stops the run; rebatch's other errors never do), ``report``
        a JSON file of `stats`.
        ``on`` mode: ``report`` the file of its counters (`_counts`); ``sample`` and ``on_defect`` unused.

        ``lazy=True`` (`rebatch_startup`'s form, from ``REBATCH``): nothing of the trainer imported; loaded
        modules patched now, the others as they finish importing; the function giving the trainer's
        workers their environment (``carry``) wrapped to pass rebatch's variables on. ``witness=False``:
        the alignment witness off for the process (`torch_impl.set_witness`; default: as
        ``REBATCH_WITNESS`` says, on); ``unbound``: keys it leaves unbound (a custom loss whose rows are
        not the batch's). Both only on a fresh install, put back by `uninstall`.
        """
        if mode not in MODES:
            raise UnsupportedSettingError(f"mode must be 'on' or 'shadow', got {mode!r}")
        with self.lock:
            if self.patcher.installed() and self.release is not None:
                return Installed(self.trainer, *self.release, tuple(self.patcher.places()))
            version = self.versions.installed()
            row, _ = self.versions.pick(version, force=force)
            kept: Shadow | Counts
            if mode == "shadow":
                kept = Shadow(sample, on_defect, report, trainer=self.trainer, version=version)
            else:
                kept = Counts(self.trainer, version, report)
            if witness is not None or unbound is not None:
                _WITNESS.push(self, witness, unbound)  # checks ``witness`` first
            try:
                places = self.patcher.install(dump, kept, row, lazy, lazy=lazy)
            except BaseException:
                _WITNESS.drop(self)  # nothing installed: as it was
                raise
            self.kept = kept
            self.release = (version, row, mode)
            logging.getLogger("rebatch").info(
                self.describe(version, row, "shadows" if mode == "shadow" else "replaces")
            )
            return Installed(self.trainer, version, row, mode, tuple(places))

    def uninstall(self) -> None:
        """Put the trainer's originals back wherever `install` replaced them, and take this install's
        settings of the alignment witness's switch out (`_WitnessSettings`, in any order). Idempotent."""
        with self.lock:
            self.patcher.uninstall()
            _WITNESS.drop(self)
            self.release = None

    def installed(self) -> bool:
        """True between `install` and `uninstall`."""
        return self.patcher.installed()

    def mode(self) -> str | None:
        """``"on"`` or ``"shadow"`` while installed, else None."""
        release = self.release
        return release[2] if release is not None and self.patcher.installed() else None

    def stats(self, json_path: str | None = None) -> dict[str, Any]:
        """The counters of the last install (kept after `uninstall`; all zero without one), written as
        JSON to ``json_path`` when given: shadow mode's (`_shadow.Shadow.stats`: calls, sampled,
        differences, defects, errors, trainer_seconds or ``<trainer>_seconds``, rebatch_seconds, by_name,
        messages, witness, trainer, version, mode, process) or an ``on`` install's (`_counts.Counts`)."""
        kept = self.kept
        if kept is None:
            kept = Shadow(0.0, "log", None, trainer=self.trainer, version=self.versions.installed())
        return kept.stats(json_path)


class _WitnessSettings:
    """The witness's switch as the installs in force set it (``install(witness=, unbound=)``): a stack of
    ``(integration, on, unbound)`` over the switch as it was before the first (``base``); each setting in
    force is the last install's that gave it, and an uninstall, in any order, takes only its own out."""

    def __init__(self) -> None:
        self.lock = ForkSafeLock()
        self.stack: list[tuple[Integration, bool | None, frozenset[Any] | None]] = []
        self.base: tuple[bool, frozenset[Any]] = (True, frozenset())

    def push(self, owner: Integration, on: bool | None, unbound: Iterable[Any] | None) -> None:
        from .._alignment import set_witness

        with self.lock:
            previous = set_witness(on, unbound=unbound)  # checks ``on`` first: nothing pushed if refused
            self.base = self.base if self.stack else previous
            self.stack.append((owner, on, None if unbound is None else frozenset(unbound)))

    def drop(self, owner: Integration) -> None:
        from .._alignment import set_witness

        with self.lock:
            if any(o is owner for o, _, _ in self.stack):
                self.stack = [e for e in self.stack if e[0] is not owner]
                on, unbound = self.base
                for _, o, u in self.stack:
                    on, unbound = on if o is None else o, unbound if u is None else u
                set_witness(on, unbound=unbound)


_WITNESS = _WitnessSettings()


def _shadowed(shadow: Shadow, r: Replaced, save: Callable[..., None] | None) -> Wrap:
    """The table value of a shadow install: the trainer's own function (found at install) wrapped by
    ``shadow`` with ``r``'s function and check in its shadow, ``save`` (a call's arguments) the first
    differing or misaligned step."""
    return Wrap(
        lambda theirs: shadow.wrap(
            r.short,
            theirs if r.observe is None else _observed(theirs, r.observe),
            r.ours,
            check=r.check,
            on_first_difference=save,
            keys_of=r.keys_of,
            mutates=r.mutates,
        )
    )


def _observed(theirs: Callable[..., Any], observe: Callable[..., None]) -> Callable[..., Any]:
    """``theirs``, its result handed to ``observe`` (a trainer's split recorded in shadow mode)."""

    @functools.wraps(theirs)
    def observed(*args: Any, **kwargs: Any) -> Any:
        result = theirs(*args, **kwargs)
        observe(result, *args, **kwargs)
        return result

    return observed


def _saving_first(
    ours: Callable[..., Any], save: Callable[..., None], saved: threading.Event
) -> Callable[..., Any]:
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
