"""The properties, as plain functions of drawn inputs, in one registry.

``test_properties.py`` turns each into a Hypothesis test (so pytest and HypoFuzz collect them);
``fuzz.py`` runs them under the ``fuzz`` profile; ``mutants.py`` runs the differential ones against
seeded defects. Each check raises ``AssertionError`` on a violation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from hypothesis import strategies as st

from torch_impl.testing import njt

from .baseline import verl_postprocess_batch_func
from .compare import assert_same
from .convert import (
    outputs_to_ref,
    provenance_for,
    ref_postprocess,
    result_to_torch,
    to_ref,
    torch_postprocess,
)
from .data import DTYPES, ListModel, rows_of
from .kernels import KERNELS, forced
from .strategies import (
    HostileData,
    HostileIndices,
    JaggedBatch,
    MalformedInput,
    MicrobatchOutputs,
    Partitions,
    TensorDictBatch,
    hostile_data,
    hostile_indices,
    jagged_batches,
    malformed_inputs,
    microbatch_outputs,
    partitions,
    tensordict_batches,
)

__all__ = ["Property", "PROPERTIES", "DIFFERENTIAL"]


class Property(NamedTuple):
    name: str
    strategy: st.SearchStrategy[Any]
    check: Callable[[Any], None]
    #: cap on examples per run outside the fuzz profile (for slow properties such as jit compilation)
    max_examples: int | None = None


@st.composite
def _batches_with_partitions(draw: st.DrawFn, **kwargs: Any) -> tuple[JaggedBatch, Partitions]:
    x = draw(jagged_batches(**kwargs))
    return x, draw(partitions(num_rows=len(x.lengths), min_micro_batches=1, max_micro_batches=4))


def _verl_applies(case: MicrobatchOutputs) -> bool:
    return bool(case.expected) and all(v.is_nested and v.size(0) > 0 for v in case.expected.values())


def postprocess_agrees(case: MicrobatchOutputs) -> None:
    """torch_impl == the original rows == ref, bit for bit (values, offsets, dtype, shape, losses,
    metrics); and == verl's algorithm where verl handles the input."""
    kwargs = {"use_dynamic_bsz": case.use_dynamic_bsz, "pad_mode": case.pad_mode}
    got = torch_postprocess(case.output_lst, case.indices, **kwargs)
    assert_same(got["model_output"], case.expected)
    assert_same(got, ref_postprocess(case.output_lst, case.indices, **kwargs))
    if _verl_applies(case):
        assert_same(
            got,
            verl_postprocess_batch_func(
                case.output_lst, case.indices, {"use_dynamic_bsz": case.use_dynamic_bsz}
            ),
        )


def postprocess_agrees_with_numpy(case: MicrobatchOutputs) -> None:
    """torch_impl (or the conformance candidate) == the plain-NumPy implementation (`numpy_impl`), bit for
    bit: each key's layout, dtype, values and offsets, the losses and the metrics."""
    from . import numpy_impl

    kwargs: dict[str, Any] = {"use_dynamic_bsz": case.use_dynamic_bsz, "pad_mode": case.pad_mode}
    got = torch_postprocess(case.output_lst, case.indices, **kwargs)
    want = numpy_impl.postprocess_batch(numpy_impl.to_numpy_tree(case.output_lst), case.indices, **kwargs)
    assert set(got["model_output"]) == set(want["model_output"]), "keys"
    for key, expected in want["model_output"].items():
        result = got["model_output"][key]
        like = next(o["model_output"][key] for o in case.output_lst if "model_output" in o)
        assert result.dtype == like.dtype, f"{key}: dtype {result.dtype}, input {like.dtype}"
        assert result.is_nested == like.is_nested, f"{key}: layout"
        actual = numpy_impl.from_torch(result)
        pairs: list[tuple[Any, Any]] = (
            list(zip(actual, expected, strict=True)) if like.is_nested else [(actual, expected)]
        )
        for a, e in pairs:
            assert a.shape == e.shape, f"{key}: shape {a.shape}, NumPy {e.shape}"
            assert a.dtype == e.dtype, f"{key}: dtype {a.dtype}, NumPy {e.dtype}"
            assert np.array_equal(a, e), f"{key}: values differ from NumPy's"
    assert_same(got["loss"], want["loss"])
    assert_same(got["metrics"], want["metrics"])


def every_kernel_agrees(drawn: tuple[MicrobatchOutputs, str]) -> None:
    """Each data-movement path of torch_impl, forced on, gives the original rows bit for bit (row
    copies, element indices in one chunk per micro-batch, or in chunks of one or three values)."""
    case, path = drawn
    with forced(path):
        got = torch_postprocess(
            case.output_lst, case.indices, use_dynamic_bsz=case.use_dynamic_bsz, pad_mode=case.pad_mode
        )
    assert_same(got["model_output"], case.expected)


def ref_matches_list_model(drawn: tuple[JaggedBatch, Partitions]) -> None:
    """ref.restore, ref.concat and ref.take equal list indexing and list concatenation on NumPy rows."""
    import ref

    x, p = drawn
    nt = x.njt()
    rows = ListModel.rows(nt)
    rx = to_ref(nt)
    got = ListModel.rows(result_to_torch(ref.restore(rx, p.parts)))
    assert ListModel.equal(got, ListModel.restore(rows, p.parts)), "restore"
    pieces = ref.split(rx, p.parts)
    assert ListModel.equal(
        ListModel.rows(result_to_torch(ref.concat(pieces))),
        ListModel.take(rows, [i for q in p.parts for i in q]),
    )
    idx = [i for q in p.parts for i in q][::-1]
    assert ListModel.equal(ListModel.rows(result_to_torch(ref.take(rx, idx))), ListModel.take(rows, idx)), (
        "take"
    )


def split_then_postprocess_is_identity(drawn: tuple[JaggedBatch, Partitions]) -> None:
    """postprocess_batch(split(x, P), P) == x, in both implementations."""
    import ref
    import torch_impl

    x, p = drawn
    nt = x.njt()
    outs = [{"model_output": {"x": piece}} for piece in torch_impl.split(nt, p.parts)]
    assert_same(torch_impl.postprocess_batch(outs, p.parts)["model_output"]["x"], nt)
    ref_outs = [{"model_output": {"x": piece}} for piece in ref.split(to_ref(nt), p.parts)]
    assert_same(result_to_torch(ref.postprocess_batch(ref_outs, p.parts)["model_output"]["x"]), nt)


def restore_undoes_take(drawn: tuple[JaggedBatch, Partitions]) -> None:
    """restore(take(x, perm), P) == x with perm the partitions flattened, in both implementations."""
    import ref
    import torch_impl

    x, p = drawn
    nt = x.njt()
    perm = [i for q in p.parts for i in q]
    assert_same(torch_impl.restore(torch_impl.take(nt, perm), p.parts), nt)
    assert_same(result_to_torch(ref.restore(ref.take(to_ref(nt), perm), p.parts)), nt)


def layouts_round_trip(drawn: tuple[JaggedBatch, int]) -> None:
    """to_padded equals padding each row by hand; from_padded(to_padded(x), lengths) == x and
    from_packed(*to_packed(x)) == x; ref and torch_impl agree bit for bit on every conversion."""
    import ref
    import torch_impl

    x, extra = drawn
    nt = x.njt()
    rows = rows_of(nt)
    longest = max(x.lengths, default=0)
    pad = 0 if nt.dtype == torch.bool or not nt.dtype.is_floating_point else -1.5
    padded = torch_impl.to_padded(nt, pad_value=pad, max_len=longest + extra)
    feature = tuple(x.values.shape[1:])
    by_hand = [
        torch.cat([r, torch.full((longest + extra - len(r), *feature), pad, dtype=nt.dtype)]) for r in rows
    ]
    assert_same(padded, torch.stack(by_hand) if by_hand else padded.new_zeros(padded.shape))
    assert_same(torch_impl.from_padded(padded, x.lengths), nt)
    assert_same(torch_impl.from_packed(*torch_impl.to_packed(nt)), nt)
    rx = to_ref(nt)
    assert_same(result_to_torch(ref.to_padded(rx, pad_value=pad, max_len=longest + extra)), padded)
    assert_same(result_to_torch(ref.from_padded(to_ref(padded), x.lengths)), nt)
    assert_same(result_to_torch(ref.to_packed(rx)), torch_impl.to_packed(nt))
    assert_same(result_to_torch(ref.from_packed(to_ref(x.values), x.lengths)), nt)


def inverse_is_an_involution(perm: list[int]) -> None:
    """inverse(inverse(p)) == p and inverse(p)[p[k]] == k, in both implementations, and they agree."""
    import ref
    import torch_impl

    inv_t = torch_impl.inverse_permutation(perm)
    inv_r = np.asarray(ref.inverse_permutation(perm))
    assert inv_t.tolist() == inv_r.tolist()
    assert torch_impl.inverse_permutation(inv_t).tolist() == list(perm)
    assert np.asarray(ref.inverse_permutation(inv_r)).tolist() == list(perm)
    assert all(inv_t[p].item() == k for k, p in enumerate(perm))


@st.composite
def _three_alike(draw: st.DrawFn) -> list[JaggedBatch]:
    dtype = draw(st.sampled_from(DTYPES))
    feature = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    return [draw(jagged_batches(dtypes=(dtype,), feature_shape=feature, max_rows=5)) for _ in range(3)]


def concat_is_associative(batches: list[JaggedBatch]) -> None:
    """concat([concat([a, b]), c]) == concat([a, concat([b, c])]) == concat([a, b, c]); lengths add."""
    import ref
    import torch_impl

    a, b, c = (x.njt() for x in batches)
    flat = torch_impl.concat([a, b, c])
    assert_same(torch_impl.concat([torch_impl.concat([a, b]), c]), flat)
    assert_same(torch_impl.concat([a, torch_impl.concat([b, c])]), flat)
    assert [r.shape[0] for r in rows_of(flat)] == [n for x in batches for n in x.lengths]
    ra, rb, rc = (to_ref(x) for x in (a, b, c))
    assert_same(result_to_torch(ref.concat([ref.concat([ra, rb]), rc])), flat)
    assert_same(result_to_torch(ref.concat([ra, ref.concat([rb, rc])])), flat)


def jit_equals_eager(drawn: tuple[JaggedBatch, Partitions]) -> None:
    """jax.jit(ref.f) == eager ref.f for concat, take with a permutation, and restore."""
    import jax

    import ref

    x, p = drawn
    rx = to_ref(x.njt())
    perm = [i for q in p.parts for i in q]
    pieces = ref.split(rx, p.parts)
    cases = [
        (lambda a: ref.restore(a, p.parts), (rx,)),
        (lambda a: ref.take(a, perm), (rx,)),
        (lambda *xs: ref.concat(list(xs)), tuple(pieces)),
    ]
    for fn, args in cases:
        assert_same(result_to_torch(jax.jit(fn)(*args)), result_to_torch(fn(*args)))


def gradients_match_vjp(case: MicrobatchOutputs) -> None:
    """The backward of torch_impl.postprocess_batch equals jax.vjp of ref.postprocess_batch, bit for bit."""
    import jax

    import ref
    import torch_impl

    rng = np.random.default_rng(len(case.output_lst))
    leaves: list[torch.Tensor] = []
    outs = []
    for o in case.output_lst:
        mo = {}
        for k, v in o.get("model_output", {}).items():
            values = (v.values() if v.is_nested else v).detach().clone().requires_grad_(True)
            leaves.append(values)
            mo[k] = njt(values, v.offsets()) if v.is_nested else values
        outs.append({"model_output": mo} if mo else {})
    if not leaves:
        return
    result = torch_impl.postprocess_batch(outs, case.indices)["model_output"]
    outputs = [r.values() if r.is_nested else r for r in result.values()]
    cots = [torch.from_numpy(rng.standard_normal(tuple(t.shape))).to(t.dtype) for t in outputs]
    grads = torch.autograd.grad(outputs, leaves, cots, allow_unused=True)

    ref_outs = outputs_to_ref([{k: v for k, v in o.items()} for o in case.output_lst])
    slots = [(m, k) for m, o in enumerate(ref_outs) for k in o.get("model_output", {})]

    def f(*values: Any) -> list[Any]:
        new = [
            dict(o, model_output=dict(o["model_output"])) if "model_output" in o else dict(o)
            for o in ref_outs
        ]
        for (m, k), v in zip(slots, values, strict=True):
            old = new[m]["model_output"][k]
            new[m]["model_output"][k] = (
                ref.Jagged.tree_unflatten(None, (v, old.offsets)) if isinstance(old, ref.Jagged) else v
            )
        res = ref.postprocess_batch(new, case.indices)["model_output"]
        return [r.values if isinstance(r, ref.Jagged) else r for r in res.values()]

    primals = [ref_outs[m]["model_output"][k] for m, k in slots]
    primals = [x.values if isinstance(x, ref.Jagged) else x for x in primals]
    _, vjp = jax.vjp(f, *primals)
    ref_grads = vjp([to_ref(c) for c in cots])
    for g_t, g_r, leaf in zip(grads, ref_grads, leaves, strict=True):
        g_t = torch.zeros_like(leaf) if g_t is None else g_t
        assert_same(g_t, result_to_torch(g_r))


@st.composite
def _batches_and_budgets(draw: st.DrawFn) -> tuple[TensorDictBatch, int]:
    batch = draw(tensordict_batches(max_rows=12, max_length=10))
    return batch, draw(st.integers(max([10, *batch.lengths]), 60))


def split_side_round_trip(drawn: tuple[TensorDictBatch, int]) -> None:
    """prepare_micro_batches then postprocess_batch_func is the identity on a TensorDict (3-D jagged,
    zero-length rows, dense and non-tensor fields); each micro-batch's fields are take(data, partition)."""
    import torch_impl

    batch, budget = drawn
    data = batch.data
    micro, indices = torch_impl.prepare_micro_batches(data, max_token_len=budget)
    assert indices is not None
    keys = ["input_ids", "top_k", "advantages"]
    for mb, part in zip(micro, indices, strict=True):
        for k in keys:
            assert_same(mb[k], torch_impl.take(data[k], part))
        if "uid" in data.keys():
            assert list(mb["uid"]) == [f"row{i}" for i in part]
    if not micro:  # an empty batch has no micro-batches, and nothing to put back
        assert not batch.lengths
        return
    outs = [{"model_output": {k: mb[k] for k in keys}} for mb in micro]
    result = torch_impl.postprocess_batch_func(outs, indices, None)["model_output"]
    for k in keys:
        assert_same(result[k], data[k])
    fixed, chunks = torch_impl.prepare_micro_batches(data, micro_batch_size=3)
    assert chunks == torch_impl.fixed_partitions(len(batch.lengths), 3)  # its chunks' indices
    result = torch_impl.postprocess_batch(
        [{"model_output": {k: mb[k] for k in keys}} for mb in fixed], None, use_dynamic_bsz=False
    )
    for k in keys:
        assert_same(result["model_output"][k], data[k])


def partitions_respect_the_budget(drawn: tuple[list[int], int]) -> None:
    """Every micro-batch fits the budget, the partitions are a permutation, ref and torch_impl agree, and
    the workload spread (heaviest minus lightest micro-batch) is at most the largest row's workload, the
    bound greedy assignment (largest first, to the lightest) also meets. (Spread no worse than greedy's on
    every input is false for the largest differencing method: lengths [2, 3, 3, 4, 6, 6, 6, 7] with budget
    13 give a spread of 24,587 against greedy's 24,575; see `test_partition.py`.)"""
    import ref
    import torch_impl
    from ref.errors import TokenBudgetError
    from ref.partition import workload

    lengths, budget = drawn
    if any(n > budget for n in lengths):
        for impl in (ref, torch_impl):
            try:
                impl.balanced_partitions(lengths, budget)
            except TokenBudgetError:
                continue
            raise AssertionError(f"{impl.__name__} accepted a row longer than the budget")
        return
    parts = ref.balanced_partitions(lengths, budget)
    assert parts == torch_impl.balanced_partitions(torch.tensor(lengths, dtype=torch.int64), budget)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in p) <= budget for p in parts)
    assert all(p == sorted(p) for p in parts)
    if parts:
        loads = [workload(n) for n in lengths]
        sums = [sum(loads[i] for i in p) for p in parts]
        assert max(sums) - min(sums) <= max(loads), (sums, max(loads))


def malformed_rejected_alike(case: MalformedInput) -> None:
    """Both implementations raise exactly the defect's RebatchError subclass, never a result."""
    from ref.errors import RebatchError

    given = {k: v for k, v in (("witness", case.witness), ("provenance", case.provenance)) if v is not None}
    for impl, form in ((torch_postprocess, "torch_impl"), (ref_postprocess, "ref")):
        try:
            extra = provenance_for(form, given)
            impl(
                case.output_lst,
                case.indices,
                use_dynamic_bsz=case.use_dynamic_bsz,
                pad_mode=case.pad_mode,
                **extra,
            )
        except RebatchError as err:
            assert type(err) is case.error, f"{impl.__name__} on {case.name}: {type(err).__name__}: {err}"
        else:
            raise AssertionError(f"{impl.__name__} returned a result for the defect {case.name!r}")


def hostile_indices_rejected_alike(case: HostileIndices) -> None:
    """A hostile partition type (meta device, object or string arrays, a lying ``len()``) raises the same
    RebatchError subclass in both implementations, never another exception or a result."""
    from ref.errors import RebatchError

    for impl in (torch_postprocess, ref_postprocess):
        try:
            impl(case.output_lst, case.indices)
        except RebatchError as err:
            assert type(err) is case.error, f"{impl.__name__} on {case.name}: {type(err).__name__}: {err}"
        else:
            raise AssertionError(f"{impl.__name__} returned a result for the hostile partition {case.name!r}")


def hostile_data_rejected(drawn: tuple[HostileData, MicrobatchOutputs]) -> None:
    """verl's drop-in (and its check-only form) refuses a ``data`` that is not a TensorDict, a mapping or
    None with `UnsupportedSettingError` naming its type, on a valid call. (``data`` is verl's argument: the
    reference has no such argument; its settings are keywords, checked by `malformed_rejected_alike`.)"""
    import torch_impl
    from torch_impl.testing import check_batch_func

    case, call = drawn
    for fn in (torch_impl.postprocess_batch_func, check_batch_func):
        try:
            fn(call.output_lst, call.indices, case.data)
        except case.error as err:
            assert f"got {type(case.data).__name__}" in str(err), str(err)
        else:
            raise AssertionError(f"{fn.__name__} accepted data of type {case.name}")


PROPERTIES: dict[str, Property] = {
    p.name: p
    for p in [
        Property("postprocess_agrees", microbatch_outputs(use_dynamic_bsz=None), postprocess_agrees),
        Property(
            "postprocess_agrees_with_numpy",
            microbatch_outputs(use_dynamic_bsz=None),
            postprocess_agrees_with_numpy,
        ),
        Property(
            "every_kernel_agrees",
            st.tuples(microbatch_outputs(use_dynamic_bsz=None), st.sampled_from(sorted(KERNELS))),
            every_kernel_agrees,
        ),
        Property("ref_matches_list_model", _batches_with_partitions(), ref_matches_list_model),
        Property(
            "split_then_postprocess_is_identity",
            _batches_with_partitions(),
            split_then_postprocess_is_identity,
        ),
        Property("restore_undoes_take", _batches_with_partitions(), restore_undoes_take),
        Property(
            "layouts_round_trip",
            st.tuples(jagged_batches(), st.integers(0, 3)),
            layouts_round_trip,
            max_examples=40,
        ),
        Property(
            "inverse_is_an_involution",
            st.integers(0, 40).flatmap(lambda n: st.permutations(range(n))),
            inverse_is_an_involution,
        ),
        Property("concat_is_associative", _three_alike(), concat_is_associative),
        Property("jit_equals_eager", _batches_with_partitions(max_rows=6), jit_equals_eager, max_examples=15),
        Property(
            "gradients_match_vjp",
            microbatch_outputs(dtypes=("float32", "float64"), losses=False, metrics=False),
            gradients_match_vjp,
            max_examples=30,
        ),
        Property("malformed_rejected_alike", malformed_inputs(), malformed_rejected_alike),
        Property("hostile_indices_rejected_alike", hostile_indices(), hostile_indices_rejected_alike),
        Property(
            "hostile_data_rejected",
            st.tuples(hostile_data(), microbatch_outputs(max_rows=4, dtypes=("float32",))),
            hostile_data_rejected,
        ),
        Property("split_side_round_trip", _batches_and_budgets(), split_side_round_trip),
        Property(
            "partitions_respect_the_budget",
            st.tuples(st.lists(st.integers(0, 300), max_size=40), st.integers(1, 900)),
            partitions_respect_the_budget,
        ),
    ]
}

#: The properties that compare torch_impl with an oracle (run against each mutant).
DIFFERENTIAL = (  # the quickest first: the first to fail ends a mutant's run
    "every_kernel_agrees",
    "postprocess_agrees",
    "restore_undoes_take",
    "split_then_postprocess_is_identity",
)


def pass_or_fail(prop: Property, *, max_examples: int) -> Callable[[], None]:
    """``prop`` as a plain test function for runs where passing or failing is all that matters (the
    mutants, conformance): derandomized, no database, no deadline, no shrinking."""
    from hypothesis import HealthCheck, Phase, given, settings

    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=False,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )(given(prop.strategy)(prop.check))
