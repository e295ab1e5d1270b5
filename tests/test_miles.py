"""miles 0.0.2's restore (``miles.backends.training_utils.log_utils.aggregate_forward_results``) and rebatch's
drop-in (`torch_impl.integrations.miles`): the same result on clean steps, a typed error on each
misalignment miles passes silently (issue 59: two micro-batches' outputs swapped, an output one row short,
a duplicate index), shadow mode returning miles' result and counting.

The first tests run anywhere, on a stand-in of miles' ``DataIterator`` (the attributes the function reads)
and a copy of miles' function (``_theirs``: its lines, for the main environment). The others run miles
itself, in its environment (``.ci/miles_env.sh``: ``.venv-miles``): its ``DataIterator`` and its
``get_data_iterator`` (one process, a gloo group of one for its all-reduce, and ``torch.cuda.
current_device`` answering ``"cpu"``: what the CPU forces) feeding the function; skipped without miles
unless ``REBATCH_REQUIRE_PEER`` names ``miles``, where a skip fails.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from ref.errors import (
    KeyMismatchError,
    MisalignmentError,
    NotAPermutationError,
    PartitionMismatchError,
    RebatchError,
    UnsupportedSettingError,
)
from torch_impl.integrations import miles

REQUIRE_ENV = "REBATCH_REQUIRE_PEER"
#: the issue's batch: 4 rows in two micro-batches, response lengths 3, 2, 4, 1
RESPONSE = [3, 2, 4, 1]
PARTS = [[2, 1], [0, 3]]


class _Iterator:
    """The attributes of miles' ``DataIterator`` that ``aggregate_forward_results`` reads."""

    def __init__(self, rollout_data: dict[str, Any], size: int | None, indices: list[list[int]] | None):
        self.rollout_data = rollout_data
        self.micro_batch_size = size
        self.micro_batch_indices = indices
        self.offset = 0


def _theirs(forward_data_store: list[dict[str, list[Any]]], data_iterator: Any, args: Any) -> dict[str, Any]:
    """miles 0.0.2's ``aggregate_forward_results`` (log_utils.py, lines 66-93), its lines copied."""
    rollout_data: dict[str, Any] = {}
    if not forward_data_store:
        return rollout_data
    for key in forward_data_store[0].keys():
        values: list[Any] = []
        for batch_result in forward_data_store:
            values += batch_result[key]
        if args.use_dynamic_batch_size and hasattr(data_iterator, "micro_batch_indices"):
            origin_values: list[Any] = [None] * len(values)
            origin_indices = sum(data_iterator.micro_batch_indices, [])  # noqa: RUF017 (miles' line)
            for value, origin_index in zip(values, origin_indices, strict=False):
                origin_values[origin_index] = value
            values = origin_values
        rollout_data[key] = values
    return rollout_data


def _data(response: list[int]) -> dict[str, Any]:
    return {"response_lengths": list(response), "total_lengths": [n + 3 for n in response]}


def _outputs(parts: list[list[int]], response: list[int], dtype: torch.dtype = torch.float32) -> list[dict]:
    """Each micro-batch's output as miles' loss functions make it: per-sample ``[R]`` tensors (values naming
    the row) for ``log_probs`` and ``entropy``."""
    return [
        {
            "log_probs": [torch.full((response[i],), -float(i), dtype=dtype) for i in p],
            "entropy": [torch.arange(response[i], dtype=dtype) + i for i in p],
        }
        for p in parts
    ]


def _args(dynamic: bool = True) -> argparse.Namespace:
    return argparse.Namespace(use_dynamic_batch_size=dynamic, qkv_format="thd")


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Bit for bit: the same keys in order, each row the same object, equal with its dtype."""
    assert list(got) == list(want)
    for key in want:
        assert len(got[key]) == len(want[key])
        for a, b in zip(got[key], want[key], strict=True):
            assert a is b or (a.dtype == b.dtype and torch.equal(a, b))


# --- anywhere: the drop-in's semantics on miles' shapes --------------------------------------------------


def test_clean_dynamic_step_equals_miles() -> None:
    it = _Iterator(_data(RESPONSE), None, PARTS)
    store = _outputs(PARTS, RESPONSE)
    got = miles.aggregate_forward_results(store, it, _args(), store_prefix="ref_")
    _same(got, _theirs(store, it, _args()))
    assert [len(x) for x in got["log_probs"]] == RESPONSE
    assert [int(x[0]) for x in got["log_probs"] if len(x)] == [0, -1, -2, -3]


def test_fixed_micro_batches_join_in_order() -> None:
    it = _Iterator(_data(RESPONSE), 2, None)
    store = _outputs([[0, 1], [2, 3]], RESPONSE)
    _same(miles.aggregate_forward_results(store, it, _args(False)), _theirs(store, it, _args(False)))
    # fixed mode under use_dynamic_batch_size: miles restores by indices it does not have (it crashes)
    with pytest.raises(UnsupportedSettingError, match="micro_batch_indices is None"):
        miles.aggregate_forward_results(store, it, _args(True))


def test_empty_and_keyless_steps() -> None:
    it = _Iterator(_data(RESPONSE), None, PARTS)
    assert miles.aggregate_forward_results([], it, _args()) == {} == _theirs([], it, _args())
    assert miles.aggregate_forward_results([{}, {}], it, _args()) == {}


def test_swapped_outputs_raise_where_miles_is_silent() -> None:
    it = _Iterator(_data(RESPONSE), None, PARTS)
    swapped = list(reversed(_outputs(PARTS, RESPONSE)))
    assert [len(x) for x in _theirs(swapped, it, _args())["log_probs"]] == [4, 1, 3, 2]  # silent
    with pytest.raises(
        MisalignmentError, match=r"key 'log_probs', micro-batch 1, position 0: 4 values .* row 0,"
    ):
        miles.aggregate_forward_results(swapped, it, _args())
    with pytest.raises(MisalignmentError):
        miles.check_aggregate_forward_results(swapped, it, _args())


def test_short_output_raises_where_miles_drops_a_row() -> None:
    it = _Iterator(_data(RESPONSE), None, PARTS)
    store = _outputs(PARTS, RESPONSE)
    store[1] = {k: v[:1] for k, v in store[1].items()}
    assert len(_theirs(store, it, _args())["log_probs"]) == 3  # silent: 3 rows for 4
    with pytest.raises(PartitionMismatchError, match=r"key 'log_probs', micro-batch 1: 1 values, .* 2 rows"):
        miles.aggregate_forward_results(store, it, _args())


def test_duplicate_index_raises_where_miles_leaves_a_none() -> None:
    it = _Iterator(_data(RESPONSE), None, [[2, 1], [0, 1]])
    store = _outputs([[2, 1], [0, 1]], RESPONSE)
    assert _theirs(store, it, _args())["log_probs"][3] is None  # silent
    with pytest.raises(NotAPermutationError, match=r"key 'log_probs'.*micro-batch 1, position 1: index 1"):
        miles.aggregate_forward_results(store, it, _args())


def test_indices_not_covering_the_rows_raise() -> None:
    it = _Iterator(_data(RESPONSE), None, [[2, 1], [0]])
    with pytest.raises(NotAPermutationError, match="index 3 is missing"):
        miles.aggregate_forward_results(_outputs([[2, 1], [0]], RESPONSE), it, _args())


def test_outputs_in_micro_batch_order_without_dynamic_batch_size_raise() -> None:
    it = _Iterator(_data(RESPONSE), None, PARTS)
    store = _outputs(PARTS, RESPONSE)
    with pytest.raises(
        MisalignmentError, match=r"micro-batch 0, position 0: .* original row 2 there, not row 0"
    ):
        miles.aggregate_forward_results(store, it, _args(False))
    ordered = _Iterator(_data(RESPONSE), None, [[0, 1], [2, 3]])
    store = _outputs([[0, 1], [2, 3]], RESPONSE)
    _same(
        miles.aggregate_forward_results(store, ordered, _args(False)), _theirs(store, ordered, _args(False))
    )


def test_malformed_outputs_are_typed_errors() -> None:
    it = _Iterator(_data(RESPONSE), None, PARTS)
    store = _outputs(PARTS, RESPONSE)
    del store[1]["entropy"]
    with pytest.raises(KeyMismatchError, match="key 'entropy', micro-batch 1: missing"):
        miles.aggregate_forward_results(store, it, _args())
    store = _outputs(PARTS, RESPONSE)
    store[0]["log_probs"] = tuple(store[0]["log_probs"])  # type: ignore[assignment]
    with pytest.raises(UnsupportedSettingError, match=r"key 'log_probs', micro-batch 0: .* got tuple"):
        miles.aggregate_forward_results(store, it, _args())


def _split(it: _Iterator, micro_batches: int) -> _Iterator:
    """``it`` recorded as ``install()`` records a split miles' ``get_data_iterator`` made, every micro-batch
    handed out."""
    miles.INTEGRATION.records[(miles.DATA, "get_data_iterator")](lambda: ([it], [micro_batches]))()
    it.offset = micro_batches
    return it


def test_a_recorded_split_vouches_for_its_rows_and_nothing_else() -> None:
    """A split checked when recorded restores by its own order while the iterator's indices and rows are
    the split's (the same result, the witness and counts still checked); a split that was no permutation
    when made vouches for nothing, and indices or rows changed since (a float or a bool equal to the
    split's int included) are checked in full."""
    it = _split(_Iterator(_data(RESPONSE), None, [list(p) for p in PARTS]), 2)
    split = miles.recorded_split(it)
    assert split is not None
    assert split.order().positions == [2, 1, 0, 3]  # original row r sits at position order[r] of [2, 1, 0, 3]
    store = _outputs(PARTS, RESPONSE)
    _same(miles.aggregate_forward_results(store, it, _args()), _theirs(store, it, _args()))
    with pytest.raises(MisalignmentError, match=r"key 'log_probs', micro-batch 1, position 0"):
        miles.aggregate_forward_results(list(reversed(store)), it, _args())  # swapped: still witnessed
    short = [store[0], {k: v[:1] for k, v in store[1].items()}]
    with pytest.raises(PartitionMismatchError, match=r"key 'log_probs', micro-batch 1: 1 values"):
        miles.aggregate_forward_results(short, it, _args())
    dup = _split(_Iterator(_data(RESPONSE), None, [[2, 1], [0, 1]]), 2)
    assert miles.recorded_split(dup) is None  # no permutation when made: unrecorded, vouches for nothing
    with pytest.raises(NotAPermutationError, match=r"micro-batch 1, position 1: index 1 duplicates"):
        miles.aggregate_forward_results(_outputs([[2, 1], [0, 1]], RESPONSE), dup, _args())
    it.micro_batch_indices = [[1, 2], [0, 3]]  # changed since the split: checked in full, and named
    with pytest.raises(
        MisalignmentError, match="micro-batch 0, position 0: index 1, but the split put row 2"
    ):
        miles.aggregate_forward_results(_outputs([[1, 2], [0, 3]], RESPONSE), it, _args())
    for value, bad in ((2, 2.0), (1, True)):  # equal to the split's int, not an int: checked in full
        it.micro_batch_indices = [[bad if i == value else i for i in p] for p in PARTS]
        with pytest.raises(NotAPermutationError, match="is not an integer"):
            miles.aggregate_forward_results(store, it, _args())
    it.micro_batch_indices = [list(p) for p in PARTS]
    it.rollout_data = _data([*RESPONSE, 5])  # a row more than the split held: checked in full
    with pytest.raises(NotAPermutationError, match="index 4 is missing"):
        miles.aggregate_forward_results(store, it, _args())


def test_per_sample_scalars_are_not_witnessed() -> None:
    """A key of one scalar a sample (not per-token) is restored, never held to the lengths."""
    it = _Iterator(_data(RESPONSE), None, PARTS)
    store = [{"score": [torch.tensor(float(i)) for i in p]} for p in PARTS]
    got = miles.aggregate_forward_results(store, it, _args())
    assert [float(x) for x in got["score"]] == [0.0, 1.0, 2.0, 3.0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_drawn_clean_steps_equal_miles(data: st.DataObject) -> None:
    rows = data.draw(st.integers(1, 12))
    response = data.draw(st.lists(st.integers(0, 6), min_size=rows, max_size=rows))
    perm = data.draw(st.permutations(range(rows)))
    cuts = sorted(data.draw(st.sets(st.integers(1, rows - 1), max_size=rows - 1)) if rows > 1 else [])
    parts = [list(perm[a:b]) for a, b in zip([0, *cuts], [*cuts, rows], strict=True)]
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))
    it = _Iterator(_data(response), None, parts)
    store = _outputs(parts, response, dtype)
    _same(miles.aggregate_forward_results(store, it, _args()), _theirs(store, it, _args()))


# --- miles itself --------------------------------------------------------------------------------------


def _need_miles() -> types.ModuleType:
    try:
        import miles.backends.training_utils.log_utils as log_utils
    except ImportError as err:
        why = (
            f"miles 0.0.2 is not installed here ({err}); CI runs these in its environment (.ci/miles_env.sh)"
        )
        if "miles" in os.environ.get(REQUIRE_ENV, "").split(","):
            pytest.fail(why)
        pytest.skip(why)
    return log_utils


@contextlib.contextmanager
def _miles_process(cp: int = 1, cp_rank: int = 0) -> Iterator[Any]:
    """miles' single-process state on the CPU: its parallel state (one data-parallel rank, ``cp`` context
    ranks), a gloo group of one for get_data_iterator's all-reduce, ``torch.cuda.current_device`` -> cpu."""
    import torch.distributed as dist
    from miles.backends.training_utils import parallel

    one = parallel.GroupInfo(rank=0, size=1, group=None)
    state = parallel.ParallelState(
        intra_dp=one,
        intra_dp_cp=one,
        cp=parallel.GroupInfo(rank=cp_rank, size=cp, group=None),
        tp=one,
        pp=one,
        ep=one,
        etp=one,
    )
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    saved = parallel._parallel_state
    mp = pytest.MonkeyPatch()
    mp.setattr(torch.cuda, "current_device", lambda: "cpu")  # the CPU forces it: no CUDA device
    parallel.set_parallel_state(state)
    try:
        yield parallel
    finally:
        parallel._parallel_state = saved
        mp.undo()
        if started:
            dist.destroy_process_group()


def _miles_args(dynamic: bool, **kw: Any) -> argparse.Namespace:
    base = dict(
        use_dynamic_batch_size=dynamic,
        use_dynamic_global_batch_size=False,
        global_batch_size=4,
        micro_batch_size=2,
        max_tokens_per_gpu=16,
        qkv_format="thd",
    )
    base.update(kw)
    return argparse.Namespace(**base)


def _forward(it: Any, num_microbatches: list[int], dtype: torch.dtype = torch.float32) -> list[dict]:
    """What Megatron's ``forward_only`` and the FSDP actor collect: the iterator reset, each step's micro-
    batches taken with ``get_next`` (miles' ``get_batch`` does), one output per micro-batch whose per-sample
    values have the rows' response lengths (naming the row by their first value: its total length)."""
    it.reset()
    store = []
    for n in num_microbatches:
        for _ in range(n):
            batch = it.get_next(["response_lengths", "total_lengths"])
            store.append(
                {
                    "log_probs": [
                        torch.full((r,), float(t), dtype=dtype)
                        for r, t in zip(batch["response_lengths"], batch["total_lengths"], strict=True)
                    ]
                }
            )
    return store


def test_miles_data_iterator_issue_batch() -> None:
    log_utils = _need_miles()
    from miles.backends.training_utils.data import DataIterator

    it = DataIterator(_data(RESPONSE), None, PARTS)
    store = _forward(it, [2])
    _same(
        miles.aggregate_forward_results(store, it, _args()),
        log_utils.aggregate_forward_results(store, it, _args()),
    )
    swapped = list(reversed(store))
    theirs = log_utils.aggregate_forward_results(swapped, it, _args())
    assert [len(x) for x in theirs["log_probs"]] == [4, 1, 3, 2]  # miles: silent
    with pytest.raises(MisalignmentError, match="key 'log_probs', micro-batch 1, position 0"):
        miles.aggregate_forward_results(swapped, it, _args())
    short = [store[0], {"log_probs": store[1]["log_probs"][:1]}]
    assert len(log_utils.aggregate_forward_results(short, it, _args())["log_probs"]) == 3  # silent
    with pytest.raises(PartitionMismatchError, match="key 'log_probs', micro-batch 1"):
        miles.aggregate_forward_results(short, it, _args())
    dup = DataIterator(_data(RESPONSE), None, [[2, 1], [0, 1]])
    assert log_utils.aggregate_forward_results(_forward(dup, [2]), dup, _args())["log_probs"][3] is None
    with pytest.raises(NotAPermutationError, match="key 'log_probs'"):
        miles.aggregate_forward_results(_forward(dup, [2]), dup, _args())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_miles_get_data_iterator_clean_steps_equal_miles(data: st.DataObject) -> None:
    """miles' own split (several steps a rollout, dynamic or fixed, virtual pipeline's iterators) feeding
    both functions: 0 differences, bit for bit."""
    log_utils = _need_miles()
    from miles.backends.training_utils.data import get_data_iterator

    steps = data.draw(st.integers(1, 3))
    gbs = data.draw(st.sampled_from([2, 4, 6]))
    dynamic = data.draw(st.booleans())
    response = data.draw(st.lists(st.integers(0, 7), min_size=steps * gbs, max_size=steps * gbs))
    prompts = data.draw(st.lists(st.integers(1, 5), min_size=steps * gbs, max_size=steps * gbs))
    rollout = {
        "response_lengths": response,
        "total_lengths": [p + r for p, r in zip(prompts, response, strict=True)],
    }
    rollout["tokens"] = [torch.zeros(t, dtype=torch.long) for t in rollout["total_lengths"]]
    args = _miles_args(dynamic, global_batch_size=gbs, micro_batch_size=2, max_tokens_per_gpu=13)
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16]))
    with _miles_process() as parallel:
        vpp = data.draw(st.sampled_from([1, 2]))
        object.__setattr__(parallel._parallel_state, "vpp_size", vpp)
        parallel._parallel_state.microbatch_group_size_per_vp_stage = 1
        iterators, counts = get_data_iterator(args, None, rollout)
        assert len(iterators) == vpp
        store = _forward(iterators[0], counts, dtype)
        _same(
            miles.aggregate_forward_results(store, iterators[0], args),
            log_utils.aggregate_forward_results(store, iterators[0], args),
        )


def test_miles_installed_on_shadow_and_provenance() -> None:
    """``install()``: miles' module attribute is rebatch's, its split recorded; a step whose indices changed
    after the split, or missing an output, raises; a reset between the pass and the join does not; shadow
    mode returns
    miles' result and counts the defect; ``uninstall()`` puts miles' names back."""
    log_utils = _need_miles()
    from miles.backends.training_utils import data as miles_data

    theirs_agg, theirs_split = log_utils.aggregate_forward_results, miles_data.get_data_iterator
    rollout = _data([3, 2, 4, 1, 5, 2, 6, 1])
    args = _miles_args(True, global_batch_size=8, max_tokens_per_gpu=9)
    try:
        with _miles_process():
            miles.install()
            assert (
                log_utils.aggregate_forward_results
                is miles.INTEGRATION.replacements()[(miles.LOG_UTILS, "aggregate_forward_results")]
                or log_utils.aggregate_forward_results is not theirs_agg
            )
            iterators, counts = miles_data.get_data_iterator(args, None, rollout)
            it = iterators[0]
            assert miles.recorded_split(it) is not None
            split_rows = [list(p) for p in it.micro_batch_indices]
            assert len(split_rows) >= 2
            store = _forward(it, counts)
            _same(log_utils.aggregate_forward_results(store, it, args), theirs_agg(store, it, args))
            with pytest.raises(PartitionMismatchError, match="micro-batch"):
                log_utils.aggregate_forward_results(store[:-1], it, args)  # an output missing
            it.reset()  # the iterator reset after the pass: no evidence, its outputs are still the split's
            _same(log_utils.aggregate_forward_results(store, it, args), theirs_agg(store, it, args))
            store = _forward(it, counts)
            it.micro_batch_indices = [list(reversed(p)) for p in it.micro_batch_indices]  # changed after
            with pytest.raises(MisalignmentError, match="the split put row"):
                log_utils.aggregate_forward_results(store, it, args)
            assert miles.stats()["by_name"]["aggregate_forward_results"]["errors"] >= 2
            # micro-batches run in another order, their indices moved with them: right, unproven
            it.micro_batch_indices = [list(p) for p in split_rows[1::-1] + split_rows[2:]]
            moved = _forward(it, counts)
            _same(log_utils.aggregate_forward_results(moved, it, args), theirs_agg(moved, it, args))
    finally:
        miles.uninstall()
    assert log_utils.aggregate_forward_results is theirs_agg
    assert miles_data.get_data_iterator is theirs_split
    try:
        miles.install(mode="shadow", sample=1.0, on_defect="log")
        it = miles_data.DataIterator(_data(RESPONSE), None, PARTS)
        swapped = list(reversed(_forward(it, [2])))
        want = theirs_agg(swapped, it, _args())
        got = log_utils.aggregate_forward_results(swapped, it, _args())
        _same(got, want)  # miles' result returned
        assert miles.stats()["by_name"]["aggregate_forward_results"]["defects"] == 1
        clean = _forward(it, [2])
        _same(log_utils.aggregate_forward_results(clean, it, _args()), theirs_agg(clean, it, _args()))
        assert miles.stats()["by_name"]["aggregate_forward_results"]["differences"] == 0
    finally:
        miles.uninstall()
    assert log_utils.aggregate_forward_results is theirs_agg


def test_miles_install_replaces_every_bound_name() -> None:
    """Modules that bind the names at import (as ``megatron_utils.model`` and ``fsdp_utils.actor`` do,
    whose GPU stacks do not import here), loaded before the install: replaced, then put back; a lazy
    install (``REBATCH``) wraps the training actors' environment and puts it back too."""
    log_utils = _need_miles()
    from miles.backends.training_utils import data as miles_data
    from miles.ray import actor_group

    probe = types.ModuleType("miles.backends._rebatch_probe")
    probe.aggregate_forward_results = log_utils.aggregate_forward_results  # type: ignore[attr-defined]
    probe.get_data_iterator = miles_data.get_data_iterator  # type: ignore[attr-defined]
    sys.modules[probe.__name__] = probe
    theirs = (log_utils.aggregate_forward_results, miles_data.get_data_iterator)
    allocate = vars(actor_group.RayTrainGroup)["_allocate_gpus_for_actor"]
    try:
        installed = miles.install(lazy=True)
        assert f"{probe.__name__}.aggregate_forward_results" in installed.places
        assert probe.aggregate_forward_results is log_utils.aggregate_forward_results is not theirs[0]
        assert probe.get_data_iterator is miles_data.get_data_iterator is not theirs[1]
        assert vars(actor_group.RayTrainGroup)["_allocate_gpus_for_actor"] is not allocate
    finally:
        miles.uninstall()
        del sys.modules[probe.__name__]
    assert (probe.aggregate_forward_results, probe.get_data_iterator) == theirs
    assert (log_utils.aggregate_forward_results, miles_data.get_data_iterator) == theirs
    assert vars(actor_group.RayTrainGroup)["_allocate_gpus_for_actor"] is allocate


def test_train_env_vars_carry_rebatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training actors' ``runtime_env`` (``args.train_env_vars``) gets rebatch's variables for the
    call (the trainer's own setting of one wins), and ``args`` is as it was after."""
    monkeypatch.setenv("REBATCH", "shadow")
    seen = []

    def allocate(self: Any, pg: Any, n: Any) -> str:
        seen.append(dict(self.args.train_env_vars))
        return "actors"

    group = types.SimpleNamespace(args=types.SimpleNamespace(train_env_vars={"A": "1"}))
    assert miles.carrying(allocate)(group, None, 1) == "actors"
    assert seen == [{"REBATCH": "shadow", "A": "1"}]
    assert group.args.train_env_vars == {"A": "1"}
    group.args.train_env_vars = {"REBATCH": "off"}
    miles.carrying(allocate)(group, None, 1)
    assert seen[-1] == {"REBATCH": "off"}


@pytest.mark.parametrize("cp_rank", [0, 1])
def test_miles_context_parallel_witness(cp_rank: int) -> None:
    """Under context parallelism each per-sample value is this rank's zigzag share of the response (miles'
    ``slice_log_prob_with_cp``): clean steps pass, swapped outputs raise."""
    log_utils = _need_miles()
    from miles.backends.training_utils.cp_utils import slice_log_prob_with_cp
    from miles.backends.training_utils.data import DataIterator

    rollout = {"response_lengths": [5, 3, 7, 3], "total_lengths": [9, 4, 12, 6]}
    with _miles_process(cp=2, cp_rank=cp_rank):
        full = [torch.arange(r, dtype=torch.float32) for r in rollout["response_lengths"]]
        mine = [
            slice_log_prob_with_cp(f, t, r, "thd")
            for f, t, r in zip(full, rollout["total_lengths"], rollout["response_lengths"], strict=True)
        ]
        it = DataIterator(rollout, None, PARTS)
        store = [{"log_probs": [mine[i] for i in p]} for p in PARTS]
        _same(
            miles.aggregate_forward_results(store, it, _args()),
            log_utils.aggregate_forward_results(store, it, _args()),
        )
        assert miles.length_witness(it, _args()) == [len(x) for x in mine]
        lengths = [len(x) for x in mine]
        swapped = list(reversed(store))
        if sorted(lengths[i] for i in PARTS[0]) != sorted(lengths[i] for i in PARTS[1]):
            with pytest.raises(RebatchError):
                miles.aggregate_forward_results(swapped, it, _args())


def test_miles_context_parallel_bshd_without_max_seq_lens_is_unproven() -> None:
    """``qkv_format="bshd"`` with ``max_seq_lens`` entries of None: miles' own join never reads them, so its
    result stands, counted unproven (it was a ``TypeError`` from ``int(None)``)."""
    log_utils = _need_miles()
    from miles.backends.training_utils.data import DataIterator

    import torch_impl

    rollout = {"response_lengths": [5, 3, 7, 3], "total_lengths": [9, 4, 12, 6], "max_seq_lens": [None] * 4}
    args = argparse.Namespace(use_dynamic_batch_size=True, qkv_format="bshd")
    with _miles_process(cp=2):
        it = DataIterator(rollout, None, PARTS)
        store = [{"log_probs": [torch.zeros(2) + i for i in p]} for p in PARTS]
        before = torch_impl.witness_stats()["skipped_unreadable_witness"]
        _same(
            miles.aggregate_forward_results(store, it, args),
            log_utils.aggregate_forward_results(store, it, args),
        )
        assert torch_impl.witness_stats()["skipped_unreadable_witness"] == before + 1


def test_miles_fixed_split_recorded_catches_a_missing_micro_batch() -> None:
    """Fixed micro-batch size: miles joins whatever comes back, so a pass missing its last micro-batch
    returns fewer rows silently; the recorded split says how many micro-batches it made."""
    log_utils = _need_miles()
    from miles.backends.training_utils import data as miles_data

    theirs = log_utils.aggregate_forward_results
    rollout = _data([3, 2, 4, 1, 5, 2, 6, 1])
    args = _miles_args(False, global_batch_size=4, micro_batch_size=2)
    try:
        with _miles_process():
            miles.install()
            iterators, counts = miles_data.get_data_iterator(args, None, rollout)
            it = iterators[0]
            assert counts == [2, 2]
            store = _forward(it, counts)
            _same(log_utils.aggregate_forward_results(store, it, args), theirs(store, it, args))
            short = _forward(it, [3])
            assert len(theirs(short, it, args)["log_probs"]) == 6  # miles: silent, 2 rows short
            with pytest.raises(MisalignmentError, match="3 micro-batch outputs, but the split made 4"):
                log_utils.aggregate_forward_results(short, it, args)
            unrecorded = miles_data.DataIterator(rollout, 2, None)  # not made by the split: unproven
            _same(
                log_utils.aggregate_forward_results(_forward(unrecorded, [3]), unrecorded, args),
                theirs(_forward(unrecorded, [3]), unrecorded, args),
            )
    finally:
        miles.uninstall()


def test_miles_lazy_install_before_miles_is_imported() -> None:
    """The startup hook's form (``install(lazy=True)`` before miles is imported, in a fresh process): each
    module is patched as it finishes importing, the training actors' environment wrapped."""
    _need_miles()
    import subprocess

    code = (
        "from torch_impl.integrations import miles as m\n"
        "import sys\n"
        "m.install(lazy=True)\n"
        "assert 'miles' not in sys.modules\n"
        "import miles.backends.training_utils.log_utils as log_utils\n"
        "import miles.backends.training_utils.data as data\n"
        "import miles.ray.actor_group as actor_group\n"
        "assert log_utils.aggregate_forward_results.__module__ == 'torch_impl.integrations.miles._restore'\n"
        "assert data.get_data_iterator.__wrapped__.__module__ == data.__name__\n"
        "assert actor_group.RayTrainGroup._allocate_gpus_for_actor.__wrapped__.__module__ "
        "== actor_group.__name__\n"
        "m.uninstall()\n"
        "assert log_utils.aggregate_forward_results.__module__ == log_utils.__name__\n"
        "assert not hasattr(data.get_data_iterator, '__wrapped__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
