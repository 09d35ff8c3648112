"""A run's wal window, in the driver or in Spark, and its decoded changes.

A small window of a local bronze (a scheduled run's increment, a continuous application's) is
read by delta-rs into the driver: its messages decoded there by the same function Spark's Python
workers run (:func:`pgmedallion.silver.decode.decode_changes`), so the run can go without Spark
(see :mod:`pgmedallion.core.session`). A large window, or one bronze holds elsewhere, is a Spark
DataFrame as before. Either way the rest of the run asks the same questions of it
(:class:`Window`, :class:`Decoded`), and a Spark DataFrame of the driver's rows is made only if
a table's run needs Spark (``df``).

Which capture read of a transaction a window holds is :func:`pgmedallion.silver.decode.wal_window`'s
rule (one read per commit LSN, one that reached its Commit, :func:`pgmedallion.silver.decode.
chosen_reads`): the driver applies it to its rows (:func:`read_once`), Spark's workers to
bronze's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.capture.pgoutput import MSG_COMMIT
from pgmedallion.core import delta_rs, sparkapi
from pgmedallion.core.sparkapi import F
from pgmedallion.silver.changes import RETRACT, LayoutIndex
from pgmedallion.silver.contract import CHANGE_ARROW
from pgmedallion.silver.decode import (
    CHANGE_TYPES,
    chosen_reads,
    decode_changes,
    decoded_changes,
    message_type,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_COMMIT = message_type(MSG_COMMIT)


def read_once(rows: pa.Table) -> pa.Table:
    """The rows (``lsn, run_id, mtype``, ...) of the reads :func:`pgmedallion.silver.decode.
    chosen_reads` picks, in their order: what ``wal_window`` keeps of the same rows."""
    if rows.num_rows == 0:
        return rows
    commits = rows.filter(pc.equal(rows.column("mtype"), _COMMIT)).select(["lsn", "run_id"])
    chosen = chosen_reads(commits)
    at = pc.index_in(rows.column("lsn"), value_set=chosen.column("lsn"))
    keep = pc.equal(rows.column("run_id"), pc.take(chosen.column("run_id"), at))
    return rows.filter(pc.fill_null(keep, False))


def relids(payloads: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Each message's bytes 2-5 as a number: the relation's OID in the messages that carry one
    (what ``wal_window``'s ``relid`` holds), NULL in a shorter message."""
    out = []
    for p in payloads.to_pylist():
        out.append(int.from_bytes(p[1:5], "big") if p is not None and len(p) >= 5 else None)
    return pa.array(out, pa.int64())


def with_mtype(rows: pa.Table) -> pa.Table:
    """``rows`` (with ``payload``) and ``mtype``: the message type as ``wal_window`` writes it."""
    first = pc.binary_slice(rows.column("payload"), 0, 1)
    mtype = pa.array(
        [None if b is None else b.hex().upper() for b in first.to_pylist()], pa.string()
    )
    return rows.append_column("mtype", mtype)


@dataclass
class Window:
    """The window's wal rows (``lsn, ordinal, payload, mtype``...): ``arrow`` in the driver, or
    only as Spark's ``df()``."""

    arrow: pa.Table | None
    to_df: Callable[[], DataFrame]
    _df: DataFrame | None = None

    def df(self) -> DataFrame:
        if self._df is None:
            self._df = self.to_df().persist(sparkapi.StorageLevel.MEMORY_AND_DISK)
        return self._df

    def messages(self, types: tuple[str, ...]) -> list[dict]:
        """The rows of the message types ``types`` (``lsn, ordinal, payload, mtype``)."""
        names = ["lsn", "ordinal", "payload", "mtype"]
        if self.arrow is None:
            rows = self.df().where(F.col("mtype").isin(*types)).select(*names).collect()
            return [r.asDict() for r in rows]
        picked = self.arrow.filter(pc.is_in(self.arrow.column("mtype"), pa.array(types)))
        return picked.select(names).to_pylist()

    def decoded(self, layouts: dict[int, tuple[LayoutIndex, int]], spark) -> Decoded:
        """Its Insert/Update/Delete messages decoded (``CHANGE_ARROW``)."""
        if self.arrow is None:
            return Decoded(None, lambda: decoded_changes(self.df(), layouts), spark)
        rows = self.arrow.filter(pc.is_in(self.arrow.column("mtype"), pa.array(CHANGE_TYPES)))
        rows = rows.select(["lsn", "ordinal", "payload"])
        batches = list(decode_changes(iter(rows.to_batches(max_chunksize=8192)), layouts))
        table = pa.Table.from_batches(batches, schema=CHANGE_ARROW)
        return Decoded(table, None, spark)

    def unpersist(self) -> None:
        if self._df is not None:
            self._df.unpersist()


@dataclass
class Decoded:
    """A window's decoded changes: ``arrow`` in the driver, or Spark's."""

    arrow: pa.Table | None
    to_df: Callable[[], DataFrame] | None
    spark: object
    _df: DataFrame | None = field(default=None)

    def df(self) -> DataFrame:
        """All of them as a Spark DataFrame (persisted)."""
        if self._df is None:
            if self.arrow is None:
                frame = self.to_df()
            else:
                frame = delta_rs.frame(self.spark, self.arrow, delta_rs.spark_types(CHANGE_ARROW))
            self._df = frame.persist(sparkapi.StorageLevel.MEMORY_AND_DISK)
        return self._df

    def good(self) -> DataFrame:
        """The ones that decoded (no ``code``), as Spark's."""
        return self.df().where(F.col("code").isNull())

    def summary(self) -> list[dict]:
        """Per table: ``table_oid``, ``errors`` (rows with a ``code``), ``rows``, and
        ``identities``: the distinct key positions (``columns``) of its ``RETRACT`` rows."""
        if self.arrow is None:
            d = self.df()
            grouped = d.groupBy("table_oid").agg(
                F.count_if(F.col("code").isNotNull()).alias("errors"),
                F.count(F.lit(1)).alias("rows"),
                F.collect_set(F.when(F.col("kind") == RETRACT, F.col("columns"))).alias(
                    "identities"
                ),
            )
            return [r.asDict() for r in grouped.collect()]
        out: dict[int, dict] = {}
        cols = self.arrow.select(["table_oid", "code", "kind", "columns"]).to_pydict()
        for oid, code, kind, columns in zip(
            cols["table_oid"], cols["code"], cols["kind"], cols["columns"], strict=True
        ):
            s = out.setdefault(oid, {"table_oid": oid, "errors": 0, "rows": 0, "identities": set()})
            s["rows"] += 1
            s["errors"] += code is not None
            if kind == RETRACT and columns is not None:
                s["identities"].add(tuple(columns))
        return [{**s, "identities": [list(i) for i in s["identities"]]} for s in out.values()]

    def errors(self, oids: list[int]) -> list[dict]:
        """The rows of tables ``oids`` that did not decode."""
        names = ["table_oid", "lsn", "code", "message", "raw"]
        if self.arrow is None:
            d = self.df()
            bad = d.where(F.col("code").isNotNull() & F.col("table_oid").isin(oids))
            return [r.asDict() for r in bad.select(*names).collect()]
        t = self.arrow
        mask = pc.and_(
            pc.is_valid(t.column("code")), pc.is_in(t.column("table_oid"), pa.array(oids))
        )
        return t.filter(mask).select(names).to_pylist()

    def rows_of(self, oid: int) -> pa.Table | None:
        """Table ``oid``'s decoded rows in the driver (None: they are Spark's)."""
        if self.arrow is None:
            return None
        t = self.arrow
        mask = pc.and_(pc.equal(t.column("table_oid"), oid), pc.is_null(t.column("code")))
        return t.filter(mask)

    def unpersist(self) -> None:
        if self._df is not None:
            self._df.unpersist()
