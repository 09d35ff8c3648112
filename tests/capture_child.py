"""Capture in a process of its own, for the crash and memory tests, and bronze replay helpers.

Run as ``python -m tests.capture_child SPEC.json`` from the repository root. The spec names the
source (conninfo, slot, publication), a state directory of the child's own (bronze is
``warehouse/<schema>.db/<table>`` under it, where a local Spark session would keep it; the
test process reads it by path) and the stream limits, and whether to stream continuously
(until SIGINT/SIGTERM). The child captures as a local ``pgmedallion run --stage capture``
does: without Spark, bronze written by delta-rs. It prints one JSON line: the capture result,
the process's peak RSS (``VmHWM``) and whether pyspark was ever imported, then exits 0; a
capture error exits 1 with its message.

:func:`replay` rebuilds a table from bronze rows the way silver will: the snapshot's rows, then
for each commit LSN above the snapshot LSN the messages of one run that reached its Commit.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.common import peak_rss_kib
from pgmedallion.bronze.table import copy_lines
from pgmedallion.capture.copy_text import decode_copy_row
from pgmedallion.capture.pgoutput import (
    UNCHANGED_TOAST,
    Commit,
    Delete,
    Insert,
    Relation,
    Update,
    decode,
)


def main(spec_path: str) -> int:
    from pgmedallion.capture.errors import PipelineError
    from pgmedallion.capture.run import (
        CaptureOptions,
        CaptureTarget,
        RetryPolicy,
        StreamLimits,
        bronze_of,
        capture_once,
    )

    spec = json.loads(Path(spec_path).read_text())
    schema, table = spec["bronze"].split(".")
    target = CaptureTarget(
        spec["conninfo"],
        source=spec["source"],
        publication=spec["publication"],
        slot=spec["slot"],
        bronze=spec["bronze"],
        bronze_path=str(Path(spec["state_dir"]) / "warehouse" / f"{schema}.db" / table),
    )
    limits = StreamLimits(**spec.get("limits", {}))
    try:
        options = CaptureOptions(
            workers=spec.get("workers", 2),
            continuous=spec.get("continuous", False),
            limits=limits,
            retry=RetryPolicy(attempts=3, initial_delay_s=0.2),
        )
        # no Spark: bronze is written by delta-rs, as a local capture does
        result = capture_once(bronze_of(None, target), target, options)
    except PipelineError as exc:
        print(f"capture failed: {exc.code}: {exc}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "snapshotted": result.snapshotted,
                "messages": result.messages,
                "frontier": result.frontier,
                "batches": result.batches,
                "python_peak_rss_kib": peak_rss_kib(),
                "pyspark_imported": "pyspark" in sys.modules,
            }
        ),
        flush=True,
    )
    return 0


# ---------------------------------------------------------------------------------------------
# Replay


class ReplayError(AssertionError):
    pass


def replay(rows: Iterable[Mapping[str, Any]], schema: str, table: str) -> dict[str, tuple]:
    """The table's rows (first column -> text values) rebuilt from bronze rows.

    Fails (:class:`ReplayError`) on anything a correct capture cannot produce: two complete
    snapshots, a duplicate row or key, an update or delete of a missing key, a run whose
    transaction repeats an ordinal.
    """
    rows = list(rows)
    rewinds = [
        r
        for r in rows
        if r["kind"] == "rewind" and (r["table_schema"], r["table_name"]) == (schema, table)
    ]
    if len(rewinds) != 1:
        raise ReplayError(f"{len(rewinds)} complete snapshots of {schema}.{table}")
    snapshot_lsn, snapshot_batch = rewinds[0]["lsn"], rewinds[0]["batch_id"]
    state: dict[str, tuple] = {}
    for r in rows:
        if r["kind"] != "copy" or (r["table_schema"], r["table_name"]) != (schema, table):
            continue
        if r["batch_id"] != snapshot_batch:
            raise ReplayError(f"copy rows of {table} outside its snapshot's commit")
        for line in copy_lines(r["payload"]):
            values = tuple(decode_copy_row(line))
            if values[0] in state:
                raise ReplayError(f"key {values[0]} twice in the snapshot")
            state[values[0]] = values
    transactions = complete_transactions(rows)
    # A Relation is sent once per streaming session, before the table's first change in it.
    relids = {
        m.relid
        for messages in transactions.values()
        for _, m in messages
        if isinstance(m, Relation) and (m.namespace, m.name) == (schema, table)
    }
    for messages in transactions.values():
        if messages[0][0] <= snapshot_lsn:
            continue  # already in the snapshot: rewound
        _apply(state, [m for _, m in messages], relids)
    return state


def complete_transactions(rows: Iterable[Mapping[str, Any]]) -> dict[int, list[tuple[int, Any]]]:
    """Commit LSN -> ``(lsn, decoded message)`` in ordinal order, from one complete read."""
    reads: dict[int, dict[str, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["kind"] == "wal":
            reads[r["lsn"]][r["run_id"]].append(r)
    chosen = {}
    for lsn, runs in sorted(reads.items()):
        complete = []
        for run_id, messages in sorted(runs.items()):
            decoded = [(m["ordinal"], decode(bytes(m["payload"]))) for m in messages]
            if any(isinstance(d, Commit) for _, d in decoded):
                complete.append((run_id, decoded))
        if not complete:
            continue  # cut by a crash and not read again yet: above the frontier
        run_id, decoded = complete[0]
        ordinals = sorted(o for o, _ in decoded)
        if ordinals != list(range(len(ordinals))):
            raise ReplayError(f"run {run_id} has ordinals {ordinals[:10]}... at {lsn:X}")
        chosen[lsn] = [(lsn, d) for _, d in sorted(decoded, key=lambda od: od[0])]
    return chosen


def _apply(state: dict[str, tuple], messages: list[Any], relids: set[int]) -> None:
    for message in messages:
        if not isinstance(message, Insert | Update | Delete) or message.relid not in relids:
            continue
        if isinstance(message, Insert):
            new = _text(message.new)
            if new[0] in state:
                raise ReplayError(f"insert of key {new[0]} already present")
            state[new[0]] = new
        elif isinstance(message, Update):
            old_key = _text(message.old)[0] if message.old is not None else _text(message.new)[0]
            if old_key not in state:
                raise ReplayError(f"update of missing key {old_key}")
            old = state.pop(old_key)
            new = tuple(
                o if v is UNCHANGED_TOAST else v
                for o, v in zip(old, _text(message.new), strict=True)
            )
            if new[0] in state:
                raise ReplayError(f"update onto existing key {new[0]}")
            state[new[0]] = new
        else:
            key = _text(message.old)[0]
            if key not in state:
                raise ReplayError(f"delete of missing key {key}")
            del state[key]


def _text(values: tuple) -> tuple:
    """Text values as ``str``; NULL and the unchanged-TOAST marker as they are."""
    return tuple(v if v is None or v is UNCHANGED_TOAST else bytes(v).decode() for v in values)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
