"""The mutants run is part of the test command: every seeded defect of torch_impl must be caught."""

from __future__ import annotations

import pytest

from property_tests.mutants import MUTANTS, run_mutant


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_is_caught(name: str) -> None:
    caught, how = run_mutant(name)
    assert caught, f"{name}: {how}"


def test_at_least_six_mutants() -> None:
    assert len(MUTANTS) >= 6
