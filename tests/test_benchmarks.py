"""The benchmark harness's own measurements: memory peaks, the alternating timer, the targets summary."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from rebatch.bench.cases import LARGE_ELEMENTS, grid
from rebatch.bench.memory import peak_tensor_bytes
from rebatch.bench.run import median_times
from rebatch.bench.tables import grid_targets as targets, memory_allowance


def test_peak_tensor_bytes_counts_what_was_alive_at_once() -> None:
    def work() -> torch.Tensor:
        kept = torch.empty(1000, dtype=torch.float32)  # 4,000 bytes, returned
        scratch = torch.empty(3000, dtype=torch.int64)  # 24,000 bytes, freed before the end
        del scratch
        more = torch.empty(500, dtype=torch.int64)  # 4,000 bytes, freed: after the peak
        del more
        return kept

    assert peak_tensor_bytes(work) == 28_000


def test_alternating_timer_runs_each_function_equally_often() -> None:
    calls = {"a": 0, "b": 0}

    def bump(name: str):
        return lambda: calls.__setitem__(name, calls[name] + 1)

    seconds = median_times({"a": bump("a"), "b": bump("b")}, "cpu", min_time=0.0)
    assert set(seconds) == {"a", "b"}
    assert calls["a"] == calls["b"] >= 6  # one warm-up, then at least 5 rounds


def test_alternating_timer_shuffles_the_order_of_each_round() -> None:
    """No function always runs right after the same other one: over the rounds, each of three is
    preceded by each of the others."""
    sequence: list[str] = []
    fns = {name: (lambda name=name: sequence.append(name)) for name in "abc"}
    median_times(fns, "cpu", min_time=0.0, min_rounds=12, max_rounds=12)
    rounds = [sequence[i : i + 3] for i in range(3, len(sequence), 3)]  # after the warm-up calls
    assert len(rounds) == 12
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    followed = {(x, y) for r in rounds for x, y in itertools.pairwise(r)}
    assert followed == {(x, y) for x in "abc" for y in "abc" if x != y}


def _row(name: str, **values) -> dict:
    case = {"rows": 16384, "mean_length": 4096, "micro_batches": 16, "keys": 1, "dtype": "float32", "ndim": 2}
    row = {
        "name": name,
        "case": case,
        "output_bytes": 256 * 2**20,
        "output_elements": 64 * 2**20,
        "speedup_vs_baseline": 6.0,
        "ratio_to_copy_limit": 1.2,
        "peak_extra_bytes": {"torch_impl": 256 * 2**20},
        "peak_extra_over_output": 1.0,
    }
    row.update(values)
    return row


def test_targets_report_met_and_missed_with_the_offending_cases() -> None:
    good = _row("good")
    slow = _row("slow", ratio_to_copy_limit=1.7)
    fat = _row("fat", peak_extra_bytes={"torch_impl": 400 * 2**20}, peak_extra_over_output=400 / 256)
    text = "\n".join(targets({"rows": [good]}))
    assert "**missed**" not in text
    assert text.count("**met**") == 3
    text = "\n".join(targets({"rows": [good, slow, fat]}))
    assert "worst 1.70x, **missed** (over 1.5x: slow: 1.70x)" in text
    assert "**missed** (over: fat: 400.0 MiB for 256.0 MiB)" in text


def test_memory_allowance_is_1_2x_the_output_plus_order_b() -> None:
    small = _row("x", output_bytes=0)
    assert memory_allowance(small) == 128 * 16384 + 2**20
    assert memory_allowance(_row("y")) == 1.2 * 256 * 2**20 + 128 * 16384 + 2**20


def test_large_grid_is_the_full_grid_at_64m_elements_and_more() -> None:
    large = grid("large")
    assert large
    assert all(c.elements >= LARGE_ELEMENTS and c.micro_batches == 16 for c in large)
    assert {c for c in grid("full") if c.elements >= LARGE_ELEMENTS and c.micro_batches == 16} == set(large)


def test_restore_side_by_side_row_on_a_tiny_size() -> None:
    """The harness's jit(ref.restore) against torch_impl.restore row runs and checks bit-equality (a
    tiny size: the ratio itself is measured only by the benchmark run)."""
    from rebatch.bench.run import restore_side_by_side
    from rebatch.bench.tables import restore_table

    row = restore_side_by_side(64, 4096, 4)
    assert set(row["seconds"]) == {"torch_impl_restore", "jax_ref_restore_jit"}
    assert row["jit_over_torch"] > 0
    assert "jit(ref.restore)" in "\n".join(restore_table(row))


def test_busy_processes_are_started_and_stopped() -> None:
    from rebatch.bench.contention import busy_processes

    with busy_processes(2) as procs:
        assert len(procs) == 2
        assert all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)


def test_contended_run_writes_quiet_and_contended_ratios_side_by_side(tmp_path) -> None:
    import json

    from rebatch import figures
    from rebatch.bench.run import run_bench

    assert run_bench(grid_name="smoke", out=str(tmp_path), with_jax=False, contended=True) == 0
    results = json.loads((tmp_path / "benchmarks.json").read_text())
    assert all("contended" in r and r["contended"]["busy_processes"] >= 1 for r in results["rows"])
    text = (tmp_path / "benchmarks.md").read_text()  # docs/benchmarks.md, its regions of this run filled

    def region(name: str) -> str:
        return "".join(text[a:b] for a, b in figures.spans(text, name))

    assert "speed-up vs baseline (quiet / contended)" in region("benchmarks-grid")
    assert f"`{results['grid']}`" in region("benchmarks-run")
    assert region("benchmarks-busy") == str(results["busy_processes"])
    assert "with one busy process per core" in text
    assert "## Launches: operations per call on the device path" in text
    assert results["verl"] in ("importable", "absent")
    if results["verl"] == "absent":
        targets = region("benchmarks-targets")
        assert "verl was not importable in this run" in targets or "B=1024" not in targets


def test_launch_table_script_runs_on_a_tiny_grid(capsys) -> None:
    """`python -m rebatch.bench.launches` on two sizes: one Markdown row per (B, M, keys), the operations
    a constant of M and B (the device path's launch bound), the model's constants stated."""
    from rebatch.bench.launches import BANDWIDTH, LAUNCH_SECONDS, launch_rows, main

    assert main(["--rows", "8", "64", "--micro-batches", "2", "4", "--keys", "1", "2"]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 2 * 2 * 2
    assert "5 µs" in text
    assert "4.8 TB/s" in text
    assert "verl's own function is not in this table" in text
    table = launch_rows([8, 64], [2, 4], [1, 2])
    assert len({r["ops"] for r in table if r["keys"] == 1}) == 1
    assert all(r["modelled_seconds"] == r["ops"] * LAUNCH_SECONDS + r["bytes"] / BANDWIDTH for r in table)
    assert all(r["bytes"] > 0 for r in table)


def test_crossover_times_every_registered_kernel_that_serves_a_case(capsys) -> None:
    """`kernels_side_by_side` times the default choice and every permuting kernel of the registry that
    serves the case's layout; `chunk_sizes` every chunked kernel at each size; nothing timed against a
    bound."""
    import torch_impl
    from rebatch.bench.crossover import chunk_sizes, kernels_side_by_side, main

    rows = kernels_side_by_side(["dense"], min_time=0.0)
    dense = {k.name for k in torch_impl.KERNELS.values() if k.permutes and "dense" in k.layouts}
    assert all(set(r["seconds"]) == {"default"} | dense and min(r["seconds"].values()) > 0 for r in rows)
    chunked = chunk_sizes([64], min_time=0.0)
    assert {r["case"] for r in chunked} == {f"{k.name} 64" for k in torch_impl.KERNELS.values() if k.chunked}
    assert main(["--chunks", "--values", "128", "--min-time", "0"]) == 0
    assert "host_scatter 128" in capsys.readouterr().out


def test_cuda_check_dry_run_passes_on_the_cpu(capsys) -> None:
    from rebatch.bench.cuda_check import main

    assert main(["--dry-run"]) == 0
    assert "passed: 0 failure(s) on cpu" in capsys.readouterr().out


def test_versus_runs_both_commits_side_by_side_on_a_tiny_grid() -> None:
    """`rebatch.bench.versus` end to end on one tiny case against this checkout's own HEAD (a worker
    process each, results checked bit-equal first), quiet and contended: every column filled, the
    targets summarised. Nothing is timed against a bound."""
    from rebatch.bench.cases import Case
    from rebatch.bench.versus import markdown, versus

    results = versus([Case(8, 16, 4, 1, "float32", 2)], "HEAD", contended=True, rounds=1, min_time=0.0)
    (row,) = results["rows"]
    for column in ("quiet", "contended"):
        s = row[column]
        assert set(s) == {"baseline", "today", "clone", "speedup", "vs_clone"} | {
            f"{name}_first" for name in ("baseline", "today", "clone")
        }
        assert all(v > 0 for v in s.values())
        # one round: the paired ratios are that round's, the ratios of the calls' medians
        assert s["speedup"] == pytest.approx(s["baseline"] / s["today"])
        assert s["vs_clone"] == pytest.approx(s["today"] / s["clone"])
    text = "\n".join(markdown(results))
    assert "| B=8 L=16 M=4 keys=1 float32 2-D |" in text
    assert "Fixed cost at B=8, L=16, M=4" in text
    assert "a turn's first call, just after the other worker's turn" in text


class _FakeWorker:
    """A worker whose calls take ``cost`` seconds each, the first of a turn ``cold``; records each turn's
    number of calls and the core it was asked to run on."""

    def __init__(self, cost: float, cold: float) -> None:
        self.cost, self.cold, self.turns, self.cores = cost, cold, [], []

    def ask(self, cmd: str, fn: str, n: int, core: int | None = None) -> dict:
        self.turns.append(n)
        self.cores.append(core)
        return {"times": [self.cold] + [self.cost] * (n - 1)}


def test_versus_turns_last_about_20_ms_for_each_function_by_its_own_cost() -> None:
    """A cheap function gets as many calls a turn as last 20 ms (at most 50), not the dear one's count:
    otherwise its median would be of cold calls."""
    from rebatch.bench.versus import _medians

    base, today, clone = _FakeWorker(0.002, 0.004), _FakeWorker(0.0003, 0.001), _FakeWorker(0.01, 0.01)
    workers = {"baseline": (base, "impl"), "today": (today, "impl"), "clone": (clone, "clone")}
    s = _medians(workers, {"baseline": 0.002, "today": 0.0003}, min_time=0.0, rounds=3, seed=0)
    assert base.turns == [1, 10, 10, 10]  # a warm-up turn, then 20 ms turns
    assert today.turns == [1, 50, 50, 50]  # 66 would last 20 ms: capped at 50
    assert clone.turns == [1, 2, 2, 2]  # priced by its warm-up call
    # the median is warm; the first call is kept apart
    assert (s["today"], s["today_first"]) == (0.0003, 0.001)
    assert (s["baseline"], s["baseline_first"]) == (0.002, 0.004)
    assert s["speedup"] == pytest.approx(0.002 / 0.0003)


def test_versus_runs_every_turn_of_a_round_on_one_core_and_the_rounds_take_the_cores_in_turn() -> None:
    """A core slower than the other for a while weighs on both implementations alike: within a round
    every function's turn is asked for the same core, the next round for the next core; the warm-up
    turn, and every turn where no cores are given, is not pinned."""
    from rebatch.bench.versus import _medians

    fakes = [_FakeWorker(0.002, 0.002) for _ in range(3)]
    workers = dict(zip(("baseline", "today", "clone"), ((w, "impl") for w in fakes), strict=True))
    _medians(workers, {}, min_time=0.0, rounds=5, seed=0, cores=[3, 7])
    for w in fakes:
        assert w.cores == [None, 3, 7, 3, 7, 3]
    unpinned = _FakeWorker(0.002, 0.002)
    _medians({"today": (unpinned, "impl")}, {}, min_time=0.0, rounds=2, seed=0)
    assert unpinned.cores == [None, None, None]


def test_on_core_pins_the_calling_thread_alone_and_gives_its_cores_back() -> None:
    """`rebatch.bench.contention.on_core`: the calling thread runs on the one core within the block, a
    thread started before keeps its cores, and the calling thread's own come back after."""
    import threading

    from rebatch.bench.contention import cores, on_core

    if not hasattr(os, "sched_setaffinity") or not cores():
        pytest.skip("this platform cannot pin a thread")
    seen: list[set[int]] = []
    go, done = threading.Event(), threading.Event()

    def other() -> None:
        go.wait()
        seen.append(os.sched_getaffinity(0))
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    before = os.sched_getaffinity(0)
    core = cores()[-1]
    with on_core(core):
        assert os.sched_getaffinity(0) == {core}
        go.set()
        done.wait(10)
    thread.join(10)
    assert seen == [before]
    assert os.sched_getaffinity(0) == before
    with on_core(None):
        assert os.sched_getaffinity(0) == before


def test_baseline_extracts_are_whole_when_processes_extract_the_same_commit_at_once(
    tmp_path, monkeypatch
) -> None:
    """CI's test lanes run side by side in one checkout: every caller gets the whole extract, and no
    scratch folder is left behind."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from rebatch.bench import workers

    repo = tmp_path / "repo"
    files = {
        f"{pkg}/m{i}.py": f"X = {i}\n" * 2000
        for pkg in ("ref", "torch_impl", "property_tests")
        for i in range(40)
    }
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    monkeypatch.setattr(workers, "ROOT", repo)

    def extract(_: int) -> list[str]:
        folder = workers.baseline_root("HEAD")
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.py"))

    with ThreadPoolExecutor(8) as pool:
        seen = list(pool.map(extract, range(8)))
    assert all(s == sorted(files) for s in seen)
    for name, text in files.items():
        assert (workers.baseline_root("HEAD") / name).read_text() == text
    assert [p.name for p in (repo / ".cache").iterdir()] == [workers.baseline_root("HEAD").name]


def test_a_versus_run_fills_its_regions_of_the_page() -> None:
    """A side-by-side run's JSON fills docs/benchmarks.md's regions of it through `rebatch.figures` (the
    page's prose, and the other runs' regions, as they were)."""
    from rebatch import figures

    results = {
        "commit": "abc",
        "today": "def",
        "torch": "2.13",
        "date": "today",
        "busy_processes": 3,
        "pinned": [0, 1, 2],
        "rows": [],
        "command": "cmd",
    }
    page = (figures.ROOT / "docs/benchmarks.md").read_text()
    text = figures.fill(
        page, "docs/benchmarks.md", figures.loader(figures.ROOT, {"docs/versus.json": results})
    )
    assert (
        "Command: <!-- versus-run -->`cmd` (today, torch 2.13, CPU; today is def)<!-- /versus-run -->."
        in text
    )
    assert "the cores <!-- versus-pinned -->[0, 1, 2]<!-- /versus-pinned --> in turn" in text
    assert "(<!-- versus-busy -->3<!-- /versus-busy --> here)" in text
    assert "<!-- versus: rendered by python -m rebatch.figures from docs/versus.json -->\n|" in text
    assert "B=16384 L=16 M=16 keys=1 float32 2-D | 444 |" not in text  # the run's table, empty here
    assert text.split("<!-- versus-run -->")[0] == page.split("<!-- versus-run -->")[0]
    after = "<!-- copy-limit: "
    assert text[text.index(after) :] == page[page.index(after) :]


def test_the_targets_against_verl_are_judged_by_their_least_figure() -> None:
    """`verl_target_lines`: each target met or missed by the least of its figures, the small call by
    `SMALL_CALL_SECONDS`, cases not measured left out; nothing timed."""
    from rebatch.bench.cases import SMALL_CALL_SECONDS, TARGETS_VS_VERL, verl_target_lines

    small, *rest = TARGETS_VS_VERL
    lines = verl_target_lines(
        "verl", {small: "quiet 3.20x, contended 2.90x", rest[-1]: "50.0x"}, 0.9 * SMALL_CALL_SECONDS
    )
    assert len(lines) == 3
    assert lines[0].endswith("quiet 3.20x, contended 2.90x, **missed**.")  # 2.9 < 3
    assert lines[1].endswith("50.0x, **met**.")
    assert lines[2].endswith("**met**.")
    assert "small call" in lines[2]
    assert verl_target_lines("verl", {}, SMALL_CALL_SECONDS)[0].endswith("**missed**.")


def test_checks_cost_runs_the_provenance_pairs_end_to_end_on_the_small_call() -> None:
    """`rebatch.bench.checkcost` end to end (one worker, one round): the provenanced call's result is
    checked bit-equal to the plain call's first, each pair of calls alternated and timed, the null pair
    beside; every figure filled and the targets judged. Nothing is timed against a bound."""
    from rebatch.bench.cases import Case
    from rebatch.bench.checkcost import checks_cost, checks_markdown, targets

    results = checks_cost([Case(8, 16, 4, 1, "float32", 2)], rounds=1, provenance=True)
    (row,) = results["rows"]
    assert results["check"] == "provenance"
    for figures in (row["check"], row["null"]):
        assert set(figures) == {"without", "with", "ratio", "cost_ms", "pairs"}
        assert figures["without"] > 0
        assert figures["with"] > 0
        assert figures["ratio"] > 0
        assert figures["pairs"] >= 1
    assert set(targets(results)) == {"B=8 L=16 M=4 keys=1 float32 2-D"}
    assert "| B=8 L=16 M=4 keys=1 float32 2-D |" in "\n".join(checks_markdown(results))


def test_checks_cost_figures_are_the_medians_of_each_pairs_ratio_and_difference() -> None:
    """The figures of a run of pairs: each call's median, and the medians of the per-pair ratios and
    differences (a slow phase moves both calls of a pair, so it cancels out of both), each target judged
    by each of its bounds."""
    from rebatch.bench.checkcost import TARGETS, checks_markdown, paired, targets

    pairs = [(0.001, 0.0011), (0.002, 0.0021), (0.004, 0.0041)]
    got = paired(pairs)
    assert got["without"] == pytest.approx(2.0)
    assert got["with"] == pytest.approx(2.1)
    assert got["ratio"] == pytest.approx(1.05)
    assert got["cost_ms"] == pytest.approx(0.1)
    small, large = TARGETS["provenance"]
    row = {"check": {"without": 0.3, "with": 0.305, "ratio": 1.016, "cost_ms": 0.005, "pairs": 9}}
    row["null"] = row["check"]
    results = {
        "check": "provenance",
        "rows": [{**row, "name": small}, {**row, "name": large, "check": {**row["check"], "cost_ms": 0.021}}],
    }
    assert targets(results) == {small: True, large: False}
    text = "\n".join(checks_markdown(results))
    assert "within 0.02 ms and 3%: met" in text
    assert "within 0.02 ms and 3%: NOT met" in text
    witness = {"check": "witness", "rows": [{**row, "name": large, "check": {**row["check"], "ratio": 1.06}}]}
    assert targets(witness) == {large: False}
    assert "within 5%: NOT met" in "\n".join(checks_markdown(witness))


def test_versus_checked_gives_today_data_with_both_checks_and_the_same_result() -> None:
    """``--checked``: today's drop-in given ``data`` with ``input_ids`` recorded by a split (the witness
    and exact provenance checking the call, every output proven) returns the baseline's bytes (the
    harness checks the digests before timing) and the run says it was checked."""
    import torch_impl
    from rebatch.bench.cases import Case
    from rebatch.bench.versus import _inputs, _provenanced_data, versus

    case = Case(8, 16, 4, 1, "float32", 2)
    outs, indices, _ = _inputs(case)
    before = torch_impl.provenance_stats()["calls_proven"]
    torch_impl.postprocess_batch_func(outs, indices, _provenanced_data(case, outs, indices))
    assert torch_impl.provenance_stats()["calls_proven"] == before + 1
    results = versus([case], "HEAD", contended=False, rounds=1, min_time=0.0, checked=True)
    assert results["checked"] is True
    assert results["rows"][0]["quiet"]["today"] > 0


ONCE_CALLS = 3


def test_median_seconds_times_one_function_alone() -> None:
    """`rebatch.bench.timing.median_seconds`: torch.utils.benchmark's median, torch's threads kept as they
    are (the library's own default is 1), a call slower than ``once_over`` timed once."""
    import torch

    from rebatch.bench.timing import median_seconds

    calls: list[int] = []
    threads: list[int] = []

    def fn() -> None:
        calls.append(1)
        threads.append(torch.get_num_threads())

    assert 0 < median_seconds(fn, min_run_time=0.01) < 0.01
    autoranged = len(calls)
    assert set(threads) == {torch.get_num_threads()}
    for once in ({"once_over": 0.0}, {"min_run_time": 0}):
        calls.clear()
        assert median_seconds(fn, **once) > 0
        assert len(calls) <= ONCE_CALLS < autoranged  # the library's two warm-up calls and the timed one
