"""How the SQL tools split a script and spot transaction control (tools/_sql_statements.py):
a ``;`` inside quotes, comments, dollar quotes or a trigger's body does not end a
statement; BEGIN/COMMIT/ROLLBACK/END at the top level are found, ROLLBACK TO is not."""

from __future__ import annotations

import pytest

from crashproof.tools._sql_statements import split_postgres, split_sqlite, transaction_control


def test_sqlite_keeps_a_trigger_body_and_quoted_semicolons_whole() -> None:
    script = (
        "CREATE TABLE t (x TEXT); -- a ; in a comment\n"
        "CREATE TRIGGER g AFTER INSERT ON t BEGIN UPDATE t SET x = 'a;b'; END;\n"
        "INSERT INTO t VALUES (';')  /* no ; at the end */"
    )
    statements = split_sqlite(script)
    assert len(statements) == 3
    assert "END;" in statements[1]
    assert transaction_control(statements) is None
    assert split_sqlite("SELECT 1; -- only a comment after\n") == ["SELECT 1;"]


def test_postgres_skips_quotes_comments_and_dollar_bodies() -> None:
    script = (
        "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$ BEGIN RETURN 1; END "
        "$body$;\n"
        "INSERT INTO t VALUES (E'it\\'s; fine', 'a''b;c', \"we;ird\");\n"
        "/* nested /* ; */ comment; */ SELECT $1;\n"
        "SELECT 2"
    )
    statements = split_postgres(script)
    assert len(statements) == 4, statements
    assert transaction_control(statements) is None


@pytest.mark.parametrize(
    "script",
    [
        "BEGIN; INSERT INTO t VALUES (1);",
        "INSERT INTO t VALUES (1); commit;",
        "INSERT INTO t VALUES (1);\n-- done\nEND;",
        "START TRANSACTION; SELECT 1;",
        "ROLLBACK;",
        "/* x */ abort",
    ],
)
def test_transaction_control_is_found(script: str) -> None:
    assert transaction_control(split_postgres(script)) is not None
    assert transaction_control(split_sqlite(script)) is not None


def test_a_savepoint_rollback_is_not_transaction_control() -> None:
    script = "SAVEPOINT s; INSERT INTO t VALUES (1); ROLLBACK TO s; ROLLBACK TRANSACTION TO s;"
    assert transaction_control(split_sqlite(script)) is None
    assert transaction_control(split_postgres(script)) is None
