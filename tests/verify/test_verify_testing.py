"""``crashproof.testing`` and its pytest plugin, as users' test suites use them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import verify_scenarios as sc

from crashproof.testing import assert_recovery_equivalent
from crashproof.verify import Report


def test_the_plugin_is_registered(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.has_plugin("crashproof")


def test_fixture_passes_an_equivalent_scenario(crashproof_verify: Callable[..., Any]) -> None:
    report = crashproof_verify(sc.TINY, recovery_points=1)
    assert isinstance(report, Report)
    assert report.ok
    assert report.seed == 0


def test_fixture_fails_with_the_matrix(crashproof_verify: Callable[..., Any]) -> None:
    with pytest.raises(AssertionError, match=r"not equivalent: \d+ DIVERGED") as failure:
        crashproof_verify(sc.LEAKY, seed=5, recovery_points=0)
    assert "crash point" in str(failure.value)  # the matrix's header
    assert "before_commit[step_done:send-0]" in str(failure.value)


def test_refusals_can_be_made_failures() -> None:
    assert assert_recovery_equivalent(sc.NO_LOOKUP, recovery_points=0).refused
    with pytest.raises(AssertionError, match="REFUSED"):
        assert_recovery_equivalent(sc.NO_LOOKUP, recovery_points=0, refused_ok=False)


def test_the_fixture_takes_an_async_scenario(crashproof_verify: Callable[..., Any]) -> None:
    from examples import async_agent

    report = crashproof_verify(async_agent.SCENARIO, max_points=4, recovery_points=0)
    assert report.ok
    assert len(report.results) >= 4
