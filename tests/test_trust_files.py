"""The files rebatch writes and reads are untrusted (issue 42, items 1 and 3): dumps loaded under an allowlist
of globals, one dump format for every trainer, private writes renamed into place (no symlink followed, no
temporary file shared by two writes), report and dump names that hold a run id and the pid, directories
resolved once and carried absolute, and a forked child that writes its own report.

Every reproduction here fails on b383f49 (``weights_only=False``, one ``.tmp`` name a process,
``rebatch-TRAINER-HOST-PID`` names, directories resolved at each write)."""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import re
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

import rebatch_startup
from property_tests.data import jagged
from rebatch import check
from rebatch.cli import main
from rebatch_startup import _names
from ref._torch_private import mark_dynamic
from torch_impl.integrations import _files, areal, skyrl, verl
from torch_impl.integrations._shadow import Shadow

ROOT = Path(__file__).resolve().parent.parent

# -- a step of each trainer --------------------------------------------------------------------------


def _verl_step(indices: Any = ((2, 0), (1, 3))) -> tuple[list[Any], list[list[int]], TensorDict]:
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
    data = TensorDict({"input_ids": jagged(torch.arange(9), [3, 1, 2, 3])}, batch_size=[4])
    data["use_dynamic_bsz"] = NonTensorData(True)
    return outs, [list(p) for p in indices], data


def _mb_list(forward: list[int]) -> Any:
    backward = [0] * len(forward)
    for k, i in enumerate(forward):
        backward[i] = k
    return types.SimpleNamespace(forward_indices=forward, backward_indices=backward)


FORWARD, SEQLENS = [4, 0, 3, 2, 1], [2, 1, 0, 3, 2]


def _areal_outputs() -> list[torch.Tensor]:
    return [torch.arange(4.0), torch.arange(4.0) + 10]  # rows 4, 0 (2 + 2 values); rows 3, 2, 1 (3 + 0 + 1)


class _Batch(dict):  # type: ignore[type-arg]
    metadata: Any = None


class _Iterator:
    def __init__(self, microbatches: list[list[int]]) -> None:
        self._microbatches = microbatches
        self._num_padding_microbatches = 0
        self._token_counts = [1] * sum(len(p) for p in microbatches)
        self.data = types.SimpleNamespace(batch_size=len(self._token_counts))


def _skyrl_batches(microbatches: list[list[int]]) -> list[_Batch]:
    out = []
    for m, part in enumerate(microbatches):
        b = _Batch({"output": torch.tensor([float(i) for i in part]), "none": None})
        b.metadata = {"m": m}
        out.append(b)
    return out


# -- dumps: nothing of a hostile file runs -----------------------------------------------------------


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_a_dump_whose_pickle_runs_code_is_refused_before_anything_runs(
    tmp_path: Path, capsys, how: str
) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    payload = ([_Payload(marker)], [[0]], None)
    if how == "torch.save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))
    assert main(["check", "--dump", str(path)]) == 2
    err = capsys.readouterr().err
    assert not marker.exists(), "the dump's code ran"
    assert "Traceback" not in err
    if how == "torch.save":
        assert re.search(r"refused: the dump names the global (posix|os)\.system", err), err
    else:
        assert "not a torch.save archive" in err


def test_a_refused_global_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "d.pt"
    torch.save({"x": collections.Counter}, path)  # a class outside the allowlist (no code runs to save it)
    with pytest.raises(check.UnsafeDumpError, match=r"the dump names the global collections\.Counter"):
        check._load_dump(str(path))
    assert check.run_check(str(path), None, True, out=io.StringIO()) == 2


def test_the_allowlist_is_exactly_what_real_steps_of_every_trainer_hold(tmp_path: Path) -> None:
    """verl's step (a TensorDict with jagged tensors, non-tensor data and a non-tensor stack), AReaL's and
    SkyRL's, saved through the one writer: the globals they name are the allowlist (``builtins.set`` is
    ``__builtin__.set``'s name under another pickle protocol)."""
    outs, indices, data = _verl_step()
    data["uid"] = NonTensorStack("a", "b", "c", "d")
    data["nested"] = TensorDict({"m": torch.ones(4, 2, dtype=torch.bfloat16)}, batch_size=[4])
    marked = torch.zeros(4, 3)
    mark_dynamic(marked, 0, min=2, max=64)  # as verl's engine marks its inputs
    data["marked"] = marked
    named: set[str] = set()
    verl.INTEGRATION.dump("postprocess_batch_func", str(tmp_path / "v.pt"), outs, indices, data)
    mb = _mb_list(FORWARD)
    mb.mbs = [
        {"cu_seqlens": torch.tensor([0, 2, 3], dtype=torch.int32)},
        {"cu_seqlens": torch.tensor([0, 0, 3, 5])},
    ]
    areal.INTEGRATION.dump("reorder_and_pad_outputs", str(tmp_path / "a.pt"), _areal_outputs(), SEQLENS, mb)
    skyrl.INTEGRATION.dump(
        "reorder_and_combine_batches",
        str(tmp_path / "s.pt"),
        _Iterator([[1], [0]]),
        _skyrl_batches([[1], [0]]),
    )
    for name in ("v.pt", "a.pt", "s.pt"):
        named |= {g for g in check._globals_named(str(tmp_path / name)) if not check._STORAGE.fullmatch(g)}
    assert named <= check.DUMP_GLOBALS
    assert check.DUMP_GLOBALS - named == {"builtins.set"}


def test_every_trainers_dump_has_one_format_and_is_checked(tmp_path: Path, capsys) -> None:
    outs, indices, data = _verl_step()
    verl.INTEGRATION.dump("postprocess_batch_func", str(tmp_path / "v.pt"), outs, indices, data)
    mb = _mb_list(FORWARD)
    areal.INTEGRATION.dump("reorder_and_pad_outputs", str(tmp_path / "a.pt"), _areal_outputs(), SEQLENS, mb)
    bad = _mb_list(FORWARD)
    bad.forward_indices = [4, 0, 3, 3, 1]  # a duplicate: AReaL misaligns it silently
    areal.INTEGRATION.dump(
        "reorder_and_pad_outputs", str(tmp_path / "a-bad.pt"), _areal_outputs(), SEQLENS, bad
    )
    it = _Iterator([[3, 0], [2], [1, 4]])
    skyrl.INTEGRATION.dump(
        "reorder_and_combine_batches", str(tmp_path / "s.pt"), it, _skyrl_batches(it._microbatches)
    )
    bad_it = _Iterator([[3, 0], [2], [1, 3]])  # a duplicate, row 4 missing
    bad_it._token_counts = [1] * 5
    skyrl.INTEGRATION.dump(
        "reorder_and_combine_batches",
        str(tmp_path / "s-bad.pt"),
        bad_it,
        _skyrl_batches([[3, 0], [2], [1, 3]]),
    )
    for name, trainer in (("v.pt", "verl"), ("a.pt", "areal"), ("s.pt", "skyrl")):
        saved = check._safe_load(str(tmp_path / name))
        assert set(saved) == {"format", "trainer", "trainer_version", "function", "inputs"}
        assert (saved["format"], saved["trainer"]) == (_files.DUMP_FORMAT, trainer)
        assert saved["function"].startswith(f"{trainer}.")
        assert main(["check", "--dump", str(tmp_path / name)]) == 0, capsys.readouterr()
    capsys.readouterr()
    for name in ("a-bad.pt", "s-bad.pt"):
        assert main(["check", "--dump", str(tmp_path / name), "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["agree"] is False
        assert report["rejected"].startswith("NotAPermutationError"), report


def test_an_old_verl_tuple_dump_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    torch.save(_verl_step(), path)
    assert main(["check", "--dump", str(path)]) == 0


def test_verls_enum_pad_mode_is_saved_as_its_value(tmp_path: Path) -> None:
    import enum

    class PadMode(str, enum.Enum):  # verl's DatasetPadMode is a str Enum of its own module
        NO_PADDING = "no_padding"

    outs, indices, data = _verl_step()
    data["pad_mode"] = NonTensorData(PadMode.NO_PADDING)
    verl.INTEGRATION.dump("postprocess_batch_func", str(tmp_path / "v.pt"), outs, indices, data)
    assert main(["check", "--dump", str(tmp_path / "v.pt")]) == 0
    assert isinstance(data["pad_mode"], PadMode)  # the caller's data untouched


# -- the private writer -------------------------------------------------------------------------------


def test_a_dump_is_private_whole_and_replaces_a_symlink_at_its_name_not_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("precious")
    link = tmp_path / "d.pt"
    link.symlink_to(target)
    outs, indices, data = _verl_step()
    verl.INTEGRATION.dump("postprocess_batch_func", str(link), outs, indices, data)
    assert target.read_text() == "precious"
    assert not link.is_symlink()
    assert link.is_file()
    assert link.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.pt", "target"]  # no temporary file left


def test_a_symlink_planted_at_the_temporary_name_is_refused(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "target"
    target.write_text("precious")
    monkeypatch.setattr(_files.secrets, "token_hex", lambda n: "f" * (2 * n))
    (tmp_path / f".d.pt.{'f' * 16}.tmp").symlink_to(target)
    outs, indices, data = _verl_step()
    with pytest.raises(FileExistsError):
        verl.INTEGRATION.dump("postprocess_batch_func", str(tmp_path / "d.pt"), outs, indices, data)
    assert target.read_text() == "precious"
    assert not (tmp_path / "d.pt").exists()


def test_a_shadow_report_never_writes_through_a_symlink(tmp_path: Path) -> None:
    """b383f49 wrote ``REPORT.PID.tmp`` with ``open(..., "w")``, following a link planted there."""
    target = tmp_path / "target"
    target.write_text("precious")
    report = tmp_path / "r.json"
    (tmp_path / f"r.json.{os.getpid()}.tmp").symlink_to(target)  # the name b383f49 used
    report.symlink_to(target)
    shadow = Shadow(1.0, "log", str(report))
    shadow.wrap("f", lambda: 1, lambda: 1)()
    assert target.read_text() == "precious"
    assert json.loads(report.read_text())["calls"] == 1
    assert not report.is_symlink()


def test_eight_threads_writing_one_report_never_collide(tmp_path: Path) -> None:
    """b383f49: one temporary name a process; threads replaced each other's file (spurious errors counted,
    invalid JSON read at the final name)."""
    report = tmp_path / "r.json"
    shadow = Shadow(1.0, "log", str(report))  # every call sampled: every call rewrites the report
    wrapped = shadow.wrap("f", lambda: 1, lambda: 1)
    stop = threading.Event()
    bad: list[str] = []

    def read() -> None:
        while not stop.is_set():
            try:
                json.loads(report.read_text())
            except FileNotFoundError:
                pass
            except ValueError as err:
                bad.append(str(err))

    def call() -> None:
        for _ in range(150):
            wrapped()

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    reader.join()
    s = shadow.stats()
    assert (s["calls"], s["errors"]) == (1200, 0), s["messages"][:3]
    assert not bad
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


# -- names, directories, forks ------------------------------------------------------------------------


def test_names_hold_the_run_id_and_the_pid_and_match_what_rebatch_report_reads(tmp_path: Path) -> None:
    name = Path(rebatch_startup.process_file(str(tmp_path), "rebatch", "areal", "json")).name
    assert _names.REPORT_NAME.fullmatch(name), name
    assert name.endswith(f"-{_names.run_id()}-{os.getpid()}.json")
    code = "import rebatch_startup._names as n; print(n.run_id())"
    runs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(runs) == 2, runs
    assert all(re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", r) for r in runs), runs


def test_relative_directories_are_resolved_once_and_carried_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REBATCH", "shadow")
    monkeypatch.setenv("REBATCH_REPORT_DIR", "reports")
    monkeypatch.setenv("REBATCH_DUMP_DIR", "dumps")
    monkeypatch.setattr(rebatch_startup, "_resolved", {}, raising=False)  # resolved afresh in this test
    setting = rebatch_startup.parse("shadow")
    assert setting is not None
    kwargs = rebatch_startup.install_kwargs("areal", setting)
    assert Path(str(kwargs["report"])).parent == tmp_path / "reports"
    assert Path(str(kwargs["dump"])).parent == tmp_path / "dumps"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a process that changes directory after activation
    carried = rebatch_startup.carried()
    assert carried["REBATCH_REPORT_DIR"] == str(tmp_path / "reports")
    assert carried["REBATCH_DUMP_DIR"] == str(tmp_path / "dumps")
    shadow = Shadow(1.0, "log", str(kwargs["report"]))
    shadow.wrap("f", lambda: 1, lambda: 1)()
    assert json.loads(Path(str(kwargs["report"])).read_text())["calls"] == 1


FORK = """
import json, os, sys
from pathlib import Path
import rebatch_startup
from torch_impl.integrations._shadow import Shadow

where = Path(sys.argv[1])
report = rebatch_startup.process_file(str(where), "rebatch", "verl", "json")
shadow = Shadow(1.0, "log", report)
wrapped = shadow.wrap("f", lambda: 1, lambda: 1)
wrapped()
pid = os.fork()
if pid == 0:  # the child
    code = 1
    try:
        wrapped()
        wrapped()
        code = 0
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
print(json.dumps({"status": os.waitstatus_to_exitcode(status), "child": pid, "report": report}))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_writes_its_own_report_and_counts_its_own_calls(tmp_path: Path) -> None:
    """In a fresh interpreter (no JAX threads to warn about): the parent counts one call, its forked child
    two; each writes its own file (b383f49: the child rewrote its parent's report)."""
    done = subprocess.run(
        [sys.executable, "-c", FORK, str(tmp_path)], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout)
    assert facts["status"] == 0
    report, pid = Path(facts["report"]), facts["child"]
    mine = json.loads(report.read_text())
    assert (mine["calls"], mine["process"]["pid"]) == (1, done_pid(report))
    (child,) = [p for p in tmp_path.iterdir() if p.name != report.name]
    assert _names.REPORT_NAME.fullmatch(child.name), child.name
    assert child.name.endswith(f"-{pid}.json"), child.name
    run = report.stem.rsplit("-", 3)[1:3]  # the parent's run id: its time and random part
    assert "-".join(run) not in child.name  # the child's own run id
    theirs = json.loads(child.read_text())
    assert (theirs["calls"], theirs["process"]["pid"]) == (2, pid)


def done_pid(report: Path) -> int:
    """The pid a report's name ends with."""
    return int(report.stem.rsplit("-", 1)[1])
