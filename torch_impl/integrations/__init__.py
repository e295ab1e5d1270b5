"""Integrations of ``torch_impl`` into trainers; each imports its trainer only when called.

`stats` gives the counters of every integration installed in this process (`verl`, `areal`, `skyrl`),
however it was installed (``install()`` or the ``REBATCH`` variable, `rebatch_startup`)."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["TRAINERS", "stats"]

#: The integrations, by trainer.
TRAINERS = ("verl", "areal", "skyrl")


def stats() -> dict[str, dict[str, Any]]:
    """``{trainer: its stats()}`` for each integration that is installed or has shadow counters in this
    process (an integration never imported is left out, and not imported): shadow mode's counters
    (calls, sampled, differences, defects, errors, trainer_seconds, rebatch_seconds, by_name, messages,
    trainer, version, mode, process), ``mode`` ``"on"`` (counters all zero) or ``"shadow"``."""
    out: dict[str, dict[str, Any]] = {}
    for trainer in TRAINERS:
        module = sys.modules.get(f"{__name__}.{trainer}")
        if module is None:
            continue
        shadowed = module._integration.shadow is not None  # the shared install state (`_integration`)
        if not (module.installed() or shadowed):
            continue
        counters = module.stats()
        counters["mode"] = "shadow" if shadowed else "on"
        out[trainer] = counters
    return out
