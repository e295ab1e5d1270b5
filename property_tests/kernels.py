"""Every kernel of ``torch_impl``'s registry, as the settings that force it (for tests and properties).

``torch_impl`` chooses a kernel per key by device, autograd, layout and size (`torch_impl._kernels.choose`,
``docs/kernels.md``); small test inputs would otherwise only ever take the default ones. `KERNELS` is
built from the registry (`torch_impl.KERNELS`): each kernel forced by name, and each chunked
kernel also with chunks of one and of a few value rows (so a chunk starts and ends inside rows); each
kernel that runs on every device also after the accelerator's plan (``plan_on_device``), which the
CPU's values check bit for bit. A
kernel added to the registry is tested by every test that iterates this table.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch_impl

__all__ = ["ANYWHERE", "KERNELS", "forced"]

#: A chunk of one value row (1 byte: one value row whatever its size).
_ONE = {"index_chunk_bytes": 1}
#: 12 bytes a chunk: 3 float32 value rows, 6 bfloat16, 1 of a [b, (j), 3] float32 key.
_FEW = {"index_chunk_bytes": 12}
#: Every jagged key planned as on an accelerator (`torch_impl._devplan`), here on the CPU's values.
_ON_DEVICE = {"plan_on_device": True}
#: Where the kernels that run on every device apply (``concat``'s: everywhere).
_ALWAYS = torch_impl.KERNELS["concat"].applies


def _table() -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for name, kernel in torch_impl.KERNELS.items():
        table[name] = {"kernel": name}
        if kernel.chunked:
            table[f"{name}_one_value_per_chunk"] = {"kernel": name, **_ONE}
            table[f"{name}_few_values_per_chunk"] = {"kernel": name, **_FEW}
        if kernel.applies is _ALWAYS:  # it runs off the CPU: also after the accelerator's plan
            table[f"{name}_planned_on_device"] = {"kernel": name, **_ON_DEVICE}
            if kernel.chunked:
                table[f"{name}_few_values_per_chunk_planned_on_device"] = {
                    "kernel": name,
                    **_FEW,
                    **_ON_DEVICE,
                }
    return table


#: case -> the `torch_impl.Settings` fields that force it
KERNELS: dict[str, dict[str, Any]] = _table()


#: The cases whose kernel runs on every key it serves (the others, the host kernels, raise
#: `ref.errors.UnsupportedSettingError` where forced on a key they cannot move: off the CPU, a gradient).
ANYWHERE = frozenset(
    case for case, s in KERNELS.items() if torch_impl.KERNELS[s["kernel"]].applies is _ALWAYS
)


@contextlib.contextmanager
def forced(path: str) -> Iterator[None]:
    """Within the block, ``torch_impl`` takes ``path`` for every key it serves (its layout, permuting or
    not; on the calling thread): where it cannot move one, the call raises (never another kernel)."""
    with torch_impl.use_settings(**KERNELS[path]):
        yield
