"""The read-once rule (``silver.decode.chosen_reads``): of each transaction a window holds, the
messages of one capture read that reached its Commit. The driver applies it to a window's rows
(``silver.window.read_once``) and Spark's workers to bronze's (``silver.decode.wal_window``):
both keep the same rows of the same random windows, the rows of one read per commit LSN."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgmedallion.silver.decode import wal_window
from pgmedallion.silver.window import read_once, with_mtype

RUNS = ["r1", "r2", "r3"]

# per transaction: for each read (run id), how many of its messages it landed and whether it
# reached the Commit
READ = st.tuples(st.sampled_from(RUNS), st.integers(1, 4), st.booleans())
WINDOW = st.lists(st.lists(READ, min_size=1, max_size=3, unique_by=lambda r: r[0]), max_size=6)


def _rows(window) -> pa.Table:
    out = {"lsn": [], "run_id": [], "ordinal": [], "payload": [], "kind": [], "batch_id": []}
    for t, reads in enumerate(window):
        lsn = 100 + 10 * t
        for run, count, committed in reads:
            messages = [b"B" + bytes(20)] + [b"I" + (16384 + t).to_bytes(4, "big")] * count
            if committed:
                messages.append(b"C" + bytes(25))
            for ordinal, payload in enumerate(messages):
                for name, value in zip(out, (lsn, run, ordinal, payload, "wal", 1), strict=True):
                    out[name].append(value)
    return pa.table(
        out,
        schema=pa.schema(
            [
                ("lsn", pa.int64()),
                ("run_id", pa.string()),
                ("ordinal", pa.int64()),
                ("payload", pa.binary()),
                ("kind", pa.string()),
                ("batch_id", pa.int64()),
            ]
        ),
    )


def _kept(rows) -> list[tuple]:
    return sorted(zip(rows["lsn"], rows["run_id"], rows["ordinal"], strict=True))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(WINDOW)
def test_the_driver_and_spark_keep_the_same_read_of_each_transaction(spark, window):
    rows = _rows(window)
    driver = read_once(with_mtype(rows)).select(["lsn", "run_id", "ordinal"]).to_pydict()
    frame = spark.createDataFrame(rows) if rows.num_rows else None
    in_spark = [] if frame is None else wal_window(frame, 0, 10_000, 1).collect()
    assert _kept(driver) == sorted((r["lsn"], r["run_id"], r["ordinal"]) for r in in_spark)

    # the model: per transaction, the least read that reached its Commit, whole
    expected = []
    for t, reads in enumerate(window):
        done = sorted(run for run, _, committed in reads if committed)
        if done:
            count = next(c for run, c, _ in reads if run == done[0])
            expected += [(100 + 10 * t, done[0], o) for o in range(count + 2)]
    assert _kept(driver) == sorted(expected)
