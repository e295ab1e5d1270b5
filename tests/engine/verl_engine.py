"""verl 0.9.1's own FSDP engine on this CPU, as a verl user's PPO step runs it: the lane's driver.

``python tests/engine/verl_engine.py --out DIR [--mode MODE] [--only-inject | --no-inject] [--unbind]`` (under
``torchrun --nproc-per-node 2`` for world size 2) builds a tiny random ``Qwen2ForCausalLM`` (hidden 64, 2
layers, vocab 512; from a config, ``save_pretrained`` into a temporary directory: no download), then for
each configuration (`CONFIGS`: bf16 and fp32, remove-padding on and off, dynamic batch size on and off)
builds verl's ``TrainingWorker`` as ``ActorRolloutRefWorker.init_model`` builds the actor's
(``verl/workers/engine_workers.py``: the same configs and the same assignments, then ``reset()`` and
``set_loss_fn(partial(ppo_loss, config=actor_config))``), over verl's ``FSDPEngineWithLMHead``
(``strategy="fsdp2"``, ``attn_implementation="sdpa"``, no torch.compile, no tokenizer), and runs:
compute_log_prob as ``RayPPOTrainer._compute_old_log_prob`` prepares it (``left_right_2_no_padding``,
entropy on, ``no_padding_2_padding`` after), two PPO updates (one ``train_mini_batch`` of two mini-batches,
verl's ``ppo_loss``), compute_log_prob again. It writes, per rank, ``DIR/rank-R.pt``: every configuration's
log-probs and entropy (values, offsets, dtypes, padded as the trainer pads them), metrics (the
wall-clock ones left out), each micro-batch's rows in the order the engine ran them, the gradients
before every optimizer step, the parameters after, and ``DIR/rank-R.json``: what happened (an exception
raised, rebatch's shadow counters, the bindings in the engine module).

The mode (``--mode``): how rebatch is in the engine, for the record; the environment does the work
(``REBATCH=on``, ``REBATCH_VERL=on``, ``REBATCH=shadow:1``: set by the caller), except ``install``, which
calls ``torch_impl.integrations.verl.install()`` here after verl's engine modules are imported.

At world size 1, three more runs (``inject-KIND``, after the configurations; ``--only-inject``: these
alone, ``--no-inject``: none) put a well-formed misalignment inside the engine loop of the first log-prob
pass of the configuration `INJECT_AT` names (a fresh worker), by wrapping the engine's ``forward_step``
(never an edit of verl): the outputs the engine collects into ``output_lst`` are changed in place before
``postprocess_batch_func`` sees them. ``swap_micro_batches``: two micro-batches' outputs of the same row count
but different row
lengths (dynamic batch size); ``swap_rows``: two rows of different lengths inside one micro-batch;
``swap_fixed``: two fixed-size micro-batches' outputs (dynamic batch size off); ``swap_equal``: two
micro-batches' outputs of identical row lengths, on the fixed-length batch (every row one length: no row
length tells them apart, only the split's provenance). Every row count, offset and total stays
consistent, so only an alignment check can see it.

``--unbind`` (the negative control): after ``install()``, verl's own ``postprocess_batch_func`` is put
back in ``verl.workers.engine.fsdp.transformer_impl``, and verl's own ``restore_dynamic_batch`` in
``verl.workers.engine.utils`` (which verl's function calls, and rebatch's checks), as if rebatch's
bindings had been left out of what the engine runs. ``--expect caught`` makes the exit status say whether
every injected misalignment was caught (0: ``MisalignmentError``) or not (1).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cpu_platform  # noqa: E402

MODES = ("off", "on", "verl", "install", "shadow")
INJECTIONS = ("swap_micro_batches", "swap_rows", "swap_fixed", "swap_equal")
#: Metrics that measure time (or the machine), never the computation: left out of the comparison.
WALL_CLOCK = ("mfu", "perf/cpu_memory_used_gb", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb")


class Config(NamedTuple):
    name: str
    dtype: str  # the engine's param dtype: "bf16" (verl's default mixed precision) or "fp32"
    remove_padding: bool
    dynamic_bsz: bool
    fixed_length: bool = False  # every row one length (the alignment witness is blind there)


CONFIGS = [
    *(
        Config(f"{dtype}-rmpad{int(rmpad)}-dyn{int(dyn)}", dtype, rmpad, dyn)
        for dtype in ("bf16", "fp32")
        for rmpad in (True, False)
        for dyn in (True, False)
    ),
    Config("fp32-rmpad1-dyn1-fixedlen", "fp32", True, True, fixed_length=True),
]
ROWS = 24
MAX_TOKENS = 64  # log_prob_max_token_len_per_gpu and ppo_max_token_len_per_gpu
MICRO_BATCH = 4  # the fixed micro-batch size (dynamic batch size off)
#: The configuration each injection applies to (its first log-prob pass).
INJECT_AT = {
    "swap_micro_batches": "fp32-rmpad1-dyn1",
    "swap_rows": "bf16-rmpad1-dyn1",
    "swap_fixed": "fp32-rmpad1-dyn0",
    "swap_equal": "fp32-rmpad1-dyn1-fixedlen",
}


def _tiny_model(path: str) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    Qwen2ForCausalLM(config).save_pretrained(path)


def _batch(rank: int, fixed_length: bool = False) -> Any:
    """The rank's 24 rows as the rollout leaves them: prompts left-padded, responses right-padded,
    6-29 tokens a row (rank 1's longer, so the ranks' micro-batch counts differ before verl agrees them),
    with the advantages of the update; ``fixed_length``: every row 4 prompt and 12 response tokens."""
    from verl import DataProto

    g = torch.Generator().manual_seed(1000 + rank)
    prompt_lens = torch.randint(2, 9, (ROWS,), generator=g)
    response_lens = torch.randint(4 + 6 * rank, 21, (ROWS,), generator=g)
    if fixed_length:
        prompt_lens, response_lens = torch.full((ROWS,), 4), torch.full((ROWS,), 12)
    p, r = int(prompt_lens.max()), int(response_lens.max())
    prompts = torch.zeros(ROWS, p, dtype=torch.int64)
    responses = torch.zeros(ROWS, r, dtype=torch.int64)
    attention = torch.zeros(ROWS, p + r, dtype=torch.int64)
    for i in range(ROWS):
        lp, lr = int(prompt_lens[i]), int(response_lens[i])
        prompts[i, p - lp :] = torch.randint(1, 512, (lp,), generator=g)
        responses[i, :lr] = torch.randint(1, 512, (lr,), generator=g)
        attention[i, p - lp : p + lr] = 1
    input_ids = torch.cat([prompts, responses], dim=1)
    position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)
    response_mask = attention[:, p:]
    advantages = torch.randn(ROWS, r, generator=g) * response_mask
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "advantages": advantages,
    }
    return DataProto.from_dict(
        tensors=tensors, meta_info={"global_token_num": attention.sum(-1).tolist(), "temperature": 1.0}
    )


def _worker(model_path: str, config: Config) -> Any:
    """verl's TrainingWorker for the actor, built as ``ActorRolloutRefWorker.init_model`` builds it."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import (
        FSDPActorConfig,
        FSDPEngineConfig,
        FSDPOptimizerConfig,
        HFModelConfig,
        TrainingWorkerConfig,
    )
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss

    model_config = HFModelConfig(
        path=model_path,
        load_tokenizer=False,
        use_remove_padding=config.remove_padding,
        enable_gradient_checkpointing=False,
        override_config={"attn_implementation": "sdpa"},
    )
    precision = "bf16" if config.dtype == "bf16" else "fp32"
    fsdp = FSDPEngineConfig(
        strategy="fsdp2",
        use_torch_compile=False,
        mixed_precision={"param_dtype": precision, "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
    )
    actor_config = FSDPActorConfig(
        strategy="fsdp2",
        rollout_n=1,
        ppo_mini_batch_size=ROWS // 2,
        ppo_micro_batch_size_per_gpu=None if config.dynamic_bsz else MICRO_BATCH,
        use_dynamic_bsz=config.dynamic_bsz,
        ppo_max_token_len_per_gpu=MAX_TOKENS,
        use_torch_compile=False,
        entropy_coeff=0.01,
        calculate_entropy=True,
        optim=FSDPOptimizerConfig(lr=1e-3, clip_grad=1.0),
        checkpoint=CheckpointConfig(),
        fsdp_config=fsdp,
    )
    # ActorRolloutRefWorker.init_model, step 2 (the actor), line for line but the rollout config's fields
    actor_config.model_config = model_config
    training = TrainingWorkerConfig(
        model_type=actor_config.model_config.get("model_type", "language_model"),
        model_config=actor_config.model_config,
        engine_config=actor_config.engine,
        optimizer_config=actor_config.optim,
        checkpoint_config=actor_config.checkpoint,
        profiler_config=None,
    )
    training.engine_config.use_dynamic_bsz = config.dynamic_bsz
    training.engine_config.infer_max_token_len_per_gpu = MAX_TOKENS  # rollout.log_prob_max_token_len_per_gpu
    training.engine_config.infer_micro_batch_size_per_gpu = None if config.dynamic_bsz else MICRO_BATCH
    training.engine_config.max_token_len_per_gpu = actor_config.ppo_max_token_len_per_gpu
    training.engine_config.micro_batch_size_per_gpu = actor_config.ppo_micro_batch_size_per_gpu
    training.engine_config.use_remove_padding = model_config.get("use_remove_padding", False)
    loss_fn = functools.partial(ppo_loss, config=actor_config)
    worker = TrainingWorker(config=training)
    worker.reset()
    worker.set_loss_fn(loss_fn)
    return worker


class Recorder:
    """Wraps the engine's ``forward_step`` and ``optimizer_step`` (instance attributes: verl's code
    unchanged): records each micro-batch's rows in the order the engine runs them, the gradients before
    each optimizer step, and applies an injected misalignment to one log-prob pass."""

    def __init__(self, engine: Any, inject: str | None) -> None:
        self.engine = engine
        self.inject = inject
        self.injected: str | None = None
        self.phase = "none"
        self.micro_batches: dict[str, list[torch.Tensor]] = {}
        self.grads: list[dict[str, torch.Tensor]] = []
        self._outputs: list[dict[str, Any]] = []
        self._forward = engine.forward_step
        self._step = engine.optimizer_step
        engine.forward_step = self.forward_step
        engine.optimizer_step = self.optimizer_step

    def start(self, phase: str) -> None:
        self.phase = phase
        self.micro_batches[phase] = []
        self._outputs = []

    def forward_step(self, micro_batch: Any, loss_function: Any, forward_only: bool) -> Any:
        ids = micro_batch["input_ids"]
        self.micro_batches.setdefault(self.phase, []).append(torch.cat([ids.offsets().diff(), ids.values()]))
        loss, output = self._forward(micro_batch, loss_function=loss_function, forward_only=forward_only)
        self._outputs.append(output)
        if forward_only and self.inject and self.injected is None:
            self.injected = _inject(self.inject, self._outputs)
        return loss, output

    def optimizer_step(self) -> Any:
        grads = {}
        for name, p in self.engine.module.named_parameters():
            g = p.grad
            if g is not None:
                g = g.to_local() if hasattr(g, "to_local") else g
                grads[name] = g.detach().clone()
        self.grads.append(grads)
        return self._step()


def _rows(nested: torch.Tensor) -> list[torch.Tensor]:
    return list(nested.unbind())


def _njt(rows: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged).to(like.dtype)


def _inject(kind: str, outputs: list[dict[str, Any]]) -> str | None:
    """Change the collected outputs in place once the pass has what ``kind`` needs; a description of the
    change, or None (not yet)."""
    model = [o["model_output"] for o in outputs]
    keys = [k for k, v in model[-1].items() if isinstance(v, torch.Tensor) and v.is_nested]
    if kind in ("swap_micro_batches", "swap_fixed", "swap_equal"):
        j = len(model) - 1
        lens_j = model[j][keys[0]].offsets().diff()
        for i in range(j):
            lens_i = model[i][keys[0]].offsets().diff()
            if lens_i.shape == lens_j.shape and torch.equal(lens_i, lens_j) == (kind == "swap_equal"):
                for k in keys:
                    model[i][k], model[j][k] = model[j][k], model[i][k]
                return f"micro-batches {i} and {j} swapped ({lens_i.numel()} rows each): keys {keys}"
        return None
    if kind == "swap_rows":
        m = len(model) - 1
        lens = model[m][keys[0]].offsets().diff().tolist()
        for a in range(len(lens)):
            for b in range(a + 1, len(lens)):
                if lens[a] != lens[b]:
                    for k in keys:
                        rows = _rows(model[m][k])
                        rows[a], rows[b] = rows[b], rows[a]
                        model[m][k] = _njt(rows, model[m][k])
                    return (
                        f"rows {a} and {b} of micro-batch {m} swapped (lengths {lens[a]}, {lens[b]}): "
                        f"keys {keys}"
                    )
        return None
    raise ValueError(f"unknown injection {kind!r}")


def _nested(t: torch.Tensor) -> dict[str, Any]:
    return {"values": t.values(), "offsets": t.offsets(), "dtype": str(t.dtype)}


def _plain(x: Any) -> Any:
    """Metrics as plain data: a verl ``Metric`` as its aggregation and values, tensors as tensors."""
    if hasattr(x, "aggregation") and hasattr(x, "values"):
        return {"aggregation": str(x.aggregation), "values": [_plain(v) for v in x.values]}
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in sorted(x.items()) if k not in WALL_CLOCK}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, np.generic):  # numpy scalars as 0-d tensors of their dtype: compared by their bits
        return torch.from_numpy(np.asarray(x))
    return x


def _log_probs(
    worker: Any, batch: Any, recorder: Recorder, phase: str
) -> tuple[dict[str, Any], torch.Tensor]:
    """``RayPPOTrainer._compute_old_log_prob``'s steps 1-5 around
    ``ActorRolloutRefWorker.compute_log_prob``."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    batch_td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(batch_td, calculate_entropy=True, calculate_sum_pi_squared=False, compute_loss=False)
    recorder.start(phase)
    output = worker.infer_batch(batch_td)
    output = output.cpu() if output is not None else None
    entropy, log_probs = tu.get(output, "entropy"), tu.get(output, "log_probs")
    metrics = tu.get(output, "metrics")
    padded_entropy = no_padding_2_padding(entropy, batch_td)
    padded = no_padding_2_padding(log_probs, batch_td)
    result = {
        "log_probs": _nested(log_probs),
        "entropy": _nested(entropy),
        "old_log_probs": padded.float(),
        "entropys": padded_entropy.float(),
        "metrics": _plain(metrics),
    }
    return result, padded.float()


def _update(worker: Any, batch: Any, old_log_probs: torch.Tensor, recorder: Recorder, world: int) -> Any:
    """``RayPPOTrainer._update_actor``'s steps around ``ActorRolloutRefWorker.update_actor``: two
    mini-batches of 12 rows, one epoch: two optimizer steps."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    batch = batch.union(type(batch).from_dict(tensors={"old_log_probs": old_log_probs}))
    batch_td = left_right_2_no_padding(batch.to_tensordict())
    mini = ROWS // 2 * world
    tu.assign_non_tensor(
        batch_td,
        calculate_entropy=True,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=mini,
        mini_batch_size=mini,
        epochs=1,
        seed=42,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
    )
    recorder.start("update")
    output = worker.train_mini_batch(batch_td)
    return _plain(tu.get(output, "metrics"))


def _bindings() -> dict[str, str]:
    """What the engine module holds under each name rebatch replaces: the function's module, name and
    the file its code is in (a shadow wrapper carries verl's name but not verl's code)."""
    import verl.workers.engine.fsdp.transformer_impl as fsdp

    out = {}
    for name in ("postprocess_batch_func", "prepare_micro_batches"):
        fn = getattr(fsdp, name)
        code = getattr(fn, "__code__", None) or getattr(getattr(fn, "func", None), "__code__", None)
        where = "/".join(Path(code.co_filename).parts[-2:]) if code else type(fn).__name__
        out[name] = f"{fn.__module__}.{fn.__qualname__} ({where})"
    return out


def run(args: argparse.Namespace) -> int:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    for name, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
    ):
        os.environ.setdefault(name, value)  # verl's Worker reads them; torchrun sets them for world size 2
    os.environ.setdefault("MASTER_PORT", str(args.port))
    os.environ["VERL_ENGINE_DEVICE"] = (
        "cuda"  # picks the FSDP engine class (registered for cuda and npu only)
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    with warnings.catch_warnings():  # verl warns of every optional engine it cannot import
        warnings.simplefilter("ignore")
        cpu_platform.use()
        import torch.distributed as dist
        import verl.workers.engine.fsdp.transformer_impl as fsdp
        import verl.workers.engine.utils as engine_utils
        import verl.workers.engine_workers  # noqa: F401

        # TrainingWorker's initialize_global_process_group_ray would ask for "cpu:gloo,cpu:gloo" (the device's
        # backend beside gloo for cpu), which torch refuses: the group is started first, as verl then skips it
        dist.init_process_group(
            "gloo", timeout=datetime.timedelta(seconds=120)
        )  # a stuck rank fails, not hangs
    verl_postprocess = engine_utils.postprocess_batch_func
    verl_restore = engine_utils.restore_dynamic_batch
    if args.mode == "install":
        from torch_impl.integrations import verl as integration

        integration.install()
        if args.unbind:
            fsdp.postprocess_batch_func = verl_postprocess  # rebatch's binding left out of the engine module
            engine_utils.restore_dynamic_batch = verl_restore  # and out of what verl's own function calls
    record: dict[str, Any] = {
        "mode": args.mode,
        "rank": rank,
        "world": world,
        "bindings": _bindings(),
        "runs": {},
    }
    results: dict[str, Any] = {}
    started = time.perf_counter()
    runs: list[tuple[str, Config, str | None]] = []
    if not args.only_inject:
        runs += [(c.name, c, None) for c in CONFIGS]
    if (
        world == 1 and not args.no_inject
    ):  # an injected rank raising alone would leave its peers in verl's collectives
        runs += [(f"inject-{kind}", _config(INJECT_AT[kind]), kind) for kind in INJECTIONS]
    if args.only:
        runs = [r for r in runs if r[0] in args.only.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model_path = _model_path(tmp, rank, world)
        for name, config, inject in runs:
            results[name], record["runs"][name] = _run_config(model_path, config, rank, world, inject)
            dist.barrier()
    record["seconds"] = time.perf_counter() - started
    torch.save(results, out / f"rank-{rank}.pt")
    (out / f"rank-{rank}.json").write_text(json.dumps(record, indent=1, sort_keys=True))
    dist.barrier()
    dist.destroy_process_group()
    if args.expect == "caught":
        missed = {
            n: r
            for n, r in record["runs"].items()
            if n.startswith("inject-") and r.get("raised") != "MisalignmentError"
        }
        if missed or not any(n.startswith("inject-") for n in record["runs"]):
            print(f"rank {rank}: an injected misalignment was NOT caught: {json.dumps(missed, indent=1)}")
            return 1
        print(f"rank {rank}: every injected misalignment caught (MisalignmentError)")
    return 0


def _config(name: str) -> Config:
    return next(c for c in CONFIGS if c.name == name)


def _model_path(tmp: str, rank: int, world: int) -> str:
    """The tiny model saved by rank 0; with many ranks (one machine), rank 0's directory broadcast."""
    import torch.distributed as dist

    path = [tmp + "/model"]
    if rank == 0:
        _tiny_model(path[0])
    if world > 1:
        dist.broadcast_object_list(path, src=0)
    dist.barrier()
    return path[0]


def _shadow_counts() -> dict[str, int] | None:
    from torch_impl.integrations import verl as integration

    stats = integration.stats()  # on mode counts its calls too (mode "on"): only a shadow's counters here
    if stats.get("mode") != "shadow" or not stats["calls"]:
        return None
    return {k: stats[k] for k in ("calls", "sampled", "differences", "defects", "errors")}


def _run_config(
    model_path: str, config: Config, rank: int, world: int, inject: str | None
) -> tuple[Any, Any]:
    """One configuration (a fresh worker): log-probs, two PPO updates, log-probs; with ``inject``, the
    first log-prob pass only, misaligned. Returns (the results compared bit for bit, what happened)."""
    torch.manual_seed(0)
    worker = _worker(model_path, config)
    recorder = Recorder(worker.engine, inject)
    batch = _batch(rank, config.fixed_length)
    info: dict[str, Any] = {"config": config.name}
    result: dict[str, Any] = {}
    before = _shadow_counts()
    try:
        result["log_prob_1"], old = _log_probs(worker, batch, recorder, "log_prob_1")
        if not inject:
            result["update_metrics"] = _update(worker, batch, old, recorder, world)
            result["log_prob_2"], _ = _log_probs(worker, batch, recorder, "log_prob_2")
            result["grads"] = recorder.grads
            result["params"] = {
                name: (p.to_local() if hasattr(p, "to_local") else p).detach().clone()
                for name, p in worker.engine.module.named_parameters()
            }
        else:
            lengths = batch.batch["attention_mask"].sum(-1)
            got = result["log_prob_1"]["log_probs"]["offsets"].diff()
            info["rows_of_wrong_length"] = int((got != lengths).sum())
    except Exception as err:  # recorded: the caller compares what each mode raised
        info["raised"] = type(err).__name__
        info["message"] = str(err)[:2000]
        info["traceback"] = traceback.format_exc()[-4000:]
    result["micro_batches"] = recorder.micro_batches
    info["injected"] = recorder.injected
    after = _shadow_counts()
    if after is not None:
        info["shadow"] = {k: v - (before or {}).get(k, 0) for k, v in after.items()}
    return result, info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the directory for rank-R.pt and rank-R.json")
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="off",
        help="for the record (the environment does the work) but install",
    )
    parser.add_argument("--no-inject", action="store_true", help="run no injected misalignment")
    parser.add_argument("--only-inject", action="store_true", help="run the injected misalignments only")
    parser.add_argument("--unbind", action="store_true", help="the negative control (with --mode install)")
    parser.add_argument(
        "--only", help="comma-separated run names (a configuration or inject-KIND): these alone"
    )
    parser.add_argument(
        "--expect", choices=("caught",), help="exit 1 unless every injection raised MisalignmentError"
    )
    parser.add_argument("--port", type=int, default=29533, help="MASTER_PORT for world size 1")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
