"""The docstrings' list expressions run: each operation's ``>>>`` example evaluates the list expression
of its meaning against the function's result on a small input."""

from __future__ import annotations

import doctest
import importlib

import jax.numpy as jnp
import numpy as np
import pytest

import ref

#: The reference alone (JAX; no torch, no trainer): CI runs it once, in its main lane.
pytestmark = pytest.mark.main_lane_only

MODULES = [
    "ref._jagged",
    "ref._permutation",
    "ref._take",
    "ref._concat",
    "ref._restore",
    "ref._postprocess",
    "ref._layouts",
    "ref.structure",
    "ref.partition",
    "ref.provenance",
    "ref._provenance",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    globs = {"Jagged": ref.Jagged, "jnp": jnp, "np": np, "ref": ref}
    result = doctest.testmod(module, extraglobs=globs, verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
    assert result.attempted > 0, f"{name} has no examples"
