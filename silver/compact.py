"""Compaction: a silver table's diffs that gold has applied, consolidated into their state.

Silver is append-only: every run adds a table's diffs (a file or two). A table that changes
all day grows without end, and so does every read that needs its whole past (the previous
images of REPLICA IDENTITY DEFAULT changes read the rows of earlier runs; a full gold build
reads them all), while the state those diffs sum to stays the size of the table. Compaction
replaces the diffs gold has already applied by their consolidated form, in one Delta commit:

    rows of runs <= R with _lsn < F ──consolidate──> one row per distinct value:
        _diff = the sum of its diffs (zero: gone), _lsn = the largest (the row's last change),
        _run = the largest run among them
    rows of runs <= R with _lsn >= F (held back by gold): kept as they are

``R`` and ``F`` are the run and frontier gold reported for the table (``_frontier``): every
diff below them is in gold's state, so no incremental gold run reads them again (it reads runs
above the one it applied, and the consolidated rows carry the largest run among theirs, which
gold applied). Every reader of silver sums diffs: per row value (gold's state, verify's
comparisons, previous images) or per key, and a row value's sum and last change LSN are the
same before and after (:func:`pgmedallion.core.multiset.consolidate`, the rule gold's state
uses, applied by buckets of rows in Spark's Python workers). What is lost is silver's history
below gold's frontier: the LSNs at which a row value came and went before its last change.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.core import delta_rs, engine
from pgmedallion.core.by_key import by_key
from pgmedallion.core.multiset import DIFF, LSN, MULT, consolidate
from pgmedallion.core.naming import quote
from pgmedallion.core.sparkapi import F, T

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

RUN = "_run"


def consolidated_history(rows: DataFrame, stamp: int) -> DataFrame:
    """``rows`` (``data..., _lsn, _diff``, any runs) as one row per distinct value with a
    nonzero sum, at run ``stamp``."""
    data = [c for c in rows.columns if c not in (LSN, DIFF, RUN)]
    schema = T.StructType(
        [rows.schema[n] for n in data]
        + [T.StructField(MULT, T.LongType()), T.StructField(LSN, T.LongType())]
    )
    rule = partial(consolidate, columns=data)
    diffs = rows.select(*[F.col(quote(n)) for n in data], LSN, DIFF)
    state = by_key(diffs, data, rule, schema)
    return state.select(
        *[F.col(quote(n)) for n in data],
        F.col(LSN),
        F.col(MULT).alias(DIFF),
        F.lit(stamp).cast("bigint").alias(RUN),
    )


def compact_table(spark: SparkSession, target: str, upto_run: int, below_lsn: int) -> bool:
    """Consolidate the diffs of silver table ``target`` in runs ``<= upto_run`` with
    ``_lsn < below_lsn`` (gold's reported run and frontier for it), in one commit that
    replaces its rows of runs ``<= upto_run``. False when there was nothing to consolidate."""
    table = spark.table(target)
    region = F.col(RUN) <= F.lit(upto_run)
    applied = region & (F.col(LSN) < F.lit(below_lsn))
    (stamp,) = table.where(applied).agg(F.max(RUN)).first()
    if stamp is None:
        return False
    held = table.where(region & (F.col(LSN) >= F.lit(below_lsn)))
    out = consolidated_history(table.where(applied), int(stamp)).unionByName(held)
    # A V2 overwrite by condition (Delta's replaceWhere): the rows of runs <= upto_run go,
    # the consolidated ones come, in one commit; readers see one or the other
    out.writeTo(target).overwrite(region)
    return True


def compact_local(path: str | None, upto_run: int, below_lsn: int) -> bool | None:
    """:func:`compact_table` of the local silver table at ``path`` in the driver: its rows of
    runs ``<= upto_run`` read by delta-rs, those with ``_lsn < below_lsn`` consolidated by the
    same rule (:func:`pgmedallion.core.multiset.consolidate`, here over all of them at once),
    and written back in place of those runs' rows in one delta-rs commit. None when the table
    is not local or those runs hold more than ``[lakehouse] driver_rows`` rows (then
    :func:`compact_table`, through Spark); False when there was nothing to consolidate.
    Measured at 4M rows: a cold Spark started for it cost a run 30-40 s."""
    if not delta_rs.usable(path):
        return None
    region = f"{RUN} <= {int(upto_run)}"
    table = delta_rs.open_table(path)
    names = [f.name for f in table.schema().fields]
    data = [n for n in names if n not in (LSN, DIFF, RUN)]
    rows = delta_rs.read_at_most(path, names, region, ["TRUE"], engine.current().driver_rows)
    if rows is None:
        return None
    lsn = rows.column(LSN)
    applied = rows.filter(pc.less(lsn, below_lsn))
    if applied.num_rows == 0:
        return False
    stamp = pc.max(applied.column(RUN)).as_py()
    held = rows.filter(pc.greater_equal(lsn, below_lsn))
    state = consolidate(applied.select([*data, LSN, DIFF]), data)
    consolidated = pa.table(
        {
            **{n: state.column(n) for n in data},
            LSN: state.column(LSN),
            DIFF: state.column(MULT),
            RUN: pa.array([stamp] * state.num_rows, pa.int64()),
        }
    )
    types = rows.schema
    out = pa.concat_tables(
        [
            pa.table([consolidated.column(f.name).cast(f.type) for f in types], schema=types),
            held.select(types.names),
        ]
    )
    delta_rs.replace_where(path, out, region)
    log.info("silver %s: %d rows consolidated into %d", path, applied.num_rows, state.num_rows)
    return True
