"""Dtype facts shared by both implementations (pure Python: no JAX, no torch).

Exact comparison and exact data movement both treat a float as the integer of its bit pattern: the
integer type of the same width is named here once, for JAX (`ref._bits`) and torch (the testing kit's
bit comparison) alike. Signed and unsigned integers move and compare bits the same way.
"""

from __future__ import annotations

from .errors import UnsupportedSettingError

__all__ = ["BITS_DTYPE", "NO_GRADIENT", "SUPPORTED_DTYPES", "bits_dtype", "check_dtype"]

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


#: The dtypes rebatch moves, by name (the same in JAX, NumPy and torch where the framework has them):
#: bool, the integers and the floats (float8 variants included) of 1, 2, 4 or 8 bytes, moved bit for bit,
#: and complex64/complex128 (moved as values). Sub-byte (int4, uint1, float4), quantized and other
#: dtypes are refused (`UnsupportedSettingError`).
SUPPORTED_DTYPES: frozenset[str] = frozenset(
    {
        "bool",
        *(f"int{w}" for w in (8, 16, 32, 64)),
        *(f"uint{w}" for w in (8, 16, 32, 64)),
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e4m3b11fnuz",
        "float8_e4m3",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e3m4",
        "float8_e8m0fnu",
        "complex64",
        "complex128",
    }
)


#: The supported dtypes whose gradient rebatch cannot carry: the float8 variants, which torch cannot
#: index (their bits move as integers, `torch_impl._bits`), so a part of one that requires a gradient is
#: refused by every public function of both implementations (JAX's parts never require one).
NO_GRADIENT: frozenset[str] = frozenset(n for n in SUPPORTED_DTYPES if n.startswith("float8"))


def check_dtype(dtype: object, *, at: str = "", grad_at: str | None = None) -> None:
    """The one dtype rule of every public function of ``ref`` and ``torch_impl``: `UnsupportedSettingError`
    unless ``dtype`` (a JAX, NumPy or torch dtype, or its name) is one of `SUPPORTED_DTYPES`, and where a
    part requires a gradient (``grad_at``: its location, `ref.errors.where`; None: no part does, or
    gradients are off) unless the dtype is not in `NO_GRADIENT`; ``at`` is the location prefix of the
    message."""
    name = str(dtype).removeprefix("torch.")
    if name not in SUPPORTED_DTYPES:
        raise UnsupportedSettingError(
            f"{at}dtype {name} is not supported: rebatch moves bool, integer, floating and complex dtypes "
            "of whole bytes (ref.dtypes.SUPPORTED_DTYPES)"
        )
    if grad_at is not None and name in NO_GRADIENT:
        raise UnsupportedSettingError(
            f"{grad_at}dtype {name} requires a gradient, which rebatch cannot carry: torch has no indexing "
            "kernels for it and moves it as the integers of its bits (detach it, or use another dtype)"
        )
