"""rebatch's reference specification in JAX: how micro-batch outputs are joined and put back in order.

Pure functions, no global state; each docstring gives its meaning as a Python list expression.
``import ref`` imports neither torch nor, until a JAX-backed function is used, JAX. The pure-Python
public modules `ref.errors`, `ref.structure`, `ref.partition` and `ref.metrics` are shared with the
production package `torch_impl`, which imports them without JAX. Only `ref.interop` imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import (
    errors as errors,
    metrics as metrics,
    partition as partition,
    provenance as provenance,
    structure as structure,
)
from .errors import (
    DeviceMismatchError as DeviceMismatchError,
    DtypeMismatchError as DtypeMismatchError,
    InvalidJaggedError as InvalidJaggedError,
    KeyMismatchError as KeyMismatchError,
    MisalignmentError as MisalignmentError,
    NotAPermutationError as NotAPermutationError,
    OutputMismatchError as OutputMismatchError,
    PartitionMismatchError as PartitionMismatchError,
    RankFailedError as RankFailedError,
    RebatchError as RebatchError,
    RowIndexError as RowIndexError,
    ShapeMismatchError as ShapeMismatchError,
    TokenBudgetError as TokenBudgetError,
    UnsupportedSettingError as UnsupportedSettingError,
)
from .metrics import (
    append_to_dict as append_to_dict,
    fold_metrics as fold_metrics,
    merge_metrics as merge_metrics,
)
from .partition import (
    balanced_partitions as balanced_partitions,
    fixed_partitions as fixed_partitions,
    get_group_balanced_partitions as get_group_balanced_partitions,
    get_seqlen_balanced_partitions as get_seqlen_balanced_partitions,
)
from .provenance import Provenance as Provenance
from .structure import PADDING as PADDING

if TYPE_CHECKING:
    from ._checked import checked as checked
    from ._concat import concat as concat
    from ._jagged import Jagged as Jagged, validate_jagged as validate_jagged
    from ._layouts import (
        from_packed as from_packed,
        from_padded as from_padded,
        to_packed as to_packed,
        to_padded as to_padded,
    )
    from ._permutation import (
        flatten_partitions as flatten_partitions,
        inverse_permutation as inverse_permutation,
    )
    from ._postprocess import postprocess_batch as postprocess_batch
    from ._provenance import split_with_provenance as split_with_provenance
    from ._restore import restore as restore, split as split
    from ._take import take as take

# The names that need JAX, imported on first use (PEP 562) so that `import ref` stays JAX-free.
_LAZY = {
    "Jagged": "._jagged",
    "validate_jagged": "._jagged",
    "checked": "._checked",
    "concat": "._concat",
    "take": "._take",
    "inverse_permutation": "._permutation",
    "flatten_partitions": "._permutation",
    "restore": "._restore",
    "split": "._restore",
    "postprocess_batch": "._postprocess",
    "split_with_provenance": "._provenance",
    "from_packed": "._layouts",
    "to_packed": "._layouts",
    "to_padded": "._layouts",
    "from_padded": "._layouts",
}

__all__ = sorted(
    [
        *_LAZY,
        "errors",
        "metrics",
        "partition",
        "structure",
        "provenance",
        "Provenance",
        "PADDING",
        "balanced_partitions",
        "fixed_partitions",
        "get_group_balanced_partitions",
        "get_seqlen_balanced_partitions",
        "append_to_dict",
        "fold_metrics",
        "merge_metrics",
        *(n for n in errors.__all__ if n != "where"),
    ]
)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ref' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
