# Derived from verl (https://github.com/volcengine/verl), Apache-2.0, Copyright Bytedance Ltd. and/or its affiliates.
# CPU/gloo edit of verl's tests/utils/test_seqlen_balancing.py::test_seqlen_balancing_distributed_params.
# Edits vs. upstream _worker: (1) no get_torch_device().set_device(rank); (2) backend="gloo" instead of
# get_nccl_backend(); (3) tensors on "cpu" instead of f"{get_device_name()}:{rank}"; (4) monkeypatch
# verl.utils.seqlen_balancing.get_device_name -> "cpu" (on a GPU-less box verl.utils.device.get_device_name()
# still returns "cuda", and rearrange_micro_batches builds its all_reduce tensors on that device).
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl import DataProto
from verl.utils.model import create_random_mask
from verl.utils.seqlen_balancing import ceildiv, get_reverse_idx


def _worker(rank, world_size, init_method, max_token_len, use_same_dp, min_mb):
    import verl.utils.seqlen_balancing as sb

    sb.get_device_name = lambda: "cpu"
    dist.init_process_group(backend="gloo", init_method=init_method, world_size=world_size, rank=rank)

    torch.manual_seed(42 + rank)
    input_ids = torch.randint(0, 10, (20 + rank * 5, 100))
    attention_mask = create_random_mask(
        input_ids=input_ids, max_ratio_of_left_padding=0.1, max_ratio_of_valid_token=0.9, min_ratio_of_valid_token=0.5
    )
    batch = DataProto.from_single_dict({"input_ids": input_ids, "attention_mask": attention_mask}).batch

    micros, idx_lst = sb.rearrange_micro_batches(
        batch, max_token_len=max_token_len, dp_group=dist.group.WORLD, same_micro_num_in_dp=use_same_dp,
        min_num_micro_batch=min_mb,
    )
    seq_len_effective = batch["attention_mask"].sum(dim=1)
    minimum = min(len(seq_len_effective), ceildiv(seq_len_effective.sum().item(), max_token_len))
    if min_mb is not None:
        minimum = max(minimum, min_mb)
    assert len(micros) >= minimum
    assert all(micro["attention_mask"].sum().item() <= max_token_len for micro in micros)
    if use_same_dp:
        counts = [torch.zeros(1) for _ in range(world_size)]
        counts[rank].fill_(len(micros))
        dist.all_gather(counts, counts[rank])
        assert len({int(c.item()) for c in counts}) == 1
    flat = torch.cat(micros, dim=0)
    idx = [i for sub in idx_lst for i in sub]
    torch.testing.assert_close(flat[torch.tensor(get_reverse_idx(idx))], batch)
    dist.destroy_process_group()


def test_seqlen_balancing_distributed_params_cpu(tmp_path):
    for name, args in (("min_mb", (300, False, 4)), ("same_dp", (300, True, None))):
        init_file = tmp_path / f"dist_init_{name}"
        init_file.write_text("")
        mp.spawn(_worker, args=(2, f"file://{init_file}", *args), nprocs=2, join=True)
