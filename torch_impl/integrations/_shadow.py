"""Shadow mode: the trainer's own function stays in charge, rebatch's runs beside it (GitHub's Scientist).

`Shadow.wrap` builds, for one replaced name, a wrapper that returns the trainer's result (the same
objects) and, on the side:

* on every call, runs rebatch's checks of the input (``check``; where a name has none, nothing of
  rebatch's runs on unsampled calls);
* on sampled calls (the first, then every ``k``-th call of that name, ``k = round(1 / sample)``; no
  random number generator is touched), runs rebatch's own function and compares the two results bit
  for bit (`torch_impl._compare`: values as integers of their bits, offsets, dtypes, devices, the order
  of losses, metrics and micro-batches);
* counts calls, sampled calls, differences, defects and rebatch's other errors, and times both
  functions (wall clock: on a GPU, the time to launch, not to finish, asynchronous work).

A *defect* is an input rebatch refuses as misaligned (`DEFECTS`) that the trainer's function then
passes: logged as an ERROR on ``logging.getLogger("rebatch.shadow")`` saying that the trainer's result
of that call is misaligned, with rebatch's message (the key, micro-batch and index or row). With
``on_defect="raise"`` the `ref.errors.RebatchError` is raised instead, before the trainer's function
runs. rebatch's other exceptions are recorded (counted, logged as a WARNING), never raised into the run
(unless ``on_defect="raise"``). Each difference is one ERROR line naming the function, the call, the
place (key), the row and both values. A normal call logs nothing.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ref.errors import (
    InvalidJaggedError,
    NotAPermutationError,
    OutputMismatchError,
    PartitionMismatchError,
    RowIndexError,
    UnsupportedSettingError,
)

from .._compare import first_difference

__all__ = ["DEFECTS", "Shadow"]

log = logging.getLogger("rebatch.shadow")

#: rebatch's refusals that mean rows would be misaligned (what the trainer's function passes silently).
DEFECTS: tuple[type[Exception], ...] = (
    NotAPermutationError,
    PartitionMismatchError,
    OutputMismatchError,
    InvalidJaggedError,
    RowIndexError,
)

_FIELDS = ("calls", "sampled", "differences", "defects", "errors", "verl_seconds", "rebatch_seconds")


def _keys(keys_of: Callable[..., Any] | None, args: Any, kwargs: Any) -> str:
    if keys_of is None:
        return ""
    try:
        return f" in keys {keys_of(*args, **kwargs)}"
    except Exception:  # an input too broken to name its keys: the message says the rest
        return ""


class _Site(NamedTuple):
    """One wrapped name: how its calls are reported; ``first`` is set at its first difference or defect."""

    name: str
    keys_of: Callable[..., Any] | None
    mutates: bool
    on_first_difference: Callable[..., Any] | None
    first: threading.Event


class Shadow:
    """Counters, sampling and reports shared by the wrappers of one shadow install."""

    def __init__(self, sample: float, on_defect: str, report: str | None) -> None:
        if not isinstance(sample, int | float) or not 0 <= sample <= 1:
            raise UnsupportedSettingError(f"sample must be a fraction in [0, 1], got {sample!r}")
        if on_defect not in ("log", "raise"):
            raise UnsupportedSettingError(f"on_defect must be 'log' or 'raise', got {on_defect!r}")
        #: every ``every``-th call of a name is sampled (0: only its first).
        self.every = round(1 / sample) if sample > 0 else 0
        self.on_defect = on_defect
        self.report = report
        self._lock = threading.Lock()
        self._by_name: dict[str, dict[str, float]] = {}
        self._messages: list[str] = []

    def stats(self, json_path: str | None = None) -> dict[str, Any]:
        """Totals over every name, and ``"by_name"``; also written to ``json_path`` when given."""
        with self._lock:
            by_name = {name: dict(c) for name, c in self._by_name.items()}
            messages = list(self._messages)
        total: dict[str, Any] = {f: sum(c[f] for c in by_name.values()) for f in _FIELDS}
        for f in _FIELDS[:5]:
            total[f] = int(total[f])
            for c in by_name.values():
                c[f] = int(c[f])
        total["by_name"] = by_name
        total["messages"] = messages
        if json_path is not None:
            with open(json_path, "w") as out:
                json.dump(total, out, indent=1)
        return total

    def _count(self, name: str, **add: float) -> None:
        with self._lock:
            c = self._by_name.setdefault(name, dict.fromkeys(_FIELDS, 0.0))
            for k, v in add.items():
                c[k] += v

    def _say(self, level: int, message: str, *args: Any) -> None:
        text = message % args if args else message
        with self._lock:
            if len(self._messages) < 100:
                self._messages.append(text)
        log.log(level, "%s", text)

    def _publish(
        self,
        site: _Site,
        n: int,
        sampled: bool,
        failure: Exception | None,
        mine: Any,
        result: Any,
        args: Any,
        kwargs: Any,
    ) -> None:
        """Count, log and report call ``n`` after the trainer's function returned ``result``."""
        name, keys_of, mutates, on_first_difference, first = site
        bad = False
        if isinstance(failure, DEFECTS):
            bad = True
            self._count(name, defects=1)
            keys = _keys(keys_of, args, kwargs)
            self._say(
                logging.ERROR,
                "%s, call %d: verl's result of this step is misaligned%s (rebatch refuses its input, %s: %s)",
                name,
                n,
                keys,
                type(failure).__name__,
                failure,
            )
        elif failure is not None:
            self._count(name, errors=1)
            self._say(
                logging.WARNING,
                "%s, call %d: rebatch raised %s: %s (recorded; verl's result returned)",
                name,
                n,
                type(failure).__name__,
                failure,
            )
        elif sampled:
            why = first_difference(mine, (result, (args, kwargs)) if mutates else result)
            if why is not None:
                bad = True
                self._count(name, differences=1)
                self._say(logging.ERROR, "%s, call %d: rebatch and verl differ (rebatch vs verl): %s", name, n, why)
        if bad and on_first_difference is not None and not first.is_set():
            first.set()
            on_first_difference(*args, **kwargs)
        if sampled and self.report is not None:
            self.stats(json_path=self.report)

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
            if failure is not None and self.on_defect == "raise":
                kind = "defects" if isinstance(failure, DEFECTS) else "errors"
                self._count(name, calls=1, sampled=sampled, rebatch_seconds=t1 - t0, **{kind: 1})
                raise failure
            try:
                result = theirs(*args, **kwargs)
            finally:
                t2 = time.perf_counter()
                self._count(name, calls=1, sampled=sampled, verl_seconds=t2 - t1, rebatch_seconds=t1 - t0)
            try:
                self._publish(site, n, sampled, failure, mine, result, args, kwargs)
            except Exception as err:  # a comparison, a dump or a report that fails never breaks the run
                self._count(name, errors=1)
                self._say(logging.WARNING, "%s, call %d: shadow mode failed: %s: %s", name, n, type(err).__name__, err)
            return result

        return shadowed
