"""Rows of a local Delta table found by key, file by file, and a commit that deletes them by
deletion vector and appends new rows: a MERGE that rewrites no file.

delta-rs 1.x reads deletion vectors and does not write them: its MERGE rewrites every file
that holds a matched row, and a 1% update wave puts a matched row in every file of a large
table. At 4M rows that MERGE rewrote the whole of gold each run (2.3 s of a 7.3 s run), and
finding the touched keys' rows took four more scans of it (2.3 s), because DataFusion takes a
list of at most 10,000 values in one query. Here:

- :func:`locate` reads each file's key columns alone, keeps the positions its deletion
  vector keeps and whose key is one of those asked for (a hash semi-join), then reads the
  rows at those positions: one pass over the key columns, and the whole rows only where
  they are wanted.
- :func:`delete_and_append` commits what Spark's MERGE commits on a table with deletion
  vectors enabled: per touched file a ``remove`` of it as it was and an ``add`` of it with a
  deletion vector of its old and new deleted positions (Delta's format, PROTOCOL.md
  "Deletion Vector Format": one file of vectors, each a 64-bit portable Roaring bitmap), one
  new file of the appended rows, the idempotency record (``txn``) and ``commitInfo``.

Only tables whose every rule a commit of this kind keeps take this path
(:func:`writable`): no partitions, column mapping by name or none, deletion vectors enabled,
and no feature in use whose rule a new file or a deletion would have to honour (constraints,
generated or identity columns, the change data feed, row tracking, append-only, in-commit
timestamps, clustering). Anything else raises :class:`Unsupported` and the caller writes
through delta-rs' MERGE or Spark, as before.

The same rows are what the semantics decide elsewhere (``gold.state.merge_operations``):
this module is a way to read and write them, never a rule of which rows change.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pgmedallion.core import delta_rs
from pgmedallion.core.naming import STATS_COLUMNS, parse_stats_columns, plain, stats_columns
from pgmedallion.core.parallel import concurrently

MAGIC = 1681511377
"""The first four bytes (little endian) of a serialized deletion vector."""

_COOKIE_NO_RUNS = 12346
"""Roaring's portable format: the cookie of a bitmap with no run containers."""

_ENGINE = "pgmedallion"

_READ_FEATURES = {"columnMapping", "deletionVectors", "timestampNtz", "vacuumProtocolCheck"}
_WRITE_FEATURES = {
    # Features a table of ours lists whose rules a deletion or a new file keeps, as long as
    # the table does not use them (checked below): Spark lists the legacy ones at (3, 7).
    "appendOnly",
    "invariants",
    "checkConstraints",
    "generatedColumns",
    "changeDataFeed",
    "columnMapping",
    "deletionVectors",
    "timestampNtz",
    "vacuumProtocolCheck",
}


log = logging.getLogger(__name__)

_FORMAT = ds.ParquetFileFormat()
_FS = pafs.LocalFileSystem()


class Unsupported(Exception):
    """The table is not one this module reads or writes correctly: the caller's other path."""


@dataclass
class Located:
    """Rows of one table version found by key, and where each one is."""

    path: str
    version: int
    rows: pa.Table
    """The rows, in the columns asked for (logical names, the table's Arrow types)."""
    files: list[str]
    """The table's files that hold a located row (paths relative to the table, decoded)."""
    file_of: np.ndarray
    """Per row, its file's index in :attr:`files`."""
    position: np.ndarray
    """Per row, its position in its file (counting rows the file's deletion vector deletes)."""
    kept: dict[str, np.ndarray]
    """Per file with a deletion vector at that version, which of its rows it keeps."""


@dataclass
class _Layout:
    schema: pa.Schema
    physical: dict[str, str]
    field_ids: dict[str, int | None]
    configuration: dict[str, str]


def _layout(table) -> _Layout:
    """The table's columns (Arrow, logical names) and their physical names, or
    :class:`Unsupported` for a table this module does not read."""
    protocol = table.protocol()
    metadata = table.metadata()
    configuration = dict(metadata.configuration)
    if metadata.partition_columns:
        raise Unsupported("partitioned")
    if (
        protocol.min_reader_version >= 3
        and not set(protocol.reader_features or ()) <= _READ_FEATURES
    ):
        raise Unsupported(f"reader features {sorted(protocol.reader_features or ())}")
    if protocol.min_reader_version > 3:
        raise Unsupported(f"reader version {protocol.min_reader_version}")
    mode = configuration.get("delta.columnMapping.mode", "none")
    if mode not in ("none", "name"):
        raise Unsupported(f"column mapping by {mode}")
    fields = json.loads(table.schema().to_json())["fields"]
    physical: dict[str, str] = {}
    field_ids: dict[str, int | None] = {}
    for f in fields:
        meta = f.get("metadata") or {}
        nested = json.dumps(f["type"])
        if mode != "none" and ('"struct"' in nested or '"map"' in nested):
            raise Unsupported(f"column {f['name']} has fields of its own under column mapping")
        physical[f["name"]] = meta.get("delta.columnMapping.physicalName", f["name"])
        field_ids[f["name"]] = meta.get("delta.columnMapping.id")
    arrow = pa.schema(table.schema().to_arrow())
    schema = pa.schema([f.with_type(delta_rs.plain_type(f.type)) for f in arrow])
    return _Layout(schema, physical, field_ids, configuration)


def writable(table) -> None:
    """Raises :class:`Unsupported` unless :func:`delete_and_append` keeps every rule of the
    table: deletion vectors enabled, no feature in use whose rule it would not honour."""
    layout = _layout(table)
    protocol = table.protocol()
    conf = layout.configuration
    if protocol.min_reader_version < 3 or protocol.min_writer_version < 7:
        raise Unsupported("no deletion vectors in the protocol")
    if "deletionVectors" not in (protocol.writer_features or ()):
        raise Unsupported("no deletion vectors in the protocol")
    if conf.get("delta.enableDeletionVectors", "false").lower() != "true":
        raise Unsupported("deletion vectors not enabled")
    writable_columns(table)
    if any(k.startswith("delta.constraints.") for k in conf):
        raise Unsupported("CHECK constraints")
    text = table.schema().to_json()
    for marker in ("delta.invariants", "delta.generationExpression", "delta.identity."):
        if marker in text:
            raise Unsupported(f"columns with {marker}")


def locate(
    path: str, key: pa.Table, names: list[str], most: int, workers: int = 2
) -> Located | None:
    """The rows of the table at ``path`` whose key columns (``key``'s column names) hold one
    of ``key``'s rows (a NULL equal to a NULL, as the MERGE matches), in columns ``names``;
    None when more than ``most`` rows do.

    Each file's key columns are read alone and joined to ``key`` (rows its deletion vector
    deletes left out); only then are the matched rows read, from the files that hold one.
    Raises :class:`Unsupported` for a table it does not read (see the module), or whose
    files Arrow cannot read in the table's types."""
    try:
        return _locate(path, key, names, most, workers)
    except pa.ArrowException as exc:
        raise Unsupported(f"a file Arrow cannot read as the table's columns: {exc}") from exc


def _locate(path: str, key: pa.Table, names: list[str], most: int, workers: int) -> Located | None:
    table = delta_rs.open_table(path)
    version = table.version()
    layout = _layout(table)
    for n in [*key.column_names, *names]:
        if n not in layout.physical:
            raise Unsupported(f"no column {n}")
    for f in key.schema:
        if not joinable(layout.schema.field(f.name).type):
            raise Unsupported(f"key column {f.name} of type {f.type}")
    key = _distinct(_cast(key, layout.schema))
    actions = pa.table(table.get_add_actions(flatten=True))
    files = [unquote(p) for p in actions.column("path").to_pylist()]
    kept = _keep_masks(table, path)
    root = Path(path)
    bounded = _in_bounds(actions, layout, key) if key.num_rows else np.zeros(len(files), bool)

    def matched(i: int) -> np.ndarray:
        if not bounded[i]:
            return np.zeros(0, np.int64)
        return _matched(root / files[i], layout, key, kept.get(files[i]))

    positions = concurrently(matched, list(range(len(files))), workers)
    total = sum(len(p) for p in positions)
    if total > most:
        return None
    hit = [i for i, p in enumerate(positions) if len(p)]

    def rows_of(i: int) -> pa.Table:
        return _read_rows(root / files[i], layout, names, positions[i])

    parts = [rows_of(i) for i in hit]  # each read decodes its columns in parallel
    empty = pa.schema([layout.schema.field(n) for n in names]).empty_table()
    rows = pa.concat_tables(parts) if parts else empty
    file_of = (
        np.concatenate([np.full(len(positions[i]), n, np.int32) for n, i in enumerate(hit)])
        if hit
        else np.zeros(0, np.int32)
    )
    position = np.concatenate([positions[i] for i in hit]) if hit else np.zeros(0, np.int64)
    return Located(path, version, rows, [files[i] for i in hit], file_of, position, kept)


def delete_below(
    path: str, column: str, bound: pa.Scalar, *, app: str, version: int, metadata: dict
) -> int | None:
    """The rows of the table at ``path`` whose ``column`` is below ``bound`` (a NULL is not)
    deleted by deletion vector in one commit (the idempotency record ``app`` at ``version``);
    how many, or None when another commit came first. Raises :class:`Unsupported` for a table
    it does not write."""
    table = delta_rs.open_table(path)
    version_read = table.version()
    layout = _layout(table)
    if column not in layout.physical:
        raise Unsupported(f"no column {column}")
    actions = pa.table(table.get_add_actions(flatten=True))
    files = [unquote(p) for p in actions.column("path").to_pylist()]
    kept = _keep_masks(table, path)
    root = Path(path)
    hits: list[tuple[int, np.ndarray]] = []
    for i, name in enumerate(files):
        values = _read(root / name, layout, [column]).column(0)
        below = pc.fill_null(pc.less(values, bound.cast(values.type)), False)
        mask = below.to_numpy(zero_copy_only=False)
        keep = kept.get(name)
        if keep is not None:
            mask[: len(keep)] &= keep[: len(mask)]
        if mask.any():
            hits.append((i, np.flatnonzero(mask)))
    if not hits:
        return 0
    located = Located(
        path,
        version_read,
        pa.table({}),
        [files[i] for i, _ in hits],
        np.concatenate([np.full(len(p), n, np.int32) for n, (_, p) in enumerate(hits)]),
        np.concatenate([p for _, p in hits]),
        kept,
    )
    empty = layout.schema.empty_table()
    count = len(located.position)
    done = delete_and_append(
        located, np.ones(count, bool), empty, app=app, version=version, metadata=metadata
    )
    return count if done else None


def _in_bounds(actions: pa.Table, layout: _Layout, key: pa.Table) -> np.ndarray:
    """Per file (``get_add_actions`` rows), whether its statistics let it hold one of
    ``key``'s rows: a one-column integer key with no NULL among its values, each file's
    minimum and maximum of it (bounds that stay true under a deletion vector); every file
    otherwise, and any file without them."""
    everything = np.ones(actions.num_rows, bool)
    if key.num_columns != 1 or key.column(0).null_count:
        return everything
    name = key.column_names[0]
    if not pa.types.is_integer(layout.schema.field(name).type):
        return everything
    low, high = f"min.{layout.physical[name]}", f"max.{layout.physical[name]}"
    if low not in actions.column_names or high not in actions.column_names:
        return everything
    values = np.sort(key.column(0).to_numpy())
    lows, highs = actions.column(low), actions.column(high)
    unknown = pc.or_(pc.is_null(lows), pc.is_null(highs)).to_numpy(zero_copy_only=False)
    first = np.searchsorted(values, pc.fill_null(lows, 0).to_numpy(zero_copy_only=False), "left")
    last = np.searchsorted(values, pc.fill_null(highs, 0).to_numpy(zero_copy_only=False), "right")
    return unknown | (last > first)


def matching(rows: pa.Table, key: pa.Table) -> np.ndarray:
    """Per row of ``rows``, whether its key columns (``key``'s column names) hold one of
    ``key``'s rows, a NULL equal to a NULL (the MERGE's ``IS NOT DISTINCT FROM``)."""
    if rows.num_rows == 0:
        return np.zeros(0, bool)
    mine = _cast(rows.select(key.column_names), rows.schema)
    mine = mine.append_column("__pos", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    out = np.zeros(rows.num_rows, bool)
    out[_found(mine, _distinct(_cast(key, rows.schema))).to_numpy()] = True
    return out


def _found(rows: pa.Table, key: pa.Table) -> pa.ChunkedArray:
    """``rows.__pos`` of the rows whose key columns (``key``'s column names) hold one of
    ``key``'s rows, a NULL equal to a NULL: a hash lookup (one column) or semi-join."""
    names = key.column_names
    if len(names) == 1:
        hit = pc.is_in(rows.column(names[0]), value_set=key.column(0), skip_nulls=False)
        return rows.filter(hit).column("__pos")
    left, on = _null_safe(rows, names)
    right, _ = _null_safe(key, names)
    return left.join(right, keys=on, join_type="left semi", use_threads=False).column("__pos")


def _null_safe(table: pa.Table, names: list[str]) -> tuple[pa.Table, list[str]]:
    """``table`` with each key column's NULLs replaced by a value of its type and a column
    saying which were NULL: a join on both matches NULL to NULL (Arrow's joins do not)."""
    on = list(names)
    for i, n in enumerate(names):
        column = table.column(n)
        flag = f"__null{i}"
        table = table.append_column(flag, pc.is_null(column))
        on.append(flag)
        if column.null_count:
            filled = pc.fill_null(column, _some_value(column.type))
            table = table.set_column(table.schema.get_field_index(n), n, filled)
    return table, on


def _some_value(t: pa.DataType) -> pa.Scalar:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.scalar("", t)
    if pa.types.is_binary(t):
        return pa.scalar(b"", t)
    if pa.types.is_boolean(t):
        return pa.scalar(False)
    if pa.types.is_decimal(t):
        from decimal import Decimal

        return pa.scalar(Decimal(0), t)
    if pa.types.is_date32(t):
        return pa.scalar(0, pa.int32()).cast(t)
    if pa.types.is_timestamp(t) or pa.types.is_date64(t):
        return pa.scalar(0, pa.int64()).cast(t)
    return pa.scalar(0, t)  # an integer


def joinable(t: pa.DataType) -> bool:
    """Whether :func:`locate` finds rows by a key column of type ``t`` (a hash join takes it
    exactly)."""
    return (
        pa.types.is_integer(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_decimal(t)
        or pa.types.is_boolean(t)
    )


def _cast(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows``' columns in the types of ``schema``'s columns of the same names."""
    return pa.table(
        [rows.column(n).cast(schema.field(n).type) for n in rows.column_names],
        names=rows.column_names,
    )


def _distinct(key: pa.Table) -> pa.Table:
    """``key``'s distinct rows (one NULL among them counts as one value)."""
    return key.group_by(key.column_names).aggregate([])


def _keep_masks(table, path: str) -> dict[str, np.ndarray]:
    """Per file with a deletion vector (relative path), which of its rows it keeps."""
    reader = pa.RecordBatchReader.from_stream(table.deletion_vectors())
    masks: dict[str, np.ndarray] = {}
    root = str(Path(path).resolve())
    for batch in reader:
        uris = batch.column("filepath").to_pylist()
        vectors = batch.column("selection_vector")
        for i, uri in enumerate(uris):
            local = unquote(urlparse(uri).path) if "://" in uri else uri
            relative = os.path.relpath(str(Path(local).resolve()), root)
            masks[relative] = vectors[i].values.to_numpy(zero_copy_only=False)
    return masks


def _matched(file: Path, layout: _Layout, key: pa.Table, keep: np.ndarray | None) -> np.ndarray:
    """The positions in ``file`` of rows its deletion vector keeps whose key is in ``key``."""
    names = key.column_names
    columns = _read(file, layout, names)
    n = columns.num_rows
    columns = columns.append_column("__pos", pa.array(np.arange(n, dtype=np.int64)))
    if keep is not None:
        mask = np.ones(n, bool)
        mask[: min(n, len(keep))] = keep[:n]
        columns = columns.filter(pa.array(mask))
    return np.sort(_found(columns, key).to_numpy())


def _fragment(file: Path, row_groups: list[int] | None = None):
    return _FORMAT.make_fragment(str(file), filesystem=_FS, row_groups=row_groups)


def _read(
    file: Path, layout: _Layout, names: list[str], row_groups: list[int] | None = None
) -> pa.Table:
    """Columns ``names`` of ``file`` (of its ``row_groups``, all by default), by logical name,
    in the table's types (a column the file predates is NULL). Read with the table's types
    given: a file delta-rs wrote would read its text as views otherwise, which Arrow's take
    and filter do not take, and a cast of them costs more than the read."""
    fragment = _fragment(file, row_groups)
    present = set(fragment.physical_schema.names)
    fields = [
        pa.field(layout.physical[n], layout.schema.field(n).type)
        for n in names
        if layout.physical[n] in present
    ]
    schema = pa.schema(fields)
    read = fragment.to_table(schema=schema, columns=schema.names, use_threads=True)
    rows = read.num_rows if fields else fragment.count_rows()
    arrays = [
        read.column(layout.physical[n])
        if layout.physical[n] in present
        else pa.nulls(rows, layout.schema.field(n).type)
        for n in names
    ]
    return pa.table(arrays, names=names)


def _read_rows(file: Path, layout: _Layout, names: list[str], positions: np.ndarray) -> pa.Table:
    """The rows at ``positions`` of ``file`` (only its row groups that hold one are read)."""
    meta = _fragment(file).metadata
    sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    starts = np.cumsum([0, *sizes])
    groups = sorted(set((np.searchsorted(starts, positions, side="right") - 1).tolist()))
    read = _read(file, layout, names, groups if len(groups) < len(sizes) else None)
    offsets = np.cumsum([0] + [sizes[g] for g in groups])
    wanted = np.zeros(int(offsets[-1]), bool)
    for j, g in enumerate(groups):  # a position among the row groups read
        inside = positions[(positions >= starts[g]) & (positions < starts[g + 1])]
        wanted[inside - starts[g] + offsets[j]] = True
    # The positions are ascending, so a filter keeps their order; it works chunk by chunk,
    # where a take from the many chunks of a read costs more.
    return read.filter(pa.array(wanted))


def delete_and_append(
    located: Located,
    deleted: np.ndarray,
    appended: pa.Table,
    *,
    app: str,
    version: int,
    metadata: dict[str, str] | None = None,
) -> bool:
    """One commit to the table ``located`` was read from: the located rows where
    ``deleted`` is true deleted by deletion vector, ``appended`` (logical column names, all
    of the table's) added as one new file, the idempotency record ``app`` at ``version`` and
    ``metadata`` (``commitInfo`` entries, as ``userMetadata``). False, having committed
    nothing, when the table has a commit past the one read (the caller's other path then);
    raises :class:`Unsupported` for a table it does not write."""
    table = delta_rs.open_table(located.path)
    if table.version() != located.version:
        return False
    writable(table)
    layout = _layout(table)
    if sorted(appended.column_names) != sorted(layout.schema.names):
        raise Unsupported("the appended rows' columns are not the table's")
    for f in layout.schema:
        if not f.nullable and appended.column(f.name).null_count:
            raise Unsupported(f"a NULL for the NOT NULL column {f.name}")
    root = Path(located.path)
    log_dir = root / "_delta_log"
    now = int(time.time() * 1000)
    written: list[Path] = []
    try:
        actions: list[dict] = []
        if appended.num_rows:
            add, file = _write_file(root, layout, appended, now)
            written.append(file)
            actions.append({"add": add})
        chosen = deleted.astype(bool)
        touched = sorted(set(located.file_of[chosen].tolist()))
        if touched:
            current = _current_adds(log_dir, located.version, [located.files[i] for i in touched])
            vectors: list[tuple[dict, np.ndarray]] = []
            for i in touched:
                name = located.files[i]
                old = current[name]
                new = located.position[chosen & (located.file_of == i)]
                keep = located.kept.get(name)
                gone = np.zeros(max(len(keep) if keep is not None else 0, int(new.max()) + 1), bool)
                if keep is not None:
                    gone[: len(keep)] = ~keep
                gone[new] = True
                vectors.append((old, np.flatnonzero(gone)))
            dv_file, descriptors = _write_vectors(root, [v for _, v in vectors])
            written.append(dv_file)
            for (old, positions), descriptor in zip(vectors, descriptors, strict=True):
                actions.append({"remove": _removal(old, now)})
                records = _records(old)
                if records is not None and len(positions) >= records:
                    continue  # every row deleted: the file goes
                added = dict(old)
                added["deletionVector"] = descriptor
                added["dataChange"] = True
                added["stats"] = _loose(old.get("stats"))
                actions.append({"add": added})
        txn = {"txn": {"appId": app, "version": int(version), "lastUpdated": now}}
        user = (metadata or {}).get("userMetadata")
        return _commit_actions(
            located.path, located.version, "MERGE", [txn, *actions], now, layout, written, user
        )
    except BaseException:
        _remove(written)
        raise


def _commit_actions(
    path: str,
    read: int,
    operation: str,
    actions: list[dict],
    now: int,
    layout: _Layout,
    written: list[Path],
    user: str | None = None,
) -> bool:
    """Commits ``actions`` (with ``commitInfo``) as version ``read + 1`` of the table at
    ``path``; a checkpoint at its interval. False when another writer made that version
    first: the files ``written`` for the commit are removed."""
    info = {
        "timestamp": now,
        "operation": operation,
        "operationParameters": {},
        "readVersion": read,
        "isBlindAppend": False,
        "engineInfo": _ENGINE,
        "txnId": str(uuid.uuid4()),
    }
    if user is not None:
        info["userMetadata"] = user
    body = "".join(
        json.dumps(a, separators=(",", ":")) + "\n" for a in [{"commitInfo": info}, *actions]
    )
    if not _commit(Path(path) / "_delta_log", read + 1, body):
        _remove(written)
        return False
    _checkpoint_every(path, read + 1, layout.configuration)
    return True


def _remove(files: list[Path]) -> None:
    for f in files:
        f.unlink(missing_ok=True)


SMALL_FILE_ROWS = 250_000
"""A file with fewer live rows than this is small: :func:`compact` packs such files together."""

MOSTLY_DELETED = 0.3
"""A file whose deletion vector deletes more than this share of its rows is rewritten by
:func:`compact` (its reads pay for rows no one sees)."""


def compact(path: str, most_rows: int = 1_000_000) -> bool:
    """The table's small files (:data:`SMALL_FILE_ROWS`) and mostly deleted ones
    (:data:`MOSTLY_DELETED`) rewritten as files of at most ``most_rows`` live rows, in one
    commit that changes no data (what Delta's ``OPTIMIZE`` does, and its purge of deletion
    vectors). True when done or when nothing needed it; False when the table is not one this
    module writes or was written meanwhile (the caller's ``OPTIMIZE`` then)."""
    try:
        table = delta_rs.open_table(path)
        writable(table)
        layout = _layout(table)
        version = table.version()
        actions = pa.table(table.get_add_actions(flatten=True)).select(["path", "num_records"])
        files = [unquote(p) for p in actions.column("path").to_pylist()]
        records = actions.column("num_records").to_pylist()
        if any(n is None for n in records):
            raise Unsupported("a file without its row count")
        kept = _keep_masks(table, path)
        live = {}
        for name, n in zip(files, records, strict=True):
            keep = kept.get(name)
            live[name] = int(keep.sum()) + max(0, n - len(keep)) if keep is not None else n
        chosen = [
            name
            for name, n in zip(files, records, strict=True)
            if live[name] < SMALL_FILE_ROWS or (n and 1 - live[name] / n > MOSTLY_DELETED)
        ]
        if len(chosen) < 2 and not any(name in kept for name in chosen):
            return True
        root = Path(path)
        names = layout.schema.names
        now = int(time.time() * 1000)
        current = _current_adds(root / "_delta_log", version, chosen)
        out: list[dict] = []
        written: list[Path] = []
        pending: list[pa.Table] = []
        pending_rows = 0

        def flush() -> None:
            nonlocal pending, pending_rows
            if pending_rows:
                add, file = _write_file(root, layout, pa.concat_tables(pending), now)
                add["dataChange"] = False
                written.append(file)
                out.append({"add": add})
            pending, pending_rows = [], 0

        try:
            for name in chosen:
                rows = _read(root / name, layout, names)
                keep = kept.get(name)
                if keep is not None:
                    mask = np.ones(rows.num_rows, bool)
                    mask[: min(rows.num_rows, len(keep))] = keep[: rows.num_rows]
                    rows = rows.filter(pa.array(mask))
                for start in range(0, rows.num_rows, most_rows):
                    part = rows.slice(start, most_rows)
                    if pending_rows + part.num_rows > most_rows:
                        flush()
                    pending.append(part)
                    pending_rows += part.num_rows
                removed = _removal(current[name], now)
                removed["dataChange"] = False
                out.append({"remove": removed})
            flush()
            return _commit_actions(path, version, "OPTIMIZE", out, now, layout, written)
        except BaseException:
            _remove(written)
            raise
    except (Unsupported, pa.ArrowException):
        return False


@dataclass
class Altered:
    """What :func:`alter_columns` changed: columns added, renamed (their old names), dropped."""

    added: list[str]
    renamed: list[str]
    dropped: list[str]


def alter_columns(
    path: str,
    add: Sequence[tuple[str, dict | str]] = (),
    renames: Mapping[str, str] | None = None,
    drops: Sequence[str] = (),
    before: str | None = None,
) -> Altered | None:
    """The column-mapped table at ``path``'s columns changed by a commit of its metadata alone,
    as Spark's ``ALTER TABLE`` writes it under column mapping by name (delta-rs 1.x refuses
    these under column mapping); no file is touched, since files are read by physical names:

    - ``renames`` (old -> new): the logical name changes, only while the old name is there and
      the new one is not;
    - ``drops``: the columns there leave the schema;
    - the statistics columns (``delta.dataSkippingStatsColumns``) follow both, as Spark's do
      (a column renamed to a name that needs quoting leaves them: with such a name listed,
      Delta 4.x fails to drop any other column, see :func:`pgmedallion.core.naming.plain`);
    - ``add`` (``(name, Delta's JSON type)``): nullable, last or ``before`` the column of that
      name, each a new id (``delta.columnMapping.maxColumnId`` + 1) and physical name; a name
      the table has is left alone (in another case: refused, Spark's names ignore case).

    So a call repeated after a crash does what is left. None, with nothing written, where this
    cannot: a table not mapped by name, partitioned or with CHECK constraints, generated
    columns or clustering (rules a rename or drop must keep), an added
    type with fields of its own or a ``timestamp_ntz`` the protocol does not list, or another
    writer committing first: the caller goes to Spark."""
    table = delta_rs.open_table(path)
    altered = _altered(table, add, renames or {}, drops, before)
    if altered is None:
        return None
    done, action, config, _ = altered
    if not (done.added or done.renamed or done.dropped):
        return done
    now = int(time.time() * 1000)
    layout = _Layout(pa.schema([]), {}, {}, config)  # the commit needs its configuration only
    operation = "ADD COLUMNS" if done.added else "RENAME COLUMN" if done.renamed else "DROP COLUMNS"
    if not _commit_actions(
        path, table.version(), operation, [{"metaData": action}], now, layout, []
    ):
        return None
    return done


def restate(
    path: str, values: pa.Table, older: tuple[str, int] | None = None, before: str | None = None
) -> bool:
    """Columns added to the column-mapped table at ``path`` (``values``: one row, a typed value
    per new column, added last or ``before`` the column of that name) that hold their value in
    every row where column ``older[0]`` is below ``older[1]``, or in every row without
    ``older`` (NULL in the others), in one commit: the schema and every file
    rewritten, so no reader sees those rows without the value (Spark's ``overwrite`` with
    ``mergeSchema`` makes the same). The rows are read into memory: the caller bounds the
    table's size. A column the table has already (a redo after a crash) is restated again.
    False, with nothing written, where this cannot (see :func:`alter_columns`, and the
    tables :func:`delete_and_append` refuses): the caller goes to Spark."""
    table = delta_rs.open_table(path)
    try:
        writable_columns(table)
        old = _layout(table)
    except Unsupported:
        return False
    names = list(values.column_names)
    types = [(n, _json_type(values.schema.field(n).type)) for n in names]
    if any(t is None for _, t in types):
        return False
    fresh = [(n, t) for n, t in types if n not in old.schema.names]
    altered = _altered(table, fresh, {}, (), before)
    if altered is None:
        return False
    _, action, config, fields = altered
    layout = _Layout(
        pa.schema([*old.schema, *(values.schema.field(n) for n, _ in fresh)]),
        {
            **old.physical,
            **{f["name"]: f["metadata"]["delta.columnMapping.physicalName"] for f in fields},
        },
        {**old.field_ids, **{f["name"]: f["metadata"]["delta.columnMapping.id"] for f in fields}},
        config,
    )
    root, version = Path(path), table.version()
    now = int(time.time() * 1000)
    try:
        actions = pa.table(table.get_add_actions(flatten=True)).select(["path"])
        files = [unquote(p) for p in actions.column("path").to_pylist()]
        kept = _keep_masks(table, path)
        current = _current_adds(root / "_delta_log", version, files)
    except (Unsupported, pa.ArrowException, KeyError) as exc:
        log.debug("no restate of %s by a commit of ours (%s)", path, exc)
        return False
    out: list[dict] = [{"metaData": action}] if fresh else []
    written: list[Path] = []
    try:
        for name in files:
            rows = _read(root / name, old, old.schema.names)
            keep = kept.get(name)
            if keep is not None:
                mask = np.ones(rows.num_rows, bool)
                mask[: min(rows.num_rows, len(keep))] = keep[: rows.num_rows]
                rows = rows.filter(pa.array(mask))
            if older is None:
                earlier = pa.array(np.ones(rows.num_rows, bool))
            else:
                earlier = pc.fill_null(pc.less(rows.column(older[0]), older[1]), False)
            for n in names:
                value = values.column(n)[0]
                filled = pc.if_else(earlier, value, pa.scalar(None, value.type))
                if n in rows.column_names:
                    filled = pc.if_else(earlier, value, rows.column(n))
                    rows = rows.set_column(rows.column_names.index(n), n, filled)
                else:
                    rows = rows.append_column(n, filled)
            out.append({"remove": _removal(current[name], now)})
            if rows.num_rows:
                add, file = _write_file(root, layout, rows, now)
                written.append(file)
                out.append({"add": add})
        return _commit_actions(path, version, "WRITE", out, now, layout, written)
    except BaseException:
        _remove(written)
        raise


def writable_columns(table) -> None:
    """Raises :class:`Unsupported` unless a rewrite of the table's files keeps its rules (those
    :func:`writable` checks, deletion vectors aside)."""
    conf = dict(table.metadata().configuration)
    unknown = set(table.protocol().writer_features or ()) - _WRITE_FEATURES
    if unknown:
        raise Unsupported(f"writer features {sorted(unknown)}")
    if conf.get("delta.appendOnly", "false").lower() == "true":
        raise Unsupported("append-only")
    if conf.get("delta.enableChangeDataFeed", "false").lower() == "true":
        raise Unsupported("change data feed")


def _json_type(t: pa.DataType) -> str | None:
    """Delta's JSON type of a plain Arrow type (None: one :func:`restate` does not add)."""
    plain = {
        pa.bool_(): "boolean",
        pa.int16(): "short",
        pa.int32(): "integer",
        pa.int64(): "long",
        pa.float32(): "float",
        pa.float64(): "double",
        pa.string(): "string",
        pa.large_string(): "string",
        pa.binary(): "binary",
        pa.date32(): "date",
    }
    if t in plain:
        return plain[t]
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t) and t.tz is not None:
        return "timestamp"
    return None


def _altered(
    table,
    add: Sequence[tuple[str, dict | str]],
    renames: Mapping[str, str],
    drops: Sequence[str],
    before: str | None,
) -> tuple[Altered, dict, dict[str, str], list[dict]] | None:
    """:func:`alter_columns`' changes to the table's metadata: what changed, the new
    ``metaData`` action, its configuration and the added fields; None where it cannot."""
    metadata, protocol = table.metadata(), table.protocol()
    config = dict(metadata.configuration)
    text = table.schema().to_json()
    try:
        writable_columns(table)
    except Unsupported:
        return None
    if (
        config.get("delta.columnMapping.mode") != "name"
        or metadata.partition_columns
        or any(k.startswith("delta.constraints.") for k in config)
        or "delta.generationExpression" in text
        or "delta.invariants" in text
        or {"clustering", "domainMetadata"} & set(protocol.writer_features or ())
    ):
        return None
    listed = None
    if STATS_COLUMNS in config:
        listed = parse_stats_columns(config[STATS_COLUMNS])
        if listed is None:
            return None
    schema = json.loads(text)
    fields = schema["fields"]
    done = Altered([], [], [])
    for old, new in sorted(renames.items()):
        names = {f["name"] for f in fields}
        if old in names and new not in names:
            if new.lower() in {n.lower() for n in names - {old}}:
                return None  # Spark's names are case-insensitive: two columns would clash
            next(f for f in fields if f["name"] == old)["name"] = new
            done.renamed.append(old)
    gone = {d for d in drops if d in {f["name"] for f in fields}}
    fields[:] = [f for f in fields if f["name"] not in gone]
    done.dropped = sorted(gone)
    features = set(protocol.reader_features or ())
    most = int(config.get("delta.columnMapping.maxColumnId", "0"))
    names = [f["name"] for f in fields]
    at = names.index(before) if before in names else len(names)
    have = {n.lower() for n in names}
    added: list[dict] = []
    for name, dtype in add:
        kind = json.dumps(dtype)
        if name in names:
            continue
        if name.lower() in have:
            return None  # another column of that name in another case: they would clash
        if '"struct"' in kind or '"map"' in kind:
            return None
        if "timestamp_ntz" in kind and "timestampNtz" not in features:
            return None
        most += 1
        have.add(name.lower())
        meta = {
            "delta.columnMapping.id": most,
            "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}",
        }
        field = {"name": name, "type": dtype, "nullable": True, "metadata": meta}
        fields.insert(at + len(added), field)
        added.append(field)
        done.added.append(name)
    config["delta.columnMapping.maxColumnId"] = str(most)
    if listed is not None:  # the statistics columns follow renames and drops, as Spark's do
        renamed = {old.lower(): new for old, new in renames.items() if old in done.renamed}
        gone = {d.lower() for d in done.dropped}
        gone |= {old for old, new in renamed.items() if not plain(new)}  # would need quoting
        listed = [renamed.get(c.lower(), c) for c in listed if c.lower() not in gone]
        config[STATS_COLUMNS] = stats_columns(listed)
    action = {
        "id": metadata.id,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(schema, separators=(",", ":")),
        "partitionColumns": [],
        "configuration": config,
        "createdTime": metadata.created_time,
    }
    if metadata.name:
        action["name"] = metadata.name
    if metadata.description:
        action["description"] = metadata.description
    return done, action, config, added


def _commit(log_dir: Path, version: int, body: str) -> bool:
    """Writes commit ``version`` unless another writer made it first (a hard link is created
    only where no file is: Delta's mutual exclusion on a local file system)."""
    temp = log_dir / f".{version:020d}.json.{uuid.uuid4().hex}.tmp"
    temp.write_text(body)
    try:
        with open(temp, "rb+") as f:
            os.fsync(f.fileno())
        os.link(temp, log_dir / f"{version:020d}.json")
    except FileExistsError:
        return False
    finally:
        temp.unlink(missing_ok=True)
    return True


def _checkpoint_every(path: str, version: int, configuration: dict[str, str]) -> None:
    """A checkpoint at every ``delta.checkpointInterval``-th version (10, Spark's default):
    delta-rs writes them after its own commits, not after these, and without them every
    reader of a table written only here would replay its whole log."""
    interval = int(configuration.get("delta.checkpointInterval", "10") or 10)
    if interval > 0 and version % interval == 0:
        try:
            delta_rs.open_table(path).create_checkpoint()
        except Exception as exc:  # the commit stands; a later one writes the checkpoint
            log.debug("no checkpoint at %s version %d (%s)", path, version, exc)


def _records(add: dict) -> int | None:
    stats = add.get("stats")
    if not stats:
        return None
    value = json.loads(stats).get("numRecords")
    return int(value) if value is not None else None


def _loose(stats: str | None) -> str | None:
    """A file's statistics once a deletion vector hides some of its rows: its bounds still
    hold and are no longer tight (Delta's ``tightBounds``), and its NULL counts no longer
    count only live rows, so they go."""
    if not stats:
        return stats
    parsed = json.loads(stats)
    parsed.pop("nullCount", None)
    parsed["tightBounds"] = False
    return json.dumps(parsed, separators=(",", ":"))


def _removal(add: dict, now: int) -> dict:
    removed = {
        "path": add["path"],
        "deletionTimestamp": now,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": add.get("partitionValues") or {},
        "size": add["size"],
    }
    records = _records(add)
    if records is not None:
        removed["stats"] = json.dumps({"numRecords": records}, separators=(",", ":"))
    if add.get("deletionVector"):
        removed["deletionVector"] = add["deletionVector"]
    return removed


def _current_adds(log_dir: Path, version: int, files: list[str]) -> dict[str, dict]:
    """The ``add`` actions by which ``files`` (decoded relative paths) are in the table at
    ``version``, read from its log: the newest checkpoint at or before it, then its commits.
    A file is its path and deletion vector: a commit that gives a file a new vector adds the
    pair and removes the old one."""
    wanted = set(files)
    found: dict[tuple[str, str], dict | None] = {}
    start = 0
    checkpoint = _checkpoint(log_dir, version)
    if checkpoint is not None:
        start = checkpoint[0] + 1
        for part in checkpoint[1]:
            adds = pq.read_table(part, columns=["add"]).column("add")
            adds = adds.filter(pc.is_valid(adds))
            paths = [unquote(p) for p in pc.struct_field(adds, "path").to_pylist()]
            hits = [j for j, p in enumerate(paths) if p in wanted]
            if hits:
                for row in adds.take(pa.array(hits)).to_pylist():
                    add = _plain_add(row)
                    found[(unquote(add["path"]), _vector_id(add))] = add
    for v in range(start, version + 1):
        with open(log_dir / f"{v:020d}.json", encoding="utf-8") as f:
            for line in f:
                action = json.loads(line)
                kind = "add" if "add" in action else "remove" if "remove" in action else None
                if kind is None:
                    continue
                body = action[kind]
                p = unquote(body["path"])
                if p in wanted:
                    found[(p, _vector_id(body))] = body if kind == "add" else None
    out: dict[str, dict] = {}
    for (p, _), add in found.items():
        if add is not None:
            if p in out:
                raise Unsupported(f"the log adds {p} twice at version {version}")
            out[p] = add
    missing = [p for p in files if p not in out]
    if missing:
        raise Unsupported(f"the log does not add {missing[0]} at version {version}")
    return {p: out[p] for p in files}


def _vector_id(action: dict) -> str:
    """A file action's deletion vector as Delta identifies it (empty: none)."""
    dv = action.get("deletionVector")
    if not dv:
        return ""
    ident = f"{dv['storageType']}{dv['pathOrInlineDv']}"
    return ident if dv.get("offset") is None else f"{ident}@{dv['offset']}"


def _plain_add(row: dict) -> dict:
    """A checkpoint's ``add`` row as the JSON action (no NULL fields, no parsed stats)."""
    out = {k: v for k, v in row.items() if v is not None and k not in ("stats_parsed", "tags")}
    if isinstance(out.get("partitionValues"), list):  # a map read as key/value pairs
        out["partitionValues"] = dict(out["partitionValues"])
    if row.get("tags"):
        tags = row["tags"]
        out["tags"] = dict(tags) if isinstance(tags, list) else tags
    if out.get("deletionVector"):
        out["deletionVector"] = {k: v for k, v in out["deletionVector"].items() if v is not None}
    return out


def _checkpoint(log_dir: Path, version: int) -> tuple[int, list[Path]] | None:
    """The newest classic checkpoint at or before ``version``: its version and parts."""
    best: dict[int, list[Path]] = {}
    for entry in log_dir.iterdir():
        name = entry.name
        if ".checkpoint" not in name or not name.endswith(".parquet"):
            continue
        v = int(name.split(".")[0])
        if v <= version:
            best.setdefault(v, []).append(entry)
    for v in sorted(best, reverse=True):
        parts = best[v]
        if len(parts) == 1 and parts[0].name == f"{v:020d}.checkpoint.parquet":
            return v, parts
        numbered = [p for p in parts if p.name.count(".") == 4]
        if numbered:
            total = int(numbered[0].name.split(".")[3])
            if len({p.name for p in numbered}) == total:
                return v, sorted(numbered)
        raise Unsupported(f"checkpoint {v} is not a classic one")
    return None


def _write_file(root: Path, layout: _Layout, rows: pa.Table, now: int) -> tuple[dict, Path]:
    """``rows`` as a new Parquet file of the table (physical column names, field ids) and its
    ``add`` action with statistics (row count; NULL counts and integer bounds of the columns
    ``delta.dataSkippingStatsColumns`` lists, or of every column without it)."""
    fields, arrays = [], []
    stats = {"numRecords": rows.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    listed = parse_stats_columns(layout.configuration.get(STATS_COLUMNS, "")) or None
    kept = None if listed is None else {c.lower() for c in listed}
    for f in layout.schema:
        column = rows.column(f.name).cast(f.type)
        p = layout.physical[f.name]
        meta = {}
        if layout.field_ids.get(f.name) is not None:
            meta[b"PARQUET:field_id"] = str(layout.field_ids[f.name]).encode()
        fields.append(pa.field(p, f.type, True, meta or None))
        arrays.append(column)
        if pa.types.is_nested(f.type) or (kept is not None and f.name.lower() not in kept):
            continue
        stats["nullCount"][p] = column.null_count
        if pa.types.is_integer(f.type) and column.null_count < len(column):
            low, high = pc.min_max(column).values()
            stats["minValues"][p] = low.as_py()
            stats["maxValues"][p] = high.as_py()
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    file = root / name
    pq.write_table(
        pa.Table.from_arrays(arrays, schema=pa.schema(fields)), file, compression="snappy"
    )
    add = {
        "path": name,
        "partitionValues": {},
        "size": file.stat().st_size,
        "modificationTime": now,
        "dataChange": True,
        "stats": json.dumps(stats, separators=(",", ":")),
    }
    return add, file


def _write_vectors(root: Path, vectors: list[np.ndarray]) -> tuple[Path, list[dict]]:
    """One deletion vector file holding ``vectors`` (positions), and their descriptors."""
    ident = uuid.uuid4()
    file = root / f"deletion_vector_{ident}.bin"
    out = bytearray(b"\x01")  # the format's version
    descriptors = []
    for positions in vectors:
        data = serialize(positions)
        offset = len(out)
        out += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
        descriptors.append(
            {
                "storageType": "u",
                "pathOrInlineDv": z85(ident.bytes),
                "offset": offset,
                "sizeInBytes": len(data),
                "cardinality": int(len(positions)),
            }
        )
    with open(file, "wb") as f:
        f.write(out)
        f.flush()
        os.fsync(f.fileno())
    return file, descriptors


def serialize(positions: np.ndarray) -> bytes:
    """Deleted row positions as a deletion vector's bytes: the magic number, then a 64-bit
    Roaring bitmap in the portable format (its 32-bit buckets, each a portable bitmap)."""
    values = np.unique(np.asarray(positions, np.uint64))
    high = (values >> np.uint64(32)).astype(np.uint32)
    buckets = np.unique(high)
    out = bytearray(struct.pack("<I", MAGIC))
    out += struct.pack("<Q", len(buckets))
    for b in buckets:
        low = (values[high == b] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        out += struct.pack("<I", int(b)) + _roaring32(low)
    return bytes(out)


def _roaring32(values: np.ndarray) -> bytes:
    """Sorted distinct 32-bit values as Roaring's portable serialization, with array and
    bitmap containers (no run containers, which readers need not be given)."""
    keys = (values >> 16).astype(np.uint16)
    containers, starts = np.unique(keys, return_index=True)
    ends = [*starts[1:].tolist(), len(values)]
    header = bytearray(struct.pack("<II", _COOKIE_NO_RUNS, len(containers)))
    bodies = []
    for k, start, end in zip(containers.tolist(), starts.tolist(), ends, strict=True):
        low = (values[start:end] & 0xFFFF).astype(np.uint16)
        header += struct.pack("<HH", k, len(low) - 1)
        if len(low) <= 4096:
            bodies.append(low.astype("<u2").tobytes())
        else:
            bits = np.zeros(65536, bool)
            bits[low] = True
            bodies.append(np.packbits(bits, bitorder="little").tobytes())
    offset = len(header) + 4 * len(containers)
    for body in bodies:
        header += struct.pack("<I", offset)
        offset += len(body)
    return bytes(header) + b"".join(bodies)


_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85(data: bytes) -> str:
    """ZeroMQ's Base85 of ``data`` (a multiple of 4 bytes): how Delta names a deletion
    vector's file (its UUID) in a descriptor."""
    out = []
    for i in range(0, len(data), 4):
        (value,) = struct.unpack(">I", data[i : i + 4])
        chunk = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chunk.append(_Z85[digit])
        out.extend(reversed(chunk))
    return "".join(out)
