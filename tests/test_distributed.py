"""Real processes on the gloo backend: data-parallel padding, gathering and pipeline broadcast."""

from __future__ import annotations

import socket
import time

import pytest
import torch.multiprocessing as mp

from property_tests import dist_workers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_agree_with_one_process(world: int) -> None:
    """Per-rank results equal the single-process result on each shard; padding micro-batches (the last
    rank has one row) never reach outputs, losses or metrics; gather_batch gives the exact global batch;
    broadcast_from_last_stage gives every rank the last stage's result."""
    mp.spawn(dist_workers.check_rank, args=(world, _free_port()), nprocs=world, join=True)


def test_budget_on_every_rank_and_rank_order_of_every_field() -> None:
    """The count synchronised by MAX is raised until it fits on every rank (rank 0 needs 3 where the MAX
    of the first counts is 2); gather_batch joins outputs, losses and metrics in rank order."""
    mp.spawn(dist_workers.check_budget_and_rank_order, args=(3, _free_port()), nprocs=3, join=True)


@pytest.mark.parametrize("world", [2, 3])
def test_an_error_on_one_rank_reaches_every_rank_at_once(world: int) -> None:
    """Keys, dtypes, shapes or layouts that differ between ranks, a bad result on one rank (in
    gather_batch and broadcast_from_last_stage), a row over budget on one rank (prepare_micro_batches_dp):
    the same error on every rank, naming the rank, within seconds (the group's timeout is 60 s). A
    well-formed misalignment on one rank: the alignment witness raises on that rank alone, the others'
    calls return, and the group still works."""
    start = time.monotonic()
    mp.spawn(dist_workers.ranks_agree_on_errors, args=(world, _free_port()), nprocs=world, join=True)
    assert time.monotonic() - start < 120


def test_a_failing_rank_does_not_leave_the_others_hanging() -> None:
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=dist_workers.raise_on_one_rank, args=(r, 2, port, 5.0)) for r in range(2)]
    start = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=90)
    alive = [p.is_alive() for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not any(alive), "a rank is still waiting after 90 s"
    assert all(p.exitcode != 0 for p in procs)
    assert time.monotonic() - start < 90
