"""Test-session set-up shared by ``tests/`` and ``property_tests/``.

- JAX sees two CPU devices (set before JAX starts), so device mismatches can be tested in ``ref``.
- Hypothesis profiles: ``dev`` (quick), ``ci`` (derandomized, no deadline, ``print_blob=True``) and
  ``fuzz`` (many examples). Choose with ``--hypothesis-profile NAME`` or the environment variable
  ``REBATCH_HYPOTHESIS_PROFILE``; the default is ``ci``, so the README's test command and CI run the same.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

from property_tests.profiles import register_profiles

register_profiles()
