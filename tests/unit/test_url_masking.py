"""Ledger messages show the URL without any password."""

from __future__ import annotations

import pytest

from crashproof.runtime.driving.urls import without_password as _without_password


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://bob:s3cret@db:5432/x", "postgresql://bob:***@db:5432/x"),
        (
            "postgresql://bob@db/x?password=s3cret&sslmode=require",
            "postgresql://bob@db/x?password=***&sslmode=require",
        ),
        ("postgres://u:p@h/d?sslpassword=k", "postgres://u:***@h/d?sslpassword=***"),
        ("sqlite:///runs.db", "sqlite:///runs.db"),
        ("memory://", "memory://"),
    ],
)
def test_passwords_are_masked(url: str, shown: str) -> None:
    assert _without_password(url) == shown
    assert "s3cret" not in _without_password(url)
