"""Quiet: a normal call writes nothing to stdout, stderr or the logging system.

Each check runs in a fresh interpreter, because what a library prints once per process (torch's
``is_fx_tracing`` warning, logged the first time ``torch.nested.nested_tensor_from_jagged`` is called)
is printed by whichever call comes first, and the test process has long made that call.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Every record of every logger: a DEBUG handler on the root logger, and ``Logger.handle`` wrapped so the
#: records of loggers that do not propagate (torch's own, which has a handler on stderr) are seen too.
_CAPTURE = """
import json, logging, sys, warnings

RECORDS = []
_handle = logging.Logger.handle

def handle(self, record):
    RECORDS.append({"logger": record.name, "level": record.levelno, "message": record.getMessage()})
    return _handle(self, record)

logging.Logger.handle = handle
root = logging.getLogger()
root.setLevel(logging.DEBUG)
root.addHandler(logging.NullHandler(logging.DEBUG))
REPORT = {}

def call(name, fn):
    before = len(RECORDS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    REPORT[name] = {"records": RECORDS[before:], "warnings": [str(w.message) for w in caught]}
"""

_CALLS = """
import types
import torch
from tensordict import TensorDict
import torch_impl
from torch_impl.integrations import areal
from property_tests.kernels import KERNELS, forced

def jag(lengths, width=None):
    rows = [
        torch.arange(float(n * (width or 1))).reshape(n, width) if width else torch.arange(float(n))
        for n in lengths
    ]
    return torch.nested.nested_tensor(rows, layout=torch.jagged)

parts = [[2, 0], [1]]
x = jag([2, 1, 3])
dense = torch.arange(6.0).reshape(3, 2)
td = TensorDict({"input_ids": jag([2, 1, 3]), "advantages": torch.arange(3.0)}, batch_size=[3])

def outputs():
    return [
        {"model_output": {"lp": jag([2, 1]), "top": jag([2, 1], 2), "v": torch.tensor([1.0, 2.0])},
         "loss": torch.tensor(0.5), "metrics": {"tokens": [3]}},
        {"model_output": {"lp": jag([3]), "top": jag([3], 2), "v": torch.tensor([3.0])},
         "loss": torch.tensor(0.25), "metrics": {"tokens": [3]}},
    ]

FIRST = {
    "postprocess_batch": lambda: torch_impl.postprocess_batch(outputs(), parts),
    "postprocess_batch_func": lambda: torch_impl.postprocess_batch_func(outputs(), parts, None),
    "concat": lambda: torch_impl.concat([x, x]),
    "take": lambda: torch_impl.take(x, [2, 0]),
    "restore": lambda: torch_impl.restore(x, parts),
    "split": lambda: torch_impl.split(x, parts),
    "flatten_partitions": lambda: torch_impl.flatten_partitions(parts, 3),
    "inverse_permutation": lambda: torch_impl.inverse_permutation([2, 0, 1]),
    "prepare_micro_batches": lambda: torch_impl.prepare_micro_batches(td, max_token_len=4),
    "rearrange_micro_batches": lambda: torch_impl.rearrange_micro_batches(td, 4),
    "restore_dynamic_batch": lambda: torch_impl.restore_dynamic_batch(dense, parts),
    "get_seqlen_balanced_partitions": lambda: torch_impl.get_seqlen_balanced_partitions(
        [3, 1, 2, 2], 2, False),
    "append_to_dict": lambda: torch_impl.append_to_dict({}, {"a": 1}),
    "from_packed": lambda: torch_impl.from_packed(torch.arange(3.0), [2, 1]),
    "to_packed": lambda: torch_impl.to_packed(x),
    "to_padded": lambda: torch_impl.to_padded(x),
    "from_padded": lambda: torch_impl.from_padded(torch.zeros(2, 3), [1, 3]),
    "areal.reorder_and_pad_outputs": lambda: areal.reorder_and_pad_outputs(
        [torch.arange(3.0), torch.arange(2.0)], [2, 2, 1],
        types.SimpleNamespace(forward_indices=[2, 0, 1], backward_indices=[1, 2, 0])),
}
for name, fn in FIRST.items():
    call(name, fn)
for path in KERNELS:  # every data-movement path, dense and TensorDict inputs too
    def again(path=path):
        with forced(path):
            torch_impl.postprocess_batch(outputs(), parts)
            torch_impl.restore(dense, parts)
            torch_impl.take(td, [2, 0])
            torch_impl.split(td, parts)
            torch_impl.concat([dense, dense])
    call(f"kernel {path}", again)
"""

#: ``rebatch check`` on a smaller embedded step (the same code, 32 rows), then on a dump.
_CHECK = """
import functools, io
import torch
from tensordict import NonTensorData, TensorDict
import rebatch.demo
from rebatch.cli import main

rebatch.demo.make_step = functools.partial(rebatch.demo.make_step, prompts=8, responses=4)
outs = [{"model_output": {"v": torch.tensor([1.0, 2.0])}, "loss": 0.5},
        {"model_output": {"v": torch.tensor([3.0, 4.0])}, "loss": 0.25}]
data = TensorDict({}, batch_size=[])
data["use_dynamic_bsz"] = NonTensorData(True)
torch.save((outs, [[2, 0], [1, 3]], data), sys.argv[2])
for argv in (["check"], ["check", "--json"], ["check", "--dump", sys.argv[2]]):
    call(" ".join(argv[:2]), lambda argv=argv: REPORT.setdefault("exit", []).append(main(argv)))
"""

_FINISH = """
with open(sys.argv[1], "w") as f:
    json.dump(REPORT, f)
"""

#: A line a logging system or ``warnings`` writes: glog's ``W1201 08:23:31.397000 ...`` (torch's format),
#: ``WARNING:root:...``, ``...: UserWarning: ...``.
_WARNING_LINE = re.compile(r"^[WEF]\d{4} |warning", re.IGNORECASE | re.MULTILINE)

_OWN = ("ref", "torch_impl", "property_tests", "rebatch")


def _run(body: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCH_LOGS", "TORCHDYNAMO", "PYTHONWARNINGS"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["JAX_PLATFORMS"] = (
        "cpu"  # no "falling back to cpu" notice from a JAX without the accelerator's plugin
    )
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-c", _CAPTURE + body + _FINISH, str(report), str(tmp_path / "dump.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done, json.loads(report.read_text())


def _assert_quiet(report: dict) -> None:
    for name, seen in report.items():
        if name == "exit":
            continue
        loud = [r for r in seen["records"] if r["level"] >= 30 or r["logger"].split(".")[0] in _OWN]
        assert not loud, f"{name} logged {loud}"
        assert not seen["warnings"], f"{name} warned {seen['warnings']}"


def test_every_public_function_is_quiet_on_its_first_call(tmp_path: Path) -> None:
    done, report = _run(_CALLS, tmp_path)
    assert done.stdout == ""
    assert done.stderr == ""
    assert "postprocess_batch" in report
    assert "kernel host_scatter" in report
    _assert_quiet(report)


def test_rebatch_check_prints_its_report_and_nothing_else(tmp_path: Path) -> None:
    done, report = _run(_CHECK, tmp_path)
    assert report["exit"] == [0, 0, 0], done.stdout
    assert done.stderr == ""
    assert "result: all identical" in done.stdout
    assert not _WARNING_LINE.search(done.stdout), done.stdout
    _assert_quiet(report)


def test_njt_is_nested_tensor_from_jagged() -> None:
    """`torch_impl._jagged.njt` (the quiet constructor every package uses) builds what torch's public
    ``nested_tensor_from_jagged`` builds: a view of the values, the same offsets and holes; and is that
    function where torch lacks the internal one."""
    import torch

    import torch_impl._jagged as jagged_mod

    values, offsets, lengths = (
        torch.arange(12.0).reshape(6, 2),
        torch.tensor([0, 2, 3, 6]),
        torch.tensor([1, 1, 2]),
    )
    for holes in (None, lengths):
        got = jagged_mod.njt(values, offsets, holes)
        want = torch.nested.nested_tensor_from_jagged(values, offsets, holes)
        assert got.layout == torch.jagged
        assert got.shape[0] == 3
        assert got.values().data_ptr() == values.data_ptr()
        assert torch.equal(got.offsets(), want.offsets())
        assert (got.lengths() is None) == (want.lengths() is None)
        assert all(torch.equal(a, b) for a, b in zip(got.unbind(), want.unbind(), strict=True))
    original = jagged_mod._nested_view
    try:
        jagged_mod._nested_view = None
        fallback = jagged_mod.njt(values, offsets)
    finally:
        jagged_mod._nested_view = original
    assert torch.equal(fallback.offsets(), offsets)
