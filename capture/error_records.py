"""Definite errors written into bronze as ``error`` records, once each."""

from __future__ import annotations

import logging

from pgmedallion.bronze.store import Bronze
from pgmedallion.bronze.table import (
    RecordBuffer,
    error_payload,
)
from pgmedallion.capture.errors import (
    PipelineError,
)
from pgmedallion.capture.pgoutput import format_lsn
from pgmedallion.capture.snapshot import (
    PublishedTable,
)

log = logging.getLogger(__name__)


def record_error(
    bronze: Bronze,
    error: PipelineError,
    *,
    lsn: int,
    run_id: str,
    table: PublishedTable | None = None,
    since: int | None = None,
) -> bool:
    """Write ``error`` as one ``error`` record in a batch of its own, unless already recorded.

    A table's error is recorded once per table (``since``: once per table from that LSN on,
    its snapshot's: a new snapshot can meet it again); a source-wide one once per LSN.
    Returns whether a record was written.
    """
    code = error.code
    oid = None if table is None else table.oid
    for known_code, known_oid, known_lsn in bronze.recorded_errors():
        if known_code != code or known_oid != oid:
            continue
        if (oid is None and known_lsn == lsn) or (oid is not None and known_lsn >= (since or 0)):
            return False
    buffer = RecordBuffer(bronze.source, run_id)
    buffer.add(
        "error",
        lsn,
        table_oid=oid,
        table_schema=None if table is None else table.schema or None,
        table_name=None if table is None else table.name or None,
        payload=error_payload(code, str(error), format_lsn(lsn)),
    )
    batch_id = bronze.next_batch_id()
    bronze.append(buffer.to_arrow(batch_id), batch_id)
    where = "" if table is None else f" for {table_name(table)}"
    # a table dropped at the source is not a failure: silver and gold drop its tables next
    level = logging.WARNING if code == "TableDropped" else logging.ERROR
    log.log(level, "recorded %s%s at %s: %s", code, where, format_lsn(lsn), error)
    return True


def table_name(table: PublishedTable) -> str:
    return f"{table.schema}.{table.name}" if table.name else f"oid {table.oid}"


def error_lsn(bronze: Bronze) -> int:
    """Where a source-wide error stops capture: bronze's frontier, else its last snapshot."""
    frontier = bronze.frontier()
    if frontier is not None:
        return frontier
    return max(bronze.snapshotted_tables().values(), default=0)
