"""Shadow mode: the trainer's own function stays in charge, rebatch's runs beside it (GitHub's Scientist).

One `Shadow` a shadow install, for every trainer (its lines and counters name it: ``trainer=``).
`Shadow.wrap` builds, for one replaced name, a wrapper that returns the trainer's result (the same
objects) and, on the side: on every call, runs rebatch's checks of the input (``check``; none: nothing
of rebatch's on unsampled calls); on sampled calls (the first, then every ``round(1 / sample)``-th of
that name; no random number generator touched), runs rebatch's own function and compares the results
bit for bit (`torch_impl._compare`); counts calls, sampled calls, differences, defects and rebatch's
other errors, and times both functions (wall clock: on a GPU, the launch).

A *defect* is an input rebatch refuses as misaligned (`DEFECTS`: an index that is not a permutation, a
micro-batch that does not match its partition, outputs that disagree, a `ref.errors.MisalignmentError`
of the alignment witness): the trainer's function would misalign that step silently. rebatch's check
(or, sampled, its function, whose checks run before any data moves) runs first; a defect is counted,
logged as an ERROR on ``rebatch.shadow`` (the trainer, the function, the keys, rebatch's message) and the
first one dumped, all BEFORE the trainer's function runs, so a trainer function that then fails (AReaL's
raises an ``AssertionError`` on a duplicate index) still leaves it in the counters and the report.
``on_defect="raise"`` raises the defect instead of running the trainer's function, and only a defect:
rebatch's other exceptions (a setting it refuses, a bug of its own) are counted and logged as a WARNING
once a name and class (`Counters.caught`), and the trainer's result is returned, whatever ``on_defect``. Each
difference is one ERROR line naming the trainer, the function, the call, the key, the row and both
values. A normal call logs nothing.

``report=``: a JSON file of `Shadow.stats` (trainer, release, mode, process), rewritten at each sampled
call, defect, difference or error and at exit, whole (`_files.Counters`: a forked child writes its own);
``rebatch report`` reads many of them.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ref.errors import (
    InvalidJaggedError,
    MisalignmentError,
    NotAPermutationError,
    OutputMismatchError,
    PartitionMismatchError,
    RowIndexError,
    UnsupportedSettingError,
)

from .._compare import first_difference
from ._files import Counters

__all__ = ["DEFECTS", "Shadow"]

log = logging.getLogger("rebatch.shadow")

#: rebatch's refusals that mean rows would be misaligned (what the trainer's function passes silently).
DEFECTS: tuple[type[Exception], ...] = (
    NotAPermutationError,
    PartitionMismatchError,
    OutputMismatchError,
    InvalidJaggedError,
    RowIndexError,
    MisalignmentError,
)

#: The counters of each name; ``trainer_seconds`` is also reported as ``<trainer>_seconds`` (verl's
#: documented ``verl_seconds``).
_FIELDS = ("calls", "sampled", "differences", "defects", "errors", "trainer_seconds", "rebatch_seconds")


def _keys(keys_of: Callable[..., Any] | None, args: Any, kwargs: Any) -> str:
    if keys_of is None:
        return ""
    try:
        return f" in keys {keys_of(*args, **kwargs)}"
    except Exception as err:  # an input too broken to name its keys: said in the defect's line
        return f" (its keys unreadable: {type(err).__name__}: {err})"


class _Site(NamedTuple):
    """One wrapped name: how its calls are reported; ``first`` is set at its first difference or defect."""

    name: str
    keys_of: Callable[..., Any] | None
    mutates: bool
    on_first_difference: Callable[..., Any] | None
    first: threading.Event


class Shadow(Counters):
    """Counters, sampling and reports shared by the wrappers of one shadow install."""

    def __init__(
        self,
        sample: float,
        on_defect: str,
        report: str | None,
        *,
        trainer: str = "verl",
        version: str | None = None,
    ) -> None:
        if not isinstance(sample, int | float) or not (
            sample == 0 or 2**-62 <= sample <= 1
        ):  # 1 / sample: finite
            raise UnsupportedSettingError(f"sample must be 0 or a fraction in [2**-62, 1], got {sample!r}")
        if on_defect not in ("log", "raise"):
            raise UnsupportedSettingError(f"on_defect must be 'log' or 'raise', got {on_defect!r}")
        #: every ``every``-th call of a name is sampled (0: only its first).
        self.every = round(1 / sample) if sample > 0 else 0
        self.on_defect = on_defect
        self.sample = float(sample)
        super().__init__(trainer, version, report)

    def renew_in_child(self) -> None:
        """Fresh counters, messages and lock (in a forked child: its report counts its own calls)."""
        super().renew_in_child()
        self.messages: list[str] = []

    def stats(self, json_path: str | None = None) -> dict[str, Any]:
        """Totals over every name, and ``"by_name"``; also written to ``json_path`` when given."""
        with self.lock:
            by_name = {name: dict(c) for name, c in self.by_name.items()}
            messages = list(self.messages)
        total: dict[str, Any] = {f: sum(c[f] for c in by_name.values()) for f in _FIELDS}
        alias = f"{self.trainer}_seconds"
        for c in [total, *by_name.values()]:
            for f in _FIELDS[:5]:
                c[f] = int(c[f])
            c[alias] = c["trainer_seconds"]
        total["by_name"] = by_name
        total["messages"] = messages
        return self.finished(total, json_path, mode="shadow", sample=self.sample, on_defect=self.on_defect)

    def _count(self, name: str, **add: float) -> None:
        with self.lock:
            c = self.by_name.setdefault(name, dict.fromkeys(_FIELDS, 0.0))
            for k, v in add.items():
                c[k] += v

    def _say(self, level: int, name: str, n: int, message: str) -> None:
        """One line on the ``rebatch.shadow`` logger, naming the trainer, the function and the call (the
        first 100 kept for `stats`)."""
        text = f"{self.trainer} {name}, call {n}: {message}"
        with self.lock:
            if len(self.messages) < 100:
                self.messages.append(text)
        log.log(level, "%s", text)

    def _first_bad(self, site: _Site, args: Any, kwargs: Any) -> None:
        """The site's first difference or defect: ``on_first_difference`` (the dump of that step), once."""
        if site.on_first_difference is not None and not site.first.is_set():
            site.first.set()
            site.on_first_difference(*args, **kwargs)

    def _before(self, site: _Site, n: int, failure: Exception, args: Any, kwargs: Any) -> None:
        """rebatch refused call ``n`` (before the trainer's function runs): a defect or another error,
        counted, logged, dumped (a defect) and reported now."""
        name, why, trainer = site.name, f"{type(failure).__name__}: {failure}", self.trainer
        if isinstance(failure, DEFECTS):
            self._count(name, defects=1)
            keys = _keys(site.keys_of, args, kwargs)
            misaligned = (
                f"{trainer}'s result of this step is misaligned{keys} (rebatch refuses its input, {why})"
            )
            self._say(logging.ERROR, name, n, misaligned)
            self._first_bad(site, args, kwargs)
        else:
            self._count(name, errors=1)
            if self.caught(f"{name}: {type(failure).__name__}"):
                self._say(
                    logging.WARNING, name, n, f"rebatch raised {why} (recorded; {trainer}'s result returned)"
                )
        self.write_report()

    def _after(self, site: _Site, n: int, mine: Any, result: Any, args: Any, kwargs: Any) -> None:
        """Compare sampled call ``n`` after the trainer's function returned ``result``, and report."""
        why = first_difference(mine, (result, (args, kwargs)) if site.mutates else result)
        if why is not None:
            self._count(site.name, differences=1)
            self._say(
                logging.ERROR,
                site.name,
                n,
                f"rebatch and {self.trainer} differ (rebatch vs {self.trainer}): {why}",
            )
            self._first_bad(site, args, kwargs)
        self.write_report()

    def _guarded(self, name: str, n: int, step: Callable[..., None], *args: Any) -> None:
        try:
            step(*args)
        except Exception as err:  # a comparison, a dump or a report that fails never breaks the run
            self._count(name, errors=1)
            if self.caught(f"{name}: shadow {type(err).__name__}"):
                self._say(logging.WARNING, name, n, f"shadow mode failed: {type(err).__name__}: {err}")

    def wrap(
        self,
        name: str,
        theirs: Callable[..., Any],
        ours: Callable[..., Any],
        check: Callable[..., Any] | None = None,
        on_first_difference: Callable[..., Any] | None = None,
        keys_of: Callable[..., Any] | None = None,
        mutates: bool = False,
    ) -> Callable[..., Any]:
        """``theirs`` in charge, ``ours`` (and ``check``) in its shadow. ``on_first_difference(*args,
        **kwargs)`` runs once, at the first call with a difference or a defect (a dump of that step);
        ``keys_of(*args, **kwargs)`` names the keys a defect misaligns, in its log line. ``mutates``: the
        function changes its arguments (verl's ``append_to_dict`` fills its first): ``ours`` runs on a
        deep copy of them, and the arguments after the call are compared too."""
        counter = iter(range(1 << 62))  # next() on a range iterator is atomic under the GIL
        site = _Site(name, keys_of, mutates, on_first_difference, threading.Event())

        @functools.wraps(theirs)
        def shadowed(*args: Any, **kwargs: Any) -> Any:
            n = next(counter)
            sampled = n == 0 or (self.every > 0 and n % self.every == 0)
            run = ours if sampled else check
            mine: Any = None
            failure: Exception | None = None
            t0 = time.perf_counter()
            if run is not None:
                try:
                    if sampled and mutates:
                        copied = copy.deepcopy((args, kwargs))
                        mine = (run(*copied[0], **copied[1]), copied)
                    else:
                        mine = run(*args, **kwargs)
                except Exception as err:  # recorded (Scientist: the candidate never breaks the run)
                    failure = err
            t1 = time.perf_counter()
            if failure is not None:  # recorded before the trainer's function runs (it may raise itself)
                self._count(name, calls=1, sampled=sampled, rebatch_seconds=t1 - t0)
                self._guarded(name, n, self._before, site, n, failure, args, kwargs)
                if self.on_defect == "raise" and isinstance(failure, DEFECTS):
                    raise failure
                t1 = time.perf_counter()
                try:
                    return theirs(*args, **kwargs)
                finally:
                    self._count(name, trainer_seconds=time.perf_counter() - t1)
            try:
                result = theirs(*args, **kwargs)
            finally:
                t2 = time.perf_counter()
                self._count(name, calls=1, sampled=sampled, trainer_seconds=t2 - t1, rebatch_seconds=t1 - t0)
            if sampled:
                self._guarded(name, n, self._after, site, n, mine, result, args, kwargs)
            return result

        return shadowed
