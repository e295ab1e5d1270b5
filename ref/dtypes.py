"""Dtype facts shared by both implementations (pure Python: no JAX, no torch).

Exact comparison and exact data movement both treat a float as the integer of its bit pattern: the
integer type of the same width is named here once, for JAX (`ref._bits`) and torch (the testing kit's
bit comparison) alike. Signed and unsigned integers move and compare bits the same way.
"""

from __future__ import annotations

from .errors import UnsupportedSettingError

__all__ = ["BITS_DTYPE", "bits_dtype"]

#: The integer dtype (by name, the same in JAX, NumPy and torch) whose items are as wide as a dtype's
#: items, by item size in bytes.
BITS_DTYPE: dict[int, str] = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def bits_dtype(itemsize: int, *, dtype: object = None) -> str:
    """The name of the integer dtype of ``itemsize`` bytes (`UnsupportedSettingError` for other widths)."""
    try:
        return BITS_DTYPE[itemsize]
    except KeyError:
        what = f"dtype {dtype} " if dtype is not None else ""
        raise UnsupportedSettingError(
            f"{what}has {itemsize}-byte items; supported widths: {sorted(BITS_DTYPE)}"
        ) from None
