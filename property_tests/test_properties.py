"""The property suite: each registered property as a Hypothesis test (collected by pytest and HypoFuzz).

The profile (``dev``, ``ci``, ``fuzz``) sets the number of examples; slow properties cap it outside ``fuzz``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings

from property_tests.properties import PROPERTIES, Property


def _make_test(prop: Property) -> Any:
    test = given(prop.strategy)(prop.check)
    current = settings()  # the profile in force
    if prop.max_examples is not None and settings._current_profile != "fuzz":
        test = settings(current, max_examples=min(current.max_examples, prop.max_examples))(test)
    test.__name__ = f"test_{prop.name}"
    test.__doc__ = prop.check.__doc__
    return test


for _name, _prop in PROPERTIES.items():
    globals()[f"test_{_name}"] = _make_test(_prop)
