"""Names as Spark SQL reads them, and the Delta properties every table of ours shares."""

from __future__ import annotations

from collections.abc import Iterable

# Column mapping by name: any PostgreSQL column name (spaces, dots, case) is a Delta column name.
COLUMN_MAPPING = {
    "delta.columnMapping.mode": "name",
    "delta.minReaderVersion": "2",
    "delta.minWriterVersion": "5",
}


def quote(name: str) -> str:
    """One identifier back-quoted for Spark SQL, whatever characters it has."""
    return "`" + name.replace("`", "``") + "`"


def qualified(parts: Iterable[str]) -> str:
    """A dotted name (catalog.schema.table) with every part back-quoted."""
    return ".".join(quote(p) for p in parts)
