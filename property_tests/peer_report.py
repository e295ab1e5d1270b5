"""The conformance report of a trainer's own reorder step (`property_tests.peers`), and ``docs/peers.md``.

`measure` runs, in the environment where the trainer is installed: the differential (the trainer's
function and rebatch's drop-in on the same drawn valid calls), the conformance properties with the
trainer as the candidate, every row of the table of defects and the trainer's own defects (what each
function does: raises, crashes untyped, or returns silently), and the speed of both in one run. It is
saved as JSON (one file per trainer: the trainers live in environments of their own); `render` joins
the files into the Markdown of ``docs/peers.md``::

    python -m property_tests.conformance --candidate areal --json .cache/peers/areal.json
    python -m property_tests.conformance --report docs/peers.md .cache/peers/*.json
"""

from __future__ import annotations

import functools
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ref import errors

from .compare import first_difference
from .convert import provenance_for
from .defects import TABLE, named_call
from .markdown import table
from .peers import PEERS, Peer, differential, outcome, sized_call

__all__ = [
    "ENGINES",
    "LIMIT",
    "SIZES",
    "OUTCOMES_BEGIN",
    "OUTCOMES_END",
    "drawn",
    "measure",
    "outcomes_section",
    "render",
]

#: The timed sizes: (rows B, mean row length, micro-batches M).
SIZES = ((1024, 512, 16), (16384, 16, 16))
OUTCOMES_BEGIN = "<!-- outcomes: generated, compared by CI -->"
OUTCOMES_END = "<!-- /outcomes -->"
#: A defect row's ``limit`` where only the split's provenance shows it and the trainer's call cannot carry it.
LIMIT = "provenance cannot reach"


def drawn(strategy: Any, n: int) -> list[Any]:
    """Up to ``n`` examples of ``strategy``, derandomized (the same every run)."""
    from hypothesis import HealthCheck, Phase, given, settings

    out: list[Any] = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(example: Any) -> None:
        out.append(example)

    collect()
    return out


def _properties(
    peer: Peer, theirs: dict[str, Callable[..., Any]], max_examples: int
) -> dict[str, str | None]:
    from .candidates import run_conformance
    from .properties import PROPERTIES, Property
    from .strategies import microbatch_outputs

    def candidate(
        output_lst: Any, indices: Any, *, use_dynamic_bsz: Any = True, pad_mode: Any = "no_padding"
    ) -> Any:
        return peer.run(theirs, output_lst, indices, use_dynamic_bsz, pad_mode)

    strategy = microbatch_outputs(**peer.bounds, use_dynamic_bsz=None)
    props = {
        name: Property(name, strategy, PROPERTIES[name].check)
        for name in ("postprocess_agrees", "postprocess_agrees_with_numpy")
    }
    return run_conformance(candidate, max_examples=max_examples, names=tuple(props), properties=props)


def _defects(peer: Peer, theirs: dict[str, Any], ours: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for d in TABLE:
        if d.op != "postprocess_batch":
            continue

        def attempt(fns: dict[str, Any], d: Any = d) -> Any:
            call = named_call(d)  # one call: its outputs, indices and provenance from one split
            outs, indices = call.args
            kwargs = provenance_for("torch_impl", call.kwargs)
            carried = (
                {"provenance": kwargs["provenance"]} if peer.provenance and "provenance" in kwargs else {}
            )
            return peer.run(
                fns,
                outs,
                indices,
                kwargs.get("use_dynamic_bsz", True),
                kwargs.get("pad_mode", "no_padding"),
                kwargs.get("witness"),
                **carried,
            )

        split = "provenance" in named_call(d).kwargs

        rows.append(
            {
                "name": d.name,
                "source": "table",
                "what": d.pattern,
                "expected": d.error.__name__,
                "theirs": outcome(functools.partial(attempt, theirs)),
                "ours": outcome(functools.partial(attempt, ours)),
                # a well-formed misalignment in a layout that keeps no row lengths: nothing can show it
                "undetectable": d.error is errors.MisalignmentError and not peer.witnessed,
                # a misalignment only the split's provenance shows, where the trainer's call cannot carry it:
                # rebatch's drop-in is measured (silent: a known limit, docs/witness.md), never counted a
                # failure
                "limit": LIMIT if split and not peer.provenance else None,
            }
        )
    for nd in peer.native_defects():
        rows.append(
            {
                "name": nd.name,
                "source": peer.name,
                "what": nd.what,
                "expected": nd.error.__name__,
                "theirs": outcome(functools.partial(nd.attempt, theirs)),
                "ours": outcome(functools.partial(nd.attempt, ours)),
            }
        )
    return rows


def _speed(peer: Peer, theirs: dict[str, Any], ours: dict[str, Any], repeats: int) -> list[dict[str, Any]]:
    rows = []
    for b, length, m in SIZES:
        output_lst, partitions = sized_call(b, length, m)
        name, args = peer.native(output_lst, partitions)
        mine, other = ours[name], theirs[name]
        same = first_difference(mine(*args), other(*args))
        times: dict[str, list[float]] = {"theirs": [], "ours": []}
        for r in range(repeats):  # alternating, the order flipped each round
            for label in ("theirs", "ours") if r % 2 == 0 else ("ours", "theirs"):
                fn = other if label == "theirs" else mine
                start = time.perf_counter()
                fn(*args)
                times[label].append(time.perf_counter() - start)
        t, o = statistics.median(times["theirs"]), statistics.median(times["ours"])
        rows.append(
            {
                "B": b,
                "mean_length": length,
                "M": m,
                "theirs_ms": t * 1e3,
                "ours_ms": o * 1e3,
                "speedup": t / o,
                "same": same,
            }
        )
    return rows


def measure(name: str, *, cases: int = 500, max_examples: int = 100, repeats: int = 5) -> dict[str, Any]:
    """The whole report of trainer ``name`` (a key of `PEERS`), as a JSON-ready dict."""
    from .strategies import microbatch_outputs

    peer = PEERS[name]
    theirs, ours = peer.theirs(), peer.ours()
    calls = drawn(microbatch_outputs(**peer.bounds, use_dynamic_bsz=None), cases)
    return {
        "name": peer.name,
        "label": peer.label,
        "timed": peer.timed,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "differential": {"cases": len(calls), "differences": differential(peer, calls)},
        "properties": _properties(peer, theirs, max_examples),
        "defects": _defects(peer, theirs, ours),
        "speed": _speed(peer, theirs, ours, repeats),
    }


#: What runs of each trainer's own engine on a CPU machine, where it stops, and the deepest layer tested
#: instead (``tests/test_trainer_steps.py``, `property_tests.trainer_steps`; issue 43). Static text: the
#: figures are the tests' assertions and one run's measurements.
ENGINES = (
    "## Inside the trainers' own engines (`tests/test_trainer_steps.py`, in each trainer's lane)",
    "",
    "A tiny random `Qwen2ForCausalLM` (hidden 64, 2 layers, vocab 512, built from a config and saved with",
    "`save_pretrained`: no download), 24 sequences of 6-29 tokens; rebatch off, `REBATCH=on` and",
    "`REBATCH=shadow:1`, each a fresh process (`property_tests/trainer_steps.py`), compared bit for bit; "
    "then",
    "two micro-batches' outputs swapped inside the loop (a well-formed misalignment). The tests bite: with",
    "the integration's binding left out (its table of replacements emptied), the `on` and swap tests of",
    "both trainers fail (the engine's function is the trainer's, the swap goes through).",
    "",
    "**AReaL 1.0.4: its own `FSDPEngine` runs here** (AReaL's CPU platform, gloo, world size 1, FSDP2,",
    '`attn_impl="sdpa"`, `max_tokens_per_mb=64`: 6 micro-batches of 63, 63, 62, 45, 61 and 64 tokens):',
    "`forward_batch` (log-probs), two `train_batch` steps (a loss on log-probs and entropy, AReaL's "
    "optimizer",
    "step), `forward_batch` again. Under `on` the engine module's `reorder_and_pad_outputs` is rebatch's.",
    "Log-probs before and after, every parameter after the updates and the metrics (grad norm, lr,",
    "micro-batch count) are bit-identical in the three modes, in float32 and in bfloat16 (the engine's",
    "`dtype`, fp32 master weights); shadow: 2 calls, 2 sampled, 0 differences. World size 2",
    "(`torch.distributed.run`, gloo, each rank its own rows, AReaL agreeing on 8 micro-batches a rank):",
    "each rank's results identical off and `on` (shadow not run at world size 2).",
    "Outputs of micro-batches 0 and 2 (63 and 62 tokens) swapped in the engine loop: AReaL silent (wrong",
    "log-probs returned), rebatch `MisalignmentError: micro-batch 0: its output holds 62 values, but",
    "mb_list.mbs[0]['cu_seqlens'] gives 63 tokens ...`, shadow mode returns AReaL's result and counts 1 "
    "defect.",
    "Measured blind spot: micro-batches 0 and 1 hold 63 tokens each, and swapping their outputs is silent "
    "for",
    "rebatch too (AReaL's outputs are packed `[n_m]` values with no row boundaries; the sizes agree and",
    "`cu_seqlens` and `output_seqlens` are not moved by the swap). About 16 s of CPU a process.",
    "",
    "**SkyRL 0.4.0: its own FSDP worker does not run on a CPU machine.** Tried in its environment (torch",
    "2.13.0+cu130, no GPU), `FSDPPolicyWorkerBase` built outside Ray as its actor is, world size 1:",
    "",
    "1. `skyrl/backends/skyrl_train/distributed/fsdp_utils.py`, line 26 (`from peft.utils.save_and_load",
    "   import get_peft_model_state_dict`): `ModuleNotFoundError: No module named 'peft'`; SkyRL's pin",
    "   `peft==0.18.1` installs and gets past it.",
    "2. **The stop:** `skyrl/backends/skyrl_train/workers/model_wrapper.py`, line 13 (`from",
    "   flash_attn.bert_padding import pad_input, unpad_input`, reached from `workers/fsdp/fsdp_worker.py`",
    "   line 11 and `distributed/fsdp_strategy.py` line 39): `ModuleNotFoundError: No module named",
    "   'flash_attn'`. flash-attn is a CUDA extension with no CPU build.",
    "3. Past it only with a stand-in module (an investigation, not a test): `workers/worker.py`, line 124,",
    '   `init_worker_process_group`: `init_process_group(backend="cpu:gloo,cuda:nccl")` raises `ValueError:',
    "   ProcessGroupNCCL is only supported with GPUs, no GPUs found!`; read in the code after it:",
    '   `init_device_mesh("cuda", ...)` in the same method, `torch.cuda.set_device(local_rank)` in',
    "   `distributed/fsdp_strategy.py` line 109, `experience.to_device(torch.cuda.current_device())` in",
    "   `_forward_backward_micro`.",
    "",
    "The deepest SkyRL layer that runs is tested instead: its `TokenBasedBatchIterator` (its real packer, 6",
    "micro-batches at 64 tokens) over a `TrainingInputBatch` built as its trainer builds one (left-padded,",
    "`response_mask`), each micro-batch through the model as `HFModelWrapper.forward` computes action",
    "log-probs (position ids from the mask, SkyRL's own `logprobs_from_logits`, `[:, -num_actions - 1 : "
    "-1]`)",
    "and the per-sample items as `_forward_backward_micro` builds them, restored by the iterator's",
    "`reorder_and_combine_batches` and `reorder_and_combine_items`, then a gradient. Outputs, items and "
    "every",
    "gradient are bit-identical off, `on` and in shadow (2 calls, 2 sampled, 0 differences), float32 and",
    "bfloat16. Two micro-batches",
    "of 3 rows swapped: SkyRL silent on both paths; rebatch `MisalignmentError: key 'logprobs', ...` on the",
    "items, silent on the padded batches (no row lengths there); shadow counts 1 defect.",
)


def outcomes_section(reports: Sequence[dict[str, Any]]) -> list[str]:
    """The table of outcomes: one row per defect, two columns per trainer (its own function, rebatch's
    drop-in). Deterministic: CI regenerates it and compares it with the committed page."""
    head = ["defect", "source", "rebatch raises"]
    for r in reports:
        head += [r["label"], "rebatch's drop-in"]
    names: list[tuple[str, str, str]] = []
    for r in reports:
        for d in r["defects"]:
            key = (d["name"], d["source"], d["expected"])
            if key not in names:
                names.append(key)
    rows = []
    for name, source, expected in names:
        cells = [f"`{name}`", source, expected]
        for r in reports:
            found = next((d for d in r["defects"] if d["name"] == name and d["source"] == source), None)
            cells += [found["theirs"], _ours(found)] if found else ["", ""]
        rows.append(cells)
    return [OUTCOMES_BEGIN, *table(head, rows), OUTCOMES_END]


def _ours(row: dict[str, Any]) -> str:
    """rebatch's outcome as measured, marked where it is silent at a known limit (the row's ``limit``)."""
    return (
        f"{row['ours']} (known limit: {row['limit']})"
        if row.get("limit") and row["ours"] == "silent"
        else row["ours"]
    )


def render(reports: Sequence[dict[str, Any]]) -> str:
    """``docs/peers.md`` from the trainers' reports."""
    out = [
        "# The trainers' reorder steps, checked",
        "",
        "Generated by `python -m property_tests.conformance --report docs/peers.md .cache/peers/*.json`, "
        "from one",
        "report per trainer made in that trainer's environment (`.ci/peers.sh`: AReaL 1.0.4 beside torch "
        "2.9.1,",
        "SkyRL 0.4.0 on Python 3.12, verl 0.9.1 in the pins environment). Do not edit by hand: CI "
        "regenerates",
        "the table of outcomes and fails if it differs.",
        "",
        "## What each trainer does with a bad input",
        "",
        "Each row of the table of defects (`property_tests/defects/`, source `table`: put into each "
        "trainer's own",
        "form by its adapter in `property_tests/peers.py`; `n/a` where that form has no place for it) and "
        "each",
        "trainer's own defects (source: the trainer). `silent`: the function returned a result, misaligned;",
        "`crashes: X`: an exception that is not a `RebatchError` (no key, micro-batch or value named);",
        "`raises X`: the typed error. The rows from `micro_batches_swapped` to "
        "`fixed_size_micro_batches_swapped`",
        "are well-formed misalignments (every structure valid, the rows restored as the wrong ones), which "
        "the",
        "batch's own row lengths show (the alignment witness, `docs/witness.md`): verl's drop-in reads "
        "them from",
        "`data`'s `input_ids`, AReaL's from each micro-batch's `cu_seqlens`, SkyRL's from the per-sample "
        "items of",
        "`reorder_and_combine_items` (its adapter's form for a call with a witness) against each row's "
        "valid length",
        "in the iterator's batch (`response_mask`); SkyRL's padded `reorder_and_combine_batches` outputs "
        "keep none.",
        "",
        "The rows from `fixed_length_micro_batches_swapped` on are misalignments of a fixed-length batch "
        "(every",
        "row one length: the witness is blind; one row holds a dense key only, which it never binds), "
        "split by",
        "rebatch's split, which only the split's provenance shows (`docs/spec.md`, \"Exact provenance\"). "
        "verl's",
        "drop-in gets it from `data`, the batch the split recorded. AReaL's and SkyRL's calls cannot carry "
        "it",
        '(`docs/witness.md`, "Where provenance cannot reach"): there rebatch\'s drop-in is measured '
        "silent too,",
        "marked `silent (known limit: ...)`, and not counted a conformance failure. (SkyRL's iterator "
        "holds the",
        "split's own partitions, so the rows of other indices reach it only through its adapter here.)",
        "",
        *outcomes_section(reports),
        "",
        "## Differential: the trainer's function against rebatch's drop-in",
        "",
        *table(
            ["trainer", "torch", "Python", "valid calls drawn", "differences", "conformance properties"],
            [
                [
                    r["label"],
                    r["torch"],
                    r["python"],
                    r["differential"]["cases"],
                    len(r["differential"]["differences"]),
                    ", ".join(
                        f"{k}: {'holds' if v is None else 'FAILS (' + v + ')'}"
                        for k, v in r["properties"].items()
                    ),
                ]
                for r in reports
            ],
        ),
    ]
    out += [
        "",
        "## Speed: the trainer's own function and rebatch's drop-in, in one run",
        "",
        "Median of alternating calls on the CPU (2 cores), float32 log-probs, lengths uniform around the "
        "mean,",
        "shuffled into M micro-batches; the same inputs for both, as each trainer's call takes them:",
        "",
        *(f"- {r['label']}: {r['timed']}." for r in reports if r.get("timed")),
        "",
        *table(
            ["trainer", "B", "mean length", "M", "trainer's ms", "rebatch's ms", "speed-up", "same result"],
            [
                [
                    r["label"],
                    s["B"],
                    s["mean_length"],
                    s["M"],
                    f"{s['theirs_ms']:.2f}",
                    f"{s['ours_ms']:.2f}",
                    f"{s['speedup']:.1f}x",
                    "yes" if s["same"] is None else f"NO: {s['same']}",
                ]
                for r in reports
                for s in r["speed"]
            ],
        ),
    ]
    return "\n".join([*out, "", *ENGINES]) + "\n"


def load(paths: Sequence[str]) -> list[dict[str, Any]]:
    """The reports saved by ``--json``, in `PEERS` order."""
    reports = []
    for path in paths:
        with open(path) as f:
            reports.append(json.load(f))
    order = list(PEERS)
    return sorted(reports, key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
