"""Integrations of ``torch_impl`` into trainers; each imports its trainer only when called.

Each trainer's module (one per trainer declared in `rebatch_startup.trainers`) is its table of
replacements and their adapters, declared as one `_integration.Integration` (``INTEGRATION``) whose bound
methods are its ``install``, ``uninstall``, ``stats``, ``mode``, ``installed`` and ``replacements``.
`stats` here gives the counters of every integration installed in this process, however it was installed
(``install()`` or the ``REBATCH`` variable, `rebatch_startup`)."""

from __future__ import annotations

import sys
from typing import Any

from rebatch_startup.trainers import names

__all__ = ["TRAINERS", "stats"]

#: The integrations, by trainer (declared once, in `rebatch_startup.trainers`).
TRAINERS = names()


def stats() -> dict[str, dict[str, Any]]:
    """``{trainer: its stats()}`` for each integration installed or with counters kept in this process
    (one never imported is left out, and not imported); ``mode`` says whose: ``"shadow"`` or ``"on"``."""
    out: dict[str, dict[str, Any]] = {}
    for trainer in TRAINERS:
        module = sys.modules.get(f"{__name__}.{trainer}")
        if module is not None and (module.installed() or module.INTEGRATION.kept is not None):
            out[trainer] = module.stats()  # its ``mode`` says whose counters they are
    return out
