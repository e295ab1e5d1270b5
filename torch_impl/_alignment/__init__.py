"""The alignment core: every rule that proves a restore put each row back where it came from, once.

The trainers' adapters read a call into the core's form (the indices, each micro-batch's rows, the rows'
lengths where the trainer has them, the identities its outputs carry) and call these:

- the switch (`witness_config`, `set_witness`: ``REBATCH_WITNESS``), read by every check below;
- the alignment witness (`Witness` for a call's planned keys, `RowWitness` for lengths the host reads,
  `misaligned_row` for the error of either; the binding rule `witness_binds` and the words are
  `ref.structure`'s, shared with ``ref``), and `read_witness`, verl's witness;
- the split record and its lookup (`record`, `record_handout`, `recorded`, `Split`, `Record`) and the
  provenance judge (`Record.judge` for outputs that carry identities, `Record.judge_handout` for
  a split whose outputs carry none, `check_restore` for ``restore_dynamic_batch``);
- `locate`, the one reading of a flat position (`ref.structure`'s);
- the counters (`witness_stats`, `provenance_stats`).

``docs/spec.md`` states the rules ("The alignment witness", "Exact provenance"); ``docs/architecture.md``
draws the adapters onto this core.
"""

from __future__ import annotations

from ref.structure import locate as locate, witness_binds as witness_binds

from ._compare import (
    RowWitness as RowWitness,
    first_difference as first_difference,
    misaligned_row as misaligned_row,
)
from ._provenance import (
    MAX_BATCHES as MAX_BATCHES,
    MAX_SPLITS as MAX_SPLITS,
    UNRECORDED as UNRECORDED,
    ItemOrder as ItemOrder,
    Record as Record,
    Split as Split,
    check_restore as check_restore,
    named_by as named_by,
    observe_split as observe_split,
    provenance_stats as provenance_stats,
    record as record,
    record_handout as record_handout,
    recorded as recorded,
)
from ._switch import set_witness as set_witness, witness_config as witness_config
from ._witness import (
    Witness as Witness,
    keys_witnessed_here as keys_witnessed_here,
    read_witness as read_witness,
    witness_stats as witness_stats,
)

__all__ = [
    "MAX_BATCHES",
    "MAX_SPLITS",
    "UNRECORDED",
    "ItemOrder",
    "Record",
    "RowWitness",
    "Split",
    "Witness",
    "check_restore",
    "first_difference",
    "keys_witnessed_here",
    "locate",
    "misaligned_row",
    "named_by",
    "observe_split",
    "provenance_stats",
    "read_witness",
    "record",
    "record_handout",
    "recorded",
    "set_witness",
    "witness_binds",
    "witness_config",
    "witness_stats",
]
