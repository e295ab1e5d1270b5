"""rebatch in verl switched on by an environment variable, the former home of verl's plugin.

verl's plugin is now `rebatch_startup.verl` (a torch-free package outside `torch_impl`, so that verl
processes with the variables unset import neither torch nor `torch_impl`): the ``verl.plugins`` entry
point is ``rebatch_startup.verl:activate`` and ``VERL_USE_EXTERNAL_MODULES=rebatch_startup.verl``. This
module stays for ``VERL_USE_EXTERNAL_MODULES=torch_impl.integrations.verl_plugin``: importing it activates
the same way (``REBATCH_VERL`` when set, else ``REBATCH``: see `rebatch_startup`).

===================  ==============================================================
``REBATCH_VERL``     effect
===================  ==============================================================
unset, ``off``       nothing: verl is untouched (unless ``REBATCH`` says otherwise, when unset)
``on``               ``torch_impl.integrations.verl.install()``
``shadow``           ``install(mode="shadow")`` (verl's functions stay in charge)
``shadow:0.05``      ``install(mode="shadow", sample=0.05)``
===================  ==============================================================

A failure is logged as an ERROR on the ``"rebatch"`` logger and, unless the mode is a shadow one, raised
as `ref.errors.UnsupportedSettingError` naming the variable.
"""

from __future__ import annotations

from typing import Any

import rebatch_startup

__all__ = ["ENV", "activate", "parse"]

#: verl's own environment variable (`rebatch_startup.VERL_ENV`; `rebatch_startup.ENV` for every trainer).
ENV = rebatch_startup.VERL_ENV

_lock = rebatch_startup.ForkSafeLock()
_active = False


def parse(value: str | None) -> dict[str, Any] | None:
    """``install``'s keyword arguments for a value of ``REBATCH_VERL`` (None: leave verl alone)."""
    setting = rebatch_startup.parse(value, ENV)
    if setting is None:
        return None
    if setting.mode == "on":
        return {}
    return {"mode": "shadow"} if setting.sample is None else {"mode": "shadow", "sample": setting.sample}


def activate() -> None:
    """Install rebatch in verl as the environment says (`rebatch_startup.activate`); nothing when the
    variables are unset or ``off``. Idempotent."""
    global _active
    with _lock:
        if _active:
            return
        _active = rebatch_startup.activate("verl", again=True)


activate()  # VERL_USE_EXTERNAL_MODULES imports this module and never calls the function
