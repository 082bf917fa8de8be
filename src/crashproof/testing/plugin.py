"""The pytest plugin crashproof registers (entry point ``pytest11``: ``crashproof``).

It adds one fixture, ``crashproof_verify``: ``crashproof.testing.assert_recovery_equivalent``.
Nothing is imported from crashproof until a test asks for it, so installing crashproof costs
other test suites nothing.

::

    def test_recovery(crashproof_verify):
        crashproof_verify(SCENARIO, mode="subprocess", max_points=20)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from crashproof.verify.report import Report

__all__ = ["crashproof_verify"]


@pytest.fixture
def crashproof_verify() -> Callable[..., Report]:
    """``assert_recovery_equivalent(scenario, mode="inproc", seed=0, max_points=None)``:
    crash the scenario at every crash point and fail with the crash matrix if any DIVERGED."""
    from crashproof.testing import assert_recovery_equivalent

    verify: Callable[..., Any] = assert_recovery_equivalent
    return verify
