"""Provenance that never cries wolf (docs/spec.md, "Exact provenance"): a record a split, not a batch; the
outputs' nested ints decide which split a restore answers to. Each case of the issue, on fixed-length
batches (every row one length: the witness is blind, so provenance alone decides): a correct restore is
the trainer's result with no error; each misalignment a recorded split proves wrong raises."""

from __future__ import annotations

import gc
import itertools
import threading
import tracemalloc
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, TensorDict

import ref
import torch_impl
from property_tests.baseline import verl_postprocess_batch_func
from property_tests.compare import first_difference
from property_tests.convert import outputs_to_ref
from property_tests.splits import ref_splits
from ref.errors import MisalignmentError, NotAPermutationError, RebatchError
from ref.provenance import Carried
from torch_impl._alignment import _provenance
from torch_impl._postprocess import check_batch_func

LENGTH = 4  # every row's length


def _batch(b: int = 16) -> TensorDict:
    ids = torch.nested.nested_tensor_from_jagged(
        torch.arange(b * LENGTH), torch.arange(0, b * LENGTH + 1, LENGTH)
    )
    return TensorDict({"input_ids": ids, "use_dynamic_bsz": NonTensorData(True)}, batch_size=[b])


def _engine(micro_batches: Any) -> list[dict[str, Any]]:
    """Each micro-batch's outputs as verl's FSDP engine builds them: on its input_ids' offsets."""
    outs = []
    for mb in micro_batches:
        ids = mb["input_ids"]
        lp = torch.nested.nested_tensor_from_jagged(ids.values().to(torch.float32) * 0.5, ids.offsets())
        score = ids.values().reshape(-1, LENGTH)[:, :2].to(torch.float32)  # dense [b, 2]
        outs.append({"model_output": {"log_probs": lp, "score": score}, "loss": torch.tensor(1.0)})
    return outs


def _split(data: TensorDict, rows_a_micro_batch: int) -> tuple[list[dict[str, Any]], list[list[int]]]:
    mbs, indices = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * rows_a_micro_batch)
    return _engine(mbs), [list(p) for p in indices]


def _theirs(outs: Any, indices: Any, data: Any) -> Any:
    return verl_postprocess_batch_func(outs, indices, data)


def _same_as_verl(outs: Any, indices: Any, data: Any) -> None:
    ours = torch_impl.postprocess_batch_func(outs, indices, data)
    assert first_difference(ours, _theirs(outs, indices, data)) is None
    check_batch_func(outs, indices, data)


def test_one_batch_split_twice_each_split_restores_correctly() -> None:
    """A log-prob pass and a training pass with another budget, two epochs: every restore answers to its
    own split, proven, and is verl's result."""
    data = _batch()
    for _epoch in range(2):
        logprob = _split(data, 8)
        train = _split(data, 2)
        before = torch_impl.provenance_stats()["calls_proven"]
        _same_as_verl(*logprob, data)  # the older split's restore
        _same_as_verl(*train, data)
        assert torch_impl.provenance_stats()["calls_proven"] == before + 4  # two calls, each checked twice


def test_two_threads_sharing_one_batch_never_raise() -> None:
    data = _batch()
    errors: list[BaseException] = []

    def step(rows: int) -> None:
        try:
            for _ in range(40):
                outs, indices = _split(data, rows)
                _same_as_verl(outs, indices, data)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=step, args=(rows,)) for rows in (2, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_an_old_record_meeting_a_split_rebatch_did_not_make() -> None:
    """rebatch split the batch once; a split rebatch did not make (fresh micro-batches, no record) feeds
    the restore: unproven, verl's result."""
    data = _batch()
    _split(data, 2)
    indices = [[0, 5, 10, 15], [1, 6, 11, 12], [2, 7, 8, 13], [3, 4, 9, 14]]
    outs = _engine(torch_impl.split(data, indices))
    before = torch_impl.provenance_stats()["calls_unproven"]
    _same_as_verl(outs, indices, data)
    assert torch_impl.provenance_stats()["calls_unproven"] == before + 2


def test_restore_dynamic_batch_answers_to_any_live_split() -> None:
    """Batch a split, then batch b: a's values restored with a's indices are proven; the inverse of a live
    split's indices raises; indices no live split made are unproven."""
    a, b = _batch(), _batch(8)
    _, a_indices = _split(a, 2)
    _, b_indices = _split(b, 4)
    x = torch.arange(16.0)
    before = torch_impl.provenance_stats()
    assert torch.equal(torch_impl.restore_dynamic_batch(x, a_indices), ref_restore(x, a_indices))
    after = torch_impl.provenance_stats()
    assert after["restores_indices_proven"] == before["restores_indices_proven"] + 1
    assert after["calls_proven"] == before["calls_proven"]  # a restore's indices prove no call
    flat = [i for p in a_indices for i in p]
    inverse = _cut([flat.index(i) for i in range(16)], a_indices)
    assert inverse != a_indices
    assert any(p != sorted(p) for p in inverse)  # not as a split lists its indices
    with pytest.raises(MisalignmentError, match="the indices are not the split's"):
        torch_impl.restore_dynamic_batch(x, inverse)
    unmade = [[15 - i for i in p] for p in a_indices]
    torch_impl.restore_dynamic_batch(x, unmade)
    assert torch_impl.provenance_stats()["restores_unproven"] == after["restores_unproven"] + 1
    torch_impl.restore_dynamic_batch(torch.arange(8.0), b_indices)


def _cut(flat: list[int], like: list[list[int]]) -> list[list[int]]:
    bounds = itertools.accumulate(map(len, like), initial=0)
    return [flat[a:b] for a, b in itertools.pairwise(bounds)]


def _lengths_batch(lengths: list[int]) -> TensorDict:
    offsets = torch.tensor([0, *itertools.accumulate(lengths)])
    ids = torch.nested.nested_tensor_from_jagged(torch.arange(int(offsets[-1])), offsets)
    return TensorDict({"input_ids": ids, "use_dynamic_bsz": NonTensorData(True)}, batch_size=[len(lengths)])


def test_restore_dynamic_batch_given_an_evicted_splits_indices_that_invert_a_live_one() -> None:
    """A review's case: batch y's live split is the inverse of batch x's split, which is then no longer
    kept; x's restore with its own indices ascends within each micro-batch as a split's own do, so it is
    unproven, never an error."""
    y, x = _lengths_batch([1, 2, 5, 6, 5]), _lengths_batch([1, 6, 5, 3, 4])
    _, y_indices = torch_impl.prepare_micro_batches(y, max_token_len=8)
    _, x_indices = torch_impl.prepare_micro_batches(x, max_token_len=8)
    flat = [i for p in y_indices for i in p]
    assert [list(p) for p in x_indices] == _cut([flat.index(i) for i in range(5)], y_indices)
    for k in range(_provenance.MAX_SPLITS):
        torch_impl.prepare_micro_batches(x, max_token_len=(6, 12, 20)[k % 3])
    router = torch.randn(5, 3)
    assert torch.equal(torch_impl.restore_dynamic_batch(router, x_indices), ref_restore(router, x_indices))


def test_restore_dynamic_batch_raises_the_restores_own_typed_errors_first() -> None:
    """Indices the restore itself refuses (on ``meta``; floats) raise its typed error, whatever a live
    split says of them."""
    from ref.errors import UnsupportedSettingError

    data = _batch(8)
    _, indices = _split(data, 4)
    x = torch.arange(8.0)
    with pytest.raises(UnsupportedSettingError):
        torch_impl.restore_dynamic_batch(x, [torch.tensor(p, device="meta") for p in indices])
    flat = [i for p in indices for i in p]
    inverse = _cut([flat.index(i) for i in range(8)], indices)
    with pytest.raises(NotAPermutationError, match="not an integer"):
        torch_impl.restore_dynamic_batch(x, [[float(i) for i in p] for p in inverse])


def test_fixed_size_chunks_restored_with_other_indices_raise_alike_in_ref_and_torch() -> None:
    """A split of fixed-size chunks holds the rows in order: a dynamic restore of its outputs with other
    indices is proven wrong, in both implementations, in the same words."""
    data = _batch(6)
    _, dynamic = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 2)
    chunks, _ = torch_impl.prepare_micro_batches(data, micro_batch_size=2)
    outs = _engine(chunks)
    given = [list(p) for p in dynamic]
    assert given != [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(MisalignmentError) as torch_error:
        torch_impl.postprocess_batch_func(outs, given, data)
    kept = torch_impl.recorded(data)
    names = {split.name: split for split in kept.splits}
    chunk_name = list(names)[-1]
    ref_outs = outputs_to_ref(outs)
    for m, o in enumerate(ref_outs):
        o["provenance"] = Carried(chunk_name, (2 * m, 2 * m + 1), kept.name)
    with pytest.raises(MisalignmentError) as ref_error:
        ref.postprocess_batch(ref_outs, given, provenance=ref_splits(data), witness=[LENGTH] * 6)
    assert str(ref_error.value) == str(torch_error.value)


def test_ref_names_the_jagged_key_as_torch_does() -> None:
    """The first model-output key dense: both name the jagged key whose provenance says so."""
    data = _batch(8)
    mbs, indices = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 4)
    outs = [{**o, "model_output": dict(reversed(list(o["model_output"].items())))} for o in _engine(mbs)]
    assert next(iter(outs[0]["model_output"])) == "score"
    swapped = [outs[1], outs[0]]
    with pytest.raises(MisalignmentError) as torch_error:
        torch_impl.postprocess_batch_func(swapped, indices, data)
    ref_outs = outputs_to_ref(swapped)
    for o, rows in zip(ref_outs, [indices[1], indices[0]], strict=True):
        o["provenance"] = tuple(rows)
    with pytest.raises(MisalignmentError) as ref_error:
        ref.postprocess_batch(ref_outs, indices, provenance=ref_splits(data), witness=[LENGTH] * 8)
    assert str(ref_error.value) == str(torch_error.value)
    assert "key 'log_probs'" in str(torch_error.value)


def ref_restore(x: torch.Tensor, indices: Any) -> torch.Tensor:
    flat = [i for p in indices for i in p]
    out = torch.empty_like(x)
    out[flat] = x
    return out


FORMS = ["tensor", "array", "tuples", "tensors", "arrays"]


def _two_dimensional(indices: list[list[int]]) -> list[Any]:
    """The indices in each of verl's forms (`FORMS`): one 2-D tensor, one 2-D array, tuples, a list of
    1-D tensors, a list of 1-D arrays."""
    return [
        torch.tensor(indices),
        np.asarray(indices),
        tuple(tuple(p) for p in indices),
        [torch.tensor(p) for p in indices],
        [np.asarray(p) for p in indices],
    ]


@pytest.mark.parametrize("form", FORMS)
def test_two_dimensional_indices_behave_alike_with_and_without_a_record(form: str) -> None:
    """Indices in each form verl takes (one 2-D tensor or array: equal micro-batches): the same result
    with and without a record, and a duplicate the same typed error."""
    position = FORMS.index(form)
    recorded = _batch()
    outs, indices = _split(recorded, 4)
    assert len({len(p) for p in indices}) == 1
    unrecorded = _batch()
    given = _two_dimensional(indices)[position]
    with_record = torch_impl.postprocess_batch_func(outs, given, recorded)
    without = torch_impl.postprocess_batch_func(outs, given, unrecorded)
    assert first_difference(with_record, without) is None
    assert first_difference(with_record, _theirs(outs, indices, recorded)) is None
    duplicated = [list(p) for p in indices]
    duplicated[1][0] = duplicated[0][0]
    bad = _two_dimensional(duplicated)[position]
    errors = []
    for data in (recorded, unrecorded):
        with pytest.raises(NotAPermutationError) as err:
            torch_impl.postprocess_batch_func(outs, bad, data)
        errors.append(str(err.value))
    assert errors[0] == errors[1]


def test_a_newer_split_leaves_the_older_splits_misalignment_caught() -> None:
    data = _batch()
    outs, indices = _split(data, 4)
    _split(data, 8)  # a newer split of the same batch
    with pytest.raises(MisalignmentError, match="micro-batch 0: this output holds micro-batch 1's rows"):
        torch_impl.postprocess_batch_func([outs[1], outs[0], *outs[2:]], indices, data)


def test_a_padding_micro_batch_swapped_into_a_real_slot_raises() -> None:
    data = _batch(4)
    mbs, indices = torch_impl.rearrange_micro_batches(
        data, LENGTH, min_num_micro_batch=6, pad_micro_batches=True
    )
    assert indices[-1] is torch_impl.PADDING
    outs = _engine(mbs)
    torch_impl.postprocess_batch_func(outs, indices, data)  # the clean call: padding dropped, proven
    swapped = [outs[-1], *outs[1:-1], outs[0]]
    with pytest.raises(
        MisalignmentError, match="micro-batch 0: this output holds a padding micro-batch's rows"
    ):
        torch_impl.postprocess_batch_func(swapped, indices, data)


def test_two_splits_of_identical_partitions_are_interchangeable() -> None:
    """Micro-batch 1's output from another split of the batch with the same partition: its rows are its
    slot's, so the call is proven and verl's result."""
    data = _batch(8)
    mbs_a, indices_a = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 4)
    mbs_b, indices_b = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 4)
    assert [list(p) for p in indices_a] == [list(p) for p in indices_b]
    mixed = [*_engine(mbs_a[:1]), *_engine(mbs_b[1:])]
    before = torch_impl.provenance_stats()["calls_proven"]
    _same_as_verl(mixed, indices_a, data)
    assert torch_impl.provenance_stats()["calls_proven"] == before + 2


def test_an_output_of_another_partition_raises_naming_it_in_ref_and_torch() -> None:
    """Micro-batch 1's output from a split of the batch into other micro-batches: it names a micro-batch
    whose rows are not its slot's, in the same words in both implementations."""
    data = _batch(8)
    mbs_a, indices_a = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 4)
    mbs_b, indices_b = torch_impl.prepare_micro_batches(data, micro_batch_size=4)
    assert [len(p) for p in indices_a] == [4, 4]
    assert indices_b[1] != list(indices_a[1])
    kept = torch_impl.recorded(data)
    names = [split.name for split in kept.splits]
    mixed = [*_engine(mbs_a[:1]), *_engine(mbs_b[1:2])]
    with pytest.raises(MisalignmentError) as torch_error:
        torch_impl.postprocess_batch_func(mixed, indices_a, data)
    assert f"micro-batch 1: this output holds micro-batch 1's rows of split {names[1]!r}" in str(
        torch_error.value
    )
    outs = outputs_to_ref(mixed)
    outs[0]["provenance"] = Carried(names[0], tuple(indices_a[0]), kept.name)
    outs[1]["provenance"] = Carried(names[1], tuple(indices_b[1]), kept.name)
    with pytest.raises(MisalignmentError) as ref_error:
        ref.postprocess_batch(outs, indices_a, provenance=ref_splits(data), witness=[LENGTH] * 8)
    assert str(ref_error.value) == str(torch_error.value)


def test_a_batch_keeps_a_bounded_number_of_splits() -> None:
    """Beyond `MAX_SPLITS` the oldest split goes: its restore is then unproven, never an error."""
    data = _batch(8)
    oldest = _split(data, 4)
    for _ in range(_provenance.MAX_SPLITS):
        _split(data, 2)
    kept = torch_impl.recorded(data)
    assert isinstance(kept, _provenance.Record)
    assert len(kept.splits) == _provenance.MAX_SPLITS
    before = torch_impl.provenance_stats()["calls_unproven"]
    _same_as_verl(*oldest, data)
    assert torch_impl.provenance_stats()["calls_unproven"] == before + 2


def test_no_growth_over_ten_thousand_steps() -> None:
    """10,000 steps, each a fresh batch whose split is recorded twice and whose restore is judged: the
    records go with their batches and memory stays flat (the micro-batches are built once: the records,
    not the split's work, are what is measured)."""
    data = _batch(4)
    mbs, indices = torch_impl.prepare_micro_batches(data, max_token_len=LENGTH * 2)
    outs = _engine(mbs)
    steps = 10_000
    gc.collect()
    tracemalloc.start()
    try:
        sizes = []
        for step in range(steps):
            data = TensorDict({}, batch_size=[4])  # a fresh batch (no witness: provenance alone judges)
            _provenance.record(data, mbs, indices)
            _provenance.record(data, mbs, indices)
            check_batch_func(outs, indices, data)
            if step in (steps // 10, steps - 1):
                del data
                gc.collect()
                sizes.append(tracemalloc.get_traced_memory()[0])
        assert len(_provenance._records) <= _provenance.MAX_BATCHES
    finally:
        tracemalloc.stop()
    assert sizes[1] - sizes[0] < 256 * 1024, sizes  # no growth a step (a record is about 2 KiB)


def test_a_split_of_fixed_size_chunks_swapped_in_an_older_split_raises() -> None:
    """Fixed-size chunks (no indices), split twice: the older split's swapped outputs raise."""
    data = _batch(8)
    data["use_dynamic_bsz"] = NonTensorData(False)
    data["micro_batch_size_per_gpu"] = NonTensorData(2)
    mbs, indices = torch_impl.prepare_micro_batches(data)
    torch_impl.prepare_micro_batches(data)
    outs = _engine(mbs)
    _same_as_verl(outs, indices, data)
    with pytest.raises(RebatchError, match="this output holds micro-batch 1's rows"):
        torch_impl.postprocess_batch_func([outs[1], outs[0], *outs[2:]], indices, data)


@pytest.mark.parametrize("mode", ["on", "shadow"])
def test_on_and_shadow_give_the_same_verdicts_through_verls_names(mode: str) -> None:
    """verl's own names, installed ``on`` (rebatch's split and restore) and in shadow mode (verl's split
    observed, every call compared, a defect raised): the issue's correct restores return verl's result
    with no error and no shadow defect; an older split's swapped outputs raise in both."""
    from property_tests.verl_oracle import verl_or_skip
    from torch_impl.integrations import verl as integration

    verl = verl_or_skip()
    theirs = verl.engine_utils.postprocess_batch_func
    integration.install(mode=mode, sample=1.0, on_defect="raise")
    try:
        split = verl.seqlen_balancing.rearrange_micro_batches
        restore = verl.engine_utils.postprocess_batch_func
        data = _batch()
        steps = []
        for _epoch in range(2):
            for rows in (8, 2):  # a log-prob pass and a training pass, other budgets
                mbs, indices = split(data, LENGTH * rows)
                steps.append((_engine(mbs), indices))
        for outs, indices in steps:  # restored in another order than split
            assert first_difference(restore(outs, indices, data), theirs(outs, indices, data)) is None
        a, b = _batch(), _batch(8)
        _, a_indices = split(a, LENGTH * 2)
        split(b, LENGTH * 4)
        x = torch.arange(16.0)
        restore_dynamic = verl.seqlen_balancing.restore_dynamic_batch if mode == "on" else None
        if restore_dynamic is not None:
            assert torch.equal(restore_dynamic(x, a_indices), ref_restore(x, a_indices))
        stats = integration.stats()
        assert stats.get("defects", 0) == 0, stats
        outs, indices = steps[0]
        swapped = [outs[1], outs[0], *outs[2:]]
        assert len(outs[0]["model_output"]["score"]) == len(outs[1]["model_output"]["score"])
        with pytest.raises(RebatchError, match="this output holds micro-batch 1's rows"):
            restore(swapped, indices, data)
    finally:
        integration.uninstall()


def test_the_docs_state_the_bounds_in_force() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = (root / "docs" / "spec.md").read_text()
    assert f"`torch_impl._alignment.MAX_SPLITS` ({_provenance.MAX_SPLITS})" in spec
    assert f"`MAX_BATCHES` ({_provenance.MAX_BATCHES})" in spec
    witness = (root / "docs" / "witness.md").read_text()
    assert f"keeps its newest {_provenance.MAX_SPLITS} splits" in witness
    assert f"older than the newest {_provenance.MAX_SPLITS}" in witness
    architecture = (root / "docs" / "architecture.md").read_text()
    assert f"a batch's newest {_provenance.MAX_SPLITS} kept together" in architecture


def test_ref_under_jit_names_are_static_and_rows_checked_in_the_program() -> None:
    """Inside ``ref.checked`` (``jax.jit`` with ``checkify``) the splits' names decide at trace time and
    the traced rows are checked in the compiled program, with the eager words."""
    import jax.numpy as jnp

    x = ref.Jagged.from_rows([[1.0] * 2] * 4)
    parts, indices, prov = ref.split_with_provenance(x, [[1, 0], [3, 2]])

    def restore(parts: Any, carried: Any, split_rows: Any) -> Any:
        outs = [
            {"model_output": {"lp": p}, "provenance": Carried("s", r)}
            for p, r in zip(parts, carried, strict=True)
        ]
        return ref.postprocess_batch(outs, indices, provenance=(ref.Provenance(tuple(split_rows), "s"),))

    checked = ref.checked(restore)
    rows = [jnp.array(r) for r in prov.rows]
    checked(parts, rows, rows)
    with pytest.raises(
        MisalignmentError, match="key 'lp', micro-batch 0: this output holds micro-batch 1's rows"
    ):
        checked(parts[::-1], rows[::-1], rows)


def test_the_state_machine_with_verls_own_function_as_oracle() -> None:
    """The provenance state machine (`property_tests.provenance_machine`) where verl is installed (CI's
    pins lane), its correct restores compared with verl 0.9.1's own function too (the main lane runs it
    at length, under the profile, with `ref` and the baseline)."""
    from hypothesis import seed, settings

    from property_tests.provenance_machine import ProvenanceMachine
    from property_tests.verl_oracle import verl_or_skip

    verl_or_skip()

    class WithVerl(ProvenanceMachine):
        pass

    assert WithVerl().verl is not None
    case = seed(59)(WithVerl.TestCase)
    case.settings = settings(settings(), max_examples=10, stateful_step_count=10, derandomize=False)
    case("runTest").runTest()


def test_verls_own_split_after_a_split_of_rebatchs_is_unproven_and_verls_result() -> None:
    """The issue's case with verl's own ``rearrange_micro_batches`` (pins environment): rebatch split the
    batch first, then verl's own split made the micro-batches the restore gets."""
    from property_tests.verl_oracle import verl_or_skip

    verl = verl_or_skip()
    data = _batch()
    _split(data, 2)  # rebatch's split of the same batch, recorded
    mbs, indices = verl.seqlen_balancing.rearrange_micro_batches(data, LENGTH * 4)
    outs = _engine(mbs)
    before = torch_impl.provenance_stats()["calls_unproven"]
    ours = torch_impl.postprocess_batch_func(outs, indices, data)
    assert torch_impl.provenance_stats()["calls_unproven"] == before + 1
    assert first_difference(ours, verl.engine_utils.postprocess_batch_func(outs, indices, data)) is None


def test_a_splits_own_lists_vouch_for_its_permutation_and_nothing_else(monkeypatch) -> None:
    """A restore given the split's own lists of ints takes the split's flattened indices, checked when
    recorded, without checking them again; a list that differs, holds a float or a bool equal to the
    split's int, or is a tuple, is checked in full and raises as it does without a record."""
    from torch_impl import _postprocess

    data = _batch()
    outs, indices = _split(data, 4)
    want = _theirs(outs, indices, data)
    checked: list[int] = []
    full_check = _postprocess.check_permutation

    def counting(*args: Any, **kwargs: Any) -> Any:
        checked.append(1)
        return full_check(*args, **kwargs)

    monkeypatch.setattr(_postprocess, "check_permutation", counting)
    assert first_difference(torch_impl.postprocess_batch_func(outs, indices, data), want) is None
    assert checked == []  # vouched: the split's own lists
    rebuilt = [[int(str(i)) for i in p] for p in indices]  # equal ints, other objects
    assert first_difference(torch_impl.postprocess_batch_func(outs, rebuilt, data), want) is None
    assert checked == []
    for value, bad in ((indices[0][0], float(indices[0][0])), (1, True)):
        p = [list(q) for q in indices]
        m = next(m for m, q in enumerate(p) if value in q)
        p[m][p[m].index(value)] = bad  # equal to the split's int
        with pytest.raises(NotAPermutationError, match="is not an integer") as recorded:
            torch_impl.postprocess_batch_func(outs, p, data)
        with pytest.raises(NotAPermutationError) as unrecorded:
            torch_impl.postprocess_batch_func(outs, p, None)
        assert str(recorded.value) == str(unrecorded.value)
    swapped = [list(q) for q in indices]
    swapped[0][0], swapped[0][1] = swapped[0][1], swapped[0][0]
    before = len(checked)
    with pytest.raises(MisalignmentError):
        torch_impl.postprocess_batch_func(outs, swapped, data)
    assert len(checked) == before + 1  # checked in full, then the split's record proves it wrong
    as_tuples = [tuple(q) for q in indices]
    assert first_difference(torch_impl.postprocess_batch_func(outs, as_tuples, data), want) is None
    assert len(checked) == before + 2


@pytest.mark.parametrize(
    ("micro_batch_rows", "indices"),
    [
        ([2, 1], [[2, 0, 1], [1]]),  # index 1 twice, 3 missing: the first 3 entries are a permutation
        ([0, 0], [[0, 0], [1, 1]]),  # micro-batches without rows
        ([1, 1], [[1, 0], [3, 2]]),  # a permutation of more rows than the micro-batches hold
        ([2, 1], [[2], [0, 1]]),  # the same rows, cut otherwise
    ],
)
def test_a_split_whose_micro_batches_disagree_with_its_indices_vouches_for_nothing_more(
    micro_batch_rows: list[int], indices: list[list[int]]
) -> None:
    """A split (here a trainer's own, observed as shadow mode observes it) whose micro-batches hold other
    row counts than its indices list: every entry counts, so what its record vouches for is what the
    restore's own check accepts; the call raises or returns as it does without a record (a split once
    checked only the entries its micro-batches held, and vouched for the rest)."""
    data = TensorDict({"use_dynamic_bsz": NonTensorData(True)}, batch_size=[])
    _provenance.observe_split(([TensorDict({}, batch_size=[n]) for n in micro_batch_rows], indices), data)
    outs = [{"model_output": {"x": torch.tensor([[float(i)] for i in p])}} for p in indices]
    outcomes = []
    for given in (None, data):
        try:
            outcomes.append(torch_impl.postprocess_batch_func(outs, indices, given))
        except RebatchError as err:
            outcomes.append(err)
    unrecorded, recorded = outcomes
    if isinstance(unrecorded, RebatchError):
        assert (type(recorded), str(recorded)) == (type(unrecorded), str(unrecorded))
    else:
        assert first_difference(recorded, unrecorded) is None
