"""Traced indices outside ``checkify`` (issue #24): a plain ``jax.jit`` over a ``ref`` operation with a traced
permutation or traced rows raises `UnsupportedSettingError` naming `ref.checked` at trace time, not JAX's
"Cannot abstractly evaluate a checkify.check which was not functionalized"; every way of functionalizing
the checks still runs them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import ref
from ref.errors import NotAPermutationError, RowIndexError, UnsupportedSettingError

#: The reference alone (JAX; no torch, no trainer): CI runs it once, in its main lane.
pytestmark = pytest.mark.main_lane_only

X = jnp.arange(8.0).reshape(4, 2)
PERM = jnp.asarray([2, 0, 3, 1])
BAD = jnp.asarray([2, 0, 2, 1])
WANT = np.asarray(ref.restore(X, [[2, 0, 3, 1]]))


JAGGED = ref.Jagged.from_rows([[1.0, 2.0], [3.0], [], [4.0, 5.0, 6.0]])


def _restore(a: Any, p: Any) -> Any:
    return ref.restore(a, p)


#: every operation of ``ref`` that takes traced indices, as ``fn(x, indices)`` (``postprocess_batch`` and
#: ``flatten_partitions`` take concrete partitions only)
OPERATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "restore": _restore,
    "restore_jagged": lambda a, p: ref.restore(JAGGED, p),
    "take_dense": lambda a, r: ref.take(a, r),
    "take_jagged": lambda a, r: ref.take(JAGGED, r),
    "inverse_permutation": lambda a, p: ref.inverse_permutation(p),
    "restore_in_scan": lambda a, p: jax.lax.scan(lambda c, q: (c, ref.restore(a, q)), 0, p[None])[1][0],
}

MESSAGE = re.escape("ref.checked(fn)")


@pytest.fixture(autouse=True)
def _x64_untouched():
    before = jax.config.jax_enable_x64
    yield
    assert jax.config.jax_enable_x64 == before, "rebatch changed the caller's jax_enable_x64"


@pytest.mark.parametrize("name", OPERATIONS)
def test_plain_jit_with_traced_indices_names_ref_checked(name: str) -> None:
    with pytest.raises(UnsupportedSettingError, match=MESSAGE) as info:
        jax.jit(OPERATIONS[name])(X, PERM)
    message = str(info.value)
    assert "jax.jit(checkify.checkify(fn))" in message
    assert "not functionalized" not in message


def test_the_issue_s_example() -> None:
    with pytest.raises(UnsupportedSettingError, match=r"ref\.checked") as info:
        jax.jit(lambda a, p: ref.restore(a, p))(X, PERM)
    assert isinstance(info.value, ref.errors.RebatchError)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", OPERATIONS)
def test_checked_still_runs_every_operation_and_its_checks(name: str) -> None:
    fn = ref.checked(OPERATIONS[name])
    fn(X, PERM)
    with pytest.raises(
        (NotAPermutationError, RowIndexError) if name.startswith("take") else NotAPermutationError
    ):
        fn(X, BAD if name != "take_dense" else jnp.asarray([0, 4]))


def test_checked_restore_result_and_bad_permutation() -> None:
    fn = ref.checked(_restore)
    assert np.array_equal(np.asarray(fn(X, PERM)), WANT)
    with pytest.raises(NotAPermutationError, match="position 2: index 2 duplicates position 0"):
        fn(X, BAD)
    with pytest.raises(
        NotAPermutationError, match="index -1 is negative"
    ):  # checkify alone: concrete indices
        ref.checked(_restore, jit=False)(X, jnp.asarray([2, 0, -1, 1]))


def _user_checkified(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The README's other way: ``checkify.checkify`` by the caller, the checks in the compiled program."""

    def run(*args: Any) -> Any:
        with jax.enable_x64(True):
            err, out = fn(*args)
        return err.get(), out

    return run


@pytest.mark.parametrize(
    "wrap",
    [
        lambda f: jax.jit(checkify.checkify(f, errors=checkify.user_checks)),
        lambda f: checkify.checkify(jax.jit(f), errors=checkify.user_checks),
        lambda f: jax.jit(checkify.checkify(jax.jit(f), errors=checkify.user_checks)),
    ],
    ids=["jit(checkify)", "checkify(jit)", "jit(checkify(jit))"],
)
def test_checkify_by_the_caller_runs_the_checks(wrap: Callable[[Any], Any]) -> None:
    run = _user_checkified(wrap(_restore))
    message, out = run(X, PERM)
    assert message is None
    assert np.array_equal(np.asarray(out), WANT)
    message, _ = run(X, BAD)
    assert message is not None
    assert "NotAPermutationError: position 2: index 2 duplicates position 0" in message


def test_checkify_alone_sees_concrete_indices() -> None:
    """``checkify.checkify(fn)`` without ``jit`` closes over its arguments: the indices are concrete there
    and checked in Python, as everywhere outside a staged trace."""
    run = checkify.checkify(_restore, errors=checkify.user_checks)
    err, out = run(X, PERM)
    assert err.get() is None
    assert np.array_equal(np.asarray(out), WANT)
    with pytest.raises(NotAPermutationError, match="duplicates"):
        run(X, BAD)


def test_vmap_and_grad_inside_checked() -> None:
    perms = jnp.stack([PERM, jnp.asarray([0, 1, 2, 3])])
    got = ref.checked(jax.vmap(_restore, in_axes=(None, 0)))(X, perms)
    assert np.array_equal(np.asarray(got[0]), WANT)
    with pytest.raises(NotAPermutationError):
        ref.checked(jax.vmap(_restore, in_axes=(None, 0)))(X, jnp.stack([PERM, BAD]))
    grad = ref.checked(jax.grad(lambda a, p: (ref.restore(a, p) * jnp.arange(8.0).reshape(4, 2)).sum()))
    g = grad(X, PERM)
    assert np.array_equal(np.asarray(ref.restore(g, [[2, 0, 3, 1]])), np.arange(8.0).reshape(4, 2))
    with pytest.raises(NotAPermutationError):
        grad(X, BAD)


def test_plain_jit_of_vmap_or_grad_is_refused_too() -> None:
    with pytest.raises(UnsupportedSettingError, match=MESSAGE):
        jax.jit(jax.vmap(_restore, in_axes=(None, 0)))(X, PERM[None])
    with pytest.raises(UnsupportedSettingError, match=MESSAGE):
        jax.jit(jax.grad(lambda a, p: ref.restore(a, p).sum()))(X, PERM)
    with pytest.raises(UnsupportedSettingError, match=MESSAGE):
        jax.make_jaxpr(_restore)(X, PERM)


def test_concrete_indices_under_plain_jit_still_work() -> None:
    perm = [2, 0, 3, 1]
    assert np.array_equal(np.asarray(jax.jit(lambda a: ref.restore(a, [perm]))(X)), WANT)
    assert np.array_equal(np.asarray(jax.jit(lambda a: ref.restore(a, np.asarray(perm)))(X)), WANT)
    assert np.array_equal(np.asarray(jax.jit(lambda a: ref.take(a, [2, 0]))(X)), np.asarray(X)[[2, 0]])
    restore_static = jax.jit(_restore, static_argnums=1)
    assert np.array_equal(np.asarray(restore_static(X, ((2, 0), (3, 1)))), WANT)
    with pytest.raises(NotAPermutationError, match="duplicates"):
        jax.jit(lambda a: ref.restore(a, [[2, 0, 2, 1]]))(X)


def test_traced_indices_without_checks_to_run_are_not_refused() -> None:
    """An empty traced index array binds no check: a plain ``jax.jit`` compiles it, as before."""
    empty = jnp.zeros((0,), dtype=jnp.int32)
    assert jax.jit(lambda a, r: ref.take(a, r))(X, empty).shape == (0, 2)
    assert jax.jit(_restore)(jnp.zeros((0, 2)), empty).shape == (0, 2)


def test_eager_vmap_checks_eagerly() -> None:
    """No staging, no refusal: under an eager ``vmap`` the checks run as they are bound."""
    got = jax.vmap(_restore, in_axes=(None, 0))(X, PERM[None])
    assert np.array_equal(np.asarray(got[0]), WANT)


def test_jax_s_runtime_errors_flag_compiles_the_checks_and_is_not_refused() -> None:
    """Under ``jax_experimental_unsafe_xla_runtime_errors`` JAX compiles an unfunctionalized check as a
    runtime error: the plain ``jax.jit`` then works, and a bad index fails when the program runs."""
    before = jax.config.jax_experimental_unsafe_xla_runtime_errors
    jax.config.update("jax_experimental_unsafe_xla_runtime_errors", True)
    try:
        fn = jax.jit(lambda a, p: ref.restore(a, p) * 1.0)
        assert np.array_equal(np.asarray(fn(X, PERM)), WANT)
        with pytest.raises(
            (jax.errors.JaxRuntimeError, checkify.JaxRuntimeError),
            match="NotAPermutationError: position 2: index 2 duplicates position 0",
        ):
            jax.block_until_ready(fn(X, BAD))
    finally:
        jax.config.update("jax_experimental_unsafe_xla_runtime_errors", before)
