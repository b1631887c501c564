"""Shared test configuration: hypothesis profiles.

``ci`` (selected by ``HYPOTHESIS_PROFILE=ci``, as ``make test`` does) runs at
least 2,000 examples per property; ``dev`` runs a quick 200.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=2_000, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
