"""Fork safety, torch-free and importing nothing but the standard library: `ForkSafeLock`, a lock a forked
child finds free, and `renew_at_fork`, the one fork-reset mechanism of rebatch. Core code
(`torch_impl`) imports it from here; the startup hook (`rebatch_startup`) re-exports it."""

from __future__ import annotations

import os
import threading
from _weakrefset import WeakSet

TYPE_CHECKING = False  # typing itself is not imported at start
if TYPE_CHECKING:
    from typing import Protocol

    class _Renews(Protocol):
        def renew_in_child(self) -> None: ...


__all__ = ["ForkSafeLock", "renew_at_fork"]


class ForkSafeLock:
    """A re-entrant lock (``with lock:``) that a forked child finds free.

    A thread holding a plain lock when another thread forks does not exist in the child, where the lock
    stays held for ever: the child's first ``with lock:`` would wait for ever. Right after a fork the
    child renews every `ForkSafeLock` (`renew_at_fork`) but one its forking thread holds itself (that
    thread goes on in the child and releases it). For the locks held across imports and installs
    (`activate`'s, `torch_impl.integrations`' patcher's and install state's)."""

    __slots__ = ("__weakref__", "_depth", "_lock", "_owner")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None  # the holder's thread id (set and cleared by the holder only)
        self._depth = 0
        renew_at_fork(self)

    def __enter__(self) -> None:
        self._lock.acquire()
        self._owner = threading.get_ident()
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if not self._depth:
            self._owner = None
        self._lock.release()

    def renew_in_child(self) -> None:
        """In a forked child: free, unless the forking thread (going on here) holds it."""
        if self._owner != threading.get_ident():  # another thread's (gone here), or free
            self._lock, self._owner, self._depth = threading.RLock(), None, 0


# weakref.WeakSet itself (threading imported it: no module more at interpreter start)
_renewed: WeakSet[_Renews] = WeakSet()


def renew_at_fork(obj: _Renews) -> None:
    """Call ``obj.renew_in_child()`` in every child forked from this process, right after the fork (while
    ``obj`` lives): the one fork-reset mechanism of rebatch (`ForkSafeLock`; the counters of a report,
    `torch_impl.integrations._files.Counters`, which count the child's own calls)."""
    _renewed.add(obj)


def _renew_after_fork() -> None:
    # the locks first (a WeakSet has no order): a renewal that takes a lock then finds it free
    for obj in sorted(_renewed, key=lambda o: not isinstance(o, ForkSafeLock)):
        obj.renew_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_after_fork)
