"""The catalog: what silver knows of each source table, and of its columns over time.

``_tables`` holds a row per table (:class:`~silver.contract.TableInfo`); a run updates it from
bronze's schema and rewind records and from the Relation messages of the stream, and plans the
column layout of every Relation (:func:`plan_layouts`) against the table's columns.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pyarrow as pa

from pgmedallion.capture.pgoutput import MSG_RELATION, MSG_TRUNCATE, Relation, Truncate, decode
from pgmedallion.capture.schema_changes import (
    FOLLOW,
    RESYNC,
    Catalog,
    CatalogColumn,
    Changes,
    by_position,
    type_text,
    widens,
)
from pgmedallion.core import delta_rs
from pgmedallion.core.config import Config
from pgmedallion.core.sparkapi import F
from pgmedallion.silver.changes import LayoutIndex, TableColumn, plan_columns, with_fill
from pgmedallion.silver.contract import Names, TableInfo
from pgmedallion.silver.decode import message_type
from pgmedallion.silver.errors import ErrorRecord, SchemaIncompatible
from pgmedallion.silver.pgtypes import INTEGER_TYPES, arrow_type, pg_type_of, type_string
from pgmedallion.silver.policies import with_policies

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Relations = dict[int, list[tuple[int, int, Relation]]]
"""relid -> ``(lsn, ordinal, Relation)``, every Relation message of the table silver read."""


def silver_table_name(schema: str, name: str, oid: int, taken: set[str]) -> str:
    """A metastore-safe, stable name: ``public."OrderItems"`` -> ``public_orderitems``."""
    base = re.sub(r"[^a-z0-9]+", "_", f"{schema}_{name}".lower()).strip("_")[:100] or "table"
    if base[0].isdigit():
        base = "t_" + base
    candidate = base if base not in taken else f"{base}_{oid}"
    taken.add(candidate)
    return candidate


def load_tables(spark: SparkSession, cfg: Config) -> dict[int, TableInfo]:
    """The source's tables as ``_tables`` holds them, by OID."""
    n = Names(cfg)
    out = {}
    columns = [
        "table_oid",
        "table_schema",
        "table_name",
        "silver_table",
        "snapshot_lsn",
        "primary_key",
        "not_null",
        "columns",
        "snapshot_run",
        "source",
    ]
    if "snapshot_ranges" in delta_rs.bookkeeping_columns(spark, n.schema, "_tables"):
        columns.append("snapshot_ranges")  # (a table made before snapshots resumed has none)
    rows = delta_rs.bookkeeping_rows(
        spark, n.schema, "_tables", columns, {"source": cfg.source.name}
    )
    for r in rows:
        out[r["table_oid"]] = TableInfo(
            oid=r["table_oid"],
            schema=r["table_schema"],
            name=r["table_name"],
            silver_table=r["silver_table"],
            snapshot_lsn=r["snapshot_lsn"],
            primary_key=list(r["primary_key"] or []),
            not_null=list(r["not_null"] or []),
            columns=json.loads(r["columns"]),
            snapshot_run=r["snapshot_run"],
            source=r["source"],
            snapshot_ranges=json.loads(r["snapshot_ranges"]) if r.get("snapshot_ranges") else None,
        )
    return out


def column_entry(c: dict) -> dict:
    """A ``_tables`` column entry with every key, defaults filled in."""
    keys = (
        "name",
        "type_oid",
        "typmod",
        "type_name",
        "base_type_oid",
        "element_type_oid",
        "category",
        "target",
        "infinity",
        "dims",
        "domain_typmod",
    )
    defaults = {"type_name": "", "category": "", "target": "", "infinity": "", "domain_typmod": -1}
    entry = {k: c.get(k, defaults.get(k, 0)) for k in keys}
    if c.get("missing") is not None:
        # a column added with a value for the rows already there (ADD COLUMN ... DEFAULT 1):
        # that value as text, which rows from before the column hold (silver.changes.with_fill)
        entry["missing"] = c["missing"]
    return entry


def silver_tables(spark: SparkSession, n: Names) -> set[str]:
    """The silver schema's table names, lower case (one catalog call for the run)."""
    return delta_rs.table_names(spark, n.schema)


def table_exists(spark: SparkSession, qualified: str) -> bool:
    try:
        return spark.table(qualified).schema is not None
    except Exception:
        return False


def write_tables(
    spark: SparkSession,
    n: Names,
    source: str,
    tables: dict[int, TableInfo],
    before: dict[int, TableInfo] | None = None,
) -> None:
    """Replace the source's rows of ``_tables`` by ``tables``; nothing is written when they are
    what ``before`` (the tables as the run read them) held already."""
    rows = _table_rows(source, tables)
    if before is not None and sorted(rows) == sorted(_table_rows(source, before)):
        return
    ddl = (
        "source string, table_oid long, table_schema string, table_name string, "
        "silver_table string, snapshot_lsn long, primary_key array<string>, "
        "not_null array<string>, columns string, snapshot_run long, snapshot_ranges string"
    )
    # by delta-rs where local (milliseconds; Spark's overwrite of a few rows took 4.6 s in a
    # first run's cold JVM), one commit replacing this source's rows either way
    names = [column.split(" ", 1)[0] for column in ddl.split(", ")]
    now = datetime.now(UTC)
    records = [dict(zip(names, row, strict=True), updated_at=now) for row in rows]
    path = delta_rs.table_dir(delta_rs.schema_dir(spark, n.schema), "_tables")
    literal = "'" + source.replace("'", "''") + "'"
    replace = f"source = {literal}"
    if delta_rs.write_records(path, records, [*names, "updated_at"], replace_where=replace):
        return
    df = spark.createDataFrame(rows, ddl).withColumn("updated_at", F.current_timestamp())
    # One atomic commit replacing this source's rows (other sources' rows stay as they are),
    # through the catalog (by name, so it works on Unity Catalog managed tables too).
    df.select(*spark.table(n.tables).columns).writeTo(n.tables).overwrite(
        F.col("source") == F.lit(source)
    )


def _table_rows(source: str, tables: dict[int, TableInfo]) -> list[tuple]:
    rows = []
    for info in tables.values():
        cols = [dict(c, spark_type=type_string(pg_type_of(c))) for c in info.columns]
        rows.append(
            (
                source,
                info.oid,
                info.schema,
                info.name,
                info.silver_table,
                info.snapshot_lsn,
                info.primary_key,
                info.not_null,
                json.dumps(cols, sort_keys=True),
                info.snapshot_run,
                None
                if info.snapshot_ranges is None
                else json.dumps(info.snapshot_ranges, sort_keys=True),
            )
        )
    return rows


def dropped_tables(control: list) -> set[int]:
    """The tables bronze's ``TableDropped`` error records say the source dropped."""
    return {
        r["table_oid"]
        for r in control
        if r["kind"] == "error"
        and r["table_oid"] is not None
        and json.loads(r["payload"] or "{}").get("code") == "TableDropped"
    }


def dropped_before(spark: SparkSession, n: Names, source: str) -> set[int]:
    """The tables earlier runs found dropped (their ``TableDropped`` errors in ``_errors``)."""
    rows = delta_rs.bookkeeping_rows(
        spark, n.schema, "_errors", ["table_oid"], {"source": source, "code": "TableDropped"}
    )
    return {r["table_oid"] for r in rows if r["table_oid"] is not None}


def retire(tables: dict[int, TableInfo], oids: set[int], taken: set[str]) -> dict[int, TableInfo]:
    """Take the tables the source dropped out of ``tables`` (silver and gold hold the source's
    live tables; bronze keeps what was captured of them) and free their names, so a table
    created again under the same name takes them. Returns them (their silver tables to drop,
    their names for their errors)."""
    retired = {}
    for oid in sorted(oids & set(tables)):
        info = retired[oid] = tables.pop(oid)
        taken.discard(info.silver_table)
    return retired


def apply_schemas(
    tables: dict[int, TableInfo], control: list, cfg: Config, taken: set[str]
) -> list[str]:
    """Bronze's ``schema`` records (a table's columns at its snapshot) into ``tables``.

    A table snapshotted again under another name (capture resyncs a renamed table) takes the
    silver table name of its new one: returns the silver tables so left behind, to drop (the
    new snapshot rebuilds the table anyway)."""
    left: list[str] = []
    records = [(r, json.loads(r["payload"])) for r in control if r["kind"] == "schema"]
    for r, s in records:  # names freed by renames first: a new table may take one
        old = tables.get(r["table_oid"])
        if old and (old.schema, old.name) != (s["schema"], s["name"]):
            taken.discard(old.silver_table)
    for r, s in records:
        qualified = f"{s['schema']}.{s['name']}"
        cols = with_policies(
            qualified,
            cfg.policy(qualified),
            [column_entry(c) for c in s["columns"] if not c.get("generated")],
        )
        old = tables.get(r["table_oid"])
        silver_table = old.silver_table if old else None
        if old and (old.schema, old.name) != (s["schema"], s["name"]):
            silver_table = None
        if silver_table is None:
            silver_table = silver_table_name(s["schema"], s["name"], r["table_oid"], taken)
            if old and old.silver_table != silver_table:
                left.append(old.silver_table)
        tables[r["table_oid"]] = TableInfo(
            oid=r["table_oid"],
            schema=s["schema"],
            name=s["name"],
            silver_table=silver_table,
            snapshot_lsn=old.snapshot_lsn if old else None,
            snapshot_run=old.snapshot_run if old else None,
            snapshot_ranges=old.snapshot_ranges if old else None,
            primary_key=list(s["primary_key"]),
            not_null=[c["name"] for c in s["columns"] if c["not_null"]],
            columns=cols,  # a table snapshotted again is rebuilt with its columns of now
        )
    return left


def apply_rewinds(tables: dict[int, TableInfo], control: list, run: int) -> dict[int, int]:
    """Bronze's ``rewind`` records (a table's snapshot LSN) into ``tables``: the tables
    snapshotted in this run, with their snapshot LSNs."""
    new_snapshots: dict[int, int] = {}
    for r in control:
        if r["kind"] == "rewind" and r["table_oid"] in tables:
            info = tables[r["table_oid"]]
            info.snapshot_lsn = r["lsn"]
            info.snapshot_run = run
            info.snapshot_batch = r["batch_id"]
            payload = json.loads(r["payload"]) if r.get("payload") else {}
            info.snapshot_ranges = payload if payload.get("ranges") else None
            new_snapshots[r["table_oid"]] = r["lsn"]
    return new_snapshots


RELATION_TYPE, TRUNCATE_TYPE = message_type(MSG_RELATION), message_type(MSG_TRUNCATE)


def window_messages(rows: list) -> tuple[list[tuple[int, int, bytes]], list[tuple]]:
    """The window's Relation messages ``(lsn, ordinal, payload)`` and Truncates ``(lsn,
    ordinal, Truncate)``, from its rows of those types (``lsn, ordinal, payload, mtype``)."""
    relations = [
        (r["lsn"], r["ordinal"], bytes(r["payload"])) for r in rows if r["mtype"] == RELATION_TYPE
    ]
    truncates = [
        (r["lsn"], r["ordinal"], decode(bytes(r["payload"])))
        for r in rows
        if r["mtype"] == TRUNCATE_TYPE
    ]
    return relations, truncates


def earlier_relations(
    spark: SparkSession, n: Names, source: str, run: int
) -> list[tuple[int, int, bytes]]:
    """The Relation messages of the source that runs before ``run`` kept."""
    rows = delta_rs.bookkeeping_rows(
        spark, n.schema, "_relations", ["lsn", "ordinal", "payload", "run"], {"source": source}
    )
    return [(r["lsn"], r["ordinal"], bytes(r["payload"])) for r in rows if r["run"] < run]


def known_relations(
    earlier: list[tuple[int, int, bytes]], window: list[tuple[int, int, bytes]]
) -> Relations:
    """Every Relation message of the source: those earlier runs kept
    (:func:`earlier_relations`) and the window's."""
    relations: Relations = defaultdict(list)
    seen = set()
    for lsn, ordinal, payload in earlier + window:
        if (lsn, ordinal, payload) in seen:
            continue
        seen.add((lsn, ordinal, payload))
        rel = decode(payload)
        relations[rel.relid].append((lsn, ordinal, rel))
    return relations


def _new_column(name: str, type_oid: int, typmod: int, policy) -> dict:
    own = policy.column(name)
    return column_entry(
        {
            "name": name,
            "type_oid": type_oid,
            "typmod": typmod,
            "target": own.type,
            "infinity": own.infinity,
        }
    )


def add_stream_tables(
    tables: dict[int, TableInfo],
    relations: Relations,
    cfg: Config,
    taken: set[str],
    window: list[tuple[int, int, bytes]],
    retired: set[int],
) -> None:
    """Tables seen only through the stream (added to the publication, not yet snapshotted):
    first seen in this run's ``window`` (one seen before is in ``tables`` already), and not
    dropped at the source (``retired``: its last changes can land after its drop record)."""
    new = {decode(payload).relid for _, _, payload in window}
    for relid, rels in relations.items():
        if relid in tables or relid not in new or relid in retired:
            continue
        rels.sort(key=lambda e: (e[0], e[1]))
        first = rels[0][2]
        policy = cfg.policy(f"{first.namespace or 'pg_catalog'}.{first.name}")
        tables[relid] = TableInfo(
            oid=relid,
            schema=first.namespace or "pg_catalog",
            name=first.name,
            silver_table=silver_table_name(first.namespace, first.name, relid, taken),
            snapshot_lsn=None,
            primary_key=[c.name for c in first.columns if c.is_key],
            not_null=[],
            columns=[
                _new_column(c.name, c.type_oid, c.type_modifier, policy) for c in first.columns
            ],
        )


def truncates_by_table(
    truncates: list[tuple], tables: dict[int, TableInfo]
) -> dict[int, list[tuple[int, int]]]:
    """The window's truncates, ``(lsn, ordinal)`` per followed table."""
    truncate_at: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for lsn, ordinal, msg in truncates:
        assert isinstance(msg, Truncate)
        for relid in msg.relids:
            if relid in tables:
                truncate_at[relid].append((lsn, ordinal))
    return truncate_at


Layouts = dict[int, tuple[LayoutIndex, int]]
"""OID -> (the column layout of each of its Relations, the table's width)."""


def plan_layouts(
    tables: dict[int, TableInfo],
    relations: Relations,
    cfg: Config,
    f_from: int,
    recorded: Mapping[int, Mapping[str, CatalogColumn]] | None = None,
    follow: Mapping[int, Followed] | None = None,
    rebuilt: Mapping[int, int] | None = None,
) -> tuple[Layouts, dict[int, tuple[int, int]], list[ErrorRecord]]:
    """Each table's Relations laid out against its columns (new columns added to the table):
    the layouts, the COPY widths (OID -> (COPY columns, silver columns)), and a
    ``SchemaIncompatible`` error for each Relation in the window silver cannot follow.
    ``recorded``: OID -> column name -> the column as capture's newest catalog record of the
    table says (:func:`recorded_columns`); ``follow``: OID -> the
    drops and renames since the table's snapshot (:func:`followed_columns`), applied first;
    ``rebuilt``: OID -> snapshot LSN of the tables snapshotted in this run (their changes after
    it are read again, so their Relations after it may add columns)."""
    layouts: Layouts = {}
    copy_widths: dict[int, tuple[int, int]] = {}
    errors: list[ErrorRecord] = []
    recorded = recorded or {}
    follow = follow or {}
    for oid, info in tables.items():
        copy_width = len(info.columns)
        index, width = _table_layouts(
            info,
            relations.get(oid, []),
            cfg,
            f_from,
            errors,
            recorded.get(oid, {}),
            follow.get(oid),
            min(f_from, (rebuilt or {})[oid] + 1) if oid in (rebuilt or {}) else f_from,
        )
        layouts[oid] = (index, width)
        copy_widths[oid] = (copy_width, width)
    return layouts, copy_widths, errors


def unfollowed(
    tables: dict[int, TableInfo], layout_errors: list[ErrorRecord], cfg: Config
) -> dict[int, tuple[str, int]]:
    """The tables a new snapshot must make exact, why, and the last LSN it must cover: the
    Relations in this run's window that silver cannot follow (``layout_errors``, from
    :func:`plan_layouts`), under a policy that resyncs (``capture.schema_changes``' rule
    decides, as for the catalog's changes). Capture's catalog check takes most migrations
    before silver reads them; what it cannot tell apart shows here first: a rename or retype of
    a column added after the table's snapshot (the snapshot's catalog never knew it), a column
    added and renamed between two runs."""
    found: dict[int, list[str]] = defaultdict(list)
    last: dict[int, int] = {}
    for e in layout_errors:
        if e.table_oid not in tables or not e.message:
            continue
        if e.message not in found[e.table_oid]:
            found[e.table_oid].append(e.message)
        last[e.table_oid] = max(last.get(e.table_oid, 0), e.lsn or 0)
    out = {}
    for oid, problems in found.items():
        policy = cfg.policy(tables[oid].qualified_name).on_schema_change
        stream = [f"a change in the stream silver cannot follow ({p})" for p in problems]
        reason = Changes(unfollowable=stream).resync_reason(policy)
        if reason:
            out[oid] = (reason, last[oid])
    return out


def recorded_columns(
    followed: Mapping[int, tuple[int, dict]], tables: Mapping[int, TableInfo]
) -> dict[int, dict[str, CatalogColumn]]:
    """OID -> name -> live column, as capture's newest catalog record since the table's
    snapshot says (``followed``: ``Bronze.followed_catalogs``, OID -> (snapshot LSN,
    catalog)): for a column added since, what the stream does not say (the value rows from
    before it read, a domain's modifier, an array's dimensions)."""
    out = {}
    for oid, (snapshot_lsn, record) in followed.items():
        info = tables.get(oid)
        catalog = Catalog.from_record(record)
        if info is None or catalog is None or info.snapshot_lsn != snapshot_lsn:
            continue
        out[oid] = {c.name: c for c in catalog.columns if not c.dropped}
    return out


@dataclass
class Followed:
    """What silver does to a table's columns for the changes capture followed (drops,
    renames, widened types, NOT NULL, the primary key: :func:`followed_columns`)."""

    dropped: set[str] = field(default_factory=set)
    """Silver's columns the source dropped."""
    renamed: dict[str, str] = field(default_factory=dict)
    """Silver's column name -> its name at the source now."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Every name a Relation may give a followed column (its snapshot's name, silver's name)
    -> its name now; a dropped column's names -> "" (left out)."""
    attnums: dict[str, int] = field(default_factory=dict)
    """A renamed column's name now -> its attnum (kept in its entry from now on)."""
    not_null: list[str] | None = None
    """The table's NOT NULL columns now, where they changed (gold's rules follow them)."""
    primary_key: list[str] | None = None
    """The table's primary key now (silver's column names), where it changed: gold's rules and
    MERGE take it (a key with a column silver does not hold: none, as a snapshot has it)."""
    retyped: dict[str, CatalogColumn] = field(default_factory=dict)
    """A column's name now -> its catalog column, where the source widened its type
    (``capture.schema_changes.widens``): its entry takes the new type, and silver's column
    the new Spark type where that differs (``silver.write.widen_columns``)."""
    positional: list[str] | None = None
    """For a table with no column added or dropped since its snapshot (``by_position``): its
    column names now in attnum order, which is the order of every Relation since the
    snapshot; silver reads those by position (``silver.changes.plan_columns``)."""
    accepted: list[set[str]] = field(default_factory=list)
    """The name sets a Relation read by position may have (now, silver's before this run, at
    the snapshot); one with other names is a change silver cannot follow."""
    strict: bool = False
    """Under ``on_schema_change = "error"``: nothing is followed, and a Relation read by
    position must name silver's columns in their order (another order is a rename: it is
    ``SchemaIncompatible``, where reading it by its names would swap values)."""
    problem: str = ""
    """A column silver holds that the source no longer has and that it cannot follow: the
    table needs a new snapshot."""


def followed_columns(
    followed: Mapping[int, tuple[int, dict]],
    snapshots: Mapping[int, Mapping],
    tables: Mapping[int, TableInfo],
    cfg: Config,
    copied: set[int],
) -> dict[int, Followed]:
    """OID -> the drops and renames of the table's columns since its snapshot, as capture's
    newest catalog record says (``followed``: OID -> (snapshot LSN, catalog); ``snapshots``:
    OID -> its snapshot's schema record, whose catalog gives each column's attnum; a column
    silver renamed keeps its attnum in its entry). Only under ``on_schema_change = "follow"``
    (``error`` keeps the table as it was, and only checks that Relations read by position
    name its columns in their order), and not for a table whose snapshot this run reads (its
    COPY rows have the old columns: the Relations then ask for a new snapshot, as before;
    renames the Relations' names cannot show, a swap, are a ``problem`` then). A table with
    no column added or dropped since its snapshot is read by position (:func:`_by_position`:
    swaps too); otherwise capture follows renames and drops only for columns the snapshot
    had and with names no other column had, and snapshots the table again for the rest; a
    column silver holds that the record does not explain is a ``problem`` (a new snapshot
    too)."""
    out = {}
    for oid, (snapshot_lsn, record) in followed.items():
        info = tables.get(oid)
        if info is None or info.snapshot_lsn != snapshot_lsn:
            continue
        policy = cfg.policy(info.qualified_name)
        now = Catalog.from_record(record)
        then = Catalog.from_record((snapshots.get(oid) or {}).get("catalog"))
        if now is None or then is None or policy.on_schema_change == RESYNC:
            continue
        if oid in copied or policy.on_schema_change != FOLLOW:
            f = _by_position(info, then, now, policy)
            if f is not None and oid in copied and f.renamed:
                out[oid] = Followed(
                    problem="columns renamed (" + ", ".join(sorted(f.renamed)) + ") in a way"
                    " the Relations' names cannot show, while the table's snapshot is read"
                )
            elif f is not None:  # read by position, nothing followed (error: checked only)
                order = [e["name"] for e in sorted(info.columns, key=_attnum_of(then))]
                strict = policy.on_schema_change != FOLLOW
                out[oid] = Followed(positional=order, accepted=[set(order)], strict=strict)
            continue
        at_snapshot = {c.name: c.attnum for c in then.columns if not c.dropped}
        snapshot_name = {attnum: name for name, attnum in at_snapshot.items()}
        live = {c.name: c.attnum for c in now.columns if not c.dropped}
        by_attnum = {c.attnum: c for c in now.columns}
        f = _by_position(info, then, now, policy)
        if f is not None:
            if f.aliases or f.problem or f.retyped or f.positional:
                out[oid] = f
            continue
        f = Followed()
        for column in then.columns:  # later runs still read Relations with the old names
            now_column = by_attnum.get(column.attnum)
            if column.dropped or now_column is None or now_column.name == column.name:
                continue
            if column.name in live:  # the old name is another column's now: ambiguous
                f.problem = f"column {column.name} is another column at the source now"
            f.aliases[column.name] = "" if now_column.dropped else now_column.name
        for entry in info.columns:
            name = entry["name"]
            attnum = entry.get("attnum") or at_snapshot.get(name)
            if name in live:
                if attnum is not None and live[name] != attnum:
                    f.problem = f"column {name} is another column at the source now"
                else:
                    _widened(f, entry, by_attnum[live[name]], policy)
                continue
            column = by_attnum.get(attnum) if attnum is not None else None
            if column is None or attnum not in snapshot_name:
                f.problem = f"column {name} is no longer at the source"
            elif policy.columns.get(name) or policy.columns.get(column.name):
                f.problem = f"column {name} has a column policy and was renamed or dropped"
            elif column.dropped:
                f.dropped.add(name)
                f.aliases[name] = ""
            else:
                f.renamed[name] = column.name
                f.attnums[column.name] = attnum
                f.aliases[name] = column.name
                _widened(f, entry, column, policy)
        _constraints(f, info, now)
        changed = f.not_null is not None or f.primary_key is not None
        if f.aliases or f.problem or f.retyped or changed:
            out[oid] = f
    return out


def _attnum_of(then: Catalog):
    """A column entry's attnum: kept in it since a rename, else its name's in the snapshot's
    catalog ``then`` (None: a column added since)."""
    at_snapshot = {c.name: c.attnum for c in then.columns if not c.dropped}
    return lambda entry: entry.get("attnum") or at_snapshot.get(entry["name"])


def _by_position(info: TableInfo, then: Catalog, now: Catalog, policy) -> Followed | None:
    """The renames (and widenings) of a table with no column added or dropped since its
    snapshot (``then``), by attnum whatever the names, swaps included: every Relation message
    since the snapshot lists the same columns in attnum order, so silver reads each by
    position (``positional``), in this run and every later one: also a Relation whose names a
    swap and a swap back between two looks at the catalog gave (capture then records the
    catalog, see ``capture.run._renamed_back``). None where the table has had other changes
    (they follow by name) or is partitioned."""
    attnums = [_attnum_of(then)(entry) for entry in info.columns]
    by_attnum = {c.attnum: c for c in now.columns if not c.dropped}
    if not by_position(then, now) or any(a not in by_attnum for a in attnums):
        return None
    snapshot_names = {c.attnum: c.name for c in then.columns if not c.dropped}
    f = Followed()
    for attnum, entry in zip(attnums, info.columns, strict=True):
        column = by_attnum[attnum]
        if column.name != entry["name"]:
            if policy.columns.get(entry["name"]) or policy.columns.get(column.name):
                f.problem = f"column {entry['name']} has a column policy and was renamed"
            f.renamed[entry["name"]] = column.name
            f.attnums[column.name] = attnum
        _widened(f, entry, column, policy)
    f.positional = [by_attnum[a].name for a in sorted(attnums)]
    f.accepted = [
        set(f.positional),  # now
        {e["name"] for e in info.columns},  # as silver last had them
        {snapshot_names[a] for a in attnums if a in snapshot_names},  # at the snapshot
    ]
    _constraints(f, info, now)
    return f


def _constraints(f: Followed, info: TableInfo, now: Catalog) -> None:
    """The source's NOT NULL columns and primary key in ``f`` where they are not silver's
    (after ``f``'s drops and renames): gold's rules follow them. A key with a column silver
    does not hold is none, as a snapshot has it."""
    held = [f.renamed.get(c["name"], c["name"]) for c in info.columns if c["name"] not in f.dropped]
    now_not_null = {c.name for c in now.columns if c.not_null and not c.dropped}
    not_null = [name for name in held if name in now_not_null]
    if sorted(not_null) != sorted(f.renamed.get(n, n) for n in info.not_null if n not in f.dropped):
        f.not_null = not_null
    key = list(now.primary_key) if all(k in held for k in now.primary_key) else []
    if key != [f.renamed.get(k, k) for k in info.primary_key]:
        f.primary_key = key


def _widened(f: Followed, entry: dict, now: CatalogColumn, policy) -> None:
    """Note in ``f`` a widening of the column of ``entry`` to ``now``'s type (capture followed
    it: ``capture.schema_changes.widens``), or the problem that makes it a new snapshot: a
    new Spark type that cannot hold every value of the old one (a ``numeric(30)`` made
    unconstrained: silver's ``decimal(38,18)`` has 20 integer digits). A column with a column
    policy keeps the type the policy gives it (a hashed column lands as text, whatever its
    type at the source); a type that differs in another way is not a widening, and capture's
    verdict on it stands."""
    old = CatalogColumn(0, entry["name"], entry["type_oid"], entry["typmod"], *[False] * 4, "")
    if (old.type_oid, old.typmod) == (now.type_oid, now.typmod) or not widens(old, now):
        return
    if policy.columns.get(entry["name"]) or policy.columns.get(now.name):
        # its type in silver is the policy's (a hashed column is text), so the change is
        # nothing to it while the value's text stays (not so a numeric's new scale: 1.50 is
        # 1.5000 now, and its hash or string another)
        if old.type_oid == now.type_oid == 1700 and _scale(old.typmod) != _scale(now.typmod):
            f.problem = f"column {now.name} has a column policy and a new scale"
        return
    before = arrow_type(pg_type_of(entry))
    after = arrow_type(pg_type_of({**entry, "type_oid": now.type_oid, "typmod": now.typmod}))
    if not holds_every_value(before, after):
        f.problem = f"column {now.name} widened to {type_text(now)}, wider than silver holds"
        return
    f.retyped[now.name] = now


def _scale(typmod: int) -> int | None:
    return None if typmod < 4 else ((((typmod - 4) & 0x7FF) ^ 0x400) - 0x400)


def holds_every_value(before: pa.DataType, after: pa.DataType) -> bool:
    """Whether type ``after`` holds every value of ``before`` exactly."""
    if before == after:
        return True
    if before in INTEGER_TYPES and after in INTEGER_TYPES:
        return INTEGER_TYPES.index(after) >= INTEGER_TYPES.index(before)
    if pa.types.is_decimal(before) and pa.types.is_decimal(after):
        return after.scale >= before.scale and (
            after.precision - after.scale >= before.precision - before.scale
        )
    return False


def _follow(info: TableInfo, f: Followed) -> None:
    """``info``'s columns after the drops, renames and widenings of ``f`` (a renamed column
    keeps its attnum in its entry, since its snapshot's catalog knows it by its old name; a
    widened one its earlier types)."""
    columns = []
    for entry in info.columns:
        name = entry["name"]
        if name in f.dropped:
            continue
        if name in f.renamed:
            entry = {
                **entry,
                "name": f.renamed[name],
                "attnum": f.attnums[f.renamed[name]],
                # gold renames its column too (gold.table.ensure_gold)
                "renamed_from": [*entry.get("renamed_from", []), name],
            }
        columns.append(entry)
    info.columns = columns
    info.not_null = [f.renamed.get(n, n) for n in info.not_null if n not in f.dropped]
    if f.not_null is not None:
        info.not_null = list(f.not_null)
    info.primary_key = [f.renamed.get(n, n) for n in info.primary_key]
    if f.primary_key is not None:
        info.primary_key = list(f.primary_key)
    for i, entry in enumerate(info.columns):
        now = f.retyped.get(entry["name"])
        if now is None or (entry["type_oid"], entry["typmod"]) == (now.type_oid, now.typmod):
            continue
        info.columns[i] = {
            **entry,
            "type_oid": now.type_oid,
            "typmod": now.typmod,
            "type_name": type_text(now),
            # a new type is not the domain whose modifier the snapshot read
            **({"domain_typmod": -1} if now.type_oid != entry["type_oid"] else {}),
            # older Relation messages carry the old type: their text casts to the new one
            "widened_from": [*entry.get("widened_from", []), [entry["type_oid"], entry["typmod"]]],
        }


def _recorded_type(recorded: Mapping[str, CatalogColumn], name: str, type_oid: int) -> dict:
    """What capture's catalog record says of the type of column ``name``, added since the
    snapshot as ``type_oid`` (a domain's base type and modifier, an array's element type and
    dimensions, which a Relation message does not carry); nothing where it does not know the
    column with that type."""
    known = recorded.get(name)
    if known is None or known.type_oid != type_oid:
        return {}
    return {
        "base_type_oid": known.base_type_oid,
        "element_type_oid": known.element_type_oid,
        "category": known.category,
        "dims": known.dims,
        "domain_typmod": known.domain_typmod,
    }


def _table_layouts(
    info: TableInfo,
    relations: list,
    cfg: Config,
    f_from: int,
    errors: list[ErrorRecord],
    recorded: Mapping[str, CatalogColumn],
    follow: Followed | None,
    adds_from: int,
) -> tuple[LayoutIndex, int]:
    aliases: dict[str, str] = {}
    if follow is not None and not follow.problem:
        _follow(info, follow)
        aliases = follow.aliases
    base = [TableColumn(c["name"], c["type_oid"], c["typmod"]) for c in info.columns]
    rels = sorted(relations, key=lambda e: (e[0], e[1]))
    entries = {c["name"]: c for c in info.columns}

    def target_type(col: TableColumn) -> pa.DataType:
        entry = entries.get(col.name) or {
            "type_oid": col.type_oid,
            **_recorded_type(recorded, col.name, col.type_oid),
        }
        return arrow_type(pg_type_of(column_entry({**entry, "typmod": col.typmod})))

    final, rel_layouts = plan_columns(
        base,
        [(lsn, rel) for lsn, _, rel in rels],
        info.snapshot_lsn,
        target_type,
        aliases,
        adds_from,
        {c["name"]: {tuple(t) for t in c.get("widened_from", [])} for c in info.columns},
        None
        if follow is None or follow.problem or follow.positional is None
        else (follow.positional, follow.accepted, follow.strict),
    )
    for (lsn, _, _rel), layout in zip(rels, rel_layouts, strict=False):
        if layout.positions is None and lsn >= f_from:
            errors.append(ErrorRecord(info.oid, lsn, SchemaIncompatible.__name__, layout.problem))
    known = {c["name"] for c in info.columns}
    policy = cfg.policy(info.qualified_name)
    for c in final:
        if c.name not in known:
            entry = _new_column(c.name, c.type_oid, c.typmod, policy)
            entry.update(_recorded_type(recorded, c.name, c.type_oid))
            column = recorded.get(c.name)
            if column is not None and column.type_oid == c.type_oid and column.has_missing:
                if column.missing is not None:  # (none recorded for a withheld column)
                    entry["missing"] = column.missing
            info.columns.append(entry)
    rel_layouts = with_fill(rel_layouts, [c.get("missing") for c in info.columns])
    index = LayoutIndex(
        [((lsn, ordinal), lay) for (lsn, ordinal, _), lay in zip(rels, rel_layouts, strict=False)]
    )
    return index, len(final)
