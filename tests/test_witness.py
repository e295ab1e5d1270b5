"""The alignment witness (docs/spec.md, "The alignment witness"): verl-style steps pass with every per-token
key bound and nothing else; every well-formed misalignment whose restored lengths differ from the
batch's raises `MisalignmentError` naming a per-token key, in both implementations, through verl's
drop-in, its shadow-mode check and (where verl is installed) verl's own name after `install()`."""

from __future__ import annotations

import itertools
import logging
import re
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from tensordict import TensorDict

import ref
import torch_impl
from property_tests.baseline import verl_postprocess_batch_func
from property_tests.compare import first_difference
from property_tests.convert import outputs_to_ref
from property_tests.kernels import KERNELS, forced
from property_tests.strategies import PER_TOKEN_KEYS, VerlStep, verl_step, verl_steps
from ref.errors import InvalidJaggedError, MisalignmentError, UnsupportedSettingError
from torch_impl._alignment import _switch
from torch_impl._postprocess import check_batch_func

KINDS = (
    "micro_batches_swapped",
    "rows_swapped",
    "inverse_for_forward",
    "another_steps_indices",
    "outputs_in_micro_batch_order",
)
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: Steps of a few rows (the witness read as Python ints) and of more than 64 (read as ``input_ids``'
#: offsets, compared with each bound key's restored offsets).
STEPS = st.one_of(verl_steps(), verl_steps(min_rows=65, max_rows=120))


def _witness_alone(data: Any) -> Any:
    """``data`` as a batch no split of rebatch's recorded (a copy whose ``input_ids`` are rebuilt on offsets
    of their own: a shallow copy would find the split's record by their nested int): the witness alone
    judges a misaligned call (exact provenance, which raises first where a split recorded it:
    test_provenance.py)."""
    alone = data.copy()
    ids = alone["input_ids"]
    alone["input_ids"] = torch.nested.nested_tensor_from_jagged(ids.values(), ids.offsets().clone())
    return alone


def _misaligned(
    step: VerlStep, kind: str, rng: np.random.Generator
) -> tuple[list[Any], Any, list[int], list[int]]:
    """``(output_lst, indices, src, perm)`` of ``step`` misaligned by ``kind``: concatenated row ``k`` was
    computed for original row ``src[k]`` and is restored as ``perm[k]``. Without dynamic batch size only
    micro-batch swaps exist (there are no indices)."""
    outs = list(step.output_lst)
    sizes = [int(o["model_output"]["log_probs"].size(0)) for o in outs]
    bounds = list(itertools.accumulate(sizes, initial=0))
    flat = [i for p in step.indices for i in p] if step.indices is not None else list(range(sum(sizes)))
    src, perm = list(flat), list(flat)
    if kind == "micro_batches_swapped" or step.indices is None:
        pairs = [(m, n) for m, n in itertools.combinations(range(len(sizes)), 2) if sizes[m] == sizes[n] > 0]
        if pairs:
            m, n = pairs[int(rng.integers(len(pairs)))]
            outs[m], outs[n] = outs[n], outs[m]
            order = list(range(len(sizes)))
            order[m], order[n] = n, m
            src = [flat[j] for q in order for j in range(bounds[q], bounds[q + 1])]
    elif kind == "rows_swapped" and len(flat) >= 2:
        a, b = rng.choice(len(flat), size=2, replace=False).tolist()
        perm[a], perm[b] = perm[b], perm[a]
    elif kind == "inverse_for_forward":
        perm = [0] * len(flat)
        for k, i in enumerate(flat):
            perm[i] = k
    elif kind == "another_steps_indices":
        perm = rng.permutation(len(flat)).tolist()
    elif kind == "outputs_in_micro_batch_order":
        perm = list(range(len(flat)))
    indices = None if step.indices is None else [perm[bounds[q] : bounds[q + 1]] for q in range(len(sizes))]
    return outs, indices, src, perm


@FEW
@given(STEPS)
def test_verl_style_steps_pass_every_per_token_key_bound(step: VerlStep) -> None:
    """0 false positives: per-token keys on the micro-batches' own offsets (shared and copied), dense
    ``[b, F]``, 4-D int16 and a key jagged over other lengths; the result is verl's algorithm's."""
    before = torch_impl.witness_stats()
    result = torch_impl.postprocess_batch_func(step.output_lst, step.indices, step.data)
    after = torch_impl.witness_stats()
    assert after["calls"] - before["calls"] == 1
    assert after["keys_witnessed"] - before["keys_witnessed"] >= len(PER_TOKEN_KEYS)
    assert (
        first_difference(result, verl_postprocess_batch_func(step.output_lst, step.indices, step.data))
        is None
    )
    check_batch_func(step.output_lst, step.indices, step.data)  # shadow mode's check: nothing raised


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(verl_steps(max_rows=6))
def test_ref_passes_the_same_steps_with_their_witness(step: VerlStep) -> None:
    ref.postprocess_batch(
        outputs_to_ref(step.output_lst),
        step.indices,
        use_dynamic_bsz=step.indices is not None,
        witness=step.lengths,
    )


@pytest.mark.parametrize("path", sorted(KERNELS))
@FEW
@given(step=STEPS, kind=st.sampled_from(KINDS), seed=st.integers(0, 2**16))
def test_each_misalignment_raises_naming_a_per_token_key(
    path: str, step: VerlStep, kind: str, seed: int
) -> None:
    """Caught exactly where some restored row's length differs from the batch's (computed here, row by
    row), through the drop-in and shadow mode's check, on every CPU path."""
    outs, indices, src, perm = _misaligned(step, kind, np.random.default_rng(seed))
    differs = any(step.lengths[a] != step.lengths[b] for a, b in zip(src, perm, strict=True))
    for fn in (torch_impl.postprocess_batch_func, check_batch_func):
        with forced(path):
            if differs:
                with pytest.raises(MisalignmentError) as info:
                    fn(outs, indices, _witness_alone(step.data))
                assert re.match(r"key '(\w+)', micro-batch \d+, position \d+: ", str(info.value))
                assert str(info.value).split("'")[1] in PER_TOKEN_KEYS
                assert "REBATCH_WITNESS=off" in str(info.value)
            else:
                fn(
                    outs, indices, _witness_alone(step.data)
                )  # moved only among rows of equal length: not visible


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step=verl_steps(max_rows=6), kind=st.sampled_from(KINDS), seed=st.integers(0, 2**16))
def test_ref_raises_the_same_error_for_the_same_misalignment(step: VerlStep, kind: str, seed: int) -> None:
    outs, indices, _, _ = _misaligned(step, kind, np.random.default_rng(seed))
    errors = []
    for run in (
        lambda: torch_impl.postprocess_batch(
            outs, indices, use_dynamic_bsz=indices is not None, witness=torch.tensor(step.lengths)
        ),
        lambda: ref.postprocess_batch(
            outputs_to_ref(outs), indices, use_dynamic_bsz=indices is not None, witness=step.lengths
        ),
    ):
        try:
            run()
            errors.append(None)
        except MisalignmentError as err:
            errors.append(str(err))
    assert errors[0] == errors[1]


def test_ref_checks_a_traced_witness_under_checked() -> None:
    lp = [ref.Jagged.from_rows([[1.0], [2.0, 3.0]]), ref.Jagged.from_rows([[4.0, 5.0, 6.0]])]
    outs = [{"model_output": {"lp": p}} for p in lp]
    run = ref.checked(lambda o, w: ref.postprocess_batch(o, [[2, 0], [1]], witness=w))
    run(outs, np.asarray([2, 3, 1]))  # aligned
    with pytest.raises(
        MisalignmentError, match=r"key 'lp', micro-batch 0, position 1: 2 values restored as original row 0"
    ):
        run(outs, np.asarray([1, 3, 2]))
    with pytest.raises(InvalidJaggedError, match=r"witness lengths\[1\] = -3 is negative"):
        run(outs, np.asarray([1, -3, 2]))
    with pytest.raises(InvalidJaggedError, match=r"2 witness lengths for 3 rows"):
        run(outs, np.asarray([1, 2]))


@pytest.mark.parametrize("rows", [3, 100])
def test_a_keys_structural_defect_comes_before_a_defect_of_the_witness(rows: int) -> None:
    """Step 5 (every key's structure) before step 6a (the witness's form and signs), in both
    implementations and whatever form the witness is read in (few rows: ints; many: offsets)."""
    offsets = list(range(rows + 1))
    offsets[1], offsets[2] = 2, 1  # decreasing: a defect of the key's offsets
    lp = torch.nested.nested_tensor_from_jagged(torch.arange(float(rows)), torch.tensor(offsets))
    outs = [{"model_output": {"lp": lp}}]
    perm = [list(range(rows))]
    for witness in ([1] * (rows - 1) + [-1], [1] * (rows + 1)):
        for run in (
            lambda w=witness: torch_impl.postprocess_batch(outs, perm, witness=w),
            lambda w=witness: ref.postprocess_batch(outputs_to_ref(outs), perm, witness=w),
        ):
            with pytest.raises(
                InvalidJaggedError, match=r"key 'lp', micro-batch 0: offsets must be non-decreasing"
            ):
                run()
        ids = torch.nested.nested_tensor_from_jagged(
            torch.zeros(rows, dtype=torch.int64),
            torch.tensor([0, *itertools.accumulate(witness)][: rows + 1]),
        )
        data = TensorDict({"input_ids": ids}, batch_size=[])
        with pytest.raises(
            InvalidJaggedError, match=r"key 'lp', micro-batch 0: offsets must be non-decreasing"
        ):
            torch_impl.postprocess_batch_func(outs, perm, data)


@pytest.mark.parametrize("rows", [3, 100])
def test_a_negative_witness_length_is_refused_before_any_mismatch(rows: int) -> None:
    """6a before 6b: a witness read from ``input_ids`` whose offsets decrease (a negative length) is
    refused naming the witness, although a bound key differs from it; the same as ``ref``'s."""
    lp = torch.nested.nested_tensor_from_jagged(torch.arange(float(rows)), torch.arange(rows + 1))
    outs = [{"model_output": {"lp": lp}}]
    ids_offsets = list(range(rows + 1))
    ids_offsets[1], ids_offsets[2] = 2, 1  # rows of 2, -1 and 2 values: the total stays, so 'lp' is bound
    ids = torch.nested.nested_tensor_from_jagged(
        torch.zeros(rows, dtype=torch.int64), torch.tensor(ids_offsets)
    )
    data = TensorDict({"input_ids": ids}, batch_size=[])
    witness = np.diff(ids_offsets).tolist()
    for run in (
        lambda: torch_impl.postprocess_batch_func(outs, [list(range(rows))], data),
        lambda: torch_impl.postprocess_batch(outs, [list(range(rows))], witness=witness),
        lambda: ref.postprocess_batch(outputs_to_ref(outs), [list(range(rows))], witness=witness),
    ):
        with pytest.raises(InvalidJaggedError, match=r"witness lengths\[1\] = -1 is negative"):
            run()


def test_many_rows_misaligned_raise_the_same_error_as_ref() -> None:
    """More than 64 rows: the witness kept as ``input_ids``' offsets; the first differing row, its
    micro-batch and position, as ``ref`` names them from the lengths."""
    rng = np.random.default_rng(7)
    step = verl_step(rng.integers(1, 9, size=90).tolist(), budget=40)
    outs, indices, _, _ = _misaligned(step, "rows_swapped", rng)
    while not any(
        step.lengths[a] != step.lengths[b]
        for a, b in zip([i for p in step.indices for i in p], [i for p in indices for i in p], strict=True)
    ):
        outs, indices, _, _ = _misaligned(step, "rows_swapped", rng)
    got = []
    for path in ("host_scatter", "element_indices"):
        with forced(path), pytest.raises(MisalignmentError) as info:
            torch_impl.postprocess_batch_func(outs, indices, _witness_alone(step.data))
        got.append(str(info.value))
    with pytest.raises(MisalignmentError) as info:
        ref.postprocess_batch(outputs_to_ref(outs), indices, witness=step.lengths)
    assert got == [str(info.value)] * 2


def test_a_witness_of_the_wrong_form_is_refused_alike() -> None:
    lp = torch.nested.nested_tensor_from_jagged(torch.arange(3.0), torch.tensor([0, 1, 3]))
    outs = [{"model_output": {"lp": lp}}]
    for witness, pattern in (
        ([1, 2, 0], r"3 witness lengths for 2 rows"),
        ([-1, 4], r"witness lengths\[0\] = -1"),
    ):
        for impl, o in ((torch_impl, outs), (ref, outputs_to_ref(outs))):
            with pytest.raises(InvalidJaggedError, match=pattern):
                impl.postprocess_batch(o, [[0, 1]], witness=witness)
            with pytest.raises(InvalidJaggedError, match=pattern):
                impl.postprocess_batch(o, [[0, 1]], witness=np.asarray(witness))


def test_unbound_keys_and_the_switch() -> None:
    """A key declared unbound is never flagged; the process-wide switch turns the drop-in's witness off
    (and is put back), and a witness that binds nothing shows in the stats."""
    step, outs, indices = _a_misaligned_step()
    keys = list(outs[0]["model_output"])
    torch_impl.postprocess_batch(outs, indices, witness=step.lengths, unbound=keys)  # nothing bound
    previous = torch_impl.set_witness(False)
    try:
        torch_impl.postprocess_batch_func(outs, indices, step.data)  # off: verl's silence
    finally:
        torch_impl.set_witness(previous[0], unbound=previous[1])
    previous = torch_impl.set_witness(unbound=PER_TOKEN_KEYS)
    try:
        before = torch_impl.witness_stats()
        torch_impl.postprocess_batch_func(outs, indices, step.data)
        after = torch_impl.witness_stats()
    finally:
        torch_impl.set_witness(previous[0], unbound=previous[1])
    assert after["keys_unbound"] - before["keys_unbound"] == len(keys)
    assert after["calls_binding_nothing"] - before["calls_binding_nothing"] == 1
    with pytest.raises(MisalignmentError):
        torch_impl.postprocess_batch_func(outs, indices, step.data)
    with pytest.raises(UnsupportedSettingError, match="set_witness: on must be a bool"):
        torch_impl.set_witness("off")  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "on"), [("off", False), ("on", True), ("", True), (" OFF ", False)])
def test_the_environment_variable_sets_the_default(
    monkeypatch: pytest.MonkeyPatch, value: str, on: bool
) -> None:
    monkeypatch.setattr(_switch, "_config", None)
    monkeypatch.setenv("REBATCH_WITNESS", value)
    monkeypatch.setenv("REBATCH_WITNESS_UNBOUND", "a, b")
    assert torch_impl.witness_config() == (on, frozenset({"a", "b"}))


def test_a_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_switch, "_config", None)
    monkeypatch.setenv("REBATCH_WITNESS", "maybe")
    with pytest.raises(UnsupportedSettingError, match="REBATCH_WITNESS='maybe'"):
        torch_impl.witness_config()


def test_data_without_jagged_input_ids_gives_no_witness() -> None:
    from tensordict import TensorDict

    step, outs, indices = _a_misaligned_step()
    before = torch_impl.witness_stats()["calls_without_witness"]
    dense = torch.zeros(len(step.lengths), 2)
    for data in (None, TensorDict({}, batch_size=[]), TensorDict({"input_ids": dense}, batch_size=[])):
        torch_impl.postprocess_batch_func(outs, indices, data)
    assert torch_impl.witness_stats()["calls_without_witness"] - before == 3


def test_on_meta_the_comparison_is_launched_and_never_read() -> None:
    """The device path without data: the call dispatches the comparison (counted in the launch table)
    and cannot read its verdict, so it raises nothing. Planned from the witness's lengths (on the host),
    the call dispatches fewer operations than without it: the comparison replaces the plan's device work."""
    from tensordict import NonTensorData, TensorDict

    from property_tests.launches import _host_input_ids, count_call, meta_batch
    from property_tests.opcount import CountOps

    outs, indices = meta_batch(8, 2, keys=1)
    data = TensorDict(
        {"use_dynamic_bsz": NonTensorData(True), "input_ids": _host_input_ids(outs, indices)}, batch_size=[]
    )
    with CountOps() as counter:
        torch_impl.postprocess_batch_func(outs, indices, data)
    assert counter.ops["aten.ne.Tensor"] == counter.ops["aten.any.default"] == 1
    without = count_call(outs, indices, drop_in=True, witness=False).ops
    assert sum(counter.ops.values()) < without


# -- verl itself (CI's pins environment) -------------------------------------------------------------


def _verl() -> Any:
    from property_tests.verl_oracle import verl_or_skip

    return verl_or_skip()


def _a_misaligned_step() -> tuple[VerlStep, list[Any], Any]:
    """A step of 8 rows of distinct lengths under a budget of 16 tokens, its outputs left in micro-batch
    order (the indices a range): misaligned where every length differs."""
    step = verl_step([5, 3, 7, 2, 4, 8, 1, 6], budget=16)
    outs, indices, src, perm = _misaligned(step, "outputs_in_micro_batch_order", np.random.default_rng(0))
    assert any(step.lengths[a] != step.lengths[b] for a, b in zip(src, perm, strict=True))
    return step._replace(data=_witness_alone(step.data)), outs, indices


def test_verl_after_install_raises_and_shadow_mode_counts_a_defect(caplog: pytest.LogCaptureFixture) -> None:
    verl = _verl()
    from torch_impl.integrations import verl as rebatch_verl

    step, outs, indices = _a_misaligned_step()
    theirs = verl.engine_utils.postprocess_batch_func
    silent = theirs(outs, indices, step.data)  # verl's own: a result, misaligned
    rebatch_verl.install()
    try:
        with pytest.raises(MisalignmentError, match=r"key 'log_probs'"):
            verl.engine_utils.postprocess_batch_func(outs, indices, step.data)
        verl.engine_utils.postprocess_batch_func(step.output_lst, step.indices, step.data)  # the aligned step
    finally:
        rebatch_verl.uninstall()
    rebatch_verl.install(witness=False)
    try:
        verl.engine_utils.postprocess_batch_func(outs, indices, step.data)  # switched off: verl's silence
        assert not torch_impl.witness_config()[0]
    finally:
        rebatch_verl.uninstall()
    assert torch_impl.witness_config()[0]
    rebatch_verl.install(mode="shadow", sample=1.0)
    try:
        with caplog.at_level(logging.ERROR, logger="rebatch.shadow"):
            got = verl.engine_utils.postprocess_batch_func(outs, indices, step.data)
        assert first_difference(got, silent) is None  # verl's result, unchanged
        assert rebatch_verl.stats()["defects"] == 1
        assert any(
            "MisalignmentError" in r.getMessage() and "misaligned" in r.getMessage() for r in caplog.records
        )
    finally:
        rebatch_verl.uninstall()


def test_verl_switched_on_by_its_variable_raises_through_its_own_name(tmp_path: Any) -> None:
    """``REBATCH_VERL=on`` alone, in a fresh process: verl's name raises for the misaligned step, and
    with ``REBATCH_WITNESS=off`` too it returns verl's (misaligned) result."""
    import os
    import subprocess
    import sys

    _verl()
    step, outs, indices = _a_misaligned_step()
    path = tmp_path / "step.pt"
    torch.save((outs, indices, step.data), path)
    code = (
        "import sys, torch\n"
        "import verl.workers.engine.utils as u\n"
        "from ref.errors import MisalignmentError\n"
        f"outs, indices, data = torch.load({str(path)!r}, weights_only=False)\n"
        "try:\n"
        "    u.postprocess_batch_func(outs, indices, data)\n"
        "except MisalignmentError as err:\n"
        "    print('raised', str(err).split(':')[0])\n"
        "else:\n"
        "    print('returned')\n"
    )
    for extra, want in (
        ({}, "raised key 'log_probs', micro-batch"),
        ({"REBATCH_WITNESS": "off"}, "returned"),
    ):
        env = {**os.environ, "REBATCH_VERL": "on", **extra}
        env.pop("REBATCH", None)
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().startswith(want), (done.stdout, done.stderr[-2000:])


def test_areal_drop_in_checks_each_micro_batch_against_its_own_cu_seqlens() -> None:
    """AReaL's witness: ``mb_list.mbs[m]["cu_seqlens"]`` (the micro-batch as the model saw it) against
    ``output_seqlens`` in ``forward_indices`` order, and each output's size against its tokens."""
    from property_tests.trainers.areal import micro_batch_list as areal_mb_list
    from torch_impl.integrations.areal import reorder_and_pad_outputs

    seqlens, forward = [2, 1, 3, 4], [2, 0, 1, 3]  # micro-batches [2, 0] (3 + 2 tokens) and [1, 3] (1 + 4)
    outs = [torch.arange(5.0), torch.arange(5.0) + 10]
    cu = [torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([0, 1, 5], dtype=torch.int32)]
    plain = reorder_and_pad_outputs(outs, seqlens, areal_mb_list(forward))
    assert (
        first_difference(reorder_and_pad_outputs(outs, seqlens, areal_mb_list(forward, cu_seqlens=cu)), plain)
        is None
    )
    with pytest.raises(
        MisalignmentError,
        match=r"key 'outputs', micro-batch 0, position 0: 3 values restored as original row 0, whose length "
        r"the alignment witness gives as 2",
    ):
        reorder_and_pad_outputs(
            outs, seqlens, areal_mb_list([0, 2, 1, 3], cu_seqlens=cu)
        )  # a wrong forward order
    swapped = [torch.tensor([0, 1, 5], dtype=torch.int32), torch.tensor([0, 3, 5], dtype=torch.int32)]
    with pytest.raises(
        MisalignmentError, match=r"micro-batch 0, position 1: 4 values restored as original row 0"
    ):
        reorder_and_pad_outputs(outs, seqlens, areal_mb_list(forward, cu_seqlens=swapped))
    previous = torch_impl.set_witness(False)
    try:
        reorder_and_pad_outputs(outs, seqlens, areal_mb_list([0, 2, 1, 3], cu_seqlens=cu))  # switched off
    finally:
        torch_impl.set_witness(previous[0], unbound=previous[1])


_FORK_WHILE_COUNTING = """
import os, signal, sys, time
import torch, torch_impl
from torch_impl._alignment import _switch
nt = torch.nested.nested_tensor_from_jagged(torch.zeros(2), torch.tensor([0, 2]))
with _switch._lock:
    pid = os.fork()
    if pid == 0:  # the child: the lock was held at the fork; counting must not wait
        try:
            torch_impl.postprocess_batch([{"model_output": {"lp": nt}}], [[0]], witness=[2])
            os._exit(0)
        except BaseException:
            os._exit(1)
deadline = time.monotonic() + 60
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() > deadline:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        sys.exit("the forked child hung on the counters' lock")
    time.sleep(0.05)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_counts_although_a_thread_held_the_counters_lock_at_the_fork() -> None:
    """A fork while the witness's counters lock is held (another thread counting) leaves the child usable.
    In a fresh interpreter: this one has JAX loaded, whose own fork hook warns."""
    import os
    import subprocess
    import sys

    if not hasattr(os, "fork"):
        pytest.skip("no fork here")  # pragma: no cover - Linux CI
    done = subprocess.run(
        [sys.executable, "-c", _FORK_WHILE_COUNTING], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
