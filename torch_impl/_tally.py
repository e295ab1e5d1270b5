"""The process's counters of torch_impl (the alignment witness's, every check skipped by reason: `SKIPS`),
zeroed
in a forked child by the one fork mechanism (`rebatch_startup.renew_at_fork`); a new reason or category is a
name.
"""

from __future__ import annotations

import threading

from rebatch_startup.forksafe import renew_at_fork

__all__ = ["SKIPS", "TALLY", "Tally", "skipped"]

#: Each reason a check is skipped, its counter (what is trusted in its place: ``docs/spec.md``, "Checked on
#: a device, and trusted"): a drop-in call whose input holds no lengths to witness; reading the witness
#: raised (its input is not a mapping); a jagged output's offsets off the CPU (trusted as torch built them).
SKIPS = ("calls_without_witness", "skipped_unreadable_witness", "skipped_device_offsets")


class Tally:
    """Named counters (``counts``, under ``lock``), zeroed in a forked child."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.renew_in_child()
        renew_at_fork(self)

    def renew_in_child(self) -> None:
        """Zeroed counters and a fresh lock (in a forked child: `rebatch_startup.renew_at_fork`)."""
        self.lock = threading.Lock()
        self.counts = dict.fromkeys(self.names, 0)

    def read(self, reset: bool = False) -> dict[str, int]:
        """The counters now (zeroed after the read with ``reset``)."""
        with self.lock:
            out = dict(self.counts)
            if reset:
                self.counts.update(dict.fromkeys(self.names, 0))
        return out


#: The witness's counters (`torch_impl.witness_stats`) and every skip's.
TALLY = Tally(("calls", "calls_binding_nothing", "keys_witnessed", "keys_unbound", *SKIPS))


def skipped(reason: str) -> None:
    """Count one check skipped for ``reason`` (a name of `SKIPS`)."""
    with TALLY.lock:
        TALLY.counts[reason] += 1
