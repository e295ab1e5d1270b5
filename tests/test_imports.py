"""Import boundaries: production never pulls in JAX; the reference never pulls in torch (but in interop)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECKS = {
    "torch_impl_without_jax": "import torch_impl, sys; assert 'jax' not in sys.modules",
    "torch_impl_without_a_trainer": (
        "import sys, torch_impl, torch_impl.integrations.verl, torch_impl.integrations.areal, "
        "torch_impl.integrations.skyrl; "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('verl', 'areal', 'skyrl', 'jax')); "
        "assert not loaded, loaded"
    ),
    "verl_plugin_on_imports_no_verl": (  # verl's plugin (rebatch_startup.verl), imported mid-import by verl
        "import os, sys, importlib.metadata as md; os.environ['REBATCH_VERL'] = 'on'; "
        # verl absent here
        "real = md.version; md.version = lambda name: '0.9.1' if name == 'verl' else real(name); "
        "import rebatch_startup.verl; "
        "from torch_impl.integrations import verl; assert verl.installed(); "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'verl'); assert not loaded, loaded"
    ),
    "ref_without_torch": "import ref, sys; assert 'torch' not in sys.modules",
    "ref_errors_without_jax_or_torch": (
        "import ref.errors, sys; assert 'jax' not in sys.modules and 'torch' not in sys.modules"
    ),
    "ref_functions_without_torch": (
        "import ref, sys; ref.restore(ref.Jagged.from_rows([[1.0], [2.0, 3.0]]), [[1, 0]]); "
        "assert 'torch' not in sys.modules"
    ),
    "interop_brings_torch": "import ref.interop, sys; assert 'torch' in sys.modules",
}


@pytest.mark.parametrize("code", CHECKS.values(), ids=CHECKS.keys())
def test_import_boundary(code: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_torch_impl_raises_ref_error_classes() -> None:
    import torch_impl
    from ref import errors

    assert torch_impl.errors is errors
    assert issubclass(errors.RebatchError, ValueError)
