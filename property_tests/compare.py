"""Bit-exact comparison of results: tensors (jagged or dense), losses and metrics (`torch_impl._compare`,
which verl's shadow mode uses too)."""

from __future__ import annotations

from torch_impl._compare import assert_same, bits, first_difference, same_tensor

__all__ = ["bits", "same_tensor", "assert_same", "first_difference"]
