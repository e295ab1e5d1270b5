"""The ``rebatch`` command: exit codes, report contents, dumps (round trip, corrupted, misordering
candidate)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
from tensordict import NonTensorData, TensorDict

from property_tests.data import jagged
from rebatch.bench import BENCHMARKS
from rebatch.cli import main


def _dump(path: Path, indices=((2, 0), (1, 3))) -> Path:
    outs = [
        {
            "model_output": {"lp": jagged(torch.arange(5.0), [2, 3]), "v": torch.tensor([1.0, 2.0])},
            "loss": 0.5,
        },
        {
            "model_output": {"lp": jagged(torch.arange(5.0, 9.0), [1, 3]), "v": torch.tensor([3.0, 4.0])},
            "loss": 0.25,
        },
    ]
    data = TensorDict({}, batch_size=[])
    data["use_dynamic_bsz"] = NonTensorData(True)
    torch.save((outs, [list(p) for p in indices], data), path)
    return path


def test_check_default_reports_agreement(capsys) -> None:
    assert main(["check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["agree"] is True
    assert report["rows"] == 2048
    assert report["micro_batches"] > 1
    assert set(report["keys"]) == {"log_probs", "entropy", "top_k_log_probs", "values"}
    assert report["keys"]["entropy"]["dtype"] == "bfloat16"
    assert all(k["vs_original_rows"]["agree"] and k["vs_ref"]["agree"] for k in report["keys"].values())
    assert report["seconds"]["torch_impl"] > 0
    assert set(report["provenance"]) == {"grpo", "fixed_length"}
    for rates in report[
        "provenance"
    ].values():  # exact provenance: every misalignment caught, whatever the lengths
        for c in rates.values():
            assert c["caught"] == c["trials"] > 0, rates


def test_dump_round_trip(tmp_path, capsys) -> None:
    assert main(["check", "--dump", str(_dump(tmp_path / "d.pt"))]) == 0
    out = capsys.readouterr().out
    assert "lp" in out
    assert "all identical" in out


def test_dump_with_the_verl_baseline_as_candidate(tmp_path, capsys) -> None:
    path = _dump(tmp_path / "d.pt")
    outs, indices, data = torch.load(path, weights_only=False)
    for o in outs:
        del o["model_output"]["v"]  # verl cannot take dense outputs
    torch.save((outs, indices, data), path)
    assert (
        main(
            [
                "check",
                "--dump",
                str(path),
                "--candidate",
                "property_tests.baseline:verl_postprocess_batch_func",
            ]
        )
        == 0
    )
    assert "candidate: identical" in capsys.readouterr().out


def test_candidate_that_swaps_rows_is_named(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "swapper.py").write_text(
        textwrap.dedent("""
        import torch, torch_impl
        def postprocess(output_lst, indices, data):
            res = torch_impl.postprocess_batch_func(output_lst, indices, data)
            lp = res["model_output"]["lp"]
            res["model_output"]["lp"] = torch_impl.take(lp, [0, 2, 1, 3])  # rows 1 and 2 swapped
            return res
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["check", "--dump", str(_dump(tmp_path / "d.pt")), "--candidate", "swapper:postprocess"])
    out = capsys.readouterr().out
    assert code == 1
    assert "MISMATCH" in out
    assert "key 'lp' first differs at original row 1" in out
    assert "differing original rows: 1, 2)" in out


def test_corrupted_dump_is_a_clear_error(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    assert main(["check", "--dump", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err
    assert "Traceback" not in err


def test_dump_of_the_wrong_shape(tmp_path, capsys) -> None:
    path = tmp_path / "two.pt"
    torch.save(([], []), path)
    assert main(["check", "--dump", str(path)]) == 2
    assert "must hold (output_lst, indices, data), got a tuple of length 2" in capsys.readouterr().err


def test_missing_dump_and_bad_candidate(tmp_path, capsys) -> None:
    assert main(["check", "--dump", str(tmp_path / "none.pt")]) == 2
    assert main(["check", "--dump", str(_dump(tmp_path / "d.pt")), "--candidate", "nomodule"]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err
    assert "module:function" in err


def test_dump_with_corrupt_indices_is_rejected(tmp_path, capsys) -> None:
    assert main(["check", "--dump", str(_dump(tmp_path / "d.pt", indices=((2, 0), (1, 2))))]) == 1
    assert "NotAPermutationError" in capsys.readouterr().out


@pytest.mark.parametrize("command", [[], ["check"], ["bench"], ["fuzz"]])
def test_help(command, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    assert "usage: rebatch" in capsys.readouterr().out


def test_bench_writes_json_table_and_plot(tmp_path) -> None:
    from rebatch.bench.run import run_bench

    assert run_bench(grid_name="smoke", out=str(tmp_path)) == 0
    results = json.loads((tmp_path / "benchmarks.json").read_text())
    assert len(results["rows"]) == 2
    assert all(r["seconds"]["torch_impl"] > 0 for r in results["rows"])
    assert "| B | mean len |" in (tmp_path / "benchmarks.md").read_text()
    assert (tmp_path / "benchmarks.png").read_bytes()[:4] == b"\x89PNG"


def test_fuzz_entry_point(tmp_path, monkeypatch, capsys) -> None:
    from property_tests.fuzz import main as fuzz_main

    monkeypatch.setenv("REBATCH_FUZZ_DB", str(tmp_path / "db"))
    assert fuzz_main(["--minutes", "0.02", "--property", "inverse_is_an_involution"]) == 0
    out = capsys.readouterr().out
    assert "inverse_is_an_involution" in out
    assert "examples/s" in out


def test_fuzz_runs_a_state_machine(tmp_path, monkeypatch, capsys) -> None:
    from property_tests import fuzz

    monkeypatch.setenv("REBATCH_FUZZ_DB", str(tmp_path / "db"))
    monkeypatch.setattr(fuzz, "MACHINE_ROUND", 1)
    monkeypatch.setattr(fuzz, "MACHINE_STEPS", 3)
    assert fuzz.main(["--minutes", "0.001", "--machine", "provenance"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"ok   the provenance state machine: [1-9]\d* runs of up to 3 steps", out), out


def test_bench_help_lists_every_benchmark(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for name, bench in BENCHMARKS.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(bench.help)}$", out, re.M), name


def test_bench_unknown_name_exits_2(capsys) -> None:
    assert main(["bench", "no-such-bench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark 'no-such-bench'" in err
    assert "grid, versus" in err


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_bench_name_runs_its_module_with_its_arguments(name, capsys) -> None:
    """``rebatch bench NAME ARGS...`` is ``python -m rebatch.bench.MODULE [fixed args] ARGS...``: each
    module's own parser answers ``--help``."""
    with pytest.raises(SystemExit) as info:
        main(["bench", name, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ")
    assert out == _module_help(BENCHMARKS[name].module, capsys)


def _module_help(module: str, capsys) -> str:
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(f"rebatch.bench.{module}").main(["--help"])
    return capsys.readouterr().out


def test_bench_name_passes_its_arguments_through(monkeypatch) -> None:
    """The rest of the command line goes to the module's ``main``, after the table's fixed arguments."""
    from rebatch.bench import versus

    seen: list[list[str]] = []
    monkeypatch.setattr(versus, "main", lambda argv: seen.append(argv) or 0)
    assert main(["bench", "checkcost", "--provenance", "--rounds", "3"]) == 0
    assert main(["bench", "versus", "--commit", "verl"]) == 0
    assert seen == [["--witness", "--provenance", "--rounds", "3"], ["--commit", "verl"]]
