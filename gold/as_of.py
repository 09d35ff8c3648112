"""Reading tables as of a point of the source: an LSN, or a time (the source's commit clock).

``orders AS OF LSN '0/1C48790'`` in a query to ``pgmedallion sql`` reads the versions of
``orders__history`` that were current at that LSN::

    __start_lsn <= L AND (__end_lsn IS NULL OR __end_lsn > L)

``orders AS OF TIMESTAMP '2026-11-28 12:00:00'`` first takes ``L``: the newest commit at or
before that time among the transactions silver read (``_commits``), so every table of a query
is read at one LSN and the whole is one transactionally consistent state of the source. (Not
to be confused with Delta's ``TIMESTAMP AS OF``, which reads an older version of a table.)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from pgmedallion.capture.pgoutput import parse_lsn
from pgmedallion.core.config import Config
from pgmedallion.core.errors import PipelineError
from pgmedallion.core.naming import quote
from pgmedallion.gold.history_table import SUFFIX
from pgmedallion.gold.versions import END, START, VERSION_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_AS_OF = re.compile(
    r"(?P<name>(?:`[^`]+`|[A-Za-z_][\w$]*)(?:\.(?:`[^`]+`|[A-Za-z_][\w$]*))*)"
    r"\s+AS\s+OF\s+(?P<kind>LSN|TIMESTAMP)\s+'(?P<value>[^']*)'"
    r"(?P<alias>\s+(?:AS\s+)?(?!(?:WHERE|JOIN|LEFT|RIGHT|INNER|FULL|CROSS|ON|GROUP|ORDER|LIMIT"
    r"|UNION|HAVING|NATURAL|WINDOW|EXCEPT|INTERSECT|USING|LATERAL|SEMI|ANTI|OUTER)\b)"
    r"[A-Za-z_]\w*)?",
    re.IGNORECASE,
)


class AsOfError(PipelineError):
    """A point a table cannot be read as of: not an LSN, a table that keeps no history."""


def lsn_of(text: str) -> int:
    """An LSN written as PostgreSQL writes it (``0/1C48790``) or as a number."""
    text = text.strip()
    try:
        return parse_lsn(text) if "/" in text else int(text)
    except ValueError:
        raise AsOfError(f"not an LSN: {text!r} (PostgreSQL writes them as 0/1C48790)") from None


def lsn_at(spark: SparkSession, cfg: Config, when: str | datetime) -> int:
    """The LSN of the source's state at time ``when``: that of its newest commit at or before
    it (``_commits``); -1 when none is known (every history reads empty there)."""
    commits = cfg.qualified("silver", "_commits")
    if isinstance(when, datetime):
        when = when.isoformat(sep=" ")
    query = (
        f"SELECT max(lsn) AS lsn FROM {commits} WHERE source = :source "
        "AND commit_time <= CAST(:when AS TIMESTAMP)"
    )
    row = spark.sql(query, args={"source": cfg.source.name, "when": when}).collect()[0]
    return -1 if row["lsn"] is None else int(row["lsn"])


def as_of_sql(history: str, columns: list[str], lsn: int) -> str:
    """A subquery of the rows of history table ``history`` (qualified) current at ``lsn``."""
    data = ", ".join(quote(c) for c in columns if c not in VERSION_COLUMNS)
    return (
        f"(SELECT {data} FROM {history} WHERE {START} <= {int(lsn)} "
        f"AND ({END} IS NULL OR {END} > {int(lsn)}))"
    )


def history_of(name: str) -> str:
    """The history table of a table named as in a query (``gold.orders`` ->
    ``gold.`orders__history```)."""
    parts = re.findall(r"`[^`]+`|[^.`]+", name)
    last = parts[-1].strip("`") + SUFFIX
    return ".".join([*parts[:-1], quote(last)])


def rewrite(query: str, columns_of: Callable[[str], list[str]], lsn_at_time) -> str:
    """``query`` with each ``<table> AS OF LSN '...'`` / ``AS OF TIMESTAMP '...'`` replaced by
    the subquery of its history's rows at that point (``columns_of(history table)``: its
    columns; ``lsn_at_time(text)``: the LSN of a time)."""

    def one(m: re.Match) -> str:
        history = history_of(m["name"])
        if m["kind"].upper() == "LSN":
            lsn = lsn_of(m["value"])
        else:
            lsn = lsn_at_time(m["value"])
        try:
            columns = columns_of(history)
        except Exception:
            raise AsOfError(
                f"{m['name']} keeps no history ({history} is not there): set history = true "
                'for the table ([tables."schema.table"] or [lakehouse]) and run'
            ) from None
        alias = (m["alias"] or "").strip()
        if alias.upper().startswith("AS "):
            alias = alias[3:].strip()
        alias = alias or re.findall(r"`[^`]+`|[^.`]+", m["name"])[-1]
        return f"{as_of_sql(history, columns, lsn)} AS {alias}"

    return _AS_OF.sub(one, query)


def sql_as_of(spark: SparkSession, cfg: Config, query: str) -> str:
    """``query`` as Spark runs it: its ``AS OF LSN``/``AS OF TIMESTAMP`` reads rewritten."""
    return rewrite(
        query, lambda name: spark.table(name).columns, lambda text: lsn_at(spark, cfg, text)
    )


def read_as_of(spark: SparkSession, cfg: Config, table: str, lsn: int) -> DataFrame:
    """Gold table ``table`` (its silver name, e.g. ``public_orders``) as of ``lsn``."""
    history = cfg.qualified("gold", table + SUFFIX)
    return spark.sql(as_of_sql(history, spark.table(history).columns, lsn))
