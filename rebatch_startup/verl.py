"""verl's plugin: importing this module is ``rebatch_startup.activate("verl")`` (``REBATCH_VERL``, else
``REBATCH``; nothing when both are unset or ``off``, and then nothing but this package is imported).

verl loads it itself: rebatch's distribution declares it a ``verl.plugins`` entry point
(``rebatch = "rebatch_startup.verl:activate"``), which verl 0.9.x's ``verl/__init__.py`` loads with
``ep.load()`` (an import, the function never called), and ``VERL_USE_EXTERNAL_MODULES=rebatch_startup.verl``
imports it in every verl release (0.8.0 has no plugin group). Both happen while ``verl`` is half-imported:
the install is lazy (`torch_impl.integrations.verl.install(lazy=True)`). Under ``on`` a failure raises
(verl 0.9.x's loader logs it at DEBUG and goes on, ``VERL_USE_EXTERNAL_MODULES`` stops the import); the
ERROR line on the ``"rebatch"`` logger is what always shows.
"""

from __future__ import annotations

from . import activate as _activate

__all__ = ["activate"]


def activate() -> bool:
    """Install rebatch in verl as the environment says (idempotent); True when it installed now."""
    return _activate("verl")


activate()  # verl's plugin loader imports this module and never calls the function
