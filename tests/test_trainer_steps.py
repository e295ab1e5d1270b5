"""The trainers' own engines and micro-batch layers with rebatch inside, over a tiny random Qwen2 model
(hidden 64, 2 layers, vocab 512, saved with ``save_pretrained``): ``REBATCH=on``, ``REBATCH=shadow:1`` and
rebatch off, each in a fresh process (`property_tests.trainer_steps`), compared bit for bit; then two
micro-batches' outputs swapped inside the loop: the trainer silent, rebatch ``MisalignmentError`` under
``on``, a defect in shadow mode with the trainer's result returned.

- AReaL 1.0.4: its own ``FSDPEngine`` on the CPU (gloo): ``forward_batch`` log-probs, two ``train_batch``
  steps, ``forward_batch`` again (6 micro-batches of at most 64 tokens), float32 and bfloat16; world size 2
  through ``torch.distributed.run``, each rank its own rows (off and on).
- SkyRL 0.4.0: its ``TokenBasedBatchIterator`` over a ``TrainingInputBatch`` around the model's forward,
  its ``reorder_and_combine_batches`` and ``reorder_and_combine_items``, a gradient. SkyRL's own FSDP worker
  does not run on the CPU (the stop: ``docs/peers.md``, "Inside the trainers' own engines").

They run in each trainer's environment (``.ci/peers.sh``, where ``REBATCH_REQUIRE_PEER`` makes a skip
fail), and are skipped elsewhere.
"""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from property_tests.compare import first_difference

REQUIRE_ENV = "REBATCH_REQUIRE_PEER"
ROOT = Path(__file__).resolve().parent.parent
MODES = ("off", "on", "shadow:1")
#: AReaL's micro-batches 0 and 2 (63 and 62 tokens): outputs of different sizes swapped
AREAL_SWAP = (0, 2)


def _need(name: str) -> None:
    try:
        importlib.import_module(name)
        importlib.import_module("transformers")
    except ImportError as err:
        why = f"{name} is not installed here ({err}); CI runs these in its environment (.ci/peers.sh)"
        if name in os.environ.get(REQUIRE_ENV, "").split(","):
            pytest.fail(why)
        pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Runs:
    """Each ``(trainer, mode, swap, dtype, world)`` step run once in its own processes, its result kept."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self.model = str(where / "qwen2-tiny")
        self.results: dict[tuple[str, str, Any, str, int], Any] = {}

    def __call__(
        self,
        trainer: str,
        mode: str,
        swap: tuple[int, int] | None = None,
        dtype: str = "float32",
        world: int = 1,
    ) -> Any:
        """The step's result (with ``world`` > 1: each rank's, in a list; through
        ``torch.distributed.run``)."""
        key = (trainer, mode, swap, dtype, world)
        if key not in self.results:
            if not os.path.isdir(self.model):
                from property_tests.trainer_steps import build_model

                build_model(self.model)
            out = self.where / f"{trainer}-{mode.replace(':', '-')}-{swap}-{dtype}-{world}.pt"
            env = {k: v for k, v in os.environ.items() if not k.startswith("REBATCH")}
            env.update(REBATCH=mode, MASTER_PORT=str(_free_port()))
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
            argv = ["-m", "property_tests.trainer_steps", trainer, self.model, str(out), "--dtype", dtype]
            if swap is not None:
                argv += ["--swap", f"{swap[0]},{swap[1]}"]
            if world > 1:
                argv = [
                    "-m",
                    "torch.distributed.run",
                    f"--nproc_per_node={world}",
                    f"--master_port={_free_port()}",
                    *argv,
                ]
            done = subprocess.run(
                [sys.executable, *argv],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert done.returncode == 0, done.stderr[-4000:]
            if world == 1:
                self.results[key] = torch.load(out, weights_only=True)
            else:
                self.results[key] = [torch.load(f"{out}.rank{r}", weights_only=True) for r in range(world)]
        return self.results[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> _Runs:
    return _Runs(tmp_path_factory.mktemp("trainer-steps"))


def _shadow(result: dict[str, Any], trainer: str) -> dict[str, int]:
    return result["mode"][f"{trainer}_shadow"]


# -- AReaL's FSDPEngine ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_areal_fsdp_engine_same_bits_off_on_and_shadow(runs: _Runs, dtype: str) -> None:
    _need("areal")
    off, on, shadow = (runs("areal", m, dtype=dtype) for m in MODES)
    assert off["bound"] == "areal.engine.core.train_engine"
    assert off["mode"] == {"areal": None, "skyrl": None}
    assert on["bound"] == "torch_impl.integrations.areal"  # rebatch's function inside the engine
    assert on["mode"]["areal"] == "on"
    assert shadow["mode"]["areal"] == "shadow"
    assert _shadow(shadow, "areal") == {"calls": 2, "sampled": 2, "differences": 0, "defects": 0, "errors": 0}
    lp = off["logp_before"]
    assert lp.shape == (24, max(off["lengths"]))
    assert bool(torch.isfinite(lp).all())
    assert first_difference(off["logp_after"], lp) is not None  # the two updates moved the model
    assert [s["num_micro_batches"] for s in off["train"]] == [6, 6]
    if dtype != "float32":  # the engine computed in that dtype: not float32's log-probs
        assert first_difference(lp, runs("areal", "off")["logp_before"]) is not None
    for other in (on, shadow):
        for key in ("logp_before", "logp_after", "params", "train"):
            assert first_difference(other[key], off[key]) is None, key


def test_areal_fsdp_engine_swapped_outputs_areal_silent_rebatch_raises(runs: _Runs) -> None:
    _need("areal")
    off, on, shadow = (runs("areal", m, AREAL_SWAP) for m in MODES)
    right = runs("areal", "off")["logp_before"]
    assert off["error"] is None  # AReaL: silent, and wrong
    assert first_difference(off["forward"], right) is not None
    assert on["error"] is not None
    assert on["error"].startswith(
        "MisalignmentError: micro-batch 0: its output holds 62 values, but mb_list.mbs[0]['cu_seqlens'] "
        "gives 63"
    )
    assert shadow["error"] is None  # AReaL's result returned, the defect counted
    assert first_difference(shadow["forward"], off["forward"]) is None
    assert _shadow(shadow, "areal")["defects"] == 1
    assert "MisalignmentError" in " ".join(shadow["mode"]["areal_messages"])


def test_areal_fsdp_engine_world_size_2_same_bits_off_and_on(runs: _Runs) -> None:
    """Two data-parallel ranks (gloo) with different rows: AReaL agrees on the micro-batch count; each
    rank's log-probs, parameters and metrics the same with rebatch off and on."""
    _need("areal")
    off, on = runs("areal", "off", world=2), runs("areal", "on", world=2)
    assert off[0]["lengths"] != off[1]["lengths"]
    assert off[0]["train"][0]["num_micro_batches"] == off[1]["train"][0]["num_micro_batches"]
    for rank in (0, 1):
        assert on[rank]["bound"] == "torch_impl.integrations.areal"
        for key in ("logp_before", "logp_after", "params", "train"):
            assert first_difference(on[rank][key], off[rank][key]) is None, (rank, key)


# -- SkyRL's TokenBasedBatchIterator around the model ------------------------------------------------


def _skyrl_pair(result: dict[str, Any]) -> tuple[int, int]:
    sizes = [len(p) for p in result["microbatches"]]
    return next((m, n) for m in range(len(sizes)) for n in range(m + 1, len(sizes)) if sizes[m] == sizes[n])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_skyrl_iterator_around_qwen2_same_bits_off_on_and_shadow(runs: _Runs, dtype: str) -> None:
    _need("skyrl")
    off, on, shadow = (runs("skyrl", m, dtype=dtype) for m in MODES)
    assert off["bound"] == "skyrl.backends.skyrl_train.workers.worker_utils"
    assert on["bound"] == "torch_impl.integrations.skyrl"
    assert _shadow(shadow, "skyrl") == {"calls": 2, "sampled": 2, "differences": 0, "defects": 0, "errors": 0}
    assert len(off["microbatches"]) > 3
    assert [len(x["logprobs"]) for x in off["items"]] == off["valid"]
    assert off["batches"]["output"].shape[0] == 24
    assert off["batches"]["output"].dtype == getattr(torch, dtype)
    for other in (on, shadow):
        for key in ("microbatches", "batches", "items", "grads"):
            assert first_difference(other[key], off[key]) is None, key


def test_skyrl_iterator_swapped_outputs_skyrl_silent_rebatch_raises_on_items(runs: _Runs) -> None:
    _need("skyrl")
    right = runs("skyrl", "off")
    pair = _skyrl_pair(right)
    off, on, shadow = (runs("skyrl", m, pair) for m in MODES)
    # SkyRL: both restore steps silent, both wrong
    assert off["batches_error"] is None
    assert off["items_error"] is None
    assert first_difference(off["batches"], right["batches"]) is not None
    assert first_difference(off["items"], right["items"]) is not None
    # rebatch: the items carry each row's valid length, the witness sees it; padded outputs keep none
    assert on["items_error"] is not None
    assert on["items_error"].startswith("MisalignmentError: key 'logprobs', micro-batch ")
    assert on["batches_error"] is None
    assert first_difference(on["batches"], off["batches"]) is None
    assert shadow["items_error"] is None
    assert first_difference(shadow["items"], off["items"]) is None
    assert _shadow(shadow, "skyrl")["defects"] == 1
