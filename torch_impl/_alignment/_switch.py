"""The process-wide switch of the alignment checks: whether the drop-ins read the alignment witness (and
judge exact provenance) at all, and the keys the witness leaves unbound.

A switch, not a per-thread `torch_impl.Settings` knob: it decides whether an input is refused, not how
fast. Read once from the environment (``REBATCH_WITNESS``, ``REBATCH_WITNESS_UNBOUND``, named in
`rebatch_startup`, which carries them to the processes a trainer starts) at the first call that asks;
`set_witness` changes it for the process. `torch_impl._witness` and `torch_impl._provenance` both read it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from rebatch_startup import WITNESS_ENV, WITNESS_UNBOUND_ENV
from rebatch_startup.forksafe import ForkSafeLock
from ref.errors import UnsupportedSettingError

__all__ = ["ENV", "ENV_UNBOUND", "set_witness", "witness_config"]

#: The environment variables of the process-wide switch (read once, at the first call that asks), named in
#: `rebatch_startup` (torch-free), which carries them to the processes a trainer starts.
ENV = WITNESS_ENV
ENV_UNBOUND = WITNESS_UNBOUND_ENV

_lock = ForkSafeLock()  # a forked child finds it free (`rebatch_startup.renew_at_fork`)
_config: tuple[bool, frozenset[Any]] | None = None


def _from_env() -> tuple[bool, frozenset[Any]]:
    value = os.environ.get(ENV, "")
    text = value.strip().lower()
    if text not in ("", "on", "off"):
        raise UnsupportedSettingError(f"{ENV}={value!r}: expected on or off")
    unbound = frozenset(k.strip() for k in os.environ.get(ENV_UNBOUND, "").split(",") if k.strip())
    return text != "off", unbound


def witness_config() -> tuple[bool, frozenset[Any]]:
    """``(on, unbound keys)``: whether the drop-ins read the alignment witness from their input, and
    the keys declared unbound (`set_witness`; default from ``REBATCH_WITNESS`` and
    ``REBATCH_WITNESS_UNBOUND``, comma-separated keys)."""
    global _config
    config = _config
    if config is None:
        with _lock:
            if _config is None:
                _config = _from_env()
            config = _config
    return config


def set_witness(
    on: bool | None = None, *, unbound: Iterable[Any] | None = None
) -> tuple[bool, frozenset[Any]]:
    """Switch the drop-ins' alignment witness on or off for the whole process, and/or declare the keys
    it leaves unbound (a custom loss whose rows are not the batch's rows, say); None keeps a setting
    as it is. Returns the previous ``(on, unbound)``, which `set_witness` takes back:
    ``set_witness(*previous[:1], unbound=previous[1])``."""
    global _config
    previous = witness_config()
    if on is not None and not isinstance(on, bool):
        raise UnsupportedSettingError(f"set_witness: on must be a bool or None, got {on!r}")
    with _lock:
        _config = (previous[0] if on is None else on, previous[1] if unbound is None else frozenset(unbound))
    return previous
