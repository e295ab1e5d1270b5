"""Calls to ``ref`` and ``torch_impl`` on the same torch-built inputs, results compared in torch."""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "outputs_to_ref",
    "provenance_for",
    "ref_postprocess",
    "result_to_torch",
    "to_ref",
    "torch_postprocess",
]


def to_ref(tree: Any) -> Any:
    """``tree`` with tensors converted by ``ref.interop.from_torch``; a tensor on the ``meta`` device
    (the stand-in for "another device" in torch-built inputs) becomes a JAX array on JAX's second device."""
    import jax
    import jax.numpy as jnp

    from ref import interop

    if isinstance(tree, torch.Tensor) and tree.device.type == "meta":
        import ref

        other = jax.devices()[-1]
        dtype = str(tree.dtype).removeprefix("torch.")
        with jax.enable_x64(True):
            if tree.is_nested:  # same rows and trailing shape, all of length 0
                values = jnp.zeros((0, *tree.shape[2:]), dtype=dtype)
                offsets = jnp.zeros((tree.size(0) + 1,), dtype=jnp.int64)
                return ref.Jagged(jax.device_put(values, other), jax.device_put(offsets, other))
            return jax.device_put(jnp.zeros(tuple(tree.shape), dtype=dtype), other)
    if isinstance(tree, torch.Tensor):
        return interop.from_torch(tree)
    if isinstance(tree, dict):
        return {k: to_ref(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_ref(v) for v in tree)
    return tree


def outputs_to_ref(output_lst: Any) -> Any:
    """``ref.interop.outputs_from_torch``, with ``meta`` tensors moved as `to_ref` does."""
    from ref import interop

    if not isinstance(output_lst, (list, tuple)):
        return output_lst
    staged = []
    for o in output_lst:
        if isinstance(o, dict) and isinstance(o.get("model_output"), dict):
            mo = {
                k: to_ref(v) if isinstance(v, torch.Tensor) and v.device.type == "meta" else v
                for k, v in o["model_output"].items()
            }
            o = {**o, "model_output": mo}
        staged.append(o)
    return interop.outputs_from_torch(staged)


def provenance_for(impl: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's keywords with its split's provenance (a `property_tests.defects.SplitProvenance`, where the
    call has one) in the form ``impl`` (``"ref"`` or ``"torch_impl"``) takes: ``ref.Provenance`` of the
    split's rows, or ``torch_impl.recorded(data)``, the record rebatch's split made."""
    from .defects import SplitProvenance

    given = kwargs.get("provenance")
    if not isinstance(given, SplitProvenance):
        return kwargs
    return {**kwargs, "provenance": given.for_ref() if impl == "ref" else given.for_torch()}


def result_to_torch(result: Any) -> Any:
    from ref import interop

    return interop.tree_to_torch(result)


def ref_postprocess(
    output_lst: Any,
    indices: Any,
    *,
    use_dynamic_bsz: Any = True,
    pad_mode: Any = "no_padding",
    **witness: Any,
) -> Any:
    """``ref.postprocess_batch`` on torch-built inputs (converted inside the call), result as torch;
    ``witness=`` and ``provenance=`` (``ref``'s form: `provenance_for`) passed on where given."""
    import ref

    out = ref.postprocess_batch(
        outputs_to_ref(output_lst), indices, use_dynamic_bsz=use_dynamic_bsz, pad_mode=pad_mode, **witness
    )
    return result_to_torch(out)


def torch_postprocess(
    output_lst: Any,
    indices: Any,
    *,
    use_dynamic_bsz: Any = True,
    pad_mode: Any = "no_padding",
    **witness: Any,
) -> Any:
    import torch_impl

    return torch_impl.postprocess_batch(
        output_lst, indices, use_dynamic_bsz=use_dynamic_bsz, pad_mode=pad_mode, **witness
    )
