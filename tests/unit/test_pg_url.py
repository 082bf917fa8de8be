"""A PostgreSQL ledger URL carries crashproof's own parameters (schema, pool_size) beside
libpq's; libpq never sees ours, and a bad pool size is refused before anything opens."""

from __future__ import annotations

from urllib.parse import quote, unquote

import pytest

from crashproof.store.pg_connection import parse_url


def test_our_parameters_are_taken_out_and_libpq_ones_kept() -> None:
    parsed = parse_url("postgresql://bob:s3cret@db:5432/x?schema=team&pool_size=9&sslmode=require")
    assert parsed.schema == "team"
    assert parsed.pool_size == 9
    assert parsed.conninfo == "postgresql://bob:s3cret@db:5432/x?sslmode=require"
    assert parsed.display == "postgresql://bob:***@db:5432/x"


def test_without_our_parameters_nothing_is_set() -> None:
    parsed = parse_url("postgres://db/x")
    assert (parsed.schema, parsed.pool_size) == (None, None)
    assert parsed.conninfo == "postgres://db/x"


@pytest.mark.parametrize("bad", ["0", "-1", "four", "", "1001", "2.5"])
def test_a_bad_pool_size_is_refused_with_the_url_but_not_its_password(bad: str) -> None:
    with pytest.raises(ValueError, match="pool_size must be a whole number") as caught:
        parse_url(f"postgresql://bob:s3cret@db/x?pool_size={bad}")
    assert "s3cret" not in str(caught.value)
    assert "postgresql://bob:***@db/x" in str(caught.value)


def test_a_witness_url_is_ours_and_its_password_never_shown() -> None:
    """``witness_url=`` (percent-encoded) names the witness's server: taken out of what
    libpq gets, and masked in messages as the ledger's own password is."""
    from crashproof.runtime.driving.urls import without_password

    witness = quote("postgresql://wit:hidden@db2/w?password=alsohidden", safe="")
    url = f"postgresql://bob:s3cret@db/x?schema=team&witness_url={witness}"
    parsed = parse_url(url)
    assert parsed.witness_url == "postgresql://wit:hidden@db2/w?password=alsohidden"
    assert parsed.conninfo == "postgresql://bob:s3cret@db/x"
    shown = without_password(url)
    assert "s3cret" not in shown
    assert "hidden" not in unquote(shown)
    assert "wit" in unquote(shown)
    with pytest.raises(ValueError, match="witness_url must be a postgresql:// URL") as caught:
        parse_url("postgresql://bob:s3cret@db/x?witness_url=sqlite%3A%2F%2F%2Fw.db")
    assert "s3cret" not in str(caught.value)
