"""`postprocess_batch`: verl's ``postprocess_batch_func`` as a specification."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ._concat import concat
from ._jagged import Jagged
from ._parts import check_invariants, check_parts, num_rows
from ._permutation import check_permutation
from ._provenance import check_provenance
from ._restore import restore
from ._witness import check_alignment
from ._x64 import exact
from .errors import PartitionMismatchError, ShapeMismatchError, where
from .metrics import fold_metrics
from .provenance import Provenance
from .structure import check_metrics, check_partition_count, check_settings, drop_padding, model_outputs

__all__ = ["postprocess_batch"]


@exact
def postprocess_batch(
    output_lst: Sequence[Mapping[str, Any]],
    indices: Sequence[Sequence[int]] | None,
    *,
    use_dynamic_bsz: bool = True,
    pad_mode: str = "no_padding",
    witness: Any = None,
    unbound: Collection[Any] = (),
    provenance: Provenance | Sequence[Provenance] | None = None,
) -> dict[str, Any]:
    """Put the outputs of micro-batches back together, in original sample order.

    ``output_lst[m]`` may hold ``model_output`` (a dict of `Jagged` ``[b_m, (j), *F]`` or dense
    ``[b_m, *F]``), ``loss`` and ``metrics``. ``indices[m]`` lists the original positions of
    micro-batch ``m``'s rows. With ``perm = [i for p in indices for i in p]``:

    - ``model_output[k] = restore(concat([o["model_output"][k] for o in output_lst]), indices)``, so
      row ``perm[n]`` of the result is row ``n`` of the concatenation (plain ``concat`` when
      ``use_dynamic_bsz`` is off);
    - ``loss = [o["loss"] for o in output_lst if "loss" in o]``;
    - ``metrics = fold_metrics([o["metrics"] for o in output_lst if "metrics" in o])``.

    Checked in this order, each check raising its `RebatchError` subclass: settings; outputs are dicts
    and carry the same keys; one partition per micro-batch; the partitions form a permutation; then per
    key: layout, dtype, device and trailing shape of every micro-batch, the dtype supported, every
    micro-batch's row count (against its partition, or without dynamic batching against the first
    key's), then every micro-batch's jagged invariants; last, with a ``witness`` (``[B]`` row lengths in
    original order, `ref.structure.witness_binds` deciding which keys it binds, ``unbound`` keys left
    out), every bound key's restored row lengths against it (`MisalignmentError`; ``docs/spec.md``,
    "The alignment witness"). With the split's ``provenance`` (`ref.provenance.Provenance`, or every
    live split of the batch restored), before the witness: each output's provenance
    (``output_lst[m]["provenance"]``: the rows it was computed on, bare or as a `ref.provenance.Carried`
    naming its split and batch) must be its slot's rows (``indices[m]``, or without dynamic batching the
    positions after the slots before it) and a micro-batch of that split, of the batch restored
    (`MisalignmentError`); where every output carries one, every key of the call is proven, dense keys
    included, whatever the lengths (``docs/spec.md``, "Exact provenance").
    Jagged results have int64 offsets.

    >>> lp = [Jagged.from_rows([[1.0], [2.0, 3.0]]), Jagged.from_rows([[4.0, 5.0, 6.0]])]
    >>> indices = [[2, 0], [1]]
    >>> out = postprocess_batch([{"model_output": {"lp": p}, "loss": m} for m, p in enumerate(lp)], indices)
    >>> joined = [r.tolist() for p in lp for r in p.rows()]
    >>> perm = [i for p in indices for i in p]
    >>> [r.tolist() for r in out["model_output"]["lp"].rows()] == [joined[perm.index(i)] for i in range(3)]
    True
    >>> out["loss"], str(out["model_output"]["lp"].offsets.dtype)
    ([0, 1], 'int64')
    >>> witness = [2, 3, 1]  # the batch's own row lengths, original order
    >>> [len(r) for r in out["model_output"]["lp"].rows()] == witness
    True
    >>> _ = postprocess_batch([{"model_output": {"lp": p}} for p in lp], indices, witness=witness)  # checked
    >>> same = [Jagged.from_rows([[1.0, 2.0]]), Jagged.from_rows([[3.0, 4.0]])]  # rows of one length
    >>> prov = Provenance(((1,), (0,)))  # what the split handed out; each output carries its own
    >>> outs = [{"model_output": {"lp": p}, "provenance": r} for p, r in zip(same, prov.rows)]
    >>> _ = postprocess_batch(outs, [[1], [0]], provenance=prov)  # proven, whatever the lengths
    >>> postprocess_batch(outs[::-1], [[1], [0]], provenance=prov)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ref.errors.MisalignmentError: key 'lp', micro-batch 0: this output holds micro-batch 1's rows of ...
    """
    use_dynamic_bsz = check_settings(use_dynamic_bsz, pad_mode, indices)
    output_lst, indices = drop_padding(output_lst, indices)
    outs = model_outputs(output_lst)
    check_metrics(output_lst)
    if use_dynamic_bsz:
        check_partition_count(indices, len(outs))
        check_permutation(indices, sum(len(list(p)) for p in indices))

    model_output: dict[str, Any] = {}
    for key in outs[0] if outs else ():
        parts = check_parts(
            [mo[key] for mo in outs], key, allow_jagged=pad_mode == "no_padding", invariants=False
        )
        for m, part in enumerate(parts):
            if use_dynamic_bsz:
                expected = len(list(indices[m]))
                if num_rows(part) != expected:
                    raise PartitionMismatchError(
                        f"{where(key, m)}{num_rows(part)} rows, but its partition has {expected} indices"
                    )
            else:
                first_key = next(iter(outs[0]))
                expected = num_rows(outs[m][first_key])
                if num_rows(part) != expected:
                    raise ShapeMismatchError(
                        f"{where(key, m)}{num_rows(part)} rows, but key {first_key!r} has {expected} there"
                    )
        check_invariants(parts, key)
        joined = concat(parts, key=key)
        model_output[key] = restore(joined, indices) if use_dynamic_bsz else joined

    if use_dynamic_bsz:
        sizes = [len(list(p)) for p in indices]
        slots = list(indices)
    else:
        sizes = [num_rows(mo[next(iter(outs[0]))]) for mo in outs] if outs else []
        starts = itertools.accumulate(sizes, initial=0)
        slots = [list(range(start, start + n)) for start, n in zip(starts, sizes, strict=False)]
    if provenance is not None and model_output:
        named = next((k for k, v in model_output.items() if isinstance(v, Jagged)), next(iter(outs[0])))
        check_provenance(output_lst, slots, provenance, named)
    if witness is not None and model_output:
        perm = [int(i) for p in indices for i in p] if use_dynamic_bsz else list(range(sum(sizes)))
        check_alignment(model_output, witness, perm, sizes, unbound)

    losses = [o["loss"] for o in output_lst if "loss" in o]
    metrics = fold_metrics(o["metrics"] for o in output_lst if "metrics" in o)
    return {"model_output": model_output, "loss": losses, "metrics": metrics}
