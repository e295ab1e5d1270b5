"""The defects of ``postprocess_batch``'s structure: an output not a dict, a missing ``model_output``, a key
missing or extra in a micro-batch, and one partition too many."""

from __future__ import annotations

from ref import errors as E

from ._core import POSTPROCESS, TWO_MICRO_BATCHES, Call, Chooser, Defect, keys_of, model_output_of

__all__ = ["STRUCTURE"]


def _not_a_dict(call: Call, choose: Chooser) -> Call:
    outs = call.args[0]
    m = choose.choice(range(len(outs)))
    outs[m] = list(outs[m])
    return call


def _missing_model_output(call: Call, choose: Chooser) -> Call:
    del call.args[0][choose.choice(range(1, len(call.args[0])))]["model_output"]
    return call


def _missing_key(call: Call, choose: Chooser) -> Call:
    key = choose.choice(keys_of(call))
    del model_output_of(call, choose.choice(range(1, len(call.args[0]))))[key]
    return call


def _extra_key(call: Call, choose: Chooser) -> Call:
    """A key present in micro-batch ``m >= 1`` only (left out of every other micro-batch)."""
    key = choose.choice(keys_of(call))
    keep = choose.choice(range(1, len(call.args[0])))
    for m in range(len(call.args[0])):
        if m != keep:
            del model_output_of(call, m)[key]
    return call


def _extra_partition(call: Call, choose: Chooser) -> Call:
    call.args[1].append([])
    return call


STRUCTURE: tuple[Defect, ...] = (
    Defect(
        "output_not_a_dict",
        POSTPROCESS,
        E.UnsupportedSettingError,
        r"micro-batch 0: an output must be a dict",
        "nothing",
        _not_a_dict,
    ),
    Defect(
        "missing_model_output",
        POSTPROCESS,
        E.KeyMismatchError,
        r"key 'model_output', micro-batch 1: missing",
        TWO_MICRO_BATCHES,
        _missing_model_output,
    ),
    Defect(
        "missing_key",
        POSTPROCESS,
        E.KeyMismatchError,
        r"key 'v', micro-batch 1: missing",
        TWO_MICRO_BATCHES,
        _missing_key,
        script=(1,),
    ),
    Defect(
        "extra_key",
        POSTPROCESS,
        E.KeyMismatchError,
        r"key 'v', micro-batch 1: present",
        TWO_MICRO_BATCHES,
        _extra_key,
        script=(1,),
    ),
    # -- partition count
    Defect(
        "too_many_partitions",
        POSTPROCESS,
        E.PartitionMismatchError,
        r"3 partitions for 2 micro-batches",
        "a key",
        _extra_partition,
    ),
)
