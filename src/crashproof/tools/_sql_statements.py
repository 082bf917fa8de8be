"""The statements of a SQL script, for the SQL tools: SQLite's split as SQLite judges a
statement complete, PostgreSQL's top level for a check only, and the statements that
would begin or end the act's own transaction."""

from __future__ import annotations

import re
import sqlite3

__all__ = ["split_postgres", "split_sqlite", "transaction_control"]


def split_sqlite(script: str) -> list[str]:
    """The statements of a SQLite script, each complete as SQLite itself judges
    (``sqlite3.complete_statement``: a ``;`` inside a string, a comment or a trigger's
    body does not end one). A trailing part without a ``;`` is one more statement unless
    it is only whitespace and comments."""
    statements: list[str] = []
    start = 0
    for at, char in enumerate(script):
        if char == ";" and sqlite3.complete_statement(script[start : at + 1]):
            statements.append(script[start : at + 1])
            start = at + 1
    rest = script[start:]
    if _leading_word(rest):
        statements.append(rest)
    return statements


# What ends or nests the act's own transaction: refused before anything runs.
_CONTROL = frozenset({"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT"})


def transaction_control(statements: list[str]) -> str | None:
    """The first statement that would begin or end a transaction (``ROLLBACK TO`` a
    savepoint is fine), or None."""
    for statement in statements:
        words = _leading_word(statement, 3)
        if words and words[0] in _CONTROL:
            if words[0] == "ROLLBACK" and "TO" in words[1:]:  # [TRANSACTION] TO savepoint
                continue
            return " ".join(statement.split())[:80]
    return None


_SPACE_OR_COMMENT = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.S)
_WORD = re.compile(r"[A-Za-z_]+")


def _leading_word(text: str, count: int = 1) -> list[str]:
    """The first ``count`` words of ``text`` after whitespace and comments, uppercased."""
    words: list[str] = []
    at = 0
    while len(words) < count:
        at = _SPACE_OR_COMMENT.match(text, at).end()  # type: ignore[union-attr]
        word = _WORD.match(text, at)
        if word is None:
            break
        words.append(word.group().upper())
        at = word.end()
    return words


def split_postgres(script: str) -> list[str]:
    """The top-level statements of a PostgreSQL script, for the transaction-control
    check only (the server parses the script itself): a ``;`` ends a statement outside
    quotes (``'..'``, ``E'..'``, ``".."``, ``$tag$..$tag$``) and comments."""
    statements: list[str] = []
    start = at = 0
    n = len(script)
    while at < n:
        char = script[at]
        if char == "-" and script.startswith("--", at):
            end = script.find("\n", at)
            at = n if end < 0 else end + 1
        elif char == "/" and script.startswith("/*", at):
            at = _skip_block_comment(script, at)
        elif char == "'":
            escapes = at > 0 and script[at - 1] in "eE" and not _word_char(script, at - 2)
            at = _skip_quoted(script, at, "'", escapes)
        elif char == '"':
            at = _skip_quoted(script, at, '"', False)
        elif char == "$" and (tag := re.match(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$", script[at:])):
            if _word_char(script, at - 1):  # $1 or a$b: not a dollar quote
                at += 1
                continue
            end = script.find(tag.group(), at + len(tag.group()))
            at = n if end < 0 else end + len(tag.group())
        elif char == ";":
            statements.append(script[start : at + 1])
            start = at = at + 1
        else:
            at += 1
    if _leading_word(script[start:]):
        statements.append(script[start:])
    return statements


def _word_char(text: str, at: int) -> bool:
    return at >= 0 and (text[at].isalnum() or text[at] == "_")


def _skip_quoted(text: str, at: int, quote: str, escapes: bool) -> int:
    at += 1
    while at < len(text):
        if escapes and text[at] == "\\":
            at += 2
            continue
        if text[at] == quote:
            if text.startswith(quote * 2, at):  # a doubled quote stays inside
                at += 2
                continue
            return at + 1
        at += 1
    return at


def _skip_block_comment(text: str, at: int) -> int:
    depth = 0
    while at < len(text):
        if text.startswith("/*", at):
            depth, at = depth + 1, at + 2
        elif text.startswith("*/", at):
            depth, at = depth - 1, at + 2
            if depth == 0:
                return at
        else:
            at += 1
    return at
