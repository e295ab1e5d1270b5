"""The launch bound: on the device path a call dispatches at most 30 torch operations per key plus 60
per call, whatever the numbers of rows (B) and micro-batches (M), for outputs up to 16 MiB a key; a
larger output adds at most 10 per further 16 MiB. Counted on ``meta`` (the device path without data)
with `property_tests.opcount.CountOps`; nothing is timed."""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
import torch

from property_tests.launches import LAYOUTS, count_call, meta_batch, output_bytes

PER_KEY, PER_CALL, PER_FURTHER_16_MIB = 30, 60, 10
MIB16 = 16 * 2**20
ROWS = (8, 1024, 16384)
MICRO_BATCHES = (1, 2, 16, 64, 256)
LENGTH = 32  # at B = 16384: 2 MiB a key for [b, (j)], 8 MiB for [b, (j), k]


def allowed(keys: int, key_bytes: int) -> int:
    """The bound for ``keys`` keys of ``key_bytes`` bytes of output each."""
    further = math.ceil(max(0, key_bytes - MIB16) / MIB16)
    return keys * (PER_KEY + PER_FURTHER_16_MIB * further) + PER_CALL


@functools.cache
def _batch(
    rows: int, micro_batches: int, layout: str, length: int = LENGTH
) -> tuple[list[Any], list[list[int]]]:
    return meta_batch(rows, micro_batches, keys=2, layout=layout, length=length)


def _ops(
    rows: int, micro_batches: int, layout: str, keys: int, dynamic: bool, drop_in: bool, length: int = LENGTH
) -> int:
    outs, indices = _batch(rows, micro_batches, layout, length)
    outs = [{**o, "model_output": dict(list(o["model_output"].items())[:keys])} for o in outs]
    return count_call(outs, indices if dynamic else None, drop_in=drop_in).ops


@pytest.mark.parametrize("micro_batches", MICRO_BATCHES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_operations_per_key_and_per_call_are_bounded(layout: str, micro_batches: int) -> None:
    """Every B, dynamic batching on and off, `postprocess_batch` and verl's drop-in: one key and two
    keys within the bound, and the second key's operations (the per-key cost) at most 30. More
    micro-batches than rows leaves some empty, which the partitions allow."""
    for rows in ROWS:
        key_bytes = output_bytes(rows, layout=layout, length=LENGTH)
        assert key_bytes <= MIB16
        for dynamic in (True, False):
            for drop_in in (False, True):
                one, two = (_ops(rows, micro_batches, layout, k, dynamic, drop_in) for k in (1, 2))
                case = (
                    f"B={rows} M={micro_batches} {layout} dynamic={dynamic} drop_in={drop_in}: "
                    f"{one}, {two} ops"
                )
                assert one <= allowed(1, key_bytes), case
                assert two <= allowed(2, key_bytes), case
                assert two - one <= PER_KEY, case
                assert one - (two - one) <= PER_CALL, case


@pytest.mark.parametrize("layout", ["[b, (j)]", "[b, (j), k]"])
@pytest.mark.parametrize("dynamic", [True, False])
def test_a_larger_output_adds_at_most_ten_operations_per_16_mib(layout: str, dynamic: bool) -> None:
    """64 MiB a key (3 further 16 MiB) against 16 MiB a key, same B and M."""
    rows, micro_batches = 1024, 16
    row_bytes = output_bytes(rows, layout=layout, length=1)
    small, large = MIB16 // row_bytes, 4 * MIB16 // row_bytes
    assert output_bytes(rows, layout=layout, length=large) == 4 * MIB16
    at_16 = _ops(rows, micro_batches, layout, 1, dynamic, False, length=small)
    at_64 = _ops(rows, micro_batches, layout, 1, dynamic, False, length=large)
    assert at_16 <= allowed(1, MIB16)
    assert at_64 <= allowed(1, 4 * MIB16), (at_16, at_64)
    assert at_64 - at_16 <= 3 * PER_FURTHER_16_MIB, (at_16, at_64)


#: Each key after the first on the same offsets tensors (as verl's engines build every per-token key of
#: a micro-batch): its values joined, the result allocated, one index copy (torch 2.9.1 also counts up
#: to four reads of a dimension: the result's sizes, and its cached sizes marked dynamic); the plan, the
#: element indices and the cached sizes are the group's (`torch_impl._plan.KeyPlan.group`).
PER_SHARED_KEY = 7
#: Of them, kernel launches on a GPU (traced on fake CUDA): the values' ``cat`` and the ``index_copy_``.
LAUNCHES_PER_SHARED_KEY = 2


@pytest.mark.parametrize("rows", ROWS)
def test_keys_on_one_offsets_tensor_share_their_plan(rows: int) -> None:
    """verl's call, keys of a micro-batch on one offsets tensor: a further key adds at most
    `PER_SHARED_KEY` operations (it was 25 with a plan a key)."""
    for micro_batches in (1, 16):
        one = _ops(rows, micro_batches, "[b, (j)]", 1, True, True)
        two = _ops(rows, micro_batches, "[b, (j)]", 2, True, True)
        assert two - one <= PER_SHARED_KEY, f"B={rows} M={micro_batches}: {one}, {two} ops"


@pytest.mark.parametrize("rows", [8, 1024])
def test_keys_on_one_offsets_tensor_launch_two_kernels_each(rows: int) -> None:
    """verl's call traced on fake CUDA (`property_tests.fakecuda`), five keys against one, the keys of a
    micro-batch on one offsets tensor: `LAUNCHES_PER_SHARED_KEY` launches a further key, no read."""
    from property_tests import sidebyside
    from property_tests.fakecuda import FakeCuda, fake_like

    traced = []
    for keys in (1, 5):
        fc = FakeCuda()
        pair = sidebyside.pair("verl", rows, keys, functools.partial(fake_like, fc=fc))
        with fc:
            pair.ours()
        traced.append(fc.trace())
    one, five = traced
    assert len(five.launches) - len(one.launches) <= 4 * LAUNCHES_PER_SHARED_KEY, (
        len(one.launches),
        len(five.launches),
    )
    assert five.syncs == one.syncs == 0


def test_the_docs_state_the_shared_keys_bound() -> None:
    from pathlib import Path

    kernels = (Path(__file__).resolve().parent.parent / "docs" / "kernels.md").read_text()
    assert f"a further key costs at most {PER_SHARED_KEY} operations" in kernels
    assert f"{LAUNCHES_PER_SHARED_KEY} kernel launches" in kernels
    assert f"at most {LAUNCHES_PER_CALL} kernel\n  launches a call and {LAUNCHES_PER_KEY} a key" in kernels
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert f"at most {LAUNCHES_PER_CALL} kernel launches plus {LAUNCHES_PER_KEY} a key" in readme


#: verl's call on the device path (issue 56), keys of a micro-batch on one offsets tensor, whatever B and
#: M: kernel launches a call (its group's plan: `torch_impl._devplan`), a key (its values joined, one
#: index copy), and what the alignment witness may add a call (its comparison and its one read).
LAUNCHES_PER_CALL, LAUNCHES_PER_KEY, WITNESS_LAUNCHES = 10, 2, 4


def _verl_call(rows: int, micro_batches: int, keys: int, witness: bool, move: Any) -> Any:
    """verl's call of ``keys`` float32 keys on each micro-batch's one offsets tensor, the outputs moved with
    ``move``; ``data`` holds the batch's ``input_ids`` on the host (as verl's engines leave it) where
    ``witness``."""
    from tensordict import TensorDict

    import torch_impl
    from property_tests.peers import sized_call

    outs, partitions = sized_call(rows, LENGTH, micro_batches)
    parts = [o["model_output"]["log_probs"] for o in outs]
    output_lst = move([{"model_output": {f"k{k}": p for k in range(keys)}} for p in parts])
    entries: dict[str, Any] = {}
    if witness:
        lengths = [0] * rows
        for p, x in zip(partitions, parts, strict=True):
            for i, n in zip(p, x.offsets().diff().tolist(), strict=True):
                lengths[i] = n
        entries["input_ids"] = torch_impl.from_packed(torch.zeros(sum(lengths), dtype=torch.int64), lengths)
    data = TensorDict(entries, batch_size=[])
    return lambda: torch_impl.postprocess_batch_func(output_lst, partitions, data)


def _fake_cuda_launches(rows: int, micro_batches: int, keys: int, witness: bool) -> tuple[int, int]:
    """Kernel launches and device reads of `_verl_call` traced on fake CUDA."""
    from property_tests.fakecuda import FakeCuda, fake_like

    fc = FakeCuda()
    call = _verl_call(rows, micro_batches, keys, witness, functools.partial(fake_like, fc=fc))
    with fc:
        call()
    trace = fc.trace()
    return len(trace.launches), trace.syncs


#: Operations that launch no kernel on ``meta``: views, allocations, reads of a dimension, and a host
#: array taken as a tensor.
_NO_LAUNCH = (
    "slice",
    "view",
    "select.int",
    "alias",
    "as_strided",
    "lift_fresh",
    "detach",
    "expand",
    "unbind",
    "empty",
    "dim",
)


def _meta_launches(rows: int, micro_batches: int, keys: int, witness: bool) -> int:
    """The operations of `_verl_call` on ``meta`` that launch a kernel."""
    from property_tests.opcount import CountOps
    from rebatch.bench.gpu_model import to_meta

    call = _verl_call(rows, micro_batches, keys, witness, to_meta)
    with CountOps() as counter:
        call()
    return sum(n for op, n in counter.ops.items() if not any(v in op for v in _NO_LAUNCH))


@pytest.mark.parametrize(
    ("rows", "micro_batches"), [(8, 1), (8, 4), (1024, 1), (1024, 16), (1024, 64), (16384, 16), (16384, 64)]
)
def test_verls_call_launches_at_most_ten_a_call_and_two_a_key(rows: int, micro_batches: int) -> None:
    """Fake CUDA: one key and five within ``10 + 2 * keys`` launches and no read; witnessed (``data``
    carrying ``input_ids``), at most `WITNESS_LAUNCHES` more and one read (its verdict)."""
    for keys in (1, 5):
        allowed = LAUNCHES_PER_CALL + LAUNCHES_PER_KEY * keys
        plain, plain_reads = _fake_cuda_launches(rows, micro_batches, keys, witness=False)
        checked, checked_reads = _fake_cuda_launches(rows, micro_batches, keys, witness=True)
        case = f"B={rows} M={micro_batches} keys={keys}: {plain} launches, {checked} witnessed"
        assert plain <= allowed, case
        assert checked <= allowed + WITNESS_LAUNCHES, case
        assert (plain_reads, checked_reads) == (0, 1), case


@pytest.mark.parametrize("witness", [False, True])
def test_verls_call_on_meta_launches_as_on_fake_cuda(witness: bool) -> None:
    """The ``meta`` device (the device path without data), B=1024 M=16: the same bound."""
    for keys in (1, 5):
        allowed = LAUNCHES_PER_CALL + LAUNCHES_PER_KEY * keys + (WITNESS_LAUNCHES if witness else 0)
        assert _meta_launches(1024, 16, keys, witness) <= allowed, keys


def test_the_docs_state_verls_launches() -> None:
    """``docs/witness.md`` states verl's call's launches at B=1024 M=16, plain and witnessed, as traced."""
    from pathlib import Path

    counts = {(w, k): _fake_cuda_launches(1024, 16, k, w)[0] for w in (False, True) for k in (1, 5)}
    text = " ".join((Path(__file__).resolve().parent.parent / "docs" / "witness.md").read_text().split())
    stated = (
        f"{counts[True, 1]} launches for one key and {counts[True, 5]} for five against "
        f"{counts[False, 1]} and {counts[False, 5]} without the witness"
    )
    assert stated in text
