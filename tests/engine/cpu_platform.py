"""A ``cpu`` platform for verl 0.9.1, registered through verl's own extension point
(`verl.plugin.platform`: ``PlatformRegistry.register`` and ``set_platform``), so verl's FSDP engine runs
on a machine without an accelerator.

verl 0.9.1 ships nvidia, huawei and amd platforms and falls back to nvidia (device ``cuda``) when none
is found; this one answers device ``cpu``, the ``gloo`` communication backend and a device module whose
memory queries return 0 and which has ``get_device_name()`` (the MFU metric,
``verl/utils/flops_counter.py``, calls it). `use` must run before verl's engine modules are imported:
``verl/workers/engine/fsdp/transformer_impl.py`` reads the device name at import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

__all__ = ["use"]


class _CpuDevice(ModuleType):
    """``torch.cpu`` with what verl asks of an accelerator's module: memory queries (0), cache and
    allocator calls (nothing to do), a name and a seed."""

    def __init__(self) -> None:
        super().__init__("verl_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    def get_device_name(self, device: Any = None) -> str:
        return "CPU"

    def memory_allocated(self, device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return 0, 0

    def empty_cache(self) -> None:
        return None

    def ipc_collect(self) -> None:
        return None

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        return None

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def set_device(self, device: Any) -> None:
        return None

    def current_device(self) -> str:
        return "cpu"


# Complex by design: one override for each method verl asks of a platform.
def _platform_class() -> type:  # noqa: C901
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    device = _CpuDevice()

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):  # type: ignore[misc]
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = device

        def is_available(self) -> bool:
            return True

        def current_device(self) -> Any:
            return "cpu"  # verl moves tensors and modules to get_device_id(): 0 would mean cuda:0

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    return PlatformCPU


def use() -> None:
    """Register the ``cpu`` platform and make it verl's platform for this process."""
    from verl.plugin.platform import set_platform

    set_platform(_platform_class()())
