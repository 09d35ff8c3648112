"""The source's part of ``pgmedallion status``: the slot, its lag and the WAL it retains. Needs
PostgreSQL only (no Spark), so it answers where PySpark is not installed."""

from __future__ import annotations

import psycopg

from pgmedallion.capture.connection import connect
from pgmedallion.core.config import Config


def slot_lines(cfg: Config) -> tuple[list[str], bool]:
    """The slot's lines of ``status``, and whether the slot is there."""
    lines, ok, _ = slot_report(cfg)
    return lines, ok


def slot_report(cfg: Config) -> tuple[list[str], bool, int | None]:
    """The slot's lines of ``status``, whether the slot is there, and the source's current WAL
    position (None when it cannot be asked)."""
    try:
        conn = connect(cfg.source.conninfo())
    except Exception as e:  # the message is already redacted by capture.connection
        return [f"source: cannot connect: {e}"], False, None
    try:
        (wal,) = conn.execute(
            "SELECT pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
            " ELSE pg_current_wal_lsn() END, '0/0')::int8"
        ).fetchone()
        row = conn.execute(
            "SELECT plugin, active, confirmed_flush_lsn::text,"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::int8,"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8"
            " FROM pg_replication_slots WHERE slot_name = %s",
            (cfg.source.slot,),
        ).fetchone()
    except psycopg.Error as e:
        return [f"source: {type(e).__name__}"], False, None
    finally:
        conn.close()
    if row is None:
        return [f"slot {cfg.source.slot}: missing (run `pgmedallion run` to create it)"], False, wal
    plugin, active, confirmed, lag, retained = row
    line = (
        f"slot {cfg.source.slot} ({plugin}, {'active' if active else 'idle'}): "
        f"confirmed {confirmed}, lag {lag or 0} bytes, WAL retained {retained or 0} bytes"
    )
    return [line], True, wal
