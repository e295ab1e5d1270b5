"""Exact data movement in the reference: 64-bit types without the caller's x64 flag, NaN payloads,
every dtype through interop, zero-copy, and ``jax.jit`` equal to eager."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import ref
import torch_impl
from property_tests.compare import assert_same, bits
from property_tests.data import DTYPES, jagged, random_tensor
from property_tests.samples import HOLE_DEFECTS, holed_tensor
from ref import interop
from ref.dtypes import bits_dtype


@pytest.fixture(autouse=True)
def _x64_untouched():
    before = jax.config.jax_enable_x64
    yield
    assert jax.config.jax_enable_x64 == before, "rebatch changed the caller's jax_enable_x64"


@pytest.mark.parametrize("dtype", DTYPES)
def test_interop_round_trip_every_dtype(dtype: str) -> None:
    rng = np.random.default_rng(7)
    dense = random_tensor(rng, (6, 3), dtype)
    nt = jagged(random_tensor(rng, (9, 2), dtype), [4, 0, 5])
    assert_same(interop.to_torch(interop.from_torch(dense)), dense)
    assert_same(interop.to_torch(interop.from_torch(nt)), nt)
    assert str(interop.from_torch(dense).dtype) == dtype
    # and through an operation of each implementation (each checks the dtype is one it moves)
    assert_same(
        interop.to_torch(ref.restore(interop.from_torch(nt), [[2, 0], [1]])),
        torch_impl.restore(nt, [[2, 0], [1]]),
    )


def test_64_bit_survives_without_x64() -> None:
    assert not jax.config.jax_enable_x64
    big = torch.tensor([2**62 + 1, -(2**61) - 3], dtype=torch.int64)
    precise = torch.tensor([1 + 2**-40, np.pi], dtype=torch.float64)
    for t in (big, precise):
        x = interop.from_torch(t)
        assert x.dtype == t.dtype.__repr__().removeprefix("torch.")
        out = ref.restore(x, [[1], [0]])
        assert_same(interop.to_torch(out), t.flip(0))
        first, second = ref.split(x, [[1], [0]])
        assert_same(interop.to_torch(ref.concat([first, second])), t.flip(0))
    assert not jax.config.jax_enable_x64


def test_jagged_built_from_numpy_64_bit_keeps_it_without_x64() -> None:
    x = ref.Jagged(np.array([2**40 + 1, -(2**62)], dtype=np.int64), np.array([0, 2], dtype=np.int64))
    assert (x.values.dtype, x.offsets.dtype) == (jnp.int64, jnp.int64)
    assert np.asarray(x.values).tolist() == [2**40 + 1, -(2**62)]


def test_caller_x64_on_stays_on() -> None:
    with jax.enable_x64(True):
        ref.restore(ref.Jagged.from_rows([np.zeros(2), np.ones(1)]), [[1, 0]])
        assert jax.config.jax_enable_x64


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_nan_payloads_move_exactly(dtype: str) -> None:
    width = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}[dtype]
    as_int = getattr(torch, bits_dtype(width // 8))
    exp_bits = {"float16": 5, "bfloat16": 8, "float32": 8, "float64": 11}[dtype]
    mantissa = width - 1 - exp_bits
    nan_all_ones = ((1 << exp_bits) - 1) << mantissa
    payloads = [
        nan_all_ones | 1,
        nan_all_ones | (1 << (mantissa - 1)) | 5,
        nan_all_ones | 3,
    ]  # signalling and quiet
    raw = torch.tensor([p - (1 << width) if p >= 1 << (width - 1) else p for p in payloads], dtype=as_int)
    vals = raw.view(getattr(torch, dtype))
    nt = jagged(vals, [1, 2])
    got = interop.to_torch(ref.restore(interop.from_torch(nt), [[1, 0]]))
    assert torch.equal(bits(got.values()), torch.cat([raw[1:], raw[:1]]))
    got_t = torch_impl.restore(nt, [[1, 0]])
    assert torch.equal(bits(got_t.values()), torch.cat([raw[1:], raw[:1]]))


def test_interop_is_zero_copy_where_possible() -> None:
    t = torch.arange(12, dtype=torch.float32)
    x = interop.from_torch(t)
    back = interop.to_torch(x)
    assert back.data_ptr() == t.data_ptr()


def test_interop_reads_rows_with_holes_as_torch_impl_does() -> None:
    """A nested tensor with ``lengths``: rows at ``offsets[i]`` of ``lengths[i]`` values; empty rows
    allowed."""
    holed = torch.nested.nested_tensor_from_jagged(
        torch.arange(10.0), torch.tensor([0, 4, 8, 10]), lengths=torch.tensor([3, 0, 2])
    )
    x = interop.from_torch(holed)
    assert isinstance(x, ref.Jagged)
    assert (np.asarray(x.offsets).tolist(), np.asarray(x.values).tolist()) == (
        [0, 3, 3, 5],
        [0.0, 1.0, 2.0, 8.0, 9.0],
    )
    assert_same(interop.to_torch(x), torch_impl.concat([holed]))


@pytest.mark.parametrize(("offsets", "lengths", "message"), HOLE_DEFECTS)
def test_interop_names_the_row_with_a_broken_hole(offsets, lengths, message) -> None:
    holed = holed_tensor(offsets, lengths)
    with pytest.raises(ref.InvalidJaggedError, match=re.escape(f"key 'k', micro-batch 0: {message}")):
        interop.from_torch(holed, key="k", micro_batch=0)


@pytest.mark.parametrize(
    ("offsets", "lengths"),
    [
        ([0, 2, 4], torch.tensor([[2], [1]])),
        ([0, 2], torch.tensor([2.0])),
        ([0, 2], torch.tensor([2], dtype=torch.complex64)),
        ([0, 2], torch.tensor([True])),
    ],
)
def test_interop_refuses_lengths_that_are_not_integers_one_per_row(offsets, lengths) -> None:
    holed = torch.nested.nested_tensor_from_jagged(torch.arange(4.0), torch.tensor(offsets), lengths=lengths)
    with pytest.raises(
        ref.InvalidJaggedError, match=re.escape("key 'k', micro-batch 0: lengths must be 1-D integers")
    ):
        interop.from_torch(holed, key="k", micro_batch=0)


def test_interop_refuses_a_ragged_dimension_other_than_1() -> None:
    nt = torch.nested.nested_tensor_from_jagged(torch.arange(12.0).reshape(6, 2), torch.tensor([0, 2, 6]))
    with pytest.raises(
        ref.InvalidJaggedError, match=re.escape("micro-batch 0: the ragged dimension must be 1, got 2")
    ):
        interop.from_torch(nt.transpose(1, 2), key="k", micro_batch=0)


def test_interop_reads_a_zero_row_tensor_with_lengths() -> None:
    empty = torch.nested.nested_tensor_from_jagged(
        torch.zeros(0, 2), torch.zeros(1, dtype=torch.int64), lengths=torch.zeros(0, dtype=torch.int64)
    )
    x = interop.from_torch(empty)
    assert isinstance(x, ref.Jagged)
    assert (x.num_rows, x.values.shape) == (0, (0, 2))
    over_values = torch.nested.nested_tensor_from_jagged(  # no rows, but values behind them (a view)
        torch.arange(4.0), torch.zeros(1, dtype=torch.int64), lengths=torch.zeros(0, dtype=torch.int64)
    )
    y = interop.from_torch(over_values)
    assert isinstance(y, ref.Jagged)
    assert (y.num_rows, y.values.shape) == (0, (0,))


def test_bits_dtype_names_the_dtype_it_refuses() -> None:
    assert bits_dtype(8) == "int64"
    with pytest.raises(ref.UnsupportedSettingError, match=r"^dtype int4 has 3-byte items; supported widths"):
        bits_dtype(3, dtype="int4")
    with pytest.raises(ref.UnsupportedSettingError, match=r"^has 3-byte items"):
        bits_dtype(3)


def test_interop_holes_over_rows_of_several_values_and_hundreds_of_rows() -> None:
    """Bounds are counted in rows of ``values``; counts are compared by value (300 rows: past CPython's
    shared small ints)."""
    holed = torch.nested.nested_tensor_from_jagged(
        torch.arange(30.0).reshape(10, 3), torch.tensor([0, 4, 8]), lengths=torch.tensor([3, 2])
    )
    x = interop.from_torch(holed)
    assert np.asarray(x.values)[:, 0].tolist() == [0.0, 3.0, 6.0, 12.0, 15.0]
    rows = 300
    many = torch.nested.nested_tensor_from_jagged(
        torch.arange(2.0 * rows),
        torch.arange(0, 2 * rows + 1, 2),
        lengths=torch.ones(rows, dtype=torch.int64),
    )
    assert np.asarray(interop.from_torch(many).values).tolist() == [2.0 * i for i in range(rows)]


def test_trees_convert_both_ways() -> None:
    nt = jagged(torch.arange(6.0), [4, 0, 2])
    dense = torch.arange(6, dtype=torch.int64).reshape(3, 2)
    x = interop.tree_from_torch({"a": nt, "b": [dense, (dense, 3)], "c": "text"})
    assert isinstance(x["a"], ref.Jagged)
    assert isinstance(x["b"][0], jax.Array)
    assert isinstance(x["b"][1], tuple)
    assert (x["b"][1][1], x["c"]) == (3, "text")
    back = interop.tree_to_torch(x)
    assert_same(back["a"], nt)
    assert_same(back["b"][1][0], dense)
    assert (type(back["b"]), type(back["b"][1]), back["b"][1][1], back["c"]) == (list, tuple, 3, "text")


def _jagged_example() -> ref.Jagged:
    rng = np.random.default_rng(3)
    return interop.from_torch(jagged(random_tensor(rng, (11, 2), "float64"), [3, 0, 4, 1, 3]))


def test_jit_concat_take_restore_equal_eager() -> None:
    x = _jagged_example()
    parts = ref.split(x, [[4, 1], [0, 3, 2]])
    perm = jnp.asarray([3, 0, 4, 1, 2])
    pairs = [
        (lambda a, b: ref.concat([a, b]), parts),
        (lambda a: ref.take(a, [3, 0, 4, 1, 2]), (x,)),
        (lambda a: ref.restore(a, [[4, 1], [0, 3, 2]]), (x,)),
    ]
    for fn, args in pairs:
        eager = interop.to_torch(fn(*args))
        jitted = interop.to_torch(jax.jit(fn)(*args))
        assert_same(jitted, eager)
    traced = [(lambda a, p: ref.take(a, p), (x, perm)), (lambda a, p: ref.restore(a, p), (x, perm))]
    for fn, args in traced:  # traced indices: checked in the compiled program, through ref.checked
        assert_same(interop.to_torch(ref.checked(fn)(*args)), interop.to_torch(fn(*args)))
    assert not jax.config.jax_enable_x64


def test_traced_indices_in_a_plain_jit_are_refused_not_trusted() -> None:
    """Without checkify (ref.checked), a traced index array cannot be checked, so it is refused when
    traced."""
    x = _jagged_example()
    with pytest.raises(ValueError, match="checkify"):
        jax.jit(lambda a, p: ref.take(a, p))(x, jnp.asarray([3, 0, 4, 1, 2]))


def test_jit_restore_dense() -> None:
    d = interop.from_torch(torch.arange(10, dtype=torch.int64).reshape(5, 2))
    fn = jax.jit(lambda a: ref.restore(a, [[2, 4], [0, 1, 3]]))
    assert_same(interop.to_torch(fn(d)), interop.to_torch(ref.restore(d, [[2, 4], [0, 1, 3]])))


def test_jagged_is_an_immutable_pytree() -> None:
    x = _jagged_example()
    leaves, tree = jax.tree_util.tree_flatten(x)
    assert len(leaves) == 2
    y = jax.tree_util.tree_unflatten(tree, leaves)
    assert isinstance(y, ref.Jagged)
    assert y.num_rows == x.num_rows
    with pytest.raises(AttributeError):
        x.values = x.values  # type: ignore[misc]


def test_jagged_constructors() -> None:
    x = ref.Jagged.from_rows([np.array([1, 2]), np.array([], dtype=np.int64), np.array([3])])
    assert x.num_rows == 3
    assert [r.tolist() for r in x.rows()] == [[1, 2], [], [3]]
    assert x.lengths().tolist() == [2, 0, 1]
    y = ref.Jagged.from_lengths(np.arange(3), [2, 0, 1])
    assert np.array_equal(np.asarray(y.offsets), np.asarray(x.offsets))
    empty = ref.Jagged.from_rows([], dtype=jnp.float32, feature_shape=(4,))
    assert empty.num_rows == 0
    assert empty.feature_shape == (4,)


@pytest.mark.parametrize(
    ("values", "offsets", "pattern"),
    [
        (np.zeros(3), np.array([[0, 3]]), "1-D"),
        (np.zeros(3), np.array(3), "1-D"),
        (np.zeros(3), np.array([0.0, 3.0]), "integer dtype"),
        (np.zeros(3), np.array([1, 3]), r"offsets\[0\] must be 0, got 1"),
        (np.zeros(3), np.array([-1, 3]), r"offsets\[0\] must be 0, got -1"),
        (
            np.zeros(3),
            np.array([0, 2, 2, 1, 3]),
            r"got offsets\[2\] = 2 > offsets\[3\] = 1",
        ),  # after a zero step
        (np.zeros(3), np.array([0, 2, 1, 3]), "non-decreasing"),
        (np.zeros(3), np.array([0, 2, 3, 1, 3]), r"non-decreasing, got offsets\[2\] = 3 > offsets\[3\] = 1"),
        (np.zeros(3), np.array([0, 2]), r"offsets\[-1\] must equal len\(values\) = 3, got 2"),
        (np.float32(1.0), np.array([0]), "at least 1 dimension"),
        (np.zeros(0), np.zeros(0, dtype=np.int64), "at least one entry"),
    ],
)
def test_one_validator_owns_the_jagged_invariants(values, offsets, pattern) -> None:
    with pytest.raises(ref.InvalidJaggedError, match=pattern):
        ref.Jagged(values, offsets)
    with pytest.raises(ref.InvalidJaggedError, match=pattern):
        ref.validate_jagged(values, offsets)
