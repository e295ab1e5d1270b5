"""The JAX reference as a JAX library (issue #15): traced permutations compiled once and checked under
jit, the jagged invariants checked however a `Jagged` was built, forward-mode AD, dtype hygiene,
interop copies, and the spec's settled points in both implementations."""

from __future__ import annotations

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import ref
import torch_impl
from property_tests.compare import assert_same, bits
from property_tests.convert import result_to_torch, to_ref
from property_tests.data import jagged, random_tensor
from ref import interop
from ref.dtypes import bits_dtype, check_dtype
from ref.errors import where


@pytest.fixture(autouse=True)
def _x64_untouched():
    before = jax.config.jax_enable_x64
    yield
    assert jax.config.jax_enable_x64 == before, "rebatch changed the caller's jax_enable_x64"


def _example(b: int = 5, seed: int = 3) -> tuple[torch.Tensor, ref.Jagged]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 4, size=b).tolist()
    nt = jagged(random_tensor(rng, (sum(lengths), 2), "float32"), lengths)
    return nt, to_ref(nt)


def _rows(x: ref.Jagged) -> list[list]:
    return [r.tolist() for r in x.rows()]


# 1. One compile for every permutation; traced indices checked under jit.


def test_ten_permutations_of_one_shape_compile_once() -> None:
    nt, x = _example(b=64)
    traces = []

    def step(a: ref.Jagged, perm: jax.Array) -> ref.Jagged:
        traces.append(1)  # a Python side effect: runs once per trace
        return ref.restore(a, perm)

    fn = ref.checked(step)
    rng = np.random.default_rng(0)
    for _ in range(10):
        perm = rng.permutation(64)
        got = fn(x, jnp.asarray(perm, dtype=jnp.int32))
        assert_same(result_to_torch(got), torch_impl.restore(nt, [perm.tolist()]))
    assert len(traces) == 1


def test_plain_jit_with_traced_partitions_array_compiles_once_for_dense() -> None:
    d = jnp.arange(12.0).reshape(6, 2)
    traces = []

    def step(a: jax.Array, perm: jax.Array) -> jax.Array:
        traces.append(1)
        return ref.take(a, ref.inverse_permutation(perm))

    fn = ref.checked(step)
    for seed in range(10):
        perm = np.random.default_rng(seed).permutation(6)
        assert np.array_equal(
            np.asarray(fn(d, jnp.asarray(perm))), np.asarray(ref.restore(d, [perm.tolist()]))
        )
    assert len(traces) == 1


@pytest.mark.parametrize(
    ("bad", "error", "pattern"),
    [
        ([0, 0, 1, 2, 3], ref.NotAPermutationError, r"position 1: index 0 duplicates position 0"),
        ([1, -1, 0, 2, 3], ref.NotAPermutationError, r"position 1: index -1 is out of range for 5 rows"),
        ([5, 0, 1, 2, 3], ref.NotAPermutationError, r"position 0: index 5 is out of range for 5 rows"),
        ([0, 1, 2, 3, 3], ref.NotAPermutationError, r"position 4: index 3 duplicates position 3"),  # the last
    ],
)
def test_traced_bad_permutation_is_detected_under_jit(bad, error, pattern) -> None:
    _, x = _example()
    for fn in (
        lambda a, p: ref.restore(a, p),
        lambda a, p: ref.take(a, p),  # jagged take under jit needs a permutation
        lambda a, p: ref.inverse_permutation(p),
    ):
        with pytest.raises(
            error if fn.__code__.co_names[-1] != "take" else (error, ref.RowIndexError), match=pattern
        ):
            ref.checked(fn)(x, jnp.asarray(bad))


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        ([7, -1], r"position 0: index 7 is out of range for 3 rows"),
        ([0, -1], r"position 1: index -1 is out of range"),
    ],
)
def test_traced_dense_take_never_wraps_or_clamps(bad, pattern) -> None:
    d = jnp.asarray([1.0, 2.0, 3.0])
    with pytest.raises(ref.RowIndexError, match=pattern):
        ref.checked(lambda a, r: ref.take(a, r))(d, jnp.asarray(bad))
    # duplicates are fine for dense take
    assert ref.checked(lambda a, r: ref.take(a, r))(d, jnp.asarray([2, 2, 0])).tolist() == [3.0, 3.0, 1.0]


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        ([0] * 35 + [1000] + [0] * 4, "position 35: index 1000 is out of range for 40 rows"),
        ([-5, *range(1, 40)], "position 0: index -5 is out of range for 40 rows"),
        ([*range(39), 99], "position 39: index 99 is out of range for 40 rows"),  # the last position
    ],
)
def test_traced_messages_show_the_position_and_index_as_they_are(bad, pattern) -> None:
    d = jnp.arange(40.0)
    with pytest.raises(ref.RowIndexError, match=re.escape(pattern)):
        ref.checked(lambda a, r: ref.take(a, r))(d, jnp.asarray(bad))


def test_traced_empty_indices_are_checked_and_taken() -> None:
    empty = jnp.zeros((0,), dtype=jnp.int32)
    assert ref.checked(lambda a, r: ref.take(a, r))(jnp.arange(3.0), empty).shape == (0,)
    assert ref.checked(lambda a, p: ref.restore(a, p))(jnp.zeros((0, 2)), empty).shape == (0, 2)
    assert ref.checked(ref.inverse_permutation)(empty).shape == (0,)


@pytest.mark.parametrize(("index", "shown"), [(2**40, 2**31 - 1), (-(2**40), -(2**31))])
def test_traced_indices_past_int32_are_shown_saturated(index: int, shown: int) -> None:
    """``checkify`` messages carry int32 (see `ref.checked`): an index past it shows as int32's bound."""
    d = jnp.arange(40.0)
    with jax.enable_x64(True):  # the caller's own int64 indices
        bad = jnp.asarray([0, index], dtype=jnp.int64)
        with pytest.raises(ref.RowIndexError, match=re.escape(f"position 1: index {shown} is out of range")):
            ref.checked(lambda a, r: ref.take(a, r))(d, bad)


@pytest.mark.parametrize("rows", [[0, 0, 2], [1, 2, 2]])
def test_jit_take_of_jagged_with_static_rows_needs_a_permutation(rows: list[int]) -> None:
    """Traced offsets, rows known at trace time: the result size is static only for a permutation."""
    x = ref.Jagged.from_rows([[1.0], [2.0, 3.0], []])
    with pytest.raises(ref.UnsupportedSettingError, match="needs rows that are a permutation"):
        jax.jit(lambda a: ref.take(a, rows))(x)
    assert jax.jit(lambda a: ref.take(a, [2, 0, 1]))(x).lengths().tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("index", "pattern"),
    [(jnp.asarray([0.0, 1.0]), "integers"), (jnp.asarray([[0, 1]]), "1-D"), (jnp.asarray(0), "1-D")],
)
def test_traced_index_dtype_and_rank_are_checked_at_trace_time(index, pattern) -> None:
    d = jnp.asarray([1.0, 2.0])
    with pytest.raises(ref.RowIndexError, match=pattern):
        jax.jit(lambda a, r: ref.take(a, r))(d, index)
    with pytest.raises(ref.NotAPermutationError, match=pattern):
        jax.jit(lambda a, p: ref.restore(a, p))(d, index)
    with pytest.raises(ref.NotAPermutationError, match="holds 3 indices for 2 rows"):
        jax.jit(lambda a, p: ref.restore(a, p))(d, jnp.asarray([0, 1, 2]))


def test_flat_permutation_eager_equals_partitions() -> None:
    nt, x = _example(b=6)
    parts = [[4, 1], [0, 5, 3, 2]]
    perm = np.asarray([i for p in parts for i in p])
    for flat in (perm, jnp.asarray(perm), jnp.asarray(perm, dtype=jnp.int32)):
        assert_same(result_to_torch(ref.restore(x, flat)), torch_impl.restore(nt, parts))
    with pytest.raises(ref.NotAPermutationError, match="duplicates"):
        ref.restore(x, np.asarray([0, 0, 1, 2, 3, 4]))


# 2. Jagged take without a search: equal to the list expression, zero-length rows included.


def test_jagged_take_by_repeat_matches_rows() -> None:
    x = ref.Jagged.from_rows([[1, 2], [], [3], [], [4, 5, 6], []])
    for rows in ([4, 0, 2, 1, 3, 5], [5, 1], [], [4, 4, 0]):
        assert _rows(ref.take(x, rows)) == [_rows(x)[i] for i in rows]
    empty = ref.Jagged.from_rows([], dtype=jnp.int32)
    assert ref.take(empty, []).num_rows == 0


# 3. The jagged invariants, however a Jagged was built.


def test_postprocess_checks_invariants_of_unvalidated_jagged() -> None:
    """The issue's input: micro-batch offsets [0, 1, 4] and [0, 3, 1]; both implementations refuse it."""
    good = ref.Jagged.tree_unflatten(None, (jnp.arange(4.0), jnp.asarray([0, 1, 4])))
    bad = ref.Jagged.tree_unflatten(None, (jnp.arange(1.0), jnp.asarray([0, 3, 1])))
    outs = [{"model_output": {"lp": good}}, {"model_output": {"lp": bad}}]
    with pytest.raises(
        ref.InvalidJaggedError, match=r"key 'lp', micro-batch 1: offsets must be non-decreasing"
    ):
        ref.postprocess_batch(outs, [[0, 3], [1, 2]])
    nts = [torch.nested.nested_tensor_from_jagged(torch.arange(4.0), torch.tensor([0, 1, 4]))]
    nts.append(torch.nested.nested_tensor_from_jagged(torch.arange(1.0), torch.tensor([0, 3, 1])))
    with pytest.raises(ref.InvalidJaggedError):
        torch_impl.postprocess_batch([{"model_output": {"lp": t}} for t in nts], [[0, 3], [1, 2]])


def test_tree_map_on_offsets_is_caught_and_map_values_is_the_way() -> None:
    x = ref.Jagged.from_rows([[1, 2], [3]])
    with jax.enable_x64(True):  # the offsets are int64
        doubled = jax.tree_util.tree_map(lambda a: a * 2, x)  # doubles the offsets too
    for op in (lambda y: ref.restore(y, [[1, 0]]), lambda y: ref.take(y, [0]), lambda y: ref.concat([y])):
        with pytest.raises(
            ref.InvalidJaggedError, match=r"offsets\[-1\] must equal len\(values\) = 3, got 6"
        ):
            op(doubled)
    assert _rows(ref.restore(x.map_values(lambda v: v * 2), [[1, 0]])) == [[6], [2, 4]]
    with pytest.raises(ref.InvalidJaggedError):
        x.map_values(lambda v: v[:1])  # changes the packed length


def test_jit_output_jagged_is_checked_when_used_eagerly() -> None:
    x = ref.Jagged.from_rows([[1, 2], [3]])
    broken = jax.jit(lambda y: ref.Jagged.tree_unflatten(None, (y.values, y.offsets[::-1])))(x)
    with pytest.raises(ref.InvalidJaggedError, match=r"offsets\[0\] must be 0"):
        ref.take(broken, [0, 1])


# 4. Forward-mode AD, the forward pass still bit-exact.


def test_jvp_and_jacfwd_of_restore_take_concat() -> None:
    x = ref.Jagged.from_rows([[1.0, 2.0], [3.0], [4.0, 5.0, 6.0]])
    tangent = jnp.arange(6.0) + 10

    def restored(v: jax.Array) -> jax.Array:
        return ref.restore(ref.Jagged.tree_unflatten(None, (v, x.offsets)), [[2, 0], [1]]).values

    out, t_out = jax.jvp(restored, (x.values,), (tangent,))
    assert out.tolist() == [3.0, 4.0, 5.0, 6.0, 1.0, 2.0]  # rows 1, 2, 0 in original order
    assert t_out.tolist() == [12.0, 13.0, 14.0, 15.0, 10.0, 11.0]
    jac = jax.jacfwd(restored)(x.values)
    assert np.array_equal(np.asarray(jac), np.eye(6)[[2, 3, 4, 5, 0, 1]])
    assert np.array_equal(np.asarray(jax.jacrev(restored)(x.values)), np.asarray(jac))
    dense = jnp.arange(3.0)
    _, t_take = jax.jvp(lambda d: ref.take(d, [2, 0]), (dense,), (jnp.ones(3) * 7,))
    assert t_take.tolist() == [7.0, 7.0]
    _, t_cat = jax.jvp(lambda a, b: ref.concat([a, b]), (dense, dense), (jnp.ones(3), jnp.zeros(3)))
    assert t_cat.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_jvp_forward_pass_keeps_nan_payloads() -> None:
    raw = torch.tensor([0x7FC00001, 0x7F800003, -1], dtype=torch.int32)  # quiet and signalling NaNs
    vals = jnp.asarray(raw.view(torch.float32).numpy())
    out, _ = jax.jvp(lambda v: ref.take(v, [2, 1, 0]), (vals,), (jnp.ones(3),))
    assert torch.equal(bits(torch.from_numpy(np.array(out))), raw.flip(0))


# 5. Dtype hygiene.


def test_from_rows_follows_jax_defaults_and_ignores_empty_rows() -> None:
    assert ref.Jagged.from_rows([[1, 2], [], [3]]).dtype == jnp.int32
    assert ref.Jagged.from_rows([np.array([1, 2], dtype=np.int32), []]).dtype == jnp.int32
    assert ref.Jagged.from_rows([[1.5], []]).dtype == jnp.float32
    assert (
        ref.Jagged.from_rows([np.array([2**40], dtype=np.int64), []]).dtype == jnp.int64
    )  # arrays keep theirs
    assert ref.Jagged.from_rows([[], []]).dtype == jnp.float32
    with jax.enable_x64(True):
        assert ref.Jagged.from_rows([[1, 2], [], [3]]).dtype == jnp.int64
    x = ref.Jagged.from_rows([np.ones((2, 3), dtype=np.float16), []])
    assert x.values.shape == (2, 3)
    assert x.dtype == jnp.float16


def test_from_rows_takes_dtype_and_features_from_empty_rows_that_have_features() -> None:
    """An empty row ``[0, 3]`` is not an untyped ``[]``: its dtype and feature shape count."""
    x = ref.Jagged.from_rows([np.zeros((0, 3), dtype=np.int16)])
    assert (x.dtype, x.values.shape, x.num_rows) == (jnp.int16, (0, 3), 1)
    assert ref.Jagged.from_rows([np.ones((1, 2), np.int8), np.zeros((0, 2), np.float16)]).dtype == jnp.float16
    y = ref.Jagged.from_rows([np.zeros((2, 0), dtype=np.float32), []])  # no features: [] becomes [0, 0]
    assert (y.values.shape, y.lengths().tolist()) == ((2, 0), [2, 0])


def test_from_lengths_names_the_first_negative_length() -> None:
    with pytest.raises(ref.InvalidJaggedError, match=re.escape("got lengths[2] = -1")):
        ref.Jagged.from_lengths(np.arange(1), [1, 0, -1, -2])
    with pytest.raises(ref.InvalidJaggedError, match=re.escape("got lengths[1] = -1")):
        ref.Jagged.from_lengths(np.arange(1), [2, -1])


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[1.0], 2.0], "row 1 must have at least 1 dimension, got a scalar"),
        (
            [np.zeros((1, 2)), [], np.zeros((1, 3))],
            "row 2 has trailing shape (3,), unlike the first non-empty row's (2,)",
        ),
        ([[1.0], [1.0, [2.0, 3.0]]], "row 1 is not an array of numbers"),
        ([np.zeros((1, 2)), np.zeros((0, 3))], "row 1 has trailing shape (3,)"),  # an empty row with features
        ([np.zeros((1, 3)), np.zeros((1, 2))], "row 1 has trailing shape (2,)"),  # a smaller one
    ],
)
def test_from_rows_names_the_row_it_cannot_take(rows, message: str) -> None:
    with pytest.raises(ref.InvalidJaggedError, match=re.escape(message)):
        ref.Jagged.from_rows(rows)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_moves_exactly_in_ref(dtype: str) -> None:
    raw = np.arange(256, dtype=np.uint8)
    values = jnp.asarray(raw.view(getattr(jnp, dtype)).reshape(64, 4))
    x = ref.Jagged.from_lengths(values, [16, 0, 48])
    for out in (ref.restore(x, [[2, 0], [1]]), ref.concat([x, x]), ref.take(x, [2, 1, 0])):
        assert out.dtype == values.dtype
    got = np.asarray(ref.restore(x, [[2], [0, 1]]).values).view(np.uint8).ravel()
    assert np.array_equal(got, np.concatenate([raw[64:], raw[:64]]))
    got_dense = np.asarray(ref.take(values, [63, 0])).view(np.uint8).ravel()
    assert np.array_equal(got_dense, np.concatenate([raw[252:], raw[:4]]))


def test_unsupported_dtypes_raise_a_rebatch_error_in_both() -> None:
    for x in (jnp.zeros((2, 3), jnp.float4_e2m1fn), jnp.zeros((2,), jnp.int4)):
        with pytest.raises(ref.UnsupportedSettingError, match=r"dtype (float4_e2m1fn|int4) is not supported"):
            ref.restore(x, [[1, 0]])
    with pytest.raises(ref.UnsupportedSettingError, match=r"key 'c', micro-batch 0: dtype int4"):
        ref.postprocess_batch([{"model_output": {"c": jnp.zeros((2,), jnp.int4)}}], [[1, 0]])
    with pytest.raises(ref.UnsupportedSettingError, match=r"key 'c', micro-batch 0: dtype uint1"):
        torch_impl.postprocess_batch([{"model_output": {"c": torch.zeros(2, dtype=torch.uint1)}}], [[1, 0]])
    assert torch_impl.postprocess_batch(
        [{"model_output": {"c": torch.zeros(2, dtype=torch.complex64)}}], [[1, 0]]
    )
    assert ref.restore(jnp.zeros((2,), jnp.complex64), [[1, 0]]).dtype == jnp.complex64


def test_interop_copy_does_not_alias() -> None:
    a = torch.zeros(3)
    shared, owned = interop.from_torch(a), interop.from_torch(a, copy=True)
    a.add_(100)
    assert shared.tolist() == [100.0] * 3  # the documented default: zero-copy, aliased
    assert owned.tolist() == [0.0] * 3
    nt = jagged(torch.zeros(3), [1, 2])
    x = interop.from_torch(nt, copy=True)
    nt.values().add_(1)
    assert x.values.tolist() == [0.0] * 3
    back = interop.to_torch(x, copy=True)
    back.values().add_(5)
    assert x.values.tolist() == [0.0] * 3


# 6. The spec's settled points, in both implementations.


def test_partition_count_is_free_without_model_output_but_must_be_a_permutation() -> None:
    outs = [{"loss": 1.0}, {"loss": 2.0}]
    for impl in (ref.postprocess_batch, torch_impl.postprocess_batch):
        assert impl(outs, [[0, 1, 2]])["loss"] == [1.0, 2.0]
        with pytest.raises(ref.NotAPermutationError):
            impl(outs, [[0, 0]])


def test_row_count_mismatch_without_dynamic_batching_is_a_shape_mismatch_in_both() -> None:
    outs = [{"model_output": {"a": torch.zeros(2), "b": torch.zeros(3)}}]
    for impl, arg in ((torch_impl.postprocess_batch, outs), (ref.postprocess_batch, to_ref(outs))):
        with pytest.raises(
            ref.ShapeMismatchError, match=r"key 'b', micro-batch 0: 3 rows, but key 'a' has 2"
        ):
            impl(arg, None, use_dynamic_bsz=False)


def test_all_layout_dtype_shape_checks_come_before_any_row_count() -> None:
    """Micro-batch 0 has the wrong row count, micro-batch 1 the wrong dtype: the dtype is reported."""
    outs = [
        {"model_output": {"lp": torch.zeros(3)}},
        {"model_output": {"lp": torch.zeros(1, dtype=torch.float64)}},
    ]
    for impl, arg in ((torch_impl.postprocess_batch, outs), (ref.postprocess_batch, to_ref(outs))):
        with pytest.raises(ref.DtypeMismatchError, match="micro-batch 1"):
            impl(arg, [[0], [1]])


def test_output_offsets_are_int64_in_both() -> None:
    values = torch.arange(5.0)
    nt32 = torch.nested.nested_tensor_from_jagged(values, torch.tensor([0, 2, 5], dtype=torch.int32))
    x = ref.Jagged(jnp.arange(5.0), jnp.asarray([0, 2, 5], dtype=jnp.int32))
    assert ref.restore(x, [[1, 0]]).offsets.dtype == jnp.int64
    assert ref.concat([x]).offsets.dtype == jnp.int64
    assert (
        ref.postprocess_batch([{"model_output": {"v": x}}], [[1, 0]])["model_output"]["v"].offsets.dtype
        == jnp.int64
    )
    got = torch_impl.postprocess_batch([{"model_output": {"v": nt32}}], [[1, 0]])["model_output"]["v"]
    assert got.offsets().dtype == torch.int64


def test_float64_jvp_with_caller_x64() -> None:
    with jax.enable_x64(True):
        v = jnp.arange(3.0, dtype=jnp.float64)
        _, t = jax.jvp(lambda a: ref.take(a, [2, 0, 1]), (v,), (v + 1,))
        assert t.dtype == jnp.float64
        assert t.tolist() == [3.0, 1.0, 2.0]
    # without the caller's x64, float64 reverse mode (vjp) is covered by the property gradients_match_vjp


def test_float64_vjp_without_caller_x64() -> None:
    """Reverse mode of float64 data for a caller without 64-bit types: exact, float64 cotangents back."""
    assert not jax.config.jax_enable_x64
    v = interop.from_torch(torch.tensor([1 + 2**-40, 2.0, 3.0], dtype=torch.float64))
    out, pullback = jax.vjp(lambda a: ref.take(a, [2, 0, 1]), v)
    (grad,) = pullback(out)
    assert (out.dtype, grad.dtype) == (jnp.float64, jnp.float64)
    assert np.asarray(grad).tolist() == [1 + 2**-40, 2.0, 3.0]


PUBLIC = {
    "concat": ["parts", "key"],
    "take": ["x", "rows"],
    "restore": ["x", "partitions"],
    "split": ["x", "partitions"],
    "flatten_partitions": ["partitions", "num_rows"],
    "inverse_permutation": ["perm"],
    "postprocess_batch": [
        "output_lst",
        "indices",
        "use_dynamic_bsz",
        "pad_mode",
        "witness",
        "unbound",
        "provenance",
    ],
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_functions_keep_their_names_docs_and_signatures(name: str) -> None:
    """The 64-bit scope around each call is invisible to ``help()``, ``inspect`` and doctest."""
    fn = getattr(ref, name)
    assert fn.__name__ == name
    assert fn.__module__.startswith("ref.")
    assert "out = " in (fn.__doc__ or "") or name in (
        "flatten_partitions",
        "postprocess_batch",
        "inverse_permutation",
    )
    assert list(inspect.signature(fn).parameters) == PUBLIC[name]


KEYWORD_ONLY = {
    "ref.postprocess_batch": (
        ref.postprocess_batch,
        ["use_dynamic_bsz", "pad_mode", "witness", "unbound", "provenance"],
    ),
    "torch_impl.postprocess_batch": (
        torch_impl.postprocess_batch,
        ["use_dynamic_bsz", "pad_mode", "witness", "unbound", "provenance"],
    ),
    "ref.concat": (ref.concat, ["key"]),
    "ref.Jagged": (ref.Jagged, ["key", "micro_batch"]),
    "ref.Jagged.from_rows": (ref.Jagged.from_rows, ["dtype", "feature_shape"]),
    "ref.validate_jagged": (ref.validate_jagged, ["key", "micro_batch"]),
    "ref.checked": (ref.checked, ["jit"]),
    "ref.dtypes.check_dtype": (check_dtype, ["at", "grad_at"]),
    "ref.dtypes.bits_dtype": (bits_dtype, ["dtype"]),
    "ref.errors.where": (where, ["rank"]),
    "ref.interop.from_torch": (interop.from_torch, ["copy", "key", "micro_batch"]),
    "ref.interop.to_torch": (interop.to_torch, ["copy"]),
}


@pytest.mark.parametrize("name", sorted(KEYWORD_ONLY))
def test_settings_are_keyword_only_and_the_rest_can_be_named(name: str) -> None:
    fn, settings = KEYWORD_ONLY[name]
    params = inspect.signature(fn).parameters
    assert [params[n].kind for n in settings] == [inspect.Parameter.KEYWORD_ONLY] * len(settings)
    assert {p.kind for n, p in params.items() if n not in settings} == {
        inspect.Parameter.POSITIONAL_OR_KEYWORD
    }


def test_checked_keeps_the_name_and_doc_of_what_it_wraps() -> None:
    def step(a: jax.Array, p: jax.Array) -> jax.Array:
        """One step."""
        return ref.restore(a, p)

    for fn in (ref.checked(step), ref.checked(step, jit=False)):
        assert (fn.__name__, fn.__doc__) == ("step", "One step.")
        assert fn(jnp.arange(3.0), jnp.asarray([2, 0, 1])).tolist() == [1.0, 2.0, 0.0]


def test_zero_d_integer_entries_count_as_indices_in_both() -> None:
    """Iterating a tensor gives 0-d tensors; verl indexes with them, so both take them as their values."""
    nt, x = _example()
    partitions = [list(torch.tensor([4, 1])), [np.array(0), np.int64(3), 2]]
    assert_same(result_to_torch(ref.restore(x, partitions)), torch_impl.restore(nt, partitions))
    assert_same(torch_impl.restore(nt, partitions), torch_impl.restore(nt, [[4, 1], [0, 3, 2]]))
    for impl, v in ((torch_impl, nt), (ref, x)):  # a one-element 1-D entry is a sequence, not an integer
        with pytest.raises(ref.NotAPermutationError, match=r"position 0: index array.* is not an integer"):
            impl.restore(v, [[np.array([4]), 1], [0, 3, 2]])


def test_a_missing_index_is_the_first_missing_in_both() -> None:
    nt, x = _example()
    for impl, v in ((torch_impl, nt), (ref, x)):
        with pytest.raises(
            ref.NotAPermutationError, match=re.escape("index 1 is missing: the partitions hold 3")
        ):
            impl.restore(v, [[0], [4, 3]])


@pytest.mark.parametrize("pad_mode", ["right", "left_right"])
def test_jagged_outputs_with_padding_are_refused_in_both(pad_mode: str) -> None:
    nt, x = _example()
    for impl, v in ((torch_impl, nt), (ref, x)):
        with pytest.raises(ref.UnsupportedSettingError, match="jagged outputs need pad_mode 'no_padding'"):
            impl.postprocess_batch([{"model_output": {"lp": v}}], [[4, 1, 0, 3, 2]], pad_mode=pad_mode)


def test_flat_permutation_is_int64_without_caller_x64() -> None:
    assert not jax.config.jax_enable_x64
    assert ref.flatten_partitions([[1], [0, 2]], 3).dtype == jnp.int64
    assert ref.inverse_permutation([1, 0, 2]).dtype == jnp.int64


def test_a_traced_permutation_of_one_row_is_checked() -> None:
    with pytest.raises(ref.NotAPermutationError, match="position 0: index 1 is out of range for 1 rows"):
        ref.checked(lambda a, p: ref.restore(a, p))(jnp.zeros((1,)), jnp.asarray([1]))
    assert ref.checked(lambda a, p: ref.restore(a, p))(jnp.ones((1,)), jnp.asarray([0])).tolist() == [1.0]


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        (np.array(3), "indices must be a list of partitions, got ndarray of shape ()"),
        (
            [np.array(3)],
            "micro-batch 0: a partition must be a 1-D sequence of row indices, got ndarray of shape ()",
        ),
        ([{4, 1, 0, 3, 2}], "micro-batch 0: a partition must be a 1-D sequence of row indices, got set"),
    ],
)
def test_postprocess_refuses_partitions_of_the_wrong_shape_alike_in_both(indices, message: str) -> None:
    nt, x = _example()
    for impl, v in ((torch_impl, nt), (ref, x)):
        with pytest.raises(ref.PartitionMismatchError, match=re.escape(message)):
            impl.postprocess_batch([{"model_output": {"v": v}}], indices)


@pytest.mark.parametrize("partitions", [3, None, np.array(3), iter([[4, 1, 0, 3, 2]])])
def test_restore_refuses_partitions_that_are_not_a_list_alike_in_both(partitions) -> None:
    nt, x = _example()
    for impl, v in ((torch_impl, nt), (ref, x)):
        with pytest.raises(ref.PartitionMismatchError, match="partitions must be a list of partitions, got"):
            impl.restore(v, partitions)


def test_a_partition_error_names_its_micro_batch_in_both() -> None:
    nt, x = _example()
    for impl, v in ((torch_impl, nt), (ref, x)):
        with pytest.raises(
            ref.PartitionMismatchError, match=r"^micro-batch 1: a partition must be a 1-D sequence"
        ):
            impl.restore(v, [[4, 1, 0, 3, 2], "ab"])


@pytest.mark.parametrize(
    ("rows", "error"),
    [
        (0, "rows must be 1-D"),
        ([[0, 1]], "rows must be 1-D"),
        ([0.0, 1.0], "rows must be integers"),
        ([0, 7], "position 1: row index 7 is out of range for 5 rows"),
        ([0, 5], "position 1: row index 5 is out of range for 5 rows"),
    ],
)
def test_concrete_take_rows_are_checked_alike_in_both(rows, error: str) -> None:
    nt, x = _example()
    for impl, v in ((torch_impl, nt), (ref, x)):
        with pytest.raises(ref.RowIndexError, match=re.escape(error)):
            impl.take(v, rows)


def test_postprocess_of_numpy_64_bit_outputs_is_exact_without_caller_x64() -> None:
    assert not jax.config.jax_enable_x64
    ints = np.array([2**40 + 1, -(2**62)], dtype=np.int64)
    floats = np.array([1 + 2**-40, np.pi], dtype=np.float64)
    out = ref.postprocess_batch([{"model_output": {"i": ints, "f": floats}}], [[1, 0]])["model_output"]
    assert (out["i"].dtype, out["f"].dtype) == (jnp.int64, jnp.float64)
    assert np.asarray(out["i"]).tolist() == ints[::-1].tolist()
    assert np.asarray(out["f"]).tolist() == floats[::-1].tolist()


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_unsigned_integers_move_exactly_in_ref(dtype: type) -> None:
    """The unsigned widths torch lacks (so ``DTYPES``, shared with torch, does not list them)."""
    top = int(np.iinfo(dtype).max)
    values = np.array([1, top, top // 2 + 1], dtype=dtype)
    got = ref.take(values, [2, 0, 1])
    assert got.dtype == dtype
    assert np.asarray(got).tolist() == [top // 2 + 1, 1, top]


def test_result_keys_follow_the_first_micro_batch_in_both() -> None:
    nt, x = _example()
    dense = torch.arange(5.0)
    for impl, v, d in ((torch_impl, nt, dense), (ref, x, jnp.asarray(dense.numpy()))):
        pieces = impl.split(v, [[4, 1], [0, 3, 2]])
        dpieces = impl.split(d, [[4, 1], [0, 3, 2]])
        outs = [
            {"model_output": {"b": pieces[0], "a": dpieces[0]}},
            {"model_output": {"a": dpieces[1], "b": pieces[1]}},
        ]
        assert list(impl.postprocess_batch(outs, [[4, 1], [0, 3, 2]])["model_output"]) == ["b", "a"]


@pytest.mark.parametrize("jagged_first", [True, False])
def test_a_layout_that_differs_either_way_is_refused_in_both(jagged_first: bool) -> None:
    nt, x = _example(b=2)
    for impl, j, d in ((torch_impl, nt, torch.zeros(2)), (ref, x, jnp.zeros(2))):
        parts = [j, d] if jagged_first else [d, j]
        with pytest.raises(ref.ShapeMismatchError, match="micro-batch 1: layout"):
            impl.concat(parts)


@pytest.mark.parametrize(("first", "second"), [(3, 2), (2, 3)])
def test_a_trailing_shape_that_differs_either_way_is_refused_in_both(first: int, second: int) -> None:
    for impl, make in ((torch_impl, torch.zeros), (ref, jnp.zeros)):
        with pytest.raises(ref.ShapeMismatchError, match=re.escape(f"trailing shape ({second},) differs")):
            impl.concat([make((1, first)), make((1, second))])


def test_a_traced_permutation_shorter_than_the_batch_is_refused() -> None:
    with pytest.raises(ref.NotAPermutationError, match="holds 1 indices for 2 rows"):
        jax.jit(lambda a, p: ref.restore(a, p))(jnp.zeros(2), jnp.asarray([0]))


@pytest.mark.parametrize("rows", [[0, 1, 2, 0], [0, 1]])
def test_traced_jagged_take_of_other_than_the_batch_s_rows_is_refused(rows: list[int]) -> None:
    x = ref.Jagged.from_rows([[1.0], [2.0, 3.0], []])
    with pytest.raises(ref.UnsupportedSettingError, match=re.escape("needs a permutation of range(3)")):
        ref.checked(lambda a, r: ref.take(a, r))(x, jnp.asarray(rows))


def test_counts_past_small_ints_are_compared_by_value_in_both() -> None:
    """300 rows: CPython shares the int objects only up to 256."""
    dense = torch.arange(300.0)
    perm = list(range(299, -1, -1))
    for impl, v in ((torch_impl, dense), (ref, jnp.asarray(dense.numpy()))):
        assert np.asarray(impl.flatten_partitions([perm[:150], perm[150:]], 300)).tolist() == perm
        out = impl.postprocess_batch([{"model_output": {"v": v}}], [perm])["model_output"]["v"]
        assert np.asarray(out).tolist()[:2] == [299.0, 298.0]
        out = impl.postprocess_batch([{"model_output": {"v": v, "w": v * 2}}], None, use_dynamic_bsz=False)
        assert len(out["model_output"]["w"]) == 300


def test_an_object_array_of_partitions_is_a_list_of_partitions_in_both() -> None:
    nt, x = _example()
    partitions = np.empty(2, dtype=object)
    partitions[0], partitions[1] = [4, 1], [0, 3, 2]
    expected = torch_impl.restore(nt, [[4, 1], [0, 3, 2]])
    assert_same(torch_impl.restore(nt, partitions), expected)
    assert_same(result_to_torch(ref.restore(x, partitions)), expected)


def test_row_counts_are_checked_before_the_offsets_in_both() -> None:
    """A micro-batch with the wrong row count and broken offsets: the row count is named (spec step 4c)."""
    values = torch.arange(3.0)
    broken = torch.nested.nested_tensor_from_jagged(
        values, torch.tensor([0, 2, 1, 3])
    )  # torch does not check
    unchecked = ref.Jagged.tree_unflatten(None, (jnp.arange(3.0), jnp.asarray([0, 2, 1, 3])))
    for impl, v in ((torch_impl, broken), (ref, unchecked)):
        with pytest.raises(ref.PartitionMismatchError, match="3 rows, but its partition has 2 indices"):
            impl.postprocess_batch([{"model_output": {"v": v}}], [[1, 0]])


def test_without_dynamic_batching_row_counts_are_named_against_the_first_key_in_both() -> None:
    for impl, make in ((torch_impl, torch.zeros), (ref, jnp.zeros)):
        outs = [
            {"model_output": {"a": make(2), "b": make(2)}},
            {"model_output": {"b": make(3), "a": make(2)}},
        ]
        with pytest.raises(
            ref.ShapeMismatchError, match=re.escape("micro-batch 1: 3 rows, but key 'a' has 2 there")
        ):
            impl.postprocess_batch(outs, None, use_dynamic_bsz=False)


def test_a_2_d_array_of_partitions_and_300_traced_rows() -> None:
    nt, x = _example()
    assert_same(
        result_to_torch(ref.restore(x, np.array([[4, 1, 0, 3, 2]]))),
        torch_impl.restore(nt, [[4, 1, 0, 3, 2]]),
    )
    d = jnp.arange(300.0)
    perm = jnp.asarray(np.arange(300)[::-1].copy())
    assert ref.checked(lambda a, p: ref.restore(a, p))(d, perm).tolist()[:2] == [299.0, 298.0]
    assert (
        ref.checked(lambda a, r: ref.take(a, r))(ref.Jagged.from_lengths(d, [1] * 300), perm).values[0]
        == 299.0
    )
