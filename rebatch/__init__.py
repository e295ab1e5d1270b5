"""rebatch, the tool: the ``rebatch`` command (check, bench, fuzz), the embedded RL step it checks, and
the benchmark harness. It may import all three libraries (`property_tests`, `torch_impl`, `ref`); none of
them imports it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rebatch")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
