"""Hypothesis profiles ``dev``, ``ci`` and ``fuzz``, and how one is chosen."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

__all__ = ["register_profiles", "PROFILE_ENV", "FUZZ_DATABASE_DIR"]

#: Environment variable naming the profile (``--hypothesis-profile`` on the pytest command line wins).
PROFILE_ENV = "REBATCH_HYPOTHESIS_PROFILE"
#: Where ``python -m property_tests.fuzz`` keeps its example database (failures are replayed first).
FUZZ_DATABASE_DIR = os.environ.get("REBATCH_FUZZ_DB", ".hypothesis/fuzz-db")

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]


def register_profiles() -> None:
    """Register the three profiles and load the one the environment asks for."""
    settings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=_SLOW_OK)
    settings.register_profile(
        "ci",
        max_examples=60,
        derandomize=True,
        deadline=None,
        print_blob=True,
        database=None,
        suppress_health_check=_SLOW_OK,
    )
    settings.register_profile(
        "fuzz",
        max_examples=10_000,
        deadline=None,
        print_blob=True,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        suppress_health_check=_SLOW_OK,
    )
    settings.load_profile(os.environ.get(PROFILE_ENV, "ci"))
