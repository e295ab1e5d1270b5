"""rebatch in verl switched on by an environment variable, ``REBATCH_VERL``, in every process.

===================  ==============================================================
``REBATCH_VERL``     effect
===================  ==============================================================
unset, ``off``       nothing: verl is untouched
``on``               ``torch_impl.integrations.verl.install()``
``shadow``           ``install(mode="shadow")`` (verl's functions stay in charge)
``shadow:0.05``      ``install(mode="shadow", sample=0.05)``
===================  ==============================================================

verl loads this module itself: rebatch's distribution declares it a ``verl.plugins`` entry point
(``rebatch = "torch_impl.integrations.verl_plugin:activate"``), which verl 0.9.x's ``verl/__init__.py``
loads with ``ep.load()`` (an import, the function never called), and verl 0.8.0's
``VERL_USE_EXTERNAL_MODULES=torch_impl.integrations.verl_plugin`` imports it. So importing the module
is what activates; `activate` is idempotent and may also be called directly.

Both happen while ``verl`` is half-imported, so nothing of verl is imported here: the install is lazy
(`torch_impl.integrations._patch.Patcher.install_as_imported`): what verl has loaded is patched now,
``verl.workers.engine.utils`` and the other modules of the table right after each finishes importing,
so every engine imported later binds rebatch's functions.

Activation logs one INFO line per process (logger ``"rebatch"``, `torch_impl.integrations.verl.install`'s)
naming the verl release and what it replaces. The release is read from verl's metadata (verl is not
imported): one verl 0.8.0, 0.9.0 or 0.9.1, as `install`, or the activation fails. A failure is
logged as an ERROR and, unless the mode is a shadow one, raised (verl 0.9.x's entry-point loader
catches exceptions and logs them at DEBUG: the ERROR line is what shows; ``VERL_USE_EXTERNAL_MODULES``
lets the exception stop the import). Ray workers get the variable through the runtime environment:
``+ray_kwargs.ray_init.runtime_env.env_vars.REBATCH_VERL=on`` on verl's command line.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

__all__ = ["ENV", "activate", "parse"]

#: The environment variable read by `activate`.
ENV = "REBATCH_VERL"

log = logging.getLogger("rebatch")
_lock = threading.Lock()
_active = False


def parse(value: str | None) -> dict[str, Any] | None:
    """``install``'s keyword arguments for a value of ``REBATCH_VERL`` (None: leave verl alone)."""
    from ref.errors import UnsupportedSettingError

    text = (value or "").strip().lower()
    if text in ("", "off"):
        return None
    if text == "on":
        return {}
    mode, _, sample = text.partition(":")
    if mode == "shadow":
        if not sample:
            return {"mode": "shadow"}
        try:
            return {"mode": "shadow", "sample": float(sample)}
        except ValueError:
            pass
    raise UnsupportedSettingError(f"{ENV}={value!r}: expected off, on, shadow or shadow:FRACTION")


def activate() -> None:
    """Install rebatch in verl as ``REBATCH_VERL`` says (module docstring); nothing when it is unset
    or ``off``. Idempotent."""
    global _active
    value = os.environ.get(ENV)
    with _lock:
        if _active:
            return
        try:
            kwargs = parse(value)
            if kwargs is None:
                return
            from . import verl

            verl.install(lazy=True, **kwargs)
        except Exception as err:
            log.error("rebatch: %s=%s: could not install rebatch in verl: %s: %s", ENV, value, type(err).__name__, err)
            if not (value or "").strip().lower().startswith("shadow"):
                raise
            return
        _active = True  # install logged its INFO line (the verl release, what it replaces, what it leaves)


activate()  # verl's plugin loader imports this module and never calls the function
