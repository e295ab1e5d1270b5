"""The defects of ``postprocess_batch``'s settings (``pad_mode``, ``use_dynamic_bsz``, ``indices``, padding
micro-batches): the first checks of ``docs/spec.md``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ref import errors as E
from ref.structure import PADDING

from ._core import POSTPROCESS, Breaker, Call, Chooser, Defect

__all__ = ["SETTINGS"]


def _setting(name: str, options: Sequence[Any]) -> Breaker:
    def breaker(call: Call, choose: Chooser) -> Call:
        call.kwargs[name] = choose.choice(options)
        return call

    return breaker


def _indices_none(call: Call, choose: Chooser) -> Call:
    return call._replace(args=(call.args[0], None))


def _padding_without_output(call: Call, choose: Chooser) -> Call:
    outs, indices = call.args
    m = choose.choice(range(len(outs)))
    indices[m] = PADDING
    del outs[m]
    return call


SETTINGS: tuple[Defect, ...] = (
    Defect(
        "unknown_pad_mode",
        POSTPROCESS,
        E.UnsupportedSettingError,
        r"pad_mode must be one of .* got 'left'",
        "nothing",
        _setting("pad_mode", ["left", "bogus", "NO_PADDING", 0, None]),
    ),
    Defect(
        "use_dynamic_bsz_not_a_bool",
        POSTPROCESS,
        E.UnsupportedSettingError,
        r"use_dynamic_bsz must be a bool.*'False'",
        "nothing",
        _setting("use_dynamic_bsz", ["False", "True", "0", "yes"]),
    ),
    Defect(
        "indices_none",
        POSTPROCESS,
        E.UnsupportedSettingError,
        r"indices is None while use_dynamic_bsz is on",
        "nothing",
        _indices_none,
    ),
    Defect(
        "padding_without_its_output",
        POSTPROCESS,
        E.PartitionMismatchError,
        r"2 partitions \(padding included\) for 1 micro-batch outputs",
        "two micro-batches",
        _padding_without_output,
    ),
)
