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


STATS_COLUMNS = "delta.dataSkippingStatsColumns"
"""The table property naming the only columns Delta keeps file statistics for."""

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def plain(name: str) -> bool:
    """Whether ``name`` is letters, digits and ``_`` only: the names :data:`STATS_COLUMNS`
    can hold safely. Delta 4.x reads a back-quoted name there, but its ``ALTER TABLE ... DROP
    COLUMN`` of another column then fails: it reads the name unquoted
    (``DELTA_COLUMN_NOT_FOUND_IN_SCHEMA``)."""
    return bool(name) and set(name) <= _PLAIN


def stats_columns(names: Iterable[str]) -> str:
    """``names`` as the value of :data:`STATS_COLUMNS`: comma-separated, a name of other
    characters than letters, digits and ``_`` back-quoted."""
    return ",".join(n if plain(n) else quote(n) for n in names)


def parse_stats_columns(text: str) -> list[str] | None:
    """The top-level column names a :data:`STATS_COLUMNS` value lists (as
    :func:`stats_columns` writes them); None for one that names a nested field (``a.b``) or
    is not well formed."""
    names: list[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] == " ":
            i += 1
        if i < n and text[i] == "`":
            name, i = [], i + 1
            while True:
                if i >= n:
                    return None
                if text[i] == "`":
                    if i + 1 < n and text[i + 1] == "`":
                        name.append("`")
                        i += 2
                        continue
                    i += 1
                    break
                name.append(text[i])
                i += 1
            names.append("".join(name))
            while i < n and text[i] == " ":
                i += 1
        else:
            end = text.find(",", i)
            end = n if end < 0 else end
            bare = text[i:end].strip()
            if not bare or "." in bare or "`" in bare:
                return None
            names.append(bare)
            i = end
        if i < n:
            if text[i] != ",":
                return None
            i += 1
            if i >= n:
                return None
    return names
