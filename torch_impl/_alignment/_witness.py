"""The alignment witness in torch: every bound key's restored row lengths against the batch's own.

Step 6 of the order of checks (``docs/spec.md``, "The alignment witness"); the binding rule and the
error's words are `ref.structure`'s, shared with ``ref``. A call builds one `Witness` after its other
checks; each key's plan hands it the restored row lengths (`Witness.observe`), and the call asks for
its `Witness.verdict` once every key is planned, before any data moves: on an accelerator every key's
flag in one small read, one host-device synchronisation a call. Keys whose parts share their offsets
tensors (verl's engines' per-token outputs) are compared once.

Whether the drop-ins read a witness at all is a process-wide switch (`set_witness`, ``REBATCH_WITNESS``),
never a per-thread `torch_impl.Settings` knob: it decides whether an input is refused, not how fast.
`witness_stats` counts what was witnessed, and every check skipped by reason (`_tally`: zeroed in a forked
child).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import torch

from ref._torch_private import ragged_idx, raw_lengths, raw_offsets
from ref.errors import RebatchError, UnsupportedSettingError, where
from ref.structure import WITNESS, check_lengths, witness_binds, witness_form

from .._parts import NestedTensor, check_offsets, explain_bad_offsets
from .._plan import KeyPlan
from .._tally import TALLY, skipped
from ._compare import first_difference, misaligned_row
from ._provenance import provenance_stats
from ._switch import witness_config

__all__ = ["Witness", "keys_witnessed_here", "read_witness", "witness_stats"]


def witness_stats(reset: bool = False) -> dict[str, int]:
    """What the witness checked in this process (a forked child: its own calls): ``calls`` (calls given a
    witness), ``calls_binding_nothing`` (given one, no key bound: it checked nothing), ``keys_witnessed``
    and ``keys_unbound`` (over all calls), each check skipped, by reason (`_tally.SKIPS`:
    ``calls_without_witness``, drop-in calls whose input held no lengths to witness, ...); and exact
    provenance's counters, prefixed ``provenance_`` (`torch_impl._provenance.provenance_stats`)."""
    out = TALLY.read(reset)
    # what exact provenance proved, beside the witness (``provenance_*``)
    out.update({f"provenance_{k}": v for k, v in provenance_stats(reset).items()})
    return out


_here = threading.local()  # ``keys``: the keys witnessed by this thread (`keys_witnessed_here`)


def keys_witnessed_here() -> int:
    """The keys the witness has witnessed in calls made by this thread (a call's count is the difference
    of two reads around it: `torch_impl.integrations._counts`)."""
    return int(getattr(_here, "keys", 0))


def _count_call(bound: int, left: int) -> None:
    """One witnessed call: ``bound`` keys witnessed, ``left`` left unbound (one lock of `TALLY`: it runs
    in every call)."""
    _here.keys = getattr(_here, "keys", 0) + bound
    with TALLY.lock:
        counts = TALLY.counts
        counts["calls"] += 1
        counts["keys_witnessed"] += bound
        counts["keys_unbound"] += left
        if not bound:
            counts["calls_binding_nothing"] += 1


def read_witness(data: Any) -> np.ndarray | torch.Tensor | None:
    """verl's witness: the row lengths ``[B]`` of ``data["input_ids"]`` if a jagged nested tensor (a
    NumPy array on the CPU), read without torch's nested-tensor dispatch; None (counted) where there is
    none: no ``data``, no ``input_ids``, a dense one (counted: ``calls_without_witness``), ``data`` whose
    ``get`` raises (counted: ``skipped_unreadable_witness``), or the switch off."""
    if not witness_config()[0]:
        return None
    ids = None
    if data is not None:
        try:
            ids = data.get("input_ids", None)
        except (AttributeError, TypeError, KeyError):  # not a mapping: the call goes unwitnessed, counted
            skipped("skipped_unreadable_witness")
            return None
    if not isinstance(ids, NestedTensor) or ragged_idx(ids) != 1:
        skipped("calls_without_witness")
        return None
    lengths, offsets = raw_lengths(ids), raw_offsets(ids)  # plain attributes: no nested-tensor dispatch
    if lengths is not None:
        return lengths.numpy() if lengths.is_cpu else lengths
    if offsets.is_cpu:
        o = offsets.numpy()
        return o[1:] - o[:-1]
    return offsets.diff()


class Witness:
    """One call's witness: ``witness`` ``[rows]`` (a list, a NumPy array or a tensor), ``perm`` (the
    call's checked permutation as a CPU tensor, or None: in order), ``sizes`` (each micro-batch's row
    count), ``unbound`` (keys left out).

    Its form is checked here but a defect of it (step 6a) is raised by `verdict`, after every key's
    structural checks (step 5, which the plan makes key by key), as ``docs/spec.md`` orders them."""

    def __init__(
        self,
        witness: Any,
        rows: int,
        perm: torch.Tensor | None,
        sizes: Sequence[int],
        unbound: Collection[Any],
    ) -> None:
        self.rows = rows
        self.unbound = unbound
        self._perm = perm
        self._sizes = sizes  # read on the error path only
        self.device: torch.Tensor | None = None  # the witness where it lives off the CPU (values unread)
        self.host: np.ndarray | None = None
        self._error: RebatchError | None = None  # a defect of the witness's form: raised by `verdict`
        self._on: dict[torch.device, torch.Tensor] = {}
        self._compared: set[tuple[int, ...]] = set()  # the offsets tensors of the keys compared
        #: each compared key in order: (its plan, host failure row or -1, device flag or None)
        self._entries: list[tuple[KeyPlan, int, torch.Tensor | None]] = []
        self._flags = 0  # entries compared on a device (their flag read by `verdict`)
        self.bound = 0
        self.left = 0
        self.bound_keys: list[Any] = []  # the keys it binds, in order (their lengths are its, once judged)
        try:
            self.total = self._take(witness, rows)
        except RebatchError as err:
            self._error = err
            self.total = None

    def _take(self, witness: Any, rows: int) -> int | None:
        """Keep ``witness`` where it lives (an int64 NumPy array on the host, or a tensor off the CPU,
        values unread); its total (None off the CPU)."""
        if isinstance(witness, torch.Tensor) and witness.device.type != "cpu":
            witness_form(witness, rows)
            self.device = witness.to(torch.int64)
            return None
        if (
            isinstance(witness, np.ndarray)
            and witness.ndim == 1
            and witness.dtype == np.int64
            and len(witness) == rows
        ):
            host = witness
        elif isinstance(witness, torch.Tensor | np.ndarray):
            witness_form(witness, rows)
            host = witness.detach().numpy() if isinstance(witness, torch.Tensor) else witness
        else:
            host = np.asarray(check_lengths(witness, rows=rows, name=WITNESS), dtype=np.int64)
        self.host = _nonnegative(host.astype(np.int64, copy=False), rows)
        return int(np.add.reduce(self.host))

    def _binds(self, key: Any, values: int) -> bool:
        """`witness_binds` for a jagged key (on an accelerator: not unbound; its total compared there)."""
        if self.total is None:
            return key not in self.unbound
        return witness_binds(key, True, values, self.total, self.unbound)

    def known(self, key: Any, values: int) -> np.ndarray | None:
        """The restored row lengths the host knows for a jagged key of ``values`` values: the witness's
        own where it is on the host, well formed, and binds the key (`torch_impl._plan.plan_key` plans
        such a key off the CPU from them, and `observe` then compares its offsets with theirs)."""
        if self._error is not None or self.host is None or not self._binds(key, values):
            return None
        return self.host

    def observe(self, plan: KeyPlan) -> None:
        """A planned key's restored row lengths ``[B]`` (original order) against the witness, where it
        binds the key; keys whose parts share offsets tensors once."""
        if self._error is not None:  # the call raises the witness's defect at its verdict
            return
        key, parts, restored = plan.key, plan.parts, plan.restored
        if restored is None or not self._binds(key, plan.total):
            self.left += 1
            return
        self.bound += 1
        self.bound_keys.append(key)
        offsets_ids = tuple([id(p.offsets) for p in parts])  # type: ignore[union-attr]  # jagged parts
        if offsets_ids in self._compared:
            return
        self._compared.add(offsets_ids)
        if plan.expected is not None:  # planned from the witness's lengths: the parts' offsets must be theirs
            offsets = [p.offsets for p in parts]  # type: ignore[union-attr]  # jagged parts
            flat = torch.cat(offsets) if len(offsets) > 1 else offsets[0]
            self._entries.append((plan, -1, flat.ne(plan.expected).any()))
            self._flags += 1
            return
        if restored.device.type != "cpu":
            want = self._on_device(restored.device)
            flag = restored.ne(want).any()
            if self.total is None:  # the binding rule's total, on the device too
                flag = flag & want.sum().eq(plan.total)
            self._entries.append((plan, -1, flag))
            self._flags += 1
            return
        if (
            self.device is not None and self.device.device.type == "meta"
        ):  # host lengths, no values to compare
            self._error = UnsupportedSettingError(
                f"{where(key)}the {WITNESS} are on the meta device, which holds no values to compare with "
                "this key's row lengths on the CPU"
            )
            return
        try:
            host = self._host_array()
        except (
            RebatchError
        ) as err:  # a negative length of a witness read from a device: step 6a, at the verdict
            self._error = err
            return
        got = (
            restored.numpy() if plan.arrays is None else plan.arrays[1]
        )  # the plan's own array, where it has one
        bad = first_difference(got, host)
        self._entries.append((plan, bad, None))

    def verdict(self) -> None:
        """Raise `MisalignmentError` for the first compared key (in order) with a mismatch: every device
        flag read at once (one synchronisation); counts the call (`witness_stats`). First, a defect of
        the witness itself (step 6a): its form, or a negative length."""
        if self._error is not None:
            raise self._error
        _count_call(self.bound, self.left)
        read: list[bool] = []
        flags = [f for _, _, f in self._entries if f is not None]
        if flags:
            if len(flags) == 1 and flags[0].device.type != "meta":
                read = [bool(flags[0])]  # one flag: one read, nothing stacked
            elif len({f.device for f in flags}) == 1:
                stacked = torch.stack(flags)
                # on ``meta`` nothing can be read: the comparison is launched (counted), never judged
                read = (
                    [False] * len(flags)
                    if stacked.device.type == "meta"
                    else [bool(v) for v in stacked.tolist()]
                )
            else:
                read = [f.device.type != "meta" and bool(f.item()) for f in flags]
        it = iter(read)
        for plan, bad, flag in self._entries:
            if flag is not None and not next(it):
                continue
            if flag is None and bad < 0:
                continue
            lengths = _restored(plan)  # the error path from here
            if flag is not None:
                got, want = lengths.tolist(), self._want().tolist()  # reads the device
                bad = first_difference(got, want)
                if (
                    bad < 0
                ):  # the lengths agree, so the offsets themselves are broken (planned from the host's)
                    explain_bad_offsets(plan.parts, plan.key)  # type: ignore[arg-type]  # jagged parts
            if bad >= 0:
                self._raise(plan.key, lengths, bad)

    def _raise(self, key: Any, lengths: torch.Tensor, i: int) -> None:
        raise misaligned_row(key, i, int(lengths[i]), int(self._want()[i]), self._perm, self._sizes)

    def _want(self) -> Any:
        return self.device if self.device is not None else self._host_array()

    def _host_array(self) -> np.ndarray:
        """The witness on the host as an int64 array (read once from the device where it came so)."""
        if self.host is None:
            if self.device is None:  # `__init__` keeps one of the two forms, or an error: a bug here
                raise RuntimeError("rebatch internal error: the witness kept no values")
            self.host = _nonnegative(self.device.cpu().numpy(), self.rows)
        return self.host

    def _on_device(self, device: torch.device) -> torch.Tensor:
        want = self._on.get(device)
        if want is None:
            source = self.device if self.device is not None else torch.from_numpy(self._host_array())
            want = source.to(device, non_blocking=source.is_cpu)  # a download blocks: read at once
            self._on[device] = want
        return want


def _restored(plan: KeyPlan) -> torch.Tensor:
    """A compared key's restored row lengths as its parts' offsets give them: the plan's own, or where it
    was planned from the witness's lengths, its parts' read from their offsets (the error path only)."""
    if plan.expected is None:
        assert plan.restored is not None
        return plan.restored
    lengths = check_offsets(plan.parts)  # type: ignore[arg-type]  # jagged parts
    perm = plan.rows.perm
    return lengths if perm is None else lengths.index_select(0, plan.rows.inverse_on(lengths.device))


def _nonnegative(host: np.ndarray, rows: int) -> np.ndarray:
    """``host`` (the witness's lengths), or `check_lengths`' error naming its first negative one."""
    if host.size and np.minimum.reduce(host) < 0:  # the ufunc itself: no Python wrapper
        check_lengths(host, rows=rows, name=WITNESS)  # raises
    return host
