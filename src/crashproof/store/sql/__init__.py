"""SQL as data: numbered migrations and named queries, one folder per dialect."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

__all__ = ["Migration", "load_migrations", "load_queries", "load_schema"]

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def load_queries(dialect: str, file: str = "queries.sql") -> dict[str, str]:
    """Parse ``queries.sql`` (or another file) of a dialect into {name: statement}."""
    text = resources.files(__package__).joinpath(dialect, file).read_text("utf-8")
    parts = _NAME.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {
        name: body.strip().rstrip(";").strip()
        for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def load_migrations(dialect: str) -> list[Migration]:
    """Numbered migration files of a dialect, in order; numbers must be 1..N without gaps."""
    folder = resources.files(__package__).joinpath(dialect)
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"{dialect} migrations are not numbered 1..N: {found}")
    return found


def load_schema(dialect: str) -> str:
    """The dialect's current schema in one file (``schema.sql``): what a new ledger gets.
    A test proves it equals every numbered migration applied in order."""
    return resources.files(__package__).joinpath(dialect, "schema.sql").read_text("utf-8")
