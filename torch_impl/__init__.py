"""rebatch's production PyTorch implementation: micro-batch outputs put back in order, vectorized and validated.

A drop-in for verl's ``postprocess_batch_func`` (`postprocess_batch_func`), and the operations of the
reference ``ref`` under the same names. Never imports JAX; errors are the classes of `ref.errors`.
"""

from __future__ import annotations

from ref import errors as errors
from ref._structure import PADDING as PADDING

from ._distributed import broadcast_from_last_stage as broadcast_from_last_stage
from ._distributed import gather_batch as gather_batch
from ._distributed import prepare_micro_batches_dp as prepare_micro_batches_dp
from ._distributed import sync_micro_batch_count as sync_micro_batch_count
from ._metrics import append_to_dict as append_to_dict
from ._ops import concat as concat
from ._ops import restore as restore
from ._ops import split as split
from ._ops import take as take
from ._permutation import flatten_partitions as flatten_partitions
from ._permutation import inverse_permutation as inverse_permutation
from ._postprocess import postprocess_batch as postprocess_batch
from ._postprocess import postprocess_batch_func as postprocess_batch_func
from ._prepare import balanced_partitions as balanced_partitions
from ._prepare import prepare_micro_batches as prepare_micro_batches
from ._prepare import row_lengths as row_lengths

__all__ = [
    "PADDING",
    "append_to_dict",
    "broadcast_from_last_stage",
    "gather_batch",
    "prepare_micro_batches_dp",
    "sync_micro_batch_count",
    "balanced_partitions",
    "concat",
    "errors",
    "flatten_partitions",
    "inverse_permutation",
    "postprocess_batch",
    "postprocess_batch_func",
    "prepare_micro_batches",
    "restore",
    "row_lengths",
    "split",
    "take",
]
