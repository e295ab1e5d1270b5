"""rebatch's production PyTorch implementation: micro-batch outputs put back in order, vectorized and
validated.

The operations of the reference ``ref`` under the same names, and drop-ins for every verl name around
them, with verl 0.9.1's signatures and results on valid input (and a `ref.errors.RebatchError` where
verl would silently misalign): ``postprocess_batch_func``, ``prepare_micro_batches`` (the engine's),
``rearrange_micro_batches``, ``restore_dynamic_batch``, ``get_seqlen_balanced_partitions``,
``get_group_balanced_partitions``, ``append_to_dict``. `torch_impl.integrations.verl.install` puts
them into verl. Never imports JAX; errors are the classes of `ref.errors`.
"""

from __future__ import annotations

from ref import errors as errors
from ref.metrics import (
    append_to_dict as append_to_dict,
    fold_metrics as fold_metrics,
    merge_metrics as merge_metrics,
)
from ref.partition import (
    fixed_partitions as fixed_partitions,
    get_group_balanced_partitions as get_group_balanced_partitions,
    get_seqlen_balanced_partitions as get_seqlen_balanced_partitions,
)
from ref.structure import PADDING as PADDING

from ._alignment import (
    provenance_stats as provenance_stats,
    read_witness as read_witness,
    recorded as recorded,
    set_witness as set_witness,
    witness_config as witness_config,
    witness_stats as witness_stats,
)
from ._distributed import (
    broadcast_from_last_stage as broadcast_from_last_stage,
    gather_batch as gather_batch,
    prepare_micro_batches_dp as prepare_micro_batches_dp,
    sync_micro_batch_count as sync_micro_batch_count,
)
from ._kernels import KERNELS as KERNELS, Kernel as Kernel
from ._layouts import (
    from_packed as from_packed,
    from_padded as from_padded,
    to_packed as to_packed,
    to_padded as to_padded,
)
from ._ops import concat as concat, restore as restore, split as split, take as take
from ._permutation import flatten_partitions as flatten_partitions, inverse_permutation as inverse_permutation
from ._postprocess import (
    postprocess_batch as postprocess_batch,
    postprocess_batch_func as postprocess_batch_func,
    read_setting as read_setting,
)
from ._prepare import (
    balanced_partitions as balanced_partitions,
    prepare_micro_batches as prepare_micro_batches,
    rearrange_micro_batches as rearrange_micro_batches,
    restore_dynamic_batch as restore_dynamic_batch,
    row_lengths as row_lengths,
)
from ._settings import Settings as Settings, get_settings as get_settings, use_settings as use_settings

__all__ = [
    "KERNELS",
    "Kernel",
    "PADDING",
    "Settings",
    "append_to_dict",
    "balanced_partitions",
    "broadcast_from_last_stage",
    "concat",
    "errors",
    "fixed_partitions",
    "flatten_partitions",
    "fold_metrics",
    "from_packed",
    "from_padded",
    "gather_batch",
    "get_group_balanced_partitions",
    "get_seqlen_balanced_partitions",
    "get_settings",
    "inverse_permutation",
    "merge_metrics",
    "postprocess_batch",
    "postprocess_batch_func",
    "prepare_micro_batches",
    "prepare_micro_batches_dp",
    "read_setting",
    "provenance_stats",
    "read_witness",
    "recorded",
    "rearrange_micro_batches",
    "restore",
    "restore_dynamic_batch",
    "row_lengths",
    "set_witness",
    "split",
    "sync_micro_batch_count",
    "take",
    "to_packed",
    "to_padded",
    "use_settings",
    "witness_config",
    "witness_stats",
]
