"""rebatch's reference specification in JAX: how micro-batch outputs are joined and put back in order.

Pure functions, no global state; each docstring gives its meaning as a Python list expression.
``import ref`` imports neither torch nor, until a function is used, JAX: `ref.errors` is pure Python
so that the production package `torch_impl` can raise the same errors without JAX. Only
`ref.interop` imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import errors as errors
from ._structure import PADDING as PADDING
from .errors import (
    DeviceMismatchError as DeviceMismatchError,
)
from .errors import (
    DtypeMismatchError as DtypeMismatchError,
)
from .errors import (
    InvalidJaggedError as InvalidJaggedError,
)
from .errors import (
    KeyMismatchError as KeyMismatchError,
)
from .errors import (
    NotAPermutationError as NotAPermutationError,
)
from .errors import (
    OutputMismatchError as OutputMismatchError,
)
from .errors import (
    PartitionMismatchError as PartitionMismatchError,
)
from .errors import (
    RebatchError as RebatchError,
)
from .errors import (
    RowIndexError as RowIndexError,
)
from .errors import (
    ShapeMismatchError as ShapeMismatchError,
)
from .errors import (
    TokenBudgetError as TokenBudgetError,
)
from .errors import (
    UnsupportedSettingError as UnsupportedSettingError,
)

if TYPE_CHECKING:
    from ._concat import concat as concat
    from ._jagged import Jagged as Jagged
    from ._jagged import validate_jagged as validate_jagged
    from ._metrics import append_to_dict as append_to_dict
    from ._partition import balanced_partitions as balanced_partitions
    from ._permutation import flatten_partitions as flatten_partitions
    from ._permutation import inverse_permutation as inverse_permutation
    from ._postprocess import postprocess_batch as postprocess_batch
    from ._restore import restore as restore
    from ._restore import split as split
    from ._take import take as take

# The JAX-backed names, imported on first use (PEP 562) so that `import ref.errors` stays JAX-free.
_LAZY = {
    "Jagged": "._jagged",
    "validate_jagged": "._jagged",
    "concat": "._concat",
    "take": "._take",
    "inverse_permutation": "._permutation",
    "flatten_partitions": "._permutation",
    "restore": "._restore",
    "split": "._restore",
    "append_to_dict": "._metrics",
    "postprocess_batch": "._postprocess",
    "balanced_partitions": "._partition",
}

__all__ = sorted([*_LAZY, "errors", "PADDING", *(n for n in errors.__all__ if n != "where")])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ref' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
